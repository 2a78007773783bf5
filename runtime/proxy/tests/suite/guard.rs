//! The resolved-address checks: an allowed name that resolves to loopback, metadata or private
//! addresses is refused unless the policy names the address; names are resolved once and the
//! checked address is the one dialled.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent_sandbox_proxy::{BoxFuture, Outcome, Resolver, SpecialRange};

use super::harness::*;
use super::socks::{Target, socks_request};

#[tokio::test]
async fn allowed_name_resolving_to_special_address_is_refused() {
    let cases = [
        ("169.254.169.254", SpecialRange::CloudMetadata),
        ("127.0.0.1", SpecialRange::Loopback),
        ("10.0.0.1", SpecialRange::Private),
        ("::ffff:127.0.0.1", SpecialRange::Loopback),
        ("::1", SpecialRange::Loopback),
        ("100.100.100.200", SpecialRange::CloudMetadata),
    ];
    for (addr, range) in cases {
        let proxy = start_proxy(
            TestRules::allow(&["rebind.test"]),
            resolver_for(&["rebind.test"], ip(addr)),
        )
        .await;
        let answer = roundtrip(proxy.addr, b"CONNECT rebind.test:443 HTTP/1.1\r\n\r\n").await;
        assert!(
            answer.starts_with("HTTP/1.1 403 Forbidden by agent-sandbox policy\r\n"),
            "{addr}: {answer}"
        );
        let header = format!(
            "X-Agent-Sandbox-Denied: {} address {}\r\n",
            range.name(),
            ip(addr)
        );
        assert!(
            answer.contains(&header),
            "{addr}: want {header:?} in {answer}"
        );
        assert!(answer.contains("rebind.test resolves to"), "{answer}");

        let (code, _) = socks_request(proxy.addr, 0x01, Target::Name("rebind.test"), 443).await;
        assert_eq!(code, 0x02, "{addr}");

        for event in proxy.events.finished(2).await {
            assert_outcome(
                &event,
                &Outcome::SpecialAddress {
                    addr: ip(addr),
                    range,
                },
            );
            assert_eq!(event.rule.as_deref(), Some("allow rebind.test"));
            assert_eq!(event.resolved, None);
        }
    }
}

#[tokio::test]
async fn loopback_target_works_only_when_the_policy_names_it() {
    // The same request as above, with a real server on 127.0.0.1, succeeds once the address is
    // excepted: the refusal is the guard's doing, not a missing server.
    let echo = Echo::start("127.0.0.1").await;
    let port = echo.addr.port();
    let refused = start_proxy(
        TestRules::allow(&["rebind.test"]),
        resolver_for(&["rebind.test"], ip("127.0.0.1")),
    )
    .await;
    let answer = roundtrip(
        refused.addr,
        format!("CONNECT rebind.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert_eq!(echo.accepted(), 0);

    let excepted = start_proxy(
        TestRules::allow(&["rebind.test"]).special_ok(&[ip("127.0.0.1")]),
        resolver_for(&["rebind.test"], ip("127.0.0.1")),
    )
    .await;
    let mut s = connect_tunnel(excepted.addr, &format!("rebind.test:{port}")).await;
    assert_eq!(echo_through(&mut s, b"through").await, b"through");
    assert_eq!(echo.accepted(), 1);
    drop(s);
    let event = excepted.events.one().await;
    assert_eq!(
        event.address_rule.as_deref(),
        Some("allow address 127.0.0.1")
    );
    assert_eq!(event.resolved, Some(echo.addr));
}

#[tokio::test]
async fn ip_literal_in_refused_range_needs_the_exception_too() {
    let echo = Echo::start(SERVER_IP).await;
    let port = echo.addr.port();
    // Listed by the rules but not excepted from the loopback refusal.
    let proxy = start_proxy(
        TestRules::allow(&[SERVER_IP]),
        resolver_for(&[], ip(SERVER_IP)),
    )
    .await;
    let answer = roundtrip(
        proxy.addr,
        format!("CONNECT {SERVER_IP}:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        answer.contains(&format!(
            "X-Agent-Sandbox-Denied: loopback address {SERVER_IP}\r\n"
        )),
        "{answer}"
    );
    // IPv4-mapped spelling of the same address.
    let answer = roundtrip(
        proxy.addr,
        format!("CONNECT [::ffff:{SERVER_IP}]:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert_eq!(echo.accepted(), 0);
}

/// Answers differently on every call: first a refused address, then the server's address.
/// Counts calls.
struct Flipping {
    calls: AtomicUsize,
    answers: Vec<IpAddr>,
}

impl Resolver for Flipping {
    fn resolve<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        let i = self.calls.fetch_add(1, Ordering::SeqCst);
        let addr = self.answers[i % self.answers.len()];
        Box::pin(async move { Ok(vec![addr]) })
    }
}

#[tokio::test]
async fn each_connection_resolves_once_and_dials_the_checked_address() {
    let echo = Echo::start(SERVER_IP).await;
    let port = echo.addr.port();
    let resolver = Arc::new(Flipping {
        calls: AtomicUsize::new(0),
        answers: vec![ip("10.0.0.1"), ip(SERVER_IP)],
    });
    let proxy = start_proxy(
        TestRules::allow(&["flip.test"]).special_ok(&[ip(SERVER_IP)]),
        Arc::clone(&resolver),
    )
    .await;
    // First lookup says 10.0.0.1: refused, and the proxy does not ask again.
    let answer = roundtrip(
        proxy.addr,
        format!("CONNECT flip.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.contains("private address 10.0.0.1"), "{answer}");
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
    // Second connection, second lookup: the server's address, dialled as checked.
    let mut s = connect_tunnel(proxy.addr, &format!("flip.test:{port}")).await;
    assert_eq!(echo_through(&mut s, b"x").await, b"x");
    drop(s);
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 2);
    let events = proxy.events.finished(2).await;
    assert!(
        events.iter().any(|e| e.resolved == Some(echo.addr)),
        "{events:#?}"
    );
}

#[tokio::test]
async fn refused_addresses_are_skipped_and_a_checked_one_is_dialled() {
    let echo = Echo::start(SERVER_IP).await;
    let port = echo.addr.port();
    let resolver = agent_sandbox_proxy::StaticResolver::new().with(
        "mixed.test",
        [ip("169.254.169.254"), ip("10.1.2.3"), ip(SERVER_IP)],
    );
    let proxy = start_proxy(
        TestRules::allow(&["mixed.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver,
    )
    .await;
    let mut s = connect_tunnel(proxy.addr, &format!("mixed.test:{port}")).await;
    assert_eq!(echo_through(&mut s, b"y").await, b"y");
    drop(s);
    let event = proxy.events.one().await;
    assert_eq!(event.resolved, Some(echo.addr));
}

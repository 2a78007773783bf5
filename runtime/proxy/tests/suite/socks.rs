//! SOCKS5 on the same port.

use std::net::SocketAddr;

use agent_sandbox_proxy::{Outcome, Protocol, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::harness::*;

/// A target in a SOCKS5 request.
pub enum Target<'a> {
    Name(&'a str),
    Addr(std::net::IpAddr),
}

/// Runs a SOCKS5 no-auth handshake with `command` and returns the reply code and the stream.
pub async fn socks_request(
    proxy: SocketAddr,
    command: u8,
    target: Target<'_>,
    port: u16,
) -> (u8, TcpStream) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&[0x05, 0x01, 0x00]).await.unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.unwrap();
    assert_eq!(choice, [0x05, 0x00]);
    let mut req = vec![0x05, command, 0x00];
    match target {
        Target::Name(name) => {
            req.push(0x03);
            req.push(u8::try_from(name.len()).unwrap());
            req.extend_from_slice(name.as_bytes());
        }
        Target::Addr(std::net::IpAddr::V4(a)) => {
            req.push(0x01);
            req.extend_from_slice(&a.octets());
        }
        Target::Addr(std::net::IpAddr::V6(a)) => {
            req.push(0x04);
            req.extend_from_slice(&a.octets());
        }
    }
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], 0x05, "reply version");
    assert_eq!(
        &reply[3..],
        &[0x01, 0, 0, 0, 0, 0, 0],
        "bound address is 0.0.0.0:0"
    );
    (reply[1], s)
}

#[tokio::test]
async fn socks5_domain_connect_allowed() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("echo.test").await;
    let (code, mut s) = socks_request(
        proxy.addr,
        0x01,
        Target::Name("Echo.Test"),
        echo.addr.port(),
    )
    .await;
    assert_eq!(code, 0x00);
    let data = payload(100_000);
    assert_eq!(echo_through(&mut s, &data).await, data);
    drop(s);
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.protocol, Protocol::Socks5);
    assert_eq!(event.host.as_deref(), Some("echo.test"));
    assert_eq!(event.resolved, Some(echo.addr));
    assert_eq!((event.bytes_up, event.bytes_down), (100_000, 100_000));
}

#[tokio::test]
async fn socks5_domain_denied_with_code_2() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["echo.test"])
            .deny(&["bad.test"])
            .special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test", "bad.test", "unlisted.test"], ip(SERVER_IP)),
    )
    .await;
    for name in ["bad.test", "unlisted.test"] {
        let (code, _) = socks_request(proxy.addr, 0x01, Target::Name(name), echo.addr.port()).await;
        assert_eq!(code, 0x02, "{name}");
    }
    assert_eq!(echo.accepted(), 0);
    let events = proxy.events.finished(2).await;
    let rules: Vec<_> = events.iter().map(|e| e.rule.clone().unwrap()).collect();
    assert!(rules.contains(&"deny bad.test".to_owned()), "{rules:?}");
    assert!(rules.contains(&"default deny".to_owned()), "{rules:?}");
}

#[tokio::test]
async fn socks5_ip_literal_only_when_listed() {
    let echo = Echo::start(SERVER_IP).await;
    // Listed as an address (and excepted from the loopback refusal): allowed.
    let listed = start_proxy(
        TestRules::allow(&[SERVER_IP]).special_ok(&[ip(SERVER_IP)]),
        StaticResolver::new(),
    )
    .await;
    let (code, mut s) = socks_request(
        listed.addr,
        0x01,
        Target::Addr(ip(SERVER_IP)),
        echo.addr.port(),
    )
    .await;
    assert_eq!(code, 0x00);
    assert_eq!(echo_through(&mut s, b"literal").await, b"literal");

    // Not listed: refused by the rules even though a name for it is allowed.
    let unlisted = proxy_allowing("echo.test").await;
    let (code, _) = socks_request(
        unlisted.addr,
        0x01,
        Target::Addr(ip(SERVER_IP)),
        echo.addr.port(),
    )
    .await;
    assert_eq!(code, 0x02);
    let (code, _) = socks_request(
        unlisted.addr,
        0x01,
        Target::Addr(ip("::1")),
        echo.addr.port(),
    )
    .await;
    assert_eq!(code, 0x02);
    assert_eq!(echo.accepted(), 1);
}

#[tokio::test]
async fn socks5_protocol_errors_get_their_codes() {
    let proxy = start_proxy(TestRules::allow(&["echo.test"]), StaticResolver::new()).await;
    // BIND and UDP ASSOCIATE are not supported.
    for command in [0x02, 0x03] {
        let (code, _) = socks_request(proxy.addr, command, Target::Name("echo.test"), 80).await;
        assert_eq!(code, 0x07, "command {command}");
    }
    // Unknown address type.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(&[0x05, 0x01, 0x00, 0x05, 0x01, 0x00, 0x09])
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, [0x05, 0x00, 0x05, 0x08, 0x00, 0x01, 0, 0, 0, 0, 0, 0]);
    // Only username/password offered: no acceptable method.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(&[0x05, 0x01, 0x02]).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, [0x05, 0xff]);
    // Resolution failure: host unreachable.
    let (code, _) = socks_request(proxy.addr, 0x01, Target::Name("echo.test"), 80).await;
    assert_eq!(code, 0x04);
    let events = proxy.events.finished(5).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::BadRequest { .. }))
            .count(),
        4,
        "{events:#?}"
    );
}

#[tokio::test]
async fn socks5_refused_upstream_gets_code_5() {
    let closed = unused_port();
    let proxy = proxy_allowing("down.test").await;
    let (code, _) = socks_request(proxy.addr, 0x01, Target::Name("down.test"), closed).await;
    assert_eq!(code, 0x05);
}

//! The TLS server name (SNI) of tunnels: read from the ClientHello without terminating TLS,
//! recorded, and a name other than the tunnel's host refused (or only recorded, by policy).
//! The same foreign-name ClientHello passes unseen through the proxy with the check off, so
//! the tests can fail.

use std::time::{Duration, Instant};

use agent_sandbox_proxy::sni::{ACCESS_DENIED_ALERT, client_hello_record};
use agent_sandbox_proxy::{
    Outcome, Protocol, ProxyConfig, SNI_MISMATCH_RULE, SNI_UNREADABLE_RULE, SniCheck,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::harness::*;
use super::socks::{Target, socks_request};

async fn proxy_with(check: SniCheck) -> TestProxy {
    start_proxy_with(
        TestRules::allow(&["echo.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test"], ip(SERVER_IP)),
        ProxyConfig {
            sni: check,
            handshake_timeout: Duration::from_millis(800),
            ..ProxyConfig::default()
        },
    )
    .await
}

/// Sends a ClientHello naming `sni` into `s` and reads what comes back until the close.
async fn hello_and_answer(s: &mut TcpStream, sni: &str) -> Vec<u8> {
    let hello = client_hello_record(Some(sni));
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    let mut got = 0;
    // The echo server returns the hello; a refusal returns the alert and closes.
    while got < back.len() {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut back[got..]))
            .await
            .expect("an answer within 10 s")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        got += n;
    }
    back.truncate(got);
    back
}

/// An echo server at echo.test and a tunnel to it through a proxy checking with `check`.
struct EchoTunnel {
    _echo: Echo,
    proxy: TestProxy,
    tunnel: TcpStream,
}

async fn echo_tunnel(check: SniCheck) -> EchoTunnel {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_with(check).await;
    let tunnel = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    EchoTunnel {
        _echo: echo,
        proxy,
        tunnel,
    }
}

/// Asserts that the proxy's one connection was allowed and recorded no server name.
async fn assert_allowed_without_a_name(proxy: &TestProxy) {
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.sni, None);
}

#[tokio::test]
async fn connect_with_a_foreign_sni_is_refused_and_recorded() {
    let mut t = echo_tunnel(SniCheck::Deny).await;
    let back = hello_and_answer(&mut t.tunnel, "collector.test").await;
    assert_eq!(back, ACCESS_DENIED_ALERT, "a TLS access_denied alert");
    let event = t.proxy.events.one().await;
    assert_outcome(&event, &Outcome::Denied);
    assert_eq!(event.protocol, Protocol::HttpConnect);
    assert_eq!(event.host.as_deref(), Some("echo.test"));
    assert_eq!(event.sni.as_deref(), Some("collector.test"));
    assert_eq!(event.rule.as_deref(), Some(SNI_MISMATCH_RULE));
    assert_eq!(event.bytes_up, 0, "no byte of the hello went upstream");
}

#[tokio::test]
async fn connect_with_a_foreign_sni_passes_unrecorded_with_the_check_off() {
    // The proxy as it was without the check: the hello reaches the server, nothing names it.
    let mut t = echo_tunnel(SniCheck::Off).await;
    let back = hello_and_answer(&mut t.tunnel, "collector.test").await;
    assert_eq!(back, client_hello_record(Some("collector.test")));
    drop(t.tunnel);
    assert_allowed_without_a_name(&t.proxy).await;
}

#[tokio::test]
async fn record_mode_lets_a_foreign_sni_through_and_names_it() {
    let mut t = echo_tunnel(SniCheck::Record).await;
    let back = hello_and_answer(&mut t.tunnel, "collector.test").await;
    assert_eq!(back, client_hello_record(Some("collector.test")));
    drop(t.tunnel);
    let event = t.proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.sni.as_deref(), Some("collector.test"));
    assert_eq!(event.rule.as_deref(), Some("allow echo.test"));
}

#[tokio::test]
async fn matching_sni_and_pipelined_hello_pass_and_are_recorded() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_with(SniCheck::Deny).await;
    // The hello sent in the same write as the CONNECT head (the proxy's `early` bytes), with
    // the name in another case and with a trailing dot.
    let hello = client_hello_record(Some("Echo.Test."));
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let mut request =
        format!("CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.addr.port()).into_bytes();
    request.extend_from_slice(&hello);
    s.write_all(&request).await.unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut back = vec![0u8; hello.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, hello);
    drop(s);
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.sni.as_deref(), Some("echo.test"));
}

#[tokio::test]
async fn socks5_with_a_foreign_sni_is_refused() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_with(SniCheck::Deny).await;
    let (code, mut s) = socks_request(
        proxy.addr,
        0x01,
        Target::Name("echo.test"),
        echo.addr.port(),
    )
    .await;
    assert_eq!(code, 0x00);
    let back = hello_and_answer(&mut s, "collector.test").await;
    assert_eq!(back, ACCESS_DENIED_ALERT);
    let event = proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::Socks5);
    assert_outcome(&event, &Outcome::Denied);
    assert_eq!(event.sni.as_deref(), Some("collector.test"));
}

#[tokio::test]
async fn a_server_that_speaks_first_is_relayed_at_once() {
    // An SSH-like server: its banner must reach a client that sends nothing first.
    let listener = TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.unwrap();
        c.write_all(b"SSH-2.0-Test\r\n").await.unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
    });
    let proxy = proxy_with(SniCheck::Deny).await;
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{port}")).await;
    let start = Instant::now();
    let mut banner = [0u8; 14];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut banner))
        .await
        .expect("banner within 5 s")
        .unwrap();
    assert_eq!(&banner, b"SSH-2.0-Test\r\n");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the banner waited {:?}",
        start.elapsed()
    );
    drop(s);
    assert_allowed_without_a_name(&proxy).await;
}

#[tokio::test]
async fn a_non_tls_client_is_relayed_without_a_name() {
    let mut t = echo_tunnel(SniCheck::Deny).await;
    let data = payload(10_000);
    assert_eq!(echo_through(&mut t.tunnel, &data).await, data);
    drop(t.tunnel);
    assert_allowed_without_a_name(&t.proxy).await;
}

#[tokio::test]
async fn a_stalled_or_malformed_hello_is_refused() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_with(SniCheck::Deny).await;
    let target = format!("echo.test:{}", echo.addr.port());
    // Half a ClientHello, then nothing: refused after the handshake timeout.
    let hello = client_hello_record(Some("collector.test"));
    let mut s = connect_tunnel(proxy.addr, &target).await;
    s.write_all(&hello[..20]).await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back))
        .await
        .expect("refused within 5 s")
        .unwrap();
    assert_eq!(back, ACCESS_DENIED_ALERT);
    // A record that claims a handshake but is not a ClientHello.
    let mut s = connect_tunnel(proxy.addr, &target).await;
    s.write_all(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00")
        .await
        .unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back))
        .await
        .expect("refused within 5 s")
        .unwrap();
    assert_eq!(back, ACCESS_DENIED_ALERT);
    let events = proxy.events.finished(2).await;
    for event in events {
        assert_outcome(&event, &Outcome::Denied);
        assert_eq!(event.rule.as_deref(), Some(SNI_UNREADABLE_RULE));
    }
    assert_eq!(echo.accepted(), 2, "upstream was dialled, then dropped");
}

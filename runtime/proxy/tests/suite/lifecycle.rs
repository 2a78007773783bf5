//! Timeouts and the proxy's lifetime: slow clients and idle tunnels are cut off, and stopping
//! the proxy ends every connection it relays.

use std::time::{Duration, Instant};

use agent_sandbox_proxy::{Outcome, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::harness::*;

fn short_timeouts() -> ProxyConfig {
    ProxyConfig {
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(400),
        ..ProxyConfig::default()
    }
}

async fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("proxy closes the connection within 10 s");
    (out, start.elapsed())
}

#[tokio::test]
async fn silent_and_slow_clients_are_cut_off() {
    let proxy = start_proxy_with(
        TestRules::default(),
        resolver_for(&[], ip(SERVER_IP)),
        short_timeouts(),
    )
    .await;
    // Says nothing.
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let (out, took) = read_until_closed(&mut silent).await;
    assert!(out.is_empty());
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Starts a head and never finishes it.
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"CONNECT slow.test:443 HTTP/1.1\r\nX-A: ")
        .await
        .unwrap();
    let (out, took) = read_until_closed(&mut slow).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Stalls in the middle of a SOCKS5 greeting.
    let mut socks = TcpStream::connect(proxy.addr).await.unwrap();
    socks.write_all(&[0x05, 0x02, 0x00]).await.unwrap();
    let (_, took) = read_until_closed(&mut socks).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    for event in proxy.events.finished(3).await {
        assert!(
            matches!(event.outcome, Outcome::ClientError { .. }),
            "{event:#?}"
        );
    }
}

#[tokio::test]
async fn idle_tunnel_is_closed() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy_with(
        TestRules::allow(&["echo.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test"], ip(SERVER_IP)),
        short_timeouts(),
    )
    .await;
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    assert_eq!(echo_through(&mut s, b"once").await, b"once");
    let (out, took) = read_until_closed(&mut s).await;
    assert!(out.is_empty());
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!((event.bytes_up, event.bytes_down), (4, 4));
}

#[tokio::test]
async fn stopping_the_proxy_ends_relayed_connections() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("echo.test").await;
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    assert_eq!(echo_through(&mut s, b"before").await, b"before");
    let addr = proxy.addr;
    drop(proxy); // aborts the serve task
    let (_, took) = read_until_closed(&mut s).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    // The listener is gone too: nothing answers on the port any more.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener still open after stop"
    );
}

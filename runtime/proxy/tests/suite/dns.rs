//! The host-side DNS cache ([`DnsResolver`]): answers are kept for their TTL and no longer, the
//! hosts table answers first, and every connection dials an address from the one lookup whose
//! answer was checked.
//!
//! The tests run their own name server on loopback (UDP) and count the A queries it gets.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox_proxy::DnsResolver;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use super::harness::*;

/// What the test name server answers for a name: address and TTL in seconds.
type Zone = Arc<Mutex<HashMap<String, (Ipv4Addr, u32)>>>;

/// A minimal authoritative name server for A queries. It builds answers by hand rather than
/// through a DNS library on purpose: one fixed answer shape is all the tests need, and the
/// code under test (hickory's client) should not be checked against the same library's
/// encoder.
struct TestDns {
    addr: SocketAddr,
    zone: Zone,
    a_queries: Arc<Mutex<HashMap<String, usize>>>,
    _task: JoinHandle<()>,
}

impl TestDns {
    async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let zone: Zone = Arc::default();
        let a_queries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (z, q) = (Arc::clone(&zone), Arc::clone(&a_queries));
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let (n, from) = socket.recv_from(&mut buf).await.unwrap();
                if let Some(answer) = answer(&buf[..n], &z, &q) {
                    let _ = socket.send_to(&answer, from).await;
                }
            }
        });
        Self {
            addr,
            zone,
            a_queries,
            _task: task,
        }
    }

    fn set(&self, name: &str, addr: &str, ttl: u32) {
        self.zone
            .lock()
            .unwrap()
            .insert(name.to_owned(), (addr.parse().unwrap(), ttl));
    }

    fn a_queries(&self, name: &str) -> usize {
        self.a_queries
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

/// The reply to one query: the question echoed, and one A record if the name is in the zone
/// and A was asked (anything else: no records, NOERROR).
fn answer(query: &[u8], zone: &Zone, a_queries: &Mutex<HashMap<String, usize>>) -> Option<Vec<u8>> {
    let header = query.get(..12)?;
    let mut pos = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(pos)?);
        pos += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(pos..pos + len)?).to_ascii_lowercase());
        pos += len;
    }
    let qtype = u16::from_be_bytes([*query.get(pos)?, *query.get(pos + 1)?]);
    let question = query.get(12..pos + 4)?;
    let name = labels.join(".");
    let found = if qtype == 1 {
        *a_queries.lock().unwrap().entry(name.clone()).or_default() += 1;
        zone.lock().unwrap().get(&name).copied()
    } else {
        None
    };
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&header[..2]); // id
    out.extend_from_slice(&[0x84, 0x00]); // response, authoritative, NOERROR
    out.extend_from_slice(&[0, 1, 0, u8::from(found.is_some()), 0, 0, 0, 0]);
    out.extend_from_slice(question);
    if let Some((ip, ttl)) = found {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]); // name = the question's, A, IN
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&[0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    Some(out)
}

/// Opens a tunnel to `name:port` and echoes one message through it; returns the proxy's answer
/// head if the tunnel was refused.
async fn tunnel_once(proxy: SocketAddr, name: &str, port: u16) -> Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    use tokio::io::AsyncWriteExt;
    s.write_all(format!("CONNECT {name}:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head);
    }
    assert_eq!(echo_through(&mut s, b"hello").await, b"hello");
    Ok(())
}

#[tokio::test]
async fn answers_are_reused_for_their_ttl() {
    let dns = TestDns::start().await;
    dns.set("cached.test", SERVER_IP, 300);
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["cached.test"]).special_ok(&[ip(SERVER_IP)]),
        DnsResolver::with_servers(&[dns.addr], "").unwrap(),
    )
    .await;
    for _ in 0..3 {
        tunnel_once(proxy.addr, "cached.test", echo.addr.port())
            .await
            .unwrap();
    }
    assert_eq!(echo.accepted(), 3);
    assert_eq!(
        dns.a_queries("cached.test"),
        1,
        "three connections within the TTL must cost one lookup"
    );
    for event in proxy.events.finished(3).await {
        assert_eq!(event.resolved, Some(echo.addr));
    }
}

#[tokio::test]
async fn an_expired_answer_is_looked_up_again_and_the_new_address_is_checked() {
    let dns = TestDns::start().await;
    dns.set("short.test", SERVER_IP, 1);
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["short.test"]).special_ok(&[ip(SERVER_IP)]),
        DnsResolver::with_servers(&[dns.addr], "").unwrap(),
    )
    .await;
    tunnel_once(proxy.addr, "short.test", echo.addr.port())
        .await
        .unwrap();
    // The name now points at the cloud metadata address. Within the TTL the cached (checked)
    // answer is still used; after it, the new answer is looked up and refused.
    dns.set("short.test", "169.254.169.254", 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let refused = tunnel_once(proxy.addr, "short.test", echo.addr.port())
        .await
        .unwrap_err();
    assert!(
        refused.starts_with("HTTP/1.1 403")
            && refused.contains("X-Agent-Sandbox-Denied: cloud-metadata address 169.254.169.254"),
        "{refused}"
    );
    assert_eq!(dns.a_queries("short.test"), 2);
    assert_eq!(echo.accepted(), 1);
}

#[tokio::test]
async fn each_connection_dials_an_address_from_its_own_single_lookup() {
    // TTL 0: nothing is cached, so a name that flips between an allowed and a refused
    // address (DNS rebinding) is looked up exactly once per connection, and each connection
    // dials what that one lookup returned and the guard checked.
    let dns = TestDns::start().await;
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["flip.test"]).special_ok(&[ip(SERVER_IP)]),
        DnsResolver::with_servers(&[dns.addr], "").unwrap(),
    )
    .await;
    for round in 1..=4usize {
        let allowed = round % 2 == 1;
        dns.set(
            "flip.test",
            if allowed { SERVER_IP } else { "127.0.0.1" },
            0,
        );
        let result = tunnel_once(proxy.addr, "flip.test", echo.addr.port()).await;
        assert_eq!(result.is_ok(), allowed, "round {round}: {result:?}");
        assert_eq!(
            dns.a_queries("flip.test"),
            round,
            "one lookup per connection"
        );
    }
    assert_eq!(echo.accepted(), 2);
    let events = proxy.events.finished(4).await;
    let dialled: Vec<_> = events.iter().filter_map(|e| e.resolved).collect();
    assert_eq!(dialled, vec![echo.addr, echo.addr]);
}

#[tokio::test]
async fn the_hosts_table_answers_before_any_name_server() {
    let dns = TestDns::start().await;
    dns.set("pinned.test", "169.254.169.254", 300);
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["pinned.test"]).special_ok(&[ip(SERVER_IP)]),
        DnsResolver::with_servers(&[dns.addr], &format!("{SERVER_IP} pinned.test\n")).unwrap(),
    )
    .await;
    tunnel_once(proxy.addr, "pinned.test", echo.addr.port())
        .await
        .unwrap();
    assert_eq!(dns.a_queries("pinned.test"), 0);
    assert_eq!(echo.accepted(), 1);
}

#[tokio::test]
async fn an_unknown_name_is_a_resolve_failure() {
    let dns = TestDns::start().await;
    let proxy = start_proxy(
        TestRules::allow(&["missing.test"]),
        DnsResolver::with_servers(&[dns.addr], "").unwrap(),
    )
    .await;
    let refused = tunnel_once(proxy.addr, "missing.test", 443)
        .await
        .unwrap_err();
    assert!(
        refused.starts_with("HTTP/1.1 502") && refused.contains("X-Agent-Sandbox-Error: resolve"),
        "{refused}"
    );
}

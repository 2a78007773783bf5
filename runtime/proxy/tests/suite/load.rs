//! A bounded load test: many concurrent tunnels through one proxy on loopback.

use std::time::{Duration, Instant};

use agent_sandbox_proxy::{Outcome, Protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::*;
use super::socks::{Target, socks_request};

const CLIENTS: usize = 200;
const BYTES: usize = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_connections() {
    let echo = Echo::start(SERVER_IP).await;
    let web = Web::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["echo.test", "web.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test", "web.test"], ip(SERVER_IP)),
    )
    .await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let proxy_addr = proxy.addr;
        let echo_port = echo.addr.port();
        let web_port = web.addr.port();
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => {
                    let mut s = connect_tunnel(proxy_addr, &format!("echo.test:{echo_port}")).await;
                    let data = payload(BYTES);
                    assert_eq!(echo_through(&mut s, &data).await, data);
                }
                1 => {
                    let (code, mut s) =
                        socks_request(proxy_addr, 0x01, Target::Name("echo.test"), echo_port).await;
                    assert_eq!(code, 0);
                    let data = payload(BYTES);
                    assert_eq!(echo_through(&mut s, &data).await, data);
                }
                _ => {
                    let answer = roundtrip(
                        proxy_addr,
                        format!("GET http://web.test:{web_port}/n{i} HTTP/1.1\r\n\r\n").as_bytes(),
                    )
                    .await;
                    assert!(
                        answer.ends_with(&format!("hello /n{i} (0 body bytes)")),
                        "{answer}"
                    );
                }
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("200 concurrent connections within 60 s");
    let took = start.elapsed();
    eprintln!("{CLIENTS} concurrent connections through the proxy in {took:?}");

    let events = proxy.events.finished(CLIENTS).await;
    assert_eq!(events.len(), CLIENTS);
    assert!(
        events.iter().all(|e| e.outcome == Outcome::Allowed),
        "{events:#?}"
    );
    let tunnels: Vec<_> = events
        .iter()
        .filter(|e| e.protocol != Protocol::HttpForward)
        .collect();
    assert_eq!(tunnels.len(), CLIENTS - CLIENTS / 3);
    for e in tunnels {
        assert_eq!(
            (e.bytes_up, e.bytes_down),
            (BYTES as u64, BYTES as u64),
            "{e:#?}"
        );
    }
    // And the proxy is still answering.
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    s.write_all(b"z").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"z");
}

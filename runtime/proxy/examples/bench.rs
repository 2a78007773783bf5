//! Compares the egress proxy with direct loopback in one interleaved run and prints ratios.
//!
//! `cargo run --release -p agent-sandbox-proxy --example bench [-- MEGABYTES REQUESTS ROUNDS]`
//! (defaults 100, 1000, 5)
//!
//! - bulk: MEGABYTES (default 100) sent through a CONNECT tunnel vs directly; prints the
//!   throughput ratio (target >= 0.9);
//! - small: REQUESTS (default 1000) sequential one-connection HTTP GETs, absolute-form through
//!   the proxy vs origin-form directly; prints the added time per request (target <= 0.3 ms).
//!
//! Two proxies run side by side: the default one (tunnels relayed with `splice(2)`) and one
//! configured to copy through a buffer (`ProxyConfig::splice = false`, the relay before
//! splice). Rounds interleave direct, copy and splice, in an order that rotates from round to
//! round, so machine drift hits all alike; ratios are taken within a round and their median
//! reported. Beside wall-clock figures it prints CPU time, which does not depend on what else
//! the machine runs: the proxy thread's (from `/proc/self/task/TID/schedstat`) and the whole
//! process's per bulk MB (`getrusage`: client + server, plus the proxy when proxied). Their
//! quotient is the throughput ratio a machine whose cores are all busy can reach at best.
//! Servers live on 127.0.0.2; nothing leaves loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_proxy::{NullSink, Proxy, ProxyConfig, StaticResolver};
use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{BenchRules, SERVER_IP, args, load_average, median};

const IDLE_TUNNELS: usize = 400;

/// The process's resident set size in KiB, from /proc/self/status.
fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("malformed VmRSS line")?
        .parse()?)
}

/// Reads everything until EOF and answers with the byte count (8 bytes, big endian).
async fn sink_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind((SERVER_IP, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut total: u64 = 0;
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = s.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    Ok(addr)
}

/// Holds connections open, reading into a small buffer (for the memory figure).
async fn hold_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind((SERVER_IP, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Answers every request with a small fixed response and closes.
async fn web_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind((SERVER_IP, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 2048];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn read_head(s: &mut TcpStream) -> Result<()> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(s.read(&mut b).await? == 1, "closed inside the head");
        head.push(b[0]);
    }
    ensure!(
        head.starts_with(b"HTTP/1.1 200"),
        "not 200: {}",
        String::from_utf8_lossy(&head)
    );
    Ok(())
}

async fn bulk(mut s: TcpStream, bytes: u64) -> Result<Duration> {
    let start = Instant::now();
    let chunk = vec![0x5au8; 256 * 1024];
    let mut sent = 0u64;
    while sent < bytes {
        s.write_all(&chunk).await?;
        sent += chunk.len() as u64;
    }
    s.shutdown().await?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await?;
    ensure!(
        u64::from_be_bytes(count) == sent,
        "server counted {} of {sent}",
        u64::from_be_bytes(count)
    );
    Ok(start.elapsed())
}

async fn small(connect_to: SocketAddr, request: &[u8], n: usize) -> Result<Duration> {
    let start = Instant::now();
    for _ in 0..n {
        let mut s = TcpStream::connect(connect_to).await?;
        s.set_nodelay(true)?;
        s.write_all(request).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        ensure!(
            out.ends_with(b"\r\n\r\nok"),
            "bad answer {}",
            String::from_utf8_lossy(&out)
        );
    }
    Ok(start.elapsed())
}

/// CPU time of thread `tid` of this process so far, in milliseconds.
fn thread_cpu_ms(tid: i32) -> Result<f64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
    let ns: f64 = text
        .split_whitespace()
        .next()
        .context("empty schedstat")?
        .parse()?;
    Ok(ns / 1e6)
}

/// Starts a proxy on its own thread and runtime, as it would run in its own process; returns
/// its address and thread id.
fn start_proxy(splice: bool) -> Result<(SocketAddr, i32)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let resolver = StaticResolver::new().with("bench.test", [SERVER_IP.parse()?]);
    let proxy = Proxy::with_config(
        Arc::new(BenchRules {
            names: &["bench.test"],
            rule: "allow bench.test",
        }),
        Arc::new(resolver),
        Arc::new(NullSink),
        ProxyConfig {
            splice,
            ..ProxyConfig::default()
        },
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(if splice { "proxy-splice" } else { "proxy-copy" }.into())
        .spawn(move || {
            let _ = tx.send(nix::unistd::gettid().as_raw());
            runtime.block_on(proxy.serve_std(listener))
        })?;
    Ok((addr, rx.recv()?))
}

async fn tunnel(proxy: SocketAddr, port: u16) -> Result<TcpStream> {
    let mut t = TcpStream::connect(proxy).await?;
    t.write_all(format!("CONNECT bench.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await?;
    read_head(&mut t).await?;
    Ok(t)
}

/// CPU time of the whole process (client, servers and both proxies) so far, in milliseconds.
fn process_cpu_ms() -> Result<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF)?;
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1000.0 + t.tv_usec() as f64 / 1000.0;
    Ok(ms(usage.user_time()) + ms(usage.system_time()))
}

const NAMES: [&str; 3] = ["direct", "copy relay", "splice relay"];

/// Figures of one mode in one round.
#[derive(Default, Clone, Copy)]
struct Figures {
    /// Bulk throughput, MB/s.
    mb_s: f64,
    /// Wall time per small request, ms.
    ms_req: f64,
    /// CPU of the whole process per bulk MB (client + server, plus the proxy when proxied), ms.
    cpu_mb: f64,
    /// CPU of the proxy thread per bulk MB and per small request, ms.
    proxy_cpu_mb: f64,
    proxy_cpu_req: f64,
}

/// What every round measures against: the servers, the two proxies (address and relay
/// thread) and the sizes.
struct Setup {
    sink: SocketAddr,
    web: SocketAddr,
    copy: (SocketAddr, i32),
    splice: (SocketAddr, i32),
    bytes: u64,
    requests: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let (megabytes, requests, rounds) = args(1000)?;
    println!("load average at start: {}", load_average());
    let setup = Setup {
        sink: sink_server().await?,
        web: web_server().await?,
        copy: start_proxy(false)?,
        splice: start_proxy(true)?,
        bytes: megabytes * 1024 * 1024,
        requests,
    };
    // fig[round][mode]
    let mut fig: Vec<[Figures; 3]> = Vec::new();
    for round in 1..=rounds {
        let this = measure_round(&setup, round).await?;
        let mut line = format!("round {round} (load {}):", load_average());
        for (mode, name) in NAMES.iter().enumerate() {
            line.push_str(&format!(
                " {name} {:.0} MB/s {:.3} ms/req;",
                this[mode].mb_s, this[mode].ms_req
            ));
        }
        println!("{line}");
        fig.push(this);
    }
    measure_idle_tunnels(setup.splice.0).await?;
    println!("load average at end: {}", load_average());
    summarise(&fig, megabytes, requests, rounds);
    Ok(())
}

/// One round: direct, copy relay and splice relay, in an order that rotates from round to
/// round, so that no mode always runs right after another (a warm cache, a burst of other
/// load) and drift hits all alike.
async fn measure_round(setup: &Setup, round: u64) -> Result<[Figures; 3]> {
    let direct_get = format!(
        "GET /x HTTP/1.1\r\nHost: bench.test:{}\r\n\r\n",
        setup.web.port()
    );
    let proxied_get = format!(
        "GET http://bench.test:{0}/x HTTP/1.1\r\nHost: bench.test:{0}\r\n\r\n",
        setup.web.port()
    );
    let mb = setup.bytes as f64 / (1024.0 * 1024.0);
    let requests = setup.requests;
    let per_req = |d: Duration| d.as_secs_f64() * 1000.0 / requests as f64;
    let mut order = [0usize, 1, 2];
    order.rotate_left(usize::try_from(round - 1)? % 3);
    let mut this = [Figures::default(); 3];
    for mode in order {
        let (proxy, tid) = match mode {
            0 => (None, 0),
            1 => (Some(setup.copy.0), setup.copy.1),
            _ => (Some(setup.splice.0), setup.splice.1),
        };
        let thread_cpu = |tid| if tid > 0 { thread_cpu_ms(tid) } else { Ok(0.0) };
        // Both paths are measured by the same client code; the proxied one's CONNECT
        // handshake happens before the clock starts (it is not bulk transfer).
        let stream = match proxy {
            None => TcpStream::connect(setup.sink).await?,
            Some(p) => tunnel(p, setup.sink.port()).await?,
        };
        let (cpu0, all0) = (thread_cpu(tid)?, process_cpu_ms()?);
        let b = bulk(stream, setup.bytes).await?;
        let (cpu1, all1) = (thread_cpu(tid)?, process_cpu_ms()?);
        let sm = match proxy {
            None => small(setup.web, direct_get.as_bytes(), requests).await?,
            Some(p) => small(p, proxied_get.as_bytes(), requests).await?,
        };
        let cpu2 = thread_cpu(tid)?;
        this[mode] = Figures {
            mb_s: mb / b.as_secs_f64(),
            ms_req: per_req(sm),
            cpu_mb: (all1 - all0) / mb,
            proxy_cpu_mb: (cpu1 - cpu0) / mb,
            proxy_cpu_req: (cpu2 - cpu1) / requests as f64,
        };
    }
    Ok(this)
}

/// Memory: many open, mostly idle tunnels through the proxy at `proxy_addr` (each has
/// carried one small message).
async fn measure_idle_tunnels(proxy_addr: SocketAddr) -> Result<()> {
    let hold = hold_server().await?;
    let rss_before = rss_kib()?;
    let mut tunnels = Vec::new();
    for _ in 0..IDLE_TUNNELS {
        let mut tunnel = TcpStream::connect(proxy_addr).await?;
        tunnel
            .write_all(format!("CONNECT bench.test:{} HTTP/1.1\r\n\r\n", hold.port()).as_bytes())
            .await?;
        read_head(&mut tunnel).await?;
        tunnel.write_all(b"ping").await?;
        tunnels.push(tunnel);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_after = rss_kib()?;
    println!(
        "memory: {IDLE_TUNNELS} open tunnels add {} KiB RSS ({:.1} KiB each, test client and server included)",
        rss_after.saturating_sub(rss_before),
        rss_after.saturating_sub(rss_before) as f64 / IDLE_TUNNELS as f64
    );
    drop(tunnels);
    Ok(())
}

/// Prints each relay's figures against direct. Ratios are taken per round (direct and
/// proxied measured minutes apart at most), then the median over rounds.
fn summarise(fig: &[[Figures; 3]], megabytes: u64, requests: usize, rounds: u64) {
    let direct = |f: &[Figures; 3]| f[0];
    for mode in [1usize, 2] {
        let per_round = |g: &dyn Fn(&[Figures; 3]) -> f64| median(fig.iter().map(g).collect());
        let ratio = per_round(&|f| f[mode].mb_s / direct(f).mb_s);
        let added = per_round(&|f| f[mode].ms_req - direct(f).ms_req);
        let cpu_ratio = per_round(&|f| direct(f).cpu_mb / f[mode].cpu_mb);
        let med = |g: &dyn Fn(&Figures) -> f64| median(fig.iter().map(|f| g(&f[mode])).collect());
        let med_direct =
            |g: &dyn Fn(&Figures) -> f64| median(fig.iter().map(|f| g(&f[0])).collect());
        let target = |met: bool| if met { "met" } else { "NOT met" };
        let detail = format!(
            "bulk {:.0} MB/s vs direct {:.0} MB/s; small {:.3} vs {:.3} ms/req; \
             process CPU {:.3} vs direct {:.3} ms per bulk MB (CPU-bound ratio {cpu_ratio:.3}); \
             proxy thread CPU {:.3} ms per bulk MB, {:.3} ms per small request",
            med(&|f| f.mb_s),
            med_direct(&|f| f.mb_s),
            med(&|f| f.ms_req),
            med_direct(&|f| f.ms_req),
            med(&|f| f.cpu_mb),
            med_direct(&|f| f.cpu_mb),
            med(&|f| f.proxy_cpu_mb),
            med(&|f| f.proxy_cpu_req),
        );
        if mode == 2 {
            // The default relay; these two lines are what hack/bench/extra.py parses.
            println!(
                "bulk throughput ratio (proxied/direct, {megabytes} MB, median of {rounds} rounds): {ratio:.3} (target >= 0.9: {})",
                target(ratio >= 0.9)
            );
            println!(
                "added per small request ({requests} requests, median of {rounds} rounds): {added:.3} ms (target <= 0.3 ms: {})",
                target(added <= 0.3)
            );
            println!("splice relay (default): {detail}");
        } else {
            println!(
                "copy relay (splice = false): ratio {ratio:.3}, added {added:.3} ms; {detail}"
            );
        }
    }
}

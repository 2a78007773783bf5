//! The cost of HTTPS credential injection: the TLS-terminating path next to the opaque tunnel,
//! in one interleaved run, with ratios.
//!
//! `cargo run --release -p agent-sandbox-proxy --example bench_tls [-- MEGABYTES REQUESTS ROUNDS]`
//! (defaults 100, 300, 5)
//!
//! One HTTPS server on 127.0.0.2 (certificate from a CA of the bench's own "internet") answers
//! every request. One proxy serves two names for it: `plain.bench` is an opaque `CONNECT`
//! tunnel (the client's TLS goes end to end), `bound.bench` has an `https` credential (the
//! proxy terminates TLS with a sandbox CA, adds the header, and opens its own verified TLS to
//! the server). The same client code measures, per round and in an order that rotates:
//! - latency: REQUESTS sequential requests, each a new connection (CONNECT, TLS handshake,
//!   one GET, answer); prints the added time per request and the ratio;
//! - throughput: one connection POSTing MEGABYTES, then one GET of MEGABYTES (the bound name's
//!   answer is scrubbed of the secret on its way back, and its request bodies searched for the
//!   placeholder); prints MB/s and the ratio.
//!   Ratios are taken within a round, the median over rounds reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_policy::network::DomainRule;
use agent_sandbox_proxy::ca::SandboxCa;
use agent_sandbox_proxy::{
    Credentials, InjectedHeader, NullSink, Proxy, ProxyConfig, StaticResolver, TlsInterceptor,
};
use anyhow::{Context, Result, ensure};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One round's figures per mode (tunnel, tls-terminating): ms per request, upload MB/s,
/// download MB/s.
type Round = [(f64, f64, f64); 2];
mod common;
use common::{BenchRules, SERVER_IP, args, load_average, median};

const BOUND: &str = "bound.bench";
const PLAIN: &str = "plain.bench";

/// Reads one request head (and its Content-Length body, counted), answers with the count, or
/// for `GET /download/N`, with N bytes.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<bool> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await? == 0 {
            return Ok(false);
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if let Some(n) = text
        .strip_prefix("get /download/")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
    {
        s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").as_bytes())
            .await?;
        let chunk = vec![b'Z'; 256 * 1024];
        let mut left = n;
        while left > 0 {
            let take = usize::try_from(left.min(chunk.len() as u64))?;
            s.write_all(&chunk[..take]).await?;
            left -= take as u64;
        }
        s.flush().await?;
        return Ok(true);
    }
    let length: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(Ok(0), |v| v.trim().parse())?;
    let mut left = length;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64))?;
        let n = s.read(&mut buf[..want]).await?;
        ensure!(n > 0, "body cut short");
        left -= n as u64;
    }
    let body = length.to_string();
    s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    s.flush().await?;
    Ok(true)
}

async fn https_server(cert: rustls::ServerConfig) -> Result<SocketAddr> {
    let listener = TcpListener::bind((SERVER_IP, 0)).await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                while let Ok(true) = answer(&mut tls).await {}
            });
        }
    });
    Ok(addr)
}

async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Result<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(
            s.read(&mut b).await? == 1,
            "closed inside the response head"
        );
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    ensure!(text.starts_with("HTTP/1.1 200"), "not 200: {text}");
    let length: usize = text
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .context("no content-length")?
        .parse()?;
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// A TLS connection to `name` through the proxy's CONNECT, trusting `roots`.
async fn connect(
    proxy: SocketAddr,
    name: &str,
    port: u16,
    client: &tokio_rustls::TlsConnector,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(
        format!("CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(s.read(&mut b).await? == 1, "proxy closed");
        head.push(b[0]);
    }
    ensure!(head.starts_with(b"HTTP/1.1 200"), "CONNECT refused");
    Ok(client
        .connect(ServerName::try_from(name.to_owned())?, s)
        .await?)
}

fn connector(ca_pem: &str) -> Result<tokio_rustls::TlsConnector> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn latency(
    proxy: SocketAddr,
    name: &str,
    port: u16,
    client: &tokio_rustls::TlsConnector,
    n: usize,
) -> Result<Duration> {
    let start = Instant::now();
    for _ in 0..n {
        let mut tls = connect(proxy, name, port, client).await?;
        tls.write_all(format!("GET /x HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n").as_bytes())
            .await?;
        ensure!(read_response(&mut tls).await? == "0", "bad answer");
    }
    Ok(start.elapsed())
}

async fn bulk(
    proxy: SocketAddr,
    name: &str,
    port: u16,
    client: &tokio_rustls::TlsConnector,
    bytes: u64,
) -> Result<Duration> {
    let mut tls = connect(proxy, name, port, client).await?;
    let start = Instant::now();
    tls.write_all(
        format!("POST /bulk HTTP/1.1\r\nHost: {name}:{port}\r\nContent-Length: {bytes}\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let chunk = vec![0x5au8; 256 * 1024];
    let mut sent = 0u64;
    while sent < bytes {
        let n = usize::try_from((bytes - sent).min(chunk.len() as u64))?;
        tls.write_all(&chunk[..n]).await?;
        sent += n as u64;
    }
    tls.flush().await?;
    ensure!(
        read_response(&mut tls).await? == bytes.to_string(),
        "server counted otherwise"
    );
    Ok(start.elapsed())
}

/// One GET of `bytes` on a new connection; the body counted (by length, or chunked: the bound
/// name's long answers come re-framed).
async fn download(
    proxy: SocketAddr,
    name: &str,
    port: u16,
    client: &tokio_rustls::TlsConnector,
    bytes: u64,
) -> Result<Duration> {
    let mut tls = connect(proxy, name, port, client).await?;
    let start = Instant::now();
    tls.write_all(
        format!("GET /download/{bytes} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut reader = tokio::io::BufReader::with_capacity(256 * 1024, tls);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        ensure!(
            tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line).await? > 0,
            "closed inside the response head"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    ensure!(head.starts_with("http/1.1 200"), "not 200: {head}");
    let mut got = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    if head.contains("transfer-encoding: chunked") {
        loop {
            let mut line = String::new();
            tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line).await?;
            let size = u64::from_str_radix(line.trim(), 16)?;
            let mut left = size + 2;
            while left > 0 {
                let want = usize::try_from(left.min(buf.len() as u64))?;
                let n = reader.read(&mut buf[..want]).await?;
                ensure!(n > 0, "chunk cut short");
                left -= n as u64;
            }
            if size == 0 {
                break;
            }
            got += size;
        }
    } else {
        let mut left = bytes;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64))?;
            let n = reader.read(&mut buf[..want]).await?;
            ensure!(n > 0, "body cut short");
            left -= n as u64;
            got += n as u64;
        }
    }
    ensure!(got == bytes, "downloaded {got} of {bytes} bytes");
    Ok(start.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines)]
async fn main() -> Result<()> {
    let (megabytes, requests, rounds) = args(300)?;
    let bytes = megabytes * 1024 * 1024;
    println!("load average at start: {}", load_average());

    // The bench's "internet": a CA and the server's certificate for both names.
    let any = [DomainRule::parse(BOUND)?, DomainRule::parse(PLAIN)?];
    let (internet, internet_pem) = SandboxCa::ephemeral("bench internet", &any)?;
    let leaf = internet.leaf(BOUND)?;
    let plain_leaf = internet.leaf(PLAIN)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut sni = rustls::server::ResolvesServerCertUsingSni::new();
    for (name, l) in [(BOUND, leaf), (PLAIN, plain_leaf)] {
        let key = provider.key_provider.load_private_key(l.key)?;
        sni.add(name, rustls::sign::CertifiedKey::new(l.chain, key))?;
    }
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(sni));
    let server = https_server(server_config).await?;
    let dir = tempfile::tempdir()?;
    let internet_file = dir.path().join("internet-ca.pem");
    std::fs::write(&internet_file, &internet_pem)?;

    // The proxy, with an https credential for BOUND verified against the internet CA.
    let bound_rule = DomainRule::parse(BOUND)?;
    let credentials = Credentials::new(vec![InjectedHeader {
        domain: bound_rule.clone(),
        name: "Authorization".into(),
        value: "Bearer bench-secret".into(),
        secret: "bench-secret".into(),
        https: true,
        placeholder: Some(
            "agent-sandbox-placeholder-BENCH-0123456789abcdef0123456789abcdef".into(),
        ),
        upstream_ca: Some(internet_file),
    }]);
    let (sandbox_ca, sandbox_pem) = SandboxCa::ephemeral("bench sandbox", &[bound_rule])?;
    let tls = TlsInterceptor::new(sandbox_ca, &credentials)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let proxy_addr = listener.local_addr()?;
    let resolver = StaticResolver::new()
        .with(BOUND, [SERVER_IP.parse()?])
        .with(PLAIN, [SERVER_IP.parse()?]);
    let proxy = Proxy::with_config(
        Arc::new(BenchRules {
            names: &[BOUND, PLAIN],
            rule: "allow bench",
        }),
        Arc::new(resolver),
        Arc::new(NullSink),
        ProxyConfig {
            credentials,
            tls: Some(Arc::new(tls)),
            ..ProxyConfig::default()
        },
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("proxy".into())
        .spawn(move || runtime.block_on(proxy.serve_std(listener)))?;

    let tunnel_client = connector(&internet_pem)?;
    let bound_client = connector(&sandbox_pem)?;
    let port = server.port();
    let mb = bytes as f64 / (1024.0 * 1024.0);
    const NAMES: [&str; 2] = ["tunnel", "tls-terminating"];
    // fig[round][mode] = (ms per request, MB/s)
    let mut fig: Vec<Round> = Vec::new();
    for round in 1..=rounds {
        let mut this = [(0.0, 0.0, 0.0); 2];
        let order = if round % 2 == 1 { [0usize, 1] } else { [1, 0] };
        for mode in order {
            let (name, client) = if mode == 0 {
                (PLAIN, &tunnel_client)
            } else {
                (BOUND, &bound_client)
            };
            let l = latency(proxy_addr, name, port, client, requests).await?;
            let b = bulk(proxy_addr, name, port, client, bytes).await?;
            let d = download(proxy_addr, name, port, client, bytes).await?;
            this[mode] = (
                l.as_secs_f64() * 1000.0 / requests as f64,
                mb / b.as_secs_f64(),
                mb / d.as_secs_f64(),
            );
        }
        println!(
            "round {round} (load {}): {} {:.3} ms/req up {:.0} MB/s down {:.0} MB/s; {} {:.3} ms/req up {:.0} MB/s down {:.0} MB/s",
            load_average(),
            NAMES[0],
            this[0].0,
            this[0].1,
            this[0].2,
            NAMES[1],
            this[1].0,
            this[1].1,
            this[1].2
        );
        fig.push(this);
    }
    println!("load average at end: {}", load_average());
    let per_round = |g: &dyn Fn(&Round) -> f64| median(fig.iter().map(g).collect());
    println!(
        "latency per new HTTPS connection + request (median of {rounds} rounds, {requests} requests): tunnel {:.3} ms, tls-terminating {:.3} ms, added {:.3} ms, ratio {:.2}",
        per_round(&|f| f[0].0),
        per_round(&|f| f[1].0),
        per_round(&|f| f[1].0 - f[0].0),
        per_round(&|f| f[1].0 / f[0].0),
    );
    println!(
        "throughput ({megabytes} MB upload in one request, median of {rounds} rounds): tunnel {:.0} MB/s, tls-terminating {:.0} MB/s, ratio {:.2}",
        per_round(&|f| f[0].1),
        per_round(&|f| f[1].1),
        per_round(&|f| f[1].1 / f[0].1),
    );
    println!(
        "throughput ({megabytes} MB download in one response, median of {rounds} rounds): tunnel {:.0} MB/s, tls-terminating (scrubbed) {:.0} MB/s, ratio {:.2}",
        per_round(&|f| f[0].2),
        per_round(&|f| f[1].2),
        per_round(&|f| f[1].2 / f[0].2),
    );
    Ok(())
}

//! The tests' own "internet" on loopback: echo and HTTP servers on 127.0.0.x, a static resolver
//! mapping test names to them, exact-match rules, and an event recorder.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox_proxy::{
    EgressEvent, EgressRules, EventSink, Host, Outcome, Proxy, ProxyConfig, Resolver, Stage,
    StaticResolver, Verdict,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Exact-match rules: deny list first, then allow list (`host` or `host:port`), else deny.
/// Addresses in `special_ok` may be dialled although they are loopback/private.
#[derive(Default, Clone)]
pub struct TestRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub special_ok: Vec<IpAddr>,
}

impl TestRules {
    pub fn allow(names: &[&str]) -> Self {
        Self {
            allow: names.iter().map(|s| (*s).to_owned()).collect(),
            ..Self::default()
        }
    }

    pub fn deny(mut self, names: &[&str]) -> Self {
        self.deny.extend(names.iter().map(|s| (*s).to_owned()));
        self
    }

    pub fn special_ok(mut self, addrs: &[IpAddr]) -> Self {
        self.special_ok.extend_from_slice(addrs);
        self
    }
}

impl EgressRules for TestRules {
    fn decide(&self, host: &Host, port: u16) -> Verdict {
        let name = host.to_string();
        let with_port = format!("{name}:{port}");
        let hit = |list: &[String]| {
            list.iter()
                .find(|r| **r == name || **r == with_port)
                .cloned()
        };
        if let Some(rule) = hit(&self.deny) {
            return Verdict::deny(format!("deny {rule}"));
        }
        if let Some(rule) = hit(&self.allow) {
            return Verdict::allow(format!("allow {rule}"));
        }
        Verdict::deny("default deny")
    }

    fn may_allow(&self, host: &Host) -> bool {
        let name = host.to_string();
        !self.deny.contains(&name)
            && self
                .allow
                .iter()
                .any(|r| *r == name || r.strip_prefix(&format!("{name}:")).is_some())
    }

    fn allows_special_address(&self, _host: &Host, _port: u16, addr: IpAddr) -> Option<String> {
        self.special_ok
            .contains(&addr)
            .then(|| format!("allow address {addr}"))
    }
}

/// Collects every event the proxy emits.
#[derive(Default, Clone)]
pub struct Recorder {
    events: Arc<Mutex<Vec<EgressEvent>>>,
}

impl EventSink for Recorder {
    fn record(&self, event: &EgressEvent) {
        self.events.lock().unwrap().push(event.clone());
    }
}

impl Recorder {
    pub fn all(&self) -> Vec<EgressEvent> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` `Finished` events have been recorded, and returns them.
    pub async fn finished(&self, n: usize) -> Vec<EgressEvent> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let done: Vec<_> = self
                .all()
                .into_iter()
                .filter(|e| e.stage == Stage::Finished)
                .collect();
            if done.len() >= n {
                return done;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {n} finished events after 10 s: {:#?}",
                done.len(),
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The single finished event (waits for it).
    pub async fn one(&self) -> EgressEvent {
        let mut done = self.finished(1).await;
        assert_eq!(done.len(), 1, "expected one finished event: {done:#?}");
        done.remove(0)
    }
}

pub struct TestProxy {
    pub addr: SocketAddr,
    pub events: Recorder,
    pub task: JoinHandle<()>,
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start_proxy(rules: TestRules, resolver: impl Resolver + 'static) -> TestProxy {
    start_proxy_with(rules, resolver, ProxyConfig::default()).await
}

pub async fn start_proxy_with(
    rules: TestRules,
    resolver: impl Resolver + 'static,
    config: ProxyConfig,
) -> TestProxy {
    // As the runtime does: a std listener bound elsewhere and handed over.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let events = Recorder::default();
    let proxy = Proxy::with_config(
        Arc::new(rules),
        Arc::new(resolver),
        Arc::new(events.clone()),
        config,
    );
    let task = tokio::spawn(async move {
        proxy.serve_std(listener).await.unwrap();
    });
    TestProxy { addr, events, task }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The address the test servers listen on: loopback, but not 127.0.0.1, so that tests can
/// except exactly this address and still show 127.0.0.1 being refused.
pub const SERVER_IP: &str = "127.0.0.2";

/// A resolver mapping test names to `ip`.
pub fn resolver_for(names: &[&str], addr: IpAddr) -> StaticResolver {
    names
        .iter()
        .fold(StaticResolver::new(), |r, name| r.with(name, [addr]))
}

/// A proxy that allows `name` (and the test servers' address) and resolves it to `SERVER_IP`.
pub async fn proxy_allowing(name: &str) -> TestProxy {
    start_proxy(
        TestRules::allow(&[name]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&[name], ip(SERVER_IP)),
    )
    .await
}

/// A port on `SERVER_IP` that nobody listens on (bound, learnt, closed): a refused upstream,
/// or a free port for a server the test starts.
pub fn unused_port() -> u16 {
    std::net::TcpListener::bind((SERVER_IP, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An echo server; counts accepted connections.
pub struct Echo {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    _task: JoinHandle<()>,
}

impl Echo {
    pub async fn start(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        Self {
            addr,
            accepted,
            _task: task,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// What the HTTP test server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

/// A tiny HTTP/1.1 origin server: reads a head and a Content-Length body, records them, answers
/// `200` with `hello <path>` and closes.
pub struct Web {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _task: JoinHandle<()>,
}

impl Web {
    pub async fn start(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let _ = serve_one(s, record).await;
                });
            }
        });
        Self {
            addr,
            seen,
            _task: task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve_one(mut s: TcpStream, record: Arc<Mutex<Vec<Seen>>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        assert!(buf.len() < 65536, "test server: head too large");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
    let reply = format!("hello {path} ({} body bytes)", body.len());
    record.lock().unwrap().push(Seen { head, body });
    s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
            reply.len()
        )
        .as_bytes(),
    )
    .await?;
    s.shutdown().await
}

/// Sends `request` on a fresh connection to the proxy and reads the whole answer (the proxy or
/// origin closes after answering).
pub async fn roundtrip(proxy: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("proxy answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads an HTTP response head (up to the blank line) byte by byte, so nothing after it is
/// consumed.
pub async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
            .await
            .expect("response head within 10 s")
            .unwrap();
        assert!(
            n == 1,
            "connection closed inside the head: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Opens a CONNECT tunnel through the proxy and returns the stream after the `200`.
pub async fn connect_tunnel(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(
        head.starts_with("HTTP/1.1 200 "),
        "CONNECT {target} not established: {head}"
    );
    s
}

/// Writes `data` and reads the same number of bytes back.
pub async fn echo_through(s: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(data).await.unwrap();
    };
    let read = async {
        let mut back = vec![0u8; data.len()];
        r.read_exact(&mut back).await.unwrap();
        back
    };
    let ((), back) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(write, read) })
            .await
            .expect("echo within 20 s");
    back
}

/// Asserts the outcome of an event, printing the event on failure.
pub fn assert_outcome(event: &EgressEvent, want: &Outcome) {
    assert_eq!(&event.outcome, want, "event: {event:#?}");
}

/// A payload with a recognisable pattern.
pub fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect()
}

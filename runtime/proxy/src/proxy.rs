//! The proxy server: accepting on a given listener, telling the protocols apart, deciding,
//! resolving once, checking the address, dialling it and relaying.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::credentials::{Credentials, InjectedHeader};
use crate::dns_stub::{self, StandIns};
use crate::error_text::chain;
use crate::events::{EgressEvent, EventSink, Injection, Outcome, Protocol, Stage};
use crate::guard::{SpecialRange, classify};
use crate::http::{self, ForwardHead, HttpError, Request};
use crate::pump::{Counters, PumpEnd, pump};
use crate::resolve::Resolver;
use crate::rules::{EgressRules, Host};
use crate::sni::{self, Peek, SniCheck};
use crate::socks::{self, Reply, SocksError};
use crate::tls_inject::{self, InterceptError, TlsInterceptor};
use crate::transparent;

/// Limits and timeouts. The defaults suit one sandbox's tools.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Time a client has to finish its HTTP head or SOCKS5 handshake.
    pub handshake_timeout: Duration,
    /// Time the host-side name lookup may take.
    pub resolve_timeout: Duration,
    /// Time one TCP connect to a checked address may take.
    pub connect_timeout: Duration,
    /// A relayed connection with no bytes either way for this long is closed.
    pub idle_timeout: Duration,
    /// Connections handled at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// The largest HTTP request head accepted (larger gets a 400).
    pub max_head_bytes: usize,
    /// Headers added to plain-HTTP requests to matching hosts (secrets stay on this side).
    pub credentials: Credentials,
    /// Relay tunnels with `splice(2)` (zero-copy, the default) rather than through a buffer.
    pub splice: bool,
    /// Live rules and the decider asked about unlisted hosts (`crate::approval`).
    pub approvals: Option<Arc<crate::approval::Approvals>>,
    /// What a tunnel (CONNECT, SOCKS5) whose TLS ClientHello names another server gets.
    pub sni: SniCheck,
    /// TLS termination for the `https` entries of `credentials` (none: every tunnel is opaque).
    pub tls: Option<Arc<TlsInterceptor>>,
    /// Who opened a connection, as the runtime knows it: the tool call of the exec whose
    /// process holds the sandbox's end, and in a pod the member container it runs in (none:
    /// no connection is attributed).
    pub tool_calls: Option<Arc<dyn ToolCalls>>,
}

/// Who opened a connection, as the runtime found it from outside the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The tool-call id of the exec whose process holds the sandbox's end.
    pub tool_call_id: Option<String>,
    /// In a pod (one proxy for every container), the id of the member container whose
    /// process holds it.
    pub container: Option<String>,
}

/// Finds the tool call (and, in a pod, the container) a connection belongs to from outside
/// the sandbox (the runtime's attribution, `agent-sandbox`'s `sidecars/tool_calls.rs`):
/// never from what the sandbox sends. Called on a blocking thread, once per connection,
/// while its client waits.
pub trait ToolCalls: Send + Sync + std::fmt::Debug {
    /// Who holds the socket connected from `client` (the address the proxy saw, in the
    /// sandbox's network namespace).
    fn of(&self, client: SocketAddr) -> Origin;
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            resolve_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            max_connections: 512,
            max_head_bytes: 32 * 1024,
            credentials: Credentials::default(),
            splice: true,
            approvals: None,
            sni: SniCheck::Deny,
            tls: None,
            tool_calls: None,
        }
    }
}

/// Why the proxy stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The listener handed over could not be made non-blocking or registered with tokio.
    #[error("proxy listener cannot be used")]
    Listener(#[source] io::Error),
    /// `accept` failed with an error that is not transient.
    #[error("accepting a proxy connection failed")]
    Accept(#[source] io::Error),
}

/// A per-sandbox egress proxy. Cheap to clone; clones share rules, resolver, sink and counters.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    rules: Arc<dyn EgressRules>,
    resolver: Arc<dyn Resolver>,
    sink: Arc<dyn EventSink>,
    config: ProxyConfig,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy with default limits.
    pub fn new(
        rules: Arc<dyn EgressRules>,
        resolver: Arc<dyn Resolver>,
        sink: Arc<dyn EventSink>,
    ) -> Self {
        Self::with_config(rules, resolver, sink, ProxyConfig::default())
    }

    /// A proxy with the given limits.
    pub fn with_config(
        rules: Arc<dyn EgressRules>,
        resolver: Arc<dyn Resolver>,
        sink: Arc<dyn EventSink>,
        config: ProxyConfig,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                rules,
                resolver,
                sink,
                config,
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Serves a listener created elsewhere (for a sandbox: bound to 127.0.0.1 inside its
    /// network namespace). Runs until `accept` fails for good; dropping the future closes the
    /// listener and aborts every connection it is relaying.
    pub async fn serve_std(&self, listener: std::net::TcpListener) -> Result<(), ProxyError> {
        listener
            .set_nonblocking(true)
            .map_err(ProxyError::Listener)?;
        let listener = TcpListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.serve(listener).await
    }

    /// Serves a tokio listener; see [`Proxy::serve_std`].
    pub async fn serve(&self, listener: TcpListener) -> Result<(), ProxyError> {
        let slots = Arc::new(Semaphore::new(self.inner.config.max_connections.max(1)));
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = done {
                        tracing::error!(error = %e, "proxy connection task failed");
                    }
                }
                accepted = accept(&listener, &slots) => match accepted {
                    Ok((stream, client, permit)) => {
                        let inner = Arc::clone(&self.inner);
                        tasks.spawn(async move {
                            inner.handle(stream, client).await;
                            drop(permit);
                        });
                    }
                    Err(e) if is_transient(&e) => {
                        tracing::warn!(error = %e, "proxy accept failed, retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(ProxyError::Accept(e)),
                },
            }
        }
    }
}

impl Proxy {
    /// Serves transparent egress (policy `network.transparent`): connections redirected to
    /// `listeners` inside the sandbox's namespace are decided on the name their stand-in
    /// address stands for (or the address itself), port and SNI, and DNS queries on `dns`
    /// are answered by the stub. Runs until a socket fails for good.
    pub async fn serve_transparent(
        &self,
        listeners: Vec<std::net::TcpListener>,
        dns: Vec<std::net::UdpSocket>,
        stand_ins: Arc<StandIns>,
    ) -> Result<(), ProxyError> {
        let mut tasks = JoinSet::new();
        for listener in listeners {
            listener
                .set_nonblocking(true)
                .map_err(ProxyError::Listener)?;
            let listener = TcpListener::from_std(listener).map_err(ProxyError::Listener)?;
            let (inner, names) = (Arc::clone(&self.inner), Arc::clone(&stand_ins));
            tasks.spawn(async move { inner.accept_transparent(listener, names).await });
        }
        for socket in dns {
            socket.set_nonblocking(true).map_err(ProxyError::Listener)?;
            let socket = tokio::net::UdpSocket::from_std(socket).map_err(ProxyError::Listener)?;
            let (inner, names) = (Arc::clone(&self.inner), Arc::clone(&stand_ins));
            tasks.spawn(async move { inner.serve_dns(socket, names).await });
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => tracing::error!(error = %e, "transparent egress task failed"),
            }
        }
        Ok(())
    }
}

impl Inner {
    async fn accept_transparent(
        self: Arc<Self>,
        listener: TcpListener,
        names: Arc<StandIns>,
    ) -> Result<(), ProxyError> {
        let slots = Arc::new(Semaphore::new(self.config.max_connections.max(1)));
        loop {
            match accept(&listener, &slots).await {
                Ok((stream, client, permit)) => {
                    let (inner, names) = (Arc::clone(&self), Arc::clone(&names));
                    tokio::spawn(async move {
                        inner.handle_transparent(stream, client, &names).await;
                        drop(permit);
                    });
                }
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "transparent accept failed, retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(ProxyError::Accept(e)),
            }
        }
    }

    async fn handle_transparent(
        &self,
        mut stream: TcpStream,
        client: SocketAddr,
        names: &StandIns,
    ) {
        let mut rec = self.record(client, Instant::now(), Protocol::Transparent);
        let counters = Counters::new();
        let _ = stream.set_nodelay(true);
        let outcome = self
            .serve_redirected(&mut stream, &mut rec, &counters, names)
            .await;
        if !rec.relayed {
            // A refused connection is reset: the tool sees "connection refused/reset" at once.
            let _ = stream.set_zero_linger();
        }
        drop(stream);
        self.emit(&rec, Stage::Finished, outcome, &counters);
    }

    async fn serve_redirected(
        &self,
        stream: &mut TcpStream,
        rec: &mut Record,
        counters: &Counters,
        names: &StandIns,
    ) -> Outcome {
        let target = match transparent::original_destination(stream) {
            Ok(t) => t,
            Err(e) => return client_error(&format!("no original destination: {e}")),
        };
        // A stand-in address means the name the stub gave it for; any other address was not
        // learnt from the stub (a raw address) and is judged as that address.
        let host = match names.name_of(target.ip()) {
            Some(name) => Host::Domain(name),
            None => Host::Ip(target.ip().to_canonical()),
        };
        rec.host = Some(host.clone());
        rec.port = Some(target.port());
        let upstream = match self.open(&host, target.port(), rec).await {
            Ok(u) => u,
            Err(refusal) => return refusal.outcome(),
        };
        self.tunnel(
            stream,
            upstream,
            Vec::new(),
            &host,
            target.port(),
            rec,
            counters,
        )
        .await
    }

    async fn serve_dns(
        self: Arc<Self>,
        socket: tokio::net::UdpSocket,
        names: Arc<StandIns>,
    ) -> Result<(), ProxyError> {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = match socket.recv_from(&mut buf).await {
                Ok(got) => got,
                Err(e) if is_transient(&e) => continue,
                Err(e) => return Err(ProxyError::Accept(e)),
            };
            let start = Instant::now();
            let query = buf.get(..n).unwrap_or_default();
            let may_open = |h: &Host| {
                self.rules.may_allow(h)
                    || self
                        .config
                        .approvals
                        .as_ref()
                        .is_some_and(|a| a.may_open(h))
            };
            let reply = dns_stub::answer(query, &may_open, &names);
            if !reply.bytes.is_empty() {
                let _ = socket.send_to(&reply.bytes, from).await;
            }
            if reply.refused {
                // A lookup of a name the policy never allows: what the tool tried, recorded
                // (rate-limited like every denial).
                let host = reply.question.and_then(|q| q.host);
                let rec = Record {
                    host,
                    port: Some(53),
                    rule: Some(DNS_REFUSED_RULE.to_owned()),
                    ..self.record(from, start, Protocol::Dns)
                };
                self.emit(&rec, Stage::Finished, Outcome::Denied, &Counters::new());
            }
        }
    }
}

async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> io::Result<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let permit = Arc::clone(slots)
        .acquire_owned()
        .await
        .map_err(|_| io::Error::other("connection limit semaphore closed"))?;
    let (stream, client) = listener.accept().await?;
    Ok((stream, client, permit))
}

fn is_transient(e: &io::Error) -> bool {
    use nix::errno::Errno;
    // Out of descriptors or buffers: the listener itself is fine, retry after a pause.
    const RESOURCE: [Errno; 4] = [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM];
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::OutOfMemory
    ) || e
        .raw_os_error()
        .is_some_and(|code| RESOURCE.contains(&Errno::from_raw(code)))
}

/// What is known about a connection so far, for its events.
struct Record {
    id: u64,
    client: SocketAddr,
    start: Instant,
    protocol: Protocol,
    host: Option<Host>,
    port: Option<u16>,
    method: Option<String>,
    path: Option<String>,
    sni: Option<String>,
    rule: Option<String>,
    address_rule: Option<String>,
    resolved: Option<SocketAddr>,
    /// The tool call the request's header claimed (`X-Agent-Sandbox-Tool-Call`).
    tool_call: Option<String>,
    /// Who opened the connection, once looked up (`ProxyConfig::tool_calls`).
    origin: Option<Origin>,
    /// The relay ran to its end: both sides are done, nothing is left to drain.
    relayed: bool,
    /// The credential the proxy added to this connection's requests.
    credential: Option<Injection>,
}

/// An `https` credential that binds a tunnel, with the interceptor that serves it.
struct TlsBinding<'a> {
    tls: &'a TlsInterceptor,
    index: usize,
    entry: &'a InjectedHeader,
}

/// Why `open` did not produce an upstream connection.
enum Refusal {
    Denied { rule: String },
    Special { addr: IpAddr, range: SpecialRange },
    Resolve { reason: String },
    Upstream { reason: String, kind: io::ErrorKind },
}

impl Refusal {
    fn outcome(&self) -> Outcome {
        match self {
            Self::Denied { .. } => Outcome::Denied,
            Self::Special { addr, range } => Outcome::SpecialAddress {
                addr: *addr,
                range: *range,
            },
            Self::Resolve { reason } => Outcome::ResolveFailed {
                reason: reason.clone(),
            },
            Self::Upstream { reason, .. } => Outcome::UpstreamFailed {
                reason: reason.clone(),
            },
        }
    }

    fn socks_reply(&self) -> Reply {
        match self {
            Self::Denied { .. } | Self::Special { .. } => Reply::NotAllowed,
            Self::Resolve { .. } => Reply::HostUnreachable,
            Self::Upstream { kind, .. } => match kind {
                io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
                io::ErrorKind::NetworkUnreachable => Reply::NetworkUnreachable,
                io::ErrorKind::HostUnreachable | io::ErrorKind::TimedOut => Reply::HostUnreachable,
                _ => Reply::GeneralFailure,
            },
        }
    }

    fn http_response(&self, host: &Host, port: u16) -> Vec<u8> {
        match self {
            Self::Denied { rule } => http::response(
                403,
                DENIED_REASON,
                (DENIED_HEADER, rule),
                &format!(
                    "agent-sandbox: connection to {host}:{port} denied by policy rule \"{rule}\""
                ),
            ),
            Self::Special { addr, range } => http::response(
                403,
                DENIED_REASON,
                (DENIED_HEADER, &format!("{} address {addr}", range.name())),
                &format!(
                    "agent-sandbox: {host} resolves to {addr}, a {} address the policy does not allow",
                    range.name()
                ),
            ),
            Self::Resolve { reason } => http::response(
                502,
                "Bad Gateway",
                (ERROR_HEADER, "resolve"),
                &format!("agent-sandbox: {host} could not be resolved: {reason}"),
            ),
            Self::Upstream { reason, .. } => http::response(
                502,
                "Bad Gateway",
                (ERROR_HEADER, "upstream"),
                &format!("agent-sandbox: connecting to {host}:{port} failed: {reason}"),
            ),
        }
    }
}

/// Header naming the rule (or refused address class) on a policy refusal.
pub const DENIED_HEADER: &str = "X-Agent-Sandbox-Denied";
/// The reason phrase of a policy refusal's `403` (tools that print the status line, e.g.
/// `curl -v` or an SSH `ProxyCommand`, show that the policy refused, not an outage).
pub const DENIED_REASON: &str = "Forbidden by agent-sandbox policy";
/// The rule a refused plain request whose Host header names another host is reported under.
pub const HOST_MISMATCH_RULE: &str = "host header mismatch";
/// The rule a refused tunnel whose TLS server name (SNI) differs from its host is reported under.
pub const SNI_MISMATCH_RULE: &str = "sni mismatch";
/// The rule a refused tunnel whose first bytes start a TLS ClientHello that cannot be read
/// (malformed, too large, or not complete in time) is reported under.
pub const SNI_UNREADABLE_RULE: &str = "unreadable tls client hello";
/// The rule a DNS stub refusal (NXDOMAIN for a name no rule allows) is recorded under.
pub const DNS_REFUSED_RULE: &str = "dns: no rule allows the name";
/// Header naming the kind of failure on a 400 or 502 from the proxy itself.
pub const ERROR_HEADER: &str = "X-Agent-Sandbox-Error";

impl Inner {
    /// A new connection's record: its id, client, start and protocol, nothing known yet.
    fn record(&self, client: SocketAddr, start: Instant, protocol: Protocol) -> Record {
        Record {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            client,
            start,
            protocol,
            host: None,
            port: None,
            method: None,
            path: None,
            sni: None,
            rule: None,
            address_rule: None,
            resolved: None,
            tool_call: None,
            origin: None,
            relayed: false,
            credential: None,
        }
    }

    async fn handle(&self, mut stream: TcpStream, client: SocketAddr) {
        let mut rec = self.record(client, Instant::now(), Protocol::Unknown);
        let counters = Counters::new();
        // Small requests should not wait for Nagle; failure only costs latency.
        let _ = stream.set_nodelay(true);
        let outcome = self.dispatch(&mut stream, &mut rec, &counters).await;
        if !rec.relayed {
            // A refusal or an error answer was written: let it reach the client.
            close_gracefully(&mut stream).await;
        }
        self.emit(&rec, Stage::Finished, outcome, &counters);
    }

    async fn dispatch(
        &self,
        stream: &mut TcpStream,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        let mut first = [0u8; 1];
        match timeout(self.config.handshake_timeout, stream.peek(&mut first)).await {
            Err(_) => return client_error("no request within the handshake timeout"),
            Ok(Err(e)) => return client_error(&e.to_string()),
            Ok(Ok(0)) => return client_error("closed before sending a request"),
            Ok(Ok(_)) => {}
        }
        // One port serves both protocols: a SOCKS5 greeting starts with its version byte 0x05,
        // an HTTP request with an ASCII method name.
        match first[0] {
            0x05 => self.serve_socks(stream, rec, counters).await,
            b if b.is_ascii_alphabetic() => self.serve_http(stream, rec, counters).await,
            other => {
                let reason = format!(
                    "unrecognised protocol (first byte {other:#04x}): speak HTTP proxy or SOCKS5"
                );
                let reply = if other == 0x04 {
                    // A SOCKS4 client understands only a SOCKS4 rejection.
                    vec![0x00, 0x5b, 0, 0, 0, 0, 0, 0]
                } else {
                    http::response(400, "Bad Request", (ERROR_HEADER, "bad-request"), &reason)
                };
                let _ = stream.write_all(&reply).await;
                Outcome::BadRequest { reason }
            }
        }
    }

    #[expect(clippy::too_many_lines)]
    async fn serve_http(
        &self,
        stream: &mut TcpStream,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        rec.protocol = Protocol::HttpForward;
        let read = timeout(
            self.config.handshake_timeout,
            http::read_request(stream, self.config.max_head_bytes),
        )
        .await;
        let request = match read {
            Err(_) => {
                let reason = "request head not complete within the handshake timeout";
                let _ = stream
                    .write_all(&http::response(
                        408,
                        "Request Timeout",
                        (ERROR_HEADER, "timeout"),
                        reason,
                    ))
                    .await;
                return client_error(reason);
            }
            Ok(Err(e @ (HttpError::Truncated | HttpError::Read(_)))) => {
                return client_error(&chain(&e));
            }
            Ok(Err(e @ HttpError::HostMismatch { .. })) => {
                // A Host header naming another site is domain fronting: a policy refusal (403),
                // not a malformed request.
                let reason = chain(&e);
                tracing::warn!(connection = rec.id, %reason, "egress host header mismatch");
                let _ = stream
                    .write_all(&http::response(
                        403,
                        DENIED_REASON,
                        (DENIED_HEADER, HOST_MISMATCH_RULE),
                        &format!("agent-sandbox: request refused by policy: {reason}"),
                    ))
                    .await;
                rec.rule = Some(HOST_MISMATCH_RULE.to_owned());
                return Outcome::Denied;
            }
            Ok(Err(e)) => {
                let reason = chain(&e);
                let _ = stream
                    .write_all(&http::response(
                        400,
                        "Bad Request",
                        (ERROR_HEADER, "bad-request"),
                        &format!("agent-sandbox: bad proxy request: {reason}"),
                    ))
                    .await;
                return Outcome::BadRequest { reason };
            }
            Ok(Ok(request)) => request,
        };
        let (host, port, early, forward) = match request {
            Request::Connect {
                host,
                port,
                early,
                tool_call,
            } => {
                rec.tool_call = tool_call;
                (host, port, early, None)
            }
            Request::Forward {
                host,
                port,
                head,
                tool_call,
            } => {
                rec.tool_call = tool_call;
                (host, port, Vec::new(), Some(head))
            }
        };
        let is_connect = forward.is_none();
        if is_connect {
            rec.protocol = Protocol::HttpConnect;
        }
        rec.host = Some(host.clone());
        rec.port = Some(port);
        if let Some(head) = &forward {
            let (method, path) = head.method_and_path();
            rec.method = Some(method);
            rec.path = Some(path);
        }
        let mut upstream = match self.open(&host, port, rec).await {
            Ok(upstream) => upstream,
            Err(refusal) => {
                let _ = stream.write_all(&refusal.http_response(&host, port)).await;
                return refusal.outcome();
            }
        };
        if is_connect && let Err(e) = stream.write_all(http::CONNECT_OK).await {
            return client_error(&e.to_string());
        }
        let Some(head) = &forward else {
            return self
                .tunnel(stream, upstream, early, &host, port, rec, counters)
                .await;
        };
        if let Some(entry) = self.config.credentials.find(&host, port) {
            return self
                .forward_bound(entry, head, stream, upstream, &host, port, rec, counters)
                .await;
        }
        let first_bytes = head.encode(None);
        if let Err(outcome) = send_first(&mut upstream, &first_bytes, counters).await {
            return outcome;
        }
        self.relay(stream, upstream, rec, counters).await
    }

    /// Serves an opened tunnel to `host:port` whose client has been told it is open: through
    /// the TLS interception if a credential binds it, else after the server-name check of its
    /// first bytes (`early`, then what the client sends), relayed.
    #[allow(clippy::too_many_arguments)]
    async fn tunnel(
        &self,
        stream: &mut TcpStream,
        mut upstream: TcpStream,
        early: Vec<u8>,
        host: &Host,
        port: u16,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        if let Some(binding) = self.tls_binding(host, port) {
            return self
                .intercept(binding, stream, early, upstream, rec, counters)
                .await;
        }
        let first_bytes = match self.tunnel_start(stream, &upstream, early, host, rec).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        if let Err(outcome) = send_first(&mut upstream, &first_bytes, counters).await {
            return outcome;
        }
        self.relay(stream, upstream, rec, counters).await
    }

    /// Reads a tunnel's first bytes for the TLS server name and applies the policy's
    /// `sni_mismatch` choice. Returns the bytes to forward, or the refusal (already told to
    /// the client as a TLS alert).
    async fn tunnel_start(
        &self,
        client: &mut TcpStream,
        upstream: &TcpStream,
        early: Vec<u8>,
        host: &Host,
        rec: &mut Record,
    ) -> Result<Vec<u8>, Outcome> {
        if self.config.sni == SniCheck::Off {
            return Ok(early);
        }
        let (bytes, peek) = sni::read_client_hello(
            client,
            upstream,
            early,
            self.config.handshake_timeout,
            self.config.idle_timeout,
        )
        .await;
        let problem = match &peek {
            Peek::Sni(name) => {
                rec.sni = Some(name.clone());
                // An IP literal has no name to compare with; the name is recorded.
                matches!(host, Host::Domain(d) if d != name).then_some(SNI_MISMATCH_RULE)
            }
            Peek::Malformed(_) | Peek::Incomplete => Some(SNI_UNREADABLE_RULE),
            Peek::NoSni | Peek::NotTls => None,
        };
        let Some(rule) = problem else {
            return Ok(bytes);
        };
        tracing::warn!(
            connection = rec.id,
            %host,
            sni = rec.sni.as_deref().unwrap_or(""),
            detail = ?peek,
            action = ?self.config.sni,
            "egress tunnel {rule}"
        );
        if self.config.sni == SniCheck::Record {
            return Ok(bytes);
        }
        rec.rule = Some(rule.to_owned());
        let _ = client.write_all(&sni::ACCESS_DENIED_ALERT).await;
        Err(Outcome::Denied)
    }

    async fn serve_socks(
        &self,
        stream: &mut TcpStream,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        rec.protocol = Protocol::Socks5;
        let (host, port) = match timeout(self.config.handshake_timeout, socks::handshake(stream))
            .await
        {
            Err(_) => {
                return client_error("socks5 handshake not complete within the handshake timeout");
            }
            Ok(Err(SocksError::Io(e))) => return client_error(&e.to_string()),
            Ok(Err(e)) => {
                if let Some(reply) = e.reply() {
                    let _ = socks::write_reply(stream, reply).await;
                }
                return Outcome::BadRequest { reason: chain(&e) };
            }
            Ok(Ok(target)) => target,
        };
        rec.host = Some(host.clone());
        rec.port = Some(port);
        let upstream = match self.open(&host, port, rec).await {
            Ok(upstream) => upstream,
            Err(refusal) => {
                let _ = socks::write_reply(stream, refusal.socks_reply()).await;
                return refusal.outcome();
            }
        };
        if let Err(e) = socks::write_reply(stream, Reply::Succeeded).await {
            return client_error(&e.to_string());
        }
        self.tunnel(stream, upstream, Vec::new(), &host, port, rec, counters)
            .await
    }

    /// The TLS interception for a tunnel to `host:port`, if an `https` credential binds it.
    fn tls_binding(&self, host: &Host, port: u16) -> Option<TlsBinding<'_>> {
        let tls = self.config.tls.as_deref()?;
        let (index, entry) = self.config.credentials.find_tls(host, port)?;
        Some(TlsBinding { tls, index, entry })
    }

    /// Serves a tunnel to a bound domain through `crate::tls_inject` instead of relaying it.
    async fn intercept(
        &self,
        binding: TlsBinding<'_>,
        stream: &mut TcpStream,
        early: Vec<u8>,
        upstream: TcpStream,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        self.emit(rec, Stage::Opened, Outcome::Allowed, counters);
        let Some(host) = rec.host.clone() else {
            return client_error("tunnel without a host");
        };
        let Some(scrubber) = self.config.credentials.scrubber(binding.entry) else {
            return client_error("cannot build the search for the credential");
        };
        let Some(guard) = self.config.credentials.guard() else {
            return client_error("cannot build the search for placeholders");
        };
        let job = tls_inject::Intercept {
            tls: Some(binding.tls),
            scrubber,
            guard,
            entry: binding.entry,
            index: binding.index,
            host: &host,
            port: rec.port.unwrap_or(0),
            connection: rec.id,
            handshake_timeout: self.config.handshake_timeout,
            idle_timeout: self.config.idle_timeout,
            max_head_bytes: self.config.max_head_bytes,
        };
        let done =
            tls_inject::serve(job, stream, early, upstream, &counters.up, &counters.down).await;
        rec.credential = Some(Injection {
            header: binding.entry.name.clone(),
            requests: done.requests,
            https: true,
        });
        rec.relayed = true;
        intercepted_outcome(done, rec)
    }

    /// Serves an absolute-form `http://` request to a host a plain credential binds: checked,
    /// injected and its response scrubbed (`crate::tls_inject::serve_plain`), like inside TLS.
    #[allow(clippy::too_many_arguments)]
    async fn forward_bound(
        &self,
        entry: &InjectedHeader,
        head: &ForwardHead,
        stream: &mut TcpStream,
        upstream: TcpStream,
        host: &Host,
        port: u16,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        self.emit(rec, Stage::Opened, Outcome::Allowed, counters);
        let Some(scrubber) = self.config.credentials.scrubber(entry) else {
            return client_error("cannot build the search for the credential");
        };
        let Some(guard) = self.config.credentials.guard() else {
            return client_error("cannot build the search for placeholders");
        };
        let job = tls_inject::Intercept {
            tls: None,
            scrubber,
            guard,
            entry,
            index: 0,
            host,
            port,
            connection: rec.id,
            handshake_timeout: self.config.handshake_timeout,
            idle_timeout: self.config.idle_timeout,
            max_head_bytes: self.config.max_head_bytes,
        };
        let done = tls_inject::serve_plain(
            job,
            stream,
            head.encode(None),
            upstream,
            &counters.up,
            &counters.down,
        )
        .await;
        rec.credential = Some(Injection {
            header: entry.name.clone(),
            requests: done.requests,
            https: false,
        });
        rec.relayed = true;
        intercepted_outcome(done, rec)
    }

    async fn relay(
        &self,
        stream: &TcpStream,
        upstream: TcpStream,
        rec: &mut Record,
        counters: &Counters,
    ) -> Outcome {
        self.emit(rec, Stage::Opened, Outcome::Allowed, counters);
        match pump(
            stream,
            &upstream,
            self.config.idle_timeout,
            counters,
            self.config.splice,
        )
        .await
        {
            PumpEnd::Closed => rec.relayed = true,
            PumpEnd::Idle => tracing::debug!(connection = rec.id, "egress connection idle, closed"),
            PumpEnd::Failed(e) => {
                tracing::debug!(connection = rec.id, error = %e, "egress connection ended with an error");
            }
        }
        Outcome::Allowed
    }

    /// Decides, resolves once, checks every address and dials the first checked one that
    /// answers. The returned stream is connected to an address that passed the checks.
    #[expect(clippy::too_many_lines)]
    async fn open(&self, host: &Host, port: u16, rec: &mut Record) -> Result<TcpStream, Refusal> {
        if rec.origin.is_none() {
            // While the client waits for this answer its socket is still open, so the
            // process holding it can be found.
            let found = match &self.config.tool_calls {
                Some(t) => {
                    let (t, client) = (Arc::clone(t), rec.client);
                    tokio::task::spawn_blocking(move || t.of(client))
                        .await
                        .unwrap_or_default()
                }
                None => Origin::default(),
            };
            rec.origin = Some(found);
        }
        let decided = match &self.config.approvals {
            Some(approvals) => {
                let tool_call = crate::approval::ToolCall {
                    id: rec.origin.as_ref().and_then(|o| o.tool_call_id.as_deref()),
                    claimed: rec.tool_call.as_deref(),
                };
                approvals
                    .decide(&*self.rules, host, port, rec.protocol, tool_call)
                    .await
            }
            None => crate::approval::Decided::fixed(self.rules.decide(host, port)),
        };
        let verdict = decided.verdict.clone();
        rec.rule = Some(verdict.rule.clone());
        if !verdict.allowed {
            return Err(Refusal::Denied { rule: verdict.rule });
        }
        let addrs = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Domain(name) => {
                match timeout(self.config.resolve_timeout, self.resolver.resolve(name)).await {
                    Err(_) => {
                        return Err(Refusal::Resolve {
                            reason: "lookup timed out".into(),
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Refusal::Resolve {
                            reason: e.to_string(),
                        });
                    }
                    Ok(Ok(addrs)) if addrs.is_empty() => {
                        return Err(Refusal::Resolve {
                            reason: "no addresses".into(),
                        });
                    }
                    Ok(Ok(addrs)) => addrs,
                }
            }
        };

        let mut refused: Option<(IpAddr, SpecialRange)> = None;
        let mut checked = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match classify(addr) {
                None => checked.push((addr, None)),
                Some(range) => match self
                    .rules
                    .allows_special_address(host, port, addr)
                    .or_else(|| decided.allows_special_address(port, addr))
                {
                    Some(rule) => {
                        tracing::debug!(connection = rec.id, %addr, range = range.name(), %rule, "special address allowed by policy");
                        checked.push((addr, Some(rule)));
                    }
                    None => {
                        tracing::warn!(connection = rec.id, %host, %addr, range = range.name(), "egress address refused");
                        refused.get_or_insert((addr, range));
                    }
                },
            }
        }
        if checked.is_empty() {
            let (addr, range) = refused.ok_or(Refusal::Resolve {
                reason: "no addresses".into(),
            })?;
            return Err(Refusal::Special { addr, range });
        }

        let mut last = Refusal::Upstream {
            reason: "no address answered".into(),
            kind: io::ErrorKind::Other,
        };
        for (addr, address_rule) in checked {
            let target = SocketAddr::new(addr, port);
            // Dial the SocketAddr that was checked: no name goes to the OS again.
            match timeout(self.config.connect_timeout, TcpStream::connect(target)).await {
                Ok(Ok(upstream)) => {
                    let _ = upstream.set_nodelay(true);
                    rec.resolved = Some(target);
                    rec.address_rule = address_rule;
                    return Ok(upstream);
                }
                Ok(Err(e)) => {
                    last = Refusal::Upstream {
                        reason: format!("{target}: {e}"),
                        kind: e.kind(),
                    };
                }
                Err(_) => {
                    last = Refusal::Upstream {
                        reason: format!("{target}: connect timed out"),
                        kind: io::ErrorKind::TimedOut,
                    };
                }
            }
        }
        Err(last)
    }

    fn emit(&self, rec: &Record, stage: Stage, outcome: Outcome, counters: &Counters) {
        let event = EgressEvent {
            stage,
            connection: rec.id,
            client: rec.client,
            protocol: rec.protocol,
            host: rec.host.as_ref().map(ToString::to_string),
            port: rec.port,
            method: rec.method.clone(),
            path: rec.path.clone(),
            sni: rec.sni.clone(),
            rule: rec.rule.clone(),
            address_rule: rec.address_rule.clone(),
            resolved: rec.resolved,
            outcome,
            bytes_up: counters.up.load(Ordering::Relaxed),
            bytes_down: counters.down.load(Ordering::Relaxed),
            duration: rec.start.elapsed(),
            credential: rec.credential.clone(),
            tool_call_id: rec.origin.as_ref().and_then(|o| o.tool_call_id.clone()),
            container: rec.origin.as_ref().and_then(|o| o.container.clone()),
            tool_call_claimed: rec.tool_call.clone(),
        };
        tracing::info!(
            target: "agent_sandbox::egress",
            stage = ?event.stage,
            connection = event.connection,
            client = %event.client,
            protocol = ?event.protocol,
            host = event.host.as_deref().unwrap_or(""),
            port = event.port.unwrap_or(0),
            sni = event.sni.as_deref().unwrap_or(""),
            rule = event.rule.as_deref().unwrap_or(""),
            address_rule = event.address_rule.as_deref().unwrap_or(""),
            resolved = ?event.resolved,
            outcome = ?event.outcome,
            bytes_up = event.bytes_up,
            bytes_down = event.bytes_down,
            duration_ms = event.duration.as_secs_f64() * 1000.0,
            "egress"
        );
        self.sink.record(&event);
    }
}

/// Sends the bytes read from the client before the relay (a request head, a ClientHello).
/// The outcome of a checked exchange with a credential-bound host, for its event.
fn intercepted_outcome(done: tls_inject::Intercepted, rec: &mut Record) -> Outcome {
    let Some(error) = done.error else {
        return Outcome::Allowed;
    };
    let reason = chain(&error);
    tracing::debug!(connection = rec.id, %reason, "intercepted connection ended early");
    if let Some(rule) = done.denied {
        rec.rule = Some(rule);
        return Outcome::Denied;
    }
    match error {
        InterceptError::UpstreamHandshake(_)
        | InterceptError::UpstreamHandshakeTimeout
        | InterceptError::Response { .. }
        | InterceptError::Malformed { .. } => Outcome::UpstreamFailed { reason },
        InterceptError::Request { .. } => Outcome::BadRequest { reason },
        InterceptError::ClientHandshake(_) | InterceptError::ClientHandshakeTimeout => {
            Outcome::ClientError { reason }
        }
        _ => Outcome::Allowed,
    }
}

async fn send_first(
    upstream: &mut TcpStream,
    bytes: &[u8],
    counters: &Counters,
) -> Result<(), Outcome> {
    if bytes.is_empty() {
        return Ok(());
    }
    upstream
        .write_all(bytes)
        .await
        .map_err(|e| Outcome::UpstreamFailed {
            reason: e.to_string(),
        })?;
    counters.up.fetch_add(
        u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    Ok(())
}

/// Closes our sending half, then reads and discards what the client still sends (bounded in
/// time and bytes), so that a refusal written just before is not lost to a TCP reset caused by
/// unread request bytes.
async fn close_gracefully(stream: &mut TcpStream) {
    const DRAIN_LIMIT: usize = 256 * 1024;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut scratch = [0u8; 4096];
        let mut total = 0usize;
        while total < DRAIN_LIMIT {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = timeout(Duration::from_millis(500), drain).await;
}

fn client_error(reason: &str) -> Outcome {
    Outcome::ClientError {
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_that_keep_the_listener_are_transient() {
        for code in [
            libc_code(nix::errno::Errno::EMFILE),
            libc_code(nix::errno::Errno::ENFILE),
        ] {
            assert!(is_transient(&io::Error::from_raw_os_error(code)), "{code}");
        }
        assert!(is_transient(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        assert!(!is_transient(&io::Error::from_raw_os_error(libc_code(
            nix::errno::Errno::EBADF
        ))));
        assert!(!is_transient(&io::Error::from_raw_os_error(libc_code(
            nix::errno::Errno::EINVAL
        ))));
    }

    fn libc_code(e: nix::errno::Errno) -> i32 {
        e as i32
    }

    #[test]
    fn refusals_map_to_socks_codes() {
        let upstream = |kind| Refusal::Upstream {
            reason: String::new(),
            kind,
        };
        assert_eq!(
            Refusal::Denied { rule: "r".into() }.socks_reply(),
            Reply::NotAllowed
        );
        assert_eq!(
            upstream(io::ErrorKind::ConnectionRefused).socks_reply(),
            Reply::ConnectionRefused
        );
        assert_eq!(
            upstream(io::ErrorKind::NetworkUnreachable).socks_reply(),
            Reply::NetworkUnreachable
        );
        assert_eq!(
            upstream(io::ErrorKind::TimedOut).socks_reply(),
            Reply::HostUnreachable
        );
        assert_eq!(
            Refusal::Resolve {
                reason: String::new()
            }
            .socks_reply(),
            Reply::HostUnreachable
        );
    }
}

//! HTTPS credential injection: for a tunnel to a domain an `https` credential binds, the proxy
//! terminates the client's TLS with a certificate from the sandbox's CA ([`crate::ca`]),
//! opens its own TLS connection to the real server (verified against the host's trust store,
//! or the credential's `upstream_ca`), and relays HTTP/1.1 between them. Tunnels to every other
//! domain stay opaque.
//!
//! The secret only leaves, never returns. Each request head is checked and rewritten: the
//! credential's header is set (whatever the client sent there is dropped) and
//! `Accept-Encoding: identity` asked for. Refused with a `403` naming the rule: the placeholder
//! anywhere else (another header, the URL, the body: a `Content-Length` body of at most
//! [`SCANNED_BODY`] bytes is searched before its request leaves; a longer or chunked one as it
//! streams, holding back the bytes that could begin the placeholder, so that the server gets a
//! cut request and never the placeholder), `TRACE`/`TRACK` (also as a method override header),
//! and `Upgrade` (another protocol's stream cannot be searched). Every response is parsed and
//! scrubbed of the secret and its encodings ([`crate::exchange`], [`crate::scrub`]).
//!
//! Only HTTP/1.1 is spoken on either side (ALPN `http/1.1`), so each request's head can be
//! found: bodies are framed by `Content-Length` or chunked encoding, and a request with both,
//! conflicting lengths or another transfer coding is refused. A request whose `Host` (or
//! absolute-form target) names another host than the tunnel's is refused: the credential goes
//! to the bound name only, never to another site behind the same address.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::ca::{CaError, SandboxCa};
use crate::credentials::{Credentials, InjectedHeader};
use crate::error_text::chain;
use crate::exchange::{BodyReader, Downstream, Framing, Pending, Refusal, relay_responses};
use crate::placeholder::{Foreign, Guard, GuardStream};
use crate::rules::Host;
use crate::scrub::{Scrubber, Watch};

/// The protocol spoken inside the terminated TLS, on both sides.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Most headers a request may have.
const MAX_HEADERS: usize = 100;

/// Why TLS interception could not be set up when the proxy started.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// The TLS library refused the configuration (no usable protocol version).
    #[error("cannot configure TLS")]
    Config(#[source] rustls::Error),
    /// The host's trust store has no certificate rustls can use.
    #[error("the host's trust store has no usable CA certificate (set `upstream_ca`)")]
    NoHostRoots,
    /// The credential's `upstream_ca` file cannot be read or holds no certificate.
    #[error("cannot use {path} as the upstream CA of {domain}", path = path.display())]
    UpstreamCa {
        domain: String,
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The TLS side of credential injection, shared by every connection of one proxy.
pub struct TlsInterceptor {
    ca: SandboxCa,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// Per-host server configurations (leaf certificate and key), made on first use.
    servers: Mutex<HashMap<String, Arc<ServerConfig>>>,
    /// Per credential entry (index): how its real server is verified; `None` for plain entries.
    clients: Vec<Option<Arc<ClientConfig>>>,
}

impl std::fmt::Debug for TlsInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsInterceptor").finish_non_exhaustive()
    }
}

impl TlsInterceptor {
    /// An interceptor for `credentials`' `https` entries, signing with `ca`. Loads the host's
    /// trust store (once) for the entries that do not name an `upstream_ca`.
    pub fn new(ca: SandboxCa, credentials: &Credentials) -> Result<Self, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut host_roots: Option<Arc<RootCertStore>> = None;
        let mut clients = Vec::new();
        for entry in credentials.entries() {
            if !entry.https {
                clients.push(None);
                continue;
            }
            let roots =
                match &entry.upstream_ca {
                    Some(path) => Arc::new(roots_from_file(path).map_err(|source| {
                        TlsSetupError::UpstreamCa {
                            domain: entry.domain.to_string(),
                            path: path.clone(),
                            source,
                        }
                    })?),
                    None => match &host_roots {
                        Some(r) => Arc::clone(r),
                        None => {
                            let r = Arc::new(native_roots()?);
                            host_roots = Some(Arc::clone(&r));
                            r
                        }
                    },
                };
            let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(TlsSetupError::Config)?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
            clients.push(Some(Arc::new(config)));
        }
        Ok(Self {
            ca,
            provider,
            servers: Mutex::new(HashMap::new()),
            clients,
        })
    }

    fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, InterceptError> {
        if let Ok(cache) = self.servers.lock()
            && let Some(config) = cache.get(host)
        {
            return Ok(Arc::clone(config));
        }
        let leaf = self.ca.leaf(host).map_err(InterceptError::Leaf)?;
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(InterceptError::Config)?
            .with_no_client_auth()
            .with_single_cert(leaf.chain, leaf.key)
            .map_err(InterceptError::Config)?;
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        let config = Arc::new(config);
        if let Ok(mut cache) = self.servers.lock() {
            cache.insert(host.to_owned(), Arc::clone(&config));
        }
        Ok(config)
    }
}

fn native_roots() -> Result<RootCertStore, TlsSetupError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsSetupError::NoHostRoots);
    }
    Ok(roots)
}

fn roots_from_file(path: &std::path::Path) -> io::Result<RootCertStore> {
    let text = std::fs::read(path)?;
    let mut roots = RootCertStore::empty();
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no PEM certificate in the file",
        ));
    }
    Ok(roots)
}

/// Why an intercepted connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("cannot make a certificate for the host")]
    Leaf(#[source] CaError),
    #[error("cannot configure TLS")]
    Config(#[source] rustls::Error),
    #[error("TLS handshake with the sandbox's client failed")]
    ClientHandshake(#[source] io::Error),
    #[error("TLS handshake with the sandbox's client timed out")]
    ClientHandshakeTimeout,
    #[error("TLS to the real server failed")]
    UpstreamHandshake(#[source] io::Error),
    #[error("TLS to the real server timed out")]
    UpstreamHandshakeTimeout,
    #[error("`{host}` is not a TLS server name")]
    ServerName { host: String },
    #[error("request refused: {reason}")]
    Request {
        reason: String,
        /// The policy rule a `403` named (none: a `400`).
        rule: Option<&'static str>,
        /// What the refused request carried that the audit record names with the rule (a
        /// stale or foreign placeholder, escaped).
        named: Option<String>,
    },
    /// A response the proxy could not search for the credential (answered with a `502`).
    #[error("response refused: {reason}")]
    Response { reason: String },
    /// A response (or a request body) whose framing could not be followed.
    #[error("{reason}")]
    Malformed { reason: String },
    #[error("the connection broke")]
    Io(#[source] io::Error),
    #[error("no bytes either way for {0:?}")]
    Idle(Duration),
}

/// What one intercepted connection needs to know.
pub(crate) struct Intercept<'a> {
    /// The TLS side (none: a plain-HTTP request, [`serve_plain`]).
    pub(crate) tls: Option<&'a TlsInterceptor>,
    /// The search for `entry`'s secret in responses (`Credentials::scrubber`).
    pub(crate) scrubber: Arc<Scrubber>,
    /// The search for placeholders that are not the sandbox's (`Credentials::guard`).
    pub(crate) guard: Arc<Guard>,
    pub(crate) entry: &'a InjectedHeader,
    pub(crate) index: usize,
    pub(crate) host: &'a Host,
    pub(crate) port: u16,
    pub(crate) connection: u64,
    pub(crate) handshake_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_head_bytes: usize,
}

/// How an intercepted connection ended, for its event.
#[derive(Debug)]
pub struct Intercepted {
    /// Requests the header was added to.
    pub(crate) requests: u64,
    /// Why it ended early (none: both sides closed normally).
    pub(crate) error: Option<InterceptError>,
    /// The rule of a policy refusal (`403`), as the audit record has it: the request went to
    /// another host than the tunnel's, could have brought the secret back, or carried a
    /// placeholder that is not the sandbox's (then named after the rule).
    pub(crate) denied: Option<String>,
}

/// The audit text of a refusal's rule: the rule, then what it names, if anything.
fn audit_rule(rule: Option<&'static str>, named: Option<&str>) -> Option<String> {
    let rule = rule?;
    Some(match named {
        Some(n) => format!("{rule}: {n}"),
        None => rule.to_owned(),
    })
}

/// Serves one tunnel to a bound domain: TLS with the client (`early` holds bytes it sent with
/// its `CONNECT`), TLS to `upstream` (already dialled and checked), then the HTTP relay.
pub(crate) async fn serve(
    job: Intercept<'_>,
    client: &mut TcpStream,
    early: Vec<u8>,
    upstream: TcpStream,
    up_bytes: &AtomicU64,
    down_bytes: &AtomicU64,
) -> Intercepted {
    let mut requests = 0u64;
    let error = run(
        &job,
        client,
        early,
        upstream,
        up_bytes,
        down_bytes,
        &mut requests,
    )
    .await
    .err();
    let denied = match &error {
        Some(InterceptError::Request { rule, named, .. }) => audit_rule(*rule, named.as_deref()),
        _ => None,
    };
    Intercepted {
        requests,
        error,
        denied,
    }
}

const HOST_MISMATCH: &str = crate::proxy::HOST_MISMATCH_RULE;

/// The rule of a request that carries the placeholder anywhere but the credential's header.
pub const PLACEHOLDER_RULE: &str = "placeholder outside the credential header";
/// The rule of a request that carries a placeholder-shaped token other than the sandbox's
/// own placeholders: a stale one (the parent's, in a fork), another sandbox's, a guess
/// (`crate::placeholder`). Its audit record names the token after the rule.
pub const FOREIGN_PLACEHOLDER_RULE: &str = "stale or foreign placeholder";
/// The rule of a `TRACE`/`TRACK` request (the server would echo the credential).
pub const TRACE_RULE: &str = "trace on a credential-bound host";
/// The rule of a request asking to switch protocols (the proxy could not scrub the stream).
pub const UPGRADE_RULE: &str = "protocol upgrade on a credential-bound host";

/// Largest `Content-Length` request body read whole and searched for the placeholder before
/// its request leaves (a longer one, or a chunked one, is searched as it streams).
const SCANNED_BODY: u64 = 1 << 20;

/// Where the docs explain the refusals.
const DOCS: &str = "docs/egress.md, \"HTTPS credential injection\"";

async fn run(
    job: &Intercept<'_>,
    client: &mut TcpStream,
    early: Vec<u8>,
    upstream: TcpStream,
    up_bytes: &AtomicU64,
    down_bytes: &AtomicU64,
    requests: &mut u64,
) -> Result<(), InterceptError> {
    let host = job.host.to_string();
    let Some(tls) = job.tls else {
        return Err(InterceptError::Request {
            reason: "no TLS configuration for this credential".into(),
            rule: None,
            named: None,
        });
    };
    let server = tls.server_config(&host)?;
    let accept = tokio_rustls::TlsAcceptor::from(server).accept(Prefixed {
        prefix: early,
        at: 0,
        inner: client,
    });
    let mut client_tls = timeout(job.handshake_timeout, accept)
        .await
        .map_err(|_| InterceptError::ClientHandshakeTimeout)?
        .map_err(InterceptError::ClientHandshake)?;

    let Some(Some(client_config)) = tls.clients.get(job.index) else {
        return Err(InterceptError::Request {
            reason: "no TLS client configuration for this credential".into(),
            rule: None,
            named: None,
        });
    };
    let name = match job.host {
        Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        Host::Domain(d) => ServerName::try_from(d.clone())
            .map_err(|_| InterceptError::ServerName { host: host.clone() })?,
    };
    let connect =
        tokio_rustls::TlsConnector::from(Arc::clone(client_config)).connect(name, upstream);
    let upstream_tls = match timeout(job.handshake_timeout, connect).await {
        Ok(Ok(s)) => s,
        failed => {
            let error = match failed {
                Ok(Err(e)) => InterceptError::UpstreamHandshake(e),
                _ => InterceptError::UpstreamHandshakeTimeout,
            };
            let reason = chain(&error);
            let _ = client_tls
                .write_all(&crate::http::response(
                    502,
                    "Bad Gateway",
                    (crate::proxy::ERROR_HEADER, "upstream-tls"),
                    &format!("agent-sandbox: {host}:{}: {reason}", job.port),
                ))
                .await;
            let _ = client_tls.shutdown().await;
            return Err(error);
        }
    };

    let (cr, cw) = tokio::io::split(client_tls);
    let (ur, uw) = tokio::io::split(upstream_tls);
    checked_exchange(
        job,
        (cr, cw),
        (ur, uw),
        None,
        Counted {
            up: up_bytes,
            down: down_bytes,
            requests,
        },
    )
    .await
}

/// Where an exchange counts what it relayed.
pub(crate) struct Counted<'a> {
    pub(crate) up: &'a AtomicU64,
    pub(crate) down: &'a AtomicU64,
    pub(crate) requests: &'a mut u64,
}

/// Relays HTTP/1.1 between a client and a credential-bound server: requests checked and
/// rewritten ([`rewrite`]; at most `limit` of them), responses scrubbed of the secret
/// ([`relay_responses`]).
async fn checked_exchange<CR, CW, UR, UW>(
    job: &Intercept<'_>,
    (mut cr, mut cw): (CR, CW),
    (mut ur, mut uw): (UR, UW),
    limit: Option<u64>,
    counted: Counted<'_>,
) -> Result<(), InterceptError>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let Counted {
        up: up_bytes,
        down: down_bytes,
        requests,
    } = counted;
    let scrubber = job.scrubber.as_ref();
    let idle = job.idle_timeout;
    let (queue, mut pending) = mpsc::unbounded_channel::<Pending>();
    // Requests: each head is checked and rewritten before anything of it reaches the server;
    // a refusal is queued for the response side, which answers it in order, and ends the
    // requests.
    let up = async {
        let sent = send_requests(job, &mut cr, &mut uw, &queue, up_bytes, requests, limit).await;
        drop(queue);
        // However the client's side ended, the server learns that no more requests come.
        let _ = uw.shutdown().await;
        sent
    };
    let down = async {
        let relayed = relay_responses(
            &mut ur,
            Downstream {
                client: &mut cw,
                counter: down_bytes,
            },
            &mut pending,
            scrubber,
            idle,
        )
        .await;
        let _ = cw.shutdown().await;
        relayed
    };
    // The response side decides when the connection ends: a client that went quiet or away
    // still gets the answers already on their way, and a refusal is answered after them.
    tokio::pin!(up, down);
    let mut up_done = false;
    loop {
        tokio::select! {
            _ = &mut up, if !up_done => up_done = true,
            relayed = &mut down => return relayed,
        }
    }
}

/// Serves one plain-HTTP request to a host a plain (non-`https`) credential binds: `head` is
/// the request as the proxy would forward it (origin form, then any body bytes already read),
/// checked and injected like a request inside TLS, and its response scrubbed. Only this request
/// goes to the server.
pub(crate) async fn serve_plain(
    job: Intercept<'_>,
    client: &mut TcpStream,
    head: Vec<u8>,
    mut upstream: TcpStream,
    up_bytes: &AtomicU64,
    down_bytes: &AtomicU64,
) -> Intercepted {
    let mut requests = 0u64;
    let (cr, cw) = client.split();
    let (ur, uw) = upstream.split();
    let error = checked_exchange(
        &job,
        (head.as_slice().chain(cr), cw),
        (ur, uw),
        Some(1),
        Counted {
            up: up_bytes,
            down: down_bytes,
            requests: &mut requests,
        },
    )
    .await
    .err();
    let denied = match &error {
        Some(InterceptError::Request { rule, named, .. }) => audit_rule(*rule, named.as_deref()),
        _ => None,
    };
    Intercepted {
        requests,
        error,
        denied,
    }
}

/// Reads, checks and sends the client's requests until it stops, one is refused, or the
/// connection fails.
#[expect(clippy::too_many_lines)]
async fn send_requests<R, W>(
    job: &Intercept<'_>,
    cr: &mut R,
    uw: &mut W,
    queue: &mpsc::UnboundedSender<Pending>,
    up_bytes: &AtomicU64,
    requests: &mut u64,
    limit: Option<u64>,
) -> Result<(), InterceptError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let idle = job.idle_timeout;
    let mut buf = Vec::with_capacity(4096);
    let refuse = |refusal: Refusal| {
        let _ = queue.send(Pending::Refused(refusal));
    };
    loop {
        if limit.is_some_and(|l| *requests >= l) {
            return Ok(());
        }
        let len = match read_head(cr, &mut buf, job.max_head_bytes, idle).await {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(()),
            Err(InterceptError::Request { reason, .. }) => {
                refuse(Refusal::bad(reason));
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let rewritten = match rewrite(job, buf.get(..len).unwrap_or_default()) {
            Ok(r) => r,
            Err(refusal) => {
                refuse(refusal);
                return Ok(());
            }
        };
        buf.drain(..len);
        let response = Pending::Response {
            head: rewritten.head_method,
            http11: rewritten.http11,
        };
        let Some(mut watch) = BodyWatch::new(job) else {
            refuse(Refusal::bad("cannot search the body for placeholders"));
            return Ok(());
        };
        match rewritten.body {
            Body::None => {
                let _ = queue.send(response);
                write_counted(uw, &rewritten.bytes, up_bytes).await?;
            }
            Body::Length(n) if n <= SCANNED_BODY && !rewritten.expect_continue => {
                // Read whole and searched before the request leaves, so a refusal is clean.
                let mut body = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
                let scratch = AtomicU64::new(0);
                copy_exact(cr, &mut buf, &mut body, n, idle, &scratch).await?;
                if let Err(refusal) = watch.whole(&body, "the request body") {
                    refuse(refusal);
                    return Ok(());
                }
                let _ = queue.send(response);
                let mut bytes = rewritten.bytes;
                bytes.extend_from_slice(&body);
                write_counted(uw, &bytes, up_bytes).await?;
            }
            framing => {
                // Streamed: the bytes that could begin the placeholder are held back, so if it
                // comes, the server gets a cut request (then the end of the connection), never
                // the placeholder.
                let _ = queue.send(response);
                write_counted(uw, &rewritten.bytes, up_bytes).await?;
                let chunked = framing == Body::Chunked;
                let mut body = BodyReader::new(match framing {
                    Body::Length(n) => Framing::Length(n),
                    _ => Framing::Chunked,
                });
                loop {
                    let piece = body.next(cr, &mut buf, idle).await?;
                    let safe = match &piece {
                        Some(data) => watch.push(data),
                        None => watch.finish(),
                    };
                    let safe = match safe {
                        Ok(safe) => safe,
                        Err(refusal) => {
                            refuse(refusal);
                            return Ok(());
                        }
                    };
                    if !safe.is_empty() {
                        let bytes = if chunked { exchange_chunk(&safe) } else { safe };
                        write_counted(uw, &bytes, up_bytes).await?;
                    }
                    if piece.is_none() {
                        break;
                    }
                }
                if chunked {
                    if let Err(refusal) =
                        watch.whole(&body.trailers, "a trailer of the request body")
                    {
                        refuse(refusal);
                        return Ok(());
                    }
                    let mut end = b"0\r\n".to_vec();
                    end.extend_from_slice(&body.trailers);
                    end.extend_from_slice(b"\r\n");
                    write_counted(uw, &end, up_bytes).await?;
                }
            }
        }
        uw.flush().await.map_err(InterceptError::Io)?;
        *requests += 1;
        tracing::info!(
            target: "agent_sandbox::egress",
            connection = job.connection,
            host = %job.host,
            port = job.port,
            header = %job.entry.name,
            https = job.tls.is_some(),
            "credential header injected"
        );
    }
}

fn exchange_chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// A request body searched for the credential's own placeholder (it belongs in the header
/// only) and for placeholders that are not the sandbox's, as it streams (each search holds
/// back what could begin its needle; the guard's released bytes go on to the own search).
struct BodyWatch {
    own: Option<Watch>,
    guard: Arc<Guard>,
    stream: GuardStream,
}

impl BodyWatch {
    fn new(job: &Intercept<'_>) -> Option<Self> {
        let own = match job.entry.placeholder.as_deref() {
            Some(p) => Some(Watch::new(p)?),
            None => None,
        };
        Some(Self {
            own,
            guard: Arc::clone(&job.guard),
            stream: GuardStream::default(),
        })
    }

    /// Checks a whole text (a short body, the trailers) found in `place`.
    fn whole(&self, data: &[u8], place: &str) -> Result<(), Refusal> {
        self.guard
            .check(data)
            .map_err(|f| foreign_placeholder_in(place, f))?;
        if self.own.as_ref().is_some_and(|w| w.found_in(data)) {
            return Err(placeholder_in(place));
        }
        Ok(())
    }

    /// Adds a piece of the body: the bytes now safe to forward.
    fn push(&mut self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        let released = self
            .stream
            .push(&self.guard, data)
            .map_err(|f| foreign_placeholder_in("the request body", f))?;
        self.own_push(&released)
    }

    /// The end of the body: what was held back.
    fn finish(&mut self) -> Result<Vec<u8>, Refusal> {
        let released = self
            .stream
            .finish(&self.guard)
            .map_err(|f| foreign_placeholder_in("the request body", f))?;
        let mut out = self.own_push(&released)?;
        if let Some(w) = &mut self.own {
            out.extend(w.finish());
        }
        Ok(out)
    }

    fn own_push(&mut self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        match &mut self.own {
            Some(w) => w
                .push(data)
                .ok_or_else(|| placeholder_in("the request body")),
            None => Ok(data.to_vec()),
        }
    }
}

fn foreign_placeholder_in(place: &str, found: Foreign) -> Refusal {
    let mut refusal = Refusal::denied(
        FOREIGN_PLACEHOLDER_RULE,
        format!(
            "{place} carries a credential placeholder that is not this sandbox's ({}): a \
             forked sandbox's tools must read theirs again ({DOCS})",
            found.0
        ),
    );
    refusal.named = Some(found.0);
    refusal
}

fn placeholder_in(place: &str) -> Refusal {
    Refusal::denied(
        PLACEHOLDER_RULE,
        format!(
            "the credential's placeholder is in {place}; it is only sent in the credential's own \
             header, which the proxy sets ({DOCS})"
        ),
    )
}

/// How a request's body is framed.
#[derive(Debug, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A request head rewritten for the real server.
#[derive(Debug)]
struct Rewritten {
    bytes: Vec<u8>,
    body: Body,
    /// A `HEAD` request (its response has no body).
    head_method: bool,
    /// The client spoke HTTP/1.1.
    http11: bool,
    /// The client waits for `100 Continue` before it sends the body.
    expect_continue: bool,
}

/// Reads until `buf` holds a complete request head; returns its length, or `None` if the
/// client closed the connection between requests.
async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
    idle: Duration,
) -> Result<Option<usize>, InterceptError> {
    loop {
        if let Some(end) = find_head_end(buf) {
            if end > limit {
                return Err(InterceptError::Request {
                    reason: format!("request head is larger than {limit} bytes"),
                    rule: None,
                    named: None,
                });
            }
            return Ok(Some(end));
        }
        if buf.len() > limit {
            return Err(InterceptError::Request {
                reason: format!("request head is larger than {limit} bytes"),
                rule: None,
                named: None,
            });
        }
        let n = fill(reader, buf, idle).await?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(InterceptError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    idle: Duration,
) -> Result<usize, InterceptError> {
    let mut chunk = [0u8; 16 * 1024];
    let n = timeout(idle, reader.read(&mut chunk))
        .await
        .map_err(|_| InterceptError::Idle(idle))?
        .map_err(InterceptError::Io)?;
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(n)
}

/// Request headers dropped on a credential-bound host: the server must answer uncompressed (a
/// compressed body cannot be searched for the secret) and whole (a byte range of an echo
/// could hold a piece of the secret too short to recognise).
const DROPPED: &[&str] = &["accept-encoding", "te", "range", "if-range"];

/// Headers through which frameworks let a request claim another method.
const METHOD_OVERRIDES: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Methods whose response echoes the request (and so its credential) back.
fn echoes_request(method: &str) -> bool {
    method.eq_ignore_ascii_case("TRACE") || method.eq_ignore_ascii_case("TRACK")
}

/// Checks one request head and rewrites it: the credential's header set (whatever the client
/// sent for it dropped), `Accept-Encoding: identity`, everything else as sent. Refused: a
/// request for another host, a request that would echo the credential back or switch to a
/// protocol the proxy cannot follow, the placeholder anywhere but the credential's header, and
/// ambiguous framing.
fn rewrite(job: &Intercept<'_>, head: &[u8]) -> Result<Rewritten, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(Refusal::bad("incomplete request head")),
        Err(e) => return Err(Refusal::bad(format!("malformed request head: {e}"))),
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Refusal::bad("CONNECT inside an intercepted tunnel"));
    }
    if echoes_request(method) {
        return Err(Refusal::denied(
            TRACE_RULE,
            format!("{method} would echo the credential back ({DOCS})"),
        ));
    }
    let entry = job.entry;
    let placeholder = entry.placeholder.as_deref().map(str::as_bytes);
    check_target(job, target, placeholder)?;
    let facts = scan_headers(&req, job, placeholder)?;
    if !facts.host_seen && req.version == Some(1) {
        return Err(Refusal::bad("HTTP/1.1 request without a Host header"));
    }
    let body = facts.body()?;
    let expect_continue = facts.expect_continue;

    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(head.len(), |p| p + 2);
    let mut out = Vec::with_capacity(head.len() + entry.value.len() + 64);
    out.extend_from_slice(head.get(..line_end).unwrap_or_default());
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case(&entry.name)
            || DROPPED.iter().any(|d| h.name.eq_ignore_ascii_case(d))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Accept-Encoding: identity\r\n");
    out.extend_from_slice(entry.name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(entry.value.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    Ok(Rewritten {
        bytes: out,
        body,
        head_method: method.eq_ignore_ascii_case("HEAD"),
        http11: req.version == Some(1),
        expect_continue,
    })
}

/// What [`rewrite`] learns from a request's headers.
#[derive(Default)]
struct HeadFacts {
    host_seen: bool,
    lengths: Vec<u64>,
    chunked: bool,
    te: bool,
    expect_continue: bool,
}

impl HeadFacts {
    /// How the request's body is framed; conflicting or unknown framings are refused.
    fn body(&self) -> Result<Body, Refusal> {
        let mut lengths = self.lengths.clone();
        lengths.dedup();
        let body = match (self.te, lengths.as_slice()) {
            (true, []) if self.chunked => Body::Chunked,
            (true, []) => return Err(Refusal::bad("a transfer coding other than chunked last")),
            (true, _) => return Err(Refusal::bad("both Transfer-Encoding and Content-Length")),
            (false, []) => Body::None,
            (false, [n]) => Body::Length(*n),
            (false, _) => return Err(Refusal::bad("conflicting Content-Length values")),
        };
        Ok(body)
    }
}

/// The request target: never carrying the placeholder (plain or percent-encoded) nor one that
/// is not the sandbox's (in any form, also once percent-decoded), and in
/// absolute form only for the intercepted host.
fn check_target(
    job: &Intercept<'_>,
    target: &str,
    placeholder: Option<&[u8]>,
) -> Result<(), Refusal> {
    let decoded = percent_decode(target.as_bytes());
    for text in [target.as_bytes(), &decoded] {
        job.guard
            .check(text)
            .map_err(|f| foreign_placeholder_in("the request target (URL)", f))?;
    }
    if let Some(p) = placeholder
        && (contains(target.as_bytes(), p) || contains(&decoded, p))
    {
        return Err(placeholder_in("the request target (URL)"));
    }
    if !target.starts_with('/') && target != "*" {
        let uri: http::Uri = target
            .parse()
            .map_err(|_| Refusal::bad(format!("request target {target:?} is not a valid URI")))?;
        match uri.host() {
            Some(h) if same_host(h, uri.port_u16(), job) => {}
            _ => {
                return Err(Refusal::denied(
                    HOST_MISMATCH,
                    format!("{HOST_MISMATCH}: target {target:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks every header (no placeholder that is not the sandbox's in any, the credential's own
/// placeholder in none but the credential's header, one Host and it
/// the intercepted host, no Upgrade, no method override that echoes) and notes the body's
/// framing.
fn scan_headers(
    req: &httparse::Request<'_, '_>,
    job: &Intercept<'_>,
    placeholder: Option<&[u8]>,
) -> Result<HeadFacts, Refusal> {
    let mut f = HeadFacts::default();
    let entry = job.entry;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        let named = h.name.eq_ignore_ascii_case(&entry.name);
        // The credential's own header too: the proxy replaces it, but a stale placeholder
        // there is a tool acting with another sandbox's state.
        for text in [h.name.as_bytes(), h.value] {
            job.guard
                .check(text)
                .map_err(|f| foreign_placeholder_in(&format!("the {} header", h.name), f))?;
        }
        if let Some(p) = placeholder
            && !named
            && (contains(h.value, p) || contains(h.name.as_bytes(), p))
        {
            return Err(placeholder_in(&format!("the {} header", h.name)));
        }
        if h.name.eq_ignore_ascii_case("host") {
            if f.host_seen {
                return Err(Refusal::bad("more than one Host header"));
            }
            f.host_seen = true;
            let mismatch =
                || Refusal::denied(HOST_MISMATCH, format!("{HOST_MISMATCH}: Host {value:?}"));
            let authority: http::uri::Authority = value.parse().map_err(|_| mismatch())?;
            if !same_host(authority.host(), authority.port_u16(), job) {
                return Err(mismatch());
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            for part in value.split(',') {
                let n = part
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| Refusal::bad(format!("bad Content-Length {value:?}")))?;
                f.lengths.push(n);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            f.te = true;
            f.chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            return Err(Refusal::denied(
                UPGRADE_RULE,
                format!(
                    "Upgrade: {value}: the proxy cannot search another protocol's stream for the \
                     credential ({DOCS})"
                ),
            ));
        } else if h.name.eq_ignore_ascii_case("expect") {
            f.expect_continue = value.eq_ignore_ascii_case("100-continue");
        } else if METHOD_OVERRIDES
            .iter()
            .any(|o| h.name.eq_ignore_ascii_case(o))
            && echoes_request(value)
        {
            return Err(Refusal::denied(
                TRACE_RULE,
                format!(
                    "{}: {value} would echo the credential back ({DOCS})",
                    h.name
                ),
            ));
        }
    }
    Ok(f)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// `%XX` escapes decoded (invalid ones kept as they are).
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let byte = text.get(i).copied().unwrap_or(0);
        let hex = text
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// Whether `host[:port]` from a request names the tunnel's host (a missing port is the
/// scheme's default, which a client may leave out).
fn same_host(host: &str, port: Option<u16>, job: &Intercept<'_>) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Host::parse(host).is_ok_and(|h| h == *job.host) && port.is_none_or(|p| p == job.port)
}

pub(crate) async fn write_counted<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    counter: &AtomicU64,
) -> Result<(), InterceptError> {
    w.write_all(bytes).await.map_err(InterceptError::Io)?;
    counter.fetch_add(
        u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    Ok(())
}

/// Relays `n` body bytes: first what `buf` already holds, then from `r`.
async fn copy_exact<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    w: &mut W,
    n: u64,
    idle: Duration,
    counter: &AtomicU64,
) -> Result<(), InterceptError> {
    let mut left = n;
    while left > 0 {
        if buf.is_empty() && fill(r, buf, idle).await? == 0 {
            return Err(InterceptError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        write_counted(w, buf.get(..take).unwrap_or_default(), counter).await?;
        buf.drain(..take);
        left -= u64::try_from(take).unwrap_or(left);
    }
    Ok(())
}

/// A stream that first yields `prefix` (bytes read before the TLS handshake began).
struct Prefixed<'a> {
    prefix: Vec<u8>,
    at: usize,
    inner: &'a mut TcpStream,
}

impl AsyncRead for Prefixed<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let rest = self.prefix.get(self.at..).unwrap_or_default();
            let n = rest.len().min(out.remaining());
            out.put_slice(rest.get(..n).unwrap_or_default());
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.inner).poll_read(cx, out)
    }
}

impl AsyncWrite for Prefixed<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_policy::network::DomainRule;

    fn entry(placeholder: Option<&str>) -> InjectedHeader {
        InjectedHeader {
            domain: DomainRule::parse("api.example.com").unwrap(),
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
            secret: "s3cret".into(),
            https: true,
            placeholder: placeholder.map(str::to_owned),
            upstream_ca: None,
        }
    }

    fn with_job<T>(e: &InjectedHeader, f: impl FnOnce(&Intercept<'_>) -> T) -> T {
        let domains = vec![e.domain.clone()];
        let (ca, _) = SandboxCa::ephemeral("test", &domains).unwrap();
        let tls = TlsInterceptor {
            ca,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            servers: Mutex::new(HashMap::new()),
            clients: Vec::new(),
        };
        let host = Host::parse("api.example.com").unwrap();
        let job = Intercept {
            tls: Some(&tls),
            scrubber: Arc::new(
                Scrubber::new(&e.secret, "Bearer ", e.placeholder.as_deref()).unwrap(),
            ),
            guard: Arc::new(
                Guard::new(&e.placeholder.as_deref().into_iter().collect::<Vec<_>>()).unwrap(),
            ),
            entry: e,
            index: 0,
            host: &host,
            port: 443,
            connection: 1,
            handshake_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_head_bytes: 8192,
        };
        f(&job)
    }

    fn text(r: &Rewritten) -> String {
        String::from_utf8(r.bytes.clone()).unwrap()
    }

    const PH: &str = "agent-sandbox-placeholder-TOKEN-0123456789abcdef0123456789abcdef";

    #[test]
    fn the_header_is_set_identity_asked_and_the_placeholder_nowhere_else() {
        let e = entry(Some(PH));
        with_job(&e, |job| {
            let r = rewrite(
                job,
                format!("POST /v1/x HTTP/1.1\r\nHost: API.example.com\r\nauthorization: token {PH}\r\nAccept-Encoding: gzip, br\r\nTE: gzip\r\nRange: bytes=3-9\r\nContent-Length: 3\r\n\r\n").as_bytes(),
            )
            .unwrap();
            assert_eq!(
                text(&r),
                "POST /v1/x HTTP/1.1\r\nHost: API.example.com\r\nContent-Length: 3\r\nAccept-Encoding: identity\r\nAuthorization: Bearer s3cret\r\n\r\n"
            );
            assert_eq!(r.body, Body::Length(3));
            assert!(r.http11 && !r.head_method);
            let r = rewrite(
                job,
                b"GET https://api.example.com:443/ HTTP/1.1\r\nHost: api.example.com:443\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            )
            .unwrap();
            assert_eq!(r.body, Body::Chunked);
        });
    }

    /// Every place a placeholder could be echoed from, and every request that makes a server
    /// echo the credential itself, is refused with a 403 that names why.
    #[test]
    fn echo_prone_requests_are_refused_with_the_reason() {
        let e = entry(Some(PH));
        with_job(&e, |job| {
            for (head, rule, why) in [
                (format!("GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Request-Id: {PH}\r\n\r\n"), PLACEHOLDER_RULE, "X-Request-Id header"),
                (format!("GET / HTTP/1.1\r\nHost: api.example.com\r\nOrigin: https://{PH}.x\r\n\r\n"), PLACEHOLDER_RULE, "Origin header"),
                (format!("GET / HTTP/1.1\r\nHost: api.example.com\r\nX-{PH}: 1\r\n\r\n"), PLACEHOLDER_RULE, "header"),
                (format!("GET /?t={PH} HTTP/1.1\r\nHost: api.example.com\r\n\r\n"), PLACEHOLDER_RULE, "request target"),
                (format!("GET /?t={} HTTP/1.1\r\nHost: api.example.com\r\n\r\n", PH.replacen("placeholder-", "placeholder%2d", 1)), PLACEHOLDER_RULE, "request target"),
                ("TRACE / HTTP/1.1\r\nHost: api.example.com\r\n\r\n".into(), TRACE_RULE, "TRACE"),
                ("track / HTTP/1.1\r\nHost: api.example.com\r\n\r\n".into(), TRACE_RULE, "track"),
                ("POST / HTTP/1.1\r\nHost: api.example.com\r\nX-HTTP-Method-Override: TRACE\r\n\r\n".into(), TRACE_RULE, "Override"),
                ("GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".into(), UPGRADE_RULE, "websocket"),
            ] {
                let refusal = rewrite(job, head.as_bytes()).unwrap_err();
                assert_eq!((refusal.status, refusal.rule), (403, Some(rule)), "{head:?}");
                assert!(refusal.reason.contains(why), "{head:?}: {}", refusal.reason);
                let response = String::from_utf8(refusal.response()).unwrap();
                assert!(response.starts_with("HTTP/1.1 403 "), "{response}");
                assert!(response.contains(&format!("X-Agent-Sandbox-Denied: {rule}\r\n")), "{response}");
                assert!(response.contains("docs/egress.md"), "{response}");
            }
        });
    }

    /// A fork's parent's placeholder (or a sibling's, or the fixed text of older runtimes) in
    /// any place and form a request can carry it, the credential's own header included, is
    /// refused with a 403 whose audit text names it; the sandbox's own passes in the header.
    #[test]
    fn placeholders_that_are_not_the_sandboxs_are_refused_everywhere() {
        use agent_sandbox_policy::network::{legacy_placeholder_value, placeholder_value};
        let parent = placeholder_value("TOKEN", "fedcba9876543210fedcba9876543210");
        let e = entry(Some(PH));
        with_job(&e, |job| {
            let hex: String = parent.bytes().map(|b| format!("{b:02x}")).collect();
            let percent: String = parent.bytes().map(|b| format!("%{b:02X}")).collect();
            let json: String = parent
                .chars()
                .map(|c| format!("\\u{:04x}", u32::from(c)))
                .collect();
            for (head, why) in [
                (
                    format!(
                        "GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer {parent}\r\n\r\n"
                    ),
                    "Authorization header",
                ),
                (
                    format!(
                        "GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer {}\r\n\r\n",
                        legacy_placeholder_value("TOKEN")
                    ),
                    "Authorization header",
                ),
                (
                    format!("GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Key: {hex}\r\n\r\n"),
                    "X-Key header",
                ),
                (
                    format!(
                        "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Json: {{\"k\":\"{json}\"}}\r\n\r\n"
                    ),
                    "X-Json header",
                ),
                (
                    format!("GET /?t={percent} HTTP/1.1\r\nHost: api.example.com\r\n\r\n"),
                    "request target",
                ),
                (
                    format!(
                        "GET /?t={} HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                        parent.replacen("placeholder-", "placeholder%2d", 1)
                    ),
                    "request target",
                ),
            ] {
                let refusal = rewrite(job, head.as_bytes()).unwrap_err();
                assert_eq!(
                    (refusal.status, refusal.rule),
                    (403, Some(FOREIGN_PLACEHOLDER_RULE)),
                    "{head:?}"
                );
                assert!(refusal.reason.contains(why), "{head:?}: {}", refusal.reason);
                let named = refusal.named.clone().unwrap();
                assert!(
                    named.starts_with("agent-sandbox-placeholder")
                        || named.starts_with("6167")
                        || named.starts_with("%61")
                        || named.starts_with("\\\\u0061"),
                    "{named}"
                );
                let response = String::from_utf8(refusal.response()).unwrap();
                assert!(
                    response.contains(&format!(
                        "X-Agent-Sandbox-Denied: {FOREIGN_PLACEHOLDER_RULE}\r\n"
                    )),
                    "{response}"
                );
            }
            let r = rewrite(
                job,
                format!(
                    "GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer {PH}\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
            assert!(
                text(&r).contains("Authorization: Bearer s3cret\r\n"),
                "{}",
                text(&r)
            );
        });
    }

    /// The control: as the runtime configured every sandbox before placeholders had a suffix
    /// (one fixed text for all), a fork's proxy took its parent's placeholder as its own and
    /// added the secret; with per-sandbox placeholders the same request is refused.
    #[test]
    fn a_shared_fixed_placeholder_let_a_parents_through_where_a_per_sandbox_one_does_not() {
        use agent_sandbox_policy::network::{legacy_placeholder_value, placeholder_value};
        let request = |ph: &str| {
            format!("GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer {ph}\r\n\r\n")
        };
        let fixed = legacy_placeholder_value("TOKEN");
        let naive = entry(Some(&fixed));
        with_job(&naive, |job| {
            let r = rewrite(job, request(&fixed).as_bytes()).unwrap();
            assert!(text(&r).contains("Authorization: Bearer s3cret\r\n"));
        });
        let parent = placeholder_value("TOKEN", "fedcba9876543210fedcba9876543210");
        let fork = placeholder_value("TOKEN", "00112233445566778899aabbccddeeff");
        let forked = entry(Some(&fork));
        with_job(&forked, |job| {
            let refusal = rewrite(job, request(&parent).as_bytes()).unwrap_err();
            assert_eq!(refusal.rule, Some(FOREIGN_PLACEHOLDER_RULE));
            assert_eq!(refusal.named.as_deref(), Some(parent.as_str()));
            let r = rewrite(job, request(&fork).as_bytes()).unwrap();
            assert!(text(&r).contains("Authorization: Bearer s3cret\r\n"));
        });
    }

    #[test]
    fn requests_for_other_hosts_or_with_ambiguous_bodies_are_refused() {
        let e = entry(None);
        with_job(&e, |job| {
            for (head, why) in [
                (
                    "GET / HTTP/1.1\r\nHost: evil.example.com\r\n\r\n",
                    HOST_MISMATCH,
                ),
                (
                    "GET / HTTP/1.1\r\nHost: api.example.com:444\r\n\r\n",
                    HOST_MISMATCH,
                ),
                (
                    "GET https://evil.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                    HOST_MISMATCH,
                ),
                ("GET / HTTP/1.1\r\n\r\n", "without a Host"),
                (
                    "GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: api.example.com\r\n\r\n",
                    "more than one",
                ),
                (
                    "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                    "both",
                ),
                (
                    "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                    "conflicting",
                ),
                (
                    "POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                    "other than chunked",
                ),
                (
                    "CONNECT a:1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                    "CONNECT",
                ),
            ] {
                let err = rewrite(job, head.as_bytes()).unwrap_err();
                assert!(err.reason.contains(why), "{head:?}: {err:?}");
            }
        });
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;
    use crate::exchange::test_io::Trickle;
    use agent_sandbox_policy::network::DomainRule;

    const PH: &str = "agent-sandbox-placeholder-TOKEN-0123456789abcdef0123456789abcdef";

    /// Runs the request side over `client` (read `step` bytes at a time): what reached the
    /// server, and what the response side was told.
    async fn requests(client: &[u8], step: usize) -> (Vec<u8>, Vec<Pending>) {
        let e = InjectedHeader {
            domain: DomainRule::parse("api.example.com").unwrap(),
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
            secret: "s3cret".into(),
            https: true,
            placeholder: Some(PH.into()),
            upstream_ca: None,
        };
        let (ca, _) = SandboxCa::ephemeral("test", std::slice::from_ref(&e.domain)).unwrap();
        let tls = TlsInterceptor {
            ca,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            servers: Mutex::new(HashMap::new()),
            clients: Vec::new(),
        };
        let host = Host::parse("api.example.com").unwrap();
        let job = Intercept {
            tls: Some(&tls),
            scrubber: Arc::new(
                Scrubber::new(&e.secret, "Bearer ", e.placeholder.as_deref()).unwrap(),
            ),
            guard: Arc::new(
                Guard::new(&e.placeholder.as_deref().into_iter().collect::<Vec<_>>()).unwrap(),
            ),
            entry: &e,
            index: 0,
            host: &host,
            port: 443,
            connection: 1,
            handshake_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_head_bytes: 8192,
        };
        let mut reader = Trickle::new(client, step);
        let mut upstream = Vec::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut n = 0;
        send_requests(
            &job,
            &mut reader,
            &mut upstream,
            &tx,
            &AtomicU64::new(0),
            &mut n,
            None,
        )
        .await
        .unwrap();
        drop(tx);
        let mut told = Vec::new();
        while let Some(p) = rx.recv().await {
            told.push(p);
        }
        (upstream, told)
    }

    fn refused(told: &[Pending]) -> Option<&Refusal> {
        told.iter().find_map(|p| match p {
            Pending::Refused(r) => Some(r),
            Pending::Response { .. } => None,
        })
    }

    #[tokio::test]
    async fn a_placeholder_in_a_short_body_stops_the_request_before_it_leaves() {
        let body = format!("{{\"echo\": \"{PH}\"}}");
        let raw = format!(
            "GET /ok HTTP/1.1\r\nHost: api.example.com\r\n\r\nPOST /x HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        for step in [1, 7, 4096] {
            let (up, told) = requests(raw.as_bytes(), step).await;
            let up = String::from_utf8(up).unwrap();
            assert!(up.starts_with("GET /ok "), "{up}");
            assert!(!up.contains("POST"), "the refused request left: {up}");
            assert!(matches!(
                told.first(),
                Some(Pending::Response {
                    head: false,
                    http11: true
                })
            ));
            let r = refused(&told).unwrap();
            assert_eq!(r.rule, Some(PLACEHOLDER_RULE));
            assert!(r.reason.contains("request body"), "{r:?}");
        }
    }

    /// A streamed body (chunked, or longer than the searched size) goes out as it comes; the
    /// placeholder split over chunks and reads is still caught and never reaches the server.
    #[tokio::test]
    async fn a_placeholder_in_a_streamed_body_cuts_it_before_the_placeholder() {
        let (a, b) = PH.split_at(10);
        let raw = format!(
            "POST /s HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        for step in [1, 3, 4096] {
            let (up, told) = requests(raw.as_bytes(), step).await;
            assert!(!String::from_utf8_lossy(&up).contains(PH));
            assert!(
                !String::from_utf8_lossy(&up).contains("0\r\n\r\n"),
                "the body was completed"
            );
            assert_eq!(refused(&told).unwrap().rule, Some(PLACEHOLDER_RULE));
        }
        let long = "x".repeat(usize::try_from(SCANNED_BODY).unwrap() + 10);
        let raw = format!(
            "PUT /l HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {}\r\n\r\n{long}{PH}",
            long.len() + PH.len()
        );
        let (up, told) = requests(raw.as_bytes(), 65536).await;
        assert!(!String::from_utf8_lossy(&up).contains(PH));
        // All but what the searches hold back (at most a few hundred bytes) went out.
        assert!(up.len() > long.len() - 1024, "the body did not stream");
        assert_eq!(refused(&told).unwrap().rule, Some(PLACEHOLDER_RULE));
    }

    /// Another sandbox's placeholder in a body, short or streamed and split over reads, is
    /// refused before it leaves; the refusal's audit text names it.
    #[tokio::test]
    async fn a_foreign_placeholder_in_a_body_never_leaves() {
        let other = PH.replace("0123456789abcdef", "fedcba9876543210");
        let body = format!("{{\"echo\": \"{other}\"}}");
        let short = format!(
            "POST /x HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (a, b) = other.split_at(30);
        let chunked = format!(
            "POST /s HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        for raw in [short, chunked] {
            for step in [1, 5, 4096] {
                let (up, told) = requests(raw.as_bytes(), step).await;
                let up = String::from_utf8_lossy(&up);
                assert!(!up.contains(&other[..30]), "{up}");
                let r = refused(&told).unwrap();
                assert_eq!(r.rule, Some(FOREIGN_PLACEHOLDER_RULE));
                assert_eq!(r.named.as_deref(), Some(other.as_str()));
            }
        }
    }

    #[tokio::test]
    async fn clean_bodies_pass_unchanged_in_every_framing() {
        let raw = "POST /a HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nHEAD /c HTTP/1.0\r\n\r\n";
        let (up, told) = requests(raw.as_bytes(), 2).await;
        let up = String::from_utf8(up).unwrap();
        assert!(up.contains("\r\n\r\nhelloPOST /b"), "{up}");
        assert!(
            up.contains("\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nHEAD /c"),
            "{up}"
        );
        assert!(refused(&told).is_none());
        assert!(matches!(
            told.as_slice(),
            [
                Pending::Response {
                    head: false,
                    http11: true
                },
                Pending::Response {
                    head: false,
                    http11: true
                },
                Pending::Response {
                    head: true,
                    http11: false
                }
            ]
        ));
    }
}

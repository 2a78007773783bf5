//! The HTTP side of the proxy: reading a bounded request head (parsed by `httparse`), turning it
//! into a target, rewriting absolute-form requests for the origin, and the proxy's own replies.

use std::str::FromStr;

use http::uri::{Authority, Scheme, Uri};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::rules::{Host, HostError};

/// Why a request could not be served; each becomes a `400` naming the reason.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The head is larger than the configured bound.
    #[error("request head is larger than {limit} bytes")]
    HeadTooLarge {
        /// The bound.
        limit: usize,
    },
    /// The client closed the connection before the head was complete.
    #[error("connection closed before the request head was complete")]
    Truncated,
    /// Reading from the client failed.
    #[error("reading the request failed")]
    Read(#[source] std::io::Error),
    /// `httparse` refused the head.
    #[error("malformed request head")]
    Malformed(#[source] httparse::Error),
    /// An origin-form request (`GET /path`) was sent to the proxy.
    #[error("not a proxy request: use an absolute URL (http://host/path) or CONNECT host:port")]
    NotAbsolute,
    /// The request target could not be parsed.
    #[error("request target {target:?} is not a valid URI")]
    BadTarget {
        /// The target as sent.
        target: String,
    },
    /// Absolute-form with a scheme other than `http`.
    #[error("scheme {scheme:?} cannot be forwarded: only http:// is, use CONNECT for https")]
    UnsupportedScheme {
        /// The scheme as sent.
        scheme: String,
    },
    /// `CONNECT` without a port.
    #[error("CONNECT target {target:?} needs host:port")]
    ConnectWithoutPort {
        /// The target as sent.
        target: String,
    },
    /// The host in the target is not a host name or address.
    #[error("request target host is invalid")]
    BadHost(#[source] HostError),
    /// More than one Host header.
    #[error("more than one Host header")]
    DuplicateHost,
    /// The Host header names a different host or port than the request target.
    #[error("Host header {header:?} does not match the request target {target}")]
    HostMismatch {
        /// The Host header as sent.
        header: String,
        /// The target's `host:port`.
        target: String,
    },
}

/// What a request head asks the proxy to do.
#[derive(Debug)]
pub(crate) enum Request {
    /// Open a tunnel to `host:port`; `early` holds bytes the client sent after the head.
    Connect {
        host: Host,
        port: u16,
        early: Vec<u8>,
        tool_call: Option<String>,
    },
    /// Forward one plain HTTP request; `head` is the rewritten head for the origin server.
    Forward {
        host: Host,
        port: u16,
        head: ForwardHead,
        tool_call: Option<String>,
    },
}

/// A plain request rewritten for the origin server: origin-form start line, the end-to-end
/// headers, and any body bytes already read.
#[derive(Debug)]
pub(crate) struct ForwardHead {
    start_line: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    rest: Vec<u8>,
}

impl ForwardHead {
    /// The request's method and path (origin form, without query string or fragment, cut at
    /// [`crate::events::MAX_PATH_CHARS`] characters), for the event.
    pub(crate) fn method_and_path(&self) -> (String, String) {
        let line = String::from_utf8_lossy(&self.start_line);
        let mut words = line.split_ascii_whitespace();
        let method = words.next().unwrap_or_default().chars().take(32).collect();
        let target = words.next().unwrap_or_default();
        let path = target
            .split(['?', '#'])
            .next()
            .unwrap_or_default()
            .chars()
            .take(crate::events::MAX_PATH_CHARS)
            .collect();
        (method, path)
    }

    /// The bytes to send upstream. `inject` (name, value) replaces any header of that name the
    /// client sent.
    pub(crate) fn encode(&self, inject: Option<(&str, &str)>) -> Vec<u8> {
        let mut out = Vec::with_capacity(512 + self.rest.len());
        out.extend_from_slice(&self.start_line);
        for (name, value) in &self.headers {
            if inject.is_some_and(|(n, _)| n.eq_ignore_ascii_case(name)) {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if let Some((name, value)) = inject {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        // One request per upstream connection: the origin closes after answering, so nothing
        // else the client sends on this connection can reach a host that was not checked.
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out.extend_from_slice(&self.rest);
        out
    }
}

const MAX_HEADERS: usize = 100;

/// Request headers that belong to one hop and are not passed on. `Transfer-Encoding` is
/// hop-by-hop too, but it stays: the body is relayed unchanged, so its framing must stay with it.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Headers the `Connection` header may not remove, because framing or routing depends on them.
const NEVER_STRIPPED: &[&str] = &["host", "content-length", "transfer-encoding"];

/// Reads a request head of at most `limit` bytes and decides what it asks for.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> Result<Request, HttpError> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = reader.read(&mut chunk).await.map_err(HttpError::Read)?;
        if n == 0 {
            return Err(HttpError::Truncated);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf).map_err(HttpError::Malformed)? {
            httparse::Status::Complete(len) => {
                if len > limit {
                    return Err(HttpError::HeadTooLarge { limit });
                }
                let rest = buf.get(len..).unwrap_or_default().to_vec();
                return interpret(&req, rest);
            }
            httparse::Status::Partial => {
                if buf.len() > limit {
                    return Err(HttpError::HeadTooLarge { limit });
                }
            }
        }
    }
}

fn interpret(req: &httparse::Request<'_, '_>, rest: Vec<u8>) -> Result<Request, HttpError> {
    // `parse` returned Complete, so method, path and version are present.
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let tool_call = req
        .headers
        .iter()
        .find(|h| {
            h.name
                .eq_ignore_ascii_case(crate::approval::TOOL_CALL_HEADER)
        })
        .and_then(|h| crate::approval::tool_call_id(h.value));
    if method.eq_ignore_ascii_case("CONNECT") {
        return connect(target, rest, tool_call);
    }

    if target.starts_with('/') || target == "*" {
        return Err(HttpError::NotAbsolute);
    }
    let uri = Uri::from_str(target).map_err(|_| HttpError::BadTarget {
        target: target.to_owned(),
    })?;
    let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
        return Err(HttpError::NotAbsolute);
    };
    if *scheme != Scheme::HTTP {
        return Err(HttpError::UnsupportedScheme {
            scheme: scheme.as_str().to_owned(),
        });
    }
    let host = Host::parse(authority.host()).map_err(HttpError::BadHost)?;
    let port = authority.port_u16().unwrap_or(80);

    let mut host_header: Option<&[u8]> = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("host") {
            if host_header.is_some() {
                return Err(HttpError::DuplicateHost);
            }
            host_header = Some(h.value);
        }
    }
    if let Some(value) = host_header {
        check_host_header(value, &host, port)?;
    }

    let head = forward_head(req, &uri, authority.as_str(), host_header.is_some(), rest);
    Ok(Request::Forward {
        host,
        port,
        head,
        tool_call,
    })
}

/// A CONNECT request: the tunnel's host and port, and what the client sent after the head.
fn connect(target: &str, rest: Vec<u8>, tool_call: Option<String>) -> Result<Request, HttpError> {
    let authority = Authority::from_str(target).map_err(|_| HttpError::BadTarget {
        target: target.to_owned(),
    })?;
    let port = authority
        .port_u16()
        .ok_or_else(|| HttpError::ConnectWithoutPort {
            target: target.to_owned(),
        })?;
    let host = Host::parse(authority.host()).map_err(HttpError::BadHost)?;
    Ok(Request::Connect {
        host,
        port,
        early: rest,
        tool_call,
    })
}

/// The head to forward: the origin-form start line, a Host header when the client sent
/// none, and the client's headers without hop-by-hop ones, `Proxy-*`, the tool-call header
/// and those `Connection` names.
fn forward_head(
    req: &httparse::Request<'_, '_>,
    uri: &Uri,
    authority: &str,
    has_host: bool,
    rest: Vec<u8>,
) -> ForwardHead {
    let method = req.method.unwrap_or_default();
    let version = req.version.unwrap_or(1);
    let connection_tokens: Vec<String> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty() && !NEVER_STRIPPED.contains(&t.as_str()))
        .collect();

    let path = uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut start_line = Vec::with_capacity(64);
    start_line.extend_from_slice(method.as_bytes());
    start_line.push(b' ');
    start_line.extend_from_slice(path.as_bytes());
    start_line.extend_from_slice(if version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    let mut headers = Vec::with_capacity(req.headers.len() + 1);
    if !has_host {
        let authority = authority.rsplit('@').next().unwrap_or_default();
        headers.push(("Host".to_owned(), authority.as_bytes().to_vec()));
    }
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&name.as_str())
            || name.starts_with("proxy-")
            || name.eq_ignore_ascii_case(crate::approval::TOOL_CALL_HEADER)
            || connection_tokens.contains(&name)
        {
            continue;
        }
        headers.push((h.name.to_owned(), h.value.to_vec()));
    }
    ForwardHead {
        start_line,
        headers,
        rest,
    }
}

fn check_host_header(value: &[u8], host: &Host, port: u16) -> Result<(), HttpError> {
    let text = String::from_utf8_lossy(value).trim().to_owned();
    let target = format!("{host}:{port}");
    let mismatch = || HttpError::HostMismatch {
        header: text.clone(),
        target: target.clone(),
    };
    let authority = Authority::from_str(&text).map_err(|_| mismatch())?;
    let header_host = Host::parse(authority.host()).map_err(|_| mismatch())?;
    let header_port = authority.port_u16().unwrap_or(80);
    if header_host == *host && header_port == port {
        Ok(())
    } else {
        Err(mismatch())
    }
}

/// Makes text safe for a header value: no control characters, bounded length.
fn header_safe(text: &str) -> String {
    text.chars()
        .take(512)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A complete proxy-generated response that closes the connection.
pub(crate) fn response(
    status: u16,
    reason: &str,
    extra_header: (&str, &str),
    body: &str,
) -> Vec<u8> {
    let body = format!("{body}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\n{}: {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        extra_header.0,
        header_safe(extra_header.1),
        body.len(),
    )
    .into_bytes()
}

/// The reply to a successful `CONNECT`.
pub(crate) const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(raw: &str) -> Result<Request, HttpError> {
        read_request(&mut raw.as_bytes(), 8192).await
    }

    #[tokio::test]
    async fn connect_target() {
        let Request::Connect {
            host,
            port,
            early,
            tool_call,
        } = parse(
            "CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nX-Agent-Sandbox-Tool-Call: toolu_7\r\n\r\nHELLO",
        )
        .await
        .unwrap()
        else {
            panic!("not a connect")
        };
        assert_eq!(host, Host::Domain("example.com".into()));
        assert_eq!(port, 443);
        assert_eq!(early, b"HELLO");
        assert_eq!(tool_call.as_deref(), Some("toolu_7"));
    }

    #[tokio::test]
    async fn connect_ipv6_literal() {
        let Request::Connect { host, port, .. } =
            parse("CONNECT [::1]:22 HTTP/1.1\r\n\r\n").await.unwrap()
        else {
            panic!("not a connect")
        };
        assert_eq!(host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(port, 22);
    }

    #[tokio::test]
    async fn connect_needs_port() {
        assert!(matches!(
            parse("CONNECT example.com HTTP/1.1\r\n\r\n").await,
            Err(HttpError::ConnectWithoutPort { .. })
        ));
    }

    #[tokio::test]
    async fn the_event_gets_method_and_path_without_the_query() {
        let raw = "GET http://a.test/p/q?token=s3cret#f HTTP/1.1\r\nHost: a.test\r\n\r\n";
        let Request::Forward { head, .. } = parse(raw).await.unwrap() else {
            panic!("not a forward")
        };
        assert_eq!(head.method_and_path(), ("GET".into(), "/p/q".into()));
        let long = format!("PUT http://a.test/{} HTTP/1.1\r\n\r\n", "x".repeat(5000));
        let Request::Forward { head, .. } = parse(&long).await.unwrap() else {
            panic!("not a forward")
        };
        let (method, path) = head.method_and_path();
        assert_eq!(method, "PUT");
        assert_eq!(path.chars().count(), crate::events::MAX_PATH_CHARS);
    }

    #[tokio::test]
    async fn forward_rewrites_head() {
        let raw = "POST http://a.test:8080/x?y=1 HTTP/1.1\r\nHost: A.test:8080\r\nProxy-Authorization: secret\r\nx-agent-sandbox-tool-call: toolu_9\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: 5\r\nContent-Length: 4\r\n\r\nbody";
        let Request::Forward {
            host,
            port,
            head,
            tool_call,
        } = parse(raw).await.unwrap()
        else {
            panic!("not a forward")
        };
        assert_eq!(tool_call.as_deref(), Some("toolu_9"));
        assert_eq!(host, Host::Domain("a.test".into()));
        assert_eq!(port, 8080);
        let head = String::from_utf8(head.encode(None)).unwrap();
        assert_eq!(
            head,
            "POST /x?y=1 HTTP/1.1\r\nHost: A.test:8080\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
        );
    }

    #[tokio::test]
    async fn forward_adds_missing_host() {
        let Request::Forward { head, .. } = parse("GET http://u:p@a.test/ HTTP/1.0\r\n\r\n")
            .await
            .unwrap()
        else {
            panic!("not a forward")
        };
        assert_eq!(
            String::from_utf8(head.encode(None)).unwrap(),
            "GET / HTTP/1.0\r\nHost: a.test\r\nConnection: close\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn injected_header_replaces_the_clients() {
        let raw =
            "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nauthorization: mine\r\nX-A: 1\r\n\r\n";
        let Request::Forward { head, .. } = parse(raw).await.unwrap() else {
            panic!("not a forward")
        };
        assert_eq!(
            String::from_utf8(head.encode(Some(("Authorization", "Bearer s")))).unwrap(),
            "GET / HTTP/1.1\r\nHost: a.test\r\nX-A: 1\r\nAuthorization: Bearer s\r\nConnection: close\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn refusals() {
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n").await,
            Err(HttpError::NotAbsolute)
        ));
        assert!(matches!(
            parse("GET https://a.test/ HTTP/1.1\r\n\r\n").await,
            Err(HttpError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            parse("GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n").await,
            Err(HttpError::HostMismatch { .. })
        ));
        assert!(matches!(
            parse("GET http://a.test/ HTTP/1.1\r\nHost: a.test:81\r\n\r\n").await,
            Err(HttpError::HostMismatch { .. })
        ));
        assert!(matches!(
            parse("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n").await,
            Err(HttpError::DuplicateHost)
        ));
        assert!(matches!(
            parse("GARBAGE\x01\r\n\r\n").await,
            Err(HttpError::Malformed(_))
        ));
        assert!(matches!(
            parse("GET http://a.test/ HTTP/1.1\r\nHost: a.te").await,
            Err(HttpError::Truncated)
        ));
        let big = format!(
            "GET http://a.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(9000)
        );
        assert!(matches!(
            parse(&big).await,
            Err(HttpError::HeadTooLarge { .. })
        ));
    }

    #[test]
    fn response_sanitises_header() {
        let r = String::from_utf8(response(403, "Forbidden", ("X-A", "a\r\nb"), "no")).unwrap();
        assert!(r.contains("X-A: a??b\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nno\n"));
    }
}

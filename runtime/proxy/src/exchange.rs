//! HTTP/1.1 messages on a credential-bound connection: reading bodies by their framing, and
//! relaying the server's responses so that the secret only leaves, never returns.
//!
//! Every response is parsed (the requests' order tells which one answers a `HEAD`), and its
//! head, body and trailers pass through the credential's [`Scrubber`] before the sandbox gets
//! them. Replacing a needle changes the body's length, so the body is re-framed:
//!
//! - a `Content-Length` body of at most [`BUFFERED_BODY`] bytes is read whole, scrubbed and sent
//!   with its new length (API answers keep their `Content-Length`);
//! - a longer one, and a chunked one, is scrubbed as it streams (a needle split across reads is
//!   found: the scrubber holds back the last bytes) and sent chunked to an HTTP/1.1 client, or
//!   delimited by closing the connection for an HTTP/1.0 one;
//! - a body delimited by the server closing the connection stays so.
//!
//! A response the proxy cannot search is refused with a `502` and the connection closed: a
//! `Content-Encoding` other than `identity` (requests go out with `Accept-Encoding: identity`,
//! so a server that compresses anyway is not followed), a transfer coding other than
//! `chunked`, or a `101 Switching Protocols` (an upgraded stream has no framing the scrubber
//! could follow; the request side refuses `Upgrade` before it leaves).

use std::io;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use crate::scrub::{ScrubStream, Scrubber};
use crate::tls_inject::{InterceptError, write_counted};

/// Largest `Content-Length` response body read whole (and sent with its scrubbed length).
pub(crate) const BUFFERED_BODY: u64 = 1 << 20;

/// Largest response head.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Longest chunk-size or trailer line, and the most trailer bytes, accepted.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

/// Most headers a response may have.
const MAX_HEADERS: usize = 128;

/// What the response relay does next, in request order.
#[derive(Debug)]
pub(crate) enum Pending {
    /// A request went to the server: relay its response.
    Response {
        /// It was a `HEAD` (the response has no body whatever its headers say).
        head: bool,
        /// The client spoke HTTP/1.1 (a chunked answer is allowed).
        http11: bool,
    },
    /// A request was refused before it (or the rest of its body) left: answer it after the
    /// responses to the requests before it, then close the connection.
    Refused(Refusal),
}

/// A request the proxy answers itself instead of sending it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// `403` (a policy refusal, with `rule`) or `400` (a malformed or ambiguous request).
    pub(crate) status: u16,
    /// The rule named in `X-Agent-Sandbox-Denied` and the audit record.
    pub(crate) rule: Option<&'static str>,
    /// Why, for the client.
    pub(crate) reason: String,
    /// What the audit record names after the rule (a stale or foreign placeholder).
    pub(crate) named: Option<String>,
}

impl Refusal {
    pub(crate) fn bad(reason: impl Into<String>) -> Self {
        Self {
            status: 400,
            rule: None,
            reason: reason.into(),
            named: None,
        }
    }

    pub(crate) fn denied(rule: &'static str, reason: impl Into<String>) -> Self {
        Self {
            status: 403,
            rule: Some(rule),
            reason: reason.into(),
            named: None,
        }
    }

    /// The proxy's own response.
    pub(crate) fn response(&self) -> Vec<u8> {
        let body = format!("agent-sandbox: request refused: {}", self.reason);
        match self.rule {
            Some(rule) => crate::http::response(
                self.status,
                crate::proxy::DENIED_REASON,
                (crate::proxy::DENIED_HEADER, rule),
                &body,
            ),
            None => crate::http::response(
                self.status,
                "Bad Request",
                (crate::proxy::ERROR_HEADER, "bad-request"),
                &body,
            ),
        }
    }

    pub(crate) fn into_error(self) -> InterceptError {
        InterceptError::Request {
            reason: self.reason,
            rule: self.rule,
            named: self.named,
        }
    }
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkAt {
    Size,
    Data,
    Done,
}

/// Reads one body's data, piece by piece, first from what the caller's buffer already holds.
#[derive(Debug)]
pub(crate) struct BodyReader {
    framing: Framing,
    left: u64,
    at: ChunkAt,
    /// A chunked body's trailer lines (each with its CRLF), once the body has ended.
    pub(crate) trailers: Vec<u8>,
}

impl BodyReader {
    pub(crate) fn new(framing: Framing) -> Self {
        let left = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        Self {
            framing,
            left,
            at: ChunkAt::Size,
            trailers: Vec::new(),
        }
    }

    /// The next piece of data, or `None` at the end of the body.
    pub(crate) async fn next<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        buf: &mut Vec<u8>,
        idle: Duration,
    ) -> Result<Option<Vec<u8>>, InterceptError> {
        match self.framing {
            Framing::Empty => Ok(None),
            Framing::Length(_) => self.counted(r, buf, idle).await,
            Framing::UntilClose => {
                if buf.is_empty() && fill_until_close(r, buf, idle).await? == 0 {
                    return Ok(None);
                }
                Ok(Some(std::mem::take(buf)))
            }
            Framing::Chunked => loop {
                match self.at {
                    ChunkAt::Done => return Ok(None),
                    ChunkAt::Data if self.left > 0 => return self.counted(r, buf, idle).await,
                    ChunkAt::Data => {
                        if take_line(r, buf, idle).await? != b"\r\n" {
                            return Err(malformed("chunk data longer than its size"));
                        }
                        self.at = ChunkAt::Size;
                    }
                    ChunkAt::Size => {
                        let line = take_line(r, buf, idle).await?;
                        let text = std::str::from_utf8(&line).unwrap_or("");
                        let size = text.split(';').next().unwrap_or("").trim();
                        let size = u64::from_str_radix(size, 16)
                            .map_err(|_| malformed(format!("bad chunk size {size:?}")))?;
                        if size > 0 {
                            self.left = size;
                            self.at = ChunkAt::Data;
                            continue;
                        }
                        loop {
                            let line = take_line(r, buf, idle).await?;
                            if line == b"\r\n" {
                                break;
                            }
                            if self.trailers.len() + line.len() > MAX_TRAILERS {
                                return Err(malformed("trailers too large"));
                            }
                            self.trailers.extend_from_slice(&line);
                        }
                        self.at = ChunkAt::Done;
                        return Ok(None);
                    }
                }
            },
        }
    }

    async fn counted<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        buf: &mut Vec<u8>,
        idle: Duration,
    ) -> Result<Option<Vec<u8>>, InterceptError> {
        if self.left == 0 {
            return Ok(None);
        }
        if buf.is_empty() && fill_until_close(r, buf, idle).await? == 0 {
            return Err(InterceptError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let take = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        self.left -= u64::try_from(take).unwrap_or(self.left);
        Ok(Some(buf.drain(..take).collect()))
    }
}

fn malformed(reason: impl Into<String>) -> InterceptError {
    InterceptError::Malformed {
        reason: reason.into(),
    }
}

/// Reads more into `buf`; a peer that closed without TLS `close_notify` has simply ended.
async fn fill_until_close<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    idle: Duration,
) -> Result<usize, InterceptError> {
    let mut chunk = [0u8; 16 * 1024];
    let n = match timeout(idle, reader.read(&mut chunk))
        .await
        .map_err(|_| InterceptError::Idle(idle))?
    {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
        Err(e) => return Err(InterceptError::Io(e)),
    };
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(n)
}

/// Reads one CRLF-terminated line (bounded) from `buf`/`r`, removes it from `buf`, returns it.
async fn take_line<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    idle: Duration,
) -> Result<Vec<u8>, InterceptError> {
    loop {
        if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
            return Ok(buf.drain(..p + 2).collect());
        }
        if buf.len() > MAX_CHUNK_LINE {
            return Err(malformed("chunk line too long"));
        }
        if fill_until_close(r, buf, idle).await? == 0 {
            return Err(InterceptError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

/// Reads until `buf` holds a complete head; its length, or `None` if the stream ended first
/// with nothing read.
async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    idle: Duration,
) -> Result<Option<usize>, InterceptError> {
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some(p + 4));
        }
        if buf.len() > MAX_RESPONSE_HEAD {
            return Err(malformed(format!(
                "response head is larger than {MAX_RESPONSE_HEAD} bytes"
            )));
        }
        if fill_until_close(r, buf, idle).await? == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(InterceptError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

/// A response the proxy will not relay: answered with a `502` naming why.
fn unsearchable(reason: String) -> InterceptError {
    InterceptError::Response { reason }
}

/// One parsed response head.
struct Head {
    status: u16,
    reason: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    framing: Framing,
}

fn parse_head(bytes: &[u8], request_was_head: bool) -> Result<Head, InterceptError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(malformed("incomplete response head")),
        Err(e) => return Err(malformed(format!("malformed response head: {e}"))),
    }
    let status = resp.code.unwrap_or(0);
    let mut lengths: Vec<u64> = Vec::new();
    let mut codings: Vec<String> = Vec::new();
    for h in resp.headers.iter() {
        let value = String::from_utf8_lossy(h.value).trim().to_ascii_lowercase();
        if h.name.eq_ignore_ascii_case("content-length") {
            for part in value.split(',') {
                lengths.push(
                    part.trim()
                        .parse()
                        .map_err(|_| malformed(format!("bad Content-Length {value:?}")))?,
                );
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            codings.extend(
                value
                    .split(',')
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty()),
            );
        } else if h.name.eq_ignore_ascii_case("content-encoding")
            && value
                .split(',')
                .any(|t| !t.trim().is_empty() && t.trim() != "identity")
        {
            return Err(unsearchable(format!(
                "the server sent a compressed response (Content-Encoding: {value}), which the \
                 proxy cannot search for the credential"
            )));
        }
    }
    if status == 101 {
        return Err(unsearchable(
            "the server switched protocols, which the proxy does not relay for a \
             credential-bound host"
                .into(),
        ));
    }
    if codings.iter().any(|c| c != "chunked") {
        return Err(unsearchable(format!(
            "the server sent a response with Transfer-Encoding: {}, which the proxy cannot \
             search for the credential",
            codings.join(", ")
        )));
    }
    lengths.dedup();
    let framing =
        if request_was_head || (100..200).contains(&status) || status == 204 || status == 304 {
            Framing::Empty
        } else if !codings.is_empty() {
            Framing::Chunked
        } else {
            match lengths.as_slice() {
                [] => Framing::UntilClose,
                [n] => Framing::Length(*n),
                _ => {
                    return Err(malformed(
                        "conflicting Content-Length values in the response",
                    ));
                }
            }
        };
    Ok(Head {
        status,
        reason: resp.reason.unwrap_or("").as_bytes().to_vec(),
        headers: resp
            .headers
            .iter()
            .map(|h| (h.name.as_bytes().to_vec(), h.value.to_vec()))
            .collect(),
        framing,
    })
}

/// How the scrubbed body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// As the head says (no body, or a body the head's framing still fits).
    AsIs,
    /// With a new `Content-Length`.
    Length(usize),
    /// Re-framed as chunked.
    Chunked,
    /// Delimited by closing the connection.
    Close,
}

/// The head for the client: the server's, scrubbed, with framing headers for `out`.
fn encode_head(head: &Head, scrubber: &Scrubber, out: Out) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(512);
    bytes.extend_from_slice(format!("HTTP/1.1 {} ", head.status).as_bytes());
    bytes.extend_from_slice(&scrubber.scrub(&head.reason));
    bytes.extend_from_slice(b"\r\n");
    for (name, value) in &head.headers {
        let framing = name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding");
        let hop =
            name.eq_ignore_ascii_case(b"connection") || name.eq_ignore_ascii_case(b"keep-alive");
        if (framing && out != Out::AsIs) || (hop && out == Out::Close) {
            continue;
        }
        bytes.extend_from_slice(&scrubber.scrub(name));
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(&scrubber.scrub(value));
        bytes.extend_from_slice(b"\r\n");
    }
    match out {
        Out::AsIs => {}
        Out::Length(n) => bytes.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Out::Chunked => bytes.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Out::Close => bytes.extend_from_slice(b"Connection: close\r\n"),
    }
    bytes.extend_from_slice(b"\r\n");
    bytes
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 12);
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// Where the response relay writes and what it counts.
pub(crate) struct Downstream<'a, W> {
    pub(crate) client: &'a mut W,
    pub(crate) counter: &'a AtomicU64,
}

/// Relays the server's responses to the client in request order (`queue`), each scrubbed of the
/// credential, until the requests end, a refusal is answered, or a response cannot be relayed.
pub(crate) async fn relay_responses<R, W>(
    server: &mut R,
    down: Downstream<'_, W>,
    queue: &mut UnboundedReceiver<Pending>,
    scrubber: &Scrubber,
    idle: Duration,
) -> Result<(), InterceptError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Downstream { client, counter } = down;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        // Between responses the server may close (after `Connection: close`): that ends the
        // connection for the client too, instead of leaving it waiting for the idle timeout.
        let next = tokio::select! {
            biased;
            next = queue.recv() => next,
            read = fill_until_close(server, &mut buf, idle), if buf.is_empty() => {
                if read? == 0 {
                    return drain_refusal(queue, client, counter).await;
                }
                continue;
            }
        };
        let Some(next) = next else {
            return Ok(());
        };
        let (was_head, http11) = match next {
            Pending::Refused(refusal) => {
                write_counted(client, &refusal.response(), counter).await?;
                return Err(refusal.into_error());
            }
            Pending::Response { head, http11 } => (head, http11),
        };
        let keep_going = match relay_one(
            server,
            client,
            counter,
            &mut buf,
            scrubber,
            idle,
            (was_head, http11),
        )
        .await
        {
            Ok(Some(more)) => more,
            Ok(None) => return drain_refusal(queue, client, counter).await,
            Err(e @ (InterceptError::Response { .. } | InterceptError::Malformed { .. })) => {
                let reason = crate::error_text::chain(&e);
                let _ = write_counted(
                    client,
                    &crate::http::response(
                        502,
                        "Bad Gateway",
                        (crate::proxy::ERROR_HEADER, "response-refused"),
                        &format!("agent-sandbox: {reason} (docs/egress.md, \"HTTPS credential injection\")"),
                    ),
                    counter,
                )
                .await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if !keep_going {
            return Ok(());
        }
    }
}

/// The server closed between responses: a refusal already queued (the request side cut a
/// body and closed) is still answered.
async fn drain_refusal<W: AsyncWrite + Unpin>(
    queue: &mut UnboundedReceiver<Pending>,
    client: &mut W,
    counter: &AtomicU64,
) -> Result<(), InterceptError> {
    while let Ok(next) = queue.try_recv() {
        if let Pending::Refused(refusal) = next {
            write_counted(client, &refusal.response(), counter).await?;
            return Err(refusal.into_error());
        }
    }
    Ok(())
}

/// Relays one response (and the interim ones before it). `Ok(None)`: the server had closed
/// before it began; `Ok(Some(false))`: the response ended the connection.
#[allow(clippy::too_many_arguments)]
async fn relay_one<R, W>(
    server: &mut R,
    client: &mut W,
    counter: &AtomicU64,
    buf: &mut Vec<u8>,
    scrubber: &Scrubber,
    idle: Duration,
    (was_head, http11): (bool, bool),
) -> Result<Option<bool>, InterceptError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let Some(len) = read_head(server, buf, idle).await? else {
            return Ok(None);
        };
        let head = parse_head(buf.get(..len).unwrap_or_default(), was_head)?;
        buf.drain(..len);
        if (100..200).contains(&head.status) {
            write_counted(client, &encode_head(&head, scrubber, Out::AsIs), counter).await?;
            client.flush().await.map_err(InterceptError::Io)?;
            continue;
        }
        let mut body = BodyReader::new(head.framing);
        let out = match head.framing {
            Framing::Empty => Out::AsIs,
            Framing::Length(n) if n <= BUFFERED_BODY => {
                let mut whole = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
                while let Some(piece) = body.next(server, buf, idle).await? {
                    whole.extend_from_slice(&piece);
                }
                let clean = scrubber.scrub(&whole);
                let mut bytes = encode_head(&head, scrubber, Out::Length(clean.len()));
                bytes.extend_from_slice(&clean);
                write_counted(client, &bytes, counter).await?;
                client.flush().await.map_err(InterceptError::Io)?;
                return Ok(Some(true));
            }
            Framing::Length(_) | Framing::Chunked if http11 => Out::Chunked,
            Framing::Length(_) | Framing::Chunked | Framing::UntilClose => Out::Close,
        };
        write_counted(client, &encode_head(&head, scrubber, out), counter).await?;
        if out == Out::AsIs {
            client.flush().await.map_err(InterceptError::Io)?;
            return Ok(Some(true));
        }
        let mut stream = ScrubStream::default();
        let mut clean = Vec::with_capacity(16 * 1024);
        loop {
            clean.clear();
            let piece = body.next(server, buf, idle).await?;
            let ended = piece.is_none();
            match &piece {
                Some(data) => stream.push(scrubber, data, &mut clean),
                None => stream.finish(scrubber, &mut clean),
            }
            if !clean.is_empty() {
                let bytes = if out == Out::Chunked {
                    chunk(&clean)
                } else {
                    std::mem::take(&mut clean)
                };
                write_counted(client, &bytes, counter).await?;
                client.flush().await.map_err(InterceptError::Io)?;
            }
            if ended {
                break;
            }
        }
        if out == Out::Chunked {
            let mut end = b"0\r\n".to_vec();
            end.extend_from_slice(&scrubber.scrub(&body.trailers));
            end.extend_from_slice(b"\r\n");
            write_counted(client, &end, counter).await?;
            client.flush().await.map_err(InterceptError::Io)?;
            return Ok(Some(true));
        }
        return Ok(Some(false));
    }
}

#[cfg(test)]
pub(crate) mod test_io {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, ReadBuf};

    /// A reader that hands out its bytes `step` at a time (needles and lines split across
    /// reads).
    pub(crate) struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Trickle {
        pub(crate) fn new(data: &[u8], step: usize) -> Self {
            Self {
                data: data.to_vec(),
                at: 0,
                step: step.max(1),
            }
        }
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let end = (self.at + self.step)
                .min(self.data.len())
                .min(self.at + out.remaining());
            let piece = self.data[self.at..end].to_vec();
            out.put_slice(&piece);
            self.at = end;
            Poll::Ready(Ok(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_io::Trickle;
    use super::*;
    use tokio::sync::mpsc;

    const SECRET: &str = "s3cret-Token-0123456789";
    const PH: &str = "agent-sandbox-placeholder-API_TOKEN-0123456789abcdef0123456789abcdef";

    /// Relays `server` (read `step` bytes at a time) as the answers to `pending`: what the
    /// client got, and how the relay ended.
    async fn relay(
        server: &[u8],
        step: usize,
        pending: Vec<Pending>,
    ) -> (Vec<u8>, Result<(), InterceptError>) {
        let s = Scrubber::new(SECRET, "Bearer ", Some(PH)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for p in pending {
            tx.send(p).unwrap();
        }
        drop(tx);
        let mut client = Vec::new();
        let counter = AtomicU64::new(0);
        let mut reader = Trickle::new(server, step);
        let end = relay_responses(
            &mut reader,
            Downstream {
                client: &mut client,
                counter: &counter,
            },
            &mut rx,
            &s,
            Duration::from_secs(1),
        )
        .await;
        (client, end)
    }

    fn get(http11: bool) -> Pending {
        Pending::Response {
            head: false,
            http11,
        }
    }

    /// Decodes a chunked body (after the head), returning the data and what followed it.
    fn dechunk(mut rest: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
            rest = &rest[eol + 2..];
            if size == 0 {
                return (data, rest.to_vec());
            }
            data.extend_from_slice(&rest[..size]);
            assert_eq!(&rest[size..size + 2], b"\r\n");
            rest = &rest[size + 2..];
        }
    }

    fn split_head(out: &[u8]) -> (String, &[u8]) {
        let end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (
            String::from_utf8_lossy(&out[..end]).into_owned(),
            &out[end..],
        )
    }

    #[tokio::test]
    async fn echoed_headers_and_a_short_body_are_scrubbed_with_the_new_length() {
        let body = format!("{{\"authorization\": \"Bearer {SECRET}\"}}");
        let server = format!(
            "HTTP/1.1 200 OK\r\nX-Request-Id: {SECRET}\r\nAccess-Control-Allow-Origin: {SECRET}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        for step in [1, 5, 100_000] {
            let (out, end) = relay(server.as_bytes(), step, vec![get(true)]).await;
            end.unwrap();
            let (head, rest) = split_head(&out);
            assert!(!String::from_utf8_lossy(&out).contains(SECRET));
            assert!(head.contains(&format!("X-Request-Id: {PH}\r\n")), "{head}");
            assert!(
                head.contains(&format!("Access-Control-Allow-Origin: {PH}\r\n")),
                "{head}"
            );
            let expect = format!("{{\"authorization\": \"Bearer {PH}\"}}");
            assert!(
                head.contains(&format!("Content-Length: {}\r\n", expect.len())),
                "{head}"
            );
            assert_eq!(rest, expect.as_bytes());
        }
    }

    /// A chunked answer with the secret split across chunks and reads comes back re-chunked
    /// and clean; so does a long `Content-Length` body (chunked for HTTP/1.1, delimited by
    /// the close for HTTP/1.0), and the next response on the connection still follows.
    #[tokio::test]
    async fn streamed_bodies_are_scrubbed_across_chunks_and_reframed() {
        let (a, b) = SECRET.split_at(7);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\nx{a}\r\n{:x}\r\n{b}y\r\n0\r\nX-Echo: {SECRET}\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            a.len() + 1,
            b.len() + 1
        );
        for step in [1, 3, 100_000] {
            let (out, end) = relay(chunked.as_bytes(), step, vec![get(true), get(true)]).await;
            end.unwrap();
            let (head, rest) = split_head(&out);
            assert!(head.contains("Transfer-Encoding: chunked\r\n"), "{head}");
            let (data, after) = dechunk(rest);
            assert_eq!(data, format!("x{PH}y").as_bytes());
            let after = String::from_utf8(after).unwrap();
            assert!(
                after.starts_with(&format!("X-Echo: {PH}\r\n\r\nHTTP/1.1 204")),
                "{after}"
            );
        }
        let filler = "z".repeat(usize::try_from(BUFFERED_BODY).unwrap());
        let long = format!("{filler}{SECRET}{filler}");
        let server = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{long}",
            long.len()
        );
        let (out, end) = relay(server.as_bytes(), 65536, vec![get(true)]).await;
        end.unwrap();
        let (head, rest) = split_head(&out);
        assert!(
            head.contains("Transfer-Encoding: chunked") && !head.contains("Content-Length"),
            "{head}"
        );
        assert_eq!(dechunk(rest).0, format!("{filler}{PH}{filler}").as_bytes());
        let (out, end) = relay(server.as_bytes(), 65536, vec![get(false), get(false)]).await;
        end.unwrap();
        let (head, rest) = split_head(&out);
        assert!(
            head.contains("Connection: close") && !head.contains("Transfer-Encoding"),
            "{head}"
        );
        assert_eq!(rest, format!("{filler}{PH}{filler}").as_bytes());
    }

    #[tokio::test]
    async fn interim_and_bodiless_responses_keep_the_order() {
        let server = format!(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nokokHTTP/1.1 200 OK\r\nContent-Length: 99\r\nX-A: {SECRET}\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{SECRET} until close"
        );
        let (out, end) = relay(
            server.as_bytes(),
            2,
            vec![
                get(true),
                Pending::Response {
                    head: true,
                    http11: true,
                },
                get(true),
            ],
        )
        .await;
        end.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nokok"
            ),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "Content-Length: 99\r\nX-A: {PH}\r\n\r\nHTTP/1.1 200"
            )),
            "{out}"
        );
        assert!(out.ends_with(&format!("\r\n\r\n{PH} until close")), "{out}");
    }

    #[tokio::test]
    async fn unsearchable_responses_are_refused_with_a_502() {
        for (server, why) in [
            (
                "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
                "compressed",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                "Transfer-Encoding",
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nraw",
                "switched protocols",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
                "conflicting",
            ),
        ] {
            let (out, end) = relay(server.as_bytes(), 100, vec![get(true)]).await;
            let out = String::from_utf8(out).unwrap();
            assert!(out.starts_with("HTTP/1.1 502 "), "{out}");
            assert!(
                out.contains(why) && !out.contains("abc") && !out.contains("raw"),
                "{out}"
            );
            assert!(end.is_err());
        }
    }

    /// A server that closes after its answer ends the relay while the client's side is still
    /// open (no wait for the idle timeout).
    #[tokio::test]
    async fn the_servers_close_between_responses_ends_the_relay() {
        let s = Scrubber::new(SECRET, "Bearer ", Some(PH)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(get(true)).unwrap();
        let mut client = Vec::new();
        let counter = AtomicU64::new(0);
        let mut server: &[u8] =
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
        let relayed = tokio::time::timeout(
            Duration::from_secs(5),
            relay_responses(
                &mut server,
                Downstream {
                    client: &mut client,
                    counter: &counter,
                },
                &mut rx,
                &s,
                Duration::from_secs(60),
            ),
        )
        .await
        .expect("the relay waited for the next request");
        relayed.unwrap();
        assert!(client.ends_with(b"\r\n\r\nok"));
        drop(tx);
    }

    #[tokio::test]
    async fn a_refusal_is_answered_after_the_responses_before_it() {
        let server = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let refusal = Refusal::denied("some rule", "because");
        let (out, end) = relay(
            server.as_bytes(),
            100,
            vec![get(true), Pending::Refused(refusal.clone()), get(true)],
        )
        .await;
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 403 "),
            "{out}"
        );
        assert!(out.contains("because"));
        assert!(matches!(
            end,
            Err(InterceptError::Request {
                rule: Some("some rule"),
                ..
            })
        ));
        // A server that closed first (the request side cut a body) still lets it be answered.
        let (out, _) = relay(b"", 100, vec![get(true), Pending::Refused(refusal)]).await;
        assert!(String::from_utf8(out).unwrap().starts_with("HTTP/1.1 403 "));
    }
}

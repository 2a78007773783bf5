//! Reading the server name (SNI) of a TLS ClientHello without terminating TLS.
//!
//! A tunnel's first bytes are read (not consumed: the caller forwards them unchanged) and
//! given to [`parse`], a small bounded parser of the TLS record layer and the ClientHello
//! (RFC 8446 §4.1.2, RFC 6066 §3). It never panics, never allocates more than the bytes it was
//! given, and answers one of: a name, a ClientHello without a name, "not TLS", "need more
//! bytes", or "malformed". Fuzzed by `fuzz/fuzz_targets/client_hello.rs`.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::rules::Host;

/// What the proxy does when a tunnel's TLS server name is not the host the tunnel was opened
/// to (policy key `network.sni_mismatch`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SniCheck {
    /// Refuse the tunnel (a TLS `access_denied` alert, then close) and record the refusal;
    /// also refuse a ClientHello that cannot be read.
    #[default]
    Deny,
    /// Let the tunnel through and record the name it presented.
    Record,
    /// Do not read the ClientHello at all (the proxy before SNI checks; for comparison tests).
    Off,
}

/// A fatal TLS alert `access_denied` (RFC 8446 §6.2), what a refused tunnel's client reads
/// instead of a ServerHello: TLS libraries report it as "tlsv1 alert access denied".
pub const ACCESS_DENIED_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// The largest ClientHello handshake message accepted (hybrid post-quantum key shares make
/// them ~1.5 KiB; 32 KiB leaves room for any real client).
pub const MAX_HELLO_BYTES: usize = 32 * 1024;

/// The most bytes of a tunnel [`parse`] can need: a ClientHello of [`MAX_HELLO_BYTES`] spread
/// over records, with their headers.
pub const MAX_PEEK_BYTES: usize = MAX_HELLO_BYTES + 5 * (MAX_HELLO_BYTES / 512 + 2);

/// Largest TLS plaintext record payload (2^14) plus the expansion a record may carry.
const MAX_RECORD: usize = (1 << 14) + 2048;

/// What the first bytes of a tunnel are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// A complete ClientHello naming this server (lower case, no trailing dot).
    Sni(String),
    /// A complete ClientHello without a server name (e.g. to an IP address).
    NoSni,
    /// The bytes do not start a TLS handshake record: another protocol.
    NotTls,
    /// A TLS handshake record has begun; more bytes are needed.
    Incomplete,
    /// The bytes start like TLS but break its rules (or exceed the bounds).
    Malformed(&'static str),
}

/// Bounds-checked reading of a byte slice.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|b| b.first().copied())
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
    }

    fn u24(&mut self) -> Option<usize> {
        let b = self.take(3)?;
        Some(
            usize::from(*b.first()?) << 16 | usize::from(*b.get(1)?) << 8 | usize::from(*b.get(2)?),
        )
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// TLS content type of handshake records.
const HANDSHAKE: u8 = 0x16;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 0x01;
/// Extension type `server_name`.
const SERVER_NAME: u16 = 0;
/// `NameType` `host_name`.
const HOST_NAME: u8 = 0;

/// Reads the ClientHello at the start of `bytes` (the first bytes a client sent into a
/// tunnel) and returns its server name, or why there is none.
pub fn parse(bytes: &[u8]) -> Peek {
    // Record layer: reassemble the handshake message from consecutive handshake records.
    let mut records = Reader::new(bytes);
    let mut hello: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let Some(&content_type) = records.rest.first() else {
            return Peek::Incomplete;
        };
        if content_type != HANDSHAKE {
            return if first {
                Peek::NotTls
            } else {
                Peek::Malformed("a record other than handshake inside the ClientHello")
            };
        }
        // legacy_record_version: 3.0 to 3.4 (clients send 3.1 or 3.3 in the first record).
        if let Some(&major) = records.rest.get(1)
            && (major != 3 || records.rest.get(2).is_some_and(|&minor| minor > 4))
        {
            return if first {
                Peek::NotTls
            } else {
                Peek::Malformed("bad record version")
            };
        }
        let Some(header) = records.take(5) else {
            return Peek::Incomplete;
        };
        let mut header = Reader::new(header);
        let length = header.take(3).and(header.u16()).map_or(0, usize::from);
        if length == 0 || length > MAX_RECORD {
            return Peek::Malformed("bad record length");
        }
        let Some(fragment) = records.take(length) else {
            return Peek::Incomplete;
        };
        first = false;
        if hello.len() + fragment.len() > MAX_HELLO_BYTES + 4 {
            return Peek::Malformed("ClientHello larger than the bound");
        }
        hello.extend_from_slice(fragment);
        let mut message = Reader::new(&hello);
        let (Some(kind), Some(size)) = (message.u8(), message.u24()) else {
            continue;
        };
        if kind != CLIENT_HELLO {
            return Peek::Malformed("first handshake message is not a ClientHello");
        }
        if size > MAX_HELLO_BYTES {
            return Peek::Malformed("ClientHello larger than the bound");
        }
        match message.take(size) {
            Some(body) => return client_hello(body),
            None => continue,
        }
    }
}

/// The server name of a complete ClientHello body.
fn client_hello(body: &[u8]) -> Peek {
    const TRUNCATED: Peek = Peek::Malformed("truncated ClientHello");
    let mut r = Reader::new(body);
    // legacy_version, random.
    if r.take(2 + 32).is_none() {
        return TRUNCATED;
    }
    let Some(session_id) = r.vec8() else {
        return TRUNCATED;
    };
    if session_id.len() > 32 {
        return Peek::Malformed("session id longer than 32 bytes");
    }
    match r.vec16() {
        Some(suites) if !suites.is_empty() && suites.len() % 2 == 0 => {}
        Some(_) => return Peek::Malformed("bad cipher suite list"),
        None => return TRUNCATED,
    }
    match r.vec8() {
        Some(methods) if !methods.is_empty() => {}
        Some(_) => return Peek::Malformed("empty compression method list"),
        None => return TRUNCATED,
    }
    if r.is_empty() {
        // A ClientHello without extensions (TLS 1.0-1.2 allow it) has no server name.
        return Peek::NoSni;
    }
    let Some(extensions) = r.vec16() else {
        return TRUNCATED;
    };
    if !r.is_empty() {
        return Peek::Malformed("bytes after the extensions");
    }
    let mut ext = Reader::new(extensions);
    let mut name = None;
    while !ext.is_empty() {
        let (Some(kind), Some(data)) = (ext.u16(), ext.vec16()) else {
            return Peek::Malformed("truncated extension");
        };
        if kind != SERVER_NAME {
            continue;
        }
        if name.is_some() {
            // RFC 8446 §4.2: one extension of each type. A server that read the other copy
            // would see a name the proxy did not check.
            return Peek::Malformed("two server_name extensions");
        }
        name = Some(server_name(data));
    }
    match name {
        Some(Ok(host)) => Peek::Sni(host),
        Some(Err(why)) => Peek::Malformed(why),
        None => Peek::NoSni,
    }
}

/// The host name of a `server_name` extension's body (RFC 6066 §3: one `host_name`).
fn server_name(data: &[u8]) -> Result<String, &'static str> {
    let mut r = Reader::new(data);
    let Some(list) = r.vec16() else {
        return Err("truncated server_name extension");
    };
    if !r.is_empty() {
        return Err("bytes after the server name list");
    }
    let mut entries = Reader::new(list);
    let mut found = None;
    while !entries.is_empty() {
        let (Some(kind), Some(name)) = (entries.u8(), entries.vec16()) else {
            return Err("truncated server name entry");
        };
        if kind != HOST_NAME {
            continue;
        }
        if found.is_some() {
            return Err("two host names in server_name");
        }
        found = Some(name);
    }
    let name = found.ok_or("server_name without a host name")?;
    let text = std::str::from_utf8(name).map_err(|_| "server name is not ASCII")?;
    // A name the proxy's rules can read; IP literals are not allowed in SNI (RFC 6066).
    match Host::parse(text) {
        Ok(Host::Domain(host)) if text.is_ascii() => Ok(host),
        Ok(Host::Ip(_)) => Err("server name is an IP address"),
        _ => Err("server name is not a host name"),
    }
}

/// Reads a tunnel's first bytes from `client` (after `early`, the bytes it sent with its
/// request) until they form a ClientHello, prove not to be TLS, or `deadline` passes after the
/// first byte. Returns every byte read (to be forwarded unchanged) and what they are.
///
/// Until the client's first byte, there is no time limit but `idle`: a protocol whose server
/// speaks first (SSH banners, SMTP) ends the wait as soon as `upstream` has bytes to read, and
/// a client that merely waits cannot later slip a ClientHello past the check.
pub(crate) async fn read_client_hello(
    client: &mut TcpStream,
    upstream: &TcpStream,
    early: Vec<u8>,
    deadline: Duration,
    idle: Duration,
) -> (Vec<u8>, Peek) {
    let start = tokio::time::Instant::now();
    let mut bytes = early;
    let mut chunk = vec![0u8; 4096];
    loop {
        let peek = parse(&bytes);
        if peek != Peek::Incomplete {
            return (bytes, peek);
        }
        let room = MAX_PEEK_BYTES.saturating_sub(bytes.len()).min(chunk.len());
        if room == 0 {
            return (bytes, Peek::Malformed("ClientHello larger than the bound"));
        }
        let quiet = bytes.is_empty();
        let until = start + if quiet { idle } else { deadline };
        let buf = chunk.get_mut(..room).unwrap_or_default();
        tokio::select! {
            read = client.read(buf) => match read {
                Ok(n) if n > 0 => bytes.extend_from_slice(buf.get(..n).unwrap_or_default()),
                // Closed or broken: the relay that follows sees the same.
                _ => return (bytes, if quiet { Peek::NotTls } else { Peek::Incomplete }),
            },
            _ = upstream.readable(), if quiet => return (bytes, Peek::NotTls),
            () = tokio::time::sleep_until(until) => {
                return (bytes, if quiet { Peek::NotTls } else { Peek::Incomplete });
            }
        }
    }
}

/// A ClientHello record as TLS clients send it, naming `sni` (or none), for tests and the
/// fuzzing seeds.
#[doc(hidden)]
pub fn client_hello_record(sni: Option<&str>) -> Vec<u8> {
    let mut extensions = Vec::new();
    if let Some(name) = sni {
        let name = name.as_bytes();
        let entry_len = u16::try_from(name.len() + 3).unwrap_or(u16::MAX);
        let ext_len = entry_len.saturating_add(2);
        extensions.extend_from_slice(&SERVER_NAME.to_be_bytes());
        extensions.extend_from_slice(&ext_len.to_be_bytes());
        extensions.extend_from_slice(&entry_len.to_be_bytes());
        extensions.push(HOST_NAME);
        extensions.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
        extensions.extend_from_slice(name);
    }
    // supported_versions: TLS 1.3, TLS 1.2.
    extensions.extend_from_slice(&[0x00, 0x2b, 0x00, 0x05, 0x04, 0x03, 0x04, 0x03, 0x03]);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    body.extend_from_slice(&u16::try_from(extensions.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(&extensions);
    let mut message = vec![CLIENT_HELLO];
    message.extend_from_slice(&u32::try_from(body.len()).unwrap_or(0).to_be_bytes()[1..]);
    message.extend_from_slice(&body);
    let mut record = vec![HANDSHAKE, 0x03, 0x01];
    record.extend_from_slice(&u16::try_from(message.len()).unwrap_or(0).to_be_bytes());
    record.extend_from_slice(&message);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_server_name() {
        let hello = client_hello_record(Some("API.Example.com"));
        assert_eq!(parse(&hello), Peek::Sni("api.example.com".into()));
        assert_eq!(parse(&client_hello_record(None)), Peek::NoSni);
    }

    #[test]
    fn reads_a_real_clienthello() {
        // Python's ssl module (OpenSSL 3) to registry.agent-sandbox.test: GREASE-free but with
        // a dozen extensions, kept as a fuzzing seed.
        let real = include_bytes!("../../../fuzz/regressions/client_hello/seed-python-ssl.bin");
        assert_eq!(parse(real), Peek::Sni("registry.agent-sandbox.test".into()));
    }

    #[test]
    fn every_prefix_is_incomplete_and_never_a_name() {
        let hello = client_hello_record(Some("example.com"));
        for n in 0..hello.len() {
            assert_eq!(parse(&hello[..n]), Peek::Incomplete, "{n} bytes");
        }
        // Bytes after the ClientHello (early data, a second record) do not matter.
        let mut more = hello.clone();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert_eq!(parse(&more), Peek::Sni("example.com".into()));
    }

    #[test]
    fn a_hello_split_over_records_is_reassembled() {
        let hello = client_hello_record(Some("split.example"));
        let message = &hello[5..];
        let mut split = Vec::new();
        for chunk in message.chunks(7) {
            split.extend_from_slice(&[0x16, 0x03, 0x03]);
            split.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
            split.extend_from_slice(chunk);
        }
        assert_eq!(parse(&split), Peek::Sni("split.example".into()));
    }

    #[test]
    fn other_protocols_are_not_tls() {
        for first in [
            &b"SSH-2.0-OpenSSH_9.2\r\n"[..],
            b"GET / HTTP/1.1\r\n",
            b"\x05\x01\x00",
            b"\x16\x02\x00",
            b"\x16\x03\x09",
        ] {
            assert_eq!(parse(first), Peek::NotTls, "{first:?}");
        }
    }

    #[test]
    fn hostile_hellos_are_malformed() {
        let good = client_hello_record(Some("a.example"));
        // Not a ClientHello (a ServerHello type).
        let mut server_hello = good.clone();
        server_hello[5] = 0x02;
        assert!(matches!(parse(&server_hello), Peek::Malformed(_)));
        // Zero-length record.
        assert!(matches!(parse(b"\x16\x03\x01\x00\x00"), Peek::Malformed(_)));
        // A ClientHello claiming more than the bound.
        assert!(matches!(
            parse(b"\x16\x03\x01\x00\x04\x01\xff\xff\xff"),
            Peek::Malformed(_)
        ));
        // Two server_name extensions.
        let hello = client_hello_record(Some("a.example"));
        let ext_start = 5 + 4 + 2 + 32 + 1 + 4 + 2 + 2;
        let sni_ext = hello[ext_start..ext_start + 4 + 2 + 3 + 9].to_vec();
        let mut doubled = hello[..ext_start].to_vec();
        doubled.extend_from_slice(&sni_ext);
        doubled.extend_from_slice(&hello[ext_start..]);
        let grow = u16::try_from(sni_ext.len()).unwrap();
        let fix16 = |b: &mut Vec<u8>, at: usize| {
            let v = u16::from_be_bytes([b[at], b[at + 1]]) + grow;
            b[at..at + 2].copy_from_slice(&v.to_be_bytes());
        };
        fix16(&mut doubled, 3);
        fix16(&mut doubled, 7);
        fix16(&mut doubled, ext_start - 2);
        assert_eq!(
            parse(&doubled),
            Peek::Malformed("two server_name extensions")
        );
        // Names that are not host names.
        for bad in ["1.2.3.4", "a b.example", "ex\u{e9}.example", ""] {
            assert!(
                matches!(parse(&client_hello_record(Some(bad))), Peek::Malformed(_)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let hello = client_hello_record(Some("fuzz.example"));
        for _ in 0..20_000 {
            let mut bytes = hello.clone();
            let flips = next() % 8;
            for _ in 0..=flips {
                let at = usize::try_from(next() % bytes.len() as u64).unwrap();
                bytes[at] = u8::try_from(next() & 0xff).unwrap();
            }
            let cut = usize::try_from(next() % (bytes.len() as u64 + 1)).unwrap();
            let _ = parse(&bytes[..cut]);
        }
    }
}

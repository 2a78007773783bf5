//! The sandbox's DNS stub for proxy-unaware tools (policy `network.transparent`).
//!
//! Inside the sandbox's network namespace every UDP query to port 53 reaches this stub. It
//! answers a name the policy may allow with a stand-in address (IPv4 from `198.18.0.0/15`,
//! IPv6 from `100::/64`, both never routed on the internet) that the proxy maps back to the
//! name when a connection to it is redirected there, and answers every other name NXDOMAIN
//! at once. No query ever leaves the host: the proxy resolves allowed names itself, on the
//! host side, when it dials. The message parser is bounded and never panics (fuzzed as
//! `dns_query`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;

use crate::rules::Host;

/// First stand-in IPv4 address (`198.18.0.0/15`, RFC 2544 benchmarking).
const V4_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
/// IPv6 stand-ins: `100::/64` (RFC 6666, discard-only).
const V6_BASE: u128 = 0x0100_0000_0000_0000_0000_0000_0000_0000;
/// Most names one sandbox gets stand-ins for (then the stub answers SERVFAIL).
pub const MAX_NAMES: u32 = 65_535;
/// TTL of an answer, seconds. Stand-ins never change for a sandbox's life.
const TTL: u32 = 300;

/// Names given stand-in addresses, both ways. Shared by the DNS stub and the proxy.
#[derive(Debug, Default)]
pub struct StandIns {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    names: Vec<String>,
    index: HashMap<String, u32>,
}

impl StandIns {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stand-in number of `name` (1-based), allocated on first use; `None` when full.
    fn number(&self, name: &str) -> Option<u32> {
        let mut t = self.inner.lock().ok()?;
        if let Some(&n) = t.index.get(name) {
            return Some(n);
        }
        let n = u32::try_from(t.names.len()).ok()?.checked_add(1)?;
        if n > MAX_NAMES {
            return None;
        }
        t.names.push(name.to_owned());
        t.index.insert(name.to_owned(), n);
        Some(n)
    }

    /// The IPv4 and IPv6 stand-ins of `name`, allocated on first use.
    pub fn addresses(&self, name: &str) -> Option<(Ipv4Addr, Ipv6Addr)> {
        let n = self.number(name)?;
        Some((
            Ipv4Addr::from(V4_BASE + n),
            Ipv6Addr::from(V6_BASE + u128::from(n)),
        ))
    }

    /// The name a stand-in address was given for, if it is one.
    pub fn name_of(&self, addr: IpAddr) -> Option<String> {
        let n = match addr.to_canonical() {
            IpAddr::V4(v4) => u32::from(v4).checked_sub(V4_BASE)?,
            IpAddr::V6(v6) => u32::try_from(u128::from(v6).checked_sub(V6_BASE)?).ok()?,
        };
        let index = usize::try_from(n.checked_sub(1)?).ok()?;
        let t = self.inner.lock().ok()?;
        t.names.get(index).cloned()
    }
}

/// What a query asked, as far as the stub cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name, as a host the rules can judge (`None`: not a host name at all).
    pub host: Option<Host>,
    /// The query type (1 A, 28 AAAA, ...).
    pub qtype: u16,
}

/// The stub's answer to one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The response bytes (none for a datagram that is not a query: it is dropped).
    pub bytes: Vec<u8>,
    /// The question, when one was read.
    pub question: Option<Question>,
    /// Whether the name was refused (NXDOMAIN).
    pub refused: bool,
}

const QTYPE_A: u16 = 1;
const QTYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u8 = 1;
const RCODE_SERVFAIL: u8 = 2;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_NOTIMP: u8 = 4;

/// Answers one query datagram. `allowed` says whether the policy may allow a host on some
/// port; stand-ins come from `table`.
pub fn answer(query: &[u8], allowed: &dyn Fn(&Host) -> bool, table: &StandIns) -> Reply {
    let dropped = Reply {
        bytes: Vec::new(),
        question: None,
        refused: false,
    };
    let Some(header) = query.get(..12) else {
        return dropped;
    };
    let flags = u16::from_be_bytes([header[2], header[3]]);
    if flags & 0x8000 != 0 {
        // A response, not a query: never answer it (no reflection loops).
        return dropped;
    }
    let opcode = (flags >> 11) & 0xf;
    let qdcount = u16::from_be_bytes([header[4], header[5]]);
    let Some((name, qtype, question_end)) = read_question(query) else {
        return Reply {
            bytes: response(query, 12, RCODE_FORMERR, &[]),
            question: None,
            refused: false,
        };
    };
    if opcode != 0 || qdcount != 1 {
        return Reply {
            bytes: response(query, question_end, RCODE_NOTIMP, &[]),
            question: None,
            refused: false,
        };
    }
    let host = Host::parse(&name)
        .ok()
        .filter(|h| matches!(h, Host::Domain(_)));
    let question = Question {
        host: host.clone(),
        qtype,
    };
    let Some(Host::Domain(domain)) = host else {
        return Reply {
            bytes: response(query, question_end, RCODE_NXDOMAIN, &[]),
            question: Some(question),
            refused: true,
        };
    };
    if !allowed(&Host::Domain(domain.clone())) {
        return Reply {
            bytes: response(query, question_end, RCODE_NXDOMAIN, &[]),
            question: Some(question),
            refused: true,
        };
    }
    let Some((v4, v6)) = table.addresses(&domain) else {
        return Reply {
            bytes: response(query, question_end, RCODE_SERVFAIL, &[]),
            question: Some(question),
            refused: false,
        };
    };
    // Other types (HTTPS, MX, TXT, ...) of an allowed name: no data, not an error.
    let record = match qtype {
        QTYPE_A => Some((QTYPE_A, v4.octets().to_vec())),
        QTYPE_AAAA => Some((QTYPE_AAAA, v6.octets().to_vec())),
        _ => None,
    };
    let answers: Vec<(u16, Vec<u8>)> = record.into_iter().collect();
    Reply {
        bytes: response(query, question_end, 0, &answers),
        question: Some(question),
        refused: false,
    }
}

/// Reads the first question: its name (dotted, as sent), type, and the offset after it.
/// Compression pointers are refused (queries do not need them).
fn read_question(query: &[u8]) -> Option<(String, u16, usize)> {
    let mut at = 12usize;
    let mut name = String::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        let label = query.get(at..at + len)?;
        at += len;
        if !name.is_empty() {
            name.push('.');
        }
        if !label.iter().all(|b| b.is_ascii_graphic()) || label.contains(&b'.') {
            return None;
        }
        name.extend(label.iter().map(|&b| char::from(b)));
        if name.len() > 253 {
            return None;
        }
    }
    let fixed = query.get(at..at + 4)?;
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    if qclass != CLASS_IN {
        return None;
    }
    Some((name, qtype, at + 4))
}

/// A response to `query` (whose header and question end at `question_end`) with `rcode` and
/// `answers` (type, rdata) for the question's name.
fn response(query: &[u8], question_end: usize, rcode: u8, answers: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let head = query.get(..question_end).unwrap_or_default();
    let mut out = Vec::with_capacity(head.len() + 32 * answers.len());
    out.extend_from_slice(head);
    if out.len() < 12 {
        out.resize(12, 0);
    }
    let rd = out.get(2).map_or(0, |b| b & 0x01);
    // QR, opcode kept, AA, RD copied; RA; rcode.
    let opcode_bits = out.get(2).map_or(0, |b| b & 0x78);
    out[2] = 0x80 | opcode_bits | 0x04 | rd;
    out[3] = 0x80 | (rcode & 0x0f);
    let qd: u16 = if question_end > 12 { 1 } else { 0 };
    out[4..6].copy_from_slice(&qd.to_be_bytes());
    let an = u16::try_from(answers.len()).unwrap_or(0);
    out[6..8].copy_from_slice(&an.to_be_bytes());
    out[8..12].copy_from_slice(&[0, 0, 0, 0]);
    for (rtype, rdata) in answers {
        out.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&u16::try_from(rdata.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(rdata);
    }
    out
}

/// A query datagram for `name` and `qtype` (for tests and fuzzing seeds).
#[doc(hidden)]
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap_or(0));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow_example(h: &Host) -> bool {
        matches!(h, Host::Domain(d) if d == "api.example.com")
    }

    fn rcode(bytes: &[u8]) -> u8 {
        bytes[3] & 0x0f
    }

    #[test]
    fn allowed_names_get_stand_ins_that_map_back() {
        let table = StandIns::new();
        let a = answer(
            &query(7, "API.example.com.", QTYPE_A),
            &allow_example,
            &table,
        );
        assert!(!a.refused);
        assert_eq!(rcode(&a.bytes), 0);
        assert_eq!(&a.bytes[..2], &[0, 7], "same id");
        assert_eq!(&a.bytes[6..8], &[0, 1], "one answer");
        let addr: [u8; 4] = a.bytes[a.bytes.len() - 4..].try_into().unwrap();
        let v4 = Ipv4Addr::from(addr);
        assert_eq!(v4, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(
            table.name_of(IpAddr::V4(v4)).as_deref(),
            Some("api.example.com")
        );
        let aaaa = answer(
            &query(8, "api.example.com", QTYPE_AAAA),
            &allow_example,
            &table,
        );
        let addr: [u8; 16] = aaaa.bytes[aaaa.bytes.len() - 16..].try_into().unwrap();
        let v6 = Ipv6Addr::from(addr);
        assert_eq!(v6, "100::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(
            table.name_of(IpAddr::V6(v6)).as_deref(),
            Some("api.example.com")
        );
        // Other types: no data, no error.
        let https = answer(&query(9, "api.example.com", 65), &allow_example, &table);
        assert_eq!(
            (rcode(&https.bytes), &https.bytes[6..8]),
            (0, &[0u8, 0][..])
        );
        // Unknown stand-ins and real addresses map to nothing.
        assert_eq!(table.name_of("198.18.0.2".parse().unwrap()), None);
        assert_eq!(table.name_of("198.17.255.255".parse().unwrap()), None);
        assert_eq!(table.name_of("8.8.8.8".parse().unwrap()), None);
    }

    #[test]
    fn other_names_get_nxdomain_and_responses_are_never_answered() {
        let table = StandIns::new();
        let r = answer(&query(1, "evil.example", QTYPE_A), &allow_example, &table);
        assert!(r.refused);
        assert_eq!(rcode(&r.bytes), RCODE_NXDOMAIN);
        assert_eq!(
            r.question.unwrap().host,
            Some(Host::Domain("evil.example".into()))
        );
        let mut response = query(2, "api.example.com", QTYPE_A);
        response[2] |= 0x80;
        assert!(answer(&response, &allow_example, &table).bytes.is_empty());
        assert_eq!(
            table.name_of("198.18.0.1".parse().unwrap()),
            None,
            "nothing allocated"
        );
    }

    #[test]
    fn hostile_datagrams_never_panic() {
        let table = StandIns::new();
        let allow_all = |_: &Host| true;
        let good = query(3, "a.b.example", QTYPE_A);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            for _ in 0..=(next() % 6) {
                let at = usize::try_from(next() % bytes.len() as u64).unwrap();
                bytes[at] = u8::try_from(next() & 0xff).unwrap();
            }
            let cut = usize::try_from(next() % (bytes.len() as u64 + 1)).unwrap();
            let _ = answer(&bytes[..cut], &allow_all, &table);
        }
    }
}

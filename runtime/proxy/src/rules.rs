//! The proxy's view of the policy: a host it is asked for, and the verdict on it.
//!
//! The rule language itself (deny wins, `*.x` strict subdomains, ports, IP literals) lives in
//! `agent-sandbox-policy`; this crate only asks an [`EgressRules`] object, so that every entry
//! point enforces exactly the policy's matching and nothing written here.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

/// Why a requested host could not be taken as a host name or address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    /// The name is empty.
    #[error("host is empty")]
    Empty,
    /// The name is longer than DNS allows.
    #[error("host is longer than 253 bytes")]
    TooLong,
    /// A label is empty or longer than 63 bytes.
    #[error("host {host:?} has an empty or over-long label")]
    BadLabel {
        /// The offending host.
        host: String,
    },
    /// Every label is a number: a shorthand IPv4 address that resolvers would read as one.
    #[error(
        "host {host:?} looks like a numeric IPv4 address; write the address in dotted-quad form"
    )]
    NumericName {
        /// The offending host.
        host: String,
    },
    /// The name holds a character outside letters, digits, `-` and `_`.
    #[error("host {host:?} holds a character that is not allowed in a host name")]
    BadCharacter {
        /// The offending host.
        host: String,
    },
}

/// A host a client asked to reach: a normalised DNS name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum Host {
    /// A DNS name, lower case, without a trailing dot.
    Domain(String),
    /// An IP address given literally (`1.2.3.4`, `[::1]`).
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as it appears in a request target, a Host header or a SOCKS5 request.
    ///
    /// IPv6 literals may come with or without brackets. Names are lower-cased and a single
    /// trailing dot is dropped, so `Example.COM.` and `example.com` are the same host.
    /// A name made only of digits and dots (e.g. `0x7f.1` or `2130706433` forms are not digits
    /// only, but `127.1` is) is refused rather than guessed at, because resolvers disagree on how
    /// to read such shorthand.
    pub fn parse(raw: &str) -> Result<Self, HostError> {
        let unbracketed = raw
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .unwrap_or(raw);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
        if name.is_empty() {
            return Err(HostError::Empty);
        }
        if name.len() > 253 {
            return Err(HostError::TooLong);
        }
        if name
            .split('.')
            .any(|label| label.is_empty() || label.len() > 63)
        {
            return Err(HostError::BadLabel { host: name });
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(HostError::BadCharacter { host: name });
        }
        // Shorthand IPv4 forms (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`) are read as
        // addresses by `inet_aton`-style resolvers: refuse them instead of letting a name rule
        // match what is really an address.
        if name.split('.').all(is_numeric_label) {
            return Err(HostError::NumericName { host: name });
        }
        Ok(Self::Domain(name))
    }
}

/// A label `inet_aton` would read as a number: decimal, octal (`0...`) or hex (`0x...`).
fn is_numeric_label(label: &str) -> bool {
    let lower = label.to_ascii_lowercase();
    match lower.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !lower.is_empty() && lower.bytes().all(|b| b.is_ascii_digit()),
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Domain(name) => f.write_str(name),
            Self::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// The policy's answer for one `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Whether the connection may be made.
    pub allowed: bool,
    /// The rule that decided, as the policy writes it (e.g. `deny *.evil.com`,
    /// `allow api.example.com:443`, or `default deny`). Shown in logs, 403 bodies and events.
    pub rule: String,
}

impl Verdict {
    /// An allowing verdict naming its rule.
    pub fn allow(rule: impl Into<String>) -> Self {
        Self {
            allowed: true,
            rule: rule.into(),
        }
    }

    /// A denying verdict naming its rule.
    pub fn deny(rule: impl Into<String>) -> Self {
        Self {
            allowed: false,
            rule: rule.into(),
        }
    }
}

/// The egress policy as the proxy consults it.
///
/// Implemented for the policy crate's allowlist when the runtime wires the proxy up; tests use
/// small exact-match implementations. A sketch of that adapter (`Allowlist::decide` takes the
/// host as text and normalises it, brackets and IPv4-mapped forms included):
///
/// ```text
/// impl EgressRules for Allowlist {
///     fn decide(&self, host: &Host, port: u16) -> Verdict {
///         let d = Allowlist::decide(self, &host.to_string(), port);
///         Verdict { allowed: d.allowed, rule: d.rule }
///     }
///     // "Unless the policy names them": an exact IP rule for the resolved address.
///     fn allows_special_address(&self, _host: &Host, port: u16, addr: IpAddr) -> Option<String> {
///         let d = Allowlist::decide(self, &addr.to_canonical().to_string(), port);
///         d.allowed.then_some(d.rule)
///     }
/// }
/// ```
pub trait EgressRules: Send + Sync {
    /// Decides whether `host:port` may be reached at all (before any name resolution).
    fn decide(&self, host: &Host, port: u16) -> Verdict;

    /// Names the policy rule that lets a connection to `host:port` reach `addr` although the
    /// address is in a range refused by default (loopback, private, link-local, metadata...; see
    /// [`crate::guard`]). `None` (the default) keeps the refusal. Implementations matching CIDRs
    /// should compare `addr.to_canonical()`, so `::ffff:10.0.0.1` is judged as `10.0.0.1`.
    fn allows_special_address(&self, host: &Host, port: u16, addr: IpAddr) -> Option<String> {
        let _ = (host, port, addr);
        None
    }

    /// Whether `host` is allowed on some port: the sandbox's DNS stub answers only such names
    /// (policy `network.transparent`). `false` (the default) answers none.
    fn may_allow(&self, host: &Host) -> bool {
        let _ = host;
        false
    }
}

impl<T: EgressRules + ?Sized> EgressRules for std::sync::Arc<T> {
    fn decide(&self, host: &Host, port: u16) -> Verdict {
        (**self).decide(host, port)
    }

    fn may_allow(&self, host: &Host) -> bool {
        (**self).may_allow(host)
    }

    fn allows_special_address(&self, host: &Host, port: u16, addr: IpAddr) -> Option<String> {
        (**self).allows_special_address(host, port, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_literals() {
        assert_eq!(
            Host::parse("Example.COM."),
            Ok(Host::Domain("example.com".into()))
        );
        assert_eq!(Host::parse("[::1]"), Ok(Host::Ip("::1".parse().unwrap())));
        assert_eq!(Host::parse("::1"), Ok(Host::Ip("::1".parse().unwrap())));
        assert_eq!(
            Host::parse("10.0.0.1"),
            Ok(Host::Ip("10.0.0.1".parse().unwrap()))
        );
        assert_eq!(Host::parse(""), Err(HostError::Empty));
        assert!(matches!(
            Host::parse("a..b"),
            Err(HostError::BadLabel { .. })
        ));
        assert!(matches!(
            Host::parse("a b.com"),
            Err(HostError::BadCharacter { .. })
        ));
        for numeric in ["127.1", "2130706433", "0x7f.1", "0X7F.0.0.1", "0177.0.0.1"] {
            assert!(
                matches!(Host::parse(numeric), Err(HostError::NumericName { .. })),
                "{numeric}"
            );
        }
        // Names with some non-numeric label stay names.
        assert_eq!(
            Host::parse("0x7f.example"),
            Ok(Host::Domain("0x7f.example".into()))
        );
        assert_eq!(
            Host::parse("1.2.3.com"),
            Ok(Host::Domain("1.2.3.com".into()))
        );
        assert_eq!(Host::parse(&"a".repeat(254)), Err(HostError::TooLong));
    }

    #[test]
    fn displays_ipv6_in_brackets() {
        assert_eq!(Host::parse("::1").unwrap().to_string(), "[::1]");
        assert_eq!(Host::parse("x.org").unwrap().to_string(), "x.org");
    }
}

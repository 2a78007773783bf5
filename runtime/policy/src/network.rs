//! Egress domain rules and the allow/deny decision the proxy takes for every connection.
//!
//! A rule is `host`, `*.host` or either with `:port`; IP literals (`10.0.0.1`, `[::1]:443`)
//! match only themselves. Matching is case-insensitive, ignores one trailing dot and
//! compares IDNA (punycode) forms. The decision is: a matching deny rule wins, then a
//! matching allow rule, otherwise "default deny".
//!
//! ```
//! use agent_sandbox_policy::network::{Allowlist, DomainRule};
//! let allow = vec![DomainRule::parse("*.example.com").unwrap()];
//! let deny = vec![DomainRule::parse("evil.example.com").unwrap()];
//! let list = Allowlist::new(allow, deny);
//! assert!(list.decide("api.example.com", 443).allowed);
//! assert!(!list.decide("example.com", 443).allowed); // `*.` is strict subdomains
//! assert_eq!(list.decide("EVIL.example.com.", 443).rule, "deny evil.example.com");
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Why a domain rule or a host name is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error("empty host in rule `{rule}`")]
    EmptyHost { rule: String },
    #[error("rule `{rule}` allows every host; list the domains instead")]
    WildcardAll { rule: String },
    #[error("rule `{rule}` is a wildcard over the public suffix `{suffix}`")]
    PublicSuffixWildcard { rule: String, suffix: String },
    #[error("rule `{rule}` has `*` somewhere other than a leading `*.` label")]
    MisplacedWildcard { rule: String },
    #[error("rule `{rule}` puts a wildcard on an IP address")]
    IpWildcard { rule: String },
    #[error("rule `{rule}` has a bad port (1-65535)")]
    BadPort { rule: String },
    #[error("host `{host}` is not a valid domain name (IDNA/DNS rules)")]
    BadHost { host: String },
}

/// What a rule's host part matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this host (ASCII, lower case, no trailing dot).
    Exact(String),
    /// Strict subdomains of this domain (`*.example.com` matches `a.example.com`, not
    /// `example.com`).
    Subdomains(String),
    /// Exactly this IP address.
    Ip(IpAddr),
}

/// One allow or deny entry: a host pattern and an optional port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DomainRule {
    host: HostPattern,
    port: Option<u16>,
}

/// A host as the proxy sees it, normalised for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Name(String),
    Ip(IpAddr),
}

/// Normalise a host name: one trailing dot dropped, IDNA to ASCII (lower case), DNS
/// length and character rules enforced. IP literals (IPv6 with or without brackets)
/// are returned as addresses.
fn normalize_host(raw: &str) -> Result<Host, NetworkError> {
    let trimmed = raw.strip_suffix('.').unwrap_or(raw);
    let unbracketed = trimmed
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(trimmed);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(Host::Ip(ip));
    }
    let bad = || NetworkError::BadHost {
        host: raw.to_owned(),
    };
    if trimmed.is_empty() || trimmed.ends_with('.') {
        return Err(bad());
    }
    // The idna crate applies UTS #46 with STD3 ASCII rules and DNS length limits, so a
    // Unicode name becomes its punycode form and malformed `xn--` labels are refused.
    let ascii = idna::domain_to_ascii_strict(trimmed).map_err(|_| bad())?;
    if ascii.is_empty() {
        return Err(bad());
    }
    Ok(Host::Name(ascii))
}

impl DomainRule {
    /// Parse one rule as written in a policy (`example.com`, `*.example.com:443`,
    /// `10.1.2.3`, `[2001:db8::1]:8443`).
    pub fn parse(rule: &str) -> Result<DomainRule, NetworkError> {
        let err_rule = || rule.to_owned();
        let (host_part, port_part) = split_port(rule);
        let port = match port_part {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(NetworkError::BadPort { rule: err_rule() }),
                Ok(port) => Some(port),
            },
        };
        if host_part.is_empty() {
            return Err(NetworkError::EmptyHost { rule: err_rule() });
        }
        if host_part == "*" || host_part == "*." {
            return Err(NetworkError::WildcardAll { rule: err_rule() });
        }
        let (wildcard, base) = match host_part.strip_prefix("*.") {
            Some(base) => (true, base),
            None => (false, host_part),
        };
        if base.contains('*') {
            return Err(NetworkError::MisplacedWildcard { rule: err_rule() });
        }
        let host = match normalize_host(base)? {
            Host::Ip(ip) if wildcard => {
                let _ = ip;
                return Err(NetworkError::IpWildcard { rule: err_rule() });
            }
            Host::Ip(ip) => HostPattern::Ip(ip),
            Host::Name(name) if wildcard => {
                // `psl` carries the Public Suffix List compiled in. A name that is its own
                // suffix (`com`, `co.uk`, `github.io`, or an unlisted single label, which
                // the list's default `*` rule makes a suffix) must not be wildcarded.
                if psl::suffix_str(&name) == Some(name.as_str()) {
                    return Err(NetworkError::PublicSuffixWildcard {
                        rule: err_rule(),
                        suffix: name,
                    });
                }
                HostPattern::Subdomains(name)
            }
            Host::Name(name) => HostPattern::Exact(name),
        };
        Ok(DomainRule { host, port })
    }

    /// The host pattern.
    pub fn host(&self) -> &HostPattern {
        &self.host
    }

    /// The port, if the rule restricts one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Exact(a), Host::Name(b)) => a == b,
            (HostPattern::Subdomains(base), Host::Name(b)) => is_strict_subdomain(b, base),
            (HostPattern::Ip(a), Host::Ip(b)) => ip_eq(*a, *b),
            _ => false,
        }
    }

    /// Whether every host:port this rule's `other` matches is also matched by `self`.
    pub fn covers(&self, other: &DomainRule) -> bool {
        let ports = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        ports
            && match (&self.host, &other.host) {
                (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
                (HostPattern::Subdomains(a), HostPattern::Exact(b)) => is_strict_subdomain(b, a),
                (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) => {
                    a == b || is_strict_subdomain(b, a)
                }
                (HostPattern::Ip(a), HostPattern::Ip(b)) => ip_eq(*a, *b),
                _ => false,
            }
    }
}

/// `host` ends with `.base` (label boundary) and is longer than `base`.
fn is_strict_subdomain(host: &str, base: &str) -> bool {
    host.len() > base.len() + 1
        && host.ends_with(base)
        && host.as_bytes().get(host.len() - base.len() - 1) == Some(&b'.')
}

/// IPv4 and its IPv4-mapped IPv6 form are the same address for matching.
fn ip_eq(a: IpAddr, b: IpAddr) -> bool {
    canonical_ip(a) == canonical_ip(b)
}

fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Split `host[:port]`, keeping bare IPv6 literals (several colons, no brackets) whole.
fn split_port(rule: &str) -> (&str, Option<&str>) {
    if let Some(rest) = rule.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            let host = &rule[..end + 2];
            let after = &rest[end + 1..];
            return match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None if after.is_empty() => (host, None),
                // Garbage after the bracket: keep it in the port so it fails as a port.
                None => (host, Some(after)),
            };
        }
        return (rule, None);
    }
    if rule.matches(':').count() > 1 && rule.parse::<Ipv6Addr>().is_ok() {
        return (rule, None);
    }
    match rule.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (rule, None),
    }
}

impl TryFrom<String> for DomainRule {
    type Error = NetworkError;
    fn try_from(rule: String) -> Result<Self, NetworkError> {
        DomainRule::parse(&rule)
    }
}

impl From<DomainRule> for String {
    fn from(rule: DomainRule) -> String {
        rule.to_string()
    }
}

impl fmt::Display for DomainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (HostPattern::Exact(h), _) => f.write_str(h)?,
            (HostPattern::Subdomains(h), _) => write!(f, "*.{h}")?,
            (HostPattern::Ip(IpAddr::V6(ip)), Some(_)) => write!(f, "[{ip}]")?,
            (HostPattern::Ip(ip), _) => write!(f, "{ip}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl DomainRule {
    /// Whether this rule matches a connection to `host:port` (`host` as a client sent it; an
    /// invalid host matches nothing).
    pub fn matches_host(&self, host: &str, port: u16) -> bool {
        normalize_host(host).is_ok_and(|h| self.matches(&h, port))
    }
}

/// Where the runtime reads a credential's secret, on the host side (never in the sandbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource<'a> {
    /// An environment variable of the runtime (the process podman or the shim runs).
    Env(&'a str),
    /// A file on the host; one trailing newline is dropped.
    File(&'a crate::value::AbsPath),
}

/// A `[[network.credentials]]` entry: the egress proxy sets `header` to `prefix` + the secret
/// on requests to `domain`, so the secret never enters the sandbox. The secret comes from
/// exactly one of `env` and `file`.
///
/// Without `https`, only plain `http://` requests carry it: HTTPS goes through the proxy as an
/// opaque tunnel, so a rule for port 443 without `https = true` is refused when the policy is
/// loaded. With `https = true`, tunnels (`CONNECT`, SOCKS5) to `domain` are terminated with the
/// sandbox's own CA, the header is added inside, and the request is re-encrypted to the real
/// server, verified against the host's trust store (or `upstream_ca`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// The requests the header is added to.
    pub domain: DomainRule,
    /// The header name (a value the client sent for it is replaced).
    pub header: String,
    /// Text before the secret in the header value, e.g. `"Bearer "`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// The runtime's environment variable holding the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The host file holding the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<crate::value::AbsPath>,
    /// Terminate TLS to `domain` (with the sandbox's CA) to add the header inside HTTPS.
    #[serde(default, skip_serializing_if = "is_false")]
    pub https: bool,
    /// A variable set in the sandbox to a placeholder (`agent-sandbox-placeholder-NAME-`
    /// and a random suffix of the sandbox's own) for tools that want a token to send: the proxy sets `header` itself and refuses a request to
    /// `domain` that carries the placeholder anywhere else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder_env: Option<String>,
    /// A CA certificate file (PEM) on the host that verifies `domain`'s real server instead of
    /// the host's trust store (`https` rules only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca: Option<crate::value::AbsPath>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How every credential placeholder begins. A sandbox's own placeholders go on with the
/// variable's name and a random suffix of its own ([`placeholder_value`]); the proxy refuses a
/// request that carries any other text beginning so (a forked sandbox's parent's, a sibling's,
/// a guessed one: docs/egress.md#placeholders).
pub const PLACEHOLDER_PREFIX: &str = "agent-sandbox-placeholder-";

/// Hex digits of a placeholder's per-sandbox suffix (128 random bits).
pub const PLACEHOLDER_SUFFIX_HEX: usize = 32;

/// The value a sandbox sees in a credential's `placeholder_env` variable `name`, with the
/// sandbox's random `suffix` (made at create, [`PLACEHOLDER_SUFFIX_HEX`] lower-case hex
/// digits): `agent-sandbox-placeholder-NAME-SUFFIX`.
pub fn placeholder_value(name: &str, suffix: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{name}-{suffix}")
}

/// The value a sandbox created before placeholders had a suffix saw (the same in every
/// sandbox): what an exec of such a sandbox still gets, since its proxy expects it.
pub fn legacy_placeholder_value(name: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{name}")
}

/// Whether `value` is a placeholder [`placeholder_value`] makes for variable `name`: the
/// prefix, the name, `-`, then exactly [`PLACEHOLDER_SUFFIX_HEX`] lower-case hex digits.
pub fn placeholder_for(name: &str, value: &str) -> bool {
    value
        .strip_prefix(PLACEHOLDER_PREFIX)
        .and_then(|rest| rest.strip_prefix(name))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|suffix| {
            suffix.len() == PLACEHOLDER_SUFFIX_HEX
                && suffix
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// Whether `name` can be a placeholder variable: a portable shell name (`[A-Za-z_][A-Za-z0-9_]*`)
/// that the runtime does not set itself.
pub fn placeholder_env_ok(name: &str) -> bool {
    let mut chars = name.chars();
    let portable = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    let upper = name.to_ascii_uppercase();
    portable
        && !upper.ends_with("_PROXY")
        && !upper.starts_with("AGENT_SANDBOX")
        && !RUNTIME_ENV.contains(&upper.as_str())
}

/// Variables the runtime sets in a sandbox with an egress proxy, which a placeholder may not
/// take over.
const RUNTIME_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "NPM_CONFIG_PROXY",
    "NPM_CONFIG_HTTPS_PROXY",
    "NPM_CONFIG_NOPROXY",
    "GIT_CONFIG_COUNT",
    "GIT_SSH_COMMAND",
    "NODE_USE_ENV_PROXY",
    "JAVA_TOOL_OPTIONS",
    "PATH",
    "HOME",
];

impl Credential {
    /// Where the secret comes from; `None` unless exactly one of `env` and `file` is set.
    pub fn source(&self) -> Option<SecretSource<'_>> {
        match (&self.env, &self.file) {
            (Some(name), None) => Some(SecretSource::Env(name)),
            (None, Some(path)) => Some(SecretSource::File(path)),
            _ => None,
        }
    }
}

/// Headers a credential may not set: they frame or route the request, or belong to one hop.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// Whether `name` is an HTTP header name (RFC 9110 token) a credential may set.
pub fn credential_header_ok(name: &str) -> bool {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    let lower = name.to_ascii_lowercase();
    token && !RESERVED_HEADERS.contains(&lower.as_str()) && !lower.starts_with("proxy-")
}

/// Whether `text` can be part of a header value (no control characters, so no CR/LF).
pub fn header_value_ok(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// Whether `name` can be an environment variable name.
pub fn env_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// The outcome of [`Allowlist::decide`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Whether the connection may proceed.
    pub allowed: bool,
    /// The rule that decided: `deny RULE`, `allow RULE`, `default deny`, or
    /// `invalid host` when the host could not be normalised.
    pub rule: String,
}

/// The allow and deny lists of a `proxy` network policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    allow: Vec<DomainRule>,
    deny: Vec<DomainRule>,
}

impl Allowlist {
    /// A list from already-validated rules.
    pub fn new(allow: Vec<DomainRule>, deny: Vec<DomainRule>) -> Allowlist {
        Allowlist { allow, deny }
    }

    /// The allow rules.
    pub fn allow(&self) -> &[DomainRule] {
        &self.allow
    }

    /// The deny rules.
    pub fn deny(&self) -> &[DomainRule] {
        &self.deny
    }

    /// Decide a connection to `host:port`. `host` is what the client asked for (a
    /// CONNECT authority, a Host header, a SOCKS5 domain or an IP literal); it is
    /// normalised the same way rules are. Deny wins over allow; no match is a deny.
    pub fn decide(&self, host: &str, port: u16) -> Decision {
        let host = match normalize_host(host) {
            Ok(host) => host,
            Err(_) => {
                return Decision {
                    allowed: false,
                    rule: "invalid host".to_owned(),
                };
            }
        };
        if let Some(rule) = self.deny.iter().find(|r| r.matches(&host, port)) {
            return Decision {
                allowed: false,
                rule: format!("deny {rule}"),
            };
        }
        if let Some(rule) = self.allow.iter().find(|r| r.matches(&host, port)) {
            return Decision {
                allowed: true,
                rule: format!("allow {rule}"),
            };
        }
        Decision {
            allowed: false,
            rule: "default deny".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> DomainRule {
        DomainRule::parse(s).unwrap()
    }

    #[test]
    fn wildcard_is_strict_subdomains_only() {
        let list = Allowlist::new(vec![rule("*.example.com")], vec![]);
        assert!(list.decide("a.example.com", 443).allowed);
        assert!(list.decide("a.b.example.com", 80).allowed);
        assert!(!list.decide("example.com", 443).allowed);
        assert!(!list.decide("badexample.com", 443).allowed);
        assert!(!list.decide("example.com.evil.net", 443).allowed);
    }

    #[test]
    fn deny_wins_and_names_the_rule() {
        let list = Allowlist::new(
            vec![rule("*.example.com"), rule("example.com")],
            vec![rule("secret.example.com")],
        );
        let d = list.decide("Secret.Example.COM.", 443);
        assert!(!d.allowed);
        assert_eq!(d.rule, "deny secret.example.com");
        let d = list.decide("example.com", 443);
        assert_eq!(d.rule, "allow example.com");
        assert_eq!(list.decide("other.org", 443).rule, "default deny");
    }

    #[test]
    fn ports_restrict() {
        let list = Allowlist::new(vec![rule("example.com:443")], vec![]);
        assert!(list.decide("example.com", 443).allowed);
        assert!(!list.decide("example.com", 80).allowed);
    }

    #[test]
    fn ip_literals_are_exact_only() {
        let list = Allowlist::new(vec![rule("10.0.0.1"), rule("[::1]:8080")], vec![]);
        assert!(list.decide("10.0.0.1", 1).allowed);
        assert!(list.decide("::ffff:10.0.0.1", 1).allowed);
        assert!(!list.decide("10.0.0.2", 1).allowed);
        assert!(list.decide("[::1]", 8080).allowed);
        assert!(!list.decide("::1", 80).allowed);
        assert!(matches!(
            DomainRule::parse("*.10.0.0.1"),
            Err(NetworkError::IpWildcard { .. })
        ));
    }

    #[test]
    fn idna_names_match_their_punycode() {
        let list = Allowlist::new(vec![rule("bücher.example")], vec![]);
        assert_eq!(list.allow()[0].to_string(), "xn--bcher-kva.example");
        assert!(list.decide("xn--bcher-kva.example", 443).allowed);
        assert!(list.decide("BÜCHER.example", 443).allowed);
        assert_eq!(list.decide("bad..host", 443).rule, "invalid host");
        assert_eq!(list.decide("under_score.example", 443).rule, "invalid host");
    }

    #[test]
    fn rejects_broad_wildcards() {
        assert!(matches!(
            DomainRule::parse("*"),
            Err(NetworkError::WildcardAll { .. })
        ));
        for suffix in ["*.com", "*.co.uk", "*.github.io", "*.localhost"] {
            assert!(
                matches!(
                    DomainRule::parse(suffix),
                    Err(NetworkError::PublicSuffixWildcard { .. })
                ),
                "{suffix}"
            );
        }
        assert!(matches!(
            DomainRule::parse("api.*.com"),
            Err(NetworkError::MisplacedWildcard { .. })
        ));
        assert!(DomainRule::parse("*.example.co.uk").is_ok());
        assert!(DomainRule::parse("github.io").is_ok());
    }

    #[test]
    fn bad_ports() {
        for bad in [
            "example.com:0",
            "example.com:65536",
            "example.com:",
            "example.com:x",
        ] {
            assert!(
                matches!(DomainRule::parse(bad), Err(NetworkError::BadPort { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn credential_headers() {
        assert!(credential_header_ok("Authorization"));
        assert!(credential_header_ok("X-Api-Key"));
        for bad in [
            "",
            "Host",
            "content-length",
            "Proxy-Authorization",
            "Bad Header",
            "a:b",
        ] {
            assert!(!credential_header_ok(bad), "{bad}");
        }
        assert!(header_value_ok("Bearer "));
        assert!(!header_value_ok("x\r\nInjected: 1"));
        assert!(env_name_ok("TOKEN"));
        assert!(!env_name_ok("A=B"));
        assert!(placeholder_env_ok("GITHUB_TOKEN"));
        for bad in [
            "",
            "1A",
            "A-B",
            "HTTPS_PROXY",
            "SSL_CERT_FILE",
            "AGENT_SANDBOX_X",
            "PATH",
        ] {
            assert!(!placeholder_env_ok(bad), "{bad}");
        }
        assert!(rule("*.example.com:80").matches_host("API.example.com.", 80));
    }

    #[test]
    fn placeholders_are_the_prefix_the_name_and_a_suffix() {
        let suffix = "0123456789abcdef0123456789abcdef";
        let v = placeholder_value("API_TOKEN", suffix);
        assert_eq!(v, format!("agent-sandbox-placeholder-API_TOKEN-{suffix}"));
        assert!(placeholder_for("API_TOKEN", &v));
        for bad in [
            legacy_placeholder_value("API_TOKEN"),
            placeholder_value("API", suffix),
            placeholder_value("API_TOKEN", &suffix[1..]),
            placeholder_value("API_TOKEN", &suffix.to_uppercase()),
            format!("{v}0"),
            placeholder_value("API_TOKEN", "0123456789abcdef0123456789abcdeg"),
        ] {
            assert!(!placeholder_for("API_TOKEN", &bad), "{bad}");
        }
        assert!(!rule("*.example.com:80").matches_host("example.com", 80));
    }

    #[test]
    fn covers() {
        assert!(rule("*.example.com").covers(&rule("a.example.com:443")));
        assert!(rule("*.example.com").covers(&rule("*.a.example.com")));
        assert!(!rule("*.example.com").covers(&rule("example.com")));
        assert!(!rule("example.com:443").covers(&rule("example.com")));
        assert!(rule("example.com").covers(&rule("example.com:443")));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "example.com",
            "*.example.com:443",
            "10.0.0.1:80",
            "[::1]:443",
            "::1",
        ] {
            let r = rule(s);
            assert_eq!(rule(&r.to_string()), r, "{s}");
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn label() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("example".to_owned()),
                Just("api".to_owned()),
                Just("com".to_owned()),
                Just("evil".to_owned()),
                "[a-z]{1,3}",
            ]
        }

        fn host() -> impl Strategy<Value = String> {
            proptest::collection::vec(label(), 1..4).prop_map(|l| l.join("."))
        }

        fn rule() -> impl Strategy<Value = Option<DomainRule>> {
            (
                any::<bool>(),
                host(),
                proptest::option::of(prop_oneof![Just(80u16), Just(443u16)]),
            )
                .prop_map(|(wild, h, port)| {
                    let mut text = if wild { format!("*.{h}") } else { h };
                    if let Some(p) = port {
                        text = format!("{text}:{p}");
                    }
                    DomainRule::parse(&text).ok()
                })
        }

        proptest! {
            #[test]
            fn decisions_follow_the_rules(
                allow in proptest::collection::vec(rule(), 0..5),
                deny in proptest::collection::vec(rule(), 0..3),
                host in host(),
                upper in any::<bool>(),
                dot in any::<bool>(),
                port in prop_oneof![Just(80u16), Just(443u16), Just(8080u16)],
            ) {
                let allow: Vec<DomainRule> = allow.into_iter().flatten().collect();
                let deny: Vec<DomainRule> = deny.into_iter().flatten().collect();
                let list = Allowlist::new(allow.clone(), deny.clone());
                let mut asked = if upper { host.to_uppercase() } else { host.clone() };
                if dot {
                    asked.push('.');
                }
                let d = list.decide(&asked, port);
                let target = Host::Name(host.clone());
                let denied = deny.iter().any(|r| r.matches(&target, port));
                let allowed = allow.iter().any(|r| r.matches(&target, port));
                // Deny wins; otherwise allow only by a matching rule; otherwise default deny.
                prop_assert_eq!(d.allowed, !denied && allowed, "{:?}", d);
                if d.allowed {
                    // A wildcard never matches its own apex.
                    let rule = DomainRule::parse(d.rule.trim_start_matches("allow ")).unwrap();
                    if let HostPattern::Subdomains(base) = rule.host() {
                        prop_assert_ne!(base, &host);
                        let suffix = format!(".{base}");
                        prop_assert!(host.ends_with(&suffix));
                    }
                } else if !denied {
                    prop_assert_eq!(d.rule, "default deny");
                }
            }

            #[test]
            fn parse_never_accepts_a_public_suffix_wildcard(h in host()) {
                if let Ok(rule) = DomainRule::parse(&format!("*.{h}"))
                    && let HostPattern::Subdomains(base) = rule.host()
                {
                    prop_assert_ne!(psl::suffix_str(base), Some(base.as_str()));
                }
            }
        }
    }
}

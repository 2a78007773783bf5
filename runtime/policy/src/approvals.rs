//! `[network.approvals]`: live changes to a running sandbox's allowlist, bounded by an admin
//! ceiling. A *decider* (a program on the host, reached over a Unix socket or a loopback HTTP
//! endpoint) is asked about each connection to a host the allow list does not name but the
//! ceiling does; `agent-sandbox allow ID RULE` and `deny ID RULE` change the list by hand.
//! Neither can open a host outside [`Approvals::ceiling`], and the proxy's refusal of
//! loopback, private and metadata addresses still applies unless the ceiling names the
//! address itself (docs/egress.md, "Approvals").
//!
//! ```
//! use agent_sandbox_policy::approvals::{Decider, DefaultAnswer};
//! let d: Decider = "/run/decider.sock".parse().unwrap();
//! assert_eq!(d.to_string(), "/run/decider.sock");
//! let h: Decider = "http://127.0.0.1:8700/decide".parse().unwrap();
//! assert!(matches!(h, Decider::Http { port: 8700, .. }));
//! assert!("http://example.com/decide".parse::<Decider>().is_err());
//! assert_eq!(DefaultAnswer::default(), DefaultAnswer::Deny);
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::network::DomainRule;
use crate::value::Seconds;

/// The longest decider timeout: a connection is held while the decider thinks.
pub const MAX_TIMEOUT_SECS: u64 = 300;

/// The timeout when the policy names none.
pub const DEFAULT_TIMEOUT: Seconds = Seconds::from_trusted(10);

/// The longest Unix socket path (`sun_path` holds 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why a decider address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeciderError {
    #[error(
        "decider `{value}` is neither an absolute Unix socket path nor an http://127.0.0.1:PORT/PATH URL"
    )]
    Form { value: String },
    #[error("decider socket path `{value}` is longer than {MAX_SOCKET_PATH} bytes")]
    PathTooLong { value: String },
    #[error(
        "decider `{value}` is not on this host's loopback (only 127.0.0.1, [::1] and localhost)"
    )]
    NotLoopback { value: String },
    #[error("decider `{value}` needs an explicit port")]
    NoPort { value: String },
    #[error("decider `{value}` has a character not allowed in its path")]
    BadPath { value: String },
}

/// Where the decider listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Decider {
    /// A Unix stream socket on the host.
    Unix(String),
    /// An HTTP endpoint on the host's loopback (`POST` of the question, JSON answer).
    Http {
        /// A loopback address.
        addr: IpAddr,
        /// The port.
        port: u16,
        /// The request path (starts with `/`).
        path: String,
    },
}

impl FromStr for Decider {
    type Err = DeciderError;

    fn from_str(value: &str) -> Result<Self, DeciderError> {
        if value.starts_with('/') {
            if value.len() > MAX_SOCKET_PATH {
                return Err(DeciderError::PathTooLong {
                    value: value.to_owned(),
                });
            }
            if value.contains('\0') {
                return Err(DeciderError::Form {
                    value: value.to_owned(),
                });
            }
            return Ok(Decider::Unix(value.to_owned()));
        }
        let Some(rest) = value.strip_prefix("http://") else {
            return Err(DeciderError::Form {
                value: value.to_owned(),
            });
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if !path
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'#' && b != b'?')
        {
            return Err(DeciderError::BadPath {
                value: value.to_owned(),
            });
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => (h, p),
            _ => {
                return Err(DeciderError::NoPort {
                    value: value.to_owned(),
                });
            }
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(DeciderError::NoPort {
                    value: value.to_owned(),
                });
            }
        };
        let addr = match host {
            "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
            "[::1]" => IpAddr::V6(Ipv6Addr::LOCALHOST),
            other => match other.parse::<IpAddr>() {
                Ok(ip) if ip.is_loopback() => ip,
                _ => {
                    return Err(DeciderError::NotLoopback {
                        value: value.to_owned(),
                    });
                }
            },
        };
        Ok(Decider::Http {
            addr,
            port,
            path: path.to_owned(),
        })
    }
}

impl TryFrom<String> for Decider {
    type Error = DeciderError;
    fn try_from(value: String) -> Result<Self, DeciderError> {
        value.parse()
    }
}

impl From<Decider> for String {
    fn from(d: Decider) -> String {
        d.to_string()
    }
}

impl fmt::Display for Decider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decider::Unix(path) => f.write_str(path),
            Decider::Http {
                addr: IpAddr::V6(a),
                port,
                path,
            } => write!(f, "http://[{a}]:{port}{path}"),
            Decider::Http {
                addr: IpAddr::V4(a),
                port,
                path,
            } => write!(f, "http://{a}:{port}{path}"),
        }
    }
}

/// What a connection gets when the decider does not answer in time, cannot be reached, or
/// answers something that is not a valid answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefaultAnswer {
    /// Refuse the connection (the tool sees why).
    #[default]
    Deny,
    /// Let this one connection through (still within the ceiling).
    AllowOnce,
}

/// The `[network.approvals]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approvals {
    /// The program asked about unlisted hosts within the ceiling; none: only
    /// `agent-sandbox allow`/`deny` change the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decider: Option<Decider>,
    /// How long a connection is held waiting for the decider.
    #[serde(default = "default_timeout")]
    pub timeout: Seconds,
    /// The answer when the decider does not give one in time.
    #[serde(default)]
    pub default: DefaultAnswer,
    /// The hosts a decider or `agent-sandbox allow` may open (domain rules as in
    /// `network.allow`). An exact IP rule here also lets an approved host reach that
    /// address when it is loopback, private or metadata.
    pub ceiling: Vec<DomainRule>,
}

fn default_timeout() -> Seconds {
    DEFAULT_TIMEOUT
}

impl Approvals {
    /// Whether the ceiling lets an approval open `host:port`.
    pub fn ceiling_covers_host(&self, host: &str, port: u16) -> bool {
        self.ceiling.iter().any(|r| r.matches_host(host, port))
    }

    /// Whether the ceiling lets `agent-sandbox allow RULE` add `rule`: one ceiling rule
    /// covers every host and port the rule matches.
    pub fn ceiling_covers_rule(&self, rule: &DomainRule) -> bool {
        self.ceiling.iter().any(|c| c.covers(rule))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decider_forms() {
        let d: Decider = "http://[::1]:9/a/b".parse().unwrap();
        assert_eq!(d.to_string(), "http://[::1]:9/a/b");
        let d: Decider = "http://localhost:9".parse().unwrap();
        assert_eq!(d.to_string(), "http://127.0.0.1:9/");
        for bad in [
            "relative.sock",
            "https://127.0.0.1:9/",
            "http://127.0.0.1/",
            "http://127.0.0.1:0/",
            "http://10.0.0.1:80/",
            "http://example.com:80/",
            "http://127.0.0.1:80/a b",
        ] {
            assert!(bad.parse::<Decider>().is_err(), "{bad}");
        }
        assert!(matches!(
            format!("/{}", "a".repeat(120)).parse::<Decider>(),
            Err(DeciderError::PathTooLong { .. })
        ));
    }

    #[test]
    fn ceiling_covers() {
        let a = Approvals {
            decider: None,
            timeout: DEFAULT_TIMEOUT,
            default: DefaultAnswer::Deny,
            ceiling: vec![DomainRule::parse("*.example.com:443").unwrap()],
        };
        assert!(a.ceiling_covers_host("api.example.com", 443));
        assert!(!a.ceiling_covers_host("api.example.com", 80));
        assert!(!a.ceiling_covers_host("example.com", 443));
        assert!(a.ceiling_covers_rule(&DomainRule::parse("a.example.com:443").unwrap()));
        assert!(!a.ceiling_covers_rule(&DomainRule::parse("a.example.com").unwrap()));
    }
}

//! Per-domain credential injection: headers the proxy adds to plain-HTTP requests so that a
//! secret reaches the server without ever entering the sandbox.
//!
//! Only absolute-form `http://` requests are rewritten. HTTPS and SOCKS5 connections are
//! opaque tunnels: the proxy cannot add a header inside TLS without terminating it, so
//! credentials are never added there (the policy refuses a credential rule for port 443).

use std::fmt;

use agent_sandbox_policy::network::DomainRule;

use crate::rules::Host;

/// One header to add: `name: value` on plain-HTTP requests to hosts `domain` matches.
#[derive(Clone)]
pub struct InjectedHeader {
    /// The requests it applies to.
    pub domain: DomainRule,
    /// The header name.
    pub name: String,
    /// The whole header value (prefix and secret).
    pub value: String,
}

impl fmt::Debug for InjectedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the value: this type's whole point is that the secret stays out of logs too.
        f.debug_struct("InjectedHeader")
            .field("domain", &self.domain.to_string())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The credential headers of one proxy; the first entry matching a request wins.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    entries: Vec<InjectedHeader>,
}

impl Credentials {
    /// A table from entries (validated by the policy: header names and values are safe).
    pub fn new(entries: Vec<InjectedHeader>) -> Self {
        Self { entries }
    }

    /// Whether there is nothing to inject.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The header for a plain-HTTP request to `host:port`, if any.
    pub fn find(&self, host: &Host, port: u16) -> Option<&InjectedHeader> {
        if self.entries.is_empty() {
            return None;
        }
        let host = host.to_string();
        self.entries
            .iter()
            .find(|e| e.domain.matches_host(&host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_by_domain_and_never_prints_the_secret() {
        let c = Credentials::new(vec![InjectedHeader {
            domain: DomainRule::parse("*.example.com:80").unwrap(),
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
        }]);
        let host = Host::parse("api.example.com").unwrap();
        assert_eq!(c.find(&host, 80).unwrap().name, "Authorization");
        assert!(c.find(&host, 8080).is_none());
        assert!(c.find(&Host::parse("example.com").unwrap(), 80).is_none());
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}

//! Per-domain credential injection: headers the proxy adds to requests so that a secret reaches
//! the server without ever entering the sandbox.
//!
//! A plain entry rewrites absolute-form `http://` requests only: HTTPS and SOCKS5 connections
//! to its domain stay opaque tunnels. An `https` entry instead makes the proxy terminate TLS
//! for its domain (`crate::tls_inject`) and add the header to every request inside. Either way,
//! the requests to a bound host are checked (the placeholder only where the header goes, no
//! `TRACE`, no `Upgrade`) and the responses scrubbed of the secret (`crate::scrub`), so the
//! secret only leaves, never returns.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use agent_sandbox_policy::network::DomainRule;

use crate::placeholder::Guard;
use crate::rules::Host;
use crate::scrub::Scrubber;

/// One header to add: `name: value` on requests to hosts `domain` matches.
#[derive(Clone)]
pub struct InjectedHeader {
    /// The requests it applies to.
    pub domain: DomainRule,
    /// The header name.
    pub name: String,
    /// The whole header value (prefix and secret).
    pub value: String,
    /// The secret alone (what a placeholder is replaced with).
    pub secret: String,
    /// Terminate TLS to `domain` and inject inside (else plain HTTP only).
    pub https: bool,
    /// Text the sandbox sees instead of the secret: refused in requests anywhere but the
    /// header, and what the secret is replaced with in responses.
    pub placeholder: Option<String>,
    /// A CA file that verifies `domain`'s server instead of the host's trust store.
    pub upstream_ca: Option<PathBuf>,
}

impl fmt::Debug for InjectedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the value: this type's whole point is that the secret stays out of logs too.
        f.debug_struct("InjectedHeader")
            .field("domain", &self.domain.to_string())
            .field("name", &self.name)
            .field("https", &self.https)
            .finish_non_exhaustive()
    }
}

/// The credential headers of one proxy; the first entry matching a request wins.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    entries: Vec<InjectedHeader>,
    /// Per entry, the search for its secret in responses: built on first use, then shared by
    /// every connection (building it costs about a TLS handshake).
    scrubbers: Vec<OnceLock<Option<Arc<Scrubber>>>>,
    /// The search for placeholders that are not this sandbox's, built on first use.
    guard: OnceLock<Option<Arc<Guard>>>,
}

impl Credentials {
    /// A table from entries (validated by the policy: header names and values are safe).
    pub fn new(entries: Vec<InjectedHeader>) -> Self {
        let scrubbers = entries.iter().map(|_| OnceLock::new()).collect();
        Self {
            entries,
            scrubbers,
            guard: OnceLock::new(),
        }
    }

    /// The search for placeholder-shaped tokens other than the entries' own placeholders
    /// (`crate::placeholder`), or `None` if it cannot be built.
    pub(crate) fn guard(&self) -> Option<Arc<Guard>> {
        self.guard
            .get_or_init(|| {
                let own: Vec<&str> = self
                    .entries
                    .iter()
                    .filter_map(|e| e.placeholder.as_deref())
                    .collect();
                Guard::new(&own).map(Arc::new)
            })
            .clone()
    }

    /// The scrubber of `entry` (one of this table's), or `None` if its search cannot be built.
    pub(crate) fn scrubber(&self, entry: &InjectedHeader) -> Option<Arc<Scrubber>> {
        let index = self.entries.iter().position(|e| std::ptr::eq(e, entry))?;
        self.scrubbers
            .get(index)?
            .get_or_init(|| {
                let prefix = entry
                    .value
                    .strip_suffix(entry.secret.as_str())
                    .unwrap_or("");
                Scrubber::new(&entry.secret, prefix, entry.placeholder.as_deref()).map(Arc::new)
            })
            .clone()
    }

    /// Whether there is nothing to inject.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, in policy order.
    pub fn entries(&self) -> &[InjectedHeader] {
        &self.entries
    }

    /// The header for a plain-HTTP request to `host:port`, if any.
    pub fn find(&self, host: &Host, port: u16) -> Option<&InjectedHeader> {
        self.find_where(host, port, false).map(|(_, e)| e)
    }

    /// The `https` entry (and its index) whose domain a tunnel to `host:port` matches.
    pub fn find_tls(&self, host: &Host, port: u16) -> Option<(usize, &InjectedHeader)> {
        self.find_where(host, port, true)
    }

    fn find_where(&self, host: &Host, port: u16, https: bool) -> Option<(usize, &InjectedHeader)> {
        if self.entries.is_empty() {
            return None;
        }
        let host = host.to_string();
        self.entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.https == https && e.domain.matches_host(&host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(domain: &str, https: bool) -> InjectedHeader {
        InjectedHeader {
            domain: DomainRule::parse(domain).unwrap(),
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
            secret: "s3cret".into(),
            https,
            placeholder: None,
            upstream_ca: None,
        }
    }

    #[test]
    fn matches_by_domain_and_never_prints_the_secret() {
        let c = Credentials::new(vec![entry("*.example.com:80", false)]);
        let host = Host::parse("api.example.com").unwrap();
        assert_eq!(c.find(&host, 80).unwrap().name, "Authorization");
        assert!(c.find(&host, 8080).is_none());
        assert!(c.find(&Host::parse("example.com").unwrap(), 80).is_none());
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn https_entries_apply_to_tunnels_only() {
        let c = Credentials::new(vec![entry("api.example.com", true)]);
        let host = Host::parse("api.example.com").unwrap();
        assert!(c.find(&host, 80).is_none());
        assert_eq!(c.find_tls(&host, 443).map(|(i, _)| i), Some(0));
        assert!(
            c.find_tls(&Host::parse("other.example.com").unwrap(), 443)
                .is_none()
        );
    }
}

//! Structured records of every egress decision, for tracing and for the audit trail.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::guard::SpecialRange;

/// How the client spoke to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `CONNECT host:port` (TLS and anything else tunnelled).
    HttpConnect,
    /// An absolute-form plain HTTP request (`GET http://host/path`).
    HttpForward,
    /// SOCKS5 `CONNECT`.
    Socks5,
    /// A TCP connection of a proxy-unaware tool, redirected to the proxy inside the
    /// sandbox's network namespace (policy `network.transparent`).
    Transparent,
    /// A query to the sandbox's DNS stub (policy `network.transparent`).
    Dns,
    /// The first bytes matched no supported protocol.
    Unknown,
}

/// Where in a connection's life an event is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// The connection was allowed and the upstream dialled; bytes are about to flow.
    Opened,
    /// The connection is over (refused, failed or closed). Exactly one per accepted connection.
    Finished,
}

/// What became of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// Allowed by the policy and connected.
    Allowed,
    /// Refused by a policy rule (see the event's `rule`).
    Denied,
    /// The name was allowed but every address it resolved to is in a refused range.
    SpecialAddress {
        /// The first refused address.
        addr: std::net::IpAddr,
        /// Its range.
        range: SpecialRange,
    },
    /// The name did not resolve (or resolved to nothing) on the host side.
    ResolveFailed {
        /// Why.
        reason: String,
    },
    /// Every checked address refused or timed out.
    UpstreamFailed {
        /// Why.
        reason: String,
    },
    /// The client's request was malformed or not a proxy request.
    BadRequest {
        /// Why.
        reason: String,
    },
    /// The client gave up or the connection broke before a decision.
    ClientError {
        /// Why.
        reason: String,
    },
}

/// A credential the proxy added to a connection's requests (the header's name, never its value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Injection {
    /// The header set.
    pub header: String,
    /// How many requests carried it.
    pub requests: u64,
    /// Added inside TLS the proxy terminated (an `https` credential).
    pub https: bool,
}

/// Most characters of a request path an event keeps.
pub const MAX_PATH_CHARS: usize = 256;

/// One structured egress record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EgressEvent {
    /// When in the connection's life this was emitted.
    pub stage: Stage,
    /// A per-proxy connection number, shared by a connection's events.
    pub connection: u64,
    /// The client's address (inside the sandbox).
    pub client: SocketAddr,
    /// The protocol used.
    pub protocol: Protocol,
    /// The requested host, if the request got that far.
    pub host: Option<String>,
    /// The requested port, if the request got that far.
    pub port: Option<u16>,
    /// The method of a plain HTTP request (`GET`), when the request got that far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The path of a plain HTTP request, without its query string (which can carry
    /// secrets) and cut at [`MAX_PATH_CHARS`] characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The server name (SNI) of the TLS ClientHello a tunnel's client sent, read without
    /// terminating TLS; `None` when the tunnel did not start with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// The policy rule that decided (or let a refused address through), if any.
    pub rule: Option<String>,
    /// The policy rule that let the dialled address through although it is in a refused range
    /// (see [`crate::EgressRules::allows_special_address`]).
    pub address_rule: Option<String>,
    /// The address actually dialled.
    pub resolved: Option<SocketAddr>,
    /// The outcome.
    pub outcome: Outcome,
    /// Bytes from the sandbox to upstream (after the proxy handshake).
    pub bytes_up: u64,
    /// Bytes from upstream to the sandbox.
    pub bytes_down: u64,
    /// Time since the connection was accepted.
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
    /// The credential added to the connection's requests, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<Injection>,
    /// The tool call of the exec whose process opened the connection, as the runtime knows
    /// it (`crate::ToolCalls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// In a pod, the member container whose process opened the connection, as the runtime
    /// knows it (`crate::ToolCalls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The tool call the request's header claimed: written by the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_claimed: Option<String>,
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Receives every [`EgressEvent`]. Called on the proxy's tasks: must be quick and must not
/// block (hand the event to a channel if writing it out takes time).
pub trait EventSink: Send + Sync {
    /// Records one event.
    fn record(&self, event: &EgressEvent);
}

/// Discards events (they still go to `tracing`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn record(&self, _event: &EgressEvent) {}
}

impl<F: Fn(&EgressEvent) + Send + Sync> EventSink for F {
    fn record(&self, event: &EgressEvent) {
        self(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_for_the_audit_log() {
        let event = EgressEvent {
            stage: Stage::Finished,
            connection: 7,
            client: "127.0.0.1:40000".parse().unwrap(),
            protocol: Protocol::HttpConnect,
            host: Some("example.com".into()),
            port: Some(443),
            method: None,
            path: None,
            sni: None,
            rule: Some("allow example.com".into()),
            address_rule: None,
            resolved: Some("93.184.216.34:443".parse().unwrap()),
            outcome: Outcome::SpecialAddress {
                addr: "10.0.0.1".parse().unwrap(),
                range: SpecialRange::Private,
            },
            bytes_up: 10,
            bytes_down: 20,
            duration: Duration::from_micros(1500),
            credential: None,
            tool_call_id: None,
            container: None,
            tool_call_claimed: None,
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "stage": "finished",
                "connection": 7,
                "client": "127.0.0.1:40000",
                "protocol": "http-connect",
                "host": "example.com",
                "port": 443,
                "rule": "allow example.com",
                "address_rule": null,
                "resolved": "93.184.216.34:443",
                "outcome": {"kind": "special-address", "addr": "10.0.0.1", "range": "private"},
                "bytes_up": 10,
                "bytes_down": 20,
                "duration_ms": 1.5
            })
        );
    }
}

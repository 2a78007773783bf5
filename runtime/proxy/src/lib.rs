#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod approval;
pub mod ca;
pub mod credentials;
pub mod dns_stub;
pub mod env;
pub mod error_text;
pub mod events;
mod exchange;
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;
mod http;
pub mod listener;
pub mod placeholder;
mod policy;
mod proxy;
mod pump;
pub mod resolve;
pub mod rules;
mod scrub;
pub mod sni;
mod socks;
pub mod tls_inject;
mod transparent;

pub use approval::{Approvals, TOOL_CALL_HEADER};
pub use credentials::{Credentials, InjectedHeader};
pub use dns_stub::StandIns;
pub use env::{NO_PROXY, SshProxyTool, proxy_env, proxy_env_with, ssh_proxy_command};
pub use events::{EgressEvent, EventSink, Injection, NullSink, Outcome, Protocol, Stage};
pub use guard::{SpecialRange, classify};
pub use http::HttpError;
pub use listener::{
    ListenerError, TransparentError, TransparentSockets, bind_in_netns, transparent_in_netns,
};
pub use proxy::{
    DENIED_HEADER, DENIED_REASON, DNS_REFUSED_RULE, ERROR_HEADER, HOST_MISMATCH_RULE, Origin,
    Proxy, ProxyConfig, ProxyError, SNI_MISMATCH_RULE, SNI_UNREADABLE_RULE, ToolCalls,
};
pub use resolve::{
    BoxFuture, DNS_CACHE_ENTRIES, DnsResolver, ResolveError, Resolver, StaticResolver,
    SystemResolver,
};
pub use rules::{EgressRules, Host, HostError, Verdict};
pub use sni::SniCheck;
pub use socks::SocksError;
pub use tls_inject::{TlsInterceptor, TlsSetupError};

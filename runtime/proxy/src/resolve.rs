//! Host-side name resolution, injectable so tests (and e2e "internets") can map names to the
//! addresses they control.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed future, so resolvers can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Resolves a DNS name to addresses, once per connection, on the host side.
pub trait Resolver: Send + Sync {
    /// Returns every address of `name` (already normalised: lower case, no trailing dot).
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The host's own resolver (`getaddrinfo` through tokio's blocking pool). No cache: every
/// connection costs a lookup, and `getaddrinfo` does not say how long an answer may be kept.
/// The runtime's proxy uses [`DnsResolver`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((name, 0)).await?;
            Ok(addrs.map(|sa| sa.ip()).collect())
        })
    }
}

/// Why a [`DnsResolver`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver could not be set up from the given configuration.
    #[error("cannot set up the DNS resolver")]
    Build(#[source] hickory_resolver::net::NetError),
    /// The hosts text given could not be read.
    #[error("cannot read the hosts table")]
    Hosts(#[source] io::Error),
}

/// Answers cached at most: a bound on the proxy's memory whatever names the sandbox asks for.
pub const DNS_CACHE_ENTRIES: u64 = 4096;

/// The host's DNS through `hickory-resolver`, with a bounded cache that keeps each answer for
/// its TTL (negative answers for their SOA minimum), so that repeated connections to one host
/// cost no lookup. Names are looked up as `getaddrinfo` with `hosts: files dns` would: the
/// hosts table first (read once, when the resolver is built), then the name servers.
///
/// The cache changes nothing about what is dialled: the proxy resolves once per connection,
/// checks every address it got and dials one of exactly those (no second lookup between the
/// check and the dial).
#[derive(Clone)]
pub struct DnsResolver {
    inner: hickory_resolver::TokioResolver,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver").finish_non_exhaustive()
    }
}

impl DnsResolver {
    /// The host's configuration: `/etc/resolv.conf` (name servers, search list, options) and
    /// `/etc/hosts`. Without a readable `resolv.conf` only the hosts table answers (as with
    /// `getaddrinfo`, which then has no name server either).
    pub fn from_system() -> Result<Self, ResolveError> {
        use hickory_resolver::config::{ResolveHosts, ResolverConfig};
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let mut builder = match hickory_resolver::TokioResolver::builder_tokio() {
            Ok(builder) => builder,
            Err(e) => {
                tracing::warn!(error = %e, "no usable /etc/resolv.conf: only /etc/hosts answers");
                hickory_resolver::TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), Vec::new()),
                    TokioRuntimeProvider::default(),
                )
            }
        };
        let options = builder.options_mut();
        options.use_hosts_file = ResolveHosts::Always;
        options.cache_size = DNS_CACHE_ENTRIES;
        Ok(Self {
            inner: builder.build().map_err(ResolveError::Build)?,
        })
    }

    /// A resolver asking only `name_servers` (UDP, then TCP), with `hosts` (text in
    /// `/etc/hosts` format) answering first. For tests and setups that run their own DNS.
    pub fn with_servers(name_servers: &[SocketAddr], hosts: &str) -> Result<Self, ResolveError> {
        use hickory_resolver::config::{
            ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig,
        };
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let servers = name_servers
            .iter()
            .map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            })
            .collect();
        let mut builder = hickory_resolver::TokioResolver::builder_with_config(
            ResolverConfig::from_parts(None, Vec::new(), servers),
            TokioRuntimeProvider::default(),
        );
        let options = builder.options_mut();
        // The table below replaces the system's; never read /etc/hosts here.
        options.use_hosts_file = ResolveHosts::Never;
        options.cache_size = DNS_CACHE_ENTRIES;
        let mut resolver = builder.build().map_err(ResolveError::Build)?;
        let mut table = hickory_resolver::Hosts::default();
        table
            .read_hosts_conf(hosts.as_bytes())
            .map_err(ResolveError::Hosts)?;
        resolver.set_hosts(Arc::new(table));
        Ok(Self { inner: resolver })
    }
}

impl Resolver for DnsResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            match self.inner.lookup_ip(name).await {
                Ok(found) => Ok(found.iter().collect()),
                Err(e) if e.is_no_records_found() || e.is_nx_domain() => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{name} has no addresses"),
                )),
                Err(e) => Err(io::Error::other(e.to_string())),
            }
        })
    }
}

/// A fixed table of names; any other name fails to resolve. Used by tests and by e2e setups that
/// build their own "internet" on loopback or in test network namespaces.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the addresses of `name`.
    #[must_use]
    pub fn with(mut self, name: &str, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.names
            .insert(name.to_ascii_lowercase(), addrs.into_iter().collect());
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        let found = self.names.get(name).cloned();
        Box::pin(async move {
            found.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "name not in the static table")
            })
        })
    }
}

impl<T: Resolver + ?Sized> Resolver for std::sync::Arc<T> {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        (**self).resolve(name)
    }
}

//! Host-side name resolution, injectable so tests (and e2e "internets") can map names to the
//! addresses they control.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// A boxed future, so resolvers can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Resolves a DNS name to addresses, once per connection, on the host side.
pub trait Resolver: Send + Sync {
    /// Returns every address of `name` (already normalised: lower case, no trailing dot).
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The host's own resolver (`getaddrinfo` through tokio's blocking pool).
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

//! Creating the proxy's listening socket inside a sandbox's network namespace.
//!
//! A dedicated thread enters the namespace (`setns`, which moves only the calling thread),
//! binds `127.0.0.1:PORT` there and ends. The socket keeps belonging to the namespace it was
//! created in, so the proxy serves it from the host side while only the sandbox can connect.
//! No process runs inside the sandbox for this.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

/// Why the listener could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The namespace file could not be opened.
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        /// The namespace path (e.g. `/proc/PID/ns/net` or `/run/netns/NAME`).
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `setns` into the namespace failed.
    #[error("cannot enter network namespace {path}")]
    EnterNetns {
        /// The namespace path.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// Binding `127.0.0.1:port` inside the namespace failed.
    #[error("cannot bind 127.0.0.1:{port} in network namespace {path}")]
    Bind {
        /// The namespace path.
        path: PathBuf,
        /// The port asked for (0: any).
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The new listener cannot be reached from inside the namespace (typically: `lo` is down
    /// there; the binding succeeds but no connection gets through).
    #[error("127.0.0.1:{port} is not reachable inside network namespace {path} (is lo up?)")]
    Unreachable {
        /// The namespace path.
        path: PathBuf,
        /// The port that was bound.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The helper thread could not be started or died.
    #[error("the namespace helper thread failed")]
    Thread(#[source] std::io::Error),
}

/// Binds `127.0.0.1:port` inside the network namespace at `netns`, checks that a connection
/// from inside the namespace reaches it, and returns the listener, ready for
/// [`crate::Proxy::serve_std`]. Port 0 picks a free port (read it from `local_addr`).
pub fn bind_in_netns(netns: &Path, port: u16) -> Result<TcpListener, ListenerError> {
    let path = netns.to_path_buf();
    let worker = std::thread::Builder::new()
        .name("proxy-netns-bind".into())
        .spawn(move || {
            let ns = File::open(&path).map_err(|source| ListenerError::OpenNetns {
                path: path.clone(),
                source,
            })?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| ListenerError::EnterNetns {
                path: path.clone(),
                source,
            })?;
            // This thread now lives in the sandbox's namespace; it ends right after binding.
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|source| {
                ListenerError::Bind {
                    path: path.clone(),
                    port,
                    source,
                }
            })?;
            // A bind on a down `lo` succeeds, yet nothing inside could connect: prove the
            // sandbox's side of the door opens before handing the listener over.
            let addr = listener
                .local_addr()
                .map_err(|source| ListenerError::Bind {
                    path: path.clone(),
                    port,
                    source,
                })?;
            let unreachable = |source| ListenerError::Unreachable {
                path: path.clone(),
                port: addr.port(),
                source,
            };
            let probe =
                TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(unreachable)?;
            // The probe is in the backlog: take it out so the proxy never sees it.
            let (accepted, _) = listener.accept().map_err(unreachable)?;
            drop((probe, accepted));
            Ok(listener)
        })
        .map_err(ListenerError::Thread)?;
    worker.join().map_err(|_| {
        ListenerError::Thread(std::io::Error::other("namespace helper thread panicked"))
    })?
}

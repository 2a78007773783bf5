//! Bringing the loopback interface of a container's network namespace up.
//!
//! libcontainer leaves `lo` down in a new network namespace. The runtime
//! enters the namespace from a dedicated thread (setns on a network namespace
//! only affects the calling thread) and sets `IFF_UP` with `SIOCSIFFLAGS`.
//! Hand-written instead of pulling a netlink crate: it is one ioctl.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use nix::sched::{CloneFlags, setns};

/// Why `lo` could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error("cannot open network namespace {path}")]
    OpenNs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enter network namespace {path}")]
    Setns {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot open a socket in the container network namespace")]
    Socket(#[source] io::Error),
    #[error("cannot read the flags of lo")]
    GetFlags(#[source] io::Error),
    #[error("cannot set lo up")]
    SetFlags(#[source] io::Error),
    #[error("the network namespace thread panicked")]
    Thread,
}

/// Sets `lo` up in the network namespace of process `pid`.
pub fn bring_loopback_up_in(pid: i32) -> Result<(), LoopbackError> {
    let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
    let ns = File::open(&path).map_err(|source| LoopbackError::OpenNs {
        path: path.clone(),
        source,
    })?;
    std::thread::spawn(move || {
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| LoopbackError::Setns {
            path: path.clone(),
            source,
        })?;
        set_lo_up_here()
    })
    .join()
    .map_err(|_| LoopbackError::Thread)?
}

fn set_lo_up_here() -> Result<(), LoopbackError> {
    // SAFETY: socket(2) has no memory-safety preconditions; the result is
    // checked before it is wrapped.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(LoopbackError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a freshly created, valid descriptor owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };

    // SAFETY: ifreq is a plain C struct for which all-zero bytes are valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: SIOCGIFFLAGS reads/writes an ifreq that lives for the call and
    // whose name is NUL-terminated.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(LoopbackError::GetFlags(io::Error::last_os_error()));
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the active one.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let up = flags | libc::c_short::try_from(libc::IFF_UP).unwrap_or(1);
    req.ifr_ifru.ifru_flags = up;
    // SAFETY: as above; SIOCSIFFLAGS only reads the ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(LoopbackError::SetFlags(io::Error::last_os_error()));
    }
    Ok(())
}

//! `fs_denied` records: the kernel side of reading Landlock's denials.
//!
//! Landlock reports a refused access only to the kernel audit subsystem. The sandbox's
//! seccomp supervisor (one host process per sandbox, [`crate::sidecars::syscall_audit`]) subscribes
//! to the audit log's read-only multicast group (`AUDIT_NLGRP_READLOG`, which needs
//! CAP_AUDIT_READ in the initial user namespace and works beside auditd or without it),
//! keeps the records of its own sandbox's Landlock domains
//! ([`agent_sandbox_audit::kernel::LandlockTracker`]) and appends them, rate-limited, as
//! `fs_denied` records. Three conditions must hold, or the sandbox reports `fs_denied` as
//! inactive with the reason (`agent-sandbox layers ID`), never pretends:
//! - kernel audit is enabled (`auditctl -e 1` or `audit=1` at boot): with it off, Landlock
//!   writes no record at all; agent-sandbox never changes the system's audit settings;
//! - the supervisor may read the audit group (a rootless runtime may not);
//! - the kernel's Landlock ABI is 7 or newer: only from there can a domain ask for denials
//!   after `execve` to be logged (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`); by default the
//!   kernel logs only denials of the process that restricted itself, before its exec, which
//!   in a sandbox are none.

use std::os::fd::{AsFd, BorrowedFd};

use agent_sandbox_audit::kernel::{self, KernelRecord};
use netlink_packet_audit::{AuditMessage, StatusMessage};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_AUDIT};
use serde::{Deserialize, Serialize};

use crate::files::FileError;
use crate::state::SandboxDir;
use agent_sandbox_proxy::error_text::chain;

/// `AUDIT_NLGRP_READLOG`: the read-only multicast group of the audit log.
const NLGRP_READLOG: u32 = 1;

/// The first Landlock ABI with `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`.
pub const MIN_LANDLOCK_ABI: u32 = 7;

/// Errors of the kernel audit reader.
#[derive(Debug, thiserror::Error)]
pub enum FsAuditError {
    #[error("cannot open a NETLINK_AUDIT socket")]
    Socket(#[source] std::io::Error),
    #[error("cannot ask the kernel for its audit status")]
    Status(#[source] std::io::Error),
    #[error("the kernel's audit status reply is malformed")]
    StatusReply,
    #[error(
        "cannot subscribe to the kernel audit log (needs CAP_AUDIT_READ in the initial user namespace)"
    )]
    Subscribe(#[source] std::io::Error),
    #[error(transparent)]
    File(#[from] FileError),
}

/// Whether `fs_denied` reporting is in force for a sandbox, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsAuditStatus {
    pub active: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl FsAuditStatus {
    fn inactive(reason: impl Into<String>) -> Self {
        Self {
            active: false,
            reason: Some(reason.into()),
        }
    }

    /// Saves the verdict in the sandbox dir (the runtime, before it starts the supervisor).
    pub fn save(&self, sandbox_dir: &SandboxDir) -> Result<(), FsAuditError> {
        Ok(sandbox_dir.fs_audit().write(self)?)
    }

    /// The verdict the sandbox's supervisor saved; `None` when it has none (no supervisor,
    /// or one from an older runtime).
    pub fn load(sandbox_dir: &SandboxDir) -> Option<Self> {
        sandbox_dir.fs_audit().read().ok()
    }
}

/// The kernel's `audit_enabled` (0 off, 1 on, 2 on and locked), asked with `AUDIT_GET`
/// (needs CAP_AUDIT_CONTROL).
pub fn kernel_audit_enabled() -> Result<u32, FsAuditError> {
    let mut sock = Socket::new(NETLINK_AUDIT).map_err(FsAuditError::Socket)?;
    sock.bind_auto().map_err(FsAuditError::Socket)?;
    set_timeout(sock.as_fd(), std::time::Duration::from_secs(2)).map_err(FsAuditError::Socket)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    header.sequence_number = 1;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(AuditMessage::GetStatus(None)),
    );
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send_to(&buf, &SocketAddr::new(0, 0), 0)
        .map_err(FsAuditError::Status)?;
    // The kernel answers with an ACK and the status, in either order.
    for _ in 0..4 {
        let mut reply = Vec::with_capacity(8192);
        sock.recv(&mut reply, 0).map_err(FsAuditError::Status)?;
        match NetlinkMessage::<AuditMessage>::deserialize(&reply) {
            Ok(m) => match m.payload {
                NetlinkPayload::InnerMessage(AuditMessage::GetStatus(Some(StatusMessage {
                    enabled,
                    ..
                }))) => return Ok(enabled),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(FsAuditError::Status(e.to_io()));
                }
                _ => continue,
            },
            Err(_) => return Err(FsAuditError::StatusReply),
        }
    }
    Err(FsAuditError::StatusReply)
}

fn set_timeout(fd: BorrowedFd<'_>, t: std::time::Duration) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::ReceiveTimeout};
    use nix::sys::time::TimeValLike;
    let ms = i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
    setsockopt(
        &fd,
        ReceiveTimeout,
        &nix::sys::time::TimeVal::milliseconds(ms),
    )
    .map_err(Into::into)
}

/// A subscription to the kernel audit log's read-only multicast group.
pub struct KernelAudit {
    sock: Socket,
}

impl KernelAudit {
    /// Checks the conditions (see the module docs) and subscribes; `Err` carries the
    /// inactive verdict with its reason.
    pub fn open() -> Result<Self, FsAuditStatus> {
        let uid_map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
        if !initial_user_namespace(&uid_map) {
            return Err(FsAuditStatus::inactive(
                "the runtime runs in a user namespace (rootless): reading the kernel audit log needs CAP_AUDIT_READ in the initial user namespace",
            ));
        }
        match agent_sandbox_sys::landlock_abi() {
            Ok(abi) if abi >= MIN_LANDLOCK_ABI => {}
            Ok(abi) => {
                return Err(FsAuditStatus::inactive(format!(
                    "the kernel's Landlock ABI {abi} cannot log denials after exec (needs {MIN_LANDLOCK_ABI})"
                )));
            }
            Err(e) => {
                return Err(FsAuditStatus::inactive(format!(
                    "cannot read the kernel's Landlock ABI: {e}"
                )));
            }
        }
        match kernel_audit_enabled() {
            Ok(0) => {
                return Err(FsAuditStatus::inactive(
                    "kernel audit is disabled (audit_enabled=0), so Landlock reports no denial; enable it with `auditctl -e 1` or boot with audit=1",
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(FsAuditStatus::inactive(chain(&e))),
        }
        Self::subscribe().map_err(|e| FsAuditStatus::inactive(chain(&e)))
    }

    /// The subscribed socket, to hand to the supervisor process.
    pub fn into_fd(self) -> std::os::fd::OwnedFd {
        agent_sandbox_sys::inherit::owned_from(self.sock)
    }

    /// The subscription [`KernelAudit::into_fd`] handed over.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Self {
        Self {
            sock: agent_sandbox_sys::inherit::into_owner(fd),
        }
    }

    fn subscribe() -> Result<Self, FsAuditError> {
        let mut sock = Socket::new(NETLINK_AUDIT).map_err(FsAuditError::Socket)?;
        sock.bind(&SocketAddr::new(0, 1 << (NLGRP_READLOG - 1)))
            .map_err(FsAuditError::Subscribe)?;
        sock.set_non_blocking(true).map_err(FsAuditError::Socket)?;
        // A bigger buffer rides out bursts; past it the kernel drops for this reader only
        // (ENOBUFS), never blocks the audited process.
        let _ = sock.set_rx_buf_sz(1 << 20);
        Ok(Self { sock })
    }

    /// Reads up to `max` pending records without blocking; returns them and whether the
    /// kernel dropped records for this reader (its buffer overflowed) meanwhile.
    pub fn drain(&self, max: usize) -> (Vec<KernelRecord>, bool) {
        let mut out = Vec::new();
        let mut lost = false;
        for _ in 0..max {
            let mut buf = Vec::with_capacity(16 * 1024);
            match self.sock.recv(&mut buf, 0) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    lost = true;
                    continue;
                }
                Err(_) => break,
            }
            let Ok(msg) = NetlinkMessage::<AuditMessage>::deserialize(&buf) else {
                continue;
            };
            let (kind, text) = match msg.payload {
                NetlinkPayload::InnerMessage(
                    AuditMessage::Event((kind, text)) | AuditMessage::Other((kind, text)),
                ) => (kind, text),
                _ => continue,
            };
            // Only the record kinds the tracker joins are parsed.
            if ![
                kernel::AUDIT_SYSCALL,
                kernel::AUDIT_EOE,
                kernel::AUDIT_LANDLOCK_ACCESS,
                kernel::AUDIT_LANDLOCK_DOMAIN,
            ]
            .contains(&kind)
            {
                continue;
            }
            if let Ok(r) = kernel::parse(kind, text.trim_end_matches('\0')) {
                out.push(r);
            }
        }
        (out, lost)
    }
}

impl AsFd for KernelAudit {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// `LANDLOCK_ACCESS_NET_CONNECT_TCP`: the one right the fence's ruleset handles.
const NET_CONNECT_TCP: u64 = 1 << 1;

/// The port the fence's probe connects to (any: its ruleset grants none).
const FENCE_PORT: u16 = 1;

/// Waits, at most `limit`, until the sandbox's supervisor has read every kernel audit
/// record made before this call, and written the `fs_denied` records among them: the
/// writer of an `exit` record calls it first, so that the denials of a process that has
/// ended come before its exit in the log.
///
/// The kernel hands its audit records to readers in the order they were made (one queue,
/// one thread). So a record made now is a fence: once the supervisor has read it, it has
/// read all before. The record is the supervisor's own handshake, a Landlock probe
/// ([`agent_sandbox_audit::kernel`]): a thread of this process restricts itself with a
/// ruleset that refuses every TCP connect, makes one, and announces it over the
/// supervisor's socket as any probed process does; the supervisor answers with one byte
/// once the probe's record came, after it wrote what the records before it completed.
/// The handover's listener is the read end of a pipe already closed at the other end,
/// which the supervisor drops at once. Nothing to wait for when `fs_denied` is inactive;
/// a supervisor that is gone or does not answer in time costs only the order.
pub fn fence(sandbox_dir: &SandboxDir, limit: std::time::Duration) {
    if !FsAuditStatus::load(sandbox_dir).is_some_and(|s| s.active) {
        return;
    }
    if let Err(e) = try_fence(sandbox_dir, limit) {
        tracing::debug!(error = %e, "no kernel audit fence before the exit record");
    }
}

fn try_fence(sandbox_dir: &SandboxDir, limit: std::time::Duration) -> std::io::Result<()> {
    use agent_sandbox_sys::seccomp_notify::{self, Handover};
    use std::io::Read;
    let stream = crate::sidecars::syscall_audit::connect(sandbox_dir)
        .map(std::os::unix::net::UnixStream::from)
        .map_err(std::io::Error::other)?;
    let (dead, writer) = std::io::pipe()?;
    drop(writer);
    seccomp_notify::send_fd(
        stream.as_fd(),
        dead.as_fd(),
        Handover::Probed { port: FENCE_PORT },
    )?;
    // Landlock restricts the calling thread only: the probe runs in one of its own.
    std::thread::scope(|s| s.spawn(probe).join())
        .map_err(|_| std::io::Error::other("the fence's probe thread panicked"))??;
    stream.set_read_timeout(Some(limit))?;
    (&stream).read_exact(&mut [0u8; 1])
}

/// Restricts the calling thread so that every TCP connect is refused, and makes one: its
/// audit record is the fence.
fn probe() -> std::io::Result<()> {
    use agent_sandbox_sys::landlock_ruleset::RawRuleset;
    nix::sys::prctl::set_no_new_privs().map_err(std::io::Error::from)?;
    RawRuleset::create(0, NET_CONNECT_TCP)?.restrict_self(0)?;
    match std::net::TcpStream::connect((agent_sandbox_audit::kernel::PROBE_ADDR, FENCE_PORT)) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
        other => Err(std::io::Error::other(format!(
            "the fence's probe was not refused by Landlock ({other:?})"
        ))),
    }
}

/// Whether a `/proc/self/uid_map` is the initial user namespace's (the identity map of
/// every id).
fn initial_user_namespace(uid_map: &str) -> bool {
    uid_map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test runs as root in the initial namespaces (as the e2e suites do): the status
    /// query must work whatever the setting is.
    #[test]
    fn the_kernel_answers_the_audit_status_query() {
        let enabled = kernel_audit_enabled().unwrap();
        assert!(enabled <= 2, "{enabled}");
    }

    #[test]
    fn only_the_initial_user_namespace_may_read_the_audit_log() {
        assert!(initial_user_namespace("         0          0 4294967295\n"));
        assert!(!initial_user_namespace(
            "         0       1500          1\n         1     100000      65536\n"
        ));
        assert!(!initial_user_namespace(""));
    }

    #[test]
    fn a_status_round_trips_through_the_sandbox_dir() {
        let root = tempfile::tempdir().unwrap();
        let dir = crate::state::StateDirs::new(root.path().to_owned())
            .sandbox(&crate::state::ContainerId::try_from("fa1").unwrap());
        std::fs::create_dir_all(dir.path()).unwrap();
        assert_eq!(FsAuditStatus::load(&dir), None);
        let s = FsAuditStatus::inactive("kernel audit is disabled");
        s.save(&dir).unwrap();
        assert_eq!(FsAuditStatus::load(&dir), Some(s));
    }
}

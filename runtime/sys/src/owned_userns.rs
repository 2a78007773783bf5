//! A user namespace owned by a host id of the caller's choosing, with its per-user limits
//! written before anything else runs in it.
//!
//! The kernel charges every per-user count (inotify instances and watches, fanotify groups
//! and marks, namespaces, and the rlimit-style counts: processes, message queue bytes,
//! pending signals, locked memory) to the (namespace, user) that made the object and then to
//! each ancestor level as (parent namespace, *owner* of the namespace), the owner being the
//! euid of the process that created it (`kernel/ucount.c`, `kernel/user_namespace.c`). A
//! namespace that host root creates charges everything inside it to host root's budget. So
//! a forked *creator* takes the owner's ids, then `unshare(CLONE_NEWUSER)`s: the namespace's
//! owner is that id. Still in the fork, it has every capability in the new namespace, so it
//! writes the namespace's own `/proc/sys/user/max_*` limits (the kernel shows each process
//! the table of its current user namespace). It reports, then waits until the caller has
//! written the id maps and pinned the namespace, and exits when the caller lets it go.
//!
//! The creator keeps its capabilities across the id change (`SECBIT_NO_SETUID_FIXUP`) so
//! that hosts that restrict user namespace creation to privileged processes
//! (`kernel.unprivileged_userns_clone = 0`, Ubuntu's AppArmor restriction) still let it.
//! Between fork and `_exit` the child only makes async-signal-safe system calls on memory
//! prepared before the fork (see `background_write` for why no thread and no allocation).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};

/// Why the owned user namespace could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OwnedUsernsError {
    #[error("cannot make the pipes to the user namespace's creator")]
    Pipe(#[source] nix::Error),
    #[error("cannot fork the user namespace's creator")]
    Fork(#[source] nix::Error),
    #[error("limit file name {path:?} has a NUL byte")]
    BadPath { path: String },
    #[error("the user namespace's creator cannot {step}")]
    Step {
        step: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the user namespace's creator ended before it reported")]
    Vanished,
}

/// One limit the creator writes inside the new namespace: `value` into `path`.
#[derive(Debug, Clone)]
pub struct NsLimit {
    path: CString,
    value: Vec<u8>,
}

impl NsLimit {
    /// `path` is a file under `/proc/sys/user/`; `value` its new content.
    pub fn new(path: &str, value: u64) -> Result<Self, OwnedUsernsError> {
        let path = CString::new(path).map_err(|_| OwnedUsernsError::BadPath {
            path: path.to_owned(),
        })?;
        Ok(Self {
            path,
            value: format!("{value}\n").into_bytes(),
        })
    }

    fn path_lossy(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }
}

/// The creator, stopped in its new namespace until [`Creator::finish`] lets it exit (or it is
/// dropped: then it is killed and reaped).
#[derive(Debug)]
pub struct Creator {
    pid: Pid,
    go: Option<OwnedFd>,
    /// Bit `i` is set when limit `i` was written; clear when the kernel has no such file.
    written: u64,
}

/// What the creator reports: the step it failed (0: none), its errno, the limits written.
const REPORT_LEN: usize = 16;
const STEP_OK: u32 = 0;
const STEP_SETGROUPS: u32 = 1;
const STEP_SETRESGID: u32 = 2;
const STEP_SETRESUID: u32 = 3;
const STEP_UNSHARE: u32 = 4;
/// Limit `i` failed: step `STEP_LIMIT + i`.
const STEP_LIMIT: u32 = 5;
/// At most this many limits (one bit each in the report).
pub const MAX_LIMITS: usize = 64;

/// Forks a creator that takes uid `uid` and gid `gid` (all three of each, no supplementary
/// groups), makes a new user namespace (owned by `uid`) and writes `limits` in it; returns
/// once it has, with the creator waiting in the namespace. A limit file the kernel does not
/// have is skipped ([`Creator::written`]); any other failure is an error naming the step.
pub fn spawn(uid: u32, gid: u32, limits: &[NsLimit]) -> Result<Creator, OwnedUsernsError> {
    if limits.len() > MAX_LIMITS {
        return Err(OwnedUsernsError::Step {
            step: format!("write {} limits (at most {MAX_LIMITS})", limits.len()),
            source: std::io::Error::from_raw_os_error(libc::E2BIG),
        });
    }
    let (ready_read, ready_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(OwnedUsernsError::Pipe)?;
    let (go_read, go_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(OwnedUsernsError::Pipe)?;
    // SAFETY: between fork and _exit the child calls only async-signal-safe system calls
    // (prctl, setgroups, setresgid, setresuid, unshare, open, write, close, read, _exit) on
    // memory prepared before the fork (`limits`, stack buffers) and descriptors the fork
    // copied; it never returns into the parent's Rust code and allocates nothing, so no lock
    // held by another thread of the parent is touched.
    match unsafe { nix::unistd::fork() }.map_err(OwnedUsernsError::Fork)? {
        ForkResult::Child => {
            // The parent's ends: with its own copy of the writer open, the child would never
            // see the end of `go`.
            drop(ready_read);
            drop(go_write);
            let report = ready_write.as_raw_fd();
            let go = go_read.as_raw_fd();
            // SAFETY: see above; every pointer passed is valid for the call's length.
            unsafe { creator(uid, gid, limits, report, go) }
        }
        ForkResult::Parent { child } => {
            drop(ready_write);
            drop(go_read);
            let mut creator = Creator {
                pid: child,
                go: Some(go_write),
                written: 0,
            };
            let mut buf = [0u8; REPORT_LEN];
            let mut got = 0;
            let mut file = std::fs::File::from(ready_read);
            while got < REPORT_LEN {
                match std::io::Read::read(&mut file, &mut buf[got..]) {
                    Ok(0) => return Err(OwnedUsernsError::Vanished),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return Err(OwnedUsernsError::Vanished),
                }
            }
            let word = |at: usize| {
                let mut w = [0u8; 4];
                w.copy_from_slice(&buf[at..at + 4]);
                w
            };
            let step = u32::from_ne_bytes(word(0));
            let errno = i32::from_ne_bytes(word(4));
            let mut mask = [0u8; 8];
            mask.copy_from_slice(&buf[8..16]);
            if step != STEP_OK {
                let step = match step {
                    STEP_SETGROUPS => "drop its supplementary groups".to_owned(),
                    STEP_SETRESGID => format!("take gid {gid}"),
                    STEP_SETRESUID => format!("take uid {uid}"),
                    STEP_UNSHARE => format!("make a user namespace as uid {uid}"),
                    n => {
                        let i = usize::try_from(n - STEP_LIMIT).unwrap_or(usize::MAX);
                        let path = limits.get(i).map(NsLimit::path_lossy).unwrap_or_default();
                        format!("write {path} in its user namespace")
                    }
                };
                return Err(OwnedUsernsError::Step {
                    step,
                    source: std::io::Error::from_raw_os_error(errno),
                });
            }
            creator.written = u64::from_ne_bytes(mask);
            Ok(creator)
        }
    }
}

/// The child's whole life. Never returns.
///
/// # Safety
/// Only to be called in the child of a fork, with `report` and `go` open.
unsafe fn creator(uid: u32, gid: u32, limits: &[NsLimit], report: i32, go: i32) -> ! {
    let send = |step: u32, errno: i32, mask: u64| {
        let mut buf = [0u8; REPORT_LEN];
        buf[0..4].copy_from_slice(&step.to_ne_bytes());
        buf[4..8].copy_from_slice(&errno.to_ne_bytes());
        buf[8..16].copy_from_slice(&mask.to_ne_bytes());
        // SAFETY: `buf` is valid for its length; write(2) is async-signal-safe.
        unsafe {
            libc::write(report, buf.as_ptr().cast(), buf.len());
        }
    };
    let fail = |step: u32| -> ! {
        let errno = nix::errno::Errno::last_raw();
        send(step, errno, 0);
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(1) }
    };
    // SAFETY: plain system calls on integers and null or valid pointers.
    unsafe {
        // Best effort: keep the capabilities across the id change (see the module docs); a
        // host where this fails may still allow the unprivileged creation below.
        let bits = libc::c_ulong::try_from(libc::SECBIT_NO_SETUID_FIXUP).unwrap_or(0);
        libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0);
        if libc::setgroups(0, std::ptr::null()) != 0 {
            fail(STEP_SETGROUPS);
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            fail(STEP_SETRESGID);
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            fail(STEP_SETRESUID);
        }
        if libc::unshare(libc::CLONE_NEWUSER) != 0 {
            fail(STEP_UNSHARE);
        }
    }
    let mut mask: u64 = 0;
    for (i, limit) in limits.iter().enumerate() {
        let step = STEP_LIMIT + u32::try_from(i).unwrap_or(u32::MAX - STEP_LIMIT);
        // SAFETY: `limit.path` is NUL-terminated and `limit.value` valid for its length.
        unsafe {
            let fd = libc::open(limit.path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                if nix::errno::Errno::last_raw() == libc::ENOENT {
                    continue;
                }
                fail(step);
            }
            let n = libc::write(fd, limit.value.as_ptr().cast(), limit.value.len());
            let errno = nix::errno::Errno::last_raw();
            libc::close(fd);
            if usize::try_from(n).ok() != Some(limit.value.len()) {
                send(step, if n < 0 { errno } else { libc::EIO }, 0);
                libc::_exit(1);
            }
        }
        mask |= 1 << i;
    }
    send(STEP_OK, 0, mask);
    let mut byte = 0u8;
    loop {
        // SAFETY: one byte into a stack variable; read(2) is async-signal-safe.
        let n = unsafe { libc::read(go, (&raw mut byte).cast(), 1) };
        if n == 0 || (n < 0 && nix::errno::Errno::last_raw() != libc::EINTR) {
            break;
        }
    }
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(0) }
}

/// The host uid that owns the user namespace at `path` (`/proc/PID/ns/user`, a pin), as the
/// kernel reports it (`NS_GET_OWNER_UID`), in the caller's user namespace.
pub fn owner_uid(path: &std::path::Path) -> std::io::Result<u32> {
    /// `_IO(NSIO, 0x4)`, `NSIO` being 0xb7 (`include/uapi/linux/nsfs.h`).
    const NS_GET_OWNER_UID: libc::c_ulong = (0xb7 << 8) | 0x4;
    let file = std::fs::File::open(path)?;
    let mut uid: libc::uid_t = 0;
    // SAFETY: NS_GET_OWNER_UID writes one uid_t through the pointer, which is valid and
    // aligned for it; the descriptor is open for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_OWNER_UID, &raw mut uid) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(uid)
}

impl Creator {
    /// The creator's pid: `/proc/PID/uid_map`, `gid_map` and `ns/user` are its namespace's.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Whether limit `i` of [`spawn`]'s list was written (the kernel has its file).
    pub fn written(&self, i: usize) -> bool {
        i < MAX_LIMITS && self.written & (1 << i) != 0
    }

    /// Lets the creator exit and reaps it. The namespace lives on only while something holds
    /// it (a bind mount of `/proc/PID/ns/user`, a process in it).
    pub fn finish(mut self) {
        self.go = None;
        let _ = waitpid(self.pid, None);
        self.pid = Pid::from_raw(0);
    }
}

impl Drop for Creator {
    fn drop(&mut self) {
        if self.pid.as_raw() > 0 {
            let _ = kill(self.pid, Signal::SIGKILL);
            self.go = None;
            let _ = waitpid(self.pid, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_uid(pid: i32) -> String {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .to_owned()
    }

    /// Needs real root, as the runtime is; the suites run as root.
    #[test]
    fn the_namespace_is_owned_by_the_given_id_and_has_the_limits() {
        let limits = [
            NsLimit::new("/proc/sys/user/max_inotify_instances", 7).unwrap(),
            NsLimit::new("/proc/sys/user/max_no_such_count", 1).unwrap(),
        ];
        let creator = spawn(3_900_000, 3_900_000, &limits).unwrap();
        let pid = creator.pid();
        assert!(status_uid(pid).contains("3900000"), "{}", status_uid(pid));
        assert!(creator.written(0));
        assert_eq!(
            owner_uid(std::path::Path::new(&format!("/proc/{pid}/ns/user"))).unwrap(),
            3_900_000
        );
        assert!(!creator.written(1), "a file the kernel lacks is skipped");
        std::fs::write(format!("/proc/{pid}/uid_map"), "0 3900000 1\n").unwrap();
        std::fs::write(format!("/proc/{pid}/gid_map"), "0 3900000 1\n").unwrap();
        // Read as a process of that namespace sees it.
        let ns = format!("/proc/{pid}/ns/user");
        let out = std::process::Command::new("nsenter")
            .args([
                format!("--user={ns}").as_str(),
                "cat",
                "/proc/sys/user/max_inotify_instances",
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "7", "{out:?}");
        creator.finish();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn a_failed_step_is_an_error_naming_it() {
        let limits = [NsLimit::new("/proc/sys/user/max_inotify_instances", 1 << 40).unwrap()];
        let err = spawn(3_900_001, 3_900_001, &limits).unwrap_err();
        assert!(
            err.to_string()
                .contains("write /proc/sys/user/max_inotify_instances"),
            "{err}"
        );
    }
}

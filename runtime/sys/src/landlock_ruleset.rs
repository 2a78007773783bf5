//! A Landlock ruleset made and enforced with the raw system calls (`<linux/landlock.h>`).
//!
//! The `landlock` crate knows ABIs up to 9; the UDP rights of ABI 10 (Linux 7.2) have no
//! flag there, so the runtime passes the kernel's bits itself. The caller builds the rights
//! for the kernel's ABI (a right the kernel does not know is `EINVAL`), so a ruleset made
//! here is enforced in full or not at all.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: libc::c_uint = 1;
/// `LANDLOCK_RULE_NET_PORT`.
const RULE_NET_PORT: libc::c_uint = 2;
/// `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (ABI 7).
pub const RESTRICT_SELF_LOG_NEW_EXEC_ON: u32 = 1 << 1;

/// `struct landlock_ruleset_attr` up to `scoped` (ABI 6); a kernel that knows fewer fields
/// accepts the longer struct when the fields it does not know are zero.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct landlock_net_port_attr`.
#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A created ruleset, not enforced yet.
pub struct RawRuleset {
    fd: OwnedFd,
}

impl RawRuleset {
    /// `landlock_create_ruleset` handling these filesystem and network rights (the kernel's
    /// bits; `net` 0 when the kernel has no network rights).
    pub fn create(fs: u64, net: u64) -> io::Result<RawRuleset> {
        let attr = RulesetAttr {
            handled_access_fs: fs,
            handled_access_net: net,
            scoped: 0,
        };
        // SAFETY: the kernel reads `size_of::<RulesetAttr>()` bytes from `&attr`, a live,
        // initialised repr(C) value of that size; it returns a new descriptor or -1.
        let fd = check(unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &raw const attr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        })?;
        let fd = i32::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(RawRuleset { fd })
    }

    /// Grants `access` beneath the file or directory `parent` (opened `O_PATH`).
    pub fn add_path(&self, parent: &impl AsFd, access: u64) -> io::Result<()> {
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: parent.as_fd().as_raw_fd(),
        };
        // SAFETY: the kernel reads the packed attribute from `&attr`, live for the call;
        // both descriptors stay open until it returns.
        check(unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &raw const attr,
                0u32,
            )
        })?;
        Ok(())
    }

    /// Grants `access` for `port`.
    pub fn add_port(&self, port: u16, access: u64) -> io::Result<()> {
        let attr = NetPortAttr {
            allowed_access: access,
            port: u64::from(port),
        };
        // SAFETY: as in `add_path`: the kernel reads `attr`, live for the call.
        check(unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_NET_PORT,
                &raw const attr,
                0u32,
            )
        })?;
        Ok(())
    }

    /// Sets `no_new_privs` (Landlock requires it of a process without `CAP_SYS_ADMIN`) and
    /// enforces the ruleset on the calling thread with `flags`
    /// (`LANDLOCK_RESTRICT_SELF_*`).
    pub fn restrict_self(self, flags: u32) -> io::Result<()> {
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers; the variadic
        // arguments are passed as the unsigned longs the kernel reads.
        let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, on, unused, unused, unused) };
        check(nnp.into())?;
        // SAFETY: landlock_restrict_self takes a descriptor and flags, no pointers.
        check(unsafe {
            libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), flags)
        })?;
        Ok(())
    }
}

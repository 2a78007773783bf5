//! Seccomp: the syscall allowlist (with a reason for every entry) compiled to BPF with
//! seccompiler and emitted as OCI seccomp JSON.
//!
//! # Shape
//!
//! The filter is **default-deny**: the data is the allowlist in [`allowlist`], where every
//! allowed syscall and every argument check carries a one-line reason (Firecracker's
//! `"comment"` style). A profile's `[syscalls]` table ([`SyscallPolicy`]) can only narrow it:
//! pick the errno of a denial, pick `level = "strict"` (drops [`allowlist::STRICT_DROPS`]),
//! and remove more syscalls with `deny`. Two compilers read the same table:
//!
//! - [`compile_bpf`] builds a classic BPF program for x86_64 or aarch64 with `seccompiler`'s
//!   backend, ready for `seccompiler::apply_filter`;
//! - [`oci_seccomp`] / [`oci_seccomp_json`] emit the same rules as the OCI
//!   `linux.seccomp` object, which runc, crun and podman
//!   (`--security-opt seccomp=FILE`) accept.
//!
//! # Why these choices
//!
//! - **EPERM by default.** A denied call fails with "Operation not permitted", which tells a
//!   person (and an agent reading stderr) that the sandbox refused it. Docker denies with EPERM
//!   too; podman uses ENOSYS. ENOSYS has one real advantage: libc treats it as "this kernel is
//!   too old" and falls back to an older syscall. We keep that advantage where it matters,
//!   without lying about the calls we refuse on purpose:
//!   - **syscalls newer than the table we reviewed** (numbers above [`allowlist::REVIEWED_THROUGH`])
//!     get ENOSYS, so a future glibc that probes a new syscall and falls back on ENOSYS keeps
//!     working (Docker's profile once broke glibc 2.33 images this way with `faccessat2`; runc
//!     now adds the same ENOSYS rule to every filter it loads);
//!   - **`clone3` gets ENOSYS.** Its flags live in a `struct clone_args` in memory, which a
//!     seccomp filter cannot read, so namespace flags cannot be filtered there. Denying it with
//!     ENOSYS makes glibc (≥ 2.34) and musl fall back to `clone`, whose flags *are* a register
//!     argument that the filter checks. EPERM would make `pthread_create` and `fork` fail
//!     instead. Docker and podman make the same choice.
//! - **Arguments are compared at the width the kernel reads them.** `ioctl`'s request,
//!   `socket`'s domain and protocol and `personality`'s persona are `unsigned int`/`int` in the
//!   kernel, which ignores the upper 32 bits of the register. A 64-bit comparison could be
//!   bypassed by setting those bits (`TIOCSTI | 1 << 32` still *is* TIOCSTI to the kernel), so
//!   those checks compare only the low 32 bits; `clone`'s flags are a full `unsigned long`.
//! - **Foreign syscall ABIs are refused.** The BPF program kills the process if the audit
//!   architecture is not the one it was built for (i386 `int 0x80` on x86_64, arm32 on
//!   aarch64), so the 32-bit syscall table cannot be used to slip past the 64-bit rules. x32
//!   calls (numbers with bit 30 set) lie above every reviewed number and get ENOSYS.
//! - **Personality**: only values that do not weaken the address space are allowed: `0`
//!   (`PER_LINUX`), `PER_LINUX32` (`setarch linux32` for 32-bit builds), `UNAME26` and
//!   `PER_LINUX32|UNAME26` (old build systems that parse `uname -r`), and `0xffffffff` (query
//!   without change). `ADDR_NO_RANDOMIZE` (no ASLR), `READ_IMPLIES_EXEC` (every mapping
//!   executable) and the other flags are denied: they only help exploits.
//! - **Sockets**: `AF_UNIX`, `AF_INET`, `AF_INET6`, and `AF_NETLINK` with protocol 0
//!   (`NETLINK_ROUTE`, which glibc's `getaddrinfo`/`getifaddrs` need) are allowed; everything
//!   else (`AF_VSOCK`, `AF_ALG`, `AF_PACKET`, `AF_KEY`, other netlink families, ...) is denied.
//!   `socketpair` is allowed for `AF_UNIX` only.
//! - **ioctl**: allowed except `TIOCSTI` (push input into a terminal: a sandboxed process
//!   could type commands into the user's shell) and `TIOCLINUX` (the same through the Linux
//!   console's paste buffer).
//!
//! # Applying the BPF
//!
//! The runtime loads [`compile_bpf`]'s program with `seccompiler::apply_filter` (which sets
//! `PR_SET_NO_NEW_PRIVS` first) as the last step before `execve`, in the container's init
//! *and* in every exec'd process: the filter denies `mount`, `pivot_root`, `setns`, `unshare`
//! and namespace `clone`s, so all privileged set-up must be finished by then. A process that
//! already runs several threads needs `apply_filter_all_threads` (TSYNC) instead.
//!
//! # Example
//!
//! ```
//! use agent_sandbox_policy::seccomp::{
//!     compile_bpf, oci_seccomp_json, Arch, DenyErrno, SyscallName, SyscallPolicy,
//! };
//!
//! let policy = SyscallPolicy {
//!     errno: DenyErrno::Eperm,
//!     deny: vec![SyscallName::try_from("memfd_create").unwrap()],
//!     ..SyscallPolicy::default()
//! };
//! let program = compile_bpf(&policy, Arch::X86_64).unwrap();
//! assert!(!program.is_empty());
//! let json = oci_seccomp_json(&policy).unwrap();
//! assert!(json.contains("SCMP_ACT_ERRNO"));
//! ```

pub mod allowlist;
mod bpf;
mod oci;
mod request;

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use bpf::{allowed_names, compile_bpf};
pub use oci::{oci_seccomp, oci_seccomp_json};
pub use request::{RequestError, compile_request};

/// Errors of the seccomp compilers.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A name in `syscalls.deny` is not a Linux syscall on any supported architecture.
    #[error("unknown syscall `{name}` in syscalls.deny")]
    UnknownSyscall {
        /// The name as written.
        name: String,
    },
    /// A name appears twice in `syscalls.deny`.
    #[error("syscall `{name}` is listed twice in syscalls.deny")]
    DuplicateDeny {
        /// The repeated name.
        name: String,
    },
    /// The built-in table names a syscall that the architecture's table lacks.
    #[error("allowlist names `{name}`, which {arch} does not have")]
    NotOnArch {
        /// The syscall name.
        name: &'static str,
        /// The architecture compiled for.
        arch: Arch,
    },
    /// The hand-written BPF prologue would not fit a jump offset (too many overrides).
    #[error("the seccomp prologue is too long for a BPF jump")]
    PrologueTooLong,
    /// seccompiler rejected the filter.
    #[error("cannot compile the seccomp filter for {arch}")]
    Compile {
        /// The architecture compiled for.
        arch: Arch,
        /// seccompiler's reason.
        #[source]
        source: seccompiler::BackendError,
    },
    /// oci-spec rejected a built object.
    #[error("cannot build the OCI seccomp object")]
    Oci {
        /// oci-spec's reason.
        #[source]
        source: oci_spec::OciSpecError,
    },
    /// The OCI seccomp object could not be serialized.
    #[error("cannot serialize the OCI seccomp object")]
    Json {
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
}

/// The `[syscalls]` table of a policy: narrows the built-in allowlist, never widens it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallPolicy {
    /// The errno a denied syscall returns (default `EPERM`).
    #[serde(default)]
    pub errno: DenyErrno,
    /// `standard` (default) or `strict`, which also drops the calls in
    /// [`allowlist::STRICT_DROPS`] (IPC, libaio, NUMA, memory locking and other facilities
    /// that agent tools do not need).
    #[serde(default)]
    pub level: Level,
    /// Syscalls to remove from the allowlist entirely (narrowing only). Naming a syscall that
    /// is already denied is allowed and changes nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<SyscallName>,
}

impl SyscallPolicy {
    /// Checks what serde cannot: no name is listed twice in `deny`.
    pub fn validate(&self) -> Result<(), SeccompError> {
        let mut seen = BTreeSet::new();
        for name in &self.deny {
            if !seen.insert(name.as_str()) {
                return Err(SeccompError::DuplicateDeny {
                    name: name.as_str().to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Whether `name` is removed by this policy's `deny` list or level.
    pub fn denies(&self, name: &str) -> bool {
        self.deny.iter().any(|d| d.as_str() == name)
            || (self.level == Level::Strict
                && allowlist::STRICT_DROPS.iter().any(|drop| drop.name == name))
    }

    /// The allowlist entries that stay allowed under this policy, in table order.
    pub fn allowed(&self) -> impl Iterator<Item = &'static allowlist::Allowed> + '_ {
        allowlist::ALLOWLIST
            .iter()
            .filter(move |entry| !self.denies(entry.name))
    }
}

/// How much of the allowlist a profile keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The whole allowlist: what a normal Linux userland needs.
    #[default]
    Standard,
    /// The allowlist without [`allowlist::STRICT_DROPS`].
    Strict,
}

/// The errno a denied syscall returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DenyErrno {
    /// "Operation not permitted": says plainly that the sandbox refused the call.
    #[default]
    #[serde(rename = "EPERM")]
    Eperm,
    /// "Permission denied", for tools that only handle EACCES gracefully.
    #[serde(rename = "EACCES")]
    Eacces,
    /// "Function not implemented": libc falls back to older syscalls (podman's default).
    #[serde(rename = "ENOSYS")]
    Enosys,
}

impl DenyErrno {
    /// The errno number (identical on x86_64 and aarch64).
    pub const fn number(self) -> u32 {
        match self {
            DenyErrno::Eperm => 1,
            DenyErrno::Eacces => 13,
            DenyErrno::Enosys => ENOSYS,
        }
    }
}

/// ENOSYS on x86_64 and aarch64 (asm-generic/errno.h).
pub const ENOSYS: u32 = 38;

/// A syscall name known on at least one supported architecture (validated on parse).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SyscallName(String);

impl SyscallName {
    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SyscallName {
    type Error = SeccompError;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        if Arch::ALL
            .iter()
            .any(|arch| arch.syscall_number(&name).is_some())
        {
            Ok(SyscallName(name))
        } else {
            Err(SeccompError::UnknownSyscall { name })
        }
    }
}

impl TryFrom<&str> for SyscallName {
    type Error = SeccompError;

    fn try_from(name: &str) -> Result<Self, Self::Error> {
        SyscallName::try_from(name.to_owned())
    }
}

impl From<SyscallName> for String {
    fn from(name: SyscallName) -> String {
        name.0
    }
}

impl fmt::Display for SyscallName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An architecture the filter is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// x86-64 (AUDIT_ARCH_X86_64).
    #[serde(rename = "x86_64")]
    X86_64,
    /// AArch64 (AUDIT_ARCH_AARCH64).
    #[serde(rename = "aarch64")]
    Aarch64,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture this binary was built for, if supported.
    pub const fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// The name used in file names and messages (`x86_64`, `aarch64`).
    pub const fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The syscall number of `name` on this architecture, from the `syscalls` crate's
    /// per-architecture tables (generated from the kernel's own syscall tables).
    pub fn syscall_number(self, name: &str) -> Option<i64> {
        match self {
            Arch::X86_64 => name
                .parse::<syscalls::x86_64::Sysno>()
                .ok()
                .map(|s| i64::from(s.id())),
            Arch::Aarch64 => {
                // The kernel (asm-generic/unistd.h) and libseccomp call syscall 79 on 64-bit
                // generic architectures `newfstatat`; the `syscalls` crate names it `fstatat`.
                // Accept only the kernel's spelling so one name means one syscall everywhere.
                let table_name = match name {
                    "newfstatat" => "fstatat",
                    "fstatat" => return None,
                    other => other,
                };
                table_name
                    .parse::<syscalls::aarch64::Sysno>()
                    .ok()
                    .map(|s| i64::from(s.id()))
            }
        }
    }

    /// Whether `nr` is a syscall of this architecture.
    pub(crate) fn has_number(self, nr: i64) -> bool {
        let Ok(nr) = usize::try_from(nr) else {
            return false;
        };
        match self {
            Arch::X86_64 => syscalls::x86_64::Sysno::new(nr).is_some(),
            Arch::Aarch64 => syscalls::aarch64::Sysno::new(nr).is_some(),
        }
    }

    pub(crate) const fn target(self) -> seccompiler::TargetArch {
        match self {
            Arch::X86_64 => seccompiler::TargetArch::x86_64,
            Arch::Aarch64 => seccompiler::TargetArch::aarch64,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;

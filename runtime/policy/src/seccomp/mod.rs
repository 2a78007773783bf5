//! Seccomp: the syscall allowlist (with a reason for every entry) compiled to BPF with
//! seccompiler and emitted as OCI seccomp JSON.

use serde::{Deserialize, Serialize};

/// The `[syscalls]` table of a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallPolicy {}

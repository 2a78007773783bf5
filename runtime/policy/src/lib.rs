//! The agent-sandbox policy: one typed description of a sandbox and the pure
//! functions that compile it to an OCI spec patch, a seccomp filter, an AppArmor
//! profile and Landlock rules. No I/O and no syscalls live here.
#![forbid(unsafe_code)]

pub mod seccomp;

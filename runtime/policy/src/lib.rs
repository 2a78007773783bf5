//! The agent-sandbox policy: one typed description of a sandbox and the pure
//! functions that compile it to a hardened OCI spec, a seccomp filter, an AppArmor
//! profile and Landlock rules. No I/O and no syscalls live here.
//!
//! Start at [`SandboxPolicy`] (`SandboxPolicy::builtin("agent")` or
//! `SandboxPolicy::parse(text, path)`), then [`harden::harden_spec`] for the OCI spec,
//! [`landlock::ruleset`], [`apparmor::profile`], [`seccomp`] and [`explain::explain`].
#![forbid(unsafe_code)]

pub mod apparmor;
pub mod explain;
pub mod generated;
pub mod harden;
pub mod landlock;
pub mod layers;
pub mod narrow;
pub mod network;
pub mod policy;
pub mod seccomp;
mod span;
pub mod value;

pub use layers::{Layer, Layers};
pub use policy::{PolicyError, SandboxPolicy, Violation, builtin_names};

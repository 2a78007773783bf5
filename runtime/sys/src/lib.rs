//! The single `unsafe` boundary of agent-sandbox. Every `unsafe` block names the
//! invariant it relies on in a `// SAFETY:` comment.
#![allow(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod atomic_file;
pub mod background_write;
pub mod cgroupns;
pub mod exec_signals;
pub mod guard_mounts;
pub mod idmap_mount;
pub mod inherit;
pub mod landlock_abi;
pub mod landlock_ruleset;
pub mod loopback;
pub mod owned_userns;
pub mod pidfd_exit;
pub mod reaper;
pub mod reseal;
pub mod seccomp_notify;
pub mod selfexec;

pub use landlock_abi::landlock_abi;
pub use loopback::{LoopbackError, bring_loopback_up_in};
pub use selfexec::{SelfExecError, reexec_from_sealed_copy};

#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod apparmor;
pub mod approvals;
pub mod carried;
pub mod explain;
pub mod generated;
pub mod harden;
pub mod landlock;
pub mod layers;
pub mod narrow;
pub mod network;
pub mod plan;
pub mod policy;
pub mod profiles;
pub mod reference;
pub mod seccomp;
mod span;
pub mod ucounts;
pub mod value;

pub use layers::{Layer, Layers};
pub use plan::{CompileError, Compiled, SandboxPlan, compile, compile_under};
pub use policy::{PolicyError, SandboxPolicy, Violation, builtin_names};

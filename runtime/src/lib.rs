//! The agent-sandbox runtime library: lifecycle, state and enforcement on top of
//! youki's libcontainer. The `agent-sandbox` binary only parses arguments.
#![forbid(unsafe_code)]

pub mod apparmor;
pub mod audit;
pub mod cgroup_warm;
pub mod changes;
pub mod cli;
pub mod egress;
pub mod enforce;
pub mod executor;
pub mod fs_audit;
pub mod host;
pub mod id;
pub mod idmap;
pub mod install;
pub mod layers;
pub mod lifecycle;
pub mod logging;
pub mod mounts;
pub mod paths;
pub mod pod;
pub mod sandbox;
pub mod sidecar;
pub mod syscall_audit;

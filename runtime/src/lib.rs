//! The agent-sandbox runtime library: lifecycle, state and enforcement on top of
//! youki's libcontainer. The `agent-sandbox` binary only parses arguments.
#![forbid(unsafe_code)]

pub mod allow;
pub mod apparmor;
pub mod audit;
pub mod cgroup_warm;
pub mod changes;
pub mod cli;
pub mod egress;
pub mod enforce;
pub mod exec_exit;
pub mod executor;
pub mod find;
pub mod fs_audit;
pub mod hooks;
pub mod host;
pub mod id;
pub mod idmap;
pub mod init_exec;
pub mod install;
pub mod install_docker;
pub mod layers;
pub mod lifecycle;
pub mod logging;
pub mod mounts;
pub mod paths;
pub mod pod;
pub mod podman_oom;
pub mod promote;
pub mod reaper;
pub mod review;
pub mod run;
pub mod sandbox;
pub mod sidecar;
pub mod state_lock;
pub mod syscall_audit;
pub mod tls_trust;

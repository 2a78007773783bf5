//! The agent-sandbox runtime library: lifecycle, state and enforcement on top of
//! youki's libcontainer. The `agent-sandbox` binary only parses arguments.
#![forbid(unsafe_code)]

pub mod cli;
mod create;
pub mod enforce;
pub mod executor;
pub mod hooks;
pub mod host;
pub mod init_exec;
pub mod install;
pub mod lifecycle;
pub mod logging;
pub mod mounts;
pub mod pod;
pub mod reaper;
pub mod report;
pub mod run;
pub mod sandbox;
pub mod sidecars;
pub mod state;
#[cfg(test)]
mod test_support;

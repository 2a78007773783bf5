//! The agent-sandbox runtime library: lifecycle, state and enforcement on top of
//! youki's libcontainer. The `agent-sandbox` binary only parses arguments.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod cli;
mod create;
pub mod enforce;
pub mod files;
pub mod harden;
pub mod host;
pub mod install;
pub mod lifecycle;
pub mod logging;
pub mod pod;
pub mod report;
pub mod run;
pub mod sidecars;
pub mod state;
#[cfg(test)]
mod test_support;

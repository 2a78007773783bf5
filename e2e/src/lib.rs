//! Helpers shared by the end-to-end suites: locating built binaries, running
//! podman/ctr/CRI, and reading probe reports.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod agent_task;
pub mod cri;
pub mod criu_image;
pub mod ctr;
pub mod docker;
pub mod harness;
pub mod k8s;
pub mod net;
pub mod podman;
pub mod script;
pub mod stream;

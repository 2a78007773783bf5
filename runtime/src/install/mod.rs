//! `agent-sandbox install`: the entries that make a host's container engines run sandboxes
//! through this runtime, printed or merged into their configuration (`containerd` for
//! containerd's CRI plugin and Kubernetes, `docker` for dockerd's daemon.json).

pub mod containerd;
pub mod docker;

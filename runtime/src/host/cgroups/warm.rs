//! Starts the kernel's wait for a cgroup migration early, so that libcontainer's own
//! migration of the container's processes does not wait for it on the critical path.
//!
//! Every write to a `cgroup.procs` file takes the kernel's global `cgroup_threadgroup_rwsem`
//! for writing. That lock is a per-CPU rwsem: taking it for writing from the idle state waits
//! for a whole RCU grace period (`rcu_sync_enter`), 8-16 ms on this machine, measured as a
//! no-op write of `0` to the writer's own `cgroup.procs`. Writers that come within one grace
//! period of the previous one skip that wait. libcontainer's intermediate process writes the
//! container's pid into each cgroup hierarchy (nine on a hybrid host) late in `create`, and the
//! tenant of `exec` does the same, so each `create` and `exec` paid the grace period after most
//! of its own work.
//!
//! [`start`] forks a child that moves itself into the cgroup it is already in (a no-op
//! migration), at the beginning of `create` or `exec`: the grace period then runs beside the
//! runtime's preparation, and libcontainer's writes find the lock warm. A child, not a thread:
//! see `agent_sandbox_sys::background_write`. No extra grace
//! period is added: the container's writes fall in the one this write started. Best effort:
//! where the runtime may not write its cgroup (rootless), nothing is written and nothing
//! changes; no protection depends on it.
//!
//! Hand-written because it is one file write; no crate covers it. libcgroups' managers create
//! and configure cgroups, which is not wanted here.

use std::collections::BTreeMap;
use std::path::{Component, PathBuf};

/// The `cgroup.procs` files of `dirs` (this process's cgroups by controller, from
/// [`crate::report::layers::cgroups_of`]). A path that climbs ("/../..": a cgroup outside
/// this cgroup namespace's root) names no directory of ours and is left out.
fn procs_files(dirs: &BTreeMap<String, PathBuf>) -> impl Iterator<Item = PathBuf> + '_ {
    dirs.values()
        .filter(|d| !d.components().any(|c| c == Component::ParentDir))
        .map(|d| d.join("cgroup.procs"))
}

/// Starts the no-op migration in a child process and returns at once.
pub fn start() {
    let dirs = crate::report::layers::cgroups_of(nix::unistd::getpid().as_raw());
    // Opening does not take the lock; only the write does. Only the first file that opens is
    // written: the lock is global, one write starts the grace period for every hierarchy.
    let Some(file) =
        procs_files(&dirs).find_map(|f| std::fs::OpenOptions::new().write(true).open(f).ok())
    else {
        return;
    };
    // "0" names the writing process: the child moves itself into the cgroup it is in.
    if let Err(e) = agent_sandbox_sys::background_write::write_in_child(file.into(), b"0") {
        tracing::debug!(error = %e, "cannot start the cgroup warm-up");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cgroup_inside_the_namespace_is_a_candidate() {
        let dirs = BTreeMap::from([
            (
                "memory".to_owned(),
                PathBuf::from("/sys/fs/cgroup/memory/pods/a"),
            ),
            (
                "pids".to_owned(),
                PathBuf::from("/sys/fs/cgroup/pids/../../.."),
            ),
            (
                "unified".to_owned(),
                PathBuf::from("/sys/fs/cgroup/unified"),
            ),
        ]);
        let files: Vec<_> = procs_files(&dirs).collect();
        assert_eq!(
            files,
            [
                PathBuf::from("/sys/fs/cgroup/memory/pods/a/cgroup.procs"),
                PathBuf::from("/sys/fs/cgroup/unified/cgroup.procs"),
            ]
        );
    }
}

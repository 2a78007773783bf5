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

use std::path::{Path, PathBuf};

/// The `cgroup.procs` files of this process's own cgroups, most likely writable first: the
/// unified hierarchy (pure v2 at the mount root, hybrid under `unified`), then each v1
/// hierarchy. `proc_cgroup` is the text of `/proc/self/cgroup`.
pub fn own_procs_files(proc_cgroup: &str, mount_root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut v1 = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // Outside the cgroup namespace's root the path climbs ("/../.."): no file of ours.
        let Some(relative) = path.strip_prefix('/') else {
            continue;
        };
        if relative.split('/').any(|c| c == "..") {
            continue;
        }
        if id == "0" && controllers.is_empty() {
            files.push(
                mount_root
                    .join("unified")
                    .join(relative)
                    .join("cgroup.procs"),
            );
            files.push(mount_root.join(relative).join("cgroup.procs"));
        } else if let Some(first) = controllers.split(',').next().filter(|c| !c.is_empty()) {
            // A v1 hierarchy is mounted under its controllers' names ("cpu,cpuacct" also has
            // the links "cpu" and "cpuacct"); a named one ("name=systemd") under the name.
            let dir = first.strip_prefix("name=").unwrap_or(first);
            v1.push(mount_root.join(dir).join(relative).join("cgroup.procs"));
        }
    }
    files.extend(v1);
    files
}

/// Starts the no-op migration in a child process and returns at once.
pub fn start() {
    let Ok(proc_cgroup) = std::fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    // Opening does not take the lock; only the write does. Only the first file that opens is
    // written: the lock is global, one write starts the grace period for every hierarchy.
    let Some(file) = own_procs_files(&proc_cgroup, Path::new("/sys/fs/cgroup"))
        .iter()
        .find_map(|f| std::fs::OpenOptions::new().write(true).open(f).ok())
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
    fn hybrid_host_lists_unified_first_then_each_v1_hierarchy() {
        let text = "9:name=systemd:/\n4:memory:/pods/a\n1:cpu,cpuacct:/pods/a\n0::/pods/a\n";
        let files = own_procs_files(text, Path::new("/sys/fs/cgroup"));
        let names: Vec<_> = files.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "/sys/fs/cgroup/unified/pods/a/cgroup.procs",
                "/sys/fs/cgroup/pods/a/cgroup.procs",
                "/sys/fs/cgroup/systemd/cgroup.procs",
                "/sys/fs/cgroup/memory/pods/a/cgroup.procs",
                "/sys/fs/cgroup/cpu/pods/a/cgroup.procs",
            ]
        );
    }

    #[test]
    fn root_cgroup_and_malformed_lines() {
        let text = "0::/\nnot a line\n3:cpuset:relative\n8:pids:/../../..\n";
        let files = own_procs_files(text, Path::new("/sys/fs/cgroup"));
        let names: Vec<_> = files.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "/sys/fs/cgroup/unified/cgroup.procs",
                "/sys/fs/cgroup/cgroup.procs",
            ]
        );
    }
}

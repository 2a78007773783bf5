//! The `exit` record of a detached exec whose caller reaps it (podman's conmon, Docker's and
//! containerd's runc shim): the runtime exits right after starting the process, and the
//! caller, not the runtime, gets its status from `wait`.
//!
//! While the exec'd process is still the runtime's child (libcontainer clones it as the
//! runtime's own child, and nothing else can reap it before the runtime exits), the runtime
//! opens a pidfd for it and hands it to a detached watcher (`agent-sandbox exec-exit`, hidden),
//! which waits for the process to end and be reaped, reads its wait status from the kernel
//! (`agent_sandbox_sys::pidfd_exit`, Linux 6.15+) and appends the `exit` record under the
//! exec's id. On an older kernel no watcher starts and no record is written
//! (docs/audit.md). Our own shim reports every exit itself (`audit-exit`), so no watcher
//! starts under it; if both reported, [`crate::report::audit::exited`] keeps the first.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use agent_sandbox_audit::ExitStatus;

use crate::state::ContainerId;
use crate::state::StateDirs;

/// The hidden subcommand of the watcher.
pub const SUBCOMMAND: &str = "exec-exit";

/// How long the watcher waits, once the process ended, for its caller to reap it.
const REAP_LIMIT: Duration = Duration::from_secs(60);

/// The exec's id, from the name of the pid file its caller asked for: podman writes
/// `SESSION/exec_pid`, the runc shim `ID.pid`, ours `exec-ID.pid`. `exec` if none fits.
pub fn exec_id(pid_file: Option<&Path>) -> String {
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    let found = pid_file.and_then(|p| match name(p)?.as_str() {
        "exec_pid" => name(p.parent()?),
        file => {
            let stem = file.strip_suffix(".pid")?;
            Some(stem.strip_prefix("exec-").unwrap_or(stem).to_owned())
        }
    });
    found
        .filter(|id| valid_exec_id(id))
        .unwrap_or_else(|| "exec".to_owned())
}

/// Whether `id` may name an exec in records: 1 to 128 characters of `A-Z a-z 0-9 . _ -`
/// (containerd's exec ids are a subset; podman's are hex).
pub fn valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Whether the runtime's caller is our shim (it reports each exit itself).
fn called_by_our_shim() -> bool {
    std::fs::read_link(format!("/proc/{}/exe", std::os::unix::process::parent_id()))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()))
        .is_some_and(|n| n == "containerd-shim-agent-sandbox")
}

/// After a detached exec of `pid` (still this runtime's child): starts the watcher that
/// records its exit as `exec_id`. Failing to start it costs the record, never the exec.
pub fn watch(dirs: &StateDirs, id: &ContainerId, pid: i32, exec_id: &str) {
    use std::os::unix::process::CommandExt;
    if called_by_our_shim() {
        return;
    }
    let pidfd = match agent_sandbox_sys::pidfd_exit::open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(id = %id, pid, error = %e, "no pidfd for the exec: its exit goes unrecorded");
            return;
        }
    };
    if !agent_sandbox_sys::pidfd_exit::supported(pidfd.as_fd()) {
        tracing::debug!(id = %id, pid, "the kernel keeps no exit status for pidfds (Linux < 6.15): the exec's exit goes unrecorded");
        return;
    }
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg("--root")
        .arg(&dirs.root)
        .arg(SUBCOMMAND)
        .arg("--exec-id")
        .arg(exec_id)
        .arg(format!("--pid={pid}"))
        .arg(id.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    agent_sandbox_sys::inherit::pass_fds(&mut cmd, vec![pidfd]);
    if let Err(e) = cmd.spawn() {
        tracing::warn!(id = %id, pid, error = %e, "cannot start the exec's exit watcher");
    }
}

/// A wait status as the audit records it.
fn status_of(wait: i32) -> ExitStatus {
    if libc::WIFEXITED(wait) {
        ExitStatus::Code(libc::WEXITSTATUS(wait))
    } else if libc::WIFSIGNALED(wait) {
        ExitStatus::Signal(libc::WTERMSIG(wait))
    } else {
        ExitStatus::Unknown
    }
}

/// The watcher (descriptor 3: the exec's pidfd): waits for the exec's end and appends its
/// `exit` record.
pub fn run(
    dirs: &StateDirs,
    id: &ContainerId,
    exec_id: &str,
    pid: i32,
) -> Result<(), agent_sandbox_audit::AuditError> {
    let pidfd = agent_sandbox_sys::inherit::take_fd(agent_sandbox_sys::inherit::FIRST_FD);
    // Whatever else the caller left open (its pipes) must not wait for this process.
    agent_sandbox_sys::reaper::close_from(4);
    let Ok(pidfd) = pidfd else {
        tracing::warn!(id = %id, pid, "the exit watcher got no pidfd");
        return Ok(());
    };
    let Some(wait) = agent_sandbox_sys::pidfd_exit::exit_status(pidfd.as_fd(), REAP_LIMIT) else {
        tracing::warn!(id = %id, pid, "the exec ended but its status never became known");
        return Ok(());
    };
    crate::report::audit::exited(
        dirs,
        id,
        &crate::report::audit::ExitReport {
            process: exec_id.to_owned(),
            pid: Some(pid),
            status: status_of(wait),
            reaped_by: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_id_comes_from_the_callers_pid_file() {
        let id = |p: &str| exec_id(Some(Path::new(p)));
        let session = "4f2c0e0a9b6d1c3e5f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e";
        assert_eq!(
            id(&format!(
                "/var/lib/containers/storage/overlay-containers/C/userdata/{session}/exec_pid"
            )),
            session
        );
        assert_eq!(
            id("/run/containerd/io.containerd.runtime.v2.task/moby/C/e1.pid"),
            "e1"
        );
        assert_eq!(
            id("/run/containerd/x/default/C/exec-probe-3.pid"),
            "probe-3"
        );
        assert_eq!(id("/tmp/pid"), "exec");
        assert_eq!(id("/tmp/bad\nname.pid"), "exec");
        assert_eq!(exec_id(None), "exec");
    }

    #[test]
    fn wait_statuses_become_codes_and_signals() {
        assert_eq!(status_of(7 << 8), ExitStatus::Code(7));
        assert_eq!(status_of(libc::SIGKILL), ExitStatus::Signal(9));
        assert_eq!(status_of(0), ExitStatus::Code(0));
    }
}

//! The `Runtime` side of the processes beside a sandbox (`crate::sidecars`): the bodies of
//! the hidden `watchdog`, `proxy` and `seccomp-supervise` commands, and the executor's
//! connection to the seccomp supervisor.

use std::path::Path;

use agent_sandbox_policy::SandboxPolicy;
use libcontainer::container::ContainerStatus;

use super::{LookupError, PlanError, Runtime};
use crate::sidecars::syscall_audit::SyscallAuditError;
use crate::state::ContainerId;

/// Errors of the hidden sidecar commands (`watchdog`, `proxy`, `seccomp-supervise`).
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Sandbox(#[from] crate::harden::SandboxError),
    #[error("kill failed")]
    Kill(#[source] Box<libcontainer::error::LibcontainerError>),
    #[error("audit trail")]
    Audit(#[source] agent_sandbox_audit::AuditError),
    #[error("network layer: the egress proxy")]
    Egress(#[source] crate::sidecars::egress::EgressError),
    #[error("denied-syscall audit")]
    SyscallAudit(#[source] SyscallAuditError),
}

type Result<T> = std::result::Result<T, SidecarError>;

impl Runtime {
    /// The watchdog body: waits, then kills the sandbox if it still runs the
    /// same init (`pid`, from `start`; else read from the state now). It ends at once when
    /// the init exits, so it never outlives the sandbox (even one whose state root was
    /// removed without `delete`).
    pub fn watchdog(&self, id: &ContainerId, seconds: u64, pid: Option<i32>) -> Result<()> {
        let pid = match pid {
            Some(p) => Some(nix::unistd::Pid::from_raw(p)),
            None => self.load(id)?.pid(),
        };
        let init = match pid.map(|p| crate::sidecars::InitWatch::open(p.as_raw())) {
            Some(Ok(Some(init))) => Some(init),
            Some(Ok(None)) => {
                tracing::debug!(id = %id, "the init is gone: the watchdog ends");
                return Ok(());
            }
            Some(Err(_)) | None => None,
        };
        self.wall_clock(id, seconds, pid, init)
    }

    /// The wall clock's timer, in the watchdog or in the sandbox's helper: waits `seconds`
    /// plus every freeze, then kills the sandbox if it still runs the init `pid` (watched
    /// by `init`, whose exit ends the wait).
    fn wall_clock(
        &self,
        id: &ContainerId,
        seconds: u64,
        pid: Option<nix::unistd::Pid>,
        init: Option<crate::sidecars::InitWatch>,
    ) -> Result<()> {
        // Waits `d`; whether the init exited meanwhile (without a pidfd: never seen).
        let exited_within = |d: std::time::Duration| match &init {
            Some(init) => init.exited_within(d),
            None => {
                std::thread::sleep(d);
                false
            }
        };
        if exited_within(std::time::Duration::from_secs(seconds)) {
            tracing::debug!(id = %id, "the init exited: the watchdog ends");
            return Ok(());
        }
        // Time frozen (`pause`) does not count: wait it out too, freeze after freeze.
        let mut credited = std::time::Duration::ZERO;
        loop {
            let frozen = super::pause::frozen_so_far(&self.dirs.sandbox(id));
            let Some(owed) = frozen.checked_sub(credited).filter(|o| !o.is_zero()) else {
                break;
            };
            tracing::debug!(id = %id, owed_ms = owed.as_millis(), "the sandbox stood frozen: the wall clock waits longer");
            credited = frozen;
            if exited_within(owed) {
                tracing::debug!(id = %id, "the init exited: the watchdog ends");
                return Ok(());
            }
        }
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.pid() != pid || c.status() == ContainerStatus::Stopped {
            return Ok(());
        }
        tracing::warn!(id = %id, seconds, "wall-clock limit reached: killing the sandbox");
        crate::sidecars::trail::wall_clock_fired(&self.dirs, id, seconds);
        if let Some(init) = c.pid() {
            tell_init_stderr(
                init.as_raw(),
                &format!(
                    "agent-sandbox: wall-clock limit of {seconds}s reached: killing the sandbox \
                     (see docs/limits.md)\n"
                ),
            );
        }
        c.kill(
            libcontainer::signal::Signal::from(nix::sys::signal::Signal::SIGKILL),
            true,
        )
        .map_err(|e| SidecarError::Kill(Box::new(e)))
    }

    /// The egress proxy body (hidden `proxy` command, spawned by `create`):
    /// serves the sandbox's effective allowlist on its netns until killed.
    pub fn proxy(&self, id: &ContainerId, netns: &Path) -> Result<()> {
        let bundle = self.dirs.sandbox(id).bundle();
        let (plan, _) = self.saved_plan(id, &bundle)?;
        let log = crate::sidecars::trail::path(&self.dirs, id).map_err(SidecarError::Audit)?;
        let sandbox_dir = self.dirs.sandbox(id);
        let netns = || {
            if netns == Path::new(crate::sidecars::egress::NETNS_ON_STDIN) {
                crate::sidecars::egress::netns_from_stdin()
            } else {
                Ok(netns.to_path_buf())
            }
        };
        crate::sidecars::egress::serve(netns, &plan, &log, id.as_str(), &sandbox_dir)
            .map_err(SidecarError::Egress)
    }

    /// `seccomp-supervise`: the body of the sandbox's denied-syscall supervisor; with
    /// `dead_man`, the sandbox's helper, whose wall clock `start` arms (a thread here, not
    /// joined: the process ends when the supervisor does, whatever the timer still waits).
    pub fn seccomp_supervise(
        self: std::sync::Arc<Self>,
        id: &ContainerId,
        errno: i32,
        kernel_audit: bool,
        dead_man: bool,
    ) -> Result<()> {
        let arch = agent_sandbox_policy::seccomp::Arch::host()
            .ok_or(crate::harden::SandboxError::NoArch)?;
        let log = crate::sidecars::trail::path(&self.dirs, id).map_err(SidecarError::Audit)?;
        // Its records share the log's cap with the proxy's (docs/audit.md).
        let bundle = self.dirs.sandbox(id).bundle();
        let (policy, _, _) = self.saved_policy(id, &bundle)?;
        let cap = policy.network.audit_max_bytes.bytes();
        let pid_file = self.dirs.sandbox(id).supervisor_pid();
        let mut arm = |seconds: u64, pidfd: std::os::fd::OwnedFd| {
            let init = crate::sidecars::InitWatch::from_fd(pidfd);
            let (runtime, sandbox) = (std::sync::Arc::clone(&self), id.clone());
            std::thread::spawn(move || {
                let pid = runtime.load(&sandbox).ok().and_then(|c| c.pid());
                if let Err(e) = runtime.wall_clock(&sandbox, seconds, pid, Some(init)) {
                    tracing::error!(id = %sandbox, error = %e, "the wall clock could not kill the sandbox");
                }
            });
            tracing::info!(id = %id, seconds, "wall-clock limit armed in the helper");
        };
        let helper = crate::sidecars::syscall_audit::Helper {
            dead_man,
            pid_file: &pid_file,
            arm: &mut arm,
        };
        crate::sidecars::syscall_audit::supervise(
            &log,
            id.as_str(),
            errno,
            arch,
            kernel_audit,
            cap,
            helper,
        )
        .map_err(SidecarError::SyscallAudit)
    }

    /// Turns the executor's seccomp layer into its user-notification form: starts the
    /// sandbox's supervisor when `spawn` (create; returned, its ready line still to be
    /// checked), then connects this process to it. With `dead_man` the supervisor is the
    /// sandbox's helper ([`helper_holds_wall_clock`]).
    pub(crate) fn notify_denials(
        &self,
        id: &ContainerId,
        executor: &mut crate::enforce::executor::SandboxExecutor,
        policy: &SandboxPolicy,
        spawn: bool,
        dead_man: bool,
    ) -> std::result::Result<
        Option<Box<dyn crate::create::host_procs::StartingSupervisor>>,
        SyscallAuditError,
    > {
        let Some(bpf) = executor.seccomp.clone() else {
            return Ok(None);
        };
        let sandbox_dir = self.dirs.sandbox(id);
        let errno = policy.syscalls.errno.number();
        let starting = if spawn {
            // The helper's death ends the sandbox through its reaper (ARCHITECTURE.md, "One
            // helper per sandbox"); the pipe's write end goes to the helper only.
            let dead_man = if dead_man {
                let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|e| SyscallAuditError::Spawn(e.into()))?;
                executor.dead_man = Some(std::sync::Arc::new(read));
                Some(write)
            } else {
                None
            };
            Some(self.procs.start_supervisor(
                &self.dirs.root,
                &sandbox_dir,
                id.as_str(),
                errno,
                dead_man,
            )?)
        } else {
            None
        };
        let supervisor = self.procs.connect_supervisor(&sandbox_dir)?;
        executor.notify = Some(std::sync::Arc::new(
            crate::enforce::executor::NotifyFilter {
                program: crate::sidecars::syscall_audit::notify_program(&bpf, errno),
                supervisor,
                fs_audit: executor.landlock.is_some()
                    && crate::sidecars::fs_audit::FsAuditStatus::load(&sandbox_dir)
                        .is_some_and(|s| s.active),
            },
        ));
        Ok(starting)
    }
}

/// Whether the sandbox's supervisor is its helper, which holds the wall clock and whose
/// death its reaper turns into the sandbox's end: a sandbox with a supervisor (a seccomp
/// layer) and the reaper as PID 1 (every policy has a wall clock: zero is refused).
/// Otherwise the wall clock is a watchdog process of its own, as the reaper is what watches
/// the helper (ARCHITECTURE.md, "One helper per sandbox").
pub(crate) fn helper_holds_wall_clock(
    policy: &SandboxPolicy,
    spec: &libcontainer::oci_spec::runtime::Spec,
    supervisor: bool,
) -> bool {
    supervisor && crate::enforce::reaper::wanted(policy, spec)
}

/// Writes `line` to the stderr of the sandbox's init (host pid `pid`), where podman's
/// conmon and the shim collect the container's output, when that is a pipe or a terminal.
/// Opened without blocking: a FIFO without reader, a socket or a full pipe drop the line.
/// Best effort; the `exit` record names the cause either way.
fn tell_init_stderr(pid: i32, line: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let path = format!("/proc/{pid}/fd/2");
    let pipe_or_tty =
        |m: std::fs::Metadata| m.file_type().is_fifo() || m.file_type().is_char_device();
    // Looked at before the open too: the sandbox's fd may be anything (a file, a socket), and
    // nothing but a pipe or a terminal is opened through the link.
    if !std::fs::metadata(&path).is_ok_and(pipe_or_tty) {
        return;
    }
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&path);
    let Ok(mut f) = opened else {
        return;
    };
    if f.metadata().is_ok_and(pipe_or_tty)
        && let Err(e) = f.write_all(line.as_bytes())
    {
        tracing::debug!(pid, error = %e, "cannot tell the init's stderr about the kill");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libcontainer::oci_spec::runtime::{ProcessBuilder, Spec};

    fn spec_running(program: &str) -> Spec {
        // The default spec has a PID namespace of its own.
        let mut spec = Spec::default();
        let process = ProcessBuilder::default()
            .args(vec![program.to_owned()])
            .build()
            .unwrap();
        spec.set_process(Some(process));
        spec
    }

    /// The helper holds the wall clock only where its death can end the sandbox: with the
    /// reaper as PID 1 to watch it and a supervisor to be it.
    #[test]
    fn the_helper_holds_the_wall_clock_only_where_the_reaper_watches_it() {
        let policy = SandboxPolicy::default();
        assert!(helper_holds_wall_clock(
            &policy,
            &spec_running("sleep"),
            true
        ));
        assert!(!helper_holds_wall_clock(
            &policy,
            &spec_running("sleep"),
            false
        ));
        assert!(!helper_holds_wall_clock(
            &policy,
            &spec_running("/sbin/tini"),
            true
        ));
        let mut never = policy;
        never.resources.init = agent_sandbox_policy::policy::InitMode::Never;
        assert!(!helper_holds_wall_clock(
            &never,
            &spec_running("sleep"),
            true
        ));
    }
}

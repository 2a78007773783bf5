//! `start`: lets the created init run the program, returns once it runs (as runc's does),
//! and arms the wall-clock watchdog.

use libcontainer::container::{Container, ContainerStatus};

use super::{LookupError, PlanError, Runtime, status_name};
use crate::state::ContainerId;

/// Errors of `start`, by its phase: finding the container, letting the init run, arming the
/// wall clock. The texts are runc's where callers match on them.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("container {id} is {status}, not {wanted}")]
    WrongState {
        id: ContainerId,
        status: &'static str,
        wanted: &'static str,
    },
    #[error(
        "container {id} was not fully created (its create was interrupted before the \
         sandbox's limits and records were in place): delete it and create it again \
         (docs/reliability.md#a-runtime-killed-mid-create)"
    )]
    Incomplete { id: ContainerId },
    #[error("start failed")]
    Container(#[source] Box<libcontainer::error::LibcontainerError>),
    /// Reading the plan the wall clock comes from.
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
}

/// Starting the wall-clock watchdog process (`start`, and a restored sandbox's).
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("cannot start the wall-clock watchdog")]
    Spawn(#[source] std::io::Error),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

type Result<T> = std::result::Result<T, StartError>;

impl Runtime {
    pub fn start(&self, id: &ContainerId) -> Result<()> {
        let lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.status() != ContainerStatus::Created {
            return Err(StartError::WrongState {
                id: id.clone(),
                status: status_name(c.status()),
                wanted: "created",
            });
        }
        if !self.dirs.sandbox(id).create_done().exists() {
            return Err(StartError::Incomplete { id: id.clone() });
        }
        let init = c.pid().map(|p| p.as_raw());
        let before = init.and_then(crate::enforce::init_exec::executable);
        c.start().map_err(|e| StartError::Container(Box::new(e)))?;
        drop(lock);
        // As runc's: return once the program runs, so that a signal sent right after `start`
        // reaches it (see `init_exec`).
        if let (Some(pid), Some(before)) = (init, before) {
            let procs = crate::report::layers::reaper_procs(&self.dirs.sandbox(id));
            let outcome = crate::enforce::init_exec::wait(
                pid,
                before,
                procs.as_deref(),
                crate::enforce::init_exec::WAIT_LIMIT,
            );
            tracing::debug!(id = %id, ?outcome, "start: the init executed the program");
            if let Some(now) = crate::enforce::init_exec::uptime() {
                // Not synced: an uptime means nothing after the host's crash (the sandbox
                // is gone then too), and a synced file costs `start` a wait on the disk and
                // `delete` a discard where the disk has them (docs/benchmarks.md).
                let _ = agent_sandbox_sys::atomic_file::replace_mode(
                    &self.dirs.sandbox(id).started(),
                    now.to_string().as_bytes(),
                    0o600,
                );
            }
        }
        self.arm_wall_clock(id, &c)
    }

    /// Arms the policy's `wall_clock` limit (not part of the OCI spec): in the sandbox's
    /// helper when it has one (`helper_holds_wall_clock`), else in a detached `agent-sandbox
    /// watchdog`; either SIGKILLs every process of the sandbox when the time is up.
    fn arm_wall_clock(&self, id: &ContainerId, c: &Container) -> Result<()> {
        let (policy, _, spec) = self.saved_policy(id, c.bundle())?;
        let secs = policy.resources.wall_clock.get();
        if secs == 0 {
            return Ok(());
        }
        let pid = c.pid().map(|p| p.as_raw());
        let dir = self.dirs.sandbox(id);
        let helper =
            super::sidecars::helper_holds_wall_clock(&policy, &spec, dir.supervisor_pid().exists());
        if let (true, Some(pid)) = (helper, pid) {
            let armed = agent_sandbox_sys::pidfd_exit::open(pid)
                .map_err(crate::sidecars::syscall_audit::SyscallAuditError::Spawn)
                .and_then(|init| {
                    use std::os::fd::AsFd as _;
                    crate::sidecars::syscall_audit::arm_wall_clock(&dir, secs, init.as_fd())
                });
            match armed {
                Ok(()) => {
                    tracing::info!(id = %id, seconds = secs, "wall-clock limit armed in the helper");
                    return Ok(());
                }
                // A dead helper ends the sandbox through its reaper; a watchdog still holds
                // the limit whatever else failed.
                Err(e) => {
                    tracing::warn!(id = %id, error = %e, "cannot arm the wall clock in the helper: starting a watchdog")
                }
            }
        }
        Ok(self.spawn_watchdog(id, pid, secs)?)
    }

    /// Starts the watchdog that kills the sandbox after `secs` of wall clock (pauses not
    /// counted); `restore` arms it with what is left of the budget.
    pub(crate) fn spawn_watchdog(
        &self,
        id: &ContainerId,
        pid: Option<i32>,
        secs: u64,
    ) -> std::result::Result<(), WatchdogError> {
        let dir = self.dirs.sandbox(id);
        use std::os::unix::process::CommandExt;
        // `/proc/self/exe`, not `current_exe()`: `run` starts from the sealed copy, whose
        // name is no path on disk (as `crate::sidecars` explains).
        let child = std::process::Command::new("/proc/self/exe")
            .arg("--root")
            .arg(&self.dirs.root)
            .arg("watchdog")
            .arg("--seconds")
            .arg(secs.to_string())
            .args(pid.map(|p| format!("--pid={p}")))
            .arg(id.as_str())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(WatchdogError::Spawn)?;
        crate::files::write(&dir.watchdog_pid(), child.id().to_string())?;
        tracing::info!(id = %id, seconds = secs, "wall-clock limit armed");
        Ok(())
    }
}

//! `run`: runc's create, start and wait in one command, the way people and scripts try a
//! runtime by hand. In the foreground it waits for the container's init, passes on the
//! signals it gets, deletes the container and exits with the init's status (128 + N for a
//! signal N), as `runc run` does; `--detach` returns after the start.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::harden::Ceiling;
use crate::lifecycle::{CreateError, CreateOpts, DeleteError, LookupError, ReapedInit, Runtime};
use crate::state::ContainerId;

/// Why `run` failed before the container's status was known.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Create(#[from] CreateError),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Delete(#[from] DeleteError),
    #[error(transparent)]
    Start(#[from] crate::lifecycle::StartError),
    #[error(
        "run: process.terminal needs --console-socket (agent-sandbox does not relay a terminal itself)"
    )]
    TerminalWithoutSocket,
    #[error("container not running")]
    NotRunning,
    #[error("run: cannot {what}")]
    Wait {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// Signals a foreground `run` passes on to the container's init (runc's set, less the ones
/// that stop or continue `run` itself).
const FORWARDED: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// Creates and starts `id`; unless `detach`, waits for its init, deletes it and returns the
/// init's status.
pub fn run(
    rt: &Runtime,
    id: &ContainerId,
    opts: &CreateOpts,
    ceiling: &Ceiling,
    detach: bool,
) -> Result<i32, RunError> {
    let terminal = libcontainer::oci_spec::runtime::Spec::load(opts.bundle.join("config.json"))
        .ok()
        .and_then(|s| s.process().as_ref().and_then(|p| p.terminal()))
        .unwrap_or(false);
    if terminal && opts.console_socket.is_none() {
        return Err(RunError::TerminalWithoutSocket);
    }
    // The init is forked by libcontainer's short-lived intermediate process; as a subreaper
    // this process becomes its parent and can wait for it, as runc is its init's parent.
    if !detach {
        nix::sys::prctl::set_child_subreaper(true).map_err(|source| RunError::Wait {
            what: "become a subreaper",
            source,
        })?;
    }
    rt.create(id, opts, ceiling)?;
    let pid = rt.load(id)?.pid();
    if let Err(e) = rt.start(id) {
        let _ = rt.delete(id, true, None);
        return Err(e.into());
    }
    if detach {
        return Ok(0);
    }
    let pid = pid.ok_or(RunError::NotRunning)?;
    let status = wait_forwarding(pid)?;
    rt.delete(
        id,
        false,
        Some(ReapedInit {
            pid: Some(pid.as_raw()),
            status,
        }),
    )?;
    Ok(match status {
        agent_sandbox_audit::ExitStatus::Code(c) => c,
        agent_sandbox_audit::ExitStatus::Signal(n) => 128 + n,
        agent_sandbox_audit::ExitStatus::Unknown => 255,
    })
}

/// Waits for `pid` to exit, passing [`FORWARDED`] signals on to it. The signals are blocked
/// only now, after the container's processes were forked (a blocked mask is inherited).
fn wait_forwarding(pid: Pid) -> Result<agent_sandbox_audit::ExitStatus, RunError> {
    let err = |what| move |source| RunError::Wait { what, source };
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    for s in FORWARDED {
        mask.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .map_err(err("block signals"))?;
    let fd = SignalFd::new(&mask).map_err(err("open a signalfd"))?;
    loop {
        // Checked before each read: the init may have exited before SIGCHLD was blocked.
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => {
                return Ok(agent_sandbox_audit::ExitStatus::Code(code));
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return Ok(agent_sandbox_audit::ExitStatus::Signal(sig as i32));
            }
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(source) => return Err(err("wait for the container's init")(source)),
        }
        let Some(info) = fd.read_signal().map_err(err("read a signal"))? else {
            continue;
        };
        let Ok(sig) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The text `LifecycleError::NotRunning` printed for `run` before it had its own type.
    #[test]
    fn not_running_keeps_its_text() {
        assert_eq!(
            super::RunError::NotRunning.to_string(),
            "container not running"
        );
    }
}

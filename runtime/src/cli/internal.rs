//! The hidden commands: what the runtime starts as helper processes beside a sandbox
//! (`proxy`, `seccomp-supervise`, `watchdog`, `exec-exit`), what the shim starts beside
//! one (`exit-recorder`) and the wrapper of OCI hooks
//! (`hook`). People do not run these; their flags may change with the runtime.

use std::path::Path;

use crate::state::ContainerId;

use super::{Cli, CliError};

/// `proxy --netns NS ID`: the sandbox's egress proxy.
pub(super) fn proxy(cli: &Cli, id: &str, netns: &Path) -> Result<(), CliError> {
    cli.runtime()?.proxy(&ContainerId::try_from(id)?, netns)?;
    Ok(())
}

/// `seccomp-supervise --errno E [--kernel-audit] [--dead-man] ID`: the sandbox's seccomp
/// supervisor, and with `--dead-man` its helper that also holds the wall clock.
pub(super) fn seccomp_supervise(
    cli: &Cli,
    id: &str,
    errno: i32,
    kernel_audit: bool,
    dead_man: bool,
) -> Result<(), CliError> {
    std::sync::Arc::new(cli.runtime()?).seccomp_supervise(
        &ContainerId::try_from(id)?,
        errno,
        kernel_audit,
        dead_man,
    )?;
    Ok(())
}

/// `watchdog --seconds S [--pid P] ID`: the wall-clock limit.
pub(super) fn watchdog(
    cli: &Cli,
    id: &str,
    seconds: u64,
    pid: Option<i32>,
) -> Result<(), CliError> {
    cli.runtime()?
        .watchdog(&ContainerId::try_from(id)?, seconds, pid)?;
    Ok(())
}

/// `exec-exit --exec-id E --pid P ID`: the `exit` record of a detached exec.
pub(super) fn exec_exit(cli: &Cli, id: &str, exec_id: &str, pid: i32) -> Result<(), CliError> {
    let runtime = cli.runtime()?;
    crate::sidecars::exec_exit::run(&runtime.dirs, &ContainerId::try_from(id)?, exec_id, pid)?;
    Ok(())
}

/// `exit-recorder [--idle-seconds S] ID`: the shim's writer of exec `exit` records, on
/// stdin and stdout.
pub(super) fn exit_recorder(cli: &Cli, id: &str, idle_seconds: u64) -> Result<(), CliError> {
    use std::os::fd::AsFd;
    let id = ContainerId::try_from(id)?;
    let runtime = cli.runtime()?;
    if !runtime.dirs.sandbox(&id).exists() {
        return Err(crate::lifecycle::LookupError::NotExist { id }.into());
    }
    let input = std::io::stdin().as_fd().try_clone_to_owned();
    let output = std::io::stdout().as_fd().try_clone_to_owned();
    let (input, output) = input
        .and_then(|i| Ok((i, output?)))
        .map_err(CliError::ExitRecorder)?;
    let idle = std::time::Duration::from_secs(idle_seconds);
    crate::sidecars::exec_exit::serve(&runtime.dirs, &id, input, output, idle)
        .map_err(CliError::ExitRecorder)
}

/// `oom-watch --bundle B --cgroup MEMDIR ID`: marks an OOM kill where podman looks for it.
pub(super) fn oom_watch(bundle: &Path, cgroup: &Path, id: &str) -> Result<(), CliError> {
    crate::sidecars::podman_oom::run(bundle, cgroup, &ContainerId::try_from(id)?)?;
    Ok(())
}

/// `hook --bundle B -- PATH ARGS...`: runs an OCI hook with the caller's bundle in its state.
pub(super) fn hook(bundle: &Path, argv: &[String]) -> Result<(), CliError> {
    crate::enforce::hooks::relay(bundle, argv)?;
    Ok(())
}

//! The commands that change a container's state: `start`, `pause`, `resume`, `kill`,
//! `delete` and `update`.

use std::io::Read;
use std::path::Path;

use crate::files::FileError;
use crate::state::ContainerId;

use super::{Cli, CliError};

/// `start`: a created container's process goes on.
pub(super) fn start(cli: &Cli, id: &str) -> Result<(), CliError> {
    cli.runtime()?.start(&ContainerId::try_from(id)?)?;
    Ok(())
}

/// `pause` (`freeze`) and `resume` (not `freeze`).
pub(super) fn pause(cli: &Cli, id: &str, freeze: bool) -> Result<(), CliError> {
    cli.runtime()?.pause(&ContainerId::try_from(id)?, freeze)?;
    Ok(())
}

/// `kill`: a signal to the init, or with `--all` to every process.
pub(super) fn kill(cli: &Cli, id: &str, signal: &str, all: bool) -> Result<(), CliError> {
    cli.runtime()?
        .kill(&ContainerId::try_from(id)?, signal, all)?;
    Ok(())
}

/// `delete`; `--exit-pid`/`--exit-status` carry the shim's reaped init for its `exit` record.
pub(super) fn delete(
    cli: &Cli,
    id: &str,
    force: bool,
    exit_pid: Option<i32>,
    exit_status: Option<i32>,
) -> Result<(), CliError> {
    let reaped = exit_status.map(|status| crate::lifecycle::ReapedInit {
        pid: exit_pid,
        status: agent_sandbox_audit::ExitStatus::from_folded(status),
    });
    cli.runtime()?
        .delete(&ContainerId::try_from(id)?, force, reaped)?;
    Ok(())
}

/// `update --resources FILE`: new resource limits (`-` reads them from stdin).
pub(super) fn update(cli: &Cli, id: &str, resources: &Path) -> Result<(), CliError> {
    let bytes = read_input(resources)?;
    let res: libcontainer::oci_spec::runtime::LinuxResources =
        crate::files::parse_json(resources, &bytes)?;
    cli.runtime()?.update(&ContainerId::try_from(id)?, &res)?;
    Ok(())
}

fn read_input(path: &Path) -> Result<Vec<u8>, FileError> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| FileError::read(path, e))?;
        Ok(buf)
    } else {
        crate::files::read(path)
    }
}

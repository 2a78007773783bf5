//! `create` and `run`.

use crate::harden::Ceiling;
use crate::lifecycle::CreateOpts;
use crate::state::ContainerId;

use super::{Cli, CliError, CreateArgs, Outcome, RunArgs};

/// `create`: a container from a bundle; its process waits for `start`.
pub(super) fn create(cli: &Cli, a: CreateArgs) -> Result<(), CliError> {
    let id = ContainerId::try_from(a.id.as_str())?;
    let ceiling = Ceiling::load(cli.policy.as_deref())?;
    cli.runtime()?
        .create(&id, &create_opts(a, cli.systemd_cgroup), &ceiling)?;
    Ok(())
}

/// `run`: create, start and (unless `--detach`) wait; the exit code is the container's.
pub(super) fn run(cli: &Cli, RunArgs { create, detach }: RunArgs) -> Result<Outcome, CliError> {
    let id = ContainerId::try_from(create.id.as_str())?;
    let ceiling = Ceiling::load(cli.policy.as_deref())?;
    let opts = create_opts(create, cli.systemd_cgroup);
    let code = crate::run::run(&cli.runtime()?, &id, &opts, &ceiling, detach)?;
    Ok(Outcome::Exit(code))
}

fn create_opts(a: CreateArgs, systemd_cgroup: bool) -> CreateOpts {
    CreateOpts {
        bundle: std::path::absolute(&a.bundle).unwrap_or(a.bundle.clone()),
        pid_file: a.pid_file,
        console_socket: a.console_socket,
        no_pivot: a.no_pivot,
        preserve_fds: a.preserve_fds,
        systemd_cgroup,
        reuse_change: None,
        keep_placeholders: std::collections::BTreeMap::new(),
    }
}

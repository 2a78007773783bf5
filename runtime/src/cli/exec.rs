//! `exec`: a process inside a running container.

use crate::lifecycle::ExecOpts;
use crate::state::ContainerId;

use super::{Cli, CliError, ExecArgs, Outcome};

/// `exec`; the exit code is the process's when the runtime waits for it.
pub(super) fn exec(cli: &Cli, a: ExecArgs) -> Result<Outcome, CliError> {
    if let Some(cap) = a.cap.first() {
        return Err(CliError::Cap { cap: cap.clone() });
    }
    let id = ContainerId::try_from(a.id.as_str())?;
    let user = match &a.user {
        None => None,
        Some(u) => Some(parse_user(u)?),
    };
    if a.process.is_none() && a.command.is_empty() {
        return Err(CliError::NoExecCommand);
    }
    let runtime = cli.runtime()?;
    let opts = ExecOpts {
        process: a.process,
        args: a.command,
        env: a.env,
        cwd: a.cwd,
        tty: a.tty,
        user,
        detach: a.detach,
        pid_file: a.pid_file,
        console_socket: a.console_socket,
        preserve_fds: a.preserve_fds,
        exec_id: a.exec_id,
    };
    let code = runtime.exec(&id, &opts)?;
    Ok(Outcome::Exit(code.unwrap_or(0)))
}

fn parse_user(u: &str) -> Result<(u32, Option<u32>), CliError> {
    let bad = || CliError::User {
        value: u.to_owned(),
    };
    let (uid, gid) = match u.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (u, None),
    };
    let uid = uid.parse().map_err(|_| bad())?;
    let gid = match gid {
        Some(g) => Some(g.parse().map_err(|_| bad())?),
        None => None,
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_spec_is_validated() {
        assert_eq!(parse_user("1000:100").unwrap(), (1000, Some(100)));
        assert_eq!(parse_user("7").unwrap(), (7, None));
        assert!(parse_user("root").is_err());
    }
}

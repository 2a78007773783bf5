//! The workspace change commands: `diff`, `export`, `promote` and `changes`
//! (`crate::report::review`, `crate::report::promote`, `crate::report::changes`).

use std::path::PathBuf;

use crate::harden::Ceiling;
use crate::report::find::Found;

use super::{Cli, CliError};

/// The sandbox `key` names, by the resolver every command shares (docs/audit.md#finding-a-sandbox).
fn found(cli: &Cli, key: &str) -> Result<Found, CliError> {
    Ok(crate::report::find::find(
        cli.root.as_deref(),
        cli.audit_dir.as_deref(),
        key,
    )?)
}

/// `diff ID [--patch | --stat] [--ignored]`: the change set for review
/// (`crate::report::review::write_diff`).
pub(super) fn diff(
    cli: &Cli,
    id: &str,
    patch: bool,
    stat: bool,
    ignored: bool,
) -> Result<(), CliError> {
    let source = crate::report::review::source(&found(cli, id)?)?;
    if source.changes()?.is_empty() {
        // A sandbox that wrote nothing (live, or ended with only its record kept).
        println!("# no changes");
        return Ok(());
    }
    let view = match (patch, stat) {
        (true, _) => crate::report::review::View::Patch,
        (false, true) => crate::report::review::View::Stat,
        (false, false) => crate::report::review::View::List,
    };
    let req = crate::report::review::DiffRequest {
        view,
        list_ignored: ignored,
        policy: cli.policy.as_deref(),
    };
    crate::report::review::write_diff(&source, &req, &mut std::io::stdout().lock())?;
    Ok(())
}

/// `export ID --to-dir DIR | --to-tar FILE`.
pub(super) fn export(
    cli: &Cli,
    id: &str,
    to_dir: Option<PathBuf>,
    to_tar: Option<PathBuf>,
) -> Result<(), CliError> {
    let source = crate::report::review::source(&found(cli, id)?)?;
    let target = match (to_dir, to_tar) {
        (Some(d), _) => agent_sandbox_audit::ExportTarget::Dir(d),
        (None, Some(t)) => agent_sandbox_audit::ExportTarget::Tar(t),
        (None, None) => return Err(CliError::NoCommand),
    };
    let limit = crate::report::review::size_limit(&source, cli.policy.as_deref())?;
    let s = agent_sandbox_audit::export(&source.upper, source.lower.as_deref(), &target, &limit)?;
    crate::report::review::write_export_summary(&mut std::io::stdout().lock(), &s)
        .map_err(|e| crate::files::FileError::write("-", e))?;
    Ok(())
}

/// `promote ID --to DIR [--dry-run] [--digest D] [--advance] [--include-ignored]`.
pub(super) fn promote(cli: &Cli, a: super::PromoteArgs) -> Result<(), CliError> {
    let found = found(cli, &a.id)?;
    // Absolute, so the audit record names the directory whatever the caller's cwd.
    let to = std::path::absolute(&a.to).unwrap_or(a.to);
    let req = crate::report::promote::Request {
        found: &found,
        to: &to,
        dry_run: a.dry_run,
        digest: a.digest.as_deref(),
        policy: cli.policy.as_deref(),
        audit_dir: cli.audit_dir.as_deref(),
        advance: a.advance,
        include_ignored: a.include_ignored,
    };
    crate::report::promote::run(&req, &mut std::io::stdout().lock())?;
    Ok(())
}

/// `changes [list | discard ID | prune]`: the kept change sets.
pub(super) fn changes(
    cli: &Cli,
    action: Option<crate::report::changes::Action>,
) -> Result<(), CliError> {
    let ceiling = Ceiling::load(cli.policy.as_deref())?;
    let scope = crate::report::changes::Scope {
        root: cli.root.as_deref(),
        audit_dir: cli.audit_dir.as_deref(),
    };
    print!(
        "{}",
        crate::report::changes::run(action, &ceiling.policy, scope)?
    );
    Ok(())
}

//! The workspace change commands: `diff`, `export`, `promote` and `changes`
//! (`crate::report::review`, `crate::report::promote`, `crate::report::changes`).

use std::path::PathBuf;

use crate::harden::Ceiling;
use crate::state::ContainerId;

use super::{Cli, CliError};

/// `diff ID`: one line per change in the workspace overlay.
pub(super) fn diff(cli: &Cli, id: &str) -> Result<(), CliError> {
    let source = crate::report::review::source(&cli.runtime()?, &ContainerId::try_from(id)?)?;
    let changes = source.changes()?;
    if changes.is_empty() {
        // A sandbox that wrote nothing (live, or ended with only its record kept).
        println!("# no changes");
        return Ok(());
    }
    let limit = crate::report::review::size_limit(&source, cli.policy.as_deref())?;
    // Measuring opens each file (no read): a file this user cannot open still gets its line.
    match agent_sandbox_audit::layout::footprint(&source.upper, &changes) {
        Ok(footprint) => {
            for line in crate::report::review::diff_lines(&changes, &footprint, &limit) {
                println!("{line}");
            }
        }
        Err(e) => {
            for c in &changes {
                println!("{}", crate::report::review::diff_line(c));
            }
            println!(
                "# size on the target: not measured ({})",
                agent_sandbox_proxy::error_text::chain(&e)
            );
        }
    }
    Ok(())
}

/// `export ID --to-dir DIR | --to-tar FILE`.
pub(super) fn export(
    cli: &Cli,
    id: &str,
    to_dir: Option<PathBuf>,
    to_tar: Option<PathBuf>,
) -> Result<(), CliError> {
    let source = crate::report::review::source(&cli.runtime()?, &ContainerId::try_from(id)?)?;
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

/// `promote ID --to DIR [--dry-run] [--digest D] [--advance]`.
pub(super) fn promote(
    cli: &Cli,
    id: &str,
    to: PathBuf,
    dry_run: bool,
    digest: Option<&str>,
    advance: bool,
) -> Result<(), CliError> {
    let id = ContainerId::try_from(id)?;
    // Absolute, so the audit record names the directory whatever the caller's cwd.
    let to = std::path::absolute(&to).unwrap_or(to);
    let req = crate::report::promote::Request {
        id: &id,
        to: &to,
        dry_run,
        digest,
        policy: cli.policy.as_deref(),
        audit_dir: cli.audit_dir.as_deref(),
        advance,
    };
    crate::report::promote::run(&cli.runtime()?, &req, &mut std::io::stdout().lock())?;
    Ok(())
}

/// `changes [list | discard ID | prune]`: the kept change sets.
pub(super) fn changes(
    cli: &Cli,
    action: Option<crate::report::changes::Action>,
) -> Result<(), CliError> {
    let ceiling = Ceiling::load(cli.policy.as_deref())?;
    print!("{}", crate::report::changes::run(action, &ceiling.policy)?);
    Ok(())
}

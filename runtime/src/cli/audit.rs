//! `audit` (show, verify, prune), the shim's `audit-exit`, and `layers`: what a sandbox did
//! and which protections it has (`crate::report`).

use crate::lifecycle::Runtime;
use crate::state::ContainerId;

use super::{Cli, CliError, Outcome};

/// The exit status of `audit verify` for a log whose chain is intact but that reached its
/// size cap: not every record is in it (docs/audit.md, "Verifying a log").
pub const VERIFY_TRUNCATED: i32 = 3;

/// `audit ID [--json]`, `audit verify ID`, `audit prune [--older-than DUR] [ID]`.
pub(super) fn audit(
    cli: &Cli,
    json: bool,
    older_than: Option<&str>,
    args: Vec<String>,
) -> Result<Outcome, CliError> {
    if args.first().is_some_and(|a| a == "prune") && args.len() <= 2 {
        prune(cli, older_than, &args)?;
        return Ok(Outcome::Exit(0));
    }
    if older_than.is_some() {
        return Err(CliError::OlderThanWithoutPrune);
    }
    let (verify, id) = match args.as_slice() {
        [id] => (false, id),
        [verb, id] if verb == "verify" => (true, id),
        _ => return Err(CliError::AuditArgs { args }),
    };
    let found = crate::report::find::find(cli.root.as_deref(), cli.audit_dir.as_deref(), id)?;
    let (runtime, id) = (Runtime::new(Some(&found.root))?, found.id);
    let log = crate::report::audit::locate(&runtime.dirs, &id, cli.audit_dir.as_deref())?;
    if !log.exists() {
        return Err(CliError::NoAuditLog {
            id: id.to_string(),
            path: log,
        });
    }
    if verify {
        let report = agent_sandbox_audit::verify(&log)?;
        if let Some(seq) = report.truncated {
            println!(
                "{}: {} records, chain intact (head {}), TRUNCATED: the log reached its size cap at record {seq}; \
                 later records of the sandbox are only counted in summary records (docs/audit.md#verifying-a-log)",
                log.display(),
                report.records,
                report.head
            );
            return Ok(Outcome::Exit(VERIFY_TRUNCATED));
        }
        println!(
            "{}: {} records, chain intact (head {})",
            log.display(),
            report.records,
            report.head
        );
    } else {
        let pod = crate::report::audit::pod_log(&runtime.dirs, &id, cli.audit_dir.as_deref());
        print!("{}", crate::report::audit::show(&log, pod.as_ref(), json)?);
    }
    Ok(Outcome::Exit(0))
}

/// `audit prune [--older-than DUR] [ID]`: `args` is `["prune"]` or `["prune", ID]`.
fn prune(cli: &Cli, older_than: Option<&str>, args: &[String]) -> Result<(), CliError> {
    let age = crate::report::audit::parse_age(older_than.unwrap_or("0s"))?;
    // An ID is found as every other command finds one (any name an engine showed, without
    // `--root`); without one, the logs of `--root` (or the default root) are pruned.
    let (runtime, only) = match args.get(1) {
        Some(key) => {
            let found =
                crate::report::find::find(cli.root.as_deref(), cli.audit_dir.as_deref(), key)?;
            (Runtime::new(Some(&found.root))?, Some(found.id))
        }
        None => (cli.runtime()?, None),
    };
    let dir = match &only {
        Some(id) => crate::sidecars::trail::dir_of(&runtime.dirs, id, cli.audit_dir.as_deref()),
        None => cli
            .audit_dir
            .clone()
            .unwrap_or_else(|| crate::sidecars::trail::dir(&runtime.dirs)),
    };
    let p = crate::report::audit::prune(&runtime.dirs, &dir, age, only.as_ref())?;
    for path in &p.removed {
        println!("removed {}", path.display());
    }
    println!(
        "{} removed, {} kept (sandbox live), {} kept (newer than the cut-off)",
        p.removed.len(),
        p.live.len(),
        p.recent.len()
    );
    Ok(())
}

/// `audit-exit`: the shim reports a reaped process of the sandbox (an `exit` record).
pub(super) fn audit_exit(
    cli: &Cli,
    id: &str,
    process: String,
    pid: Option<i32>,
    status: i32,
) -> Result<(), CliError> {
    let id = ContainerId::try_from(id)?;
    let runtime = cli.runtime()?;
    if !runtime.dirs.sandbox(&id).exists() {
        return Err(crate::lifecycle::LookupError::NotExist { id }.into());
    }
    crate::sidecars::trail::exited(
        &runtime.dirs,
        &id,
        &crate::sidecars::trail::ExitReport {
            process,
            pid,
            status: agent_sandbox_audit::ExitStatus::from_folded(status),
            reaped_by: None,
        },
    )?;
    Ok(())
}

/// `layers ID`: the protections in force, as JSON.
pub(super) fn layers(cli: &Cli, id: &str) -> Result<(), CliError> {
    let found = crate::report::find::find(cli.root.as_deref(), cli.audit_dir.as_deref(), id)?;
    let report = Runtime::new(Some(&found.root))?.layers(&found.id)?;
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    println!("{}", agent_sandbox_audit::escape::json_for_terminal(&json));
    Ok(())
}

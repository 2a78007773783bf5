//! `agent-sandbox promote ID --to DIR [--dry-run]`: applies a sandbox's reviewed workspace
//! changes to a host directory (the engine is `agent_sandbox_audit::promote`; this is the
//! command: which names are protected, the printed plan, the `promoted` audit record).
//! User documentation: docs/promote.md.

use std::io::Write;
use std::path::{Path, PathBuf};

use agent_sandbox_audit::escape::escape_path;
use agent_sandbox_audit::layout::human;
use agent_sandbox_audit::promote::{self, PromoteError, Rules};

use crate::harden::Ceiling;
use crate::lifecycle::{LifecycleError, Runtime};
use crate::state::ContainerId;

/// Errors of the `promote` command.
#[derive(Debug, thiserror::Error)]
pub enum PromoteCmdError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("cannot read the workspace changes")]
    Scratch(#[from] agent_sandbox_audit::ScratchError),
    #[error(transparent)]
    Promote(#[from] PromoteError),
    #[error("policy")]
    Policy(#[from] crate::harden::SandboxError),
    #[error(
        "promote refused {count} of the sandbox's changes; nothing was applied (docs/promote.md)"
    )]
    Refused { count: usize },
    #[error(
        "sandbox {id} has no audit log at {}; promote records what it applies there",
        escape_path(path)
    )]
    NoAuditLog { id: String, path: PathBuf },
    #[error(
        "the change set is {actual}, not the reviewed {expected}: the sandbox or the target changed since the review; nothing was applied (docs/promote.md)"
    )]
    DigestMismatch { expected: String, actual: String },
    #[error(
        "the sandbox's changes or the target changed while being promoted; nothing was applied (docs/promote.md)"
    )]
    ChangedMeanwhile,
    #[error("cannot write the promoted record")]
    Audit(#[from] agent_sandbox_audit::AuditError),
    #[error("cannot print")]
    Print(#[from] std::io::Error),
}

/// What `promote` was asked.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub id: &'a ContainerId,
    pub to: &'a Path,
    pub dry_run: bool,
    /// `--digest`: apply only this reviewed change set (from a dry run's first line).
    pub digest: Option<&'a str>,
    /// `--policy` / `AGENT_SANDBOX_POLICY`.
    pub policy: Option<&'a Path>,
    /// `--audit-dir`.
    pub audit_dir: Option<&'a Path>,
}

/// The names promotion refuses at any depth: the protected names of the default profile,
/// of the admin's policy and of the policy the sandbox was created under (the mandatory ones
/// are in each). A policy that protects all of `.git/` (`strict`) refuses every `.git` change.
/// `sandbox_dir` is the sandbox's state dir, where its create saved the policy it ran under.
pub fn rules(
    sandbox_dir: &crate::state::SandboxDir,
    req: &Request<'_>,
) -> Result<Rules, PromoteCmdError> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |p: &agent_sandbox_policy::SandboxPolicy| {
        names.extend(
            p.filesystem
                .protected_names()
                .iter()
                .map(ToString::to_string),
        );
    };
    // The default profile's names always count: promotion must not depend on which policy
    // a caller happens to pass.
    add(
        &agent_sandbox_policy::SandboxPolicy::builtin(crate::harden::DEFAULT_PROFILE)
            .map_err(crate::harden::SandboxError::Policy)?,
    );
    add(&Ceiling::load(req.policy)?.policy);
    if let Ok(saved) = Ceiling::load_saved(sandbox_dir) {
        add(&saved.policy);
    }
    Ok(Rules::new(names.iter().map(String::as_str)))
}

/// Runs the command, printing the plan to `out`.
pub fn run(rt: &Runtime, req: &Request<'_>, out: &mut impl Write) -> Result<(), PromoteCmdError> {
    let source = crate::report::review::source(rt, req.id)?;
    let changes = source.changes()?;
    let rules = rules(&source.dirs.sandbox(&source.container), req)?;
    // The key may be a short id, a name or a change id: the log is the container's own.
    let log = crate::report::audit::locate(&source.dirs, &source.container, req.audit_dir)?;
    if !req.dry_run && !log.exists() {
        return Err(PromoteCmdError::NoAuditLog {
            id: source.container.to_string(),
            path: log,
        });
    }
    let limit = crate::report::review::size_limit(&source, req.policy)?;
    // The check runs without touching the target; only a clean plan is staged.
    let checked = promote::prepare(&source.upper, &changes, req.to, &rules, false, &limit)?;
    let plan = &checked;
    writeln!(
        out,
        "{} {} -> {} ({} entries, change set {})",
        if req.dry_run { "plan for" } else { "promote" },
        req.id,
        escape_path(req.to),
        plan.entries.len(),
        plan.digest
    )?;
    for e in &plan.entries {
        writeln!(out, "  {}", e.describe())?;
    }
    writeln!(
        out,
        "writes {} of file data in {} files with {} names (holes and hard links kept; a copy that fills holes and breaks links: {}); limit {}, {}",
        human(plan.footprint.data),
        plan.footprint.files,
        plan.footprint.names,
        human(plan.footprint.naive),
        human(limit.bytes),
        limit.source
    )?;
    for (path, why) in &plan.refused {
        writeln!(out, "refused /{}: {why}", escape_path(path))?;
        tracing::info!(
            id = %req.id,
            path = %escape_path(path),
            reason = %why,
            "promote refused an entry"
        );
    }
    if !plan.refused.is_empty() {
        return Err(PromoteCmdError::Refused {
            count: plan.refused.len(),
        });
    }
    if let Some(expected) = req.digest
        && expected != plan.digest
    {
        return Err(PromoteCmdError::DigestMismatch {
            expected: expected.to_owned(),
            actual: plan.digest.clone(),
        });
    }
    if req.dry_run {
        writeln!(out, "dry run: nothing was changed")?;
        return Ok(());
    }
    // Staging reads every file again: what it staged must be what was checked and printed.
    let printed = checked.digest.clone();
    drop(checked);
    let plan = promote::prepare(&source.upper, &changes, req.to, &rules, true, &limit)?;
    if !plan.refused.is_empty() || plan.digest != printed {
        return Err(PromoteCmdError::ChangedMeanwhile);
    }
    let audit = agent_sandbox_audit::AuditLog::open(&log, source.container.as_str())?;
    match promote::apply(&plan) {
        Ok(applied) => {
            audit.append(&plan.event(&applied, true))?;
            writeln!(
                out,
                "promoted {} entries to {}; recorded in {}",
                applied.len(),
                escape_path(plan.target()),
                escape_path(&log)
            )?;
            // Kept until promoted or discarded: an ended sandbox's change set goes now. Its
            // review mount is released first; a live sandbox keeps its own.
            let change = source.change.clone();
            drop(source);
            if let Some(change) = change {
                forget_promoted(&change, out)?;
            }
            Ok(())
        }
        Err(e) => {
            if let PromoteError::Partial { applied, .. } = &e {
                writeln!(out, "applied before the failure:")?;
                for p in applied {
                    writeln!(out, "  /{}", escape_path(p))?;
                }
                if let Err(e) = audit.append(&plan.event(applied, false)) {
                    tracing::error!(error = %e, "cannot record the incomplete promotion");
                }
            }
            Err(e.into())
        }
    }
}

/// Drops change set `change` after a complete promotion, unless its sandbox still runs.
/// A set that cannot be removed stays listed (`agent-sandbox changes`) and is said so.
fn forget_promoted(change: &str, out: &mut impl Write) -> std::io::Result<()> {
    use crate::report::changes::{ChangesError, Store, discard};
    match Store::locate().and_then(|store| discard(&store, change)) {
        Ok(_) => writeln!(out, "change set {change} promoted and discarded"),
        Err(ChangesError::Live { .. }) => Ok(()),
        Err(e) => {
            tracing::warn!(change, error = %e, "promoted change set not discarded");
            writeln!(
                out,
                "change set {change} promoted but kept: {e} (`agent-sandbox changes discard {change}`)"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_audit::FileKind;

    #[test]
    fn rules_hold_the_default_profiles_names_and_a_strict_policy_protects_all_of_git()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let rt = Runtime::new(Some(dir.path()))?;
        let id = ContainerId::try_from("pr-rules")?;
        let mut req = Request {
            id: &id,
            to: dir.path(),
            dry_run: true,
            digest: None,
            policy: None,
            audit_dir: None,
        };
        let r = rules(&rt.dirs.sandbox(&id), &req)?;
        for p in [
            "pkg/.envrc",
            "a/.git/hooks/x",
            ".mcp.json",
            "x/.cargo/config.toml",
        ] {
            assert!(
                r.check(Path::new(p), FileKind::File, false).is_some(),
                "{p}"
            );
        }
        assert_eq!(
            r.check(Path::new(".git/index"), FileKind::File, false),
            None
        );
        req.policy = Some(Path::new("strict"));
        let strict = rules(&rt.dirs.sandbox(&id), &req)?;
        assert!(
            strict
                .check(Path::new(".git/index"), FileKind::File, false)
                .is_some()
        );
        Ok(())
    }
}

//! `agent-sandbox promote ID --to DIR [--dry-run] [--advance]`: applies a sandbox's reviewed
//! workspace changes to a host directory (the engines are `agent_sandbox_audit::promote` for
//! files and `agent_sandbox_audit::history` for commits; this is the command: which names are
//! protected, the printed plan, the `promoted` audit record).
//! User documentation: docs/promote.md.

use std::io::Write;
use std::path::{Path, PathBuf};

use agent_sandbox_audit::escape::escape_path;
use agent_sandbox_audit::history::{self, History, HistoryError};
use agent_sandbox_audit::layout::human;
use agent_sandbox_audit::promote::{self, PromoteError, Rules};

use crate::harden::Ceiling;
use crate::lifecycle::WorkspaceError;
use crate::report::find::Found;

/// Errors of the `promote` command.
#[derive(Debug, thiserror::Error)]
pub enum PromoteCmdError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error("cannot read the workspace changes")]
    Scratch(#[from] agent_sandbox_audit::ScratchError),
    #[error(transparent)]
    Promote(#[from] PromoteError),
    #[error(transparent)]
    History(#[from] HistoryError),
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
    /// The sandbox the key named (`crate::report::find`).
    pub found: &'a Found,
    pub to: &'a Path,
    pub dry_run: bool,
    /// `--digest`: apply only this reviewed change set (from a dry run's first line).
    pub digest: Option<&'a str>,
    /// `--policy` / `AGENT_SANDBOX_POLICY`.
    pub policy: Option<&'a Path>,
    /// `--audit-dir`.
    pub audit_dir: Option<&'a Path>,
    /// `--advance`: fast-forward the target's current branch to the agent's commit for it.
    pub advance: bool,
    /// `--include-ignored`: also promote what the checkout's `.gitignore` files ignore.
    pub include_ignored: bool,
}

/// The names promotion refuses at any depth: the protected names of the default profile,
/// of the admin's policy and of the policy the sandbox was created under (the mandatory ones
/// are in each). A policy that protects all of `.git/` (`strict`) refuses every `.git` change.
/// `sandbox_dir` is the sandbox's state dir, where its create saved the policy it ran under.
/// `policy` is the ceiling (`--policy`, `AGENT_SANDBOX_POLICY`).
pub fn rules(
    sandbox_dir: &crate::state::SandboxDir,
    policy: Option<&Path>,
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
    add(&Ceiling::load(policy)?.policy);
    if let Ok(saved) = Ceiling::load_saved(sandbox_dir) {
        add(&saved.policy);
    }
    // The policy the sandbox ran under, with an admin profile's own names.
    if let Ok(Some(plan)) = sandbox_dir
        .plan()
        .read_if_present::<agent_sandbox_policy::SandboxPlan>()
    {
        add(&plan.policy);
    }
    Ok(Rules::new(names.iter().map(String::as_str)))
}

/// Runs the command, printing the plan to `out`: the check, the plan printed, the refusals,
/// then (unless a dry run) the staging and the apply.
pub fn run(req: &Request<'_>, out: &mut impl Write) -> Result<(), PromoteCmdError> {
    let checked = check(req)?;
    print_plan(req, &checked, out)?;
    refuse(req, &checked, out)?;
    if req.dry_run {
        writeln!(out, "dry run: nothing was changed")?;
        return Ok(());
    }
    stage_and_apply(req, checked, out)
}

/// What the check found, before anything is staged: the plan a dry run prints.
struct Checked {
    source: crate::report::review::ChangeSource,
    /// The changes to promote (without the ignored ones unless asked).
    changes: Vec<agent_sandbox_audit::Change>,
    /// How many entries the checkout's `.gitignore` files ignore.
    ignored: usize,
    rules: Rules,
    /// The sandbox's audit log, where the `promoted` record goes.
    log: PathBuf,
    limit: agent_sandbox_audit::SizeLimit,
    /// The files' plan, checked without touching the target.
    plan: promote::Plan,
    hist: History,
    /// The change set's digest: the one a dry run prints and `--digest` binds.
    digest: String,
}

/// The check: the changes, the rules, the log and the limit, and the files' and history's
/// plans, without touching the target.
fn check(req: &Request<'_>) -> Result<Checked, PromoteCmdError> {
    let source = crate::report::review::source(req.found)?;
    let all = source.changes()?;
    // What the checkout ignores (`__pycache__`, build output) stays out unless asked.
    let ignored = source.ignored(&all)?;
    let changes: Vec<_> = if req.include_ignored {
        all
    } else {
        ignored.without(&all).into_iter().cloned().collect()
    };
    let rules = rules(&source.dirs.sandbox(&source.container), req.policy)?;
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
    let plan = promote::prepare(&source.upper, &changes, req.to, &rules, false, &limit)?;
    // The history comes back as commits under refs/agent-sandbox/CHANGE/ (or the sandbox's
    // id when it has no kept change set).
    let namespace = source
        .change
        .clone()
        .unwrap_or_else(|| source.container.to_string());
    let hist = history::prepare(
        &source.upper,
        &changes,
        req.to,
        &rules,
        &history::Options {
            namespace: &namespace,
            advance: req.advance,
            max_bytes: limit.bytes,
        },
    )?;
    let digest = change_set_digest(&plan.digest, &hist);
    Ok(Checked {
        source,
        changes,
        ignored: ignored.paths.len(),
        rules,
        log,
        limit,
        plan,
        hist,
        digest,
    })
}

/// The plan as the developer reviews it: entries, history, the ignored ones, the footprint.
fn print_plan(req: &Request<'_>, c: &Checked, out: &mut impl Write) -> Result<(), PromoteCmdError> {
    let plan = &c.plan;
    writeln!(
        out,
        "{} {} -> {} ({} entries, change set {})",
        if req.dry_run { "plan for" } else { "promote" },
        c.source.container,
        escape_path(req.to),
        plan.entries.len(),
        c.digest
    )?;
    for e in &plan.entries {
        writeln!(out, "  {}", e.describe())?;
    }
    if c.ignored > 0 {
        writeln!(
            out,
            "  ({} entries the checkout's .gitignore ignores are {}: `diff --ignored` lists them)",
            c.ignored,
            if req.include_ignored {
                "included (--include-ignored)"
            } else {
                "left out (--include-ignored promotes them)"
            }
        )?;
    }
    describe_history(&c.hist, out)?;
    writeln!(
        out,
        "writes {} of file data in {} files with {} names (holes and hard links kept; a copy that fills holes and breaks links: {}); limit {}, {}",
        human(plan.footprint.data),
        plan.footprint.files,
        plan.footprint.names,
        human(plan.footprint.naive),
        human(c.limit.bytes),
        c.limit.source
    )?;
    Ok(())
}

/// The refusals, printed and logged: any refuses the whole promotion, and so does a
/// `--digest` other than the change set's.
fn refuse(req: &Request<'_>, c: &Checked, out: &mut impl Write) -> Result<(), PromoteCmdError> {
    for (path, why) in &c.plan.refused {
        writeln!(out, "refused /{}: {why}", escape_path(path))?;
        tracing::info!(
            id = %c.source.container,
            path = %escape_path(path),
            reason = %why,
            "promote refused an entry"
        );
    }
    for r in &c.hist.refused {
        writeln!(out, "refused {r}")?;
        tracing::info!(id = %c.source.container, refusal = %r, "promote refused part of the history");
    }
    if !c.plan.refused.is_empty() || !c.hist.refused.is_empty() {
        return Err(PromoteCmdError::Refused {
            count: c.plan.refused.len() + c.hist.refused.len(),
        });
    }
    if let Some(expected) = req.digest
        && expected != c.digest
    {
        return Err(PromoteCmdError::DigestMismatch {
            expected: expected.to_owned(),
            actual: c.digest.clone(),
        });
    }
    Ok(())
}

/// Stages the checked plan again, then writes the history's objects and refs, the files
/// and the fast-forward, and records the `promoted` event (an incomplete one on a failure).
fn stage_and_apply(
    req: &Request<'_>,
    c: Checked,
    out: &mut impl Write,
) -> Result<(), PromoteCmdError> {
    let Checked {
        source,
        changes,
        rules,
        log,
        limit,
        plan: checked,
        hist,
        digest,
        ..
    } = c;
    // Staging reads every file again: what it staged must be what was checked and printed.
    let printed = checked.digest.clone();
    drop(checked);
    let plan = promote::prepare(&source.upper, &changes, req.to, &rules, true, &limit)?;
    if !plan.refused.is_empty() || plan.digest != printed {
        return Err(PromoteCmdError::ChangedMeanwhile);
    }
    let audit = agent_sandbox_audit::AuditLog::open(&log, source.container.as_str())?;
    // Objects and quarantine refs first (they change nothing the developer uses), then the
    // files, then the checked fast-forward.
    let refs = hist.write()?;
    let promoted = |applied: &[PathBuf], complete: bool| {
        let mut event = plan.event(applied, complete);
        if let agent_sandbox_audit::Event::Promoted {
            paths, digest: d, ..
        } = &mut event
        {
            // The digest the dry run printed: files and history.
            d.clone_from(&digest);
            paths.extend(refs.iter().map(|r| format!("R {r}")));
        }
        event
    };
    match promote::apply(&plan) {
        Ok(applied) => {
            // Recorded whether or not the fast-forward still holds: files and refs are in.
            let advanced = hist.advance();
            let mut event = promoted(&applied, true);
            if let (agent_sandbox_audit::Event::Promoted { paths, .. }, Ok(Some(a))) =
                (&mut event, &advanced)
            {
                paths.push(format!("R {} {}", a.branch, a.to));
            }
            audit.append(&event)?;
            let advanced = advanced?;
            for r in &refs {
                writeln!(out, "wrote {r}")?;
            }
            if let Some(a) = advanced {
                writeln!(
                    out,
                    "advanced {} to {}; the index still holds the old commit: `git reset` there updates it without touching a file (docs/promote.md#advance)",
                    a.branch,
                    a.to.to_hex_with_len(7)
                )?;
            }
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
                if let Err(e) = audit.append(&promoted(applied, false)) {
                    tracing::error!(error = %e, "cannot record the incomplete promotion");
                }
            }
            Err(e.into())
        }
    }
}

/// The digest the dry run prints and `--digest` binds: the files' alone when no history comes
/// back, else one over both.
fn change_set_digest(files: &str, hist: &History) -> String {
    if hist.refs.is_empty() && hist.refused.is_empty() {
        return files.to_owned();
    }
    use sha2::Digest as _;
    let mut d = sha2::Sha256::new();
    d.update(format!("files {files}\nhistory {}\n", hist.digest).as_bytes());
    format!("sha256:{}", hex::encode(d.finalize()))
}

/// The history part of the plan: commits (subjects escaped), refs, the fast-forward.
fn describe_history(hist: &History, out: &mut impl Write) -> std::io::Result<()> {
    if hist.not_carried > 0 {
        writeln!(
            out,
            "  ({} entries below .git are not copied: the history comes back as commits)",
            hist.not_carried
        )?;
    }
    if hist.refs.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "history: {} new commits, {} refs",
        hist.commits.len(),
        hist.refs.len()
    )?;
    for c in &hist.commits {
        writeln!(out, "  {}", c.describe())?;
    }
    for r in &hist.refs {
        writeln!(
            out,
            "  ref     {} -> {} (the sandbox's {})",
            r.quarantine,
            r.oid.to_hex_with_len(7),
            r.agent
        )?;
    }
    if let Some(a) = &hist.advance {
        writeln!(
            out,
            "  advance {} {} -> {}",
            a.branch,
            a.from.map_or_else(
                || "(unborn)".to_owned(),
                |f| f.to_hex_with_len(7).to_string()
            ),
            a.to.to_hex_with_len(7)
        )?;
    }
    Ok(())
}

/// Drops change set `change` after a complete promotion, unless its sandbox still runs.
/// A set that cannot be removed stays listed (`agent-sandbox changes`) and is said so.
fn forget_promoted(change: &str, out: &mut impl Write) -> std::io::Result<()> {
    use crate::report::changes::{ChangesError, Entry, Store, discard};
    match Store::locate()
        .and_then(|store| Entry::load(&store.dir.join(change)))
        .and_then(discard)
    {
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
        let rt = crate::lifecycle::Runtime::new(Some(dir.path()))?;
        let id = crate::state::ContainerId::try_from("pr-rules")?;
        let found = Found {
            root: dir.path().to_owned(),
            id: id.clone(),
            change: None,
        };
        let mut req = Request {
            found: &found,
            to: dir.path(),
            dry_run: true,
            digest: None,
            policy: None,
            audit_dir: None,
            advance: false,
            include_ignored: false,
        };
        let r = rules(&rt.dirs.sandbox(&id), req.policy)?;
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
        let strict = rules(&rt.dirs.sandbox(&id), req.policy)?;
        assert!(
            strict
                .check(Path::new(".git/index"), FileKind::File, false)
                .is_some()
        );
        Ok(())
    }
}

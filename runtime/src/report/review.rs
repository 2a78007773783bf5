//! Review of a sandbox's workspace changes: where they are read from (one place for
//! `diff`, `export` and `promote`), and the human views of them. Names come from the agent,
//! so every name printed here is escaped (`agent_sandbox_audit::escape`).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use agent_sandbox_audit::escape::escape_path;
use agent_sandbox_audit::history::{self, History, HistoryError, is_history_path};
use agent_sandbox_audit::ignore::Ignored;
use agent_sandbox_audit::layout::human;
use agent_sandbox_audit::{Change, ExportSummary, Footprint, ScratchError, SizeLimit};

use crate::harden::{Ceiling, SandboxError};

use std::sync::Arc;

use crate::lifecycle::{Runtime, WorkspaceError};
use crate::report::changes::ReviewMount;
use crate::report::find::Found;
use crate::state::ContainerId;
use crate::state::StateDirs;

/// Where a sandbox's workspace changes are read from.
#[derive(Debug, Clone)]
pub struct ChangeSource {
    /// The overlay's upper dir: what the sandbox wrote.
    pub upper: PathBuf,
    /// The layer the overlay was mounted over, when it can still be read (it tells added
    /// from modified).
    pub lower: Option<PathBuf>,
    /// The container the changes belong to, as its entry point named it (the key the
    /// caller gave may be a short id, a name or a change id).
    pub container: ContainerId,
    /// The state root that container ran under (its audit log and saved policy are there).
    pub dirs: StateDirs,
    /// The kept change set (`crate::report::changes`) holding `upper`, if the sandbox had one.
    pub change: Option<String>,
    /// The size of the change set's quota image (`workspace_size`), when it had one.
    pub quota_bytes: Option<u64>,
    /// Keeps an ended change set's image mounted while `upper` is read.
    _held: Option<Arc<ReviewMount>>,
}

impl ChangeSource {
    /// The sandbox's changes as `diff` lists them.
    pub fn changes(&self) -> Result<Vec<Change>, agent_sandbox_audit::ScratchError> {
        agent_sandbox_audit::diff(&self.upper, self.lower.as_deref())
    }

    /// Which of `changes` the checkout's `.gitignore` files ignore (host's and the change
    /// set's, read as data: `agent_sandbox_audit::ignore`).
    pub fn ignored(&self, changes: &[Change]) -> Result<Ignored, ScratchError> {
        agent_sandbox_audit::ignore::ignored(&self.upper, self.lower.as_deref(), changes)
    }

    /// The agent's history in `changes` as `promote` would bring it back to the host
    /// checkout the workspace came from (its lower layer): new commits and refusals. `None`
    /// when the change set has nothing below `.git`.
    pub fn history(
        &self,
        changes: &[Change],
        rules: &agent_sandbox_audit::promote::Rules,
        limit: &SizeLimit,
    ) -> Option<Result<History, HistoryError>> {
        if !changes.iter().any(|c| is_history_path(&c.path)) {
            return None;
        }
        let Some(lower) = self.lower.as_deref() else {
            return Some(Err(HistoryError::Target {
                path: self.upper.clone(),
                why: "the layer the workspace was mounted over is gone, so there is nothing to \
                      compare the commits with"
                    .to_owned(),
            }));
        };
        let namespace = self
            .change
            .clone()
            .unwrap_or_else(|| self.container.to_string());
        Some(history::prepare(
            &self.upper,
            changes,
            lower,
            rules,
            &history::Options {
                namespace: &namespace,
                advance: false,
                max_bytes: limit.bytes,
            },
        ))
    }
}

/// Errors of `diff`.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("cannot read the workspace changes")]
    Scratch(#[from] ScratchError),
    #[error("policy")]
    Policy(#[from] SandboxError),
    #[error(transparent)]
    Rules(#[from] crate::report::promote::PromoteCmdError),
    #[error("cannot print")]
    Print(#[from] std::io::Error),
}

/// What `diff` shows of the files: one line each, `--stat` or `--patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// `A /path (file)` lines, and the size on the target.
    #[default]
    List,
    /// Lines added and removed per file, and totals.
    Stat,
    /// A unified diff of each file against the host's, escaped.
    Patch,
}

/// What `diff` was asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiffRequest<'a> {
    pub view: View,
    /// `--ignored`: list the ignored changes one by one too.
    pub list_ignored: bool,
    /// `--policy` / `AGENT_SANDBOX_POLICY`: the ceiling (size limit, protected names).
    pub policy: Option<&'a Path>,
}

/// `diff`: the files of the change set that `promote` would bring (as lines, `--stat` or
/// `--patch`), the agent's history as commits, then the ignored files apart; everything
/// the sandbox wrote is escaped.
pub fn write_diff(
    source: &ChangeSource,
    req: &DiffRequest<'_>,
    out: &mut impl Write,
) -> Result<(), ReviewError> {
    let changes = source.changes()?;
    let ignored = source.ignored(&changes)?;
    let files: Vec<Change> = changes
        .iter()
        .filter(|c| {
            !is_history_path(&c.path) && c.path != Path::new(".git") && !ignored.contains(&c.path)
        })
        .cloned()
        .collect();
    let promoted: Vec<Change> = changes
        .iter()
        .filter(|c| !ignored.contains(&c.path))
        .cloned()
        .collect();
    // Measuring opens each file (no read): a file this user cannot open still gets its line.
    let footprint = agent_sandbox_audit::layout::footprint(&source.upper, &promoted);
    let mut first = HashMap::new();
    let limit = size_limit(source, req.policy)?;
    match req.view {
        View::List => {
            for c in &files {
                let mut line = diff_line(c);
                if let Ok(fp) = &footprint {
                    line.push_str(&link_note(c, fp, &mut first));
                }
                writeln!(out, "{line}")?;
            }
        }
        View::Stat | View::Patch => {
            let patches = agent_sandbox_audit::patch::patches(
                &source.upper,
                source.lower.as_deref(),
                &files,
            )?;
            if req.view == View::Stat {
                for line in agent_sandbox_audit::patch::stat_lines(&patches) {
                    writeln!(out, "{line}")?;
                }
            } else {
                for p in &patches {
                    out.write_all(p.text.as_bytes())?;
                }
            }
        }
    }
    write_history_and_ignored(source, &changes, &ignored, req, &limit, out)?;
    // What promote measures against the limit: everything it would read (history too).
    match &footprint {
        Ok(fp) => writeln!(out, "{}", size_line(fp, &limit))?,
        Err(e) => writeln!(
            out,
            "# size on the target: not measured ({})",
            agent_sandbox_proxy::error_text::chain(e)
        )?,
    }
    Ok(())
}

/// The history as commits (`commit abc1234 SUBJECT`, escaped) and the ignored files apart.
fn write_history_and_ignored(
    source: &ChangeSource,
    changes: &[Change],
    ignored: &Ignored,
    req: &DiffRequest<'_>,
    limit: &SizeLimit,
    out: &mut impl Write,
) -> Result<(), ReviewError> {
    let below_git = changes.iter().filter(|c| is_history_path(&c.path)).count();
    let rules = crate::report::promote::rules(&source.dirs.sandbox(&source.container), req.policy)?;
    match source.history(changes, &rules, limit) {
        None => {}
        Some(Ok(h)) => {
            writeln!(
                out,
                "# history: {} new commits ({below_git} entries below .git are not listed: promote brings the commits back, never .git files)",
                h.commits.len()
            )?;
            for c in &h.commits {
                writeln!(out, "{}", c.describe())?;
            }
            for r in &h.refs {
                writeln!(
                    out,
                    "ref {} -> {} (promote writes it as {})",
                    r.agent,
                    r.oid.to_hex_with_len(7),
                    r.quarantine
                )?;
            }
            for r in &h.refused {
                writeln!(out, "refused {r}")?;
            }
        }
        Some(Err(e)) => writeln!(
            out,
            "# history: {below_git} entries below .git, not read as commits: {}",
            agent_sandbox_proxy::error_text::chain(&e)
        )?,
    }
    if !ignored.paths.is_empty() {
        let shapes = agent_sandbox_audit::ignore::shapes(&ignored.paths, 5)
            .into_iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "# ignored: {} entries the checkout's .gitignore ignores ({shapes}); promote leaves them out unless --include-ignored{}",
            ignored.paths.len(),
            if req.list_ignored {
                ""
            } else {
                " (diff --ignored lists them)"
            }
        )?;
        if req.list_ignored {
            for c in changes.iter().filter(|c| ignored.contains(&c.path)) {
                writeln!(out, "ignored {}", diff_line(c))?;
            }
        }
    }
    for (path, why) in &ignored.skipped {
        writeln!(
            out,
            "# not read: /{} ({why}); its rules do not count",
            escape_path(path)
        )?;
    }
    Ok(())
}

/// The one place `diff`, `export` and `promote` find a sandbox's changes: those of the
/// sandbox the shared resolver found (`crate::report::find`), live or kept.
pub fn source(found: &Found) -> Result<ChangeSource, WorkspaceError> {
    let rt = Runtime::new(Some(&found.root))?;
    let id = &found.id;
    let ws = rt.workspace(id, found.change.as_deref())?;
    let record = ws
        .change_dir
        .as_deref()
        .and_then(|dir| crate::report::changes::Entry::load(dir).ok())
        .map(|e| e.record);
    let quota_bytes = record.as_ref().and_then(|r| r.quota_bytes);
    let (container, dirs) = match record {
        Some(r) => (
            ContainerId::try_from(r.container.as_str()).unwrap_or_else(|_| id.clone()),
            StateDirs::new(r.root),
        ),
        None => (id.clone(), rt.dirs.clone()),
    };
    let lower = ws.lower.is_dir().then_some(ws.lower);
    Ok(ChangeSource {
        upper: ws.upper,
        lower,
        container,
        dirs,
        change: ws.change,
        quota_bytes,
        _held: ws.held,
    })
}

/// The policy a sandbox ran under: its plan's, or, for a sandbox an older runtime created, its
/// saved ceiling.
fn ran_under(dir: &crate::state::SandboxDir) -> Option<agent_sandbox_policy::SandboxPolicy> {
    match dir
        .plan()
        .read_if_present::<agent_sandbox_policy::SandboxPlan>()
    {
        Ok(Some(plan)) => Some(plan.policy),
        _ => Ceiling::load_saved(dir).ok().map(|c| c.policy),
    }
}

/// The most `export` and `promote` may write for `source` (its files' data, holes kept,
/// each hard-linked file once), checked before anything is read: the sandbox's
/// `workspace_size` (its quota image, else the policy it ran under), and the ceiling policy's
/// (`--policy`, `AGENT_SANDBOX_POLICY`, else the `agent` profile), whichever is smaller: a
/// sandbox that had no quota gets the ceiling's, and a policy without one the default
/// profile's (docs/promote.md#size).
pub fn size_limit(source: &ChangeSource, policy: Option<&Path>) -> Result<SizeLimit, SandboxError> {
    let mut limits: Vec<(u64, String)> = Vec::new();
    if let Some(bytes) = source.quota_bytes {
        limits.push((bytes, "the sandbox's workspace_size".to_owned()));
    } else if let Some(size) =
        ran_under(&source.dirs.sandbox(&source.container)).and_then(|p| p.filesystem.workspace_size)
    {
        limits.push((
            size.bytes(),
            "the workspace_size of the policy the sandbox ran under".to_owned(),
        ));
    }
    let ceiling = Ceiling::load(policy)?;
    if let Some(size) = ceiling.policy.filesystem.workspace_size {
        limits.push((
            size.bytes(),
            format!("the workspace_size of the {} policy", ceiling.origin),
        ));
    }
    if limits.is_empty() {
        let default = Ceiling::load(None)?;
        let bytes = default
            .policy
            .filesystem
            .workspace_size
            .map_or(DEFAULT_LIMIT, |s| s.bytes());
        limits.push((
            bytes,
            format!(
                "the workspace_size of the default {} policy",
                default.origin
            ),
        ));
    }
    let (bytes, source) = limits
        .into_iter()
        .min_by_key(|(b, _)| *b)
        .unwrap_or((DEFAULT_LIMIT, "the default quota".to_owned()));
    Ok(SizeLimit { bytes, source })
}

/// The bound when no policy names one (the `agent` profile's `workspace_size`).
const DEFAULT_LIMIT: u64 = 4 << 30;

/// The `diff` lines of `changes`; a sparse file and each further name of a hard-linked file
/// say so (`footprint` from [`agent_sandbox_audit::layout::footprint`]), and the last line
/// is the size the change set takes on a target that keeps holes and hard links.
pub fn diff_lines(changes: &[Change], footprint: &Footprint, limit: &SizeLimit) -> Vec<String> {
    let mut first: HashMap<(u64, u64), &Path> = HashMap::new();
    let mut out = Vec::with_capacity(changes.len() + 1);
    for c in changes {
        let mut line = diff_line(c);
        line.push_str(&link_note(c, footprint, &mut first));
        out.push(line);
    }
    out.push(size_line(footprint, limit));
    out
}

/// ` hard link to /FIRST` for each further name of a file, ` sparse: ...` for a sparse one
/// (`first` remembers the first name of each file seen).
fn link_note<'a>(
    c: &'a Change,
    footprint: &Footprint,
    first: &mut HashMap<(u64, u64), &'a Path>,
) -> String {
    let Some(m) = footprint.file(&c.path) else {
        return String::new();
    };
    match first.get(&m.id) {
        Some(p) => format!(" hard link to /{}", escape_path(p)),
        None => {
            first.insert(m.id, &c.path);
            if m.data < m.size {
                format!(" sparse: {} bytes, {} of them data", m.size, m.data)
            } else {
                String::new()
            }
        }
    }
}

/// `# size on the target: ...`: what the files of a change set take with holes and hard
/// links kept, what a copy that fills holes and breaks links would write, and the limit.
pub fn size_line(fp: &Footprint, limit: &SizeLimit) -> String {
    format!(
        "# size on the target: {} of file data in {} files with {} names (a copy that fills holes and breaks links: {}); limit {}, {}",
        human(fp.data),
        fp.files,
        fp.names,
        human(fp.naive),
        human(limit.bytes),
        limit.source
    )
}

/// One `diff` line: `A /path (file)`, a symlink with its stored target; names escaped.
pub fn diff_line(c: &Change) -> String {
    let target = c
        .link_target
        .as_ref()
        .map(|t| format!(" -> {}", escape_path(t)))
        .unwrap_or_default();
    format!(
        "{} /{} ({}){target}",
        c.kind.letter(),
        escape_path(&c.path),
        c.file_type.name()
    )
}

/// What `export` prints: the counts, then each manifest entry (escaped; the manifest files
/// themselves keep the exact bytes).
pub fn write_export_summary(out: &mut impl Write, s: &ExportSummary) -> std::io::Result<()> {
    writeln!(
        out,
        "exported {} files ({} bytes of data, {} apparent; holes kept) and {} hard links, {} dirs, {} symlinks; {} deletions listed",
        s.files,
        s.bytes,
        s.apparent,
        s.links,
        s.dirs,
        s.symlinks,
        s.deleted.len()
    )?;
    for (what, list) in [
        ("deleted", &s.deleted),
        ("opaque", &s.opaque),
        ("skipped", &s.skipped),
    ] {
        for p in list {
            writeln!(out, "{what} /{}", escape_path(p))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_audit::{ChangeKind, FileKind};

    #[test]
    fn diff_lines_escape_names_and_link_targets() {
        let c = Change {
            path: PathBuf::from("ok\x1b[1A\x1b[2K.txt"),
            kind: ChangeKind::Added,
            file_type: FileKind::Symlink,
            size: 3,
            mode: 0o777,
            link_target: Some(PathBuf::from("\x1b]0;x\x07")),
        };
        let line = diff_line(&c);
        assert_eq!(
            line,
            "A /ok\\x1b[1A\\x1b[2K.txt (symlink) -> \\x1b]0;x\\x07"
        );
        assert!(!line.chars().any(char::is_control));
    }

    #[test]
    fn export_summary_escapes_manifest_entries() -> std::io::Result<()> {
        let s = ExportSummary {
            deleted: vec![PathBuf::from("a\rb")],
            skipped: vec![PathBuf::from("s\u{9b}2K")],
            ..ExportSummary::default()
        };
        let mut out = Vec::new();
        write_export_summary(&mut out, &s)?;
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("deleted /a\\x0db\n"), "{text}");
        assert!(text.contains("skipped /s\\u{009b}2K\n"), "{text}");
        Ok(())
    }

    #[test]
    fn diff_lines_mark_sparse_files_and_hard_links_and_end_with_the_size()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let upper = dir.path();
        let f = std::fs::File::create(upper.join("big.img"))?;
        f.set_len(8 << 30)?;
        std::fs::write(upper.join("a"), "x".repeat(5000))?;
        std::fs::hard_link(upper.join("a"), upper.join("b"))?;
        let changes = agent_sandbox_audit::diff(upper, None)?;
        let fp = agent_sandbox_audit::layout::footprint(upper, &changes)?;
        let limit = SizeLimit {
            bytes: 256 << 20,
            source: "the sandbox's workspace_size".to_owned(),
        };
        let lines = diff_lines(&changes, &fp, &limit);
        assert_eq!(
            lines,
            [
                "A /a (file)",
                "A /b (file) hard link to /a",
                "A /big.img (file) sparse: 8589934592 bytes, 0 of them data",
                "# size on the target: 4.8 KiB (5000 bytes) of file data in 2 files with 3 names \
                 (a copy that fills holes and breaks links: 8.0 GiB (8589944592 bytes)); \
                 limit 256.0 MiB (268435456 bytes), the sandbox's workspace_size",
            ]
        );
        Ok(())
    }
}

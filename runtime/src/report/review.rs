//! Review of a sandbox's workspace changes: where they are read from (one place for
//! `diff`, `export` and `promote`), and the human views of them. Names come from the agent,
//! so every name printed here is escaped (`agent_sandbox_audit::escape`).

use std::io::Write;
use std::path::PathBuf;

use agent_sandbox_audit::escape::escape_path;
use agent_sandbox_audit::{Change, ExportSummary};

use std::sync::Arc;

use crate::lifecycle::{LifecycleError, Runtime};
use crate::report::changes::ReviewMount;
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
    /// Keeps an ended change set's image mounted while `upper` is read.
    _held: Option<Arc<ReviewMount>>,
}

impl ChangeSource {
    /// The sandbox's changes as `diff` lists them.
    pub fn changes(&self) -> Result<Vec<Change>, agent_sandbox_audit::ScratchError> {
        agent_sandbox_audit::diff(&self.upper, self.lower.as_deref())
    }
}

/// The one place `diff`, `export` and `promote` find a sandbox's changes: the live sandbox
/// in this state root, else a kept change set found by any of its keys.
pub fn source(rt: &Runtime, id: &ContainerId) -> Result<ChangeSource, LifecycleError> {
    let ws = rt.workspace(id)?;
    let record = ws
        .change_dir
        .as_deref()
        .and_then(|dir| crate::report::changes::Entry::load(dir).ok())
        .map(|e| e.record);
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
        _held: ws.held,
    })
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
        "exported {} files ({} bytes), {} dirs, {} symlinks; {} deletions listed",
        s.files,
        s.bytes,
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
}

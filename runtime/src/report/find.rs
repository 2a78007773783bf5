//! Finding a sandbox for `audit` and `layers` by full id, unique id prefix (podman's short
//! id) or name (podman's `--name`, CRI's `POD/CONTAINER`), whatever entry point created it,
//! without `--root`.
//!
//! Each entry point gives the runtime its own state root: podman none (the default root),
//! the shim `/run/containerd/agent-sandbox/NAMESPACE`, dockerd
//! `EXEC_ROOT/runtime-runc/NAMESPACE`. Without `--root` every such root on this host is
//! searched, plus the roots the change store records (`crate::report::changes`). In each root a
//! sandbox is live (`sandbox/ID`) or ended with its log kept (`audit/ID.jsonl`). Names are
//! kept next to the logs (`audit/.names/ID`, written at create) so they outlive the sandbox.

use std::path::{Path, PathBuf};

use crate::state::ContainerId;
use crate::state::StateDirs;

const NAMES_DIR: &str = ".names";

/// A sandbox found: its state root and its full id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub root: PathBuf,
    pub id: ContainerId,
}

#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("no sandbox {key:?} (by id, unique id prefix or name) in {searched} (docs/audit.md#finding-a-sandbox)", searched = list(.searched))]
    NotFound { key: String, searched: Vec<PathBuf> },
    #[error("{key:?} names several sandboxes: {candidates}; give the full id (and --root ROOT)", candidates = .candidates.join("; "))]
    Ambiguous {
        key: String,
        candidates: Vec<String>,
    },
    #[error(transparent)]
    Paths(#[from] crate::state::paths::PathsError),
}

fn list(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "no state root".to_owned();
    }
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// At create: keeps the sandbox's human name (if it has one) next to its audit log.
pub fn remember(
    dirs: &StateDirs,
    id: &ContainerId,
    annotations: Option<&std::collections::HashMap<String, String>>,
) {
    let empty = std::collections::HashMap::new();
    let (_, name) = crate::report::changes::origin(annotations.unwrap_or(&empty), &dirs.root);
    let Some(name) = name else { return };
    let dir = crate::report::audit::dir_of(dirs, id, None).join(NAMES_DIR);
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    if let Err(e) = made.and_then(|()| std::fs::write(dir.join(id.as_str()), name.as_bytes())) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot keep the sandbox's name");
    }
}

/// Removes the kept name of `id` from the log directory `dir` (at `audit prune`).
pub fn forget(dir: &Path, id: &str) {
    let _ = std::fs::remove_file(dir.join(NAMES_DIR).join(id));
}

/// The state roots searched without `--root`, existing ones only, each once.
pub fn roots() -> Result<Vec<PathBuf>, FindError> {
    let mut out: Vec<PathBuf> = vec![crate::state::paths::state_root(None)?];
    let rootless = crate::state::paths::rootless().unwrap_or(true);
    if !rootless {
        for parent in [
            "/run/containerd/agent-sandbox",
            "/run/docker/runtime-runc",
            "/var/run/docker/runtime-runc",
        ] {
            if let Ok(rd) = std::fs::read_dir(parent) {
                let mut found: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                found.sort();
                out.extend(found);
            }
        }
    }
    if let Ok(store) = crate::report::changes::Store::locate() {
        out.extend(store.entries().into_iter().map(|e| e.record.root));
    }
    let mut seen = std::collections::HashSet::new();
    Ok(out
        .into_iter()
        .filter(|r| r.is_dir())
        .filter(|r| seen.insert(std::fs::canonicalize(r).unwrap_or_else(|_| r.clone())))
        .collect())
}

/// One sandbox a root knows, live or ended, with its kept name.
#[derive(Debug, Clone)]
struct Known {
    root: PathBuf,
    id: String,
    name: Option<String>,
}

fn known_in(root: &Path) -> Vec<Known> {
    let dirs = StateDirs::new(root.to_owned());
    let mut ids = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(dirs.sandboxes()) {
        ids.extend(rd.filter_map(|e| e.ok()?.file_name().into_string().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(crate::report::audit::dir(&dirs)) {
        ids.extend(rd.filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".jsonl").map(str::to_owned)
        }));
    }
    ids.into_iter()
        .filter_map(|id| {
            let cid = ContainerId::try_from(id.as_str()).ok()?;
            let names = crate::report::audit::dir_of(&dirs, &cid, None).join(NAMES_DIR);
            let name = std::fs::read_to_string(names.join(&id)).ok();
            Some(Known {
                root: root.to_owned(),
                id,
                name,
            })
        })
        .collect()
}

/// The sandbox `key` names in `roots`: exact ids win over exact names, which win over unique
/// id prefixes. Change-store records add names for sandboxes whose name was not kept.
fn find_in(roots: &[PathBuf], extra: Vec<Known>, key: &str) -> Result<Found, FindError> {
    let mut known: Vec<Known> = roots.iter().flat_map(|r| known_in(r)).collect();
    known.extend(extra);
    if let Ok(store) = crate::report::changes::Store::locate() {
        for e in store.entries() {
            let Some(name) = e.record.name else { continue };
            for k in known.iter_mut().filter(|k| {
                k.id == e.record.container && k.root == e.record.root && k.name.is_none()
            }) {
                k.name = Some(name.clone());
            }
        }
    }
    let pick = |found: Vec<&Known>| -> Result<Option<Found>, FindError> {
        let mut unique: Vec<&Known> = Vec::new();
        for k in found {
            if !unique.iter().any(|u| u.root == k.root && u.id == k.id) {
                unique.push(k);
            }
        }
        match unique.as_slice() {
            [] => Ok(None),
            [one] => Ok(ContainerId::try_from(one.id.as_str()).ok().map(|id| Found {
                root: one.root.clone(),
                id,
            })),
            many => Err(FindError::Ambiguous {
                key: key.to_owned(),
                candidates: many
                    .iter()
                    .map(|k| {
                        let name = k
                            .name
                            .as_deref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default();
                        format!("{}{name} in {}", k.id, k.root.display())
                    })
                    .collect(),
            }),
        }
    };
    for matches in [
        &(|k: &Known| k.id == key) as &dyn Fn(&Known) -> bool,
        &|k: &Known| k.name.as_deref() == Some(key),
        &|k: &Known| k.id.starts_with(key),
    ] {
        if let Some(found) = pick(known.iter().filter(|k| matches(k)).collect())? {
            return Ok(found);
        }
    }
    Err(FindError::NotFound {
        key: key.to_owned(),
        searched: roots.to_vec(),
    })
}

/// The sandboxes whose logs are in `dir` (`--audit-dir`): a live one in the root its live
/// marker names, an ended one in `fallback` (its log is then found through `--audit-dir`).
fn known_by_logs(dir: &Path, fallback: &Path) -> Vec<Known> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let n = e.ok()?.file_name().into_string().ok()?;
        let id = n.strip_suffix(".jsonl")?.to_owned();
        ContainerId::try_from(id.as_str()).ok()?;
        let root = std::fs::read_to_string(dir.join(".live").join(&id))
            .map(|r| PathBuf::from(r.trim_end_matches('\n')))
            .unwrap_or_else(|_| fallback.to_owned());
        let name = std::fs::read_to_string(dir.join(NAMES_DIR).join(&id)).ok();
        Some(Known { root, id, name })
    })
    .collect()
}

/// `key` in `explicit` (`--root`) alone, else in every root of [`roots`]; with `--audit-dir`
/// also among the logs there.
pub fn find(
    explicit: Option<&Path>,
    audit_dir: Option<&Path>,
    key: &str,
) -> Result<Found, FindError> {
    if key.is_empty() {
        return Err(FindError::NotFound {
            key: key.to_owned(),
            searched: Vec::new(),
        });
    }
    let roots = match explicit {
        Some(r) => vec![r.to_owned()],
        None => roots()?,
    };
    let extra = match audit_dir {
        Some(dir) => known_by_logs(dir, &crate::state::paths::state_root(explicit)?),
        None => Vec::new(),
    };
    find_in(&roots, extra, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(root: &Path, id: &str, live: bool, name: Option<&str>) {
        if live {
            std::fs::create_dir_all(root.join("sandbox").join(id)).unwrap();
        }
        let audit = root.join("audit");
        std::fs::create_dir_all(audit.join(NAMES_DIR)).unwrap();
        std::fs::write(audit.join(format!("{id}.jsonl")), "").unwrap();
        if let Some(n) = name {
            std::fs::write(audit.join(NAMES_DIR).join(id), n).unwrap();
        }
    }

    #[test]
    fn ids_names_and_prefixes_are_found_across_roots_and_ambiguity_lists_candidates() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        sandbox(&a, "abc123def", true, Some("web"));
        sandbox(&b, "abc999", false, None);
        sandbox(&b, "web", false, None);
        let roots = vec![a.clone(), b.clone()];
        let f = find_in(&roots, Vec::new(), "abc123def").unwrap();
        assert_eq!(
            (f.root.as_path(), f.id.as_str()),
            (a.as_path(), "abc123def")
        );
        // An exact id beats a name.
        let f = find_in(&roots, Vec::new(), "web").unwrap();
        assert_eq!((f.root.as_path(), f.id.as_str()), (b.as_path(), "web"));
        let f = find_in(&roots, Vec::new(), "abc9").unwrap();
        assert_eq!((f.root.as_path(), f.id.as_str()), (b.as_path(), "abc999"));
        let e = find_in(&roots, Vec::new(), "abc").unwrap_err().to_string();
        assert!(
            e.contains("abc123def (web) in ") && e.contains("abc999 in "),
            "{e}"
        );
        let e = find_in(&roots, Vec::new(), "zzz").unwrap_err().to_string();
        assert!(
            e.contains(&a.display().to_string()) && e.contains(&b.display().to_string()),
            "{e}"
        );
        assert!(e.contains("docs/audit.md"), "{e}");
    }

    #[test]
    fn logs_in_an_audit_dir_are_found_live_in_their_marked_root_and_ended_in_the_fallback() {
        let t = tempfile::tempdir().unwrap();
        let logs = t.path().join("logs");
        std::fs::create_dir_all(logs.join(".live")).unwrap();
        std::fs::write(logs.join("live1.jsonl"), "").unwrap();
        std::fs::write(logs.join(".live").join("live1"), "/some/root\n").unwrap();
        std::fs::write(logs.join("gone1.jsonl"), "").unwrap();
        let extra = known_by_logs(&logs, Path::new("/fallback"));
        let f = find_in(&[], extra.clone(), "live1").unwrap();
        assert_eq!(f.root, PathBuf::from("/some/root"));
        let f = find_in(&[], extra, "gone").unwrap();
        assert_eq!(
            (f.root, f.id.as_str()),
            (PathBuf::from("/fallback"), "gone1")
        );
    }
}

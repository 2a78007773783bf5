//! The one resolver of the commands that read what a sandbox did (`audit`, `layers`,
//! `allow`/`deny`, `diff`, `export`, `promote`, `changes discard`): a key is a full id, a
//! change id, a name (podman's `--name`, CRI's `POD/CONTAINER` and its pod's `POD`), or a
//! unique prefix of an id or change id (podman's and Docker's short ids), whatever entry point
//! created the sandbox, without `--root`.
//!
//! Each entry point gives the runtime its own state root: podman none (the default root),
//! the shim `/run/containerd/agent-sandbox/NAMESPACE`, dockerd
//! `EXEC_ROOT/runtime-runc/NAMESPACE`. Without `--root` every such root on this host is
//! searched, plus the roots the change store records (`crate::report::changes`) and every
//! root a sandbox was ever created in since boot (`DEFAULT_ROOT/roots/`, written at create,
//! so Docker's exec root is found whatever `--exec-root` dockerd has). In each root a sandbox
//! is live (`sandbox/ID`) or ended with its log kept (`audit/ID.jsonl`). Names are kept next
//! to the logs (`audit/.names/ID`, written at create) so they outlive the sandbox, and so is a
//! pod member's pod (`audit/.pods/ID`: the pod sandbox's id, whose log holds the pod's
//! network records).
//!
//! Names come from the engine (conmon's command line, CRI's annotations), never from the
//! sandbox, but they are still treated as hostile: a key that fits two sandboxes in any way
//! (a name of one and a prefix of another's id, a name two engines gave) is an error listing
//! both, escaped; only a full id or change id beats everything else.

use std::path::{Path, PathBuf};

use agent_sandbox_audit::escape::{escape, escape_path};

use crate::state::ContainerId;
use crate::state::StateDirs;

const NAMES_DIR: &str = ".names";
const PODS_DIR: &str = ".pods";
/// Under the default state root: one file per state root a sandbox was created in.
const ROOTS_DIR: &str = "roots";

/// A sandbox found: its state root, its full id, and the kept change set the key named
/// (when it was a change id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub root: PathBuf,
    pub id: ContainerId,
    pub change: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("no sandbox \"{key}\" (by id, change id, name or unique prefix) in {searched} (docs/audit.md#finding-a-sandbox)", key = escape(.key), searched = list(.searched))]
    NotFound { key: String, searched: Vec<PathBuf> },
    #[error("\"{key}\" names several sandboxes: {candidates}; give the full id (and --root ROOT) or the change id (docs/audit.md#finding-a-sandbox)", key = escape(.key), candidates = .candidates.join("; "))]
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
        .map(|r| escape_path(r))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name an engine gave a sandbox, from its annotations (CRI) or its caller (podman's
/// conmon): `POD/CONTAINER` for a pod's app container, `POD` for the pod's sandbox.
pub fn name_of(
    annotations: &std::collections::HashMap<String, String>,
    root: &Path,
) -> Option<String> {
    let (_, name) = crate::report::changes::origin(annotations, root);
    name.or_else(|| {
        let sandbox = annotations.get(crate::pod::CONTAINER_TYPE_ANNOTATION)? == "sandbox";
        sandbox
            .then(|| annotations.get(POD_NAME_ANNOTATION).cloned())
            .flatten()
    })
}

/// The pod name CRI puts on every container of a pod.
pub const POD_NAME_ANNOTATION: &str = "io.kubernetes.cri.sandbox-name";

/// Writes `dir/file` (0600) in `dir` (made 0700 if missing; its parent must exist: this
/// never creates a state root or a log directory, whose modes their owners choose).
fn keep(dir: &Path, file: &str, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let made = match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    };
    let written = made.and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(dir.join(file))?
            .write_all(text.as_bytes())
    });
    if let Err(e) = written {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot keep what finds the sandbox");
    }
}

/// At create: keeps the sandbox's name (if it has one) and, for a pod's app container, its
/// pod next to its audit log; and notes its state root for later searches without `--root`.
pub fn remember(
    dirs: &StateDirs,
    id: &ContainerId,
    annotations: Option<&std::collections::HashMap<String, String>>,
) {
    let empty = std::collections::HashMap::new();
    let annotations = annotations.unwrap_or(&empty);
    let logs = crate::sidecars::trail::dir_of(dirs, id, None);
    if let Some(name) = name_of(annotations, &dirs.root) {
        keep(&logs.join(NAMES_DIR), id.as_str(), &name);
    }
    let member = annotations
        .get(crate::pod::CONTAINER_TYPE_ANNOTATION)
        .is_some_and(|t| t == "container");
    if let Some(pod) = annotations
        .get(crate::pod::SANDBOX_ID_ANNOTATION)
        .filter(|_| member)
        .and_then(|p| ContainerId::try_from(p.as_str()).ok())
        .filter(|p| p != id)
    {
        keep(&logs.join(PODS_DIR), id.as_str(), pod.as_str());
    }
    note_root(&dirs.root);
}

/// Notes `root` in the default root's `roots/` (a file named after a digest of the path).
fn note_root(root: &Path) {
    let Ok(default) = crate::state::paths::state_root(None) else {
        return;
    };
    if root == default {
        return;
    }
    let Ok(abs) = std::path::absolute(root) else {
        return;
    };
    let digest = {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(abs.as_os_str().as_encoded_bytes())[..8])
    };
    let dir = default.join(ROOTS_DIR);
    if dir.join(&digest).exists() {
        return;
    }
    let Some(text) = abs.to_str() else { return };
    keep(&dir, &digest, text);
}

/// The roots noted by [`note_root`].
fn noted_roots() -> Vec<PathBuf> {
    let Ok(default) = crate::state::paths::state_root(None) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(default.join(ROOTS_DIR)) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .collect();
    out.sort();
    out
}

/// The pod sandbox a pod's app container belongs to, as kept at its create, from its log
/// directory `logs`.
pub fn pod_of(logs: &Path, id: &ContainerId) -> Option<ContainerId> {
    let text = std::fs::read_to_string(logs.join(PODS_DIR).join(id.as_str())).ok()?;
    ContainerId::try_from(text.trim_end_matches('\n')).ok()
}

/// Removes the kept name and pod of `id` from the log directory `dir` (at `audit prune`).
pub fn forget(dir: &Path, id: &str) {
    let _ = std::fs::remove_file(dir.join(NAMES_DIR).join(id));
    let _ = std::fs::remove_file(dir.join(PODS_DIR).join(id));
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
    out.extend(noted_roots());
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

/// One sandbox a root knows, live or ended, with its kept names and change sets.
#[derive(Debug, Clone, Default)]
struct Known {
    root: PathBuf,
    id: String,
    names: Vec<String>,
    changes: Vec<String>,
}

/// Whether two spellings name one state root (`/var/run/...` and `/run/...`).
pub fn same_root(a: &Path, b: &Path) -> bool {
    a == b || std::fs::canonicalize(a).is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
}

impl Known {
    fn same(&self, other: &Known) -> bool {
        self.id == other.id && same_root(&self.root, &other.root)
    }

    /// `ID (NAME) in ROOT`, escaped for a terminal.
    fn describe(&self) -> String {
        let mut s = escape(&self.id).into_owned();
        for n in &self.names {
            s.push_str(&format!(" ({})", escape(n)));
        }
        if !self.changes.is_empty() {
            s.push_str(&format!(" [change {}]", self.changes.join(", ")));
        }
        format!("{s} in {}", escape_path(&self.root))
    }
}

fn read_name(logs: &Path, id: &str) -> Option<String> {
    std::fs::read_to_string(logs.join(NAMES_DIR).join(id))
        .ok()
        .filter(|n| !n.is_empty())
}

fn known_in(root: &Path) -> Vec<Known> {
    let dirs = StateDirs::new(root.to_owned());
    let mut ids = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(dirs.sandboxes()) {
        ids.extend(rd.filter_map(|e| e.ok()?.file_name().into_string().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(crate::sidecars::trail::dir(&dirs)) {
        ids.extend(rd.filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".jsonl").map(str::to_owned)
        }));
    }
    ids.into_iter()
        .filter_map(|id| {
            let cid = ContainerId::try_from(id.as_str()).ok()?;
            let logs = crate::sidecars::trail::dir_of(&dirs, &cid, None);
            Some(Known {
                root: root.to_owned(),
                names: read_name(&logs, &id).into_iter().collect(),
                id,
                changes: Vec::new(),
            })
        })
        .collect()
}

/// Adds the change store's records: each one's change id (and its name, when the log kept
/// none) to its sandbox, or the sandbox itself when only its change set is left.
fn add_changes(known: &mut Vec<Known>, records: Vec<crate::report::changes::Record>) {
    for r in records {
        if ContainerId::try_from(r.container.as_str()).is_err() {
            continue;
        }
        let at = match known
            .iter()
            .position(|k| k.id == r.container && same_root(&k.root, &r.root))
        {
            Some(at) => at,
            None => {
                known.push(Known {
                    root: r.root.clone(),
                    id: r.container.clone(),
                    ..Known::default()
                });
                known.len() - 1
            }
        };
        let k = &mut known[at];
        k.changes.push(r.change);
        if let Some(name) = r.name.filter(|n| !k.names.contains(n)) {
            k.names.push(name);
        }
    }
}

/// The sandbox `key` names among `known`:
/// 1. a full id, then a change id: exact, so it wins over any name or prefix;
/// 2. else every sandbox with that name and every one whose id or change id starts with
///    the key: exactly one, or an error listing them all.
fn pick(known: &[Known], key: &str) -> Result<Option<Found>, FindError> {
    let unique = |found: Vec<&Known>| -> Vec<Known> {
        let mut out: Vec<Known> = Vec::new();
        for k in found {
            if !out.iter().any(|u| u.same(k)) {
                out.push(k.clone());
            }
        }
        out
    };
    let one = |found: Vec<Known>, change: Option<String>| match found.as_slice() {
        [] => Ok(None),
        [k] => Ok(ContainerId::try_from(k.id.as_str()).ok().map(|id| Found {
            root: k.root.clone(),
            id,
            change: change.clone(),
        })),
        many => Err(FindError::Ambiguous {
            key: key.to_owned(),
            candidates: many.iter().map(Known::describe).collect(),
        }),
    };
    if let Some(f) = one(unique(known.iter().filter(|k| k.id == key).collect()), None)? {
        return Ok(Some(f));
    }
    if let Some(f) = one(
        unique(
            known
                .iter()
                .filter(|k| k.changes.iter().any(|c| c == key))
                .collect(),
        ),
        Some(key.to_owned()),
    )? {
        return Ok(Some(f));
    }
    let loose = unique(
        known
            .iter()
            .filter(|k| {
                k.names.iter().any(|n| n == key)
                    || k.id.starts_with(key)
                    || k.changes.iter().any(|c| c.starts_with(key))
            })
            .collect(),
    );
    // A change-id prefix names that change set, as a full change id does.
    let change = match loose.as_slice() {
        [k] => {
            let by_change: Vec<&String> = k.changes.iter().filter(|c| c.starts_with(key)).collect();
            match by_change.as_slice() {
                [c] if !k.id.starts_with(key) && !k.names.iter().any(|n| n == key) => {
                    Some((*c).clone())
                }
                _ => None,
            }
        }
        _ => None,
    };
    one(loose, change)
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
        Some(Known {
            root,
            names: read_name(dir, &id).into_iter().collect(),
            id,
            changes: Vec::new(),
        })
    })
    .collect()
}

/// `key` in `explicit` (`--root`) alone, else in every root of [`roots`]; with `--audit-dir`
/// also among the logs there; kept change sets of those roots in every case.
pub fn find(
    explicit: Option<&Path>,
    audit_dir: Option<&Path>,
    key: &str,
) -> Result<Found, FindError> {
    let roots = match explicit {
        Some(r) => vec![r.to_owned()],
        None => roots()?,
    };
    let not_found = || FindError::NotFound {
        key: key.to_owned(),
        searched: roots.clone(),
    };
    if key.is_empty() {
        return Err(not_found());
    }
    let mut known: Vec<Known> = roots.iter().flat_map(|r| known_in(r)).collect();
    if let Some(dir) = audit_dir {
        let fallback = crate::state::paths::state_root(explicit)?;
        for k in known_by_logs(dir, &fallback) {
            if !known.iter().any(|o| o.same(&k)) {
                known.push(k);
            }
        }
    }
    let records = crate::report::changes::Store::locate()
        .map(|s| s.entries())
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.record)
        .filter(|r| explicit.is_none_or(|root| same_root(&r.root, root)))
        .collect();
    add_changes(&mut known, records);
    pick(&known, key)?.ok_or_else(not_found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(root: &Path, id: &str, live: bool, name: Option<&str>) -> Known {
        if live {
            std::fs::create_dir_all(root.join("sandbox").join(id)).unwrap();
        }
        let audit = root.join("audit");
        std::fs::create_dir_all(audit.join(NAMES_DIR)).unwrap();
        std::fs::write(audit.join(format!("{id}.jsonl")), "").unwrap();
        if let Some(n) = name {
            std::fs::write(audit.join(NAMES_DIR).join(id), n).unwrap();
        }
        Known {
            root: root.to_owned(),
            id: id.to_owned(),
            ..Known::default()
        }
    }

    fn found_in(roots: &[PathBuf], key: &str) -> Result<Option<Found>, FindError> {
        let known: Vec<Known> = roots.iter().flat_map(|r| known_in(r)).collect();
        pick(&known, key)
    }

    fn record(
        change: &str,
        container: &str,
        name: Option<&str>,
        root: &Path,
    ) -> crate::report::changes::Record {
        crate::report::changes::Record {
            change: change.to_owned(),
            container: container.to_owned(),
            name: name.map(str::to_owned),
            entry_point: "runtime".to_owned(),
            root: root.to_owned(),
            created: 1,
            workspace: PathBuf::from("/w"),
            quota_bytes: None,
            keep_until: 2,
            ended: Some(1),
            size_bytes: Some(1),
            empty: false,
            checkpoints: Vec::new(),
        }
    }

    #[test]
    fn ids_names_and_prefixes_are_found_across_roots() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        sandbox(&a, "abc123def", true, Some("web"));
        sandbox(&b, "abc999", false, None);
        sandbox(&b, "9f8e7d6c5b4a", false, Some("pod-1/agent"));
        sandbox(&b, "1234pause", false, Some("pod-1"));
        let roots = vec![a.clone(), b.clone()];
        let at = |key: &str| {
            let f = found_in(&roots, key).unwrap().unwrap();
            (f.root, f.id.to_string())
        };
        assert_eq!(at("abc123def"), (a.clone(), "abc123def".to_owned()));
        assert_eq!(at("web"), (a.clone(), "abc123def".to_owned()));
        assert_eq!(at("abc9"), (b.clone(), "abc999".to_owned()));
        assert_eq!(at("pod-1/agent"), (b.clone(), "9f8e7d6c5b4a".to_owned()));
        assert_eq!(at("pod-1"), (b.clone(), "1234pause".to_owned()));
        assert_eq!(at("9f8e"), (b.clone(), "9f8e7d6c5b4a".to_owned()));
        assert!(found_in(&roots, "zzz").unwrap().is_none());
    }

    /// A name never steals a key that also fits another sandbox: a name that is a prefix of
    /// another's id, or a name two sandboxes carry, lists both (escaped) instead of picking.
    #[test]
    fn a_crafted_name_is_ambiguous_never_another_sandbox() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        sandbox(&a, "c0ffee0123456789", true, None);
        // The attack: a second engine's container named after the first one's short id.
        sandbox(&b, "decoy1", true, Some("c0ffee012345"));
        // And one whose name carries a terminal escape, shared with a third.
        sandbox(&b, "decoy2", true, Some("x\x1b[2Jy"));
        sandbox(&a, "other3", true, Some("x\x1b[2Jy"));
        let roots = vec![a.clone(), b.clone()];
        let e = found_in(&roots, "c0ffee012345").unwrap_err().to_string();
        assert!(
            e.contains("c0ffee0123456789 in ") && e.contains("decoy1 (c0ffee012345) in "),
            "{e}"
        );
        assert!(e.contains("docs/audit.md"), "{e}");
        let e = found_in(&roots, "x\x1b[2Jy").unwrap_err().to_string();
        assert!(e.contains("decoy2") && e.contains("other3"), "{e}");
        assert!(!e.contains('\x1b'), "{e:?}");
        // The full id still names the sandbox: an exact id is never ambiguous with a name.
        let f = found_in(&roots, "c0ffee0123456789").unwrap().unwrap();
        assert_eq!((f.root, f.id.as_str()), (a.clone(), "c0ffee0123456789"));
        // The same id in two roots is ambiguous (give --root).
        sandbox(&b, "c0ffee0123456789", false, None);
        let roots = vec![a, b];
        assert!(matches!(
            found_in(&roots, "c0ffee0123456789"),
            Err(FindError::Ambiguous { .. })
        ));
    }

    #[test]
    fn change_sets_name_their_sandbox_even_after_its_log_is_gone() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let mut known = vec![sandbox(&a, "reused", false, None)];
        add_changes(
            &mut known,
            vec![
                record("aaaa11112222", "reused", None, &a),
                record("bbbb11112222", "reused", None, &a),
                record("cccc11112222", "gone42", Some("fix-calc"), &a),
            ],
        );
        let f = pick(&known, "bbbb").unwrap().unwrap();
        assert_eq!(
            (f.id.as_str(), f.change.as_deref()),
            ("reused", Some("bbbb11112222"))
        );
        let f = pick(&known, "reused").unwrap().unwrap();
        assert_eq!((f.id.as_str(), f.change), ("reused", None));
        let f = pick(&known, "fix-calc").unwrap().unwrap();
        assert_eq!((f.id.as_str(), f.root), ("gone42", a.clone()));
        let f = pick(&known, "cccc11112222").unwrap().unwrap();
        assert_eq!(f.change.as_deref(), Some("cccc11112222"));
    }

    #[test]
    fn logs_in_an_audit_dir_are_found_live_in_their_marked_root_and_ended_in_the_fallback() {
        let t = tempfile::tempdir().unwrap();
        let logs = t.path().join("logs");
        std::fs::create_dir_all(logs.join(".live")).unwrap();
        std::fs::write(logs.join("live1.jsonl"), "").unwrap();
        std::fs::write(logs.join(".live").join("live1"), "/some/root\n").unwrap();
        std::fs::write(logs.join("gone1.jsonl"), "").unwrap();
        let known = known_by_logs(&logs, Path::new("/fallback"));
        let f = pick(&known, "live1").unwrap().unwrap();
        assert_eq!(f.root, PathBuf::from("/some/root"));
        let f = pick(&known, "gone").unwrap().unwrap();
        assert_eq!(
            (f.root, f.id.as_str()),
            (PathBuf::from("/fallback"), "gone1")
        );
    }

    #[test]
    fn pod_names_come_from_cri_annotations() {
        let ann = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let root = Path::new("/run/containerd/agent-sandbox/k8s.io");
        let member = ann(&[
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.container-name", "agent"),
            ("io.kubernetes.cri.sandbox-name", "task-7"),
        ]);
        assert_eq!(name_of(&member, root).as_deref(), Some("task-7/agent"));
        let pause = ann(&[
            ("io.kubernetes.cri.container-type", "sandbox"),
            ("io.kubernetes.cri.sandbox-name", "task-7"),
        ]);
        assert_eq!(name_of(&pause, root).as_deref(), Some("task-7"));
        assert_eq!(name_of(&ann(&[]), root), None);
    }
}

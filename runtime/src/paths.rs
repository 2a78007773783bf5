//! Where the runtime keeps its state, derived the same way on every call.
//!
//! Layout under the state root `R`:
//! - `R/containers/<id>/`: libcontainer's state (`state.json`, its notify socket).
//! - `R/sandbox/<id>/`: ours, one directory per sandbox; each file and the module that
//!   writes it:
//!   - `sandbox.json`: the sandbox record (policy, ids, mounts to undo) — `lifecycle`
//!   - `bundle/config.json`: the hardened spec libcontainer runs — `lifecycle`
//!   - `workspace.json`: the workspace overlay's placement — `lifecycle`
//!   - `requested-seccomp.json`: the seccomp profile the caller asked for — `lifecycle`
//!   - `watchdog.pid`: the wall-clock watchdog — `lifecycle`
//!   - `oom-watch.pid`: the OOM watcher of a podman container — `podman_oom`
//!   - `started`: uptime when the init executed the program — `lifecycle` (`init_exec`)
//!   - `cgroup.json`: a v2 sandbox's cgroup or scope placement — `host::cgroups`
//!   - `layers.json`: what was applied, for `layers` — `layers`
//!   - `pod.json`: the pod role and pins (CRI only) — `pod`
//!   - `poststop.json`: the poststop hooks to run at delete — `hooks`
//!   - `apparmor-profile`: the name of the loaded profile — `apparmor`
//!   - `proxy.pid`, `proxy.log`: the egress proxy sidecar — `egress`
//!   - `seccomp-supervisor.pid`, `seccomp.sock`: the syscall audit supervisor —
//!     `syscall_audit`
//!   - `fs-audit.json`: whether Landlock denials are logged — `fs_audit`
//!   - `audit-dir`, `audit-state.json`, `audit-exec/<pid>`, `wall-clock-fired`: the audit
//!     log's place and what exit records need — `audit`
//! - `R/locks/<id>.lock`: serialises the lifecycle calls on one id — `state_lock`.
//! - `R/idmap.json` + `R/idmap.lock`: host id ranges handed to sandboxes — `idmap`.
//!
//! Mount points live outside `R`, under [`crate::sandbox::mount_dir`]
//! (`/run/agent-sandbox/mnt/<tag>/<id>`, or `/tmp/agent-sandbox-<uid>/<tag>/<id>` rootless):
//! the reachable `rootfs`, the `workspace` overlay's `upper`/`work` (in the change set's
//! directory when changes are kept, `changes`) and its `workspace-merged` view, and
//! `binds/<n>` for re-bound sources (`mounts`).
//!
//! `R` is `--root` if given; otherwise `/run/agent-sandbox` for the real root
//! user and `$XDG_RUNTIME_DIR/agent-sandbox` when unprivileged or inside a user
//! namespace (podman's rootless mode runs the runtime in one and never passes
//! `--root`, so `state` must find the same place from the environment alone).

use std::path::{Path, PathBuf};

use crate::id::ContainerId;

/// Why the state root could not be determined or prepared.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("XDG_RUNTIME_DIR is not set; pass --root for an unprivileged runtime")]
    NoRuntimeDir,
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create state directory {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether the process runs with the host's full id range (real root).
pub fn in_initial_userns() -> Result<bool, PathsError> {
    let path = Path::new("/proc/self/uid_map");
    let text = std::fs::read_to_string(path).map_err(|source| PathsError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(is_identity_full_map(&text))
}

fn is_identity_full_map(text: &str) -> bool {
    let fields: Vec<&str> = text.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// True when the runtime must act as "rootless": not real root, or inside a
/// user namespace.
pub fn rootless() -> Result<bool, PathsError> {
    Ok(!nix::unistd::geteuid().is_root() || !in_initial_userns()?)
}

/// The state root for this invocation.
pub fn state_root(explicit: Option<&Path>) -> Result<PathBuf, PathsError> {
    if let Some(root) = explicit {
        return Ok(root.to_owned());
    }
    if rootless()? {
        let dir = std::env::var_os("XDG_RUNTIME_DIR").ok_or(PathsError::NoRuntimeDir)?;
        if dir.is_empty() {
            return Err(PathsError::NoRuntimeDir);
        }
        return Ok(PathBuf::from(dir).join("agent-sandbox"));
    }
    Ok(PathBuf::from("/run/agent-sandbox"))
}

/// The directories of one state root.
#[derive(Debug, Clone)]
pub struct StateDirs {
    pub root: PathBuf,
}

impl StateDirs {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// libcontainer's root (it adds `<id>`).
    pub fn containers(&self) -> PathBuf {
        self.root.join("containers")
    }

    pub fn container(&self, id: &ContainerId) -> PathBuf {
        self.containers().join(id.as_str())
    }

    pub fn sandbox(&self, id: &ContainerId) -> PathBuf {
        self.root.join("sandbox").join(id.as_str())
    }

    pub fn idmap_db(&self) -> PathBuf {
        self.root.join("idmap.json")
    }

    pub fn idmap_lock(&self) -> PathBuf {
        self.root.join("idmap.lock")
    }

    /// Creates the root and its fixed subdirectories.
    pub fn ensure(&self) -> Result<(), PathsError> {
        for dir in [
            self.root.clone(),
            self.containers(),
            self.root.join("sandbox"),
        ] {
            std::fs::create_dir_all(&dir).map_err(|source| PathsError::Create {
                path: dir.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Replaces `path` with `bytes` atomically: the bytes go to a temporary file in the same
/// directory, are synced, and the file is renamed over `path`. A concurrent reader opens
/// either the old file or the new one, never a part; a crash leaves one of the two.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("record.json");
        write_atomic(&file, b"{\"a\":1}").unwrap();
        write_atomic(&file, b"{}").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn identity_map_is_recognised() {
        assert!(is_identity_full_map("         0          0 4294967295\n"));
        assert!(!is_identity_full_map("0 1500 1\n1 100000 65536\n"));
    }

    #[test]
    fn explicit_root_wins() {
        assert_eq!(
            state_root(Some(Path::new("/x/y"))).unwrap(),
            PathBuf::from("/x/y")
        );
    }
}

//! The state root `R` and its fixed directories (the layout is in [`crate::state`]).
//!
//! `R` is `--root` if given; otherwise `/run/agent-sandbox` for the real root
//! user and `$XDG_RUNTIME_DIR/agent-sandbox` when unprivileged or inside a user
//! namespace (podman's rootless mode runs the runtime in one and never passes
//! `--root`, so `state` must find the same place from the environment alone).

use std::path::{Path, PathBuf};

use super::id::ContainerId;
use super::sandbox_dir::SandboxDir;

/// Why the state root could not be determined or prepared.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("XDG_RUNTIME_DIR is not set; pass --root for an unprivileged runtime")]
    NoRuntimeDir,
    #[error(transparent)]
    File(#[from] crate::files::FileError),
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
    let text = crate::files::read_to_string(path)?;
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

    /// `R/sandbox/`: one [`SandboxDir`] per sandbox.
    pub fn sandboxes(&self) -> PathBuf {
        self.root.join(SandboxDir::PARENT)
    }

    /// `R/sandbox/<id>/`, with every file in it.
    pub fn sandbox(&self, id: &ContainerId) -> SandboxDir {
        SandboxDir::new(&self.root, id)
    }

    /// `R/audit/`: where the audit logs go unless the sandbox was given another directory.
    pub fn audit(&self) -> PathBuf {
        self.root.join("audit")
    }

    pub fn idmap_db(&self) -> PathBuf {
        self.root.join("idmap.json")
    }

    pub fn idmap_lock(&self) -> PathBuf {
        self.root.join("idmap.lock")
    }

    /// Creates the root and its fixed subdirectories.
    pub fn ensure(&self) -> Result<(), PathsError> {
        for dir in [self.root.clone(), self.containers(), self.sandboxes()] {
            std::fs::create_dir_all(&dir).map_err(|source| PathsError::Create {
                path: dir.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Atomic replacement of a state file (a temporary file in the same directory, synced, then
/// renamed over the path; mode 0600 unless given): one implementation for the runtime and
/// the shim.
pub use agent_sandbox_sys::atomic_file::{write_atomic, write_atomic_mode};

#[cfg(test)]
mod tests {
    use super::*;

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

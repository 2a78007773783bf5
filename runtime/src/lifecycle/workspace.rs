//! The workspace changes of a sandbox, for `diff`, `export` and `promote`.

use super::Runtime;
use crate::enforce::mounts;
use crate::state::ContainerId;

/// Errors of finding a sandbox's workspace changes (`diff`, `export`, `promote`).
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("container {id} does not exist")]
    NotExist { id: ContainerId },
    #[error("container {id} has no workspace overlay")]
    NoWorkspace { id: ContainerId },
    #[error("workspace changes")]
    Changes(#[source] crate::report::changes::ChangesError),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(transparent)]
    Paths(#[from] crate::state::paths::PathsError),
}

type Result<T> = std::result::Result<T, WorkspaceError>;

impl Runtime {
    /// The workspace changes of sandbox `id` in this state root (`crate::report::find`
    /// resolved the user's key to it): the live sandbox's while it exists, else its kept
    /// change set (`change`, when the key named one; else its only one,
    /// `crate::report::changes::of_sandbox`). An ended change set with a quota is mounted
    /// read-only while the result lives.
    pub fn workspace(
        &self,
        id: &ContainerId,
        change: Option<&str>,
    ) -> Result<mounts::WorkspaceOverlay> {
        let dir = self.dirs.sandbox(id);
        let file = dir.workspace();
        if change.is_none() && file.path().exists() {
            return Ok(file.read()?);
        }
        let store = crate::report::changes::Store::locate().map_err(WorkspaceError::Changes)?;
        match crate::report::changes::of_sandbox(&store, &self.dirs.root, id.as_str(), change) {
            Ok(entry) => crate::report::changes::open(&entry).map_err(WorkspaceError::Changes),
            Err(crate::report::changes::ChangesError::NotFound { .. }) if dir.exists() => {
                Err(WorkspaceError::NoWorkspace { id: id.clone() })
            }
            Err(crate::report::changes::ChangesError::NotFound { .. }) => {
                Err(WorkspaceError::NotExist { id: id.clone() })
            }
            Err(e) => Err(WorkspaceError::Changes(e)),
        }
    }
}

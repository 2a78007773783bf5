//! The workspace changes of a sandbox, for `diff`, `export` and `promote`.

use super::{LifecycleError, Result, Runtime};
use crate::enforce::mounts;
use crate::state::ContainerId;

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
        let store = crate::report::changes::Store::locate().map_err(LifecycleError::Changes)?;
        match crate::report::changes::of_sandbox(&store, &self.dirs.root, id.as_str(), change) {
            Ok(entry) => crate::report::changes::open(&entry).map_err(LifecycleError::Changes),
            Err(crate::report::changes::ChangesError::NotFound { .. }) if dir.exists() => {
                Err(LifecycleError::NoWorkspace { id: id.clone() })
            }
            Err(crate::report::changes::ChangesError::NotFound { .. }) => {
                Err(LifecycleError::NotExist { id: id.clone() })
            }
            Err(e) => Err(LifecycleError::Changes(e)),
        }
    }
}

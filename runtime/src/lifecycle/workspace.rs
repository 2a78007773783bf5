//! The workspace changes of a sandbox, for `diff`, `export` and `promote`.

use super::{LifecycleError, Result, Runtime};
use crate::enforce::mounts;
use crate::state::ContainerId;

impl Runtime {
    /// The workspace changes `id` names, for `diff`, `export` and `promote`: those of the
    /// sandbox `id` in this state root while it exists, else a kept change set of any entry
    /// point found by change id, container id, name or unique prefix (`crate::report::changes::find`).
    /// An ended change set with a quota is mounted read-only while the result lives.
    pub fn workspace(&self, id: &ContainerId) -> Result<mounts::WorkspaceOverlay> {
        let dir = self.dirs.sandbox(id);
        let file = dir.workspace();
        if file.path().exists() {
            return Ok(file.read()?);
        }
        let store = crate::report::changes::Store::locate().map_err(LifecycleError::Changes)?;
        match crate::report::changes::find(&store, id.as_str()) {
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

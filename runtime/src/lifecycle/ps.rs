//! `ps`: the pids in the container's cgroup.

use super::{LookupError, Runtime};
use crate::state::ContainerId;

/// Errors of `ps`.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// libcontainer's saved config of the container (its cgroup path).
    #[error("ps failed")]
    Container(#[source] Box<libcontainer::error::LibcontainerError>),
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
}

impl Runtime {
    /// `ps`: the pids in the container's cgroup.
    pub fn pids(&self, id: &ContainerId) -> Result<Vec<i32>, PsError> {
        let c = self.load(id)?;
        let cfg = c.spec().map_err(|e| PsError::Container(Box::new(e)))?;
        Ok(crate::host::cgroups::pids(
            &cfg.cgroup_path,
            c.systemd(),
            id,
        )?)
    }
}

//! `ps`: the pids in the container's cgroup.

use super::{Result, Runtime, container_err};
use crate::state::ContainerId;

impl Runtime {
    /// `ps`: the pids in the container's cgroup.
    pub fn pids(&self, id: &ContainerId) -> Result<Vec<i32>> {
        let c = self.load(id)?;
        let cfg = c.spec().map_err(container_err("ps"))?;
        Ok(crate::host::cgroups::pids(
            &cfg.cgroup_path,
            c.systemd(),
            id,
        )?)
    }
}

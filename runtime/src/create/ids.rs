//! Phase 1: the sandbox's place among its pod and its host id block.

use libcontainer::oci_spec::runtime::Spec;

use super::{Ids, Result};
use crate::host::idmap;
use crate::lifecycle::Runtime;
use crate::state::ContainerId;
use crate::state::paths;

impl Runtime {
    /// A Kubernetes app container joins its pod (ids, namespaces, ceiling: `crate::pod`);
    /// any other sandbox gets a block of its own (rootless: the runtime's nested range).
    pub(super) fn assign_ids(&self, id: &ContainerId, spec: &Spec) -> Result<Ids> {
        self.dirs.ensure()?;
        let rootless = paths::rootless()?;
        let role = crate::pod::role(spec, id)?;
        let member = match &role {
            crate::pod::Role::Member { pod } => Some(crate::pod::Member::join(self, id, pod)?),
            _ => None,
        };
        let (ids, allocated) = if let Some(m) = &member {
            (m.ids, true)
        } else if rootless {
            (idmap::nested_range()?, false)
        } else {
            (
                idmap::allocate(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id)?,
                true,
            )
        };
        Ok(Ids {
            rootless,
            role,
            member,
            ids,
            allocated,
        })
    }
}

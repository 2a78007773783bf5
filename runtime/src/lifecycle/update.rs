//! `update --resources`: new limits, never above the policy's ceiling.

use super::{LookupError, PlanError, Runtime};
use crate::state::ContainerId;

/// Errors of `update`, by its phase: finding the container, reading the plan whose policy is
/// the ceiling, checking, applying and verifying the limits.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
    /// libcontainer's saved config of the container (its cgroup path).
    #[error("update failed")]
    Container(#[source] Box<libcontainer::error::LibcontainerError>),
    #[error("container not running")]
    NotRunning,
}

impl Runtime {
    /// `update --resources`: applies new limits and verifies they took. The
    /// policy stays the ceiling: a limit above it (or none) is refused.
    pub fn update(
        &self,
        id: &ContainerId,
        resources: &libcontainer::oci_spec::runtime::LinuxResources,
    ) -> Result<(), UpdateError> {
        let c = self.load(id)?;
        let (plan, mut hardened) = self.saved_plan(id, c.bundle())?;
        let policy = plan.policy;
        crate::host::cgroups::check_update_within(resources, &policy)?;
        let resources = &crate::host::cgroups::update_resources(resources);
        let cfg = c.spec().map_err(|e| UpdateError::Container(Box::new(e)))?;
        crate::host::cgroups::apply(&cfg.cgroup_path, c.systemd(), id, resources)?;
        if let Some(linux) = hardened.linux_mut().as_mut() {
            linux.set_resources(Some(resources.clone()));
        }
        let host = crate::host::cgroups::RealHost;
        let hierarchy = crate::host::cgroups::Host::hierarchy(&host)?;
        let driver = if c.systemd() {
            crate::host::cgroups::Driver::Systemd
        } else {
            crate::host::cgroups::Driver::Cgroupfs
        };
        let pid = c.pid().map(|p| p.as_raw()).ok_or(UpdateError::NotRunning)?;
        crate::host::cgroups::verify(&host, hierarchy, driver, &hardened, id, pid)?;
        Ok(())
    }
}

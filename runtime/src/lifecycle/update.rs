//! `update --resources`: new limits, never above the policy's ceiling.

use libcontainer::oci_spec::runtime::Spec;

use super::{LifecycleError, Result, Runtime, container_err};
use crate::state::ContainerId;

impl Runtime {
    /// `update --resources`: applies new limits and verifies they took. The
    /// policy stays the ceiling: a limit above it (or none) is refused.
    pub fn update(
        &self,
        id: &ContainerId,
        resources: &libcontainer::oci_spec::runtime::LinuxResources,
    ) -> Result<()> {
        let c = self.load(id)?;
        let config = c.bundle().join("config.json");
        let mut hardened = Spec::load(&config).map_err(|source| LifecycleError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        let policy = crate::harden::saved_plan(&self.dirs.sandbox(id), &hardened)?.policy;
        crate::host::cgroups::check_update_within(resources, &policy)?;
        let resources = &crate::host::cgroups::update_resources(resources);
        let cfg = c.spec().map_err(container_err("update"))?;
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
        let pid = c
            .pid()
            .map(|p| p.as_raw())
            .ok_or(LifecycleError::NotRunning)?;
        crate::host::cgroups::verify(&host, hierarchy, driver, &hardened, id, pid)?;
        Ok(())
    }
}

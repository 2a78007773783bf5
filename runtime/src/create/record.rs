//! Phase 6: what the sandbox was created with, recorded: the audit trail's `create` and
//! `exec` records, the cgroup limits read back, the layers in force.

use std::borrow::Cow;

use super::{CreateError, Hardened, Host, Ids, Marks, Result};
use crate::lifecycle::Runtime;
use crate::state::ContainerId;

impl Runtime {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_created(
        &self,
        id: &ContainerId,
        ids: &Ids,
        host: &Host,
        hardened: &Hardened,
        pid: i32,
        proxy_pid: Option<u32>,
        marks: &Marks,
    ) -> Result<()> {
        let spec = &hardened.spec;
        crate::sidecars::trail::created(
            &self.dirs,
            id,
            &hardened.plan.policy,
            &hardened.plan.layers,
            &hardened.plan.clamped,
        )
        .map_err(CreateError::Audit)?;
        if let Some(process) = spec.process() {
            let init = crate::sidecars::trail::ProcessName::init();
            crate::sidecars::trail::exec(&self.dirs, id, process, spec, &init)
                .map_err(CreateError::Audit)?;
            crate::sidecars::trail::tag_exec(&self.dirs, id, pid, process, spec, &init);
        }
        marks.mark("audit");
        let cgroups = &hardened.cgroups;
        // The limits in force: the spec's, with those the runtime wrote itself (v1 rootless)
        // instead of libcontainer. A view for the checks below; the bundle's spec stays.
        let limited = match &cgroups.deferred {
            Some(res) => {
                self.procs().write_limits(spec, id, res)?;
                let mut view = spec.clone();
                if let Some(linux) = view.linux_mut().as_mut() {
                    linux.set_resources(Some(res.clone()));
                }
                Cow::Owned(view)
            }
            None => Cow::Borrowed(spec),
        };
        if hardened
            .plan
            .layers
            .apply
            .contains(&agent_sandbox_policy::Layer::Cgroups)
        {
            self.procs().verify_limits(cgroups, &limited, id, pid)?;
        }
        marks.mark("cgroups");
        let (ucounts, ucounts_pod) = match (&host.userns, &ids.member) {
            (Some(own), _) => (Some(own.clone()), None),
            (None, Some(m)) => (
                crate::report::layers::ucounts_of(&self.dirs.sandbox(&m.pod)),
                Some(m.pod.as_str().to_owned()),
            ),
            (None, None) => (None, None),
        };
        crate::report::layers::record_create(
            &host.sandbox_dir,
            &ids.ids,
            &limited,
            hardened.seccomp_len,
            &hardened.plan.policy,
            &hardened.plan.layers,
            proxy_pid,
            pid,
            ucounts,
            ucounts_pod,
            crate::report::layers::masked_secrets(spec, &hardened.plan.policy, &host.placeholders),
        )
        .map_err(CreateError::Layers)?;
        // Last: `start` runs no init of a sandbox without it.
        crate::files::write(&host.sandbox_dir.create_done(), b"")?;
        tracing::info!(
            id = %id,
            pid,
            profile = %host.record.profile,
            host_uid = ids.ids.host_start,
            layers = ?hardened.plan.layers.apply,
            "sandbox created"
        );
        Ok(())
    }
}

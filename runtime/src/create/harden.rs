//! Phase 3: the spec's one owner. Every edit of the spec happens here, in order: the
//! re-bound sources, the plan compiler (`agent_sandbox_policy::compile_under`: the hardened
//! spec with the AppArmor profile of its layer plan; the plan is saved here), the rlimits narrowed to what the runtime could raise (`host::rlimits`), the egress
//! and CA environment, the CA's mounts, the runtime's rootfs, the cgroup placement, the
//! workspace overlay as a bind of its merged dir, the wrapped hooks. Then `verify`: nothing
//! edits the spec after it.

use agent_sandbox_policy::Compiled;
use agent_sandbox_policy::harden::HostFacts;
use libcontainer::oci_spec::runtime::Spec;

use super::{CreateError, Hardened, Host, Ids, Result};
use crate::enforce;
use crate::enforce::executor::SandboxExecutor;
use crate::enforce::mounts;
use crate::harden::Ceiling;
use crate::host::{idmap, rlimits};
use crate::lifecycle::{CreateOpts, Runtime};
use crate::state::ContainerId;

impl Runtime {
    pub(super) fn harden(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        mut spec: Spec,
        ids: &Ids,
        ceiling: &Ceiling,
        host: &mut Host,
    ) -> Result<(Hardened, SandboxExecutor)> {
        host.rebinds.apply(&mut spec);
        let member = ids.member.as_ref();
        let facts = HostFacts {
            workspace: host.workspace.clone(),
            pod: member.map(|m| m.namespaces.clone()),
            placeholders: Some(host.placeholders.clone()),
            user_namespace: host.userns.as_ref().map(|u| u.pin.clone()),
            parent_root_unprivileged: ids.rootless
                && !idmap::parent_root_is_host_root(&idmap::own_map(idmap::IdKind::Uid)?),
            support: self.procs().support(),
            ..HostFacts::default()
        };
        let (compiled, executor) =
            crate::harden::compile(ceiling, host.policy.clone(), spec, &ids.ids, facts)?;
        let Compiled { mut spec, mut plan } = compiled;
        if let Some(m) = member {
            m.check_policy(&plan.policy, &spec)?;
        }
        host.record.profile =
            crate::harden::spec_profile_name(&spec).unwrap_or_else(|| ceiling.origin.clone());
        if let Some(process) = spec.process_mut().as_mut() {
            // In this process, before libcontainer forks and enters the user namespace.
            plan.clamped
                .extend(rlimits::raise(&rlimits::ThisProcess, process)?);
        }
        // A member's are its pod's (one proxy serves the pod); a restore in place keeps its
        // own; anything else gets new ones.
        let keep = member.map_or(&opts.keep_placeholders, |m| &m.placeholders);
        plan.credential_placeholders = crate::sidecars::tls_trust::placeholders(&plan.policy, keep)
            .map_err(CreateError::Trust)?;
        // Saved once its clamps are complete; exec, `update`, the proxy and a pod's members
        // read it from here on.
        host.sandbox_dir.plan().write(&plan)?;
        let policy = &plan.policy;
        if let Some(process) = spec.process_mut().as_mut() {
            crate::sidecars::egress::inject_env(process, policy);
            crate::sidecars::tls_trust::inject_env(process, &plan);
        }
        let pod_mount_dir = match member {
            Some(m) => Some(crate::harden::mount_dir(&self.dirs, &m.pod)?),
            None => None,
        };
        // Writes the sandbox's CA beside the mounts it adds.
        crate::sidecars::tls_trust::prepare(
            &mut spec,
            policy,
            id.as_str(),
            &host.sandbox_dir,
            &host.mount_dir,
            &host.rootfs_src,
            pod_mount_dir.as_deref(),
        )
        .map_err(CreateError::Trust)?;
        enforce::apply_runtime_facts(&mut spec, &host.record.rootfs_mount)?;
        let cgroups = crate::host::cgroups::place(
            &crate::host::cgroups::RealHost,
            &mut spec,
            id,
            opts.systemd_cgroup,
            ids.rootless,
        )?;
        let overlay = mounts::overlay_as_bind(&mut spec, &host.mount_dir.join("workspace-merged"))?;
        // Saves the `poststop` hooks for delete.
        let start_hooks =
            crate::enforce::hooks::prepare(&mut spec, &opts.bundle, &host.sandbox_dir)
                .map_err(CreateError::Hook)?;
        // Keep this as the last step: the spec is checked as libcontainer will get it.
        match (member, &host.userns) {
            (Some(m), _) => crate::pod::verify_member(&spec, m)?,
            (None, Some(userns)) => enforce::verify_in_userns(&spec, &userns.pin)?,
            (None, None) => enforce::verify(&spec)?,
        }
        let hardened = Hardened {
            spec,
            plan,
            seccomp_len: executor.seccomp.as_ref().map(|b| b.len()),
            cgroups,
            overlay,
            start_hooks,
        };
        Ok((hardened, executor))
    }
}

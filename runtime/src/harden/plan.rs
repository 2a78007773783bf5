//! The layer plan on this host: what the host supports, which layers a hardened spec gets,
//! and the AppArmor profile of a process where that layer applies.

use agent_sandbox_policy::harden;
use agent_sandbox_policy::layers::{HostSupport, LayerPlan};
use agent_sandbox_policy::{Layer, SandboxPolicy};
use libcontainer::oci_spec::runtime::{Process, Spec};

use super::SandboxError;

/// What the host supports, measured. Landlock's ABI comes from the kernel's own version
/// query (`agent_sandbox_sys::landlock_abi`), the one probe every part of the runtime uses.
pub fn host_support() -> HostSupport {
    HostSupport {
        seccomp: std::fs::read_to_string("/proc/self/status")
            .map(|s| s.contains("Seccomp:"))
            .unwrap_or(false),
        landlock_abi: agent_sandbox_sys::landlock_abi().unwrap_or(0),
        apparmor: crate::host::apparmor::host(),
        cgroups: crate::host::cgroups::available(&crate::host::cgroups::RealHost),
    }
}

/// The layer plan of a hardened spec on a host that supports `support` (see
/// `agent_sandbox_policy::layers::plan`).
pub(super) fn plan_for(
    policy: &SandboxPolicy,
    spec: &Spec,
    support: &HostSupport,
) -> Result<LayerPlan, SandboxError> {
    let plan = agent_sandbox_policy::layers::plan(policy, support, harden::cover_facts(spec))
        .map_err(SandboxError::Layer)?;
    if let Some(at) = &plan.landlock {
        for gap in at.gaps.iter().filter(|g| !g.unused) {
            tracing::info!(
                layer = "landlock",
                kernel_abi = at.kernel_abi,
                right = %gap.right,
                since_abi = gap.since_abi,
                covered_by = ?gap.covered_by,
                "landlock right missing on this kernel"
            );
        }
        for gap in at.uncovered() {
            tracing::warn!(
                layer = "landlock",
                right = %gap.right,
                "landlock right missing and uncovered (landlock is optional)"
            );
        }
    }
    Ok(plan)
}

/// Sets the process's AppArmor profile to the policy's when the plan applies AppArmor. An
/// incoming profile (podman's `containers-default`, CRI's `cri-containerd.apparmor.d`) is
/// replaced: the policy's profile is the one the sandbox's rules were written for.
pub(super) fn set_apparmor(process: &mut Process, policy: &SandboxPolicy, plan: &LayerPlan) {
    if !plan.apply.contains(&Layer::Apparmor) {
        return;
    }
    let name = agent_sandbox_policy::apparmor::loaded_profile(policy).name;
    if let Some(incoming) = process.apparmor_profile()
        && incoming != &name
    {
        tracing::info!(incoming = %incoming, profile = %name, "apparmor profile replaced by the policy's");
    }
    process.set_apparmor_profile(Some(name));
}

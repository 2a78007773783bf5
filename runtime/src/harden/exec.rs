//! Hardening for `exec`: the effective policy of a running sandbox, and an exec'd process
//! clamped like the init.

use agent_sandbox_policy::harden;
use agent_sandbox_policy::layers::LayerPlan;
use agent_sandbox_policy::{SandboxPlan, SandboxPolicy};
use libcontainer::oci_spec::runtime::{Process, Spec};

use super::plan::{plan_for, set_apparmor};
use super::{Ceiling, SandboxError};
use crate::state::SandboxDir;

/// The plan a sandbox was created with (`plan.json`). A sandbox that an older runtime created
/// has none: its plan is derived again from its saved ceiling and `hardened` spec, as that
/// runtime did.
pub fn saved_plan(dir: &SandboxDir, hardened: &Spec) -> Result<SandboxPlan, SandboxError> {
    if let Some(plan) = dir.plan().read_if_present::<SandboxPlan>()? {
        return Ok(plan);
    }
    let ceiling = Ceiling::load_saved(dir)?;
    let (policy, layers) = effective_for_exec(&ceiling, hardened)?;
    Ok(SandboxPlan { policy, layers })
}

/// The effective policy of a running sandbox (for exec): the saved ceiling
/// narrowed by the annotations of its hardened spec.
fn effective_for_exec(
    ceiling: &Ceiling,
    hardened: &Spec,
) -> Result<(SandboxPolicy, LayerPlan), SandboxError> {
    let annotations = hardened.annotations().clone().unwrap_or_default();
    let policy =
        harden::effective_policy_with(&annotations, &ceiling.policy, ceiling.admin_profile())
            .map_err(SandboxError::Harden)?;
    let plan = plan_for(&policy, hardened, &super::host_support())?;
    Ok((policy, plan))
}

/// Clamps an exec'd process with the policy, and gives it the sandbox's AppArmor profile.
pub fn harden_exec(
    process: Process,
    policy: &SandboxPolicy,
    plan: &LayerPlan,
) -> Result<Process, SandboxError> {
    let mut process = harden::harden_process(process, policy).map_err(SandboxError::Harden)?;
    set_apparmor(&mut process, policy, plan);
    Ok(process)
}

#[cfg(test)]
mod tests {
    use agent_sandbox_policy::Layer;

    use super::*;
    use crate::harden::DEFAULT_PROFILE;

    #[test]
    fn every_exec_gets_the_policys_apparmor_profile_where_apparmor_applies() {
        let policy = SandboxPolicy::builtin(DEFAULT_PROFILE).unwrap();
        let mut process = Process::default();
        process.set_apparmor_profile(Some("containers-default-0.50.1".to_owned()));
        let with = LayerPlan {
            apply: vec![Layer::Seccomp, Layer::Landlock, Layer::Apparmor],
            ..LayerPlan::default()
        };
        let name = agent_sandbox_policy::apparmor::loaded_profile(&policy).name;
        let exec = harden_exec(process.clone(), &policy, &with).unwrap();
        assert_eq!(exec.apparmor_profile().as_deref(), Some(name.as_str()));
        // Without the layer (no AppArmor, rootless), the caller's profile is left as it is:
        // any profile is narrower than none.
        let without = LayerPlan {
            apply: vec![Layer::Seccomp, Layer::Landlock],
            ..LayerPlan::default()
        };
        let exec = harden_exec(process, &policy, &without).unwrap();
        assert_eq!(
            exec.apparmor_profile().as_deref(),
            Some("containers-default-0.50.1")
        );
    }
}

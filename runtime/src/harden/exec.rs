//! The plan a created sandbox saved, for exec and every later command; for a sandbox that an
//! older runtime created, derived once more as that runtime did.

use agent_sandbox_policy::{SandboxPlan, harden};
use libcontainer::oci_spec::runtime::{LinuxSeccomp, Spec};

use super::{Ceiling, SandboxError};
use crate::state::SandboxDir;

/// The plan a sandbox was created with (`plan.json`). A sandbox that an older runtime created
/// has none: its plan is derived again from its saved ceiling and `hardened` spec, as that
/// runtime did. A plan without the config's seccomp request (none asked, or saved by a
/// runtime that kept the request apart) takes it from `requested-seccomp.json` if that is
/// there.
pub fn saved_plan(dir: &SandboxDir, hardened: &Spec) -> Result<SandboxPlan, SandboxError> {
    let mut plan = match dir.plan().read_if_present::<SandboxPlan>()? {
        Some(plan) => plan,
        None => derived_plan(dir, hardened)?,
    };
    if plan.requested_seccomp.is_none() {
        plan.requested_seccomp = dir.requested_seccomp().read_if_present::<LinuxSeccomp>()?;
    }
    Ok(plan)
}

/// The plan of a sandbox created without `plan.json`: the saved ceiling narrowed by the
/// annotations of its hardened spec, and the layer plan of that spec on this host.
fn derived_plan(dir: &SandboxDir, hardened: &Spec) -> Result<SandboxPlan, SandboxError> {
    let ceiling = Ceiling::load_saved(dir)?;
    let annotations = hardened.annotations().clone().unwrap_or_default();
    let policy =
        harden::effective_policy_with(&annotations, &ceiling.policy, ceiling.admin_profile())
            .map_err(SandboxError::Harden)?;
    let layers = agent_sandbox_policy::plan::layers_for(&policy, hardened, &super::host_support())
        .map_err(SandboxError::Layer)?;
    Ok(SandboxPlan::bare(policy, layers))
}

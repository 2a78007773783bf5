//! The sandbox plan: what a sandbox's enforcement is decided from, compiled once at create
//! and saved with the sandbox, so that start, exec, `update`, the proxy and a pod's members
//! read the same decision instead of deriving it again from the ceiling and the annotations.

use serde::{Deserialize, Serialize};

use crate::SandboxPolicy;
use crate::layers::LayerPlan;

/// One sandbox's compiled plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The effective policy: the ceiling (or the admin's profile the sandbox named) narrowed
    /// by the sandbox's `io.agent.sandbox.*` annotations.
    pub policy: SandboxPolicy,
    /// The layers that apply on the host the sandbox was created on, the inactive ones with
    /// their reasons, and Landlock's ruleset at that kernel's ABI.
    pub layers: LayerPlan,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{AppArmorHost, HostSupport};

    #[test]
    fn a_plan_reads_back_as_it_was_saved() {
        for name in crate::builtin_names() {
            let policy = SandboxPolicy::builtin(name).unwrap();
            let host = HostSupport {
                seccomp: true,
                landlock_abi: u32::from(crate::landlock::NEWEST_ABI),
                apparmor: AppArmorHost::Absent,
                cgroups: true,
            };
            let facts = crate::landlock::CoverFacts::of_hardened_spec();
            let layers = crate::layers::plan(&policy, &host, facts).unwrap();
            assert!(layers.landlock.is_some(), "{name}: the plan has a ruleset");
            let plan = SandboxPlan { policy, layers };
            let text = serde_json::to_string(&plan).unwrap();
            let back: SandboxPlan = serde_json::from_str(&text).unwrap();
            assert_eq!(back, plan, "{name}");
        }
    }
}

//! The sandbox plan: what a sandbox's enforcement is decided from, compiled once at create
//! and saved with the sandbox, so that start, exec, `update`, the proxy, a pod's members and
//! checkpoint/restore read the same decision instead of deriving it again from the ceiling
//! and the annotations.
//!
//! [`compile`] is the one place that turns a ceiling, an incoming spec and the host's facts
//! into a plan: the effective policy (the ceiling narrowed by the annotations), the hardened
//! spec, the settings it clamped, the protected binds, the config's own seccomp request and
//! the layer plan on this host. Create's host phase needs the effective policy before it
//! can measure the facts (the user namespace's caps, the workspace's change set), so it
//! narrows first ([`crate::harden::effective_policy_with`]) and hands the result to
//! [`compile_under`]; both are this same compiler, run once per sandbox.

use std::collections::BTreeMap;

use oci_spec::runtime::{LinuxSeccomp, Process, Spec};
use serde::{Deserialize, Serialize};

use crate::harden::{self, Clamp, HardenError, HostFacts, ProtectedMount};
use crate::layers::{HostSupport, LayerError, LayerPlan};
use crate::{Layer, SandboxPolicy};

/// One sandbox's compiled plan (`plan.json` in its state dir).
///
/// The fields after `layers` came later: a plan saved by an older runtime has none of them
/// and reads back with them empty; the runtime then takes the config's seccomp request from
/// the file that runtime saved it in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The effective policy: the ceiling (or the admin's profile the sandbox named) narrowed
    /// by the sandbox's `io.agent.sandbox.*` annotations.
    pub policy: SandboxPolicy,
    /// The layers that apply on the host the sandbox was created on, the inactive ones with
    /// their reasons, and Landlock's ruleset at that kernel's ABI.
    pub layers: LayerPlan,
    /// The protected paths found in the workspace, bound read-only (or masked) over it.
    #[serde(default)]
    pub protected: Vec<ProtectedMount>,
    /// Settings of the incoming spec granted narrower (recorded in the audit trail).
    #[serde(default)]
    pub clamped: Vec<Clamp>,
    /// The config's own `linux.seccomp`, honoured beside the policy's filter for the init
    /// and every exec (`crate::seccomp::compile_request`).
    #[serde(default)]
    pub requested_seccomp: Option<LinuxSeccomp>,
    /// The sandbox's credential placeholders, by their `placeholder_env` name: made at create
    /// with a random suffix of the sandbox's own, kept by a restore in place, new for a fork
    /// (`crate::network::placeholder_value`). The proxy and every exec read them here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credential_placeholders: BTreeMap<String, String>,
    /// The layers a restored sandbox's restored processes run without, with the reason: the
    /// checkpoint image could not carry them (docs/checkpoint.md#layers). `layers` still
    /// applies them to every exec started after the restore. Empty unless restored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_restored: Vec<(Layer, String)>,
}

/// What [`compile`] makes: the plan, and the spec hardened under it (the runtime adds its
/// own facts to that spec, ending with its last check, and saves it as the bundle's).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub spec: Spec,
    pub plan: SandboxPlan,
}

/// Why a sandbox's plan could not be compiled. Nothing is changed when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("cannot harden the container spec")]
    Harden(#[source] HardenError),
    #[error("layer plan")]
    Layer(#[source] LayerError),
}

/// Compiles the plan of a sandbox whose config is `spec`, under the ceiling `ceiling` (the
/// admin's profile that the annotations may name is in `facts.profile`).
pub fn compile(
    ceiling: &SandboxPolicy,
    spec: Spec,
    facts: &HostFacts,
) -> Result<Compiled, CompileError> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    let effective = harden::effective_policy_with(&annotations, ceiling, facts.profile.as_ref())
        .map_err(CompileError::Harden)?;
    compile_under(effective, spec, facts)
}

/// [`compile`] with the effective policy already narrowed from the ceiling (create's host
/// phase narrows it first: see the module docs).
pub fn compile_under(
    effective: SandboxPolicy,
    spec: Spec,
    facts: &HostFacts,
) -> Result<Compiled, CompileError> {
    let requested_seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    let hardened =
        harden::harden_spec_under(spec, effective, facts).map_err(CompileError::Harden)?;
    let layers = layers_for(&hardened.policy, &hardened.spec, &facts.support)
        .map_err(CompileError::Layer)?;
    let mut spec = hardened.spec;
    if let Some(process) = spec.process_mut().as_mut() {
        set_apparmor(process, &hardened.policy, &layers);
    }
    for (layer, reason) in &layers.inactive {
        tracing::warn!(layer = %layer, reason = %reason, "sandbox layer inactive");
    }
    Ok(Compiled {
        spec,
        plan: SandboxPlan {
            policy: hardened.policy,
            layers,
            protected: facts.protected.clone(),
            clamped: hardened.clamped,
            requested_seccomp,
            credential_placeholders: BTreeMap::new(),
            not_restored: Vec::new(),
        },
    })
}

/// The layer plan of a hardened spec on a host that supports `support`
/// ([`crate::layers::plan`], with what covers a Landlock right measured from the spec),
/// each Landlock right the kernel lacks logged with what covers it.
pub fn layers_for(
    policy: &SandboxPolicy,
    spec: &Spec,
    support: &HostSupport,
) -> Result<LayerPlan, LayerError> {
    let plan = crate::layers::plan(policy, support, harden::cover_facts(spec))?;
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

impl SandboxPlan {
    /// A plan of `policy` and `layers` alone: no protected binds, clamps, seccomp request or
    /// credential placeholders (a sandbox an older runtime created without `plan.json`).
    pub fn bare(policy: SandboxPolicy, layers: LayerPlan) -> Self {
        Self {
            policy,
            layers,
            protected: Vec::new(),
            clamped: Vec::new(),
            requested_seccomp: None,
            credential_placeholders: BTreeMap::new(),
            not_restored: Vec::new(),
        }
    }

    /// The value the sandbox's `placeholder_env` variable `name` holds: its own placeholder,
    /// or, in a plan that has none (saved by a runtime from before the per-sandbox suffix),
    /// the fixed text that runtime's proxy expects.
    pub fn credential_placeholder(&self, name: &str) -> String {
        self.credential_placeholders
            .get(name)
            .cloned()
            .unwrap_or_else(|| crate::network::legacy_placeholder_value(name))
    }

    /// Notes that the sandbox's restored processes run without `layer` (its checkpoint image
    /// could not carry it, for `reason`) and returns the layer plan they run under: the layer
    /// inactive with the reason, as `layers` and the audit report it. The plan itself keeps
    /// the layer for the execs started after the restore, and names it in `not_restored`.
    pub fn restored_without(&mut self, layer: Layer, reason: &str) -> LayerPlan {
        self.not_restored.push((layer, reason.to_owned()));
        let mut restored = self.layers.clone();
        restored.apply.retain(|l| *l != layer);
        restored.inactive.push((layer, reason.to_owned()));
        if layer == Layer::Landlock {
            restored.landlock = None;
        }
        restored
    }

    /// An exec'd process clamped like the init ([`harden::harden_process`]), with the
    /// sandbox's AppArmor profile where that layer applies.
    pub fn harden_exec(&self, process: Process) -> Result<Process, HardenError> {
        let mut process = harden::harden_process(process, &self.policy)?;
        set_apparmor(&mut process, &self.policy, &self.layers);
        Ok(process)
    }
}

/// Sets the process's AppArmor profile to the policy's when the plan applies AppArmor. An
/// incoming profile (podman's `containers-default`, CRI's `cri-containerd.apparmor.d`) is
/// replaced: the policy's profile is the one the sandbox's rules were written for.
fn set_apparmor(process: &mut Process, policy: &SandboxPolicy, plan: &LayerPlan) {
    if !plan.apply.contains(&Layer::Apparmor) {
        return;
    }
    let name = crate::apparmor::loaded_profile(policy).name;
    if let Some(incoming) = process.apparmor_profile()
        && incoming != &name
    {
        tracing::info!(incoming = %incoming, profile = %name, "apparmor profile replaced by the policy's");
    }
    process.set_apparmor_profile(Some(name));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::AppArmorHost;

    fn host() -> HostSupport {
        HostSupport {
            seccomp: true,
            landlock_abi: u32::from(crate::landlock::NEWEST_ABI),
            apparmor: AppArmorHost::Absent,
            cgroups: true,
        }
    }

    #[test]
    fn a_plan_reads_back_as_it_was_saved() {
        for name in crate::builtin_names() {
            let policy = SandboxPolicy::builtin(name).unwrap();
            let facts = crate::landlock::CoverFacts::of_hardened_spec();
            let layers = crate::layers::plan(&policy, &host(), facts).unwrap();
            assert!(layers.landlock.is_some(), "{name}: the plan has a ruleset");
            let plan = SandboxPlan {
                policy,
                layers,
                protected: vec![ProtectedMount {
                    container_path: "/workspace/.git/hooks".into(),
                    host_path: "/home/u/repo/.git/hooks".into(),
                    dir: true,
                    secret: false,
                }],
                clamped: vec![Clamp {
                    key: "process.oomScoreAdj".to_owned(),
                    requested: "-999".to_owned(),
                    granted: "0".to_owned(),
                }],
                requested_seccomp: Some(LinuxSeccomp::default()),
                credential_placeholders: BTreeMap::new(),
                not_restored: vec![(Layer::Landlock, "not in the image".to_owned())],
            };
            let text = serde_json::to_string(&plan).unwrap();
            let back: SandboxPlan = serde_json::from_str(&text).unwrap();
            assert_eq!(back, plan, "{name}");
        }
    }

    /// A plan saved by the runtime before the plan held the protected binds, the clamps and
    /// the seccomp request reads back with those empty (its sandbox must still exec).
    #[test]
    fn a_plan_saved_before_the_later_fields_reads_back_with_them_empty() {
        let policy = SandboxPolicy::builtin("agent").unwrap();
        let layers = LayerPlan {
            apply: vec![Layer::Seccomp],
            ..LayerPlan::default()
        };
        let old = serde_json::json!({ "policy": policy, "layers": layers });
        let back: SandboxPlan = serde_json::from_value(old).unwrap();
        assert_eq!(back.policy, policy);
        assert_eq!(back.layers, layers);
        assert!(back.protected.is_empty() && back.clamped.is_empty());
        assert_eq!(back.requested_seccomp, None);
        assert!(back.not_restored.is_empty());
    }

    /// A restore that cannot carry Landlock: the restored processes' layers say it is
    /// inactive, and the saved plan says so too (`not_restored`) while it keeps the ruleset
    /// every later exec is confined by.
    #[test]
    fn a_restored_plan_names_the_layer_its_restored_processes_lack() {
        let policy = SandboxPolicy::builtin("agent").unwrap();
        let facts = crate::landlock::CoverFacts::of_hardened_spec();
        let layers = crate::layers::plan(&policy, &host(), facts).unwrap();
        assert!(layers.apply.contains(&Layer::Landlock));
        let mut plan = SandboxPlan::bare(policy, layers.clone());
        let restored = plan.restored_without(Layer::Landlock, "not in the image");
        assert!(!restored.apply.contains(&Layer::Landlock));
        assert!(restored.landlock.is_none());
        assert_eq!(
            restored.inactive.last(),
            Some(&(Layer::Landlock, "not in the image".to_owned()))
        );
        assert_eq!(plan.layers, layers, "later execs keep the layer");
        assert_eq!(
            plan.not_restored,
            [(Layer::Landlock, "not in the image".to_owned())]
        );
        let saved: serde_json::Value = serde_json::to_value(&plan).unwrap();
        assert_eq!(
            saved["not_restored"],
            serde_json::json!([["landlock", "not in the image"]])
        );
    }

    #[test]
    fn every_exec_gets_the_policys_apparmor_profile_where_apparmor_applies() {
        let policy = SandboxPolicy::builtin("agent").unwrap();
        let mut process = Process::default();
        process.set_apparmor_profile(Some("containers-default-0.50.1".to_owned()));
        let plan = |apply: Vec<Layer>| SandboxPlan {
            policy: policy.clone(),
            layers: LayerPlan {
                apply,
                ..LayerPlan::default()
            },
            protected: Vec::new(),
            clamped: Vec::new(),
            requested_seccomp: None,
            credential_placeholders: BTreeMap::new(),
            not_restored: Vec::new(),
        };
        let with = plan(vec![Layer::Seccomp, Layer::Landlock, Layer::Apparmor]);
        let name = crate::apparmor::loaded_profile(&policy).name;
        let exec = with.harden_exec(process.clone()).unwrap();
        assert_eq!(exec.apparmor_profile().as_deref(), Some(name.as_str()));
        // Without the layer (no AppArmor, rootless), the caller's profile is left as it is:
        // any profile is narrower than none.
        let without = plan(vec![Layer::Seccomp, Layer::Landlock]);
        let exec = without.harden_exec(process).unwrap();
        assert_eq!(
            exec.apparmor_profile().as_deref(),
            Some("containers-default-0.50.1")
        );
    }
}

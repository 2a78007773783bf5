//! Which enforcement layers a sandbox needs, and the pure decision of what to do when the
//! host lacks one: apply, report inactive (only if the policy says `optional`), or fail.

use serde::{Deserialize, Serialize};

use crate::SandboxPolicy;
use crate::landlock::{CoverFacts, Gap, LandlockAtAbi};

/// A layer the host could not provide although the policy requires it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    #[error("required layer {layer} is not available on this host")]
    Unavailable { layer: Layer },
    #[error("required layer apparmor cannot be applied: {reason}")]
    AppArmorUnusable { reason: String },
    #[error(
        "required layer landlock: the kernel's Landlock ABI {kernel_abi} lacks {right} (ABI {since_abi}) and no other layer of this sandbox covers it"
    )]
    LandlockRightUncovered {
        right: Gap,
        since_abi: u8,
        kernel_abi: u32,
    },
}

/// An enforcement mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    Seccomp,
    Landlock,
    Apparmor,
    Cgroups,
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layer::Seccomp => "seccomp",
            Layer::Landlock => "landlock",
            Layer::Apparmor => "apparmor",
            Layer::Cgroups => "cgroups",
        })
    }
}

/// Whether a layer must be applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Requirement {
    /// Missing on the host: the create fails naming the layer.
    #[default]
    Required,
    /// Missing on the host: the sandbox runs and reports the layer inactive.
    Optional,
}

/// AppArmor's requirement, which may also be met by Landlock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AppArmorRequirement {
    Required,
    Optional,
    /// Required where the host has AppArmor; where it has none, Landlock (applied) covers
    /// the filesystem rules instead.
    #[default]
    LandlockFallback,
}

/// The `[layers]` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Layers {
    pub seccomp: Requirement,
    pub landlock: Requirement,
    pub apparmor: AppArmorRequirement,
    pub cgroups: Requirement,
}

/// What the host offers, as probed by the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSupport {
    pub seccomp: bool,
    /// The kernel's Landlock ABI version; 0: no Landlock (not built, or off at boot).
    pub landlock_abi: u32,
    pub apparmor: AppArmorHost,
    pub cgroups: bool,
}

impl HostSupport {
    /// Landlock at any ABI.
    pub fn landlock(&self) -> bool {
        self.landlock_abi >= 1
    }
}

/// AppArmor on this host, for this runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AppArmorHost {
    /// The kernel has no AppArmor, or it is off.
    #[default]
    Absent,
    /// The kernel has it but this runtime cannot load a profile (rootless, no
    /// `apparmor_parser`, no securityfs).
    Unusable { reason: String },
    /// Profiles can be loaded and applied.
    Usable,
}

/// The outcome of [`Layers::plan`] and [`plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPlan {
    /// Layers to apply, in order.
    pub apply: Vec<Layer>,
    /// Layers not applied, with the reason to report.
    pub inactive: Vec<(Layer, String)>,
    /// The Landlock ruleset at the kernel's ABI, with what covers each right it lacks
    /// (set by [`plan`] when Landlock applies).
    pub landlock: Option<LandlockAtAbi>,
}

/// The whole decision for one sandbox on one host: which layers apply ([`Layers::plan`]),
/// and, for Landlock, the ruleset at the kernel's ABI. A right the kernel lacks is
/// acceptable when another layer of the sandbox covers it (`facts`, from the hardened
/// spec); one that nothing covers fails a `required` Landlock layer and is reported
/// uncovered under an `optional` one.
pub fn plan(
    policy: &SandboxPolicy,
    host: &HostSupport,
    facts: CoverFacts,
) -> Result<LayerPlan, LayerError> {
    let mut plan = policy.layers.plan(host)?;
    if plan.apply.contains(&Layer::Landlock) {
        let facts = CoverFacts {
            apparmor: plan.apply.contains(&Layer::Apparmor),
            ..facts
        };
        let at =
            crate::landlock::at_abi(&crate::landlock::ruleset(policy), host.landlock_abi, &facts);
        if policy.layers.landlock == Requirement::Required
            && let Some(gap) = at.uncovered().next()
        {
            return Err(LayerError::LandlockRightUncovered {
                right: gap.right,
                since_abi: gap.since_abi,
                kernel_abi: host.landlock_abi,
            });
        }
        plan.landlock = Some(at);
    }
    Ok(plan)
}

impl Layers {
    /// Decide which layers to apply on a host. Fails on the first required layer the
    /// host lacks.
    pub fn plan(&self, host: &HostSupport) -> Result<LayerPlan, LayerError> {
        let mut plan = LayerPlan::default();
        let simple = [
            (Layer::Seccomp, self.seccomp, host.seccomp),
            (Layer::Landlock, self.landlock, host.landlock()),
            (Layer::Cgroups, self.cgroups, host.cgroups),
        ];
        for (layer, requirement, present) in simple {
            match (present, requirement) {
                (true, _) => plan.apply.push(layer),
                (false, Requirement::Optional) => plan
                    .inactive
                    .push((layer, "not available on this host (optional)".to_owned())),
                (false, Requirement::Required) => return Err(LayerError::Unavailable { layer }),
            }
        }
        let landlock_applied = plan.apply.contains(&Layer::Landlock);
        let missing = match &host.apparmor {
            AppArmorHost::Usable => None,
            AppArmorHost::Absent => Some("not available on this host".to_owned()),
            AppArmorHost::Unusable { reason } => Some(reason.clone()),
        };
        match (missing, self.apparmor) {
            (None, _) => plan.apply.push(Layer::Apparmor),
            (Some(why), AppArmorRequirement::Optional) => plan
                .inactive
                .push((Layer::Apparmor, format!("{why} (optional)"))),
            (Some(why), AppArmorRequirement::LandlockFallback) if landlock_applied => {
                plan.inactive.push((
                    Layer::Apparmor,
                    format!("{why}; Landlock enforces the filesystem rules"),
                ));
            }
            (Some(_), _) if host.apparmor == AppArmorHost::Absent => {
                return Err(LayerError::Unavailable {
                    layer: Layer::Apparmor,
                });
            }
            (Some(reason), _) => return Err(LayerError::AppArmorUnusable { reason }),
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apparmor_falls_back_to_landlock_only_when_landlock_applies() {
        let layers = Layers::default();
        let host = HostSupport {
            seccomp: true,
            landlock_abi: 7,
            apparmor: AppArmorHost::Absent,
            cgroups: true,
        };
        let plan = layers.plan(&host).unwrap();
        assert!(plan.apply.contains(&Layer::Landlock));
        assert_eq!(plan.inactive[0].0, Layer::Apparmor);

        let optional_landlock = Layers {
            landlock: Requirement::Optional,
            ..Layers::default()
        };
        let no_lsm = HostSupport {
            landlock_abi: 0,
            ..host
        };
        assert_eq!(
            optional_landlock.plan(&no_lsm),
            Err(LayerError::Unavailable {
                layer: Layer::Apparmor
            })
        );
    }

    #[test]
    fn required_layer_missing_is_an_error() {
        let host = HostSupport {
            seccomp: true,
            landlock_abi: 7,
            apparmor: AppArmorHost::Usable,
            cgroups: false,
        };
        assert_eq!(
            Layers::default().plan(&host),
            Err(LayerError::Unavailable {
                layer: Layer::Cgroups
            })
        );
    }

    fn spec_facts() -> CoverFacts {
        CoverFacts::of_hardened_spec()
    }

    #[test]
    fn required_landlock_runs_on_every_abi_whose_gaps_are_covered() {
        let policy = SandboxPolicy::builtin("agent").unwrap();
        for abi in 1..=10 {
            let host = HostSupport {
                seccomp: true,
                landlock_abi: abi,
                apparmor: AppArmorHost::Absent,
                cgroups: true,
            };
            let plan = plan(&policy, &host, spec_facts()).unwrap();
            let at = plan.landlock.unwrap();
            assert_eq!(u32::from(at.abi), abi);
        }
        // No Landlock at all is still a missing required layer.
        let none = HostSupport {
            seccomp: true,
            landlock_abi: 0,
            apparmor: AppArmorHost::Absent,
            cgroups: true,
        };
        assert_eq!(
            plan(&policy, &none, spec_facts()),
            Err(LayerError::Unavailable {
                layer: Layer::Landlock
            })
        );
    }

    #[test]
    fn an_uncovered_right_fails_required_and_is_reported_under_optional() {
        let mut policy = SandboxPolicy::builtin("agent").unwrap();
        let host = HostSupport {
            seccomp: true,
            landlock_abi: 2,
            apparmor: AppArmorHost::Absent,
            cgroups: true,
        };
        let facts = CoverFacts {
            readonly_mounts: false,
            ..spec_facts()
        };
        assert_eq!(
            plan(&policy, &host, facts),
            Err(LayerError::LandlockRightUncovered {
                right: Gap::Truncate,
                since_abi: 3,
                kernel_abi: 2
            })
        );
        // AppArmor's file rules cover it where AppArmor applies.
        let with_apparmor = HostSupport {
            apparmor: AppArmorHost::Usable,
            ..host.clone()
        };
        let p = plan(&policy, &with_apparmor, facts).unwrap();
        assert!(p.landlock.unwrap().uncovered().next().is_none());
        policy.layers.landlock = Requirement::Optional;
        let p = plan(&policy, &host, facts).unwrap();
        let gaps: Vec<Gap> = p.landlock.unwrap().uncovered().map(|g| g.right).collect();
        assert_eq!(gaps, [Gap::Truncate]);
    }

    #[test]
    fn apparmor_the_runtime_cannot_load_names_the_reason() {
        let host = HostSupport {
            seccomp: true,
            landlock_abi: 7,
            apparmor: AppArmorHost::Unusable {
                reason: "rootless".into(),
            },
            cgroups: true,
        };
        let plan = Layers::default().plan(&host).unwrap();
        assert_eq!(
            plan.inactive,
            [(
                Layer::Apparmor,
                "rootless; Landlock enforces the filesystem rules".to_owned()
            )]
        );
        let required = Layers {
            apparmor: AppArmorRequirement::Required,
            ..Layers::default()
        };
        assert_eq!(
            required.plan(&host),
            Err(LayerError::AppArmorUnusable {
                reason: "rootless".into()
            })
        );
    }
}

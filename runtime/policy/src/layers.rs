//! Which enforcement layers a sandbox needs, and the pure decision of what to do when the
//! host lacks one: apply, report inactive (only if the policy says `optional`), or fail.

use serde::{Deserialize, Serialize};

/// A layer the host could not provide although the policy requires it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    #[error("required layer {layer} is not available on this host")]
    Unavailable { layer: Layer },
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostSupport {
    pub seccomp: bool,
    pub landlock: bool,
    pub apparmor: bool,
    pub cgroups: bool,
}

/// The outcome of [`Layers::plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LayerPlan {
    /// Layers to apply, in order.
    pub apply: Vec<Layer>,
    /// Layers not applied, with the reason to report.
    pub inactive: Vec<(Layer, String)>,
}

impl Layers {
    /// Decide which layers to apply on a host. Fails on the first required layer the
    /// host lacks.
    pub fn plan(&self, host: &HostSupport) -> Result<LayerPlan, LayerError> {
        let mut plan = LayerPlan::default();
        let simple = [
            (Layer::Seccomp, self.seccomp, host.seccomp),
            (Layer::Landlock, self.landlock, host.landlock),
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
        match (host.apparmor, self.apparmor) {
            (true, _) => plan.apply.push(Layer::Apparmor),
            (false, AppArmorRequirement::Optional) => plan.inactive.push((
                Layer::Apparmor,
                "not available on this host (optional)".to_owned(),
            )),
            (false, AppArmorRequirement::LandlockFallback) if landlock_applied => {
                plan.inactive.push((
                    Layer::Apparmor,
                    "not available on this host; Landlock enforces the filesystem rules".to_owned(),
                ));
            }
            (false, _) => {
                return Err(LayerError::Unavailable {
                    layer: Layer::Apparmor,
                });
            }
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
            landlock: true,
            apparmor: false,
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
            landlock: false,
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
            landlock: true,
            apparmor: true,
            cgroups: false,
        };
        assert_eq!(
            Layers::default().plan(&host),
            Err(LayerError::Unavailable {
                layer: Layer::Cgroups
            })
        );
    }
}

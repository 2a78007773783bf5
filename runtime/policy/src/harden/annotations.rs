//! The effective policy: the ceiling narrowed by the spec's `io.agent.sandbox.*`
//! annotations and the profile they may name, never widened (docs/policy.md).

use std::collections::{BTreeMap, HashMap};

use crate::narrow::{self, NarrowError};
use crate::network::DomainRule;
use crate::policy::{NetworkMode, SandboxPolicy};
use crate::profiles::{AdminProfile, Requested};
use crate::value::{ByteSize, Capability, Seconds};

use super::{ANNOTATION_PREFIX, ANNOTATION_PROFILE, AnnotationValueError, HardenError};

/// Read the `io.agent.sandbox.*` annotations and return the policy they select and
/// narrow. Fails on an unknown key, a bad value, or anything wider than `ceiling`. Only
/// built-in profiles can be selected: see [`effective_policy_with`].
pub fn effective_policy(
    annotations: &HashMap<String, String>,
    ceiling: &SandboxPolicy,
) -> Result<SandboxPolicy, HardenError> {
    effective_policy_with(annotations, ceiling, None)
}

/// [`effective_policy`], where the profile annotation may also name `admin`: the profile the
/// runtime read from the admin's profiles directory for these annotations. A name that is
/// neither built in nor `admin`'s is an error, as is a profile wider than `ceiling`.
#[expect(clippy::too_many_lines)]
pub fn effective_policy_with(
    annotations: &HashMap<String, String>,
    ceiling: &SandboxPolicy,
    admin: Option<&AdminProfile>,
) -> Result<SandboxPolicy, HardenError> {
    // Sorted so errors are deterministic.
    let ours: BTreeMap<&str, &str> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut policy = ceiling.clone();
    let requested =
        crate::profiles::requested(annotations).map_err(|source| HardenError::BadAnnotation {
            annotation: ANNOTATION_PROFILE.to_owned(),
            value: ours
                .get(ANNOTATION_PROFILE)
                .copied()
                .unwrap_or_default()
                .to_owned(),
            source: AnnotationValueError::ProfileName { reason: source },
        })?;
    if let Some(requested) = requested {
        let selected = match requested {
            Requested::Builtin(name) => {
                SandboxPolicy::builtin(name).map_err(|source| HardenError::UnknownProfile {
                    annotation: ANNOTATION_PROFILE.to_owned(),
                    source: Box::new(source),
                })?
            }
            Requested::Admin(name) => match admin {
                Some(profile) if profile.name == name => profile.policy.clone(),
                _ => {
                    return Err(HardenError::ProfileNotLoaded {
                        annotation: ANNOTATION_PROFILE.to_owned(),
                        name: name.to_string(),
                    });
                }
            },
        };
        narrow::within(&selected, ceiling).map_err(|source| HardenError::AnnotationWidens {
            annotation: ANNOTATION_PROFILE.to_owned(),
            source,
        })?;
        policy = selected;
    }
    for (&key, &value) in &ours {
        if key == ANNOTATION_PROFILE {
            continue;
        }
        let bad = |source: AnnotationValueError| HardenError::BadAnnotation {
            annotation: key.to_owned(),
            value: value.to_owned(),
            source,
        };
        let before = policy.clone();
        let suffix = key.trim_start_matches(ANNOTATION_PREFIX);
        match suffix {
            "network" => {
                policy.network.mode = match value.trim() {
                    "none" => NetworkMode::None,
                    "proxy" => NetworkMode::Proxy,
                    _ => return Err(bad(AnnotationValueError::NetworkMode)),
                };
                if policy.network.mode == NetworkMode::None {
                    policy.network.allow.clear();
                    policy.network.deny.clear();
                }
            }
            "network.allow" => {
                let rules = parse_rules(value).map_err(bad)?;
                if rules.is_empty() {
                    policy.network.mode = NetworkMode::None;
                    policy.network.allow.clear();
                    policy.network.deny.clear();
                } else if policy.network.mode == NetworkMode::None {
                    // Asking for hosts where the policy allows no network at all.
                    return Err(HardenError::AnnotationWidens {
                        annotation: key.to_owned(),
                        source: NarrowError::NetworkMode,
                    });
                } else {
                    policy.network.allow = rules;
                }
            }
            "network.deny" => {
                if policy.network.mode == NetworkMode::Proxy {
                    policy.network.deny.extend(parse_rules(value).map_err(bad)?);
                }
            }
            "network.local-ports" => {
                policy.network.local_ports = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse::<std::num::NonZeroU16>().map(u16::from))
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(AnnotationValueError::Number(e)))?;
            }
            "memory" => {
                policy.resources.memory =
                    ByteSize::try_from(value.trim()).map_err(|e| bad(e.into()))?;
            }
            "pids" => {
                policy.resources.pids = value
                    .trim()
                    .parse()
                    .map_err(|e| bad(AnnotationValueError::Number(e)))?
            }
            "cpu-shares" => {
                policy.resources.cpu_shares = value
                    .trim()
                    .parse()
                    .map_err(|e| bad(AnnotationValueError::Number(e)))?;
            }
            "cpu-quota-us" => {
                policy.resources.cpu_quota_us = value
                    .trim()
                    .parse()
                    .map_err(|e| bad(AnnotationValueError::Number(e)))?;
            }
            "wall-clock" => {
                policy.resources.wall_clock =
                    Seconds::try_from(value.trim()).map_err(|e| bad(e.into()))?;
            }
            "capabilities" => {
                policy.privileges.capabilities = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Capability::try_from(s.to_owned()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(e.into()))?;
            }
            _ => {
                return Err(HardenError::UnknownAnnotation {
                    annotation: key.to_owned(),
                });
            }
        }
        narrow::within(&policy, &before).map_err(|source| HardenError::AnnotationWidens {
            annotation: key.to_owned(),
            source,
        })?;
    }
    // Belt and braces: the whole result against the ceiling.
    narrow::within(&policy, ceiling).map_err(|source| HardenError::AnnotationWidens {
        annotation: ANNOTATION_PREFIX.to_owned() + "*",
        source,
    })?;
    Ok(policy)
}

pub(super) fn parse_rules(value: &str) -> Result<Vec<DomainRule>, AnnotationValueError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| DomainRule::parse(s).map_err(AnnotationValueError::from))
        .collect()
}

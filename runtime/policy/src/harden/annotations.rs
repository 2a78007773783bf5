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
    let mut policy =
        selected_profile(annotations, &ours, ceiling, admin)?.unwrap_or_else(|| ceiling.clone());
    for (&key, &value) in &ours {
        if key == ANNOTATION_PROFILE {
            continue;
        }
        let before = policy.clone();
        narrow_by(&mut policy, key, value)?;
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

/// The profile the profile annotation selects, checked against `ceiling`; `None` without one.
fn selected_profile(
    annotations: &HashMap<String, String>,
    ours: &BTreeMap<&str, &str>,
    ceiling: &SandboxPolicy,
    admin: Option<&AdminProfile>,
) -> Result<Option<SandboxPolicy>, HardenError> {
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
    let Some(requested) = requested else {
        return Ok(None);
    };
    {
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
        Ok(Some(selected))
    }
}

/// A decimal number, spaces around it allowed.
fn number<T: std::str::FromStr<Err = std::num::ParseIntError>>(
    value: &str,
) -> Result<T, AnnotationValueError> {
    value.trim().parse().map_err(AnnotationValueError::Number)
}

/// Narrows `policy` by one annotation, `key` = `value` (docs/policy.md#annotations).
fn narrow_by(policy: &mut SandboxPolicy, key: &str, value: &str) -> Result<(), HardenError> {
    let bad = |source: AnnotationValueError| HardenError::BadAnnotation {
        annotation: key.to_owned(),
        value: value.to_owned(),
        source,
    };
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
            policy.resources.pids = number(value).map_err(bad)?;
        }
        "cpu-shares" => {
            policy.resources.cpu_shares = number(value).map_err(bad)?;
        }
        "cpu-quota-us" => {
            policy.resources.cpu_quota_us = number(value).map_err(bad)?;
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
    Ok(())
}

pub(super) fn parse_rules(value: &str) -> Result<Vec<DomainRule>, AnnotationValueError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| DomainRule::parse(s).map_err(AnnotationValueError::from))
        .collect()
}

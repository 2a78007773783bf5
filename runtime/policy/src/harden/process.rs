//! The process: `--privileged` refused, capability requests clamped to the policy,
//! `no_new_privs`, no negative OOM score adjustment.

use std::collections::HashSet;

use oci_spec::runtime::{LinuxCapabilities, Process, Spec};

use crate::policy::SandboxPolicy;
use crate::value::Capability;

use super::mounts::is_safe_device;
use super::{Clamp, ENGINE_DEFAULT_CAPABILITIES, HardenError};

/// Clamp an exec'd process's spec (containerd and podman send one per exec) the same way
/// as the init process: capabilities within the policy, `no_new_privs`, no negative OOM
/// score adjustment. The runtime must apply the seccomp filter and Landlock to it too.
pub fn harden_process(
    mut process: Process,
    policy: &SandboxPolicy,
) -> Result<Process, HardenError> {
    capability_requests(&process, policy)?;
    process.set_no_new_privileges(Some(true));
    process.set_capabilities(Some(clamp_capabilities(
        process.capabilities().as_ref(),
        &policy.privileges.capabilities,
    )));
    if let Some(adj) = process.oom_score_adj() {
        process.set_oom_score_adj(Some(adj.max(0)));
    }
    // runc 1.1.5 folds repeated `additionalGids` into one (the kernel would keep both).
    if let Some(gids) = process.user().additional_gids().clone() {
        let mut seen = HashSet::new();
        let unique: Vec<u32> = gids.into_iter().filter(|g| seen.insert(*g)).collect();
        let mut user = process.user().clone();
        user.set_additional_gids(Some(unique));
        process.set_user(user);
    }
    Ok(process)
}

/// The shape `--privileged` gives a container (podman, Docker, `ctr --privileged` alike): every
/// capability in the bounding set and the host's devices. Refused up front with one sentence
/// about privilege rather than by the first device it lists.
pub(super) fn check_privileged(spec: &Spec, process: &Process) -> Result<(), HardenError> {
    let sys_admin = process
        .capabilities()
        .as_ref()
        .and_then(|c| c.bounding().as_ref())
        .is_some_and(|b| b.contains(&oci_spec::runtime::Capability::SysAdmin));
    if !sys_admin {
        return Ok(());
    }
    let host_device = spec
        .linux()
        .as_ref()
        .and_then(|l| l.devices().as_ref())
        .into_iter()
        .flatten()
        .find(|d| !is_safe_device(d.typ(), d.major(), d.minor()));
    match host_device {
        Some(d) => Err(HardenError::Privileged {
            device: d.path().clone(),
        }),
        None => Ok(()),
    }
}

/// The name the spec uses for a capability (`CAP_CHOWN`).
pub(super) fn capability_name(c: &oci_spec::runtime::Capability) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{c:?}"))
}

/// A list of names for a [`Clamp`]: comma-separated, `none` when empty.
pub(super) fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

/// `process.capabilities`: a capability the policy does not grant is refused unless an
/// engine sends it by default ([`ENGINE_DEFAULT_CAPABILITIES`]); each set the policy narrows
/// gives one [`Clamp`].
pub(super) fn capability_requests(
    process: &Process,
    policy: &SandboxPolicy,
) -> Result<Vec<Clamp>, HardenError> {
    let allowed: HashSet<&str> = policy
        .privileges
        .capabilities
        .iter()
        .map(Capability::as_str)
        .collect();
    let Some(caps) = process.capabilities() else {
        return Ok(Vec::new());
    };
    let sets = [
        ("bounding", caps.bounding()),
        ("effective", caps.effective()),
        ("permitted", caps.permitted()),
        ("inheritable", caps.inheritable()),
        ("ambient", caps.ambient()),
    ];
    let mut clamps = Vec::new();
    for (set, names) in sets {
        let Some(names) = names else { continue };
        let mut requested: Vec<String> = names.iter().map(capability_name).collect();
        requested.sort();
        let key = format!("process.capabilities.{set}");
        if let Some(wide) = requested.iter().find(|n| {
            !allowed.contains(n.as_str()) && !ENGINE_DEFAULT_CAPABILITIES.contains(&n.as_str())
        }) {
            return Err(HardenError::Widens {
                key,
                requested: wide.clone(),
                reason: "no engine sends this capability by default (it comes from --cap-add or a pod's capabilities.add) and the policy's [privileges] capabilities do not grant it",
            });
        }
        let granted: Vec<String> = requested
            .iter()
            .filter(|n| allowed.contains(n.as_str()))
            .cloned()
            .collect();
        if granted.len() < requested.len() {
            clamps.push(Clamp {
                key,
                requested: name_list(&requested),
                granted: name_list(&granted),
            });
        }
    }
    Ok(clamps)
}

/// `linux.seccomp`: none at all is what `seccomp=unconfined` sends, and also ctr's default
/// (without `--seccomp`). The policy's filter applies anyway, so the request is clamped.
pub(super) fn seccomp_request(spec: &Spec) -> Option<Clamp> {
    let requested = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref());
    requested.is_none().then(|| Clamp {
        key: "linux.seccomp".to_owned(),
        requested: "none (unconfined)".to_owned(),
        granted: "the policy's filter".to_owned(),
    })
}

pub(super) fn clamp_capabilities(
    incoming: Option<&LinuxCapabilities>,
    allowed: &[Capability],
) -> LinuxCapabilities {
    let allowed: HashSet<&str> = allowed.iter().map(Capability::as_str).collect();
    let keep = |set: Option<&oci_spec::runtime::Capabilities>| {
        let kept: oci_spec::runtime::Capabilities = set
            .into_iter()
            .flatten()
            .filter(|c| {
                serde_json::to_value(c)
                    .ok()
                    .and_then(|v| v.as_str().map(|s| allowed.contains(s)))
                    .unwrap_or(false)
            })
            .copied()
            .collect();
        Some(kept)
    };
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(keep(incoming.and_then(|c| c.bounding().as_ref())));
    caps.set_effective(keep(incoming.and_then(|c| c.effective().as_ref())));
    caps.set_permitted(keep(incoming.and_then(|c| c.permitted().as_ref())));
    caps.set_inheritable(keep(incoming.and_then(|c| c.inheritable().as_ref())));
    caps.set_ambient(keep(incoming.and_then(|c| c.ambient().as_ref())));
    caps
}

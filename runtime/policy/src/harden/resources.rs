//! Cgroup limits and device rules: each limit at most the policy's, only the standard
//! safe devices.

use oci_spec::runtime::{
    LinuxCpu, LinuxDeviceCgroup, LinuxDeviceType, LinuxMemory, LinuxPids, LinuxResources,
};

use crate::policy::SandboxPolicy;

use super::{Clamp, HardenError};

pub(super) fn min_opt_i64(incoming: Option<i64>, policy: i64) -> i64 {
    match incoming {
        Some(v) if v > 0 => v.min(policy),
        _ => policy,
    }
}

/// A [`Clamp`] when the spec set `key` explicitly and the sandbox grants less (an unset key
/// is no request: the policy's limit applies).
pub(super) fn resource_clamp(key: &str, requested: Option<i64>, granted: i64) -> Option<Clamp> {
    let requested = requested?;
    let unlimited = requested <= 0;
    (unlimited || requested > granted).then(|| Clamp {
        key: key.to_owned(),
        requested: if unlimited {
            format!("{requested} (unlimited)")
        } else {
            requested.to_string()
        },
        granted: granted.to_string(),
    })
}

/// The cgroup limits: each at most the policy's, an explicit larger (or unlimited) value
/// clamped with a [`Clamp`] naming its key.
pub(super) fn clamp_resources(
    incoming: Option<LinuxResources>,
    policy: &SandboxPolicy,
) -> Result<(LinuxResources, Vec<Clamp>), HardenError> {
    let r = &policy.resources;
    let mut clamps = Vec::new();
    let mut res = incoming.unwrap_or_default();
    if let Some(key) = res.unified().as_ref().and_then(|u| u.keys().next()) {
        return Err(HardenError::UnifiedResource { key: key.clone() });
    }
    res.set_memory(Some(clamp_memory(
        res.memory().unwrap_or_default(),
        policy,
        &mut clamps,
    )));

    let mut pids = LinuxPids::default();
    let requested_pids = res.pids().map(|p| p.limit());
    let pids_limit = min_opt_i64(requested_pids, i64::from(r.pids));
    clamps.extend(resource_clamp(
        "linux.resources.pids.limit",
        requested_pids,
        pids_limit,
    ));
    pids.set_limit(pids_limit);
    res.set_pids(Some(pids));

    res.set_cpu(Some(clamp_cpu(
        res.cpu().clone().unwrap_or_default(),
        policy,
        &mut clamps,
    )));

    res.set_devices(Some(device_rules()));
    Ok((res, clamps))
}

/// Memory at most the policy's, memory+swap equal to it (no swap on top), the OOM killer on.
fn clamp_memory(
    old_mem: LinuxMemory,
    policy: &SandboxPolicy,
    clamps: &mut Vec<Clamp>,
) -> LinuxMemory {
    let r = &policy.resources;
    let policy_memory = i64::try_from(r.memory.bytes()).unwrap_or(i64::MAX);
    let limit = min_opt_i64(old_mem.limit(), policy_memory);
    clamps.extend(resource_clamp(
        "linux.resources.memory.limit",
        old_mem.limit(),
        limit,
    ));
    // memory+swap equal to memory: no swap on top of the limit.
    clamps.extend(resource_clamp(
        "linux.resources.memory.swap",
        old_mem.swap(),
        limit,
    ));
    let mut mem = LinuxMemory::default();
    mem.set_limit(Some(limit));
    mem.set_swap(Some(limit));
    if let Some(reservation) = old_mem.reservation() {
        mem.set_reservation(Some(reservation.min(limit)));
    }
    mem.set_swappiness(old_mem.swappiness());
    mem.set_disable_oom_killer(Some(false));
    mem
}

/// CPU shares and the quota/period ratio at most the policy's; cpusets kept.
fn clamp_cpu(old_cpu: LinuxCpu, policy: &SandboxPolicy, clamps: &mut Vec<Clamp>) -> LinuxCpu {
    let r = &policy.resources;
    let mut cpu = LinuxCpu::default();
    let shares = old_cpu
        .shares()
        .filter(|s| *s > 0)
        .map_or(r.cpu_shares, |s| s.min(r.cpu_shares));
    if let Some(asked) = old_cpu.shares().filter(|s| *s > shares) {
        clamps.push(Clamp {
            key: "linux.resources.cpu.shares".to_owned(),
            requested: asked.to_string(),
            granted: shares.to_string(),
        });
    }
    cpu.set_shares(Some(shares));
    let policy_quota = i64::try_from(r.cpu_quota_us).unwrap_or(i64::MAX);
    let (quota, period) = match (old_cpu.quota(), old_cpu.period()) {
        (Some(q), Some(p)) if q > 0 && p > 0 => {
            let (q_u, p_u) = (q.unsigned_abs(), p);
            // Keep the incoming pair only if its ratio is at most the policy's.
            if u128::from(q_u) * u128::from(r.cpu_period_us)
                <= u128::from(r.cpu_quota_us) * u128::from(p_u)
            {
                (q, p)
            } else {
                (policy_quota, r.cpu_period_us)
            }
        }
        _ => (policy_quota, r.cpu_period_us),
    };
    if let Some(asked) = old_cpu.quota()
        && (asked, old_cpu.period()) != (quota, Some(period))
    {
        clamps.push(Clamp {
            key: "linux.resources.cpu.quota".to_owned(),
            requested: match old_cpu.period() {
                Some(p) => format!("{asked} per {p}"),
                None => asked.to_string(),
            },
            granted: format!("{quota} per {period}"),
        });
    }
    cpu.set_quota(Some(quota));
    cpu.set_period(Some(period));
    cpu.set_cpus(old_cpu.cpus().clone());
    cpu.set_mems(old_cpu.mems().clone());
    cpu
}

/// Deny every device, then allow the standard safe ones.
pub(super) fn device_rules() -> Vec<LinuxDeviceCgroup> {
    let rule = |allow: bool, major: Option<i64>, minor: Option<i64>| {
        let mut d = LinuxDeviceCgroup::default();
        d.set_allow(allow);
        d.set_typ(Some(if allow {
            LinuxDeviceType::C
        } else {
            LinuxDeviceType::A
        }));
        d.set_major(major);
        d.set_minor(minor);
        d.set_access(Some("rwm".to_owned()));
        d
    };
    let mut rules = vec![rule(false, None, None)];
    for (major, minor) in [
        (1, 3),
        (1, 5),
        (1, 7),
        (1, 8),
        (1, 9),
        (5, 0),
        (5, 1),
        (5, 2),
    ] {
        rules.push(rule(true, Some(major), Some(minor)));
    }
    rules.push(rule(true, Some(136), None));
    rules
}

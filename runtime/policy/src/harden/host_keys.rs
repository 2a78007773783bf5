//! The `linux` keys that reach past the sandbox: devices, sysctls, network devices, root
//! propagation and personality. Each is refused, narrowed or clamped here.

use oci_spec::runtime::{Linux, LinuxPersonalityDomain};

use super::mounts::is_safe_device;
use super::namespaces::{clamp_ping_group_range, is_namespaced_sysctl, sysctl_device};
use super::{Clamp, HardenError, HostFacts, PING_GROUP_RANGE};

/// Refuses or narrows the host-reaching keys of `linux`; returns what was clamped.
pub(super) fn harden(linux: &mut Linux, ctx: &HostFacts) -> Result<Vec<Clamp>, HardenError> {
    let mut clamped = Vec::new();
    if let Some(bad) = linux
        .devices()
        .iter()
        .flatten()
        .find(|d| !is_safe_device(d.typ(), d.major(), d.minor()))
    {
        return Err(HardenError::Device {
            path: bad.path().clone(),
        });
    }
    if let Some(key) = linux
        .sysctl()
        .iter()
        .flat_map(|s| s.keys())
        .find(|k| !is_namespaced_sysctl(k))
    {
        return Err(HardenError::Sysctl { key: key.clone() });
    }
    // The sandbox's own network namespace, and a pod's (docs/pod-network.md), has only `lo`.
    if ctx.network_namespace.is_none()
        && let Some((key, device)) = linux
            .sysctl()
            .iter()
            .flat_map(|s| s.keys())
            .find_map(|k| sysctl_device(k).map(|d| (k, d)))
    {
        return Err(HardenError::SysctlDevice {
            key: key.clone(),
            device: device.to_owned(),
        });
    }
    if let Some(mut sysctl) = linux.sysctl().clone() {
        if let Some(value) = sysctl.get_mut(PING_GROUP_RANGE) {
            let granted = clamp_ping_group_range(value, &ctx.gid_mappings)?;
            if granted != *value {
                tracing::info!(
                    key = PING_GROUP_RANGE,
                    requested = %value,
                    granted = %granted,
                    "sysctl clamped to the sandbox's gid mapping"
                );
                clamped.push(Clamp {
                    key: PING_GROUP_RANGE.to_owned(),
                    requested: std::mem::replace(value, granted.clone()),
                    granted,
                });
            }
        }
        linux.set_sysctl(Some(sysctl));
    }
    // OCI `netDevices` moves host interfaces into the sandbox's network namespace.
    if let Some(device) = linux.net_devices().iter().flat_map(|d| d.keys()).next() {
        return Err(HardenError::NetDevice {
            device: device.clone(),
        });
    }
    if let Some(mode) = linux.rootfs_propagation().clone() {
        linux.set_rootfs_propagation(Some(rootfs_propagation(&mode)?.to_owned()));
    }
    if let Some(personality) = linux.personality()
        && !matches!(
            personality.domain(),
            LinuxPersonalityDomain::PerLinux | LinuxPersonalityDomain::PerLinux32
        )
    {
        return Err(HardenError::Personality {
            domain: format!("{:?}", personality.domain()),
        });
    }
    Ok(clamped)
}

/// The `linux.rootfsPropagation` the sandbox gets for `mode`: the eight values runc accepts
/// are accepted; `shared` and `rshared` are narrowed to `rslave` (a shared root would let the
/// sandbox's mount events reach the host's peer group), everything else is kept.
fn rootfs_propagation(mode: &str) -> Result<&str, HardenError> {
    match mode {
        "shared" | "rshared" => {
            tracing::info!(
                requested = mode,
                applied = "rslave",
                "linux.rootfsPropagation narrowed: a shared root is not allowed"
            );
            Ok("rslave")
        }
        "slave" | "rslave" | "private" | "rprivate" | "unbindable" | "runbindable" => Ok(mode),
        _ => Err(HardenError::RootfsPropagation {
            value: mode.to_owned(),
        }),
    }
}

//! Namespaces and identity: the sandbox's own user namespace and id mappings, the host's
//! namespaces refused, a pod member's joined, and `ping_group_range` within the mapping.

use oci_spec::runtime::{
    LinuxIdMapping, LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceType, Spec,
};

use crate::policy::SandboxPolicy;

use super::{
    Clamp, HOST_NAMESPACE, HardenError, HostFacts, IdMapping, NEW_NAMESPACE, PING_GROUP_RANGE,
    PodNamespaces,
};

/// `linux.namespaces`: no entry for the network, PID, IPC or UTS namespace means the host's
/// and is refused (only `--network host`, `--pid host`, ... send that). Every namespace the
/// sandbox makes itself where the spec asked for another one (a `path`, or no cgroup entry:
/// the host's cgroup namespace, podman's and Docker's default on cgroup v1) gives a [`Clamp`].
/// The user namespace is always the sandbox's own (no engine adds one by default) and a
/// pod's member joins the pod's user, network, IPC and UTS namespaces.
pub(super) fn namespace_requests(spec: &Spec, ctx: &HostFacts) -> Result<Vec<Clamp>, HardenError> {
    let listed: &[LinuxNamespace] = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_deref())
        .unwrap_or_default();
    let mut clamps = Vec::new();
    for (typ, name, host_reason) in NAMESPACE_KEYS {
        let key = format!("linux.namespaces[{name}]");
        let Some(requested) = requested_namespace(listed, typ, host_reason, &key, ctx)? else {
            continue;
        };
        let pods = ctx.pod.is_some()
            && matches!(
                typ,
                LinuxNamespaceType::User
                    | LinuxNamespaceType::Network
                    | LinuxNamespaceType::Ipc
                    | LinuxNamespaceType::Uts
            );
        let runtimes = typ == LinuxNamespaceType::Network && ctx.network_namespace.is_some();
        if pods || runtimes {
            continue;
        }
        clamps.push(Clamp {
            key,
            requested,
            granted: NEW_NAMESPACE.to_owned(),
        });
    }
    Ok(clamps)
}

/// Each namespace a spec may ask about: its type, its name in a [`Clamp`]'s key, and why
/// sharing the host's is refused (`None`: the sandbox makes its own instead).
const NAMESPACE_KEYS: [(LinuxNamespaceType, &str, Option<&str>); 6] = [
    (
        LinuxNamespaceType::Network,
        "network",
        Some(
            "the container would share the host's network (--network host, --net-host, hostNetwork)",
        ),
    ),
    (
        LinuxNamespaceType::Pid,
        "pid",
        Some("the container would see and signal the host's processes (--pid host, hostPID)"),
    ),
    (
        LinuxNamespaceType::Ipc,
        "ipc",
        Some("the container would share the host's IPC objects (--ipc host, hostIPC)"),
    ),
    (
        LinuxNamespaceType::Uts,
        "uts",
        Some("the container could set the host's hostname (--uts host)"),
    ),
    (LinuxNamespaceType::Cgroup, "cgroup", None),
    (LinuxNamespaceType::User, "user", None),
];

/// What the spec asked for namespace `typ` when it is something other than a new one (no
/// entry, or a path), refused when that is the host's and `host_reason` says why; `None`
/// when it asked for a new one.
fn requested_namespace(
    listed: &[LinuxNamespace],
    typ: LinuxNamespaceType,
    host_reason: Option<&'static str>,
    key: &str,
    ctx: &HostFacts,
) -> Result<Option<String>, HardenError> {
    let widens = |requested: String, reason: &'static str| HardenError::Widens {
        key: key.to_owned(),
        requested,
        reason,
    };
    match listed.iter().find(|ns| ns.typ() == typ) {
        None => match host_reason {
            Some(reason) => Err(widens(HOST_NAMESPACE.to_owned(), reason)),
            None if typ == LinuxNamespaceType::Cgroup => Ok(Some(HOST_NAMESPACE.to_owned())),
            None => Ok(None),
        },
        Some(ns) => match ns.path() {
            Some(path) if ctx.host_namespaces.contains(&typ) => {
                let requested = format!("path {} (the host's)", path.display());
                match host_reason {
                    Some(reason) => Err(widens(requested, reason)),
                    None => Ok(Some(requested)),
                }
            }
            Some(path) => Ok(Some(format!("path {}", path.display()))),
            None => Ok(None),
        },
    }
}

pub(super) fn check_mappings(
    kind: &'static str,
    mappings: &[IdMapping],
    policy: &SandboxPolicy,
    parent_root_unprivileged: bool,
) -> Result<(), HardenError> {
    let mut total: u64 = 0;
    for m in mappings {
        let end = u64::from(m.host_id) + u64::from(m.size);
        if m.size == 0 || (m.host_id == 0 && !parent_root_unprivileged) {
            return Err(HardenError::HostRootMapping {
                container_id: m.container_id,
                host_id: m.host_id,
                size: m.size,
            });
        }
        if let Some(start) = policy.identity.host_start {
            let limit = u64::from(start) + u64::from(policy.identity.id_range);
            if m.host_id < start || end > limit {
                return Err(HardenError::MappingOutsideRange {
                    kind,
                    host_id: m.host_id,
                    size: m.size,
                });
            }
        }
        total += u64::from(m.size);
    }
    if !mappings.iter().any(|m| m.container_id == 0) {
        return Err(HardenError::MissingMapping { kind });
    }
    if total > u64::from(policy.identity.id_range) {
        return Err(HardenError::MappingTooLarge {
            kind,
            total,
            limit: policy.identity.id_range,
        });
    }
    Ok(())
}

pub(super) fn oci_mappings(mappings: &[IdMapping]) -> Result<Vec<LinuxIdMapping>, HardenError> {
    mappings
        .iter()
        .map(|m| {
            LinuxIdMappingBuilder::default()
                .container_id(m.container_id)
                .host_id(m.host_id)
                .size(m.size)
                .build()
                .map_err(|source| HardenError::Oci { source })
        })
        .collect()
}

pub(super) fn check_pod_namespaces(
    pod: &PodNamespaces,
    ctx: &HostFacts,
) -> Result<(), HardenError> {
    for path in [&pod.user, &pod.network, &pod.ipc, &pod.uts] {
        if !path.is_absolute() {
            return Err(HardenError::PodNamespacePath { path: path.clone() });
        }
    }
    match &ctx.network_namespace {
        Some(other) if other != &pod.network => Err(HardenError::PodNetworkConflict {
            path: other.clone(),
        }),
        _ => Ok(()),
    }
}

pub(super) fn namespaces(ctx: &HostFacts) -> Vec<LinuxNamespace> {
    [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Cgroup,
    ]
    .into_iter()
    .map(|typ| {
        let mut ns = LinuxNamespace::default();
        ns.set_typ(typ);
        let joined = ctx.pod.as_ref().and_then(|pod| match typ {
            LinuxNamespaceType::User => Some(pod.user.clone()),
            LinuxNamespaceType::Network => Some(pod.network.clone()),
            LinuxNamespaceType::Ipc => Some(pod.ipc.clone()),
            LinuxNamespaceType::Uts => Some(pod.uts.clone()),
            _ => None,
        });
        if let Some(path) = joined {
            ns.set_path(Some(path));
        } else if typ == LinuxNamespaceType::Network {
            ns.set_path(ctx.network_namespace.clone());
        } else if typ == LinuxNamespaceType::User {
            ns.set_path(ctx.user_namespace.clone());
        } else {
            ns.set_path(None);
        }
        ns
    })
    .collect()
}

/// `net.ipv4.ping_group_range` (`LOW HIGH`, group ids as the sandbox sees them) narrowed to
/// the ids `gid_mappings` map: the kernel refuses an unmapped bound (EINVAL). The result is the
/// part of the requested range inside the first mapping it overlaps; a range that overlaps
/// none, or an empty one (`HIGH < LOW`, the kernel's "nobody"), becomes `1 0` (nobody).
pub(super) fn clamp_ping_group_range(
    value: &str,
    gid_mappings: &[IdMapping],
) -> Result<String, HardenError> {
    let bad = |reason| HardenError::SysctlValue {
        key: PING_GROUP_RANGE.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let bounds: Vec<&str> = value.split_whitespace().collect();
    let [low, high] = bounds.as_slice() else {
        return Err(bad("expected two group ids, `LOW HIGH`"));
    };
    let parse = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| bad("a group id is not a whole number"))
    };
    let (low, high) = (parse(low)?, parse(high)?);
    let mapped = |id: u32| {
        gid_mappings.iter().any(|m| {
            id >= m.container_id && u64::from(id) < u64::from(m.container_id) + u64::from(m.size)
        })
    };
    let nobody = || {
        if mapped(0) && mapped(1) {
            Ok("1 0".to_owned())
        } else {
            Err(bad(
                "the sandbox's gid mapping cannot express an empty range",
            ))
        }
    };
    if high < low {
        return if mapped(low) && mapped(high) {
            Ok(format!("{low} {high}"))
        } else {
            nobody()
        };
    }
    let mut mappings: Vec<&IdMapping> = gid_mappings.iter().filter(|m| m.size > 0).collect();
    mappings.sort_by_key(|m| m.container_id);
    let overlap = mappings.iter().find_map(|m| {
        let last = m.container_id.saturating_add(m.size - 1);
        (m.container_id <= high && low <= last).then(|| (low.max(m.container_id), high.min(last)))
    });
    match overlap {
        Some((l, h)) => Ok(format!("{l} {h}")),
        None => nobody(),
    }
}

/// The network device a per-device sysctl names (`net.ipv4.conf.eth0.forwarding` -> `eth0`),
/// unless it is one every network namespace has (`all`, `default`, `lo`).
pub(super) fn sysctl_device(key: &str) -> Option<&str> {
    let rest = [
        "net.ipv4.conf.",
        "net.ipv6.conf.",
        "net.ipv4.neigh.",
        "net.ipv6.neigh.",
    ]
    .iter()
    .find_map(|p| key.strip_prefix(p))?;
    // The device is everything up to the last dot (a device name may hold dots: `eth0.100`).
    let (device, _) = rest.rsplit_once('.')?;
    (!matches!(device, "all" | "default" | "lo")).then_some(device)
}

/// Sysctls the kernel scopes to the sandbox's own namespaces.
pub(super) fn is_namespaced_sysctl(key: &str) -> bool {
    key.starts_with("net.")
        || key.starts_with("fs.mqueue.")
        || matches!(
            key,
            "kernel.msgmax"
                | "kernel.msgmnb"
                | "kernel.msgmni"
                | "kernel.sem"
                | "kernel.shmall"
                | "kernel.shmmax"
                | "kernel.shmmni"
                | "kernel.shm_rmid_forced"
        )
}

//! Spec hardening: an incoming OCI `Spec` (podman's, containerd's or a user's
//! `config.json`) in, the sandbox's `Spec` out. The policy is a ceiling: the incoming spec
//! and its `io.agent.sandbox.*` annotations may narrow it, never widen it.
//!
//! What the result always has, whatever came in:
//! - a new user namespace with the id mappings the runtime chose (`HardenContext`), never
//!   one that maps host uid 0 (id 0 of a rootless runtime's namespace is the invoking
//!   user: [`HardenContext::parent_root_unprivileged`]); or, for a pod's app container, the user namespace of the
//!   pod's sandbox container, pinned by the runtime (`HardenContext::pod`);
//! - a new network namespace (or one the runtime created itself for this sandbox or its
//!   pod), never a path that could be the host's; never a path taken from the spec;
//! - a read-only root, the policy's tmpfs scratch areas, the workspace as an overlay whose
//!   lower layer is the host directory, read-only binds over protected paths, masked and
//!   read-only /proc and /sys paths, every other bind mount read-only;
//! - capability sets reduced to what both the spec and the policy allow (none by
//!   default), `no_new_privs`, the policy's seccomp filter;
//! - cgroup limits at most the policy's, and only the standard safe devices.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCapabilities, LinuxCpu, LinuxDeviceCgroup, LinuxDeviceType, LinuxIdMapping,
    LinuxIdMappingBuilder, LinuxMemory, LinuxNamespace, LinuxNamespaceType, LinuxPersonalityDomain,
    LinuxPids, LinuxResources, Mount, Process, Spec,
};

use crate::narrow::{self, NarrowError};
use crate::network::{DomainRule, NetworkError};
use crate::policy::{NetworkMode, PolicyError, SandboxPolicy};
use crate::profiles::{AdminProfile, ProfileNameError, Requested};
use crate::seccomp::{self, SeccompError};
use crate::value::{AbsPath, ByteSize, Capability, Seconds, ValueError};

/// Annotation prefix for everything this module reads.
pub const ANNOTATION_PREFIX: &str = "io.agent.sandbox.";
/// Selects a built-in profile or one of the admin's profiles (`crate::profiles`), which
/// must be within the runtime's ceiling.
pub const ANNOTATION_PROFILE: &str = "io.agent.sandbox.profile";

/// Why a spec could not be hardened. Nothing is changed when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    #[error("unknown annotation {annotation}")]
    UnknownAnnotation { annotation: String },
    #[error("annotation {annotation} has a bad value `{value}`")]
    BadAnnotation {
        annotation: String,
        value: String,
        #[source]
        source: AnnotationValueError,
    },
    #[error(
        "annotation {annotation} would widen the policy (docs/policy.md#keys-that-may-only-tighten)"
    )]
    AnnotationWidens {
        annotation: String,
        #[source]
        source: NarrowError,
    },
    #[error(
        "annotation {annotation} names the profile `{name}`, which the runtime did not read from its profiles directory (docs/policy.md#profiles-by-annotation)"
    )]
    ProfileNotLoaded { annotation: String, name: String },
    #[error(
        "annotation io.agent.sandbox.profile=`{annotation}` and the environment's AGENT_SANDBOX_PROFILE=`{env}` name different profiles; give one (docs/policy.md#profiles-by-annotation)"
    )]
    ProfileConflict { annotation: String, env: String },
    #[error("annotation {annotation} names an unknown profile")]
    UnknownProfile {
        annotation: String,
        #[source]
        source: Box<PolicyError>,
    },
    #[error("uid/gid mapping {container_id}->{host_id}+{size} would map host uid 0")]
    HostRootMapping {
        container_id: u32,
        host_id: u32,
        size: u32,
    },
    #[error("no {kind} mapping given for container id 0")]
    MissingMapping { kind: &'static str },
    #[error("{kind} mappings cover {total} ids, more than the policy's id range {limit}")]
    MappingTooLarge {
        kind: &'static str,
        total: u64,
        limit: u32,
    },
    #[error("{kind} mapping {host_id}+{size} lies outside the policy's host range")]
    MappingOutsideRange {
        kind: &'static str,
        host_id: u32,
        size: u32,
    },
    #[error("the spec mounts the workspace {path} but no overlay directories were given")]
    MissingOverlayDirs { path: String },
    #[error(
        "overlay directory {path} contains `,`, `:`, `=` or `\\` and cannot be passed to overlayfs"
    )]
    OverlayPath { path: PathBuf },
    #[error("protected path {path} is not a candidate for this spec")]
    UnexpectedProtectedPath { path: PathBuf },
    #[error(
        "HOME {home} is on the scratch area {scratch}, but no placeholders were given to keep its protected names unwritable"
    )]
    MissingPlaceholders { home: String, scratch: String },
    #[error(
        "credential store {path} is in the workspace, but no placeholders were given to mask it"
    )]
    MissingMaskPlaceholders { path: PathBuf },
    #[error("mount at {destination}: a writable {typ} outside the policy's writable paths")]
    WritableMount { destination: PathBuf, typ: String },
    #[error("mount at {destination}: path is not absolute and normalized")]
    MountPath {
        destination: PathBuf,
        #[source]
        source: ValueError,
    },
    #[error("mount at {destination}: writable only when /dev is the sandbox's own tmpfs")]
    DevNotTmpfs { destination: PathBuf },
    #[error("mount at {destination}: type {typ} is not allowed in a sandbox")]
    MountType { destination: PathBuf, typ: String },
    #[error("mount at {destination}: host device {source_path} is not allowed")]
    DeviceMount {
        destination: PathBuf,
        source_path: PathBuf,
    },
    #[error("mount at {destination}: a bind of the host's {source_path} is not allowed")]
    ProcBind {
        destination: PathBuf,
        source_path: PathBuf,
    },
    #[error(
        "privileged containers are refused: a sandbox never holds the host's capabilities or devices, and --privileged asks for all of them (found CAP_SYS_ADMIN with host device {device}); run without --privileged and add only what the policy allows (docs/threat-model.md#privileged-containers)"
    )]
    Privileged { device: PathBuf },
    #[error(
        "{key} asks for {requested}, which would widen the sandbox: {reason}; refused (docs/policy.md#widening-requests)"
    )]
    Widens {
        /// The config.json key, e.g. `linux.namespaces[network]`.
        key: String,
        /// What the config asked for.
        requested: String,
        /// Why it widens, in the caller's words (the flag that sends it).
        reason: &'static str,
    },
    #[error(
        "linux.devices {path} is not one of the standard safe devices; refused (docs/policy.md#widening-requests)"
    )]
    Device { path: PathBuf },
    #[error(
        "linux.sysctl {key} is not namespaced to the sandbox; refused (docs/policy.md#widening-requests)"
    )]
    Sysctl { key: String },
    #[error(
        "sysctl {key} names network device {device}, which the sandbox's network namespace does not have (only lo)"
    )]
    SysctlDevice { key: String, device: String },
    #[error("sysctl {key} has a bad value `{value}`: {reason}")]
    SysctlValue {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error(
        "linux.resources.unified {key} cannot be checked against the policy; refused (docs/policy.md#widening-requests)"
    )]
    UnifiedResource { key: String },
    #[error(
        "linux.netDevices {device}: moving a host network device into the sandbox is refused (docs/policy.md#widening-requests)"
    )]
    NetDevice { device: String },
    #[error(
        "linux.rootfsPropagation {value:?} is not one of shared, slave, private, unbindable or their r-forms"
    )]
    RootfsPropagation { value: String },
    #[error("personality domain {domain} is not allowed")]
    Personality { domain: String },
    #[error("the spec has no process")]
    NoProcess,
    #[error("pod namespace path {path} is not absolute")]
    PodNamespacePath { path: PathBuf },
    #[error("a pod member's network namespace is the pod's; a second one ({path}) was given")]
    PodNetworkConflict { path: PathBuf },
    #[error("the spec has no root")]
    NoRoot,
    #[error("cannot build an OCI object")]
    Oci {
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("cannot compile the seccomp filter")]
    Seccomp {
        #[source]
        source: SeccompError,
    },
}

/// Why an annotation's value could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationValueError {
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error(transparent)]
    Rule(#[from] NetworkError),
    #[error("not a whole number")]
    Number(#[from] std::num::ParseIntError),
    #[error("expected `none` or `proxy`")]
    NetworkMode,
    #[error("{reason} (docs/policy.md#profiles-by-annotation)")]
    ProfileName { reason: ProfileNameError },
}

/// One uid or gid mapping (container id, host id, count), as the runtime allocated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// The host directories the runtime created for the workspace overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayDirs {
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// A protected path: where it appears in the container and the host path that stays
/// visible there read-only, or, for a credential store, is masked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProtectedMount {
    pub container_path: PathBuf,
    pub host_path: PathBuf,
    /// Written as a directory in the policy (`.ssh/`).
    pub dir: bool,
    /// A credential store ([`crate::policy::is_secret`]): [`harden_spec`] binds an empty
    /// read-only placeholder over it instead of the host path, so the sandbox reads nothing
    /// there (docs/workspace.md#secret-names). Must agree with the name.
    pub secret: bool,
}

/// What the runtime decided and found on the host; the only inputs besides the spec and
/// the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HardenContext {
    /// uid mappings; must map container uid 0, never host uid 0.
    pub uid_mappings: Vec<IdMapping>,
    /// gid mappings; same rules.
    pub gid_mappings: Vec<IdMapping>,
    /// Id 0 of the namespace the mappings' host ids belong to is not host root: the runtime
    /// runs in rootless podman's user namespace, where 0 is the invoking user. Mappings may
    /// then start at host id 0 (the sandbox's root is that user, docs/workspace.md,
    /// "Rootless"). The runtime reads it from its own id maps and checks the translation to
    /// host ids again before libcontainer runs; `false` (the default) refuses host id 0.
    pub parent_root_unprivileged: bool,
    /// Upper and work directories for the workspace overlay; required when the spec
    /// bind-mounts something at the policy's workspace path.
    pub workspace: Option<OverlayDirs>,
    /// The entries of [`protected_path_candidates`] that exist on the host (the runtime
    /// checks with `lstat`; a symlink should be reported so it is covered too).
    pub protected: Vec<ProtectedMount>,
    /// A network namespace the runtime itself created for this sandbox (e.g. a pod's);
    /// `None` makes a new one. Never pass a path taken from the spec.
    pub network_namespace: Option<PathBuf>,
    /// The user namespace the runtime itself created for this sandbox, owned by the
    /// sandbox's own host root id so that its per-user kernel counts are never charged to
    /// host root (`crate::ucounts`); `None` makes a new one. Never a path taken from the spec.
    /// A pod's member joins the pod's instead ([`Self::pod`]).
    pub user_namespace: Option<PathBuf>,
    /// The pod this container joins (a Kubernetes app container): the user, network, IPC
    /// and UTS namespaces of the pod's sandbox container, as paths the runtime pinned itself
    /// when it created that container. Never paths taken from the spec. The container still
    /// gets its own mount, PID and cgroup namespaces.
    pub pod: Option<PodNamespaces>,
    /// The namespace types whose `path` in the spec the runtime found to be its own namespace
    /// of that type, i.e. the host's (Docker's `--network host` names
    /// `EXEC_ROOT/netns/default`; `--network ns:/proc/1/ns/net`). Refused like a missing
    /// entry for the network, PID, IPC and UTS namespaces.
    pub host_namespaces: Vec<LinuxNamespaceType>,
    /// An empty file and an empty directory the runtime made on the host, read-only and
    /// reachable by the sandbox: [`harden_spec`] binds them over each protected name of a
    /// HOME on a scratch area. Required when HOME is on one.
    pub placeholders: Option<Placeholders>,
    /// The admin's profile that the spec's `io.agent.sandbox.profile` names, as the runtime
    /// read it from its profiles directory (`crate::profiles`); `None` when the annotation
    /// names a built-in profile or is absent.
    pub profile: Option<AdminProfile>,
}

/// Host paths of an empty file and an empty directory (see [`HardenContext::placeholders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholders {
    pub file: PathBuf,
    pub dir: PathBuf,
}

/// Namespaces a pod's containers share, pinned by the runtime (see [`HardenContext::pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNamespaces {
    pub user: PathBuf,
    pub network: PathBuf,
    pub ipc: PathBuf,
    pub uts: PathBuf,
}

/// The hardened spec and the effective (possibly narrowed) policy that produced it. The
/// runtime derives Landlock rules, the proxy allowlist and the wall-clock limit from
/// `policy`, not from the ceiling it passed in.
#[derive(Debug, Clone)]
pub struct HardenedSpec {
    pub spec: Spec,
    pub policy: SandboxPolicy,
    /// Settings of the incoming spec that the sandbox grants only in part (the runtime
    /// records each one in the audit trail).
    pub clamped: Vec<Clamp>,
}

/// A setting the incoming spec asked for that the sandbox can only grant narrower: an
/// engine's default that would otherwise make the container fail to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clamp {
    /// The setting, as the spec names it (e.g. `net.ipv4.ping_group_range`).
    pub key: String,
    /// What the spec asked.
    pub requested: String,
    /// What the sandbox gets.
    pub granted: String,
}

/// The sysctl Docker sets for every container on a non-host network (`0 2147483647`: any
/// group may open ICMP echo sockets). The kernel takes only group ids mapped in the writer's
/// user namespace, so [`harden_spec`] clamps it to the sandbox's gid mapping.
pub const PING_GROUP_RANGE: &str = "net.ipv4.ping_group_range";

/// The capabilities an engine puts in every container's sets unless told otherwise, measured
/// (docs/policy.md#widening-requests): containerd's default set (ctr, CRI) and Docker's are
/// these 14; podman 4's is the 11 without `CAP_AUDIT_WRITE`, `CAP_MKNOD` and `CAP_NET_RAW`.
/// The policy narrows them to its own list, with a [`Clamp`] per set; any other capability
/// is asked for only by an explicit flag (`--cap-add`, a pod's `capabilities.add`) and refused.
pub const ENGINE_DEFAULT_CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
];

/// What a [`Clamp`] says the sandbox granted for a namespace it made itself.
const NEW_NAMESPACE: &str = "a new namespace";
/// What a [`Clamp`] says a spec asked for when it listed no entry for a namespace.
const HOST_NAMESPACE: &str = "the host's (no entry)";

/// The host path bind-mounted at the policy's workspace in `spec`, if any.
pub fn workspace_source(spec: &Spec, policy: &SandboxPolicy) -> Option<PathBuf> {
    let workspace = policy.filesystem.workspace.as_ref()?;
    spec.mounts()
        .as_ref()?
        .iter()
        .rev()
        .find(|m| m.destination() == workspace.as_path() && is_bind(m))
        .and_then(|m| m.source().clone())
}

/// The protected paths the runtime should look for on the host: each protected name
/// under the workspace's host directory. Pass the ones that exist back in
/// [`HardenContext::protected`].
pub fn protected_path_candidates(spec: &Spec, policy: &SandboxPolicy) -> Vec<ProtectedMount> {
    let (Some(workspace), Some(source)) = (
        policy.filesystem.workspace.as_ref(),
        workspace_source(spec, policy),
    ) else {
        return Vec::new();
    };
    policy
        .filesystem
        .protected_names()
        .into_iter()
        .map(|name| ProtectedMount {
            container_path: workspace.join(&name),
            host_path: source.join(name.as_str()),
            dir: name.is_dir(),
            secret: crate::policy::is_secret(&name),
        })
        .collect()
}

/// The protected path `name` found in the workspace's subdirectory `rel` (relative, normal
/// components only; empty for the top level), as [`protected_path_candidates`] would name it
/// there. `None` when `rel` is not a plain relative path or the spec has no workspace.
pub fn protected_path_at(
    spec: &Spec,
    policy: &SandboxPolicy,
    rel: &Path,
    name: &crate::value::ProtectedName,
) -> Option<ProtectedMount> {
    let workspace = policy.filesystem.workspace.as_ref()?;
    let source = workspace_source(spec, policy)?;
    if !rel
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(ProtectedMount {
        container_path: workspace.as_path().join(rel).join(name.as_str()),
        host_path: source.join(rel).join(name.as_str()),
        dir: name.is_dir(),
        secret: crate::policy::is_secret(name),
    })
}

/// Whether `p` is a protected path at some depth of the workspace: its host and container
/// paths are the same protected name under the same relative directory.
fn is_protected_candidate(spec: &Spec, policy: &SandboxPolicy, p: &ProtectedMount) -> bool {
    let (Some(workspace), Some(source)) = (
        policy.filesystem.workspace.as_ref(),
        workspace_source(spec, policy),
    ) else {
        return false;
    };
    let Ok(rel) = p.host_path.strip_prefix(&source) else {
        return false;
    };
    policy.filesystem.protected_names().iter().any(|name| {
        let name_path = Path::new(name.as_str().trim_end_matches('/'));
        rel.ends_with(name_path)
            && rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
            && p.container_path == workspace.as_path().join(rel)
            && p.dir == name.is_dir()
            && p.secret == crate::policy::is_secret(name)
    })
}

/// Destinations of the writable mounts in a hardened spec (tmpfs, overlay, the engine's
/// `/dev/shm`). The runtime must check that none of them, nor any parent, is a symlink in
/// the rootfs: a symlink in the image (`/tmp -> /etc`) would put the writable mount over a
/// path the policy keeps read-only. (libcontainer resolves symlinks inside the rootfs.)
pub fn writable_destinations(spec: &Spec) -> Vec<PathBuf> {
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| {
            let typ = m.typ().as_deref().unwrap_or_default();
            let ro = m.options().iter().flatten().any(|o| o == "ro");
            !ro && (matches!(typ, "tmpfs" | "overlay") || is_bind(m))
        })
        .map(|m| m.destination().clone())
        .collect()
}

/// What a hardened spec gives that can stand in for Landlock rights an older kernel lacks
/// (see [`crate::landlock::at_abi`]). Measured from the spec libcontainer gets, so a spec
/// edited after hardening is judged as it is.
pub fn cover_facts(spec: &Spec) -> crate::landlock::CoverFacts {
    let linux = spec.linux().as_ref();
    let has_ns = |typ: LinuxNamespaceType| {
        linux
            .and_then(|l| l.namespaces().as_ref())
            .is_some_and(|nss| nss.iter().any(|ns| ns.typ() == typ))
    };
    let readonly_paths = linux
        .and_then(|l| l.readonly_paths().as_ref())
        .is_some_and(|p| p.iter().any(|p| p == "/proc/sys"));
    crate::landlock::CoverFacts {
        readonly_mounts: spec.root().as_ref().and_then(|r| r.readonly()) == Some(true)
            && readonly_paths,
        network_namespace: has_ns(LinuxNamespaceType::Network),
        safe_devices: linux.and_then(|l| l.devices().as_ref()).is_none_or(|ds| {
            ds.iter()
                .all(|d| is_safe_device(d.typ(), d.major(), d.minor()))
        }),
        namespaces: has_ns(LinuxNamespaceType::Pid) && has_ns(LinuxNamespaceType::Network),
        apparmor: false,
        mount_namespace: has_ns(LinuxNamespaceType::Mount),
    }
}

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

fn parse_rules(value: &str) -> Result<Vec<DomainRule>, AnnotationValueError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| DomainRule::parse(s).map_err(AnnotationValueError::from))
        .collect()
}

/// Harden `spec` under the ceiling `policy`. See the module docs for what the result
/// always has.
pub fn harden_spec(
    spec: Spec,
    policy: &SandboxPolicy,
    ctx: &HardenContext,
) -> Result<HardenedSpec, HardenError> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    let effective = effective_policy_with(&annotations, policy, ctx.profile.as_ref())?;
    harden_spec_under(spec, effective, ctx)
}

/// [`harden_spec`] with the sandbox's effective policy already compiled from the ceiling
/// and the spec's annotations ([`effective_policy_with`]), so that create derives it once.
#[expect(clippy::too_many_lines)]
pub fn harden_spec_under(
    mut spec: Spec,
    policy: SandboxPolicy,
    ctx: &HardenContext,
) -> Result<HardenedSpec, HardenError> {
    check_mappings(
        "uid",
        &ctx.uid_mappings,
        &policy,
        ctx.parent_root_unprivileged,
    )?;
    check_mappings(
        "gid",
        &ctx.gid_mappings,
        &policy,
        ctx.parent_root_unprivileged,
    )?;

    // Protected paths must be ones we asked the runtime to look for: a protected name at
    // the workspace's top or in one of its subdirectories.
    if let Some(unexpected) = ctx
        .protected
        .iter()
        .find(|p| !is_protected_candidate(&spec, &policy, p))
    {
        return Err(HardenError::UnexpectedProtectedPath {
            path: unexpected.container_path.clone(),
        });
    }

    let mut root = spec.root().clone().ok_or(HardenError::NoRoot)?;
    root.set_readonly(Some(true));
    spec.set_root(Some(root));

    let process = spec.process().clone().ok_or(HardenError::NoProcess)?;
    check_privileged(&spec, &process)?;
    // Widening requests: refused before anything else is looked at, or clamped and
    // reported (docs/policy.md#widening-requests).
    let mut clamped = capability_requests(&process, &policy)?;
    clamped.extend(namespace_requests(&spec, ctx)?);
    clamped.extend(seccomp_request(&spec));
    if let Some(adj) = process.oom_score_adj().filter(|adj| *adj < 0) {
        clamped.push(Clamp {
            key: "process.oomScoreAdj".to_owned(),
            requested: adj.to_string(),
            granted: "0".to_owned(),
        });
    }
    spec.set_process(Some(harden_process(process, &policy)?));

    let mounts = harden_mounts(spec.mounts().clone().unwrap_or_default(), &policy, ctx)?;
    spec.set_mounts(Some(mounts));

    let mut linux = spec.linux().clone().unwrap_or_default();
    if let Some(pod) = &ctx.pod {
        check_pod_namespaces(pod, ctx)?;
        // The pod's UTS namespace already carries the pod's hostname.
        spec.set_hostname(None);
        spec.set_domainname(None);
    }
    linux.set_namespaces(Some(namespaces(ctx)));
    linux.set_uid_mappings(Some(oci_mappings(&ctx.uid_mappings)?));
    linux.set_gid_mappings(Some(oci_mappings(&ctx.gid_mappings)?));
    let fs = &policy.filesystem;
    linux.set_masked_paths(Some(union(
        linux.masked_paths().clone(),
        fs.all_masked_paths(),
    )));
    linux.set_readonly_paths(Some(union(
        linux.readonly_paths().clone(),
        fs.all_readonly_paths(),
    )));
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
    let (resources, resource_clamps) = clamp_resources(linux.resources().clone(), &policy)?;
    clamped.extend(resource_clamps);
    linux.set_resources(Some(resources));
    for c in &clamped {
        tracing::info!(key = %c.key, requested = %c.requested, granted = %c.granted, "request clamped");
    }
    let seccomp =
        seccomp::oci_seccomp(&policy.syscalls).map_err(|source| HardenError::Seccomp { source })?;
    linux.set_seccomp(Some(seccomp));
    spec.set_linux(Some(linux));
    if let Some(mut process) = spec.process().clone() {
        writable_home(&mut process, &policy, &spec);
        spec.set_process(Some(process));
    }
    guard_home(&mut spec, &policy, ctx)?;
    tracing::debug!(
        network = %policy.network.mode,
        capabilities = policy.privileges.capabilities.len(),
        "spec hardened"
    );
    Ok(HardenedSpec {
        spec,
        policy,
        clamped,
    })
}

/// Points `HOME` at a scratch area when the image's home is on the read-only root (podman
/// and containerd give root `HOME=/root`): tools that write caches or their state there then
/// work ([`guard_home`] keeps its protected names, `~/.gitconfig` among them, unwritable). The policy's `/home` scratch is preferred, else `/tmp`, else the first one. A
/// `HOME` on a writable path, or on a mount the caller chose (a home shared read-only on
/// purpose), is left alone. `hardened` is the sandbox's spec: [`harden_spec`] applies this to
/// the init, and the runtime to each exec'd process with the saved spec.
pub fn writable_home(process: &mut Process, policy: &SandboxPolicy, hardened: &Spec) {
    let mut writable: Vec<PathBuf> = policy
        .filesystem
        .writable_paths()
        .iter()
        .map(|p| p.as_path().to_path_buf())
        .collect();
    writable.extend(
        hardened
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.destination().clone())
            .filter(|d| d != Path::new("/")),
    );
    let mut env = process.env().clone().unwrap_or_default();
    let current = env
        .iter()
        .find_map(|kv| kv.strip_prefix("HOME="))
        .map(str::to_owned);
    let on_writable = |home: &str| writable.iter().any(|w| Path::new(home).starts_with(w));
    if current.as_deref().is_some_and(on_writable) {
        return;
    }
    let scratch = &policy.filesystem.scratch;
    let Some(home) = ["/home", "/tmp"]
        .iter()
        .find_map(|p| scratch.iter().find(|s| s.path.as_str() == *p))
        .or_else(|| scratch.first())
        .map(|s| s.path.as_str().to_owned())
    else {
        return;
    };
    tracing::debug!(from = ?current, to = %home, "HOME moved to a writable scratch area");
    env.retain(|kv| !kv.starts_with("HOME="));
    env.push(format!("HOME={home}"));
    process.set_env(Some(env));
}

/// The scratch area `home` lies on, when the mount that holds `home` in `spec` is the
/// policy's tmpfs there (not a caller's bind beneath it, not the workspace).
fn home_scratch<'a>(
    spec: &Spec,
    policy: &'a SandboxPolicy,
    home: &Path,
) -> Option<&'a crate::policy::Scratch> {
    let holder = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| home.starts_with(m.destination()))
        .max_by_key(|m| m.destination().components().count())?;
    if holder.typ().as_deref() != Some("tmpfs") {
        return None;
    }
    policy
        .filesystem
        .scratch
        .iter()
        .find(|s| s.path.as_path() == holder.destination())
}

/// Keeps every protected name of the init's HOME unwritable when HOME is on a scratch tmpfs
/// (where [`writable_home`] puts it), whether or not anything is there: an empty read-only
/// directory or file ([`HardenContext::placeholders`]) is bound at each protected name
/// before the program starts, so `echo x >> ~/.bashrc` fails with EROFS. A mount point cannot
/// be renamed or removed, but a directory holding one can: so HOME itself, when it lies below
/// the scratch area's top, and each directory on the way to a nested name (`.config` of
/// `.config/git/`) become tmpfs mounts of their own (writable, owned by the process's user).
/// The mounts go right after the scratch area's tmpfs, so a caller's mount beneath HOME
/// stays on top. Names inside a protected directory are covered by it. An exec that points
/// HOME elsewhere gets no such mounts (docs/policy.md#protected-names).
#[expect(clippy::too_many_lines)]
fn guard_home(
    spec: &mut Spec,
    policy: &SandboxPolicy,
    ctx: &HardenContext,
) -> Result<(), HardenError> {
    let Some(process) = spec.process().as_ref() else {
        return Ok(());
    };
    let Some(home) = process
        .env()
        .iter()
        .flatten()
        .find_map(|kv| kv.strip_prefix("HOME="))
        .map(PathBuf::from)
    else {
        return Ok(());
    };
    if !home.is_absolute() {
        return Ok(());
    }
    // `/home/./x/../y/` is `/home/y`: the tmpfs holds no symlinks before the program runs.
    let mut normal = PathBuf::from("/");
    for c in home.components() {
        match c {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::Normal(n) => normal.push(n),
            _ => {}
        }
    }
    let home = normal;
    let Some(scratch) = home_scratch(spec, policy, &home) else {
        return Ok(());
    };
    let placeholders =
        ctx.placeholders
            .as_ref()
            .ok_or_else(|| HardenError::MissingPlaceholders {
                home: home.display().to_string(),
                scratch: scratch.path.to_string(),
            })?;
    let (uid, gid) = (process.user().uid(), process.user().gid());
    let own_tmpfs = |dest: PathBuf| {
        let mut m = Mount::default();
        m.set_destination(dest);
        m.set_typ(Some("tmpfs".to_owned()));
        m.set_source(Some(PathBuf::from("tmpfs")));
        m.set_options(Some(vec![
            "nosuid".to_owned(),
            "nodev".to_owned(),
            "mode=0755".to_owned(),
            format!("uid={uid}"),
            format!("gid={gid}"),
            format!("size={}", scratch.size.bytes()),
        ]));
        m
    };
    let names = policy.filesystem.protected_names();
    let whole_dirs: Vec<&str> = names
        .iter()
        .filter(|n| n.is_dir())
        .map(|n| n.as_str())
        .collect();
    let mut guards: Vec<Mount> = Vec::new();
    if home != scratch.path.as_path() {
        guards.push(own_tmpfs(home.clone()));
    }
    let mut made: HashSet<PathBuf> = HashSet::new();
    for name in &names {
        let parts: Vec<&str> = name.as_str().split('/').collect();
        let inside_protected_dir =
            (1..parts.len()).any(|i| whole_dirs.contains(&parts[..i].join("/").as_str()));
        if inside_protected_dir {
            continue;
        }
        for i in 1..parts.len() {
            let dir = home.join(parts[..i].join("/"));
            if made.insert(dir.clone()) {
                guards.push(own_tmpfs(dir));
            }
        }
        let source = if name.is_dir() {
            &placeholders.dir
        } else {
            &placeholders.file
        };
        let mut m = Mount::default();
        m.set_destination(home.join(name.as_str()));
        m.set_typ(Some("bind".to_owned()));
        m.set_source(Some(source.clone()));
        m.set_options(Some(
            ["bind", "ro", "nosuid", "nodev", "noexec"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        ));
        guards.push(m);
    }
    // Parents before children: each tmpfs before the names inside it.
    guards.sort_by_key(|m| m.destination().components().count());
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    let at = mounts
        .iter()
        .position(|m| {
            m.destination() == scratch.path.as_path() && m.typ().as_deref() == Some("tmpfs")
        })
        .map_or(mounts.len(), |i| i + 1);
    tracing::debug!(home = %home.display(), mounts = guards.len(), "protected names of HOME kept unwritable");
    mounts.splice(at..at, guards);
    spec.set_mounts(Some(mounts));
    Ok(())
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
fn check_privileged(spec: &Spec, process: &Process) -> Result<(), HardenError> {
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
fn capability_name(c: &oci_spec::runtime::Capability) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{c:?}"))
}

/// A list of names for a [`Clamp`]: comma-separated, `none` when empty.
fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

/// `process.capabilities`: a capability the policy does not grant is refused unless an
/// engine sends it by default ([`ENGINE_DEFAULT_CAPABILITIES`]); each set the policy narrows
/// gives one [`Clamp`].
fn capability_requests(
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

/// `linux.namespaces`: no entry for the network, PID, IPC or UTS namespace means the host's
/// and is refused (only `--network host`, `--pid host`, ... send that). Every namespace the
/// sandbox makes itself where the spec asked for another one (a `path`, or no cgroup entry:
/// the host's cgroup namespace, podman's and Docker's default on cgroup v1) gives a [`Clamp`].
/// The user namespace is always the sandbox's own (no engine adds one by default) and a
/// pod's member joins the pod's user, network, IPC and UTS namespaces.
#[expect(clippy::too_many_lines)]
fn namespace_requests(spec: &Spec, ctx: &HardenContext) -> Result<Vec<Clamp>, HardenError> {
    let listed: &[LinuxNamespace] = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_deref())
        .unwrap_or_default();
    let mut clamps = Vec::new();
    for (typ, name, host_reason) in [
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
    ] {
        let key = format!("linux.namespaces[{name}]");
        let requested = match listed.iter().find(|ns| ns.typ() == typ) {
            None => match host_reason {
                Some(reason) => {
                    return Err(HardenError::Widens {
                        key,
                        requested: HOST_NAMESPACE.to_owned(),
                        reason,
                    });
                }
                None if typ == LinuxNamespaceType::Cgroup => HOST_NAMESPACE.to_owned(),
                None => continue,
            },
            Some(ns) => match ns.path() {
                Some(path) if ctx.host_namespaces.contains(&typ) => {
                    let requested = format!("path {} (the host's)", path.display());
                    match host_reason {
                        Some(reason) => {
                            return Err(HardenError::Widens {
                                key,
                                requested,
                                reason,
                            });
                        }
                        None => requested,
                    }
                }
                Some(path) => format!("path {}", path.display()),
                None => continue,
            },
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

/// `linux.seccomp`: none at all is what `seccomp=unconfined` sends, and also ctr's default
/// (without `--seccomp`). The policy's filter applies anyway, so the request is clamped.
fn seccomp_request(spec: &Spec) -> Option<Clamp> {
    let requested = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref());
    requested.is_none().then(|| Clamp {
        key: "linux.seccomp".to_owned(),
        requested: "none (unconfined)".to_owned(),
        granted: "the policy's filter".to_owned(),
    })
}

fn clamp_capabilities(
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

fn check_mappings(
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

fn oci_mappings(mappings: &[IdMapping]) -> Result<Vec<LinuxIdMapping>, HardenError> {
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

fn check_pod_namespaces(pod: &PodNamespaces, ctx: &HardenContext) -> Result<(), HardenError> {
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

fn namespaces(ctx: &HardenContext) -> Vec<LinuxNamespace> {
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

fn union(existing: Option<Vec<String>>, required: Vec<AbsPath>) -> Vec<String> {
    let mut all: Vec<String> = existing.unwrap_or_default();
    all.extend(required.into_iter().map(String::from));
    all.sort();
    all.dedup();
    all
}

fn is_bind(m: &Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .iter()
            .flatten()
            .any(|o| o == "bind" || o == "rbind")
}

/// Devices every container gets: null, zero, full, random, urandom, tty, console, ptmx and
/// the pty slaves.
fn is_safe_device(typ: LinuxDeviceType, major: i64, minor: i64) -> bool {
    matches!(typ, LinuxDeviceType::C | LinuxDeviceType::U)
        && matches!(
            (major, minor),
            (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) | (5, 0) | (5, 1) | (5, 2)
        )
        || (typ == LinuxDeviceType::C && major == 136)
}

const SAFE_DEV_SOURCES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// `net.ipv4.ping_group_range` (`LOW HIGH`, group ids as the sandbox sees them) narrowed to
/// the ids `gid_mappings` map: the kernel refuses an unmapped bound (EINVAL). The result is the
/// part of the requested range inside the first mapping it overlaps; a range that overlaps
/// none, or an empty one (`HIGH < LOW`, the kernel's "nobody"), becomes `1 0` (nobody).
fn clamp_ping_group_range(value: &str, gid_mappings: &[IdMapping]) -> Result<String, HardenError> {
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
fn sysctl_device(key: &str) -> Option<&str> {
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
fn is_namespaced_sysctl(key: &str) -> bool {
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

fn with_options(mut mount: Mount, add: &[&str], remove: &[&str]) -> Mount {
    let mut options: Vec<String> = mount
        .options()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| !remove.contains(&o.as_str()) && !add.contains(&o.as_str()))
        .collect();
    options.extend(add.iter().map(|s| (*s).to_owned()));
    mount.set_options(Some(options));
    mount
}

#[expect(clippy::too_many_lines)]
fn harden_mounts(
    incoming: Vec<Mount>,
    policy: &SandboxPolicy,
    ctx: &HardenContext,
) -> Result<Vec<Mount>, HardenError> {
    let fs = &policy.filesystem;
    let scratch: Vec<&AbsPath> = fs.scratch.iter().map(|s| &s.path).collect();
    let workspace = fs.workspace.as_ref();
    // Mounts keep the order the spec lists them in (the OCI spec says the runtime mounts
    // them in that order): the policy's mounts take the place of the ones they replace.
    let mut out: Vec<Slot> = Vec::new();
    let mut workspace_lower: Option<PathBuf> = None;
    // `..` or `.` in a path would defeat every prefix check below.
    let check_path = |destination: &Path, path: &Path| {
        AbsPath::try_from(path.to_string_lossy().into_owned())
            .map(|_| ())
            .map_err(|source| HardenError::MountPath {
                destination: destination.to_path_buf(),
                source,
            })
    };
    // Writable mounts under /dev are safe only on the sandbox's own /dev tmpfs; on the
    // image's /dev a symlink (`/dev/shm -> /etc`) could redirect them.
    let dev_is_tmpfs = incoming
        .iter()
        .any(|m| m.destination() == Path::new("/dev") && m.typ().as_deref() == Some("tmpfs"));
    for mount in incoming {
        let dest = mount.destination().clone();
        let typ = mount.typ().clone().unwrap_or_default();
        check_path(&dest, &dest)?;
        if is_bind(&mount)
            && let Some(source) = mount.source()
        {
            check_path(&dest, source)?;
        }
        let under_dev = dest.starts_with("/dev") && dest != Path::new("/dev");
        if scratch.iter().any(|s| s.as_path() == dest) {
            out.push(Slot::Scratch(dest)); // the policy's tmpfs, below
            continue;
        }
        if workspace.is_some_and(|w| w.as_path() == dest) {
            if is_bind(&mount) {
                workspace_lower = mount.source().clone();
                out.push(Slot::Workspace); // the overlay, below
            }
            continue;
        }
        if is_bind(&mount) {
            let source = mount.source().clone().unwrap_or_default();
            if source.starts_with("/proc") {
                // Rootless podman binds the host's /proc for `--pid host`: it would list every
                // host process (and the egress proxy) inside the sandbox's own pid namespace.
                // The sandbox gets a fresh procfs for that namespace instead.
                if dest == Path::new("/proc") {
                    let mut fresh = Mount::default();
                    fresh.set_destination(dest);
                    fresh.set_typ(Some("proc".to_owned()));
                    fresh.set_source(Some(PathBuf::from("proc")));
                    fresh.set_options(Some(vec![
                        "nosuid".to_owned(),
                        "nodev".to_owned(),
                        "noexec".to_owned(),
                    ]));
                    out.push(Slot::Mount(fresh));
                    continue;
                }
                return Err(HardenError::ProcBind {
                    destination: dest,
                    source_path: source,
                });
            }
            if source.starts_with("/dev")
                && !SAFE_DEV_SOURCES.iter().any(|s| Path::new(s) == source)
            {
                return Err(HardenError::DeviceMount {
                    destination: dest,
                    source_path: source,
                });
            }
            if dest == Path::new("/dev/shm") {
                if !dev_is_tmpfs {
                    return Err(HardenError::DevNotTmpfs { destination: dest });
                }
                // The engine's per-container shm tmpfs: writable by design, never exec.
                out.push(Slot::Mount(with_options(
                    mount,
                    &["nosuid", "nodev", "noexec"],
                    &["suid", "dev", "exec"],
                )));
            } else {
                out.push(Slot::Mount(with_options(
                    mount,
                    &["ro", "nosuid", "nodev"],
                    &["rw", "suid", "dev"],
                )));
            }
            continue;
        }
        match typ.as_str() {
            "proc" | "mqueue" => {
                out.push(Slot::Mount(with_options(
                    mount,
                    &["nosuid", "nodev"],
                    &["suid", "dev"],
                )));
            }
            // No `nodev` on devpts, as runc: with it `/dev/ptmx` cannot be opened (EACCES) and
            // no terminal works (`podman run -t`, `exec -t`). A new devpts instance holds only
            // pty devices, and the device cgroup still limits them.
            "devpts" => {
                out.push(Slot::Mount(with_options(
                    mount,
                    &["nosuid"],
                    &["suid", "dev", "nodev"],
                )));
            }
            "sysfs" | "cgroup" | "cgroup2" => {
                out.push(Slot::Mount(with_options(
                    mount,
                    &["ro", "nosuid", "nodev", "noexec"],
                    &["rw", "suid", "dev", "exec"],
                )));
            }
            "tmpfs" if under_dev && !dev_is_tmpfs => {
                return Err(HardenError::DevNotTmpfs { destination: dest });
            }
            "tmpfs" if dest.starts_with("/dev") => {
                out.push(Slot::Mount(with_options(mount, &["nosuid"], &["suid"])));
            }
            "tmpfs" => {
                return Err(HardenError::WritableMount {
                    destination: dest,
                    typ,
                });
            }
            _ => {
                return Err(HardenError::MountType {
                    destination: dest,
                    typ,
                });
            }
        }
    }
    let mut tmpfs: Vec<Mount> = Vec::new();
    for s in &fs.scratch {
        let mut m = Mount::default();
        m.set_destination(s.path.as_path().to_path_buf());
        m.set_typ(Some("tmpfs".to_owned()));
        m.set_source(Some(PathBuf::from("tmpfs")));
        m.set_options(Some(vec![
            "nosuid".to_owned(),
            "nodev".to_owned(),
            "mode=1777".to_owned(),
            format!("size={}", s.size.bytes()),
        ]));
        tmpfs.push(m);
    }
    let mut overlay: Vec<Mount> = Vec::new();
    if let (Some(workspace), Some(lower)) = (workspace, workspace_lower) {
        let dirs = ctx
            .workspace
            .as_ref()
            .ok_or_else(|| HardenError::MissingOverlayDirs {
                path: workspace.to_string(),
            })?;
        // Overlay options are a comma list and lowerdir a colon list: a `,` in a path
        // could add `upperdir=/etc` and send the sandbox's writes to the host.
        for path in [&lower, &dirs.upper, &dirs.work] {
            let text = path.to_string_lossy();
            let safe = !text.contains([',', ':', '\\', '=']) && !text.chars().any(char::is_control);
            if !safe || !path.is_absolute() {
                return Err(HardenError::OverlayPath { path: path.clone() });
            }
        }
        let mut m = Mount::default();
        m.set_destination(workspace.as_path().to_path_buf());
        m.set_typ(Some("overlay".to_owned()));
        m.set_source(Some(PathBuf::from("overlay")));
        m.set_options(Some(vec![
            format!("lowerdir={}", lower.display()),
            format!("upperdir={}", dirs.upper.display()),
            format!("workdir={}", dirs.work.display()),
            "userxattr".to_owned(),
            "nosuid".to_owned(),
            "nodev".to_owned(),
        ]));
        overlay.push(m);
        // The protected binds go on top of the overlay, right after it; a credential store
        // gets an empty placeholder instead of its host path (masked, not only read-only).
        // Nothing is bound at or beneath a mask: it hides the whole name, and a mount point
        // inside it would have to be made in the placeholder.
        let masks: Vec<&Path> = ctx
            .protected
            .iter()
            .filter(|p| p.secret)
            .map(|p| p.container_path.as_path())
            .collect();
        for p in &ctx.protected {
            if !p.secret && masks.iter().any(|m| p.container_path.starts_with(m)) {
                continue;
            }
            let source = if p.secret {
                let ph = ctx.placeholders.as_ref().ok_or_else(|| {
                    HardenError::MissingMaskPlaceholders {
                        path: p.container_path.clone(),
                    }
                })?;
                if p.dir { &ph.dir } else { &ph.file }
            } else {
                &p.host_path
            };
            let mut m = Mount::default();
            m.set_destination(p.container_path.clone());
            m.set_typ(Some("bind".to_owned()));
            m.set_source(Some(source.clone()));
            m.set_options(Some(
                ["rbind", "ro", "nosuid", "nodev"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
            ));
            overlay.push(m);
        }
    }
    Ok(in_spec_order(out, tmpfs, overlay))
}

/// One entry of the hardened mount list before the policy's own mounts are placed.
enum Slot {
    Mount(Mount),
    /// Where the spec had a mount at this scratch path.
    Scratch(PathBuf),
    /// Where the spec bound the workspace.
    Workspace,
}

/// The mount list in the spec's order: each scratch tmpfs where the spec had a mount at its
/// path (else just before the first mount beneath it, else last), the workspace overlay and
/// its protected binds where the spec bound the workspace (its last bind there).
fn in_spec_order(slots: Vec<Slot>, tmpfs: Vec<Mount>, overlay: Vec<Mount>) -> Vec<Mount> {
    let last_workspace = slots.iter().rposition(|s| matches!(s, Slot::Workspace));
    let mut placed: HashSet<PathBuf> = HashSet::new();
    let mut out: Vec<Mount> = Vec::new();
    let mut overlay = Some(overlay);
    for (i, slot) in slots.into_iter().enumerate() {
        match slot {
            Slot::Mount(m) => out.push(m),
            Slot::Scratch(dest) => {
                if placed.insert(dest.clone())
                    && let Some(m) = tmpfs.iter().find(|m| m.destination() == &dest)
                {
                    out.push(m.clone());
                }
            }
            Slot::Workspace if Some(i) == last_workspace => {
                out.extend(overlay.take().into_iter().flatten());
            }
            Slot::Workspace => {}
        }
    }
    for m in tmpfs {
        if placed.contains(m.destination()) {
            continue;
        }
        let at = out
            .iter()
            .position(|o| {
                o.destination() != m.destination() && o.destination().starts_with(m.destination())
            })
            .unwrap_or(out.len());
        out.insert(at, m);
    }
    out
}

fn min_opt_i64(incoming: Option<i64>, policy: i64) -> i64 {
    match incoming {
        Some(v) if v > 0 => v.min(policy),
        _ => policy,
    }
}

/// A [`Clamp`] when the spec set `key` explicitly and the sandbox grants less (an unset key
/// is no request: the policy's limit applies).
fn resource_clamp(key: &str, requested: Option<i64>, granted: i64) -> Option<Clamp> {
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
#[expect(clippy::too_many_lines)]
fn clamp_resources(
    incoming: Option<LinuxResources>,
    policy: &SandboxPolicy,
) -> Result<(LinuxResources, Vec<Clamp>), HardenError> {
    let r = &policy.resources;
    let mut clamps = Vec::new();
    let mut res = incoming.unwrap_or_default();
    if let Some(key) = res.unified().as_ref().and_then(|u| u.keys().next()) {
        return Err(HardenError::UnifiedResource { key: key.clone() });
    }
    let policy_memory = i64::try_from(r.memory.bytes()).unwrap_or(i64::MAX);
    let old_mem = res.memory().unwrap_or_default();
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
    res.set_memory(Some(mem));

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

    let old_cpu = res.cpu().clone().unwrap_or_default();
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
    res.set_cpu(Some(cpu));

    res.set_devices(Some(device_rules()));
    Ok((res, clamps))
}

/// Deny every device, then allow the standard safe ones.
fn device_rules() -> Vec<LinuxDeviceCgroup> {
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

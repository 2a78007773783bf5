//! Spec hardening: an incoming OCI `Spec` (podman's, containerd's or a user's
//! `config.json`) in, the sandbox's `Spec` out. The policy is a ceiling: the incoming spec
//! and its `io.agent.sandbox.*` annotations may narrow it, never widen it.
//!
//! What the result always has, whatever came in:
//! - a new user namespace with the id mappings the runtime chose (`HostFacts`), never
//!   one that maps host uid 0 (id 0 of a rootless runtime's namespace is the invoking
//!   user: [`HostFacts::parent_root_unprivileged`]); or, for a pod's app container, the user namespace of the
//!   pod's sandbox container, pinned by the runtime (`HostFacts::pod`);
//! - a new network namespace (or one the runtime created itself for this sandbox or its
//!   pod), never a path that could be the host's; never a path taken from the spec;
//! - a read-only root, the policy's tmpfs scratch areas, the workspace as an overlay whose
//!   lower layer is the host directory, read-only binds over protected paths, masked and
//!   read-only /proc and /sys paths, every other bind mount read-only;
//! - capability sets reduced to what both the spec and the policy allow (none by
//!   default), `no_new_privs`, the policy's seccomp filter;
//! - cgroup limits at most the policy's, and only the standard safe devices.
//!
//! `harden_spec_under` (the spec step of [`crate::plan::compile`], behind [`harden_spec`]
//! too) is the recipe; one module per concern does each step: the effective policy
//! (`annotations`), the process (`process`), the mounts (`mounts`), namespaces and identity
//! (`namespaces`), the host-reaching `linux` keys (`host_keys`), cgroup limits (`resources`)
//! and `HOME` (`home`).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::narrow::NarrowError;
use crate::network::NetworkError;
use crate::policy::{PolicyError, SandboxPolicy};
use crate::profiles::{AdminProfile, ProfileNameError};
use crate::seccomp::{self, SeccompError};
use crate::value::ValueError;

mod annotations;
mod home;
mod host_keys;
mod mounts;
mod namespaces;
mod process;
mod resources;

pub use annotations::{effective_policy, effective_policy_with};
use home::guard_home;
pub use home::{split_home_guards, writable_home};
use mounts::{harden_mounts, is_bind, is_safe_device, union};
use namespaces::{
    check_mappings, check_pod_namespaces, namespace_requests, namespaces, oci_mappings,
};
pub use process::harden_process;
use process::{capability_requests, check_privileged, seccomp_request};
use resources::clamp_resources;

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
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
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

/// What the runtime decided and found on the host; the only inputs of
/// [`crate::plan::compile`] besides the spec and the ceiling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
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
    /// The enforcement layers this host supports, for the layer plan (the default: none).
    pub support: crate::layers::HostSupport,
}

/// Host paths of an empty file and an empty directory (see [`HostFacts::placeholders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholders {
    pub file: PathBuf,
    pub dir: PathBuf,
}

/// Namespaces a pod's containers share, pinned by the runtime (see [`HostFacts::pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNamespaces {
    pub user: PathBuf,
    pub network: PathBuf,
    pub ipc: PathBuf,
    pub uts: PathBuf,
}

/// The spec step of [`crate::plan::compile`]: the hardened spec and the effective (possibly
/// narrowed) policy that produced it. The runtime reads neither from here: it takes the
/// compiled [`crate::SandboxPlan`], whose `policy` is this one. It stays public as the result
/// of [`harden_spec`], the spec step alone, which the policy's tests, the `harden_spec` fuzz
/// target and the policy bench drive without a host's layer plan.
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
/// [`HostFacts::protected`].
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

/// Harden `spec` under the ceiling `policy`. See the module docs for what the result
/// always has.
pub fn harden_spec(
    spec: Spec,
    policy: &SandboxPolicy,
    ctx: &HostFacts,
) -> Result<HardenedSpec, HardenError> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    let effective = effective_policy_with(&annotations, policy, ctx.profile.as_ref())?;
    harden_spec_under(spec, effective, ctx)
}

/// [`harden_spec`] with the sandbox's effective policy already compiled from the ceiling
/// and the spec's annotations ([`effective_policy_with`]), so that create derives it once.
/// Only [`crate::plan::compile_under`] calls it: outside this crate, a sandbox's hardened
/// spec comes with its plan, in [`crate::plan::Compiled`].
pub(crate) fn harden_spec_under(
    mut spec: Spec,
    policy: SandboxPolicy,
    ctx: &HostFacts,
) -> Result<HardenedSpec, HardenError> {
    check_context(&spec, &policy, ctx)?;
    let mut root = spec.root().clone().ok_or(HardenError::NoRoot)?;
    root.set_readonly(Some(true));
    spec.set_root(Some(root));
    let mut clamped = harden_init_process(&mut spec, &policy, ctx)?;
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
    clamped.extend(host_keys::harden(&mut linux, ctx)?);
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

/// What the runtime handed over must be what it was asked for: id mappings the policy
/// allows, and protected paths that are protected-name candidates at the workspace's top or
/// in one of its subdirectories.
fn check_context(spec: &Spec, policy: &SandboxPolicy, ctx: &HostFacts) -> Result<(), HardenError> {
    check_mappings(
        "uid",
        &ctx.uid_mappings,
        policy,
        ctx.parent_root_unprivileged,
    )?;
    check_mappings(
        "gid",
        &ctx.gid_mappings,
        policy,
        ctx.parent_root_unprivileged,
    )?;
    if let Some(unexpected) = ctx
        .protected
        .iter()
        .find(|p| !is_protected_candidate(spec, policy, p))
    {
        return Err(HardenError::UnexpectedProtectedPath {
            path: unexpected.container_path.clone(),
        });
    }
    Ok(())
}

/// The init process: a privileged request refused; widening requests refused before
/// anything else is looked at, or clamped and reported (docs/policy.md#widening-requests);
/// then clamped like every exec'd process ([`harden_process`]).
fn harden_init_process(
    spec: &mut Spec,
    policy: &SandboxPolicy,
    ctx: &HostFacts,
) -> Result<Vec<Clamp>, HardenError> {
    let process = spec.process().clone().ok_or(HardenError::NoProcess)?;
    check_privileged(spec, &process)?;
    let mut clamped = capability_requests(&process, policy)?;
    clamped.extend(namespace_requests(spec, ctx)?);
    clamped.extend(seccomp_request(spec));
    if let Some(adj) = process.oom_score_adj().filter(|adj| *adj < 0) {
        clamped.push(Clamp {
            key: "process.oomScoreAdj".to_owned(),
            requested: adj.to_string(),
            granted: "0".to_owned(),
        });
    }
    spec.set_process(Some(harden_process(process, policy)?));
    Ok(clamped)
}

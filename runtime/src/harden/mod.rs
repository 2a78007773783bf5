//! The bridge between a container and the policy crate: which policy is the
//! ceiling, hardening the spec with the runtime's facts (id mapping, overlay
//! dirs, protected paths found on the host), the layer plan, the in-process
//! layers handed to the executor (seccomp BPF, Landlock). Cgroups are
//! `crate::host::cgroups`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_sandbox_policy::harden::{self, HardenContext, HardenError, IdMapping, OverlayDirs};
use agent_sandbox_policy::layers::{HostSupport, LayerError, LayerPlan};
use agent_sandbox_policy::seccomp::{Arch, SeccompError};
use agent_sandbox_policy::{Layer, PolicyError, SandboxPolicy};
use libcontainer::oci_spec::runtime::{Process, Spec};

use crate::executor::{LandlockApply, SandboxExecutor};
use crate::host::idmap::IdRange;
use crate::mounts;
use crate::state::ContainerId;
use crate::state::SandboxDir;
use crate::state::paths::{self, StateDirs};

/// The profile used when nothing else selects one.
pub const DEFAULT_PROFILE: &str = "agent";

/// Errors of the policy bridge; each names the layer, file or annotation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "policy file {path} does not exist (a path or a built-in profile name: docs/policy.md)"
    )]
    MissingPolicy { path: PathBuf },
    #[error("cannot read policy file {path}")]
    ReadPolicy {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid policy")]
    Policy(#[source] PolicyError),
    #[error("cannot harden the container spec")]
    Harden(#[source] HardenError),
    #[error("layer plan")]
    Layer(#[source] LayerError),
    #[error("seccomp layer: cannot compile the filter")]
    Seccomp(#[source] SeccompError),
    #[error("seccomp layer: this architecture has no filter")]
    NoArch,
    #[error("seccomp layer: the config's own profile cannot be honoured")]
    SeccompRequest(#[source] agent_sandbox_policy::seccomp::RequestError),
    #[error(
        "seccomp layer: config.json asks for linux.seccomp but this host applies no seccomp filter"
    )]
    SeccompRequestWithoutLayer,
    #[error("writable mount {path} would land on a symlink in the rootfs ({component}); refusing")]
    SymlinkedWritable { path: PathBuf, component: PathBuf },
    #[error("cannot prepare the workspace overlay dir {path}")]
    Overlay {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    #[error(transparent)]
    Paths(#[from] paths::PathsError),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The ceiling policy: the admin's file, or the built-in `agent`. Saved in the
/// sandbox dir at create so every exec uses the same one.
#[derive(Debug, Clone)]
pub struct Ceiling {
    pub policy: SandboxPolicy,
    /// Built-in name or file path, for logs.
    pub origin: String,
    text: String,
}

impl Ceiling {
    /// `admin` (from `--policy` / `AGENT_SANDBOX_POLICY`) is a file path or a
    /// built-in profile name.
    pub fn load(admin: Option<&Path>) -> Result<Self, SandboxError> {
        match admin {
            None => Self::builtin(DEFAULT_PROFILE),
            Some(p)
                if !p.exists()
                    && agent_sandbox_policy::builtin_names()
                        .contains(&p.to_string_lossy().as_ref()) =>
            {
                Self::builtin(&p.to_string_lossy())
            }
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| {
                    // Not the io error's text: podman reads "no such file or directory" in
                    // a runtime's error as its own "command not found" (exit 127).
                    if source.kind() == std::io::ErrorKind::NotFound {
                        SandboxError::MissingPolicy {
                            path: path.to_owned(),
                        }
                    } else {
                        SandboxError::ReadPolicy {
                            path: path.to_owned(),
                            source,
                        }
                    }
                })?;
                let origin = path.display().to_string();
                let policy = SandboxPolicy::parse(&text, &origin).map_err(SandboxError::Policy)?;
                Ok(Self {
                    policy,
                    origin,
                    text,
                })
            }
        }
    }

    fn builtin(name: &str) -> Result<Self, SandboxError> {
        let text =
            agent_sandbox_policy::policy::builtin_text(name).map_err(SandboxError::Policy)?;
        let policy = SandboxPolicy::builtin(name).map_err(SandboxError::Policy)?;
        Ok(Self {
            policy,
            origin: name.to_owned(),
            text: text.to_owned(),
        })
    }

    pub fn save(&self, dir: &SandboxDir) -> Result<(), SandboxError> {
        let path = dir.ceiling();
        std::fs::write(&path, format!("# origin: {}\n{}", self.origin, self.text))
            .map_err(|source| SandboxError::Write { path, source })
    }

    /// The ceiling saved at create (exec uses it, whatever flags it got).
    pub fn load_saved(dir: &SandboxDir) -> Result<Self, SandboxError> {
        let path = dir.ceiling();
        let text = std::fs::read_to_string(&path).map_err(|source| SandboxError::ReadPolicy {
            path: path.clone(),
            source,
        })?;
        let origin = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# origin: "))
            .unwrap_or("saved")
            .to_owned();
        let policy = SandboxPolicy::parse(&text, &path.display().to_string())
            .map_err(SandboxError::Policy)?;
        Ok(Self {
            policy,
            origin,
            text,
        })
    }
}

/// What the host supports, measured. Landlock's ABI comes from the kernel's own version
/// query (`agent_sandbox_sys::landlock_abi`), the one probe every part of the runtime uses.
pub fn host_support() -> HostSupport {
    HostSupport {
        seccomp: std::fs::read_to_string("/proc/self/status")
            .map(|s| s.contains("Seccomp:"))
            .unwrap_or(false),
        landlock_abi: agent_sandbox_sys::landlock_abi().unwrap_or(0),
        apparmor: crate::host::apparmor::host(),
        cgroups: crate::host::cgroups::available(&crate::host::cgroups::RealHost),
    }
}

/// The layer plan of a hardened spec on this host (see `agent_sandbox_policy::layers::plan`).
fn plan_for(policy: &SandboxPolicy, spec: &Spec) -> Result<LayerPlan, SandboxError> {
    let plan =
        agent_sandbox_policy::layers::plan(policy, &host_support(), harden::cover_facts(spec))
            .map_err(SandboxError::Layer)?;
    if let Some(at) = &plan.landlock {
        for gap in at.gaps.iter().filter(|g| !g.unused) {
            tracing::info!(
                layer = "landlock",
                kernel_abi = at.kernel_abi,
                right = %gap.right,
                since_abi = gap.since_abi,
                covered_by = ?gap.covered_by,
                "landlock right missing on this kernel"
            );
        }
        for gap in at.uncovered() {
            tracing::warn!(
                layer = "landlock",
                right = %gap.right,
                "landlock right missing and uncovered (landlock is optional)"
            );
        }
    }
    Ok(plan)
}

/// Sets the process's AppArmor profile to the policy's when the plan applies AppArmor. An
/// incoming profile (podman's `containers-default`, CRI's `cri-containerd.apparmor.d`) is
/// replaced: the policy's profile is the one the sandbox's rules were written for.
fn set_apparmor(process: &mut Process, policy: &SandboxPolicy, plan: &LayerPlan) {
    if !plan.apply.contains(&Layer::Apparmor) {
        return;
    }
    let name = agent_sandbox_policy::apparmor::loaded_profile(policy).name;
    if let Some(incoming) = process.apparmor_profile()
        && incoming != &name
    {
        tracing::info!(incoming = %incoming, profile = %name, "apparmor profile replaced by the policy's");
    }
    process.set_apparmor_profile(Some(name));
}

/// Inputs the runtime measured for hardening.
pub struct Facts {
    pub ids: IdRange,
    /// The workspace overlay's upper/work dirs, made by [`overlay_dirs`] when the sandbox
    /// has a workspace.
    pub workspace: Option<OverlayDirs>,
    /// The pinned namespaces of the pod a Kubernetes app container joins (`crate::pod`).
    pub pod: Option<harden::PodNamespaces>,
}

/// The outcome of preparing a sandbox.
pub struct Prepared {
    pub spec: Spec,
    pub policy: SandboxPolicy,
    pub plan: LayerPlan,
    pub executor: SandboxExecutor,
    /// Settings of the incoming spec granted narrower (recorded in the audit trail).
    pub clamped: Vec<harden::Clamp>,
    /// The config's own `linux.seccomp`, honoured beside the policy's filter (saved for exec).
    pub requested_seccomp: Option<libcontainer::oci_spec::runtime::LinuxSeccomp>,
}

/// The filters that honour the config's own seccomp profile beside the policy's (see
/// `agent_sandbox_policy::seccomp::compile_request`); an error names what cannot be honoured.
pub fn requested_seccomp(
    requested: Option<&libcontainer::oci_spec::runtime::LinuxSeccomp>,
    policy: &SandboxPolicy,
    plan: &LayerPlan,
) -> Result<Vec<Arc<seccompiler::BpfProgram>>, SandboxError> {
    let Some(requested) = requested else {
        return Ok(Vec::new());
    };
    if !plan.apply.contains(&Layer::Seccomp) {
        return Err(SandboxError::SeccompRequestWithoutLayer);
    }
    let arch = Arch::host().ok_or(SandboxError::NoArch)?;
    let programs =
        agent_sandbox_policy::seccomp::compile_request(requested, &policy.syscalls, arch)
            .map_err(SandboxError::SeccompRequest)?;
    tracing::debug!(filters = programs.len(), "config seccomp profile honoured");
    Ok(programs.into_iter().map(Arc::new).collect())
}

/// The namespace types whose `path` in `spec` is the runtime's own namespace of that type
/// (the host's): the same nsfs inode as `/proc/self/ns/KIND`.
fn host_namespaces(spec: &Spec) -> Vec<libcontainer::oci_spec::runtime::LinuxNamespaceType> {
    use libcontainer::oci_spec::runtime::LinuxNamespaceType as T;
    use std::os::unix::fs::MetadataExt;
    let inode = |path: &Path| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ns| {
            let path = ns.path().as_ref()?;
            let kind = match ns.typ() {
                T::Network => "net",
                T::Pid => "pid",
                T::Ipc => "ipc",
                T::Uts => "uts",
                T::Cgroup => "cgroup",
                T::User => "user",
                T::Mount => "mnt",
                T::Time => "time",
            };
            let own = inode(Path::new("/proc/self/ns").join(kind).as_path())?;
            (inode(path.as_path()) == Some(own)).then_some(ns.typ())
        })
        .collect()
}

/// The workspace overlay's upper and work dirs under `base` (reachable, per container) when
/// `spec` has a workspace under `policy` (the effective one), owned by the sandbox's process
/// user: the top of the merged workspace is upper's, and git refuses a checkout whose top
/// belongs to another user ("dubious ownership").
pub fn overlay_dirs(
    spec: &Spec,
    policy: &SandboxPolicy,
    ids: &IdRange,
    base: &Path,
) -> Result<Option<OverlayDirs>, SandboxError> {
    if harden::workspace_source(spec, policy).is_none() {
        return Ok(None);
    }
    let upper = base.join("upper");
    let work = base.join("work");
    for d in [base, upper.as_path(), work.as_path()] {
        std::fs::create_dir_all(d).map_err(|source| SandboxError::Overlay {
            path: d.to_owned(),
            source,
        })?;
    }
    mounts::mkdir_traversable(base)?;
    let (uid, gid) = process_host_ids(spec, &id_mapping(ids));
    for d in [&upper, &work] {
        std::os::unix::fs::chown(d, Some(uid), Some(gid)).map_err(|source| {
            SandboxError::Overlay {
                path: d.clone(),
                source,
            }
        })?;
    }
    Ok(Some(OverlayDirs { upper, work }))
}

/// The sandbox's one id mapping: container id 0 onwards to its host block.
fn id_mapping(ids: &IdRange) -> IdMapping {
    IdMapping {
        container_id: 0,
        host_id: ids.host_start,
        size: ids.size,
    }
}

/// Hardens `spec` under `ceiling` with the runtime's facts (the policy compiler,
/// `harden_spec`), sets the AppArmor profile the layer plan applies, and builds the
/// executor for the layers the plan applies.
pub fn prepare(ceiling: &Ceiling, spec: Spec, facts: &Facts) -> Result<Prepared, SandboxError> {
    let requested = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    let annotations = spec.annotations().clone().unwrap_or_default();
    let effective =
        harden::effective_policy(&annotations, &ceiling.policy).map_err(SandboxError::Harden)?;
    let map = id_mapping(&facts.ids);
    // Protected paths that exist in the host workspace are bound read-only over
    // the overlay. A symlink is left out: binding it would follow the link on
    // the host and show the host file it points to inside the sandbox (an
    // information leak); left in the overlay it resolves inside the sandbox's
    // own view, and writes through it never reach the host.
    let protected = protected_in_workspace(&spec, &effective);
    let ctx = HardenContext {
        uid_mappings: vec![map],
        gid_mappings: vec![map],
        workspace: facts.workspace.clone(),
        protected,
        network_namespace: None,
        pod: facts.pod.clone(),
        host_namespaces: host_namespaces(&spec),
    };
    let mut hardened =
        harden::harden_spec(spec, &ceiling.policy, &ctx).map_err(SandboxError::Harden)?;
    let plan = plan_for(&hardened.policy, &hardened.spec)?;
    if let Some(process) = hardened.spec.process_mut().as_mut() {
        set_apparmor(process, &hardened.policy, &plan);
    }
    for (layer, reason) in &plan.inactive {
        tracing::warn!(layer = %layer, reason = %reason, "sandbox layer inactive");
    }
    let mut executor = executor_for(&hardened.policy, &plan)?;
    executor.requested_seccomp = requested_seccomp(requested.as_ref(), &hardened.policy, &plan)?;
    Ok(Prepared {
        spec: hardened.spec,
        policy: hardened.policy,
        plan,
        executor,
        clamped: hardened.clamped,
        requested_seccomp: requested,
    })
}

/// The effective policy of a running sandbox (for exec): the saved ceiling
/// narrowed by the annotations of its hardened spec.
pub fn effective_for_exec(
    ceiling: &Ceiling,
    hardened: &Spec,
) -> Result<(SandboxPolicy, LayerPlan), SandboxError> {
    let annotations = hardened.annotations().clone().unwrap_or_default();
    let policy =
        harden::effective_policy(&annotations, &ceiling.policy).map_err(SandboxError::Harden)?;
    let plan = plan_for(&policy, hardened)?;
    Ok((policy, plan))
}

/// Clamps an exec'd process with the policy, and gives it the sandbox's AppArmor profile.
pub fn harden_exec(
    process: Process,
    policy: &SandboxPolicy,
    plan: &LayerPlan,
) -> Result<Process, SandboxError> {
    let mut process = harden::harden_process(process, policy).map_err(SandboxError::Harden)?;
    set_apparmor(&mut process, policy, plan);
    Ok(process)
}

/// Builds the executor for the layers in `plan`.
pub fn executor_for(
    policy: &SandboxPolicy,
    plan: &LayerPlan,
) -> Result<SandboxExecutor, SandboxError> {
    let mut executor = SandboxExecutor::default();
    if plan.apply.contains(&Layer::Seccomp) {
        let arch = Arch::host().ok_or(SandboxError::NoArch)?;
        let bpf = agent_sandbox_policy::seccomp::compile_bpf(&policy.syscalls, arch)
            .map_err(SandboxError::Seccomp)?;
        executor.seccomp = Some(Arc::new(bpf));
    }
    if plan.apply.contains(&Layer::Landlock) {
        // The ruleset at the kernel's ABI, as the plan decided (never the newest ABI's
        // rights on an older kernel: HardRequirement below would refuse them).
        let ruleset =
            plan.landlock
                .as_ref()
                .map(|at| at.ruleset.clone())
                .ok_or(SandboxError::Layer(LayerError::Unavailable {
                    layer: Layer::Landlock,
                }))?;
        executor.landlock = Some(Arc::new(LandlockRules(ruleset)));
    }
    Ok(executor)
}

/// The policy's Landlock ruleset, applied inside the container.
struct LandlockRules(agent_sandbox_policy::landlock::LandlockRuleset);

impl LandlockApply for LandlockRules {
    fn apply(&self, audit: bool) -> Result<Option<u16>, String> {
        use landlock::{
            CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
            RulesetCreatedAttr, RulesetStatus,
        };
        let rs = &self.0;
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(rs.handled_fs_flags())
            .map_err(|e| e.to_string())?;
        // Below ABI 4 the ruleset handles no TCP right (an empty set is an error).
        if !rs.handled_net.is_empty() {
            ruleset = ruleset
                .handle_access(rs.handled_net_flags())
                .map_err(|e| e.to_string())?;
        }
        let mut created = ruleset.create().map_err(|e| e.to_string())?;
        for rule in &rs.paths {
            // A path missing in this container gets no rights, which is narrower.
            let Ok(fd) = PathFd::new(&rule.path) else {
                continue;
            };
            created = created
                .add_rule(PathBeneath::new(fd, rule.flags()))
                .map_err(|e| format!("{}: {e}", rule.path))?;
        }
        for rule in &rs.net {
            created = created
                .add_rule(NetPort::new(rule.port, rule.flags()))
                .map_err(|e| format!("port {}: {e}", rule.port))?;
        }
        if audit {
            // By default the kernel logs only denials of the process that restricted
            // itself, before it execs (none in a sandbox: this process execs the
            // workload next); the workload's denials need LOG_NEW_EXEC_ON (ABI 7, which
            // the supervisor checked before it turned `fs_denied` reporting on).
            created = created.log_new_exec(true).map_err(|e| e.to_string())?;
        }
        let status = created.restrict_self().map_err(|e| e.to_string())?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(format!("ruleset only {:?}", status.ruleset));
        }
        // The probe needs a TCP port Landlock refuses; a ruleset without TCP rights
        // (transparent egress, docs/egress.md) cannot make one, and this process's Landlock
        // denials go unclaimed (no `fs_denied` records for it).
        if !audit || rs.handled_net.is_empty() {
            return Ok(None);
        }
        let port = probe_port(rs);
        match std::net::TcpStream::connect((agent_sandbox_audit::kernel::PROBE_ADDR, port)) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(Some(port)),
            other => Err(format!(
                "the TCP connect probe to port {port} was not refused by Landlock ({other:?})"
            )),
        }
    }
}

/// The port of the Landlock probe: the lowest one the ruleset grants no connect to.
fn probe_port(rs: &agent_sandbox_policy::landlock::LandlockRuleset) -> u16 {
    (1..=u16::MAX)
        .find(|p| !rs.net.iter().any(|r| r.port == *p))
        .unwrap_or(1)
}

/// How much of the workspace `protected_in_workspace` reads, and how many protected paths
/// it binds, at most: it runs at every create.
const PROTECTED_WALK_ENTRIES: usize = 50_000;
const PROTECTED_WALK_DEPTH: usize = 32;
const PROTECTED_MAX_MOUNTS: usize = 256;

/// The protected paths that exist in the host workspace, at its top and in its
/// subdirectories (`pkg/.envrc`, a vendored repository's `.git/hooks`), bound read-only over
/// the overlay. Symlinks are neither bound nor followed: binding one would follow the link on
/// the host and show the file it points to inside the sandbox (an information leak); left in
/// the overlay it resolves inside the sandbox's own view, and writes through it never reach
/// the host. The walk does not enter `.git` directories (their protected parts are named
/// from the parent) and stops after [`PROTECTED_WALK_ENTRIES`] entries; a protected name that
/// does not exist yet, or lies past the limits, is for review and promotion to refuse
/// (docs/workspace.md).
fn protected_in_workspace(spec: &Spec, policy: &SandboxPolicy) -> Vec<harden::ProtectedMount> {
    let Some(source) = harden::workspace_source(spec, policy) else {
        return Vec::new();
    };
    let names = policy.filesystem.protected_names();
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| !m.file_type().is_symlink());
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([(PathBuf::new(), 0usize)]);
    let mut seen = 0usize;
    while let Some((rel, depth)) = queue.pop_front() {
        let dir = source.join(&rel);
        for name in &names {
            // Every component but the last must be a real directory, not a link.
            let mut ok = true;
            let mut cur = dir.clone();
            let parts: Vec<&str> = name.as_str().split('/').collect();
            for (i, part) in parts.iter().enumerate() {
                cur.push(part);
                let meta = std::fs::symlink_metadata(&cur);
                let last = i + 1 == parts.len();
                if !meta.as_ref().is_ok_and(|m| last || m.is_dir()) {
                    ok = false;
                    break;
                }
            }
            if ok
                && exists(&cur)
                && let Some(m) = harden::protected_path_at(spec, policy, &rel, name)
            {
                found.push(m);
            }
        }
        if depth >= PROTECTED_WALK_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            seen += 1;
            if seen > PROTECTED_WALK_ENTRIES {
                tracing::warn!(workspace = %source.display(), limit = PROTECTED_WALK_ENTRIES, "protected paths searched only part of the workspace");
                queue.clear();
                break;
            }
            let child = e.file_name();
            if child == ".git" || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            // A protected directory is bound whole: nothing under it needs a bind of its own.
            if names
                .iter()
                .any(|n| n.is_dir() && n.as_str() == child.to_string_lossy())
            {
                continue;
            }
            queue.push_back((rel.join(&child), depth + 1));
        }
    }
    if found.len() > PROTECTED_MAX_MOUNTS {
        tracing::warn!(
            found = found.len(),
            limit = PROTECTED_MAX_MOUNTS,
            "too many protected paths in the workspace: only the shallowest are bound"
        );
        found.truncate(PROTECTED_MAX_MOUNTS);
    }
    found
}

/// The host ids of the spec's process user and group (container root's if unmapped).
fn process_host_ids(spec: &Spec, map: &IdMapping) -> (u32, u32) {
    let host = |id: u32| {
        if id < map.size {
            map.host_id + id
        } else {
            map.host_id
        }
    };
    spec.process()
        .as_ref()
        .map(|p| (host(p.user().uid()), host(p.user().gid())))
        .unwrap_or((map.host_id, map.host_id))
}

/// Refuses a spec whose writable mounts (or a parent) are symlinks in the rootfs.
pub fn check_writable_destinations(spec: &Spec, rootfs: &Path) -> Result<(), SandboxError> {
    for dest in harden::writable_destinations(spec) {
        let mut cur = rootfs.to_path_buf();
        for comp in dest.components().skip(1) {
            cur.push(comp);
            if let Ok(meta) = std::fs::symlink_metadata(&cur)
                && meta.file_type().is_symlink()
            {
                return Err(SandboxError::SymlinkedWritable {
                    path: dest.clone(),
                    component: cur,
                });
            }
        }
    }
    Ok(())
}

/// Where the reachable mounts of a sandbox live: a directory every ancestor of
/// which the sandbox's unprivileged root can traverse. The state root cannot be
/// used for that: a caller's `--root` may sit under a 0700 directory (the shim's
/// `/run/containerd/agent-sandbox/<ns>`), and rootless `$XDG_RUNTIME_DIR` is 0700.
/// As real root: `/run/agent-sandbox/mnt/<tag>/<id>`; rootless:
/// `/tmp/agent-sandbox-<host uid>/<tag>/<id>`, where `<tag>` is a short hash of
/// the state root, so equal ids under different roots never collide. The path
/// is recorded in `sandbox.json`, and cleanup uses the recorded one.
pub fn mount_dir(dirs: &StateDirs, id: &ContainerId) -> Result<PathBuf, SandboxError> {
    use sha2::Digest;
    let tag = hex::encode(&sha2::Sha256::digest(dirs.root.as_os_str().as_encoded_bytes())[..6]);
    let base = if paths::rootless()? {
        let host_uid = host_uid_of_self().unwrap_or_else(|| nix::unistd::geteuid().as_raw());
        let top = PathBuf::from(format!("/tmp/agent-sandbox-{host_uid}"));
        mounts::mkdir_traversable(&top)?;
        top
    } else {
        let top = PathBuf::from("/run/agent-sandbox");
        mounts::mkdir_traversable(&top)?;
        let mnt = top.join("mnt");
        mounts::mkdir_traversable(&mnt)?;
        mnt
    };
    let tagged = base.join(tag);
    mounts::mkdir_traversable(&tagged)?;
    Ok(tagged.join(id.as_str()))
}

/// The host uid that our uid maps to, read from `/proc/self/uid_map`.
fn host_uid_of_self() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let me = nix::unistd::geteuid().as_raw();
    map.lines().find_map(|l| {
        let f: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        (f.len() == 3 && me >= f[0] && me - f[0] < f[2]).then(|| f[1] + (me - f[0]))
    })
}

impl Prepared {
    /// The profile name for logs and `state`: the selecting annotation, if any.
    pub fn spec_profile_name(&self) -> Option<String> {
        self.spec
            .annotations()
            .as_ref()
            .and_then(|a| a.get("io.agent.sandbox.profile").cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Landlock before ABI 3 does not handle truncate(2): the right is missing, and only the
    /// layers the plan names (read-only mounts, AppArmor) stop it. Proven on this kernel by
    /// applying the real ruleset code at ABI 2, then at the kernel's own ABI.
    #[test]
    fn an_abi_2_ruleset_lets_truncate_through_where_the_kernels_own_abi_refuses_it() {
        use agent_sandbox_policy::landlock::{
            CoverFacts, FsAccess, LandlockRuleset, PathRule, at_abi,
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("victim");
        let full = LandlockRuleset {
            min_abi: 5,
            handled_fs: FsAccess::ALL.into_iter().collect(),
            handled_net: Default::default(),
            paths: vec![PathRule {
                path: "/".to_owned(),
                access: [FsAccess::Execute, FsAccess::ReadFile, FsAccess::ReadDir]
                    .into_iter()
                    .collect(),
            }],
            net: Vec::new(),
        };
        // Landlock restricts the calling thread only: each attempt runs on a thread of its own.
        let attempt = |abi: u32| {
            std::fs::write(&file, b"data").unwrap();
            let rules = LandlockRules(at_abi(&full, abi, &CoverFacts::default()).ruleset);
            let f = file.clone();
            std::thread::spawn(move || {
                rules.apply(false).unwrap();
                let write = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .err()
                    .and_then(|e| e.raw_os_error());
                (nix::unistd::truncate(&f, 0), write)
            })
            .join()
            .unwrap()
        };
        let (truncate, write) = attempt(2);
        assert_eq!(write, Some(libc::EACCES), "ABI 2 still refuses writes");
        assert_eq!(
            truncate,
            Ok(()),
            "ABI 2 has no truncate right: the gap is real"
        );
        let kernel = agent_sandbox_sys::landlock_abi().unwrap();
        assert!(
            kernel >= 3,
            "this test needs a kernel with Landlock ABI 3 (has {kernel})"
        );
        let (truncate, write) = attempt(kernel);
        assert_eq!(write, Some(libc::EACCES));
        assert_eq!(
            truncate,
            Err(nix::errno::Errno::EACCES),
            "ABI {kernel} refuses it"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
    }

    #[test]
    fn every_exec_gets_the_policys_apparmor_profile_where_apparmor_applies() {
        let policy = SandboxPolicy::builtin(DEFAULT_PROFILE).unwrap();
        let mut process = Process::default();
        process.set_apparmor_profile(Some("containers-default-0.50.1".to_owned()));
        let with = LayerPlan {
            apply: vec![Layer::Seccomp, Layer::Landlock, Layer::Apparmor],
            ..LayerPlan::default()
        };
        let name = agent_sandbox_policy::apparmor::loaded_profile(&policy).name;
        let exec = harden_exec(process.clone(), &policy, &with).unwrap();
        assert_eq!(exec.apparmor_profile().as_deref(), Some(name.as_str()));
        // Without the layer (no AppArmor, rootless), the caller's profile is left as it is:
        // any profile is narrower than none.
        let without = LayerPlan {
            apply: vec![Layer::Seccomp, Layer::Landlock],
            ..LayerPlan::default()
        };
        let exec = harden_exec(process, &policy, &without).unwrap();
        assert_eq!(
            exec.apparmor_profile().as_deref(),
            Some("containers-default-0.50.1")
        );
    }
}

//! `prepare`: the spec hardened under the ceiling with the runtime's facts, its layer plan,
//! and the executor for the in-process layers (create's hardening phase calls it).

use std::path::Path;
use std::sync::Arc;

use agent_sandbox_policy::harden::{self, HardenContext, OverlayDirs};
use agent_sandbox_policy::layers::LayerPlan;
use agent_sandbox_policy::seccomp::Arch;
use agent_sandbox_policy::{Layer, SandboxPolicy};
use libcontainer::oci_spec::runtime::Spec;

use super::ids::id_mapping;
use super::plan::{plan_for, set_apparmor};
use super::protected::protected_in_workspace;
use super::{Ceiling, SandboxError};
use crate::enforce::executor::{SandboxExecutor, executor_for};
use crate::host::idmap::IdRange;

/// Inputs the runtime measured for hardening.
pub struct Facts {
    pub ids: IdRange,
    /// The workspace overlay's upper/work dirs, made by [`overlay_dirs`](super::overlay_dirs)
    /// when the sandbox has a workspace.
    pub workspace: Option<OverlayDirs>,
    /// The pinned namespaces of the pod a Kubernetes app container joins (`crate::pod`).
    pub pod: Option<harden::PodNamespaces>,
    /// Bound over the protected names of a HOME on a scratch area
    /// ([`HardenContext::placeholders`]).
    pub placeholders: Option<harden::Placeholders>,
    /// The user namespace the runtime made for this sandbox, owned by its host root id
    /// (`crate::host::userns`); `None` for a pod's member.
    pub user_namespace: Option<std::path::PathBuf>,
    /// Id 0 of the runtime's user namespace is not host root (rootless podman's namespace,
    /// [`HardenContext::parent_root_unprivileged`]).
    pub parent_root_unprivileged: bool,
    /// What the host supports, for the layer plan (`crate::harden::host_support`, or a
    /// unit test's fake host).
    pub support: agent_sandbox_policy::layers::HostSupport,
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

/// Hardens `spec` under the sandbox's `effective` policy (compiled once, by create's host
/// phase, from `ceiling` and the spec's annotations) with the runtime's facts (the policy
/// compiler, `harden_spec_under`), sets the AppArmor profile the layer plan applies, and builds the
/// executor for the layers the plan applies.
pub fn prepare(
    ceiling: &Ceiling,
    effective: SandboxPolicy,
    spec: Spec,
    facts: &Facts,
) -> Result<Prepared, SandboxError> {
    let requested = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    let map = id_mapping(&facts.ids);
    // Protected paths that exist in the host workspace are bound read-only over
    // the overlay, credential stores masked (docs/workspace.md#secret-names). A symlink
    // is left out: binding it would follow the link on
    // the host and show the host file it points to inside the sandbox (an
    // information leak); left in the overlay it resolves inside the sandbox's
    // own view, and writes through it never reach the host.
    let protected = protected_in_workspace(&spec, &effective);
    let ctx = HardenContext {
        uid_mappings: vec![map],
        gid_mappings: vec![map],
        parent_root_unprivileged: facts.parent_root_unprivileged,
        workspace: facts.workspace.clone(),
        protected,
        network_namespace: None,
        user_namespace: facts.user_namespace.clone(),
        pod: facts.pod.clone(),
        host_namespaces: host_namespaces(&spec),
        placeholders: facts.placeholders.clone(),
        profile: ceiling.admin_profile().cloned(),
    };
    let mut hardened =
        harden::harden_spec_under(spec, effective, &ctx).map_err(SandboxError::Harden)?;
    let plan = plan_for(&hardened.policy, &hardened.spec, &facts.support)?;
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

impl Prepared {
    /// The profile name for logs and `state`: the selecting annotation, if any.
    pub fn spec_profile_name(&self) -> Option<String> {
        self.spec
            .annotations()
            .as_ref()
            .and_then(|a| a.get(harden::ANNOTATION_PROFILE).cloned())
    }
}

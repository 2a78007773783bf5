//! `compile`: the sandbox's plan compiled with the facts the runtime measures here, and the
//! executor for the in-process layers the plan applies (create's hardening phase calls it;
//! exec builds its executor from the saved plan).

use std::path::Path;
use std::sync::Arc;

use agent_sandbox_policy::harden::{self, HostFacts};
use agent_sandbox_policy::layers::LayerPlan;
use agent_sandbox_policy::seccomp::Arch;
use agent_sandbox_policy::{Compiled, Layer, SandboxPlan, SandboxPolicy};
use libcontainer::oci_spec::runtime::Spec;

use super::ids::id_mapping;
use super::protected::protected_in_workspace;
use super::{Ceiling, SandboxError};
use crate::enforce::executor::{SandboxExecutor, executor_for};
use crate::host::idmap::IdRange;

/// The filters that honour the config's own seccomp profile beside the policy's (see
/// `agent_sandbox_policy::seccomp::compile_request`); an error names what cannot be honoured.
fn requested_seccomp(
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

/// Compiles the sandbox's plan (`agent_sandbox_policy::compile_under`) under its
/// `effective` policy (narrowed once, by create's host phase, from `ceiling` and the spec's
/// annotations) with the host's `facts`, to which it adds what it measures here: the id
/// mapping of `ids`, the protected paths found in the workspace, the spec's namespaces that
/// are the host's and the admin's profile of `ceiling`. Returns the plan with its hardened
/// spec, and the executor for the in-process layers the plan applies.
pub fn compile(
    ceiling: &Ceiling,
    effective: SandboxPolicy,
    spec: Spec,
    ids: &IdRange,
    facts: HostFacts,
) -> Result<(Compiled, SandboxExecutor), SandboxError> {
    let map = id_mapping(ids);
    // Protected paths that exist in the host workspace are bound read-only over
    // the overlay, credential stores masked (docs/workspace.md#secret-names). A symlink
    // is left out: binding it would follow the link on
    // the host and show the host file it points to inside the sandbox (an
    // information leak); left in the overlay it resolves inside the sandbox's
    // own view, and writes through it never reach the host.
    let facts = HostFacts {
        uid_mappings: vec![map],
        gid_mappings: vec![map],
        protected: protected_in_workspace(&spec, &effective),
        host_namespaces: host_namespaces(&spec),
        profile: ceiling.admin_profile().cloned(),
        ..facts
    };
    let compiled = agent_sandbox_policy::compile_under(effective, spec, &facts)?;
    let executor = executor(&compiled.plan)?;
    Ok((compiled, executor))
}

/// The executor for the in-process layers `plan` applies, with the filters that honour the
/// config's own seccomp profile the plan holds.
pub fn executor(plan: &SandboxPlan) -> Result<SandboxExecutor, SandboxError> {
    let mut executor = executor_for(&plan.policy, &plan.layers)?;
    executor.requested_seccomp =
        requested_seccomp(plan.requested_seccomp.as_ref(), &plan.policy, &plan.layers)?;
    Ok(executor)
}

/// The profile name for logs and `state`: the selecting annotation of the hardened `spec`,
/// if any.
pub fn spec_profile_name(spec: &Spec) -> Option<String> {
    spec.annotations()
        .as_ref()
        .and_then(|a| a.get(harden::ANNOTATION_PROFILE).cloned())
}

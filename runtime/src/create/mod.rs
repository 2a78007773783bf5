//! `create` as a recipe of named phases, each a function with a typed result:
//!
//! 1. [`ids`](Runtime::assign_ids): the pod role and the sandbox's host id block.
//! 2. [`host`](Runtime::prepare_host): the sandbox's directories, audit log, record and
//!    ceiling, the workspace change set, reachable bind sources, the overlay's dirs.
//! 3. [`harden`](Runtime::harden): every edit of the spec, from the policy compiler to the
//!    runtime's facts; it ends with `verify`, and nothing edits the spec after it.
//! 4. [`install`](Runtime::install): the hardened spec made real on the host (AppArmor
//!    profile, mount points, read-only rootfs, workspace overlay, the bundle libcontainer
//!    reads).
//! 5. [`spawn_sidecars`](Runtime::spawn_sidecars), [`build`](Runtime::build),
//!    [`start_home_guards`](Runtime::start_home_guards),
//!    [`attach_sidecars`](Runtime::attach_sidecars),
//!    [`home_guards_placed`](Runtime::home_guards_placed): the denied-syscall supervisor
//!    and the egress proxy start beside libcontainer's create and are tied to the init
//!    after it; meanwhile a child places HOME's guards in the container libcontainer made
//!    without them, and create waits for it before going on; for podman, the OOM watcher
//!    of `sidecars::podman_oom` is registered.
//! 6. [`record`](Runtime::record_created): the audit records, the limits read back, the layers.
//!
//! A failed phase leaves the clean-up to `create`'s caller side
//! (`Runtime::cleanup_sandbox`), which removes whatever the phases before it set up.
//! Every phase reaches the host (mounts, cgroups, AppArmor, the sidecars, `lo` in the init's
//! namespace, a pod's pins) through [`host_procs::HostProcs`], and libcontainer through
//! [`engine::Engine`], so that the unit tests in `failure_tests.rs` fail each step in turn
//! with recording fakes, without root, and check that nothing of the sandbox is left: no
//! file in the state root, no mount, no sidecar, no AppArmor profile.

mod build;
pub(crate) mod engine;
mod harden;
mod host;
pub(crate) mod host_procs;
mod ids;
mod marks;
mod record;
pub(crate) mod restore;
mod sidecars;

use std::path::PathBuf;

use libcontainer::oci_spec::runtime::Spec;

use crate::harden::Ceiling;
use crate::host::idmap::IdRange;
use crate::lifecycle::{
    BuildError, CreateOpts, LookupError, PlanError, Runtime, SandboxRecord, WatchdogError,
};
use crate::state::ContainerId;
use marks::Marks;

pub use restore::RestoreOpts;

/// Errors of `create` and of `restore` (a create from a checkpoint image: what only restore
/// does is its [`Restore`](CreateError::Restore) variant). The other operations have one type
/// each (`crate::lifecycle`). Messages read like runc's where callers match on them
/// ("container with id ... already exists").
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("container with id {id} already exists")]
    Exists { id: ContainerId },
    #[error("cannot read bundle config {path}")]
    BundleConfig {
        path: PathBuf,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error("bundle {bundle} has no root.path in config.json")]
    NoRoot { bundle: PathBuf },
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(transparent)]
    Paths(#[from] crate::state::paths::PathsError),
    #[error(transparent)]
    IdMap(#[from] crate::host::idmap::IdMapError),
    #[error(transparent)]
    Mount(#[from] crate::enforce::mounts::MountError),
    #[error(transparent)]
    Enforce(#[from] crate::enforce::EnforceError),
    #[error(transparent)]
    Sandbox(#[from] crate::harden::SandboxError),
    #[error(transparent)]
    Pod(#[from] crate::pod::PodError),
    #[error("network layer: the egress proxy")]
    Egress(#[source] crate::sidecars::egress::EgressError),
    #[error("cannot set up the sandbox's CA for https credential injection")]
    Trust(#[source] crate::sidecars::tls_trust::TrustError),
    #[error("audit trail")]
    Audit(#[source] agent_sandbox_audit::AuditError),
    #[error("layers record")]
    Layers(#[source] crate::report::layers::LayersError),
    #[error("apparmor layer")]
    AppArmor(#[source] crate::host::apparmor::AppArmorError),
    #[error("hooks")]
    Hook(#[source] crate::enforce::hooks::HookError),
    #[error("denied-syscall audit")]
    SyscallAudit(#[from] crate::sidecars::syscall_audit::SyscallAuditError),
    #[error("workspace changes")]
    Changes(#[source] crate::report::changes::ChangesError),
    #[error("cannot bring lo up in the sandbox network namespace")]
    Loopback(#[source] agent_sandbox_sys::LoopbackError),
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
    #[error(transparent)]
    Rlimit(#[from] crate::host::rlimits::RlimitError),
    #[error("per-user kernel counts: the sandbox's own user namespace")]
    Userns(#[source] crate::host::userns::UsernsError),
    #[error("{op} failed")]
    Container {
        op: &'static str,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    #[error("create failed: cannot set sysctl {settings} in the sandbox")]
    Sysctl {
        settings: String,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    #[error(transparent)]
    Restore(Box<restore::RestoreError>),
}

type Result<T> = std::result::Result<T, CreateError>;

/// Phase 1: who the sandbox is among its pod, and its host ids.
struct Ids {
    rootless: bool,
    role: crate::pod::Role,
    /// The pod a Kubernetes app container joins (its ids, namespaces and ceiling).
    member: Option<crate::pod::Member>,
    ids: IdRange,
    /// Whether `ids` came from the host allocation file (released on delete).
    allocated: bool,
}

impl Ids {
    /// The ceiling in force: the pod's for a member, else the runtime's.
    fn ceiling<'a>(&'a self, runtime: &'a Ceiling) -> &'a Ceiling {
        self.member.as_ref().map_or(runtime, |m| &m.ceiling)
    }
}

/// Phase 2: what the host holds for the sandbox before its spec is hardened.
struct Host {
    sandbox_dir: crate::state::SandboxDir,
    /// The per-sandbox directory of reachable mounts (`crate::harden::mount_dir`).
    mount_dir: PathBuf,
    /// The image rootfs the caller's bundle names.
    rootfs_src: PathBuf,
    record: SandboxRecord,
    change_set: Option<crate::report::changes::Created>,
    rebinds: crate::enforce::mounts::Rebinds,
    workspace: Option<agent_sandbox_policy::harden::OverlayDirs>,
    /// Bound over the protected names of a scratch HOME (`mounts::placeholders`).
    placeholders: agent_sandbox_policy::harden::Placeholders,
    /// The sandbox's own user namespace (`crate::host::userns`); `None` for a pod's member
    /// (it joins the pod's).
    userns: Option<crate::host::userns::OwnedUserns>,
    /// The effective policy, narrowed once here from the ceiling and the spec's annotations
    /// (the user namespace's caps and the workspace need it); the hardening phase compiles
    /// the sandbox's plan under it.
    policy: agent_sandbox_policy::SandboxPolicy,
}

/// Phase 3: the verified spec, the plan it was compiled with, and the runtime's own facts.
struct Hardened {
    /// The spec libcontainer gets; no phase after [`Runtime::harden`] edits it.
    spec: Spec,
    /// The sandbox's plan (effective policy, layer plan, protected binds, clamps, the
    /// config's seccomp request), saved as `plan.json` by the hardening phase.
    plan: agent_sandbox_policy::SandboxPlan,
    /// The length of the policy's seccomp program, for the layers record.
    seccomp_len: Option<usize>,
    cgroups: crate::host::cgroups::Placement,
    /// The workspace overlay the runtime mounts (the spec binds its merged dir).
    overlay: Option<crate::enforce::mounts::OverlayMount>,
    /// The `startContainer` hooks, run by the init (`crate::enforce::hooks`).
    start_hooks: Vec<libcontainer::oci_spec::runtime::Hook>,
}

/// Phase 5: the sidecars started before libcontainer's create.
struct Sidecars {
    supervisor: Option<Box<dyn host_procs::StartingSupervisor>>,
    proxy: Option<Box<dyn host_procs::StartingProxy>>,
}

impl Runtime {
    /// `create`: prepares the sandbox and leaves its init waiting for `start`.
    pub fn create(&self, id: &ContainerId, opts: &CreateOpts, ceiling: &Ceiling) -> Result<()> {
        if self.dirs.container(id).exists() || self.dirs.sandbox(id).exists() {
            return Err(CreateError::Exists { id: id.clone() });
        }
        let marks = Marks::start();
        crate::host::cgroups::warm::start();
        let config = opts.bundle.join("config.json");
        let spec = Spec::load(&config).map_err(|source| CreateError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        marks.mark("spec");
        let result = self.create_inner(id, opts, spec, ceiling, &marks);
        if result.is_err() {
            self.cleanup_sandbox(id);
            marks.mark("cleanup");
        }
        marks.finish(id.as_str(), result.is_ok());
        result
    }

    /// The recipe. Order is security where a comment says so.
    fn create_inner(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        spec: Spec,
        ceiling: &Ceiling,
        marks: &Marks,
    ) -> Result<()> {
        let mut spec = spec;
        agent_sandbox_policy::profiles::annotation_from_env(&mut spec)
            .map_err(|e| CreateError::Sandbox(crate::harden::SandboxError::Harden(e)))?;
        let ids = self.assign_ids(id, &spec)?;
        // Before anything is set up for the sandbox: the admin's profile its annotation
        // names, read once; exec and a pod's members use the copy saved with the ceiling.
        let annotations = spec.annotations().clone().unwrap_or_default();
        let ceiling = &ids
            .ceiling(ceiling)
            .with_profile_for(&annotations, &self.profiles_dir)?;
        marks.mark("ids");
        let mut host = self.prepare_host(id, opts, &spec, &ids, ceiling, marks)?;
        // Every edit of the spec; ends with `verify`.
        let (hardened, mut executor) = self.harden(id, opts, spec, &ids, ceiling, &mut host)?;
        marks.mark("prepare");
        let bundle = self.install(id, &ids, &host, &hardened)?;
        marks.mark("mounts");
        let sidecars = self.spawn_sidecars(id, &ids, &host, &hardened, &mut executor)?;
        marks.mark("supervisor");
        let (pid, guards) = self.build(id, opts, &hardened, &host, executor, &bundle)?;
        marks.mark("libcontainer");
        // A child places HOME's guards while the sidecars are tied to the init (neither
        // touches what the other does); dropped on a failure, it is killed and reaped.
        let placing = self.start_home_guards(pid, &guards)?;
        let proxy_pid = self.attach_sidecars(id, &ids, &host, pid, sidecars, marks)?;
        // Keep before anything reports the sandbox created: `start` may run the program
        // only once every guard is in place.
        self.home_guards_placed(placing)?;
        marks.mark("home_guards");
        // Before the program runs, so an OOM kill in its first moment is seen.
        self.watch_oom_for_podman(id, &hardened.spec, &opts.bundle, pid);
        // Keep this as the last step: a sandbox is reported created only with its records.
        self.record_created(id, &ids, &host, &hardened, pid, proxy_pid, marks)?;
        marks.mark("record");
        Ok(())
    }
}

#[cfg(test)]
mod failure_tests;
#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod tests;

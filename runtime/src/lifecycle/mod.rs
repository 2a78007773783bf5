//! The runc-compatible operations: create, start, state, kill, delete, exec,
//! ps, update. Each maps runc's contract onto libcontainer plus the sandbox's
//! own preparation (id range, reachable rootfs, hardened spec) and cleanup.
//!
//! `create` is a recipe of its own (`crate::create`); every other operation has a file here,
//! each an `impl Runtime` block. This file holds the `Runtime`, its errors and options, and what
//! the operations share: loading a container, its state lock, the policy saved at create.

use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::syscall::syscall::SyscallType;
use serde::{Deserialize, Serialize};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::layers::LayerPlan;

use crate::enforce::mounts;
use crate::host::idmap::IdRange;
use crate::state::ContainerId;
use crate::state::paths::{self, PathsError, StateDirs};

pub use crate::create::CreateError;
pub use checkpoint::{CheckpointError, CheckpointOpts, CriuFlags};
pub use delete::DeleteError;
pub use exec::ExecError;
pub use kill::KillError;
pub use pause::PauseError;
pub use ps::PsError;
pub use sidecars::SidecarError;
pub use start::{StartError, WatchdogError};
pub use state::StateError;
pub use update::UpdateError;
pub use workspace::WorkspaceError;

pub(crate) mod checkpoint;
mod delete;
mod exec;
mod kill;
mod pause;
mod ps;
pub(crate) mod sidecars;
mod start;
mod state;
mod update;
mod workspace;

/// Finding a container: its state lock and libcontainer's view of it, the first step of
/// every operation on an existing container; each operation's error type holds it.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("container {id} does not exist")]
    NotExist { id: ContainerId },
    #[error(transparent)]
    StateLock(#[from] crate::state::lock::StateLockError),
    #[error("{op} failed")]
    Container {
        op: &'static str,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
}

/// Reading what create saved for a sandbox: its hardened spec (the bundle's `config.json`)
/// and its plan, the step every operation on a created sandbox that needs its policy takes.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read bundle config {path}")]
    BundleConfig {
        path: PathBuf,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error(transparent)]
    Sandbox(#[from] crate::harden::SandboxError),
}

/// Setting up a libcontainer build (create's and exec's): the builder on the state root, and
/// the working directory around the build ([`in_root_dir`]).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error("{op} failed")]
    Container {
        op: &'static str,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    #[error("cannot {what} the working directory around libcontainer's build")]
    WorkingDir {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Maps libcontainer's error of create's or restore's step `op` (boxed: it is large).
pub(crate) fn container_err(
    op: &'static str,
) -> impl FnOnce(libcontainer::error::LibcontainerError) -> CreateError {
    move |source| CreateError::Container {
        op,
        source: Box::new(source),
    }
}

/// Maps libcontainer's error of the lookup step `op`.
fn lookup_err(
    op: &'static str,
) -> impl FnOnce(libcontainer::error::LibcontainerError) -> LookupError {
    move |source| LookupError::Container {
        op,
        source: Box::new(source),
    }
}

/// Maps libcontainer's create error; a failed sysctl write names the keys and values the
/// sandbox asked for (libcontainer's own message names none).
pub(crate) fn create_err(
    source: libcontainer::error::LibcontainerError,
    spec: &Spec,
) -> CreateError {
    let mut chain = String::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&source);
    while let Some(e) = cause {
        chain.push_str(&e.to_string());
        cause = e.source();
    }
    let mut settings: Vec<String> = spec
        .linux()
        .as_ref()
        .and_then(|l| l.sysctl().as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if settings.is_empty() || !chain.contains("sysctl") {
        return container_err("create")(source);
    }
    settings.sort();
    CreateError::Sysctl {
        settings: settings.join(", "),
        source: Box::new(source),
    }
}

/// Runs `build` (libcontainer's create or exec) in `/`, then returns to the caller's working
/// directory.
///
/// The processes libcontainer forks inherit the working directory. containerd starts the
/// runtime in the task's bundle directory (mode 0700), which the container's mapped root cannot
/// open. libcontainer resolves procfs paths through `pathrs`, which, the first time an
/// `openat2` lookup fails for an expected reason (a magic link's ELOOP), probes
/// `openat2(AT_FDCWD, ".")` to tell whether `openat2` works at all (pathrs 0.2.6,
/// `syscalls::openat2::openat2_is_not_supported`). EACCES there makes it fall back, for the rest
/// of the process, to a walk of every procfs path one component at a time, each step checked with
/// `fstatfs` and `statx`. In a pod member's init that is about 12,700 system calls instead of a
/// few hundred, and 6-8 ms per `create` (docs/benchmarks.md). `/` can be opened by every uid, so
/// the probe sees `openat2` work. The fallback's checks and `openat2`'s `RESOLVE_*` flags give the
/// same guarantees; only the cost differs.
pub(crate) fn in_root_dir<T>(build: impl FnOnce() -> T) -> std::result::Result<T, BuildError> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    // O_PATH: the caller's directory only needs to be found again, not read.
    let caller = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(".")
        .map_err(|source| BuildError::WorkingDir {
            what: "open",
            source,
        })?;
    std::env::set_current_dir("/").map_err(|source| BuildError::WorkingDir {
        what: "leave",
        source,
    })?;
    let built = build();
    nix::unistd::fchdir(caller.as_raw_fd()).map_err(|e| BuildError::WorkingDir {
        what: "restore",
        source: e.into(),
    })?;
    Ok(built)
}

/// What the runtime remembers about a sandbox besides libcontainer's state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// The bundle the caller gave (reported by `state`).
    pub bundle: PathBuf,
    pub ids: IdRange,
    /// Whether `ids` came from the host allocation file (released on delete).
    pub allocated: bool,
    pub rootfs_mount: PathBuf,
    pub profile: String,
}

/// Options of `create`.
#[derive(Debug, Default, Clone)]
pub struct CreateOpts {
    pub bundle: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub no_pivot: bool,
    pub preserve_fds: i32,
    /// `--systemd-cgroup`: the systemd driver places the sandbox (`crate::host::cgroups`).
    pub systemd_cgroup: bool,
    /// `restore`: the ended change set the image names, whose layer the sandbox gets
    /// again instead of an empty one.
    pub reuse_change: Option<RestoredChange>,
    /// `restore` in place: the credential placeholders the image's sandbox had, which its
    /// restored processes hold (a fork passes none and gets new ones; docs/checkpoint.md#fork).
    pub keep_placeholders: std::collections::BTreeMap<String, String>,
}

/// The change set a checkpoint image names: of the same sandbox id it is reopened
/// (`crate::report::changes::reopen`); of another (podman's `--import` under a new name) its
/// layer is copied into the new sandbox's own change set (`crate::report::changes::copy_layer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredChange {
    /// The change id.
    pub change: String,
    /// The sandbox the image was taken of.
    pub from: String,
    /// The digest of the restoring runtime's own copy of the image's CRIU files: the change
    /// set is reused only if its checkpoint bound it to this digest
    /// (`crate::report::changes::bind_checkpoint`).
    pub image_digest: String,
    /// A fork's blocks (docs/checkpoint.md#fork): the copied layer's owners move from the
    /// image's id block (first) to the restoring sandbox's (second).
    pub reown: Option<(crate::host::idmap::IdRange, crate::host::idmap::IdRange)>,
}

impl RestoredChange {
    /// What the image says of its change set, with the digest the runtime computed.
    pub fn image(&self) -> crate::report::changes::ImageRef<'_> {
        crate::report::changes::ImageRef {
            container: &self.from,
            change: &self.change,
            digest: &self.image_digest,
        }
    }
}

/// Options of `exec`.
#[derive(Debug, Default)]
pub struct ExecOpts {
    pub process: Option<PathBuf>,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub tty: bool,
    pub user: Option<(u32, Option<u32>)>,
    pub detach: bool,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub preserve_fds: i32,
    /// The exec's id as our shim passes it (containerd's exec id).
    pub exec_id: Option<String>,
}

/// The init's exit as its reaper (the shim) saw it, handed to `delete` so that one run
/// writes the `exit` record and then deletes (instead of a separate `audit-exit` run first).
#[derive(Debug, Clone, Copy)]
pub struct ReapedInit {
    pub pid: Option<i32>,
    pub status: agent_sandbox_audit::ExitStatus,
}

/// The runtime, bound to one state root.
pub struct Runtime {
    pub dirs: StateDirs,
    /// `--audit-dir` / `AGENT_SANDBOX_AUDIT_DIR`: where new sandboxes' logs go.
    pub audit_dir: Option<PathBuf>,
    /// `--profiles-dir` / `AGENT_SANDBOX_PROFILES_DIR`: where `io.agent.sandbox.profile`
    /// finds the admin's profiles (`crate::harden::profiles`).
    pub profiles_dir: PathBuf,
    /// libcontainer, or a recording fake in unit tests (`crate::create::engine`).
    engine: Box<dyn crate::create::engine::Engine>,
    /// The sidecars and host steps of create, or a recording fake in unit tests
    /// (`crate::create::host_procs`).
    procs: Box<dyn crate::create::host_procs::HostProcs>,
}

impl crate::pod::PodStates for Runtime {
    fn dirs(&self) -> &StateDirs {
        &self.dirs
    }

    fn status(
        &self,
        pod: &ContainerId,
    ) -> std::result::Result<Option<ContainerStatus>, Box<dyn std::error::Error + Send + Sync>>
    {
        match self.load(pod) {
            Ok(c) => Ok(Some(c.status())),
            Err(LookupError::NotExist { .. }) => Ok(None),
            Err(e) => Err(Box::new(e)),
        }
    }
}

fn status_name(s: ContainerStatus) -> &'static str {
    match s {
        ContainerStatus::Creating | ContainerStatus::Created => "created",
        ContainerStatus::Running => "running",
        ContainerStatus::Paused => "paused",
        ContainerStatus::Stopped => "stopped",
    }
}

impl Runtime {
    pub fn new(root: Option<&Path>) -> std::result::Result<Self, PathsError> {
        let dirs = StateDirs::new(paths::state_root(root)?);
        Ok(Self {
            dirs,
            audit_dir: None,
            profiles_dir: PathBuf::from(crate::harden::DEFAULT_PROFILES_DIR),
            engine: Box::new(crate::create::engine::Libcontainer),
            procs: Box::new(crate::create::host_procs::RealProcs),
        })
    }

    /// The runtime with another engine (a unit test's recording fake).
    #[cfg(test)]
    pub(crate) fn with_engine(
        root: &Path,
        engine: Box<dyn crate::create::engine::Engine>,
    ) -> std::result::Result<Self, PathsError> {
        Ok(Self {
            engine,
            ..Self::new(Some(root))?
        })
    }

    /// The runtime with other host processes (a unit test's recording fake).
    #[cfg(test)]
    pub(crate) fn with_procs(self, procs: Box<dyn crate::create::host_procs::HostProcs>) -> Self {
        Self { procs, ..self }
    }

    pub(crate) fn engine(&self) -> &dyn crate::create::engine::Engine {
        self.engine.as_ref()
    }

    pub(crate) fn procs(&self) -> &dyn crate::create::host_procs::HostProcs {
        self.procs.as_ref()
    }

    pub(crate) fn builder(
        &self,
        id: &ContainerId,
    ) -> std::result::Result<ContainerBuilder, BuildError> {
        self.dirs.ensure()?;
        ContainerBuilder::new(id.as_str().to_owned(), SyscallType::default())
            .with_root_path(self.dirs.containers())
            .map_err(|source| BuildError::Container {
                op: "create",
                source: Box::new(source),
            })
    }

    /// Loads libcontainer's view of `id`, with a fresh status.
    ///
    /// libcontainer rewrites `state.json` in place; a command that reads it without the state
    /// lock (see [`crate::state::lock`]) can find it mid-write, empty or cut short, and then
    /// reads it again: a write lasts microseconds.
    pub fn load(&self, id: &ContainerId) -> std::result::Result<Container, LookupError> {
        const TORN_READ_RETRIES: u32 = 200;
        let dir = self.dirs.container(id);
        let mut retries = 0;
        let mut c = loop {
            if !dir.join("state.json").exists() {
                return Err(LookupError::NotExist { id: id.clone() });
            }
            match self.engine.load(dir.clone()) {
                Ok(c) => break c,
                Err(libcontainer::error::LibcontainerError::State(
                    libcontainer::container::state::StateError::ParseStateFile { .. },
                )) if retries < TORN_READ_RETRIES => {
                    retries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => return Err(lookup_err("load state")(e)),
            }
        };
        if retries > 0 {
            tracing::debug!(id = %id, retries, "state.json was being written; read again");
        }
        self.engine
            .refresh(&mut c)
            .map_err(lookup_err("refresh state"))?;
        Ok(c)
    }

    /// Takes `id`'s state lock: every command that may write libcontainer's `state.json`
    /// holds it (see [`crate::state::lock`]). None for an id without state: the command then
    /// finds no container, and leaves no lock file behind.
    fn state_lock(
        &self,
        id: &ContainerId,
    ) -> std::result::Result<Option<crate::state::lock::StateLock>, LookupError> {
        if !self.dirs.container(id).exists() {
            return Ok(None);
        }
        Ok(Some(crate::state::lock::acquire(
            &self.dirs.root,
            id,
            crate::state::lock::WAIT_LIMIT,
        )?))
    }

    fn record(
        &self,
        id: &ContainerId,
    ) -> std::result::Result<SandboxRecord, crate::files::FileError> {
        self.dirs.sandbox(id).record().read()
    }

    /// The plan of a created sandbox, as create compiled it (`plan.json`), with its hardened
    /// spec (in `bundle`). Start, exec, `update`, checkpoint and the sidecars all use this.
    fn saved_plan(
        &self,
        id: &ContainerId,
        bundle: &Path,
    ) -> std::result::Result<(agent_sandbox_policy::SandboxPlan, Spec), PlanError> {
        let config = bundle.join("config.json");
        let hardened = Spec::load(&config).map_err(|source| PlanError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        let plan = crate::harden::saved_plan(&self.dirs.sandbox(id), &hardened)?;
        Ok((plan, hardened))
    }

    /// [`Self::saved_plan`]'s effective policy and layer plan, for the commands that need
    /// no more of it.
    fn saved_policy(
        &self,
        id: &ContainerId,
        bundle: &Path,
    ) -> std::result::Result<(SandboxPolicy, LayerPlan, Spec), PlanError> {
        let (plan, hardened) = self.saved_plan(id, bundle)?;
        Ok((plan.policy, plan.layers, hardened))
    }
}

/// The host ids of the sandbox's process user and group, if its range maps them.
pub(crate) fn sandbox_user(spec: &Spec, ids: &IdRange) -> Option<mounts::SandboxUser> {
    let user = spec.process().as_ref()?.user();
    let host = |id: u32| (id < ids.size).then(|| ids.host_start + id);
    Some(mounts::SandboxUser {
        host_uid: host(user.uid())?,
        host_gid: host(user.gid())?,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The texts callers read (podman reads "container not running" as already stopped, the
    /// shim passes the rest on) are the ones the one `LifecycleError` printed for these
    /// operations before each had its own type.
    #[test]
    fn each_operations_error_keeps_the_text_it_had() {
        let id = ContainerId::try_from("texts").unwrap();
        let libcontainer = || {
            Box::new(libcontainer::error::LibcontainerError::Other(
                "x".to_owned(),
            ))
        };
        let texts: Vec<(String, &str)> = vec![
            (ExecError::NotRunning.to_string(), "container not running"),
            (ExecError::Exec(libcontainer()).to_string(), "exec failed"),
            (
                StartError::WrongState {
                    id: id.clone(),
                    status: "running",
                    wanted: "created",
                }
                .to_string(),
                "container texts is running, not created",
            ),
            (
                StartError::Container(libcontainer()).to_string(),
                "start failed",
            ),
            (
                WatchdogError::Spawn(std::io::Error::other("x")).to_string(),
                "cannot start the wall-clock watchdog",
            ),
            (
                UpdateError::Container(libcontainer()).to_string(),
                "update failed",
            ),
            (UpdateError::NotRunning.to_string(), "container not running"),
            (
                PauseError::Container {
                    op: "resume",
                    source: libcontainer(),
                }
                .to_string(),
                "resume failed",
            ),
            (PsError::Container(libcontainer()).to_string(), "ps failed"),
            (
                StartError::Lookup(LookupError::NotExist { id: id.clone() }).to_string(),
                "container texts does not exist",
            ),
        ];
        for (got, want) in texts {
            assert_eq!(got, want);
        }
    }

    /// The texts of create, restore, checkpoint, state, the workspace commands, the sidecar
    /// commands are the ones the one `LifecycleError` printed for them before each
    /// had its own type (the CLI prints the chain; transparent variants add no line).
    #[test]
    fn the_operations_split_from_lifecycle_error_keep_its_texts() {
        let id = ContainerId::try_from("texts").unwrap();
        let libcontainer = || {
            Box::new(libcontainer::error::LibcontainerError::Other(
                "x".to_owned(),
            ))
        };
        let not_exist = || LookupError::NotExist { id: id.clone() };
        let texts: Vec<(String, &str)> = vec![
            (
                CreateError::Exists { id: id.clone() }.to_string(),
                "container with id texts already exists",
            ),
            (
                CreateError::NoRoot {
                    bundle: PathBuf::from("/b"),
                }
                .to_string(),
                "bundle /b has no root.path in config.json",
            ),
            (
                CreateError::Lookup(not_exist()).to_string(),
                "container texts does not exist",
            ),
            (
                CreateError::Container {
                    op: "create",
                    source: libcontainer(),
                }
                .to_string(),
                "create failed",
            ),
            (
                CreateError::Sysctl {
                    settings: "a=\"1\"".to_owned(),
                    source: libcontainer(),
                }
                .to_string(),
                "create failed: cannot set sysctl a=\"1\" in the sandbox",
            ),
            (
                CreateError::Build(BuildError::WorkingDir {
                    what: "leave",
                    source: std::io::Error::other("x"),
                })
                .to_string(),
                "cannot leave the working directory around libcontainer's build",
            ),
            (
                CreateError::Watchdog(WatchdogError::Spawn(std::io::Error::other("x"))).to_string(),
                "cannot start the wall-clock watchdog",
            ),
            (
                StateError::Lookup(not_exist()).to_string(),
                "container texts does not exist",
            ),
            (
                WorkspaceError::NoWorkspace { id: id.clone() }.to_string(),
                "container texts has no workspace overlay",
            ),
            (
                WorkspaceError::NotExist { id: id.clone() }.to_string(),
                "container texts does not exist",
            ),
            (
                CheckpointError::WrongState {
                    id: id.clone(),
                    status: "stopped",
                    wanted: "running",
                }
                .to_string(),
                "container texts is stopped, not running",
            ),
            (
                CheckpointError::Resume(libcontainer()).to_string(),
                "resume failed",
            ),
            (
                CheckpointError::Lookup(not_exist()).to_string(),
                "container texts does not exist",
            ),
            (
                SidecarError::Kill(libcontainer()).to_string(),
                "kill failed",
            ),
            (
                SidecarError::Lookup(not_exist()).to_string(),
                "container texts does not exist",
            ),
        ];
        for (got, want) in texts {
            assert_eq!(got, want);
        }
    }

    /// The build sees `/`; the caller gets its own directory back, even one it may not list
    /// (containerd's bundle directories are 0700), which `O_PATH` does not need.
    #[test]
    fn build_runs_in_the_root_dir_and_the_callers_dir_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let locked = dir.path().join("bundle");
        std::fs::create_dir(&locked).unwrap();
        let before = std::env::current_dir().unwrap();
        std::env::set_current_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o111))
            .unwrap();
        let inside = super::in_root_dir(|| std::env::current_dir().unwrap()).unwrap();
        let after = std::env::current_dir().unwrap();
        std::env::set_current_dir(&before).unwrap();
        assert_eq!(inside, Path::new("/"));
        assert_eq!(after, locked);
    }
}

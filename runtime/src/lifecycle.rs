//! The runc-compatible operations: create, start, state, kill, delete, exec,
//! ps, update. Each maps runc's contract onto libcontainer plus the sandbox's
//! own preparation (id range, reachable rootfs, hardened spec) and cleanup.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::{Process, Spec};
use libcontainer::syscall::syscall::SyscallType;
use serde::{Deserialize, Serialize};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::layers::LayerPlan;

use crate::enforce::{self, EnforceError};
use crate::host::idmap::{self, IdMapError, IdRange};
use crate::mounts::{self, MountError};
use crate::state::ContainerId;
use crate::state::paths::{self, PathsError, StateDirs};

/// Errors of the lifecycle operations. Messages read like runc's where callers
/// match on them ("container ... does not exist").
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("container {id} does not exist")]
    NotExist { id: ContainerId },
    #[error("container with id {id} already exists")]
    Exists { id: ContainerId },
    #[error("cannot read bundle config {path}")]
    BundleConfig {
        path: PathBuf,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("bundle {bundle} has no root.path in config.json")]
    NoRoot { bundle: PathBuf },
    #[error("container {id} is {status}, not {wanted}")]
    WrongState {
        id: ContainerId,
        status: &'static str,
        wanted: &'static str,
    },
    #[error("container not running")]
    NotRunning,
    #[error(transparent)]
    StateLock(#[from] crate::state::lock::StateLockError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("invalid signal {signal:?}")]
    Signal { signal: String },
    #[error("cannot signal process {pid}")]
    SignalSend {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    IdMap(#[from] IdMapError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Enforce(#[from] EnforceError),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
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
    Hook(#[source] crate::hooks::HookError),
    #[error("denied-syscall audit")]
    SyscallAudit(#[source] crate::sidecars::syscall_audit::SyscallAuditError),
    #[error("container {id} has no workspace overlay")]
    NoWorkspace { id: ContainerId },
    #[error("workspace changes")]
    Changes(#[source] crate::report::changes::ChangesError),
    #[error("cannot bring lo up in the sandbox network namespace")]
    Loopback(#[source] agent_sandbox_sys::LoopbackError),
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
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
    #[error("exec failed")]
    Exec {
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    #[error("cannot wait for process {pid}")]
    Wait {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error("cannot {what} the working directory around libcontainer's build")]
    WorkingDir {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, LifecycleError>;

/// Maps libcontainer's error of operation `op` (boxed: it is large).
pub(crate) fn container_err(
    op: &'static str,
) -> impl FnOnce(libcontainer::error::LibcontainerError) -> LifecycleError {
    move |source| LifecycleError::Container {
        op,
        source: Box::new(source),
    }
}

/// Maps libcontainer's create error; a failed sysctl write names the keys and values the
/// sandbox asked for (libcontainer's own message names none).
pub(crate) fn create_err(
    source: libcontainer::error::LibcontainerError,
    spec: &Spec,
) -> LifecycleError {
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
    LifecycleError::Sysctl {
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
pub(crate) fn in_root_dir<T>(build: impl FnOnce() -> T) -> Result<T> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    // O_PATH: the caller's directory only needs to be found again, not read.
    let caller = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(".")
        .map_err(|source| LifecycleError::WorkingDir {
            what: "open",
            source,
        })?;
    std::env::set_current_dir("/").map_err(|source| LifecycleError::WorkingDir {
        what: "leave",
        source,
    })?;
    let built = build();
    nix::unistd::fchdir(caller.as_raw_fd()).map_err(|e| LifecycleError::WorkingDir {
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
#[derive(Debug, Default)]
pub struct CreateOpts {
    pub bundle: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub no_pivot: bool,
    pub preserve_fds: i32,
    /// `--systemd-cgroup`: the systemd driver places the sandbox (`crate::host::cgroups`).
    pub systemd_cgroup: bool,
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
            Err(LifecycleError::NotExist { .. }) => Ok(None),
            Err(e) => Err(Box::new(e)),
        }
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read(path).map_err(|source| LifecycleError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| LifecycleError::Parse {
        path: path.to_owned(),
        source,
    })
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
    pub fn new(root: Option<&Path>) -> Result<Self> {
        let dirs = StateDirs::new(paths::state_root(root)?);
        Ok(Self {
            dirs,
            audit_dir: None,
            engine: Box::new(crate::create::engine::Libcontainer),
            procs: Box::new(crate::create::host_procs::RealProcs),
        })
    }

    /// The runtime with another engine (a unit test's recording fake).
    #[cfg(test)]
    pub(crate) fn with_engine(
        root: &Path,
        engine: Box<dyn crate::create::engine::Engine>,
    ) -> Result<Self> {
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

    pub(crate) fn builder(&self, id: &ContainerId) -> Result<ContainerBuilder> {
        self.dirs.ensure()?;
        ContainerBuilder::new(id.as_str().to_owned(), SyscallType::default())
            .with_root_path(self.dirs.containers())
            .map_err(container_err("create"))
    }

    /// Loads libcontainer's view of `id`, with a fresh status.
    ///
    /// libcontainer rewrites `state.json` in place; a command that reads it without the state
    /// lock (see [`crate::state::lock`]) can find it mid-write, empty or cut short, and then
    /// reads it again: a write lasts microseconds.
    pub fn load(&self, id: &ContainerId) -> Result<Container> {
        const TORN_READ_RETRIES: u32 = 200;
        let dir = self.dirs.container(id);
        let mut retries = 0;
        let mut c = loop {
            if !dir.join("state.json").exists() {
                return Err(LifecycleError::NotExist { id: id.clone() });
            }
            match self.engine.load(dir.clone()) {
                Ok(c) => break c,
                Err(libcontainer::error::LibcontainerError::State(
                    libcontainer::container::state::StateError::ParseStateFile { .. },
                )) if retries < TORN_READ_RETRIES => {
                    retries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => return Err(container_err("load state")(e)),
            }
        };
        if retries > 0 {
            tracing::debug!(id = %id, retries, "state.json was being written; read again");
        }
        self.engine
            .refresh(&mut c)
            .map_err(container_err("refresh state"))?;
        Ok(c)
    }

    /// Takes `id`'s state lock: every command that may write libcontainer's `state.json`
    /// holds it (see [`crate::state::lock`]). None for an id without state: the command then
    /// finds no container, and leaves no lock file behind.
    fn state_lock(&self, id: &ContainerId) -> Result<Option<crate::state::lock::StateLock>> {
        if !self.dirs.container(id).exists() {
            return Ok(None);
        }
        Ok(Some(crate::state::lock::acquire(
            &self.dirs.root,
            id,
            crate::state::lock::WAIT_LIMIT,
        )?))
    }

    fn record(&self, id: &ContainerId) -> Result<SandboxRecord> {
        Ok(self.dirs.sandbox(id).record().read()?)
    }

    /// Removes everything `create` set up outside libcontainer. Best effort.
    pub(crate) fn cleanup_sandbox(&self, id: &ContainerId) {
        let sandbox_dir = self.dirs.sandbox(id);
        let proxy = self.procs.stop_proxy(&sandbox_dir, id.as_str());
        self.procs.stop_oom_watch(&sandbox_dir, id.as_str());
        self.procs.stop_supervisor(&sandbox_dir, id.as_str());
        let workspace: Option<mounts::WorkspaceOverlay> =
            self.dirs.sandbox(id).workspace().read().ok();
        if let Err(e) = crate::report::audit::deleted(&self.dirs, id, workspace.as_ref(), proxy) {
            tracing::error!(id = %id, error = %e, "cannot write the closing audit records");
        }
        crate::report::audit::release(&self.dirs, id);
        if let Ok(text) = std::fs::read_to_string(self.dirs.sandbox(id).watchdog_pid())
            && let Ok(pid) = text.trim().parse::<i32>()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Ok(c) = self.load(id) {
            let mut c = c;
            let _ = self.engine.delete(&mut c, true);
        }
        let _ = std::fs::remove_dir_all(self.dirs.container(id));
        // After the container's processes are gone: a profile removed from the kernel
        // would leave a live process unconfined.
        crate::host::apparmor::release(&self.dirs.sandbox(id));
        let record = self.record(id).ok();
        let mount_dir = record
            .as_ref()
            .and_then(|r| r.rootfs_mount.parent().map(Path::to_path_buf))
            .or_else(|| crate::sandbox::mount_dir(&self.dirs, id).ok());
        if let Some(ws) = &workspace {
            // Before the mounts go: an empty change set is dropped, any other is kept.
            crate::report::changes::ended(ws);
        }
        if let Some(mount_dir) = mount_dir {
            detach_all_under(&mount_dir);
            let _ = std::fs::remove_dir_all(&mount_dir);
        }
        if let Some(r) = &record {
            let _ = mounts::detach(&r.rootfs_mount);
            if r.allocated {
                let _ = idmap::release(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id);
            }
        } else if !paths::rootless().unwrap_or(true) {
            let _ = idmap::release(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id);
        }
        let _ = std::fs::remove_dir_all(self.dirs.sandbox(id).path());
    }

    pub fn start(&self, id: &ContainerId) -> Result<()> {
        let lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.status() != ContainerStatus::Created {
            return Err(LifecycleError::WrongState {
                id: id.clone(),
                status: status_name(c.status()),
                wanted: "created",
            });
        }
        let init = c.pid().map(|p| p.as_raw());
        let before = init.and_then(crate::init_exec::executable);
        c.start().map_err(container_err("start"))?;
        drop(lock);
        // As runc's: return once the program runs, so that a signal sent right after `start`
        // reaches it (see `init_exec`).
        if let (Some(pid), Some(before)) = (init, before) {
            let procs = crate::report::layers::reaper_procs(&self.dirs.sandbox(id));
            let outcome =
                crate::init_exec::wait(pid, before, procs.as_deref(), crate::init_exec::WAIT_LIMIT);
            tracing::debug!(id = %id, ?outcome, "start: the init executed the program");
            if let Some(now) = crate::init_exec::uptime() {
                let _ = paths::write_atomic(
                    &self.dirs.sandbox(id).started(),
                    now.to_string().as_bytes(),
                );
            }
        }
        self.arm_wall_clock(id, &c)
    }

    /// Starts the wall-clock watchdog for the policy's `wall_clock` limit: a
    /// detached `agent-sandbox watchdog` that SIGKILLs every process of the
    /// sandbox when the time is up (the limit is not part of the OCI spec).
    fn arm_wall_clock(&self, id: &ContainerId, c: &Container) -> Result<()> {
        let dir = self.dirs.sandbox(id);
        let (policy, _, _) = self.saved_policy(id, c.bundle())?;
        let secs = policy.resources.wall_clock.get();
        if secs == 0 {
            return Ok(());
        }
        use std::os::unix::process::CommandExt;
        // `/proc/self/exe`, not `current_exe()`: `run` starts from the sealed copy, whose
        // name is no path on disk (as `crate::sidecars` explains).
        let child = std::process::Command::new("/proc/self/exe")
            .arg("--root")
            .arg(&self.dirs.root)
            .arg("watchdog")
            .arg("--seconds")
            .arg(secs.to_string())
            .args(c.pid().map(|p| format!("--pid={p}")))
            .arg(id.as_str())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|source| LifecycleError::Write {
                path: PathBuf::from("watchdog"),
                source,
            })?;
        let pid_file = dir.watchdog_pid();
        std::fs::write(&pid_file, child.id().to_string()).map_err(|source| {
            LifecycleError::Write {
                path: pid_file,
                source,
            }
        })?;
        tracing::info!(id = %id, seconds = secs, "wall-clock limit armed");
        Ok(())
    }

    /// The watchdog body: waits, then kills the sandbox if it still runs the
    /// same init (`pid`, from `start`; else read from the state now).
    pub fn watchdog(&self, id: &ContainerId, seconds: u64, pid: Option<i32>) -> Result<()> {
        let pid = match pid {
            Some(p) => Some(nix::unistd::Pid::from_raw(p)),
            None => self.load(id)?.pid(),
        };
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.pid() != pid || c.status() == ContainerStatus::Stopped {
            return Ok(());
        }
        tracing::warn!(id = %id, seconds, "wall-clock limit reached: killing the sandbox");
        crate::report::audit::wall_clock_fired(&self.dirs, id, seconds);
        if let Some(init) = c.pid() {
            tell_init_stderr(
                init.as_raw(),
                &format!(
                    "agent-sandbox: wall-clock limit of {seconds}s reached: killing the sandbox \
                     (see docs/limits.md)\n"
                ),
            );
        }
        c.kill(
            libcontainer::signal::Signal::from(nix::sys::signal::Signal::SIGKILL),
            true,
        )
        .map_err(container_err("kill"))
    }

    /// The effective policy of a created sandbox, as at create: its saved ceiling
    /// narrowed by the annotations of its hardened spec (in `bundle`), with the
    /// layer plan and that spec. Start, exec and the proxy all use this.
    fn saved_policy(
        &self,
        id: &ContainerId,
        bundle: &Path,
    ) -> Result<(SandboxPolicy, LayerPlan, Spec)> {
        let ceiling = crate::sandbox::Ceiling::load_saved(&self.dirs.sandbox(id))?;
        let config = bundle.join("config.json");
        let hardened = Spec::load(&config).map_err(|source| LifecycleError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        let (policy, plan) = crate::sandbox::effective_for_exec(&ceiling, &hardened)?;
        Ok((policy, plan, hardened))
    }

    /// The workspace changes `id` names, for `diff`, `export` and `promote`: those of the
    /// sandbox `id` in this state root while it exists, else a kept change set of any entry
    /// point found by change id, container id, name or unique prefix (`crate::report::changes::find`).
    /// An ended change set with a quota is mounted read-only while the result lives.
    pub fn workspace(&self, id: &ContainerId) -> Result<mounts::WorkspaceOverlay> {
        let dir = self.dirs.sandbox(id);
        let file = dir.workspace();
        if file.path().exists() {
            return Ok(file.read()?);
        }
        let store = crate::report::changes::Store::locate().map_err(LifecycleError::Changes)?;
        match crate::report::changes::find(&store, id.as_str()) {
            Ok(entry) => crate::report::changes::open(&entry).map_err(LifecycleError::Changes),
            Err(crate::report::changes::ChangesError::NotFound { .. }) if dir.exists() => {
                Err(LifecycleError::NoWorkspace { id: id.clone() })
            }
            Err(crate::report::changes::ChangesError::NotFound { .. }) => {
                Err(LifecycleError::NotExist { id: id.clone() })
            }
            Err(e) => Err(LifecycleError::Changes(e)),
        }
    }

    /// The egress proxy body (hidden `proxy` command, spawned by `create`):
    /// serves the sandbox's effective allowlist on its netns until killed.
    pub fn proxy(&self, id: &ContainerId, netns: &Path) -> Result<()> {
        let bundle = self.dirs.sandbox(id).bundle();
        let (policy, _, _) = self.saved_policy(id, &bundle)?;
        let log = crate::report::audit::path(&self.dirs, id).map_err(LifecycleError::Audit)?;
        let sandbox_dir = self.dirs.sandbox(id);
        let netns = || {
            if netns == Path::new(crate::sidecars::egress::NETNS_ON_STDIN) {
                crate::sidecars::egress::netns_from_stdin()
            } else {
                Ok(netns.to_path_buf())
            }
        };
        crate::sidecars::egress::serve(netns, &policy, &log, id.as_str(), &sandbox_dir)
            .map_err(LifecycleError::Egress)
    }

    /// `seccomp-supervise`: the body of the sandbox's denied-syscall supervisor.
    pub fn seccomp_supervise(
        &self,
        id: &ContainerId,
        errno: i32,
        kernel_audit: bool,
    ) -> Result<()> {
        let arch = agent_sandbox_policy::seccomp::Arch::host()
            .ok_or(crate::sandbox::SandboxError::NoArch)?;
        let log = crate::report::audit::path(&self.dirs, id).map_err(LifecycleError::Audit)?;
        crate::sidecars::syscall_audit::supervise(&log, id.as_str(), errno, arch, kernel_audit)
            .map_err(LifecycleError::SyscallAudit)
    }

    /// Turns the executor's seccomp layer into its user-notification form: starts the
    /// sandbox's supervisor when `spawn` (create; returned, its ready line still to be
    /// checked), then connects this process to it.
    pub(crate) fn notify_denials(
        &self,
        id: &ContainerId,
        executor: &mut crate::executor::SandboxExecutor,
        policy: &SandboxPolicy,
        spawn: bool,
    ) -> Result<Option<Box<dyn crate::create::host_procs::StartingSupervisor>>> {
        let Some(bpf) = executor.seccomp.clone() else {
            return Ok(None);
        };
        let sandbox_dir = self.dirs.sandbox(id);
        let errno = policy.syscalls.errno.number();
        let starting = if spawn {
            Some(
                self.procs
                    .start_supervisor(&self.dirs.root, &sandbox_dir, id.as_str(), errno)
                    .map_err(LifecycleError::SyscallAudit)?,
            )
        } else {
            None
        };
        let supervisor = self
            .procs
            .connect_supervisor(&sandbox_dir)
            .map_err(LifecycleError::SyscallAudit)?;
        executor.notify = Some(std::sync::Arc::new(crate::executor::NotifyFilter {
            program: crate::sidecars::syscall_audit::notify_program(&bpf, errno),
            supervisor,
            fs_audit: executor.landlock.is_some()
                && crate::sidecars::fs_audit::FsAuditStatus::load(&sandbox_dir)
                    .is_some_and(|s| s.active),
        }));
        Ok(starting)
    }

    /// `layers`: the protections in force for a sandbox (see [`crate::report::layers`]).
    pub fn layers(&self, id: &ContainerId) -> Result<serde_json::Value> {
        let c = self.load(id)?;
        let pid = c.pid().map(|p| p.as_raw());
        crate::report::layers::report(&self.dirs, id, status_name(c.status()), pid)
            .map_err(LifecycleError::Layers)
    }

    /// `pause` (`freeze = true`) and `resume`.
    pub fn pause(&self, id: &ContainerId, freeze: bool) -> Result<()> {
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        let (op, result) = if freeze {
            ("pause", c.pause())
        } else {
            ("resume", c.resume())
        };
        result.map_err(container_err(op))
    }

    /// `state`: runc's JSON.
    pub fn state(&self, id: &ContainerId) -> Result<serde_json::Value> {
        let c = self.load(id)?;
        let record = self.record(id).ok();
        let status = status_name(c.status());
        let pid = if status == "stopped" {
            0
        } else {
            c.pid().map(|p| p.as_raw()).unwrap_or(0)
        };
        let bundle = record
            .as_ref()
            .map(|r| r.bundle.clone())
            .unwrap_or_else(|| c.bundle().clone());
        let mut annotations = c.state.annotations.clone().unwrap_or_default();
        if let Some(r) = &record {
            annotations.insert("io.agent.sandbox.active-profile".into(), r.profile.clone());
        }
        Ok(serde_json::json!({
            "ociVersion": crate::hooks::OCI_VERSION,
            "id": id.as_str(),
            "pid": pid,
            "status": status,
            "bundle": bundle,
            "rootfs": record.as_ref().map(|r| r.rootfs_mount.clone()),
            "created": c.created().map(|t| t.to_rfc3339()),
            "owner": "",
            "annotations": annotations,
        }))
    }

    pub fn kill(&self, id: &ContainerId, signal: &str, all: bool) -> Result<()> {
        let sig =
            libcontainer::signal::Signal::try_from(signal).map_err(|_| LifecycleError::Signal {
                signal: signal.to_owned(),
            })?;
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.status() == ContainerStatus::Created {
            return self.kill_created(id, c, signal, all);
        }
        if c.status() == ContainerStatus::Stopped {
            if !all {
                return Err(LifecycleError::NotRunning);
            }
            // containerd follows every init exit with `kill --all` (its Delete kills what may
            // be left in the cgroup). Under the systemd driver the scope went with the last
            // process, and libcontainer fails to list a cgroup that is not there: that failure
            // kept containerd from ever handling the exit. No cgroup, nothing left to signal
            // (runc answers the same).
            let cfg = c.spec().map_err(container_err("kill"))?;
            if crate::host::cgroups::is_gone(&cfg.cgroup_path, c.systemd(), id) {
                tracing::debug!(id = %id, "kill --all: the stopped container's cgroup is gone, nothing to signal");
                return Ok(());
            }
        }
        // A process-ending signal right after `start` waits for the program's handler (not
        // needed with the reaper as PID 1: it queues every signal it forwards).
        if let (Some(pid), Some(n)) = (c.pid(), nix_signal(signal))
            && crate::report::layers::reaper_procs(&self.dirs.sandbox(id)).is_none()
            && let Some(started) = std::fs::read_to_string(self.dirs.sandbox(id).started())
                .ok()
                .and_then(|t| t.trim().parse::<f64>().ok())
        {
            crate::init_exec::await_handler(pid.as_raw(), n as i32, started);
        }
        match c.kill(sig, all) {
            // It exited meanwhile (libcontainer looks again): as for a stopped one above.
            Err(libcontainer::error::LibcontainerError::IncorrectStatus(
                ContainerStatus::Stopped,
            )) if !all => Err(LifecycleError::NotRunning),
            r => r.map_err(container_err("kill")),
        }
    }

    /// `kill` of a created container. Its init still waits for `start` inside the runtime's
    /// own code, where, as the pid namespace's init, it ignores every signal it has no
    /// handler for: only SIGKILL and SIGSTOP would reach it. runc's waiting init dies of any
    /// signal whose default action ends a process, so such a signal becomes SIGKILL here
    /// (the program never ran: nothing is lost), and `kill` returns once the init is gone,
    /// `state` then saying `stopped`. Other signals (SIGCHLD, SIGWINCH, ...) go to the init
    /// as they are and leave it `created`.
    fn kill_created(
        &self,
        id: &ContainerId,
        mut c: Container,
        signal: &str,
        all: bool,
    ) -> Result<()> {
        use nix::sys::signal::Signal as S;
        let Some(sig) = nix_signal(signal) else {
            return Err(LifecycleError::Signal {
                signal: signal.to_owned(),
            });
        };
        let pid = c.pid().ok_or(LifecycleError::NotRunning)?;
        if matches!(
            sig,
            S::SIGCHLD
                | S::SIGCONT
                | S::SIGURG
                | S::SIGWINCH
                | S::SIGSTOP
                | S::SIGTSTP
                | S::SIGTTIN
                | S::SIGTTOU
        ) {
            return match nix::sys::signal::kill(pid, sig) {
                Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
                Err(source) => Err(LifecycleError::SignalSend {
                    pid: pid.as_raw(),
                    source,
                }),
            };
        }
        if sig != S::SIGKILL {
            tracing::debug!(id = %id, signal, "created container: the waiting init gets SIGKILL");
        }
        c.kill(libcontainer::signal::Signal::from(S::SIGKILL), all)
            .map_err(container_err("kill"))?;
        // Return once it is gone, so a `state` right after says `stopped` (libcontainer
        // counts a live init as running whatever it saved).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline && alive(pid.as_raw()) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }

    /// `delete`: with `force`, kills first; an unknown id with `force` is fine. `reaped`
    /// (from the shim) is the init's exit, recorded before anything else.
    pub fn delete(&self, id: &ContainerId, force: bool, reaped: Option<ReapedInit>) -> Result<()> {
        let lock = self.state_lock(id)?;
        let result = self.delete_locked(id, force, reaped);
        if let Some(lock) = lock
            && !self.dirs.container(id).exists()
        {
            lock.remove();
        }
        result
    }

    fn delete_locked(
        &self,
        id: &ContainerId,
        force: bool,
        reaped: Option<ReapedInit>,
    ) -> Result<()> {
        match self.load(id) {
            Ok(mut c) => {
                // As with `audit-exit` and the closing records, a record that cannot be
                // written is logged and the delete goes on: the container must still go.
                if let Some(r) = reaped
                    && c.status() == ContainerStatus::Stopped
                    && let Err(e) = crate::report::audit::exited(
                        &self.dirs,
                        id,
                        &crate::report::audit::ExitReport {
                            process: "init".to_owned(),
                            pid: r.pid,
                            status: r.status,
                            reaped_by: None,
                        },
                    )
                {
                    tracing::error!(id = %id, error = %e, "cannot write the init's exit record");
                }
                self.audit_init_exit(id, &c, force);
                if !force
                    && !matches!(
                        c.status(),
                        ContainerStatus::Stopped | ContainerStatus::Created
                    )
                {
                    return Err(LifecycleError::WrongState {
                        id: id.clone(),
                        status: status_name(c.status()),
                        wanted: "stopped",
                    });
                }
                let poststop_state = {
                    let bundle = self
                        .record(id)
                        .map(|r| r.bundle)
                        .unwrap_or_else(|_| c.bundle().clone());
                    let annotations = c.state.annotations.clone().unwrap_or_default();
                    let pid = c.pid().map(|p| p.as_raw());
                    crate::hooks::state(id.as_str(), "stopped", pid, &bundle, &annotations)
                };
                let mut result = self.engine.delete(&mut c, force);
                // Processes SIGKILLed by a forced delete may still be exiting, and
                // a v1 cgroup cannot be removed until they are gone: retry for up
                // to two seconds before reporting the failure.
                let mut tries = 0;
                while result.is_err() && force && tries < 20 {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    result = match self.load(id) {
                        Ok(mut again) => self.engine.delete(&mut again, true),
                        Err(LifecycleError::NotExist { .. }) => Ok(()),
                        Err(_) => continue,
                    };
                }
                if force {
                    // A create killed after it saved the state but before it recorded the
                    // init's pid leaves the intermediate or init process in the container's
                    // cgroups, where libcontainer's delete does not look.
                    self.remove_orphan_cgroups(id);
                }
                if let Err(source) = result {
                    if force {
                        self.cleanup_sandbox(id);
                    }
                    return Err(container_err("delete")(source));
                }
                self.run_poststop(id, &poststop_state);
                self.cleanup_sandbox(id);
                Ok(())
            }
            Err(LifecycleError::NotExist { .. }) => {
                let leftovers = self.dirs.sandbox(id).exists();
                if force {
                    self.remove_orphan_cgroups(id);
                }
                if leftovers {
                    self.cleanup_sandbox(id);
                } else if force && !paths::rootless().unwrap_or(true) {
                    // A create killed between allocating the id block and making the
                    // sandbox directory left only the block behind.
                    let _ = idmap::release(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id);
                }
                if force || leftovers {
                    Ok(())
                } else {
                    Err(LifecycleError::NotExist { id: id.clone() })
                }
            }
            Err(e) => {
                if force {
                    self.remove_orphan_cgroups(id);
                    self.cleanup_sandbox(id);
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// The `poststop` hooks, after the container is gone: a failing one is a warning and
    /// the rest still run (runtime spec, "Lifecycle" step 12; runc exits 0 too).
    fn run_poststop(&self, id: &ContainerId, state: &serde_json::Value) {
        for hook in crate::hooks::saved_poststop(&self.dirs.sandbox(id)) {
            if let Err(e) = crate::hooks::run(&hook, state) {
                tracing::warn!(id = %id, error = %e, "poststop hook failed; delete goes on");
            }
        }
    }

    /// Kills what is left in the container's cgroups and removes them (see
    /// [`crate::host::cgroups::remove_orphans`]); before the sandbox directory, which holds
    /// the v2 placement record, is cleaned up.
    fn remove_orphan_cgroups(&self, id: &ContainerId) {
        let recorded = crate::host::cgroups::Record::load(&self.dirs.sandbox(id));
        crate::host::cgroups::remove_orphans(
            &crate::host::cgroups::RealHost,
            id,
            recorded.as_ref(),
        );
    }

    /// The init's `exit` record at delete, while its cgroup (and OOM counter)
    /// still exists, unless its reaper reported it already: a stopped init was
    /// reaped by the caller (status unknown here); a live one is about to be
    /// SIGKILLed by this forced delete (e.g. containerd cleaning up after a dead shim).
    fn audit_init_exit(&self, id: &ContainerId, c: &Container, force: bool) {
        if let Err(e) = crate::report::audit::limits_at_delete(&self.dirs, id) {
            tracing::error!(id = %id, error = %e, "cannot write the limit records");
        }
        let (status, reaped_by) = match c.status() {
            ContainerStatus::Stopped => (agent_sandbox_audit::ExitStatus::Unknown, "caller"),
            _ if force => (agent_sandbox_audit::ExitStatus::Signal(9), "delete --force"),
            _ => return,
        };
        let pid = c.pid().map(|p| p.as_raw());
        if let Err(e) =
            crate::report::audit::init_exit_at_delete(&self.dirs, id, pid, status, reaped_by)
        {
            tracing::error!(id = %id, error = %e, "cannot write the init's exit record");
        }
    }

    /// `exec`: runs a process in the sandbox, clamped like the init and under
    /// the same seccomp filter and Landlock rules. Returns the exit code when
    /// not detached.
    pub fn exec(&self, id: &ContainerId, opts: &ExecOpts) -> Result<Option<i32>> {
        let c = self.load(id)?;
        if c.status() != ContainerStatus::Running {
            return Err(LifecycleError::NotRunning);
        }
        crate::host::cgroups::warm::start();
        let process: Process = match &opts.process {
            Some(path) => read_json(path)?,
            None => inline_process(&c, opts)?,
        };
        let dir = self.dirs.sandbox(id);
        let (policy, plan, hardened) = self.saved_policy(id, c.bundle())?;
        let mut process = crate::sandbox::harden_exec(process, &policy, &plan)?;
        agent_sandbox_policy::harden::writable_home(&mut process, &policy, &hardened);
        crate::sidecars::egress::inject_env(&mut process, &policy);
        crate::sidecars::tls_trust::inject_env(&mut process, &policy);
        crate::report::audit::exec(&self.dirs, id, &process, &hardened)
            .map_err(LifecycleError::Audit)?;
        let process_for_audit = process.clone();
        enforce::verify_process(&process)?;
        let mut executor = crate::sandbox::executor_for(&policy, &plan)?;
        let requested_file = dir.requested_seccomp();
        let requested: Option<libcontainer::oci_spec::runtime::LinuxSeccomp> =
            if requested_file.path().exists() {
                Some(requested_file.read()?)
            } else {
                None
            };
        executor.requested_seccomp =
            crate::sandbox::requested_seccomp(requested.as_ref(), &policy, &plan)?;
        let init_pid = c
            .pid()
            .map(|p| p.as_raw())
            .ok_or(LifecycleError::NotRunning)?;
        let (process, join) = enforce::tenant_join_userns(process, init_pid)?;
        executor.join_userns = Some(Arc::new(join));
        self.notify_denials(id, &mut executor, &policy, false)?;
        let clamped_file = dir.exec_process(std::process::id());
        clamped_file.write(&process)?;
        let clamped = clamped_file.path().to_owned();
        let tenant = self
            .builder(id)?
            .with_pid_file(opts.pid_file.as_ref())
            .map_err(|source| LifecycleError::Exec {
                source: Box::new(source),
            })?
            .with_console_socket(opts.console_socket.as_ref())
            .with_preserved_fds(opts.preserve_fds)
            .with_executor(executor)
            .as_tenant()
            .with_process(Some(&clamped))
            .with_detach(opts.detach);
        let result = in_root_dir(|| tenant.build());
        let _ = std::fs::remove_file(&clamped);
        let pid = result?.map_err(|source| LifecycleError::Exec {
            source: Box::new(source),
        })?;
        if opts.detach {
            crate::report::audit::tag_exec(
                &self.dirs,
                id,
                pid.as_raw(),
                &process_for_audit,
                &hardened,
            );
            let exec_id = crate::sidecars::exec_exit::exec_id(opts.pid_file.as_deref());
            crate::sidecars::exec_exit::watch(&self.dirs, id, pid.as_raw(), &exec_id);
            return Ok(None);
        }
        let status = wait_exit(pid.as_raw())?;
        crate::report::audit::exited(
            &self.dirs,
            id,
            &crate::report::audit::ExitReport {
                process: "exec".to_owned(),
                pid: Some(pid.as_raw()),
                status,
                reaped_by: None,
            },
        )
        .map_err(LifecycleError::Audit)?;
        Ok(Some(match status {
            agent_sandbox_audit::ExitStatus::Code(c) => c,
            agent_sandbox_audit::ExitStatus::Signal(n) => 128 + n,
            agent_sandbox_audit::ExitStatus::Unknown => 255,
        }))
    }

    /// `ps`: the pids in the container's cgroup.
    pub fn pids(&self, id: &ContainerId) -> Result<Vec<i32>> {
        let c = self.load(id)?;
        let cfg = c.spec().map_err(container_err("ps"))?;
        Ok(crate::host::cgroups::pids(
            &cfg.cgroup_path,
            c.systemd(),
            id,
        )?)
    }

    /// `update --resources`: applies new limits and verifies they took. The
    /// policy stays the ceiling: a limit above it (or none) is refused.
    pub fn update(
        &self,
        id: &ContainerId,
        resources: &libcontainer::oci_spec::runtime::LinuxResources,
    ) -> Result<()> {
        let c = self.load(id)?;
        let ceiling = crate::sandbox::Ceiling::load_saved(&self.dirs.sandbox(id))?;
        let config = c.bundle().join("config.json");
        let mut hardened = Spec::load(&config).map_err(|source| LifecycleError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        let (policy, _) = crate::sandbox::effective_for_exec(&ceiling, &hardened)?;
        crate::host::cgroups::check_update_within(resources, &policy)?;
        let resources = &crate::host::cgroups::update_resources(resources);
        let cfg = c.spec().map_err(container_err("update"))?;
        crate::host::cgroups::apply(&cfg.cgroup_path, c.systemd(), id, resources)?;
        if let Some(linux) = hardened.linux_mut().as_mut() {
            linux.set_resources(Some(resources.clone()));
        }
        let host = crate::host::cgroups::RealHost;
        let hierarchy = crate::host::cgroups::Host::hierarchy(&host)?;
        let driver = if c.systemd() {
            crate::host::cgroups::Driver::Systemd
        } else {
            crate::host::cgroups::Driver::Cgroupfs
        };
        let pid = c
            .pid()
            .map(|p| p.as_raw())
            .ok_or(LifecycleError::NotRunning)?;
        crate::host::cgroups::verify(&host, hierarchy, driver, &hardened, id, pid)?;
        Ok(())
    }

    /// Ids of all containers in this state root.
    pub fn list(&self) -> Vec<String> {
        std::fs::read_dir(self.dirs.containers())
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
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

/// Detaches every mount at or below `dir` (deepest first), from /proc/self/mountinfo.
fn detach_all_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = mounts::detach(&p);
    }
}

/// A signal as `kill` takes it: a number, or a name with or without `SIG`.
fn nix_signal(text: &str) -> Option<nix::sys::signal::Signal> {
    use std::str::FromStr;
    if let Ok(n) = text.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).ok();
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    nix::sys::signal::Signal::from_str(&name).ok()
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X'))
    })
}

fn inline_process(c: &Container, opts: &ExecOpts) -> Result<Process> {
    let config = c.bundle().join("config.json");
    let spec = Spec::load(&config).map_err(|source| LifecycleError::BundleConfig {
        path: config.clone(),
        source,
    })?;
    let mut p = spec.process().clone().unwrap_or_default();
    p.set_args(Some(opts.args.clone()));
    let mut env: HashMap<String, String> = p
        .env()
        .clone()
        .unwrap_or_default()
        .iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    for kv in &opts.env {
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    p.set_env(Some(
        env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
    ));
    if let Some(cwd) = &opts.cwd {
        p.set_cwd(cwd.clone());
    }
    p.set_terminal(Some(opts.tty));
    if let Some((uid, gid)) = opts.user {
        let mut u = libcontainer::oci_spec::runtime::User::default();
        u.set_uid(uid);
        u.set_gid(gid.unwrap_or(0));
        p.set_user(u);
    }
    Ok(p)
}

fn wait_exit(pid: i32) -> Result<agent_sandbox_audit::ExitStatus> {
    use agent_sandbox_audit::ExitStatus;
    use nix::sys::wait::{WaitStatus, waitpid};
    let p = nix::unistd::Pid::from_raw(pid);
    loop {
        match waitpid(p, None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::Code(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(ExitStatus::Signal(sig as i32)),
            Ok(_) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(source) => return Err(LifecycleError::Wait { pid, source }),
        }
    }
}

/// Writes `line` to the stderr of the sandbox's init (host pid `pid`), where podman's
/// conmon and the shim collect the container's output, when that is a pipe or a terminal.
/// Opened without blocking: a FIFO without reader, a socket or a full pipe drop the line.
/// Best effort; the `exit` record names the cause either way.
fn tell_init_stderr(pid: i32, line: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let path = format!("/proc/{pid}/fd/2");
    let pipe_or_tty =
        |m: std::fs::Metadata| m.file_type().is_fifo() || m.file_type().is_char_device();
    // Looked at before the open too: the sandbox's fd may be anything (a file, a socket), and
    // nothing but a pipe or a terminal is opened through the link.
    if !std::fs::metadata(&path).is_ok_and(pipe_or_tty) {
        return;
    }
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&path);
    let Ok(mut f) = opened else {
        return;
    };
    if f.metadata().is_ok_and(pipe_or_tty)
        && let Err(e) = f.write_all(line.as_bytes())
    {
        tracing::debug!(pid, error = %e, "cannot tell the init's stderr about the kill");
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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

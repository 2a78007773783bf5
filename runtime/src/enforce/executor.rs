//! The workload executor: runs inside the container's init (and inside every
//! exec'd process) after libcontainer has pivoted, dropped capabilities and
//! set no_new_privs, and applies the last two layers just before `execve`:
//! Landlock, then the seccomp filter (last, so it need not allow the Landlock
//! syscalls). libcontainer is built without libseccomp, so this is the only
//! place seccomp is applied, for init and exec alike.

use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError, default};
use seccompiler::BpfProgram;

use agent_sandbox_policy::layers::{LayerError, LayerPlan};
use agent_sandbox_policy::seccomp::Arch;
use agent_sandbox_policy::{Layer, SandboxPolicy};

use super::landlock::LandlockRules;
use crate::harden::SandboxError;

/// A filesystem rule set applied with Landlock in the container process.
pub trait LandlockApply: Send + Sync {
    /// Restricts the calling thread; an error aborts the start. With `audit`, the domain
    /// also logs denials after `execve`, and the process makes one connect the ruleset
    /// refuses (the probe that names its domain to the supervisor, see
    /// [`crate::sidecars::fs_audit`]); returns the probe's port then.
    fn apply(&self, audit: bool) -> Result<Option<u16>, String>;
}

/// Applies the sandbox's in-process layers, then execs the workload.
#[derive(Clone, Default)]
pub struct SandboxExecutor {
    pub seccomp: Option<Arc<BpfProgram>>,
    pub landlock: Option<Arc<dyn LandlockApply>>,
    /// For exec'd processes: the container's user namespace to join.
    pub join_userns: Option<Arc<JoinUserns>>,
    /// Audit of denied syscalls: install the filter in its user-notification form and hand
    /// the listener to the supervisor (see [`crate::sidecars::syscall_audit`]) instead of `seccomp`.
    pub notify: Option<Arc<NotifyFilter>>,
    /// The init's `startContainer` hooks, run here (after the pivot, before the layers) with
    /// the caller's bundle in their state (see [`crate::enforce::hooks`]).
    pub start_container: Option<Arc<StartContainerHooks>>,
    /// The config's own seccomp profile, installed after the policy's filter (the kernel
    /// takes the strictest answer; `crate::harden::requested_seccomp`).
    pub requested_seccomp: Vec<Arc<BpfProgram>>,
    /// The init only: fork here, the child executing the program and this process staying
    /// PID 1 as the reaper (`agent_sandbox_sys::reaper`, `crate::enforce::reaper`).
    pub reaper: bool,
    /// The init with the reaper only: the read end of the dead-man pipe whose write end the
    /// sandbox's helper holds; the reaper ends the sandbox when it reads end-of-file
    /// (ARCHITECTURE.md, "One helper per sandbox").
    pub dead_man: Option<Arc<std::os::fd::OwnedFd>>,
}

/// `startContainer` hooks and the state they read.
pub struct StartContainerHooks {
    pub hooks: Vec<libcontainer::oci_spec::runtime::Hook>,
    pub state: serde_json::Value,
}

/// The seccomp filter whose denials go to the supervisor, and the stream to send its
/// listener over (connected by the runtime before forking).
pub struct NotifyFilter {
    pub program: Vec<agent_sandbox_sys::seccomp_notify::Instruction>,
    pub supervisor: std::os::fd::OwnedFd,
    /// The supervisor also records Landlock denials (`fs_denied`) of this sandbox.
    pub fs_audit: bool,
}

/// How long a probed process waits for the supervisor to have seen its Landlock domain
/// (longer than the supervisor's own wait, so its answer normally comes first).
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl NotifyFilter {
    /// Installs the filter, sends its listener to the supervisor and closes this process's
    /// copies, so the workload never holds the listener. After a Landlock probe to `probe`,
    /// waits until the supervisor has seen it (bounded: a supervisor that does not answer
    /// costs this process its `fs_denied` records, which the supervisor notes in the log,
    /// never its start). Any other failure aborts the start.
    fn apply(&self, probe: Option<u16>) -> Result<(), String> {
        use agent_sandbox_sys::seccomp_notify::{self, Handover};
        use std::io::Read;
        use std::os::fd::AsFd;
        let listener = seccomp_notify::install_with_listener(&self.program)
            .map_err(|e| format!("install filter: {e}"))?;
        let what = match probe {
            Some(port) => Handover::Probed { port },
            None => Handover::Listener,
        };
        seccomp_notify::send_fd(self.supervisor.as_fd(), listener.as_fd(), what)
            .map_err(|e| format!("hand the listener to the supervisor: {e}"))?;
        if probe.is_some() {
            let stream = self
                .supervisor
                .try_clone()
                .map(std::os::unix::net::UnixStream::from)
                .map_err(|e| format!("supervisor stream: {e}"))?;
            stream
                .set_read_timeout(Some(PROBE_WAIT))
                .map_err(|e| format!("supervisor stream: {e}"))?;
            let _ = (&stream).read(&mut [0u8; 1]);
        }
        Ok(())
    }
}

/// libcontainer's exec (tenant) path joins every namespace of the container
/// except the user namespace, which would leave an exec'd process as host
/// root (capabilities dropped, but owning every host-root file it can reach).
/// The runtime closes that gap: the tenant keeps only CAP_SYS_ADMIN and
/// CAP_SETGID (host side) until this step, which clears the supplementary
/// groups, joins the container's user namespace (opened by the runtime before
/// forking), switches to the requested in-container ids and drops every
/// capability in every set.
pub struct JoinUserns {
    pub ns: std::os::fd::OwnedFd,
    pub uid: u32,
    pub gid: u32,
    /// The process's `user.additionalGids` (container ids), set inside the namespace as
    /// runc sets them for every exec: the same groups as the init.
    pub additional_gids: Vec<u32>,
}

impl JoinUserns {
    fn join(&self) -> Result<(), String> {
        use nix::sched::{CloneFlags, setns};
        use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};
        setgroups(&[]).map_err(|e| format!("clear supplementary groups: {e}"))?;
        setns(&self.ns, CloneFlags::CLONE_NEWUSER)
            .map_err(|e| format!("join user namespace: {e}"))?;
        if !self.additional_gids.is_empty() {
            // Container ids, mapped through the namespace just joined (its gid map and
            // `setgroups` permission are the init's, which set the same list).
            let groups: Vec<Gid> = self
                .additional_gids
                .iter()
                .map(|g| Gid::from_raw(*g))
                .collect();
            setgroups(&groups)
                .map_err(|e| format!("supplementary groups {:?}: {e}", self.additional_gids))?;
        }
        let (u, g) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        setresgid(g, g, g).map_err(|e| format!("setresgid {}: {e}", self.gid))?;
        setresuid(u, u, u).map_err(|e| format!("setresuid {}: {e}", self.uid))?;
        drop_all_caps()
    }
}

/// Empties the bounding, ambient, inheritable, permitted and effective sets.
fn drop_all_caps() -> Result<(), String> {
    use caps::CapSet;
    for cap in caps::all() {
        // Dropping from the bounding set needs CAP_SETPCAP, held until the end.
        if cap != caps::Capability::CAP_SETPCAP {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| format!("bounding {cap}: {e}"))?;
        }
    }
    caps::drop(None, CapSet::Bounding, caps::Capability::CAP_SETPCAP)
        .map_err(|e| format!("bounding CAP_SETPCAP: {e}"))?;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| format!("clear {set:?}: {e}"))?;
    }
    Ok(())
}

impl Executor for SandboxExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // First, before any layer: the filters need not allow what arming takes.
        if let Some(fd) = self.dead_man.as_deref().filter(|_| self.reaper) {
            agent_sandbox_sys::reaper::arm_dead_man(std::os::fd::AsFd::as_fd(fd))
                .map_err(|e| ExecutorError::Other(format!("dead-man pipe: {e}")))?;
        }
        if let Some(join) = &self.join_userns {
            join.join()
                .map_err(|e| ExecutorError::Other(format!("user namespace: {e}")))?;
        }
        if let Some(start) = &self.start_container {
            for hook in &start.hooks {
                crate::enforce::hooks::run(hook, &start.state)
                    .map_err(|e| ExecutorError::Other(format!("startContainer hook: {e}")))?;
            }
        }
        let fs_audit = self.notify.as_ref().is_some_and(|n| n.fs_audit);
        let mut probe = None;
        if let Some(landlock) = &self.landlock {
            probe = landlock
                .apply(fs_audit)
                .map_err(|e| ExecutorError::Other(format!("landlock layer: {e}")))?;
        }
        if let Some(notify) = &self.notify {
            notify
                .apply(probe)
                .map_err(|e| ExecutorError::Other(format!("seccomp layer: {e}")))?;
            // The listener was dropped in `apply`; the supervisor stream is close-on-exec.
        } else if let Some(bpf) = &self.seccomp {
            seccompiler::apply_filter(bpf)
                .map_err(|e| ExecutorError::Other(format!("seccomp layer: {e}")))?;
        }
        for bpf in &self.requested_seccomp {
            seccompiler::apply_filter(bpf).map_err(|e| {
                ExecutorError::Other(format!("seccomp layer: the config's linux.seccomp: {e}"))
            })?;
        }
        if self.reaper {
            // Last: both processes keep every layer above, and only the child executes.
            let dead_man = self
                .dead_man
                .as_deref()
                .map(std::os::fd::AsRawFd::as_raw_fd);
            agent_sandbox_sys::reaper::fork_program(dead_man)
                .map_err(|e| ExecutorError::Other(format!("reaping init: {e}")))?;
        }
        // Last before execve: the program gets runc's signal state, not the runtime's
        // (Rust ignores SIGPIPE, and an ignored signal stays ignored across execve).
        agent_sandbox_sys::exec_signals::reset_for_exec()
            .map_err(|e| ExecutorError::Other(format!("signal dispositions: {e}")))?;
        default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        default::get_executor().validate(spec)
    }
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

//! Where `create`'s phases meet the host: the creator of the sandbox's own user namespace
//! (phase 2), what the host supports (phase 3's layer plan), the AppArmor profile load, the
//! mount points, the rootfs bind and the workspace overlay (phase 4), the sandbox's sidecars
//! (the denied-syscall supervisor, the egress proxy, podman's OOM watcher), `lo` in the
//! init's network namespace and a pod's namespace pins (phase 5), the cgroup limits written
//! and read back (phase 6), and their undoing at clean-up. They sit behind a trait so that
//! what clean-up does after a failure in each step is unit-tested without root with a
//! recording fake that can fail any step, as [`super::engine`] does for libcontainer and
//! youki's `Syscall` trait does for its syscalls (a sidecar is this executable run again,
//! which a test binary cannot be; a mount needs root). [`RealProcs`] is the code those steps
//! always ran, in the same order: it adds no process, thread or syscall (only a box per
//! sidecar waiting for its ready line).

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;

use agent_sandbox_policy::apparmor::LoadedProfile;
use agent_sandbox_policy::layers::HostSupport;
use agent_sandbox_policy::ucounts::Ucounts;
use libcontainer::oci_spec::runtime::{LinuxResources, Spec};

use crate::enforce::mounts::WorkspaceOverlay;
use crate::enforce::mounts::{self, MountError, OverlayMount, Ownership, SandboxUser};
use crate::host::apparmor::{self, AppArmorError};
use crate::host::cgroups::{self, CgroupsError, Placement};
use crate::host::idmap::IdRange;
use crate::host::userns::{OwnedUserns, UsernsError};
use crate::pod::PodError;
use crate::sidecars::egress::{self, EgressError};
use crate::sidecars::podman_oom::{self, PodmanOomError};
use crate::sidecars::syscall_audit::{self, SyscallAuditError};
use crate::state::{ContainerId, SandboxDir};

/// The host mechanisms a sandbox is made of (mounts, cgroups, AppArmor), its host processes
/// and the host-side steps that tie them to its init.
///
/// A sidecar writes its pid file as soon as it runs (`crate::sidecars::start`), so the `stop_*`
/// steps, which `Runtime::cleanup_sandbox` takes for every sandbox, find each one that started,
/// whatever step failed after it.
pub trait HostProcs: Send + Sync {
    /// Starts the denied-syscall supervisor, its socket listening (`syscall_audit::start`).
    fn start_supervisor(
        &self,
        root: &Path,
        sandbox_dir: &SandboxDir,
        id: &str,
        errno: u32,
        dead_man: Option<OwnedFd>,
    ) -> Result<Box<dyn StartingSupervisor>, SyscallAuditError>;
    /// A stream to the sandbox's supervisor for one executor, of create or exec
    /// (`syscall_audit::connect`).
    fn connect_supervisor(&self, sandbox_dir: &SandboxDir) -> Result<OwnedFd, SyscallAuditError>;
    /// Starts the egress proxy before the init exists (`egress::prespawn`).
    fn prespawn_proxy(
        &self,
        root: &Path,
        sandbox_dir: &SandboxDir,
        id: &str,
    ) -> Result<Box<dyn StartingProxy>, EgressError>;
    /// Brings `lo` up in the network namespace of the init `pid`.
    fn loopback_up(&self, pid: i32) -> Result<(), agent_sandbox_sys::LoopbackError>;
    /// Makes the sandbox's user namespace, owned by its host root id, with the policy's
    /// per-user caps in it, pinned at `pin` (`crate::host::userns::create`).
    fn own_userns(
        &self,
        ids: &IdRange,
        caps: &Ucounts,
        pin: &Path,
    ) -> Result<OwnedUserns, UsernsError>;
    /// Pins a pod sandbox's namespaces for its members (`crate::pod::pin_sandbox`).
    fn pin_pod(&self, sandbox_dir: &SandboxDir, mount_dir: &Path, pid: i32)
    -> Result<(), PodError>;
    /// Starts podman's OOM watcher and waits until its watch is registered
    /// (`podman_oom::start`); returns its pid.
    fn watch_oom(
        &self,
        sandbox_dir: &SandboxDir,
        watch: &OomWatch<'_>,
    ) -> Result<u32, PodmanOomError>;
    /// Kills the sandbox's supervisor if its pid file names it; whether it had died.
    fn stop_supervisor(&self, sandbox_dir: &SandboxDir, id: &str) -> crate::sidecars::Stopped;
    /// Kills the sandbox's proxy if its pid file names it.
    fn stop_proxy(&self, sandbox_dir: &SandboxDir, id: &str) -> egress::Stopped;
    /// Kills podman's OOM watcher if its pid file names it.
    fn stop_oom_watch(&self, sandbox_dir: &SandboxDir, id: &str);
    /// What the host supports, for the layer plan (`crate::harden::host_support`).
    fn support(&self) -> HostSupport;
    /// Loads the sandbox's AppArmor profile unless the kernel has it, and records the
    /// sandbox as its user (`apparmor::acquire`).
    fn load_apparmor(
        &self,
        sandbox_dir: &SandboxDir,
        profile: &LoadedProfile,
    ) -> Result<(), AppArmorError>;
    /// Drops the sandbox's use of its profile, unloading it when no sandbox uses it
    /// (`apparmor::release`). Best effort.
    fn release_apparmor(&self, sandbox_dir: &SandboxDir);
    /// Makes the spec's mount points in the image rootfs (`mounts::ensure_mount_points`).
    fn make_mount_points(&self, rootfs: &Path, spec: &Spec) -> Result<(), MountError>;
    /// Starts placing HOME's guards in the created container of `pid`
    /// (`crate::enforce::home_guards::start`); they are in place once the result's `wait`
    /// says so.
    fn start_home_guards(
        &self,
        pid: i32,
        guards: &[libcontainer::oci_spec::runtime::Mount],
    ) -> Result<Box<dyn PlacingGuards>, MountError>;
    /// Binds the image rootfs read-only at the sandbox's rootfs mount.
    fn bind_rootfs(&self, rootfs: &Path, at: &Path) -> Result<(), MountError>;
    /// Mounts the workspace overlay (`mounts::mount_overlay`).
    fn mount_overlay(
        &self,
        overlay: &OverlayMount,
        user: Option<SandboxUser>,
    ) -> Result<(WorkspaceOverlay, Ownership), MountError>;
    /// Saves where the sandbox's cgroup is placed (`cgroups::Record::save`).
    fn save_cgroups(
        &self,
        placement: &Placement,
        spec: &Spec,
        sandbox_dir: &SandboxDir,
    ) -> Result<(), CgroupsError>;
    /// Writes the limits the runtime writes itself, not libcontainer (rootless on v1,
    /// `cgroups::apply_v1_limits`).
    fn write_limits(
        &self,
        spec: &Spec,
        id: &ContainerId,
        resources: &LinuxResources,
    ) -> Result<(), CgroupsError>;
    /// Reads back the limits in force for the init `pid` and checks them against `spec`'s
    /// (`cgroups::verify`).
    fn verify_limits(
        &self,
        placement: &Placement,
        spec: &Spec,
        id: &ContainerId,
        pid: i32,
    ) -> Result<(), CgroupsError>;
    /// Detaches every mount at or below `dir`, deepest first. Best effort.
    fn detach_all_under(&self, dir: &Path);
    /// Detaches the mount at `path`. Best effort.
    fn detach(&self, path: &Path);
}

/// What podman's OOM watcher is started with (`podman_oom::start`'s arguments).
pub struct OomWatch<'a> {
    pub root: &'a Path,
    /// The caller's bundle, absolute.
    pub bundle: &'a Path,
    /// The init's memory cgroup.
    pub cgroup: &'a Path,
    pub id: &'a str,
    /// The runtime's own `--log`/`--log-format` arguments.
    pub log: &'a [OsString],
}

/// A supervisor started by [`HostProcs::start_supervisor`], its ready line not read yet.
pub trait StartingSupervisor {
    /// Tells the supervisor the sandbox's init (`pid`), whose exit ends it, and waits for its
    /// ready line; returns its pid.
    fn ready(self: Box<Self>, init: i32) -> Result<u32, SyscallAuditError>;
}

/// A proxy started by [`HostProcs::prespawn_proxy`], not yet bound in the sandbox.
pub trait StartingProxy {
    /// Hands the proxy the network namespace of the init `pid` and waits until it listens
    /// there; returns the proxy's pid.
    fn finish(self: Box<Self>, id: &str, pid: i32) -> Result<u32, EgressError>;
}

/// HOME's guards being placed by [`HostProcs::start_home_guards`]. Dropped without
/// [`wait`](PlacingGuards::wait), the placing stops and nothing of it is left running.
pub trait PlacingGuards {
    /// Waits until every guard is in place, or for the failure that stopped them.
    fn wait(self: Box<Self>) -> Result<(), MountError>;
}

/// The host's processes: the sidecars are this executable run again.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealProcs;

impl HostProcs for RealProcs {
    fn start_supervisor(
        &self,
        root: &Path,
        sandbox_dir: &SandboxDir,
        id: &str,
        errno: u32,
        dead_man: Option<OwnedFd>,
    ) -> Result<Box<dyn StartingSupervisor>, SyscallAuditError> {
        syscall_audit::start(root, sandbox_dir, id, errno, dead_man)
            .map(|s| Box::new(s) as Box<dyn StartingSupervisor>)
    }

    fn connect_supervisor(&self, sandbox_dir: &SandboxDir) -> Result<OwnedFd, SyscallAuditError> {
        syscall_audit::connect(sandbox_dir)
    }

    fn prespawn_proxy(
        &self,
        root: &Path,
        sandbox_dir: &SandboxDir,
        id: &str,
    ) -> Result<Box<dyn StartingProxy>, EgressError> {
        egress::prespawn(root, sandbox_dir, id).map(|p| Box::new(p) as Box<dyn StartingProxy>)
    }

    fn loopback_up(&self, pid: i32) -> Result<(), agent_sandbox_sys::LoopbackError> {
        agent_sandbox_sys::bring_loopback_up_in(pid)
    }

    fn own_userns(
        &self,
        ids: &IdRange,
        caps: &Ucounts,
        pin: &Path,
    ) -> Result<OwnedUserns, UsernsError> {
        crate::host::userns::create(ids, caps, pin)
    }

    fn pin_pod(
        &self,
        sandbox_dir: &SandboxDir,
        mount_dir: &Path,
        pid: i32,
    ) -> Result<(), PodError> {
        crate::pod::pin_sandbox(sandbox_dir, mount_dir, pid).map(drop)
    }

    fn watch_oom(&self, sandbox_dir: &SandboxDir, w: &OomWatch<'_>) -> Result<u32, PodmanOomError> {
        podman_oom::start(sandbox_dir, w.root, w.bundle, w.cgroup, w.id, w.log)
    }

    fn stop_supervisor(&self, sandbox_dir: &SandboxDir, id: &str) -> crate::sidecars::Stopped {
        syscall_audit::stop(sandbox_dir, id)
    }

    fn stop_proxy(&self, sandbox_dir: &SandboxDir, id: &str) -> egress::Stopped {
        egress::stop(sandbox_dir, id)
    }

    fn stop_oom_watch(&self, sandbox_dir: &SandboxDir, id: &str) {
        podman_oom::stop(sandbox_dir, id);
    }

    fn support(&self) -> HostSupport {
        crate::harden::host_support()
    }

    fn load_apparmor(
        &self,
        sandbox_dir: &SandboxDir,
        profile: &LoadedProfile,
    ) -> Result<(), AppArmorError> {
        apparmor::acquire(sandbox_dir, profile)
    }

    fn release_apparmor(&self, sandbox_dir: &SandboxDir) {
        apparmor::release(sandbox_dir);
    }

    fn make_mount_points(&self, rootfs: &Path, spec: &Spec) -> Result<(), MountError> {
        mounts::ensure_mount_points(rootfs, spec)
    }

    fn start_home_guards(
        &self,
        pid: i32,
        guards: &[libcontainer::oci_spec::runtime::Mount],
    ) -> Result<Box<dyn PlacingGuards>, MountError> {
        crate::enforce::home_guards::start(pid, guards)
            .map(|p| Box::new(p) as Box<dyn PlacingGuards>)
    }

    fn bind_rootfs(&self, rootfs: &Path, at: &Path) -> Result<(), MountError> {
        mounts::bind_readonly(rootfs, at)
    }

    fn mount_overlay(
        &self,
        overlay: &OverlayMount,
        user: Option<SandboxUser>,
    ) -> Result<(WorkspaceOverlay, Ownership), MountError> {
        mounts::mount_overlay(overlay, user)
    }

    fn save_cgroups(
        &self,
        placement: &Placement,
        spec: &Spec,
        sandbox_dir: &SandboxDir,
    ) -> Result<(), CgroupsError> {
        cgroups::Record::save(placement, spec, sandbox_dir)
    }

    fn write_limits(
        &self,
        spec: &Spec,
        id: &ContainerId,
        resources: &LinuxResources,
    ) -> Result<(), CgroupsError> {
        cgroups::apply_v1_limits(&cgroups::RealHost, spec, id, resources)
    }

    fn verify_limits(
        &self,
        placement: &Placement,
        spec: &Spec,
        id: &ContainerId,
        pid: i32,
    ) -> Result<(), CgroupsError> {
        cgroups::verify(
            &cgroups::RealHost,
            placement.hierarchy,
            placement.driver,
            spec,
            id,
            pid,
        )
    }

    fn detach_all_under(&self, dir: &Path) {
        mounts::detach_all_under(dir);
    }

    fn detach(&self, path: &Path) {
        let _ = mounts::detach(path);
    }
}

impl StartingSupervisor for syscall_audit::Starting {
    fn ready(self: Box<Self>, init: i32) -> Result<u32, SyscallAuditError> {
        syscall_audit::Starting::ready(*self, init)
    }
}

impl PlacingGuards for agent_sandbox_sys::guard_mounts::Placing {
    fn wait(self: Box<Self>) -> Result<(), MountError> {
        agent_sandbox_sys::guard_mounts::Placing::wait(*self).map_err(MountError::HomeGuards)
    }
}

impl StartingProxy for egress::PendingProxy {
    fn finish(self: Box<Self>, id: &str, pid: i32) -> Result<u32, EgressError> {
        egress::PendingProxy::finish(*self, id, pid)
    }
}

/// A recording fake for unit tests: every step is logged in order, any one step fails on
/// demand, and the sidecars "running" are tracked as the real ones' pid files would be.
#[cfg(test)]
pub mod fake {
    use std::collections::BTreeSet;
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use agent_sandbox_policy::apparmor::LoadedProfile;
    use agent_sandbox_policy::layers::{AppArmorHost, HostSupport};
    use libcontainer::oci_spec::runtime::{LinuxResources, Spec};

    use super::{OomWatch, PlacingGuards, StartingProxy, StartingSupervisor};
    use crate::enforce::mounts::WorkspaceOverlay;
    use crate::enforce::mounts::{MountError, OverlayMount, Ownership, SandboxUser};
    use crate::host::apparmor::AppArmorError;
    use crate::host::cgroups::{CgroupsError, Placement};
    use crate::pod::PodError;
    use crate::sidecars::egress::{self, EgressError};
    use crate::sidecars::podman_oom::PodmanOomError;
    use crate::sidecars::syscall_audit::SyscallAuditError;
    use crate::state::ContainerId;
    use crate::state::SandboxDir;

    /// One step the runtime took.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Step {
        StartSupervisor,
        ConnectSupervisor,
        SupervisorReady,
        PrespawnProxy,
        FinishProxy,
        LoopbackUp,
        OwnUserns,
        PinPod,
        WatchOom,
        StopSupervisor,
        StopProxy,
        StopOomWatch,
        LoadApparmor,
        ReleaseApparmor,
        MountPoints,
        HomeGuards,
        HomeGuardsPlaced,
        BindRootfs,
        MountOverlay,
        SaveCgroups,
        WriteLimits,
        VerifyLimits,
        DetachAllUnder,
        DetachRootfs,
    }

    /// A host process of the sandbox.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Sidecar {
        Supervisor,
        Proxy,
        OomWatch,
        /// The child placing HOME's guards (`guard_mounts::Placing`).
        GuardsChild,
    }

    #[derive(Default)]
    struct Log {
        steps: Vec<Step>,
        /// Steps that fail the first time they are taken.
        failing: Vec<Step>,
        running: BTreeSet<Sidecar>,
        /// The user namespace the runtime asked for.
        userns: Option<crate::host::userns::OwnedUserns>,
        /// The mounts made and not detached.
        mounted: BTreeSet<PathBuf>,
        /// Whether the sandbox holds its AppArmor profile (loaded and not released).
        apparmor: bool,
    }

    /// Shared with the test that reads the steps afterwards (clones share one log).
    ///
    /// As the real sidecars do: a start that fails started nothing (its process did not
    /// spawn); a supervisor whose ready line, or a proxy whose bind, fails is still running
    /// (its pid file was written at spawn); an OOM watcher whose watch fails may be running.
    #[derive(Clone, Default)]
    pub struct FakeProcs(Arc<Mutex<Log>>);

    impl FakeProcs {
        /// `step` fails (the first time it is taken).
        pub fn fail(&self, step: Step) {
            self.0.lock().unwrap().failing.push(step);
        }

        /// The sandbox's own user namespace as requested (`own_userns`).
        pub fn userns(&self) -> Option<crate::host::userns::OwnedUserns> {
            self.0.lock().unwrap().userns.clone()
        }

        pub fn steps(&self) -> Vec<Step> {
            self.0.lock().unwrap().steps.clone()
        }

        /// The sidecars started and not stopped.
        pub fn running(&self) -> Vec<Sidecar> {
            self.0.lock().unwrap().running.iter().copied().collect()
        }

        /// The mounts made and not detached.
        pub fn mounted(&self) -> Vec<PathBuf> {
            self.0.lock().unwrap().mounted.iter().cloned().collect()
        }

        /// Whether the sandbox holds its AppArmor profile.
        pub fn holds_apparmor(&self) -> bool {
            self.0.lock().unwrap().apparmor
        }

        fn set_mounted(&self, path: &Path) {
            self.0.lock().unwrap().mounted.insert(path.to_owned());
        }

        /// Logs `step`; whether it fails.
        fn take(&self, step: Step) -> bool {
            let mut log = self.0.lock().unwrap();
            log.steps.push(step);
            let Some(at) = log.failing.iter().position(|s| *s == step) else {
                return false;
            };
            log.failing.remove(at);
            true
        }

        fn set_running(&self, sidecar: Sidecar, running: bool) {
            let mut log = self.0.lock().unwrap();
            if running {
                log.running.insert(sidecar);
            } else {
                log.running.remove(&sidecar);
            }
        }

        fn is_running(&self, sidecar: Sidecar) -> bool {
            self.0.lock().unwrap().running.contains(&sidecar)
        }
    }

    fn io_error(step: Step) -> std::io::Error {
        std::io::Error::other(format!("the fake fails {step:?}"))
    }

    struct Supervisor(FakeProcs);

    impl StartingSupervisor for Supervisor {
        fn ready(self: Box<Self>, _init: i32) -> Result<u32, SyscallAuditError> {
            if self.0.take(Step::SupervisorReady) {
                return Err(SyscallAuditError::NotReady {
                    reason: "it exited (the fake)".to_owned(),
                });
            }
            Ok(2)
        }
    }

    struct Guards(FakeProcs, PathBuf);

    impl PlacingGuards for Guards {
        fn wait(self: Box<Self>) -> Result<(), MountError> {
            self.0.set_running(Sidecar::GuardsChild, false);
            if self.0.take(Step::HomeGuardsPlaced) {
                return Err(MountError::HomeGuards(
                    agent_sandbox_sys::guard_mounts::GuardMountError::Place {
                        stage: "mount",
                        path: self.1.clone(),
                        source: io_error(Step::HomeGuardsPlaced),
                    },
                ));
            }
            Ok(())
        }
    }

    impl Drop for Guards {
        fn drop(&mut self) {
            self.0.set_running(Sidecar::GuardsChild, false);
        }
    }

    struct Proxy(FakeProcs);

    impl StartingProxy for Proxy {
        fn finish(self: Box<Self>, _id: &str, _pid: i32) -> Result<u32, EgressError> {
            if self.0.take(Step::FinishProxy) {
                return Err(EgressError::NotReady {
                    reason: "cannot bind (the fake)".to_owned(),
                });
            }
            Ok(3)
        }
    }

    impl super::HostProcs for FakeProcs {
        fn start_supervisor(
            &self,
            _root: &Path,
            _sandbox_dir: &SandboxDir,
            _id: &str,
            _errno: u32,
            _dead_man: Option<OwnedFd>,
        ) -> Result<Box<dyn StartingSupervisor>, SyscallAuditError> {
            if self.take(Step::StartSupervisor) {
                return Err(SyscallAuditError::Spawn(io_error(Step::StartSupervisor)));
            }
            self.set_running(Sidecar::Supervisor, true);
            Ok(Box::new(Supervisor(self.clone())))
        }

        fn connect_supervisor(
            &self,
            sandbox_dir: &SandboxDir,
        ) -> Result<OwnedFd, SyscallAuditError> {
            if self.take(Step::ConnectSupervisor) {
                return Err(SyscallAuditError::Connect {
                    path: sandbox_dir.seccomp_socket(),
                    source: io_error(Step::ConnectSupervisor),
                });
            }
            let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            Ok(ours.into())
        }

        fn prespawn_proxy(
            &self,
            _root: &Path,
            _sandbox_dir: &SandboxDir,
            _id: &str,
        ) -> Result<Box<dyn StartingProxy>, EgressError> {
            if self.take(Step::PrespawnProxy) {
                return Err(EgressError::Spawn(io_error(Step::PrespawnProxy)));
            }
            self.set_running(Sidecar::Proxy, true);
            Ok(Box::new(Proxy(self.clone())))
        }

        fn loopback_up(&self, pid: i32) -> Result<(), agent_sandbox_sys::LoopbackError> {
            if self.take(Step::LoopbackUp) {
                return Err(agent_sandbox_sys::LoopbackError::OpenNs {
                    path: format!("/proc/{pid}/ns/net").into(),
                    source: io_error(Step::LoopbackUp),
                });
            }
            Ok(())
        }

        /// Records the request (owner, caps, pin) as the real one would make it; makes no
        /// namespace (the fake engine joins none).
        fn own_userns(
            &self,
            ids: &crate::host::idmap::IdRange,
            caps: &agent_sandbox_policy::ucounts::Ucounts,
            pin: &Path,
        ) -> Result<crate::host::userns::OwnedUserns, crate::host::userns::UsernsError> {
            if self.take(Step::OwnUserns) {
                return Err(crate::host::userns::UsernsError::Create {
                    owner: ids.host_start,
                    source: agent_sandbox_sys::owned_userns::OwnedUsernsError::Vanished,
                });
            }
            self.0.lock().unwrap().userns = Some(crate::host::userns::OwnedUserns {
                pin: pin.to_owned(),
                owner: ids.host_start,
                caps: caps
                    .caps()
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), *v))
                    .collect(),
                absent: Vec::new(),
            });
            Ok(self.0.lock().unwrap().userns.clone().unwrap())
        }

        fn pin_pod(
            &self,
            _sandbox_dir: &SandboxDir,
            mount_dir: &Path,
            pid: i32,
        ) -> Result<(), PodError> {
            if self.take(Step::PinPod) {
                let path = mount_dir.join("ns").join("net");
                return Err(PodError::Pin {
                    kind: "network",
                    path: path.clone(),
                    source: crate::enforce::mounts::MountError::Bind {
                        src: format!("/proc/{pid}/ns/net").into(),
                        dst: path,
                        source: nix::Error::EPERM,
                    },
                });
            }
            Ok(())
        }

        fn watch_oom(
            &self,
            _sandbox_dir: &SandboxDir,
            _watch: &OomWatch<'_>,
        ) -> Result<u32, PodmanOomError> {
            self.set_running(Sidecar::OomWatch, true);
            if self.take(Step::WatchOom) {
                return Err(PodmanOomError::Spawn {
                    reason: "no watch (the fake)".to_owned(),
                });
            }
            Ok(4)
        }

        fn stop_supervisor(
            &self,
            _sandbox_dir: &SandboxDir,
            _id: &str,
        ) -> crate::sidecars::Stopped {
            self.take(Step::StopSupervisor);
            let was = self.is_running(Sidecar::Supervisor);
            self.set_running(Sidecar::Supervisor, false);
            if was {
                crate::sidecars::Stopped::Killed
            } else {
                crate::sidecars::Stopped::NoPidFile
            }
        }

        fn stop_proxy(&self, _sandbox_dir: &SandboxDir, _id: &str) -> egress::Stopped {
            self.take(Step::StopProxy);
            let was = self.is_running(Sidecar::Proxy);
            self.set_running(Sidecar::Proxy, false);
            if was {
                egress::Stopped::Killed
            } else {
                egress::Stopped::NoProxy
            }
        }

        fn stop_oom_watch(&self, _sandbox_dir: &SandboxDir, _id: &str) {
            self.take(Step::StopOomWatch);
            self.set_running(Sidecar::OomWatch, false);
        }

        /// A host where every layer can be applied: AppArmor loads profiles (so create
        /// takes that step here too), cgroups are there, Landlock at this kernel's ABI.
        fn support(&self) -> HostSupport {
            HostSupport {
                seccomp: true,
                landlock_abi: agent_sandbox_sys::landlock_abi().unwrap_or(0),
                apparmor: AppArmorHost::Usable,
                cgroups: true,
            }
        }

        fn load_apparmor(
            &self,
            _sandbox_dir: &SandboxDir,
            profile: &LoadedProfile,
        ) -> Result<(), AppArmorError> {
            // As the real one, the sandbox is recorded as a user before the load.
            self.0.lock().unwrap().apparmor = true;
            if self.take(Step::LoadApparmor) {
                return Err(AppArmorError::NotLoaded {
                    profile: profile.name.clone(),
                });
            }
            Ok(())
        }

        fn release_apparmor(&self, _sandbox_dir: &SandboxDir) {
            self.take(Step::ReleaseApparmor);
            self.0.lock().unwrap().apparmor = false;
        }

        fn make_mount_points(&self, rootfs: &Path, _spec: &Spec) -> Result<(), MountError> {
            if self.take(Step::MountPoints) {
                // pathrs makes its errors itself: the one of a rootfs that is not there.
                let gone = rootfs.join("the-fake-removed-it");
                let Err(source) = pathrs::Root::open(&gone) else {
                    unreachable!("{} does not exist", gone.display());
                };
                return Err(MountError::MountPoint {
                    path: rootfs.to_owned(),
                    source,
                });
            }
            Ok(())
        }

        /// The guards go into the container's own mount namespace: nothing to detach.
        /// Their child runs until it is waited for or dropped, as the real one does.
        fn start_home_guards(
            &self,
            _pid: i32,
            guards: &[libcontainer::oci_spec::runtime::Mount],
        ) -> Result<Box<dyn PlacingGuards>, MountError> {
            let dest = guards
                .first()
                .map(|m| m.destination().clone())
                .unwrap_or_default();
            if self.take(Step::HomeGuards) {
                return Err(MountError::GuardOption {
                    dest,
                    option: "the fake's".to_owned(),
                });
            }
            self.set_running(Sidecar::GuardsChild, true);
            Ok(Box::new(Guards(self.clone(), dest)))
        }

        fn bind_rootfs(&self, rootfs: &Path, at: &Path) -> Result<(), MountError> {
            if self.take(Step::BindRootfs) {
                return Err(MountError::Bind {
                    src: rootfs.to_owned(),
                    dst: at.to_owned(),
                    source: nix::Error::EPERM,
                });
            }
            self.set_mounted(at);
            Ok(())
        }

        fn mount_overlay(
            &self,
            overlay: &OverlayMount,
            _user: Option<SandboxUser>,
        ) -> Result<(WorkspaceOverlay, Ownership), MountError> {
            if self.take(Step::MountOverlay) {
                return Err(MountError::Bind {
                    src: overlay.lower.clone(),
                    dst: overlay.merged.clone(),
                    source: nix::Error::EPERM,
                });
            }
            self.set_mounted(&overlay.merged);
            let ws = WorkspaceOverlay {
                lower: overlay.lower.clone(),
                upper: overlay.upper.clone(),
                change: None,
                change_dir: None,
                held: None,
            };
            let reason = "the fake maps nothing".to_owned();
            Ok((ws, Ownership::Unmapped { reason }))
        }

        fn save_cgroups(
            &self,
            _placement: &Placement,
            _spec: &Spec,
            sandbox_dir: &SandboxDir,
        ) -> Result<(), CgroupsError> {
            if self.take(Step::SaveCgroups) {
                let path = sandbox_dir.path().join("cgroup.json");
                let source = io_error(Step::SaveCgroups);
                return Err(crate::files::FileError::write(&path, source).into());
            }
            Ok(())
        }

        fn write_limits(
            &self,
            _spec: &Spec,
            _id: &ContainerId,
            _resources: &LinuxResources,
        ) -> Result<(), CgroupsError> {
            if self.take(Step::WriteLimits) {
                return Err(CgroupsError::Write {
                    path: PathBuf::from("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                    value: "max".to_owned(),
                    source: io_error(Step::WriteLimits),
                });
            }
            Ok(())
        }

        fn verify_limits(
            &self,
            _placement: &Placement,
            _spec: &Spec,
            _id: &ContainerId,
            _pid: i32,
        ) -> Result<(), CgroupsError> {
            if self.take(Step::VerifyLimits) {
                return Err(CgroupsError::NotDelegated {
                    dir: PathBuf::from("/sys/fs/cgroup/the-fake"),
                });
            }
            Ok(())
        }

        fn detach_all_under(&self, dir: &Path) {
            self.take(Step::DetachAllUnder);
            self.0
                .lock()
                .unwrap()
                .mounted
                .retain(|m| !m.starts_with(dir));
        }

        fn detach(&self, path: &Path) {
            self.take(Step::DetachRootfs);
            self.0.lock().unwrap().mounted.remove(path);
        }
    }
}

//! Phase 5: the sandbox's sidecars. The denied-syscall supervisor and the egress proxy start
//! before libcontainer's create (they load meanwhile) and are tied to the init after it.

use super::host_procs::OomWatch;
use super::{CreateError, Hardened, Host, Ids, Marks, Result, Sidecars};
use crate::enforce::executor::SandboxExecutor;
use crate::lifecycle::Runtime;
use crate::state::ContainerId;
use libcontainer::oci_spec::runtime::Spec;
use std::path::Path;

impl Runtime {
    /// Starts the supervisor (and connects `executor` to it) and pre-spawns the egress proxy.
    pub(super) fn spawn_sidecars(
        &self,
        id: &ContainerId,
        ids: &Ids,
        host: &Host,
        hardened: &Hardened,
        executor: &mut SandboxExecutor,
    ) -> Result<Sidecars> {
        let helper = crate::lifecycle::sidecars::helper_holds_wall_clock(
            &hardened.plan.policy,
            &hardened.spec,
            executor.seccomp.is_some(),
        );
        let supervisor = self.notify_denials(id, executor, &hardened.plan.policy, true, helper)?;
        // The proxy starts now and binds once the init's namespace exists.
        let proxy =
            if ids.member.is_none() && crate::sidecars::egress::wanted(&hardened.plan.policy) {
                Some(
                    self.procs()
                        .prespawn_proxy(&self.dirs.root, &host.sandbox_dir, id.as_str())
                        .map_err(CreateError::Egress)?,
                )
            } else {
                None
            };
        Ok(Sidecars { supervisor, proxy })
    }

    /// Brings `lo` up in the init's network namespace, pins a pod's namespaces, hands the
    /// proxy its namespace, and waits for the supervisor's ready line. Returns the proxy's
    /// pid.
    pub(super) fn attach_sidecars(
        &self,
        id: &ContainerId,
        ids: &Ids,
        host: &Host,
        pid: i32,
        sidecars: Sidecars,
        marks: &Marks,
    ) -> Result<Option<u32>> {
        crate::sidecars::trail::track_init(&self.dirs, id, pid);
        // A pod member shares its pod's network namespace: lo and the egress proxy came
        // with the pod's sandbox container, whose namespaces are pinned for the members.
        let mut proxy_pid = None;
        if ids.member.is_none() {
            self.procs()
                .loopback_up(pid)
                .map_err(CreateError::Loopback)?;
            if ids.role == crate::pod::Role::Sandbox {
                self.procs()
                    .pin_pod(&host.sandbox_dir, &host.mount_dir, pid)?;
            }
            if let Some(pending) = sidecars.proxy {
                proxy_pid = Some(
                    pending
                        .finish(id.as_str(), pid)
                        .map_err(CreateError::Egress)?,
                );
            }
        }
        marks.mark("net");
        // A sandbox whose denials nobody answers or records is not handed out.
        if let Some(s) = sidecars.supervisor {
            s.ready(pid).map_err(CreateError::SyscallAudit)?;
        }
        marks.mark("supervisor_ready");
        Ok(proxy_pid)
    }

    /// For podman's containers, before the program runs: the watcher that marks an OOM kill
    /// where podman 4 looks for it (`crate::sidecars::podman_oom`). It never fails the create.
    pub(super) fn watch_oom_for_podman(
        &self,
        id: &ContainerId,
        spec: &Spec,
        bundle: &Path,
        pid: i32,
    ) {
        use crate::sidecars::podman_oom;
        if !podman_oom::wanted(spec) {
            return;
        }
        let Some(cgroup) = crate::sidecars::trail::memory_cgroup_of(pid) else {
            tracing::warn!(id = %id, "no memory cgroup: podman's OOMKilled will stay false");
            return;
        };
        let bundle = std::path::absolute(bundle).unwrap_or_else(|_| bundle.to_path_buf());
        let dir = self.dirs.sandbox(id);
        let watch = OomWatch {
            root: &self.dirs.root,
            bundle: &bundle,
            cgroup: &cgroup,
            id: id.as_str(),
            log: crate::logging::log_args(),
        };
        match self.procs().watch_oom(&dir, &watch) {
            Ok(watcher) => {
                tracing::debug!(id = %id, watcher, cgroup = %cgroup.display(), "OOM watch registered")
            }
            Err(e) => {
                self.procs().stop_oom_watch(&dir, id.as_str());
                tracing::warn!(id = %id, error = %e, "podman's OOMKilled will stay false (docs/limits.md)");
            }
        }
    }
}

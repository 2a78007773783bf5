//! Phase 5: the sandbox's sidecars. The denied-syscall supervisor and the egress proxy start
//! before libcontainer's create (they load meanwhile) and are tied to the init after it.

use super::{Hardened, Host, Ids, Marks, Result, Sidecars};
use crate::executor::SandboxExecutor;
use crate::lifecycle::{LifecycleError, Runtime};
use crate::state::ContainerId;

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
        let supervisor = self.notify_denials(id, executor, &hardened.policy, true)?;
        // The proxy starts now and binds once the init's namespace exists.
        let proxy = if ids.member.is_none() && crate::sidecars::egress::wanted(&hardened.policy) {
            Some(
                crate::sidecars::egress::prespawn(&self.dirs.root, &host.sandbox_dir, id.as_str())
                    .map_err(LifecycleError::Egress)?,
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
        crate::report::audit::track_init(&self.dirs, id, pid);
        // A pod member shares its pod's network namespace: lo and the egress proxy came
        // with the pod's sandbox container, whose namespaces are pinned for the members.
        let mut proxy_pid = None;
        if ids.member.is_none() {
            agent_sandbox_sys::bring_loopback_up_in(pid).map_err(LifecycleError::Loopback)?;
            if ids.role == crate::pod::Role::Sandbox {
                crate::pod::pin_sandbox(&host.sandbox_dir, &host.mount_dir, pid)?;
            }
            if let Some(pending) = sidecars.proxy {
                proxy_pid = Some(
                    pending
                        .finish(id.as_str(), pid)
                        .map_err(LifecycleError::Egress)?,
                );
            }
        }
        marks.mark("net");
        // A sandbox whose denials nobody answers or records is not handed out.
        if let Some(s) = sidecars.supervisor {
            s.ready().map_err(LifecycleError::SyscallAudit)?;
        }
        marks.mark("supervisor_ready");
        Ok(proxy_pid)
    }
}

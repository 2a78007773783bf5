//! `delete`: the container through libcontainer, then everything `create` set up outside
//! it (`cleanup_sandbox`, also what a failed `create` runs).

use std::path::Path;

use libcontainer::container::{Container, ContainerStatus};

use super::{LookupError, ReapedInit, Runtime, status_name};
use crate::enforce::mounts;
use crate::host::idmap;
use crate::state::ContainerId;
use crate::state::paths;

/// Errors of `delete`. The texts are runc's where callers match on them ("container ...
/// does not exist": podman and our shim read it as "already deleted").
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("container {id} is {status}, not stopped")]
    NotStopped {
        id: ContainerId,
        status: &'static str,
    },
    #[error("delete failed")]
    Container(#[source] Box<libcontainer::error::LibcontainerError>),
}

type Result<T> = std::result::Result<T, DeleteError>;

impl Runtime {
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
            Ok(c) => self.delete_loaded(id, c, force, reaped),
            Err(LookupError::NotExist { .. }) => self.delete_leftovers(id, force),
            Err(e) => {
                if force {
                    self.remove_orphan_cgroups(id);
                    self.cleanup_sandbox(id);
                    Ok(())
                } else {
                    Err(e.into())
                }
            }
        }
    }

    /// The delete of a container libcontainer knows: its closing records, its own delete
    /// (retried under `force`), the poststop hooks and the sandbox's clean-up.
    fn delete_loaded(
        &self,
        id: &ContainerId,
        mut c: libcontainer::container::Container,
        force: bool,
        reaped: Option<ReapedInit>,
    ) -> Result<()> {
        // As with `audit-exit` and the closing records, a record that cannot be
        // written is logged and the delete goes on: the container must still go.
        if let Some(r) = reaped
            && c.status() == ContainerStatus::Stopped
            && let Err(e) = crate::sidecars::trail::exited(
                &self.dirs,
                id,
                &crate::sidecars::trail::ExitReport {
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
            return Err(DeleteError::NotStopped {
                id: id.clone(),
                status: status_name(c.status()),
            });
        }
        let poststop_state = {
            let bundle = self
                .record(id)
                .map(|r| r.bundle)
                .unwrap_or_else(|_| c.bundle().clone());
            let annotations = c.state.annotations.clone().unwrap_or_default();
            let pid = c.pid().map(|p| p.as_raw());
            crate::enforce::hooks::state(id.as_str(), "stopped", pid, &bundle, &annotations)
        };
        let result = self.engine_delete(id, &mut c, force);
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
            return Err(DeleteError::Container(Box::new(source)));
        }
        self.run_poststop(id, &poststop_state);
        self.cleanup_sandbox(id);
        Ok(())
    }

    /// libcontainer's delete. Processes SIGKILLed by a forced delete may still be exiting,
    /// and a v1 cgroup cannot be removed until they are gone: under `force` it is retried
    /// for up to two seconds before the failure is reported.
    fn engine_delete(
        &self,
        id: &ContainerId,
        c: &mut libcontainer::container::Container,
        force: bool,
    ) -> std::result::Result<(), libcontainer::error::LibcontainerError> {
        let mut result = self.engine.delete(c, force);
        let mut tries = 0;
        while result.is_err() && force && tries < 20 {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(100));
            result = match self.load(id) {
                Ok(mut again) => self.engine.delete(&mut again, true),
                Err(LookupError::NotExist { .. }) => Ok(()),
                Err(_) => continue,
            };
        }
        result
    }

    /// The delete of an id libcontainer has no state for: what a failed or killed create
    /// left (the sandbox's directory, its cgroups, its id block) goes; with nothing left and
    /// no `force`, the id does not exist.
    fn delete_leftovers(&self, id: &ContainerId, force: bool) -> Result<()> {
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
            Err(LookupError::NotExist { id: id.clone() }.into())
        }
    }

    /// The `poststop` hooks, after the container is gone: a failing one is a warning and
    /// the rest still run (runtime spec, "Lifecycle" step 12; runc exits 0 too).
    fn run_poststop(&self, id: &ContainerId, state: &serde_json::Value) {
        for hook in crate::enforce::hooks::saved_poststop(&self.dirs.sandbox(id)) {
            if let Err(e) = crate::enforce::hooks::run(&hook, state) {
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
        if let Err(e) = crate::sidecars::trail::limits_at_delete(&self.dirs, id) {
            tracing::error!(id = %id, error = %e, "cannot write the limit records");
        }
        let (status, reaped_by) = match c.status() {
            ContainerStatus::Stopped => (agent_sandbox_audit::ExitStatus::Unknown, "caller"),
            _ if force => (agent_sandbox_audit::ExitStatus::Signal(9), "delete --force"),
            _ => return,
        };
        let pid = c.pid().map(|p| p.as_raw());
        if let Err(e) =
            crate::sidecars::trail::init_exit_at_delete(&self.dirs, id, pid, status, reaped_by)
        {
            tracing::error!(id = %id, error = %e, "cannot write the init's exit record");
        }
    }

    /// Removes everything `create` set up outside libcontainer. Best effort.
    pub(crate) fn cleanup_sandbox(&self, id: &ContainerId) {
        let sandbox_dir = self.dirs.sandbox(id);
        let proxy = self.procs.stop_proxy(&sandbox_dir, id.as_str());
        self.procs.stop_oom_watch(&sandbox_dir, id.as_str());
        let helper = self.procs.stop_supervisor(&sandbox_dir, id.as_str());
        let workspace: Option<mounts::WorkspaceOverlay> =
            self.dirs.sandbox(id).workspace().read().ok();
        let died = crate::sidecars::trail::Died {
            proxy: proxy == crate::sidecars::egress::Stopped::WasDead,
            helper: helper == crate::sidecars::Stopped::WasDead,
        };
        if let Err(e) = crate::sidecars::trail::deleted(
            &self.dirs,
            id,
            workspace
                .as_ref()
                .map(|w| (w.upper.as_path(), w.lower.as_path())),
            died,
        ) {
            tracing::error!(id = %id, error = %e, "cannot write the closing audit records");
        }
        crate::sidecars::trail::release(&self.dirs, id);
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
        self.procs.release_apparmor(&self.dirs.sandbox(id));
        let record = self.record(id).ok();
        let mount_dir = record
            .as_ref()
            .and_then(|r| r.rootfs_mount.parent().map(Path::to_path_buf))
            .or_else(|| crate::harden::mount_dir(&self.dirs, id).ok());
        if let Some(ws) = &workspace {
            // Before the mounts go: an empty change set keeps its record only, any other is
            // kept; a sandbox whose create failed (no layers record yet) leaves none.
            let ran = self.dirs.sandbox(id).layers().path().exists();
            crate::report::changes::ended(ws, ran);
        }
        if let Some(mount_dir) = mount_dir {
            self.procs.detach_all_under(&mount_dir);
            let _ = std::fs::remove_dir_all(&mount_dir);
        }
        if let Some(r) = &record {
            self.procs.detach(&r.rootfs_mount);
            if r.allocated {
                let _ = idmap::release(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id);
            }
        } else if !paths::rootless().unwrap_or(true) {
            let _ = idmap::release(&self.dirs.idmap_db(), &self.dirs.idmap_lock(), id);
        }
        let _ = std::fs::remove_dir_all(self.dirs.sandbox(id).path());
    }
}

#[cfg(test)]
mod tests {
    use libcontainer::container::ContainerStatus;
    use libcontainer::oci_spec::runtime::Spec;

    use crate::create::engine::fake::Call;
    use crate::create::fixture::Sandbox;
    use crate::create::host_procs::fake::Step;
    use crate::lifecycle::{DeleteError, ReapedInit};
    use crate::state::ContainerId;

    /// This test process: an init that is read, never signalled (the fake engine kills
    /// nothing, and no delete here is forced).
    fn this_process() -> i32 {
        i32::try_from(std::process::id()).unwrap()
    }

    /// What clean-up takes for a created sandbox: every sidecar's stop, the AppArmor
    /// release, the detach of the mount dir and of the rootfs mount.
    const CLEANUP: [Step; 6] = [
        Step::StopProxy,
        Step::StopOomWatch,
        Step::StopSupervisor,
        Step::ReleaseApparmor,
        Step::DetachAllUnder,
        Step::DetachRootfs,
    ];

    /// The steps the fake host took after `create`.
    fn steps_since_create(s: &Sandbox, created: usize) -> Vec<Step> {
        s.procs.steps()[created..].to_vec()
    }

    /// Whether anything of the sandbox is left in its state root or on the fake host.
    fn remains(s: &Sandbox) -> Vec<String> {
        let dirs = &s.runtime.dirs;
        let mut left = Vec::new();
        for p in [dirs.container(&s.id), dirs.sandbox(&s.id).path().to_owned()] {
            if p.exists() {
                left.push(p.display().to_string());
            }
        }
        left.extend(s.procs.mounted().iter().map(|m| m.display().to_string()));
        left.extend(s.procs.running().iter().map(|r| format!("{r:?}")));
        if s.procs.holds_apparmor() {
            left.push("the AppArmor profile".to_owned());
        }
        left
    }

    #[test]
    fn a_created_sandbox_is_deleted_with_everything_create_set_up() {
        let s = Sandbox::created("del-created", &Spec::default(), this_process());
        assert!(!remains(&s).is_empty(), "create set the sandbox up");
        let created = s.procs.steps().len();
        s.runtime.delete(&s.id, false, None).unwrap();
        assert_eq!(remains(&s), Vec::<String>::new());
        assert_eq!(steps_since_create(&s, created), CLEANUP);
        let id = s.id.as_str().to_owned();
        assert!(
            s.engine
                .calls()
                .contains(&Call::Delete { id, force: false })
        );
        let last = s.audit_events().pop().unwrap();
        assert_eq!(last["kind"], "delete", "{last}");
    }

    /// runc's answer for a running container without `--force`, and nothing goes.
    #[test]
    fn a_running_sandbox_is_not_deleted_without_force() {
        let s = Sandbox::created("del-running", &Spec::default(), this_process());
        s.engine.set_status(s.id.as_str(), ContainerStatus::Running);
        let created = s.procs.steps().len();
        let before = remains(&s);
        let err = s.runtime.delete(&s.id, false, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("container {} is running, not stopped", s.id.as_str())
        );
        assert!(matches!(err, DeleteError::NotStopped { .. }));
        assert_eq!(remains(&s), before, "nothing of the sandbox went");
        assert_eq!(steps_since_create(&s, created), []);
        assert!(
            !s.engine
                .calls()
                .iter()
                .any(|c| matches!(c, Call::Delete { .. }))
        );
    }

    /// The exit the shim reaped is recorded before the sandbox goes.
    #[test]
    fn a_reaped_init_exit_is_recorded_before_the_delete() {
        let s = Sandbox::created("del-reaped", &Spec::default(), this_process());
        s.engine.set_status(s.id.as_str(), ContainerStatus::Stopped);
        let reaped = ReapedInit {
            pid: Some(4242),
            status: agent_sandbox_audit::ExitStatus::Code(3),
        };
        s.runtime.delete(&s.id, false, Some(reaped)).unwrap();
        let exits: Vec<_> = s
            .audit_events()
            .into_iter()
            .filter(|e| e["kind"] == "exit")
            .collect();
        assert_eq!(exits.len(), 1, "{exits:?}");
        let data = &exits[0]["data"];
        assert_eq!(data["process"], "init");
        assert_eq!(data["status"], serde_json::json!({"code": 3}));
        assert_eq!(remains(&s), Vec::<String>::new());
    }

    /// An unknown id: runc's "does not exist" without `--force`, success with it; neither
    /// takes a clean-up step.
    #[test]
    fn an_unknown_id_is_an_error_unless_forced() {
        let s = Sandbox::created("del-known", &Spec::default(), this_process());
        let other = ContainerId::try_from("del-unknown").unwrap();
        let created = s.procs.steps().len();
        let err = s.runtime.delete(&other, false, None).unwrap_err();
        assert_eq!(err.to_string(), "container del-unknown does not exist");
        s.runtime.delete(&other, true, None).unwrap();
        assert_eq!(steps_since_create(&s, created), []);
        assert!(s.runtime.dirs.sandbox(&s.id).exists(), "the other stays");
    }

    /// A sandbox whose libcontainer state is gone (a create killed half-way) still has
    /// its directory: a plain delete cleans it up and succeeds.
    #[test]
    fn leftovers_without_a_container_are_cleaned_up() {
        let s = Sandbox::created("del-leftover", &Spec::default(), this_process());
        std::fs::remove_dir_all(s.runtime.dirs.container(&s.id)).unwrap();
        let created = s.procs.steps().len();
        s.runtime.delete(&s.id, false, None).unwrap();
        assert_eq!(steps_since_create(&s, created), CLEANUP);
        assert_eq!(remains(&s), Vec::<String>::new());
    }
}

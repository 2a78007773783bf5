//! Phase 4: the hardened spec made real on the host, then libcontainer's create.

use std::path::PathBuf;

use libcontainer::oci_spec::runtime::Mount;
use std::sync::Arc;

use super::host_procs::PlacingGuards;
use super::{CreateError, Hardened, Host, Ids, Result};
use crate::enforce::executor::SandboxExecutor;
use crate::lifecycle::{self, CreateOpts, Runtime};
use crate::state::ContainerId;

impl Runtime {
    /// Loads the AppArmor profile the spec names, creates the spec's mount points in the
    /// image, binds the rootfs read-only where the spec points, mounts the workspace overlay,
    /// and writes the bundle libcontainer reads. Returns the bundle directory.
    pub(super) fn install(
        &self,
        id: &ContainerId,
        ids: &Ids,
        host: &Host,
        hardened: &Hardened,
    ) -> Result<PathBuf> {
        let spec = &hardened.spec;
        if hardened
            .plan
            .layers
            .apply
            .contains(&agent_sandbox_policy::Layer::Apparmor)
        {
            // Loaded before libcontainer's init names it in /proc/self/attr/apparmor/exec.
            self.procs()
                .load_apparmor(
                    &host.sandbox_dir,
                    &agent_sandbox_policy::apparmor::loaded_profile(&hardened.plan.policy),
                )
                .map_err(CreateError::AppArmor)?;
        }
        if let Some(m) = &ids.member {
            m.record(&host.sandbox_dir)?;
        }
        host.sandbox_dir.record().write(&host.record)?;
        self.procs().make_mount_points(&host.rootfs_src, spec)?;
        crate::harden::check_writable_destinations(spec, &host.rootfs_src)?;
        self.procs()
            .bind_rootfs(&host.rootfs_src, &host.record.rootfs_mount)?;
        self.procs()
            .save_cgroups(&hardened.cgroups, spec, &host.sandbox_dir)?;
        if let Some(overlay) = &hardened.overlay {
            let user = (!ids.rootless)
                .then(|| lifecycle::sandbox_user(spec, &ids.ids))
                .flatten();
            let (mut ws, ownership) = self.procs().mount_overlay(overlay, user)?;
            let change_set = host.change_set.as_ref();
            ws.change = change_set.map(|c| c.entry.record.change.clone());
            ws.change_dir = change_set.map(|c| c.entry.dir.clone());
            tracing::info!(id = %id, change = ?ws.change, ownership = ?ownership, "workspace overlay mounted");
            host.sandbox_dir.workspace().write(&ws)?;
        }
        let bundle = host.sandbox_dir.bundle();
        std::fs::create_dir_all(&bundle).map_err(|e| crate::files::FileError::write(&bundle, e))?;
        let config = bundle.join("config.json");
        spec.save(&config)
            .map_err(|source| CreateError::BundleConfig {
                path: config.clone(),
                source,
            })?;
        Ok(bundle)
    }

    /// libcontainer's create of the init from `bundle`, which then waits for `start`.
    /// Returns the init's host pid, and HOME's guards for [`Runtime::start_home_guards`].
    ///
    /// Where `split_home_guards` allows, libcontainer creates the container from the spec
    /// without HOME's guards, in `bundle/engine/` (its checked mount path costs about 80
    /// system calls a bind, three quarters of the init's), and the runtime places them
    /// itself right after. The sidecars read `bundle/config.json`, the whole hardened spec,
    /// throughout; `bundle/engine/`'s is replaced by it before anything else reads it there.
    pub(super) fn build(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        hardened: &Hardened,
        host: &Host,
        executor: SandboxExecutor,
        bundle: &std::path::Path,
    ) -> Result<(i32, Vec<Mount>)> {
        let spec = &hardened.spec;
        let Some((engine_spec, guards)) = agent_sandbox_policy::harden::split_home_guards(
            spec,
            &hardened.plan.policy,
            &host.placeholders,
        ) else {
            let pid = self.build_init(id, opts, hardened, executor, bundle)?;
            return Ok((pid, Vec::new()));
        };
        let engine = host.sandbox_dir.engine_bundle();
        let config = engine.join("config.json");
        let write = |s: &libcontainer::oci_spec::runtime::Spec| {
            let bytes =
                serde_json::to_vec(s).map_err(|e| crate::files::FileError::encode(&config, e))?;
            agent_sandbox_sys::atomic_file::write_atomic(&config, bytes)
                .map_err(|e| crate::files::FileError::write(&config, e))
        };
        std::fs::create_dir_all(&engine).map_err(|e| crate::files::FileError::write(&engine, e))?;
        write(&engine_spec)?;
        let pid = self.build_init(id, opts, hardened, executor, &engine)?;
        write(spec)?;
        Ok((pid, guards))
    }

    /// Starts placing HOME's guards that [`Runtime::build`] left to the runtime in the
    /// created container of `pid`; `None` without any. Before `start`: nothing of the
    /// sandbox has run yet, and nothing may before [`Runtime::home_guards_placed`].
    pub(super) fn start_home_guards(
        &self,
        pid: i32,
        guards: &[Mount],
    ) -> Result<Option<Box<dyn PlacingGuards>>> {
        if guards.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.procs().start_home_guards(pid, guards)?))
    }

    /// Waits until every guard [`Runtime::start_home_guards`] started placing is in place.
    pub(super) fn home_guards_placed(&self, placing: Option<Box<dyn PlacingGuards>>) -> Result<()> {
        match placing {
            Some(p) => Ok(p.wait()?),
            None => Ok(()),
        }
    }

    /// libcontainer's create of the init from the spec in `bundle`.
    fn build_init(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        hardened: &Hardened,
        mut executor: SandboxExecutor,
        bundle: &std::path::Path,
    ) -> Result<i32> {
        let spec = &hardened.spec;
        executor.reaper = crate::enforce::reaper::wanted(&hardened.plan.policy, spec);
        if !hardened.start_hooks.is_empty() {
            let annotations = spec.annotations().clone().unwrap_or_default();
            executor.start_container =
                Some(Arc::new(crate::enforce::executor::StartContainerHooks {
                    hooks: hardened.start_hooks.clone(),
                    state: crate::enforce::hooks::state(
                        id.as_str(),
                        "created",
                        None,
                        &opts.bundle,
                        &annotations,
                    ),
                }));
        }
        let init = self
            .builder(id)?
            .with_pid_file(opts.pid_file.as_ref())
            .map_err(lifecycle::container_err("create"))?
            .with_console_socket(opts.console_socket.as_ref())
            .with_preserved_fds(opts.preserve_fds)
            .with_executor(executor)
            .as_init(bundle)
            .with_systemd(hardened.cgroups.systemd())
            .with_detach(true)
            .with_no_pivot(opts.no_pivot);
        let container = lifecycle::in_root_dir(|| self.engine().build_init(init))?
            .map_err(|e| lifecycle::create_err(e, spec))?;
        Ok(container.pid().map(|p| p.as_raw()).unwrap_or(0))
    }
}

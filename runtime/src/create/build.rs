//! Phase 4: the hardened spec made real on the host, then libcontainer's create.

use std::path::PathBuf;
use std::sync::Arc;

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
    /// Returns the init's host pid.
    pub(super) fn build(
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

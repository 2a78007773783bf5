//! Phase 2: the host side a sandbox needs before its spec is hardened.

use libcontainer::oci_spec::runtime::Spec;

use super::{CreateError, Host, Ids, Marks, Result};
use crate::enforce::mounts;
use crate::harden::Ceiling;
use crate::lifecycle::{CreateOpts, Runtime, SandboxRecord};
use crate::state::ContainerId;

impl Runtime {
    /// The sandbox's directories, audit log, record and saved ceiling; the workspace's change
    /// set; bind sources re-bound where the sandbox's unprivileged root can reach them, so
    /// the policy sees reachable paths; the workspace overlay's upper and work dirs.
    pub(super) fn prepare_host(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        spec: &Spec,
        ids: &Ids,
        ceiling: &Ceiling,
        marks: &Marks,
    ) -> Result<Host> {
        let sandbox_dir = self.dirs.sandbox(id);
        let mount_dir = crate::harden::mount_dir(&self.dirs, id)?;
        let rootfs_src = {
            let root = spec.root().as_ref().ok_or(CreateError::NoRoot {
                bundle: opts.bundle.clone(),
            })?;
            let p = root.path();
            if p.is_absolute() {
                p.clone()
            } else {
                opts.bundle.join(p)
            }
        };
        mounts::mkdir_traversable(sandbox_dir.path())?;
        crate::sidecars::trail::init(&self.dirs, id, self.audit_dir.as_deref())
            .map_err(CreateError::Audit)?;
        crate::report::find::remember(&self.dirs, id, spec.annotations().as_ref());
        marks.mark("audit_init");
        let record = SandboxRecord {
            id: id.as_str().to_owned(),
            bundle: opts.bundle.clone(),
            ids: ids.ids,
            allocated: ids.allocated,
            rootfs_mount: mount_dir.join("rootfs"),
            profile: ceiling.origin.clone(),
        };
        sandbox_dir.record().write(&record)?;
        ceiling.save(&sandbox_dir)?;
        mounts::mkdir_traversable(&mount_dir)?;
        let policy = effective_policy(spec, ceiling)?;
        // Before anything runs in the sandbox: a user namespace owned by its own host root
        // id, so that what it holds is never charged to host root (docs/limits.md).
        let userns = if ids.member.is_none() {
            let pin = crate::host::userns::pin_path(&mount_dir);
            let made = self
                .procs()
                .own_userns(&ids.ids, &policy.ucounts, &pin)
                .map_err(CreateError::Userns)?;
            marks.mark("userns");
            Some(made)
        } else {
            None
        };
        let change_set = self.change_set_for(id, opts, spec, &policy, &mount_dir, ids.rootless)?;
        let rebinds = mounts::rebind_sources(spec, &mount_dir)?;
        let placeholders = mounts::placeholders(&mount_dir)?;
        let overlay_base = change_set
            .as_ref()
            .map_or_else(|| mount_dir.join("workspace"), |c| c.base.clone());
        let workspace = crate::harden::overlay_dirs(spec, &policy, &ids.ids, &overlay_base)?;
        Ok(Host {
            sandbox_dir,
            mount_dir,
            rootfs_src,
            record,
            change_set,
            rebinds,
            workspace,
            placeholders,
            userns,
            policy,
        })
    }

    /// The workspace's change set: the one a restore's image names (this id's own reopened,
    /// another sandbox's layer copied into a new one), else a new one.
    fn change_set_for(
        &self,
        id: &ContainerId,
        opts: &CreateOpts,
        spec: &Spec,
        policy: &agent_sandbox_policy::SandboxPolicy,
        mount_dir: &std::path::Path,
        rootless: bool,
    ) -> Result<Option<crate::report::changes::Created>> {
        Ok(match &opts.reuse_change {
            Some(c) if c.from == id.as_str() => {
                self.reopened_change_set(id, spec, policy, mount_dir, c)?
            }
            Some(c) => {
                // The source checked before this sandbox gets a change set of its own.
                let source = agent_sandbox_policy::harden::workspace_source(spec, policy)
                    .map(|workspace| {
                        let store = crate::report::changes::Store::locate()?;
                        crate::report::changes::copy_source(
                            &store,
                            &c.image(),
                            &self.dirs.root,
                            &workspace,
                        )
                    })
                    .transpose()
                    .map_err(CreateError::Changes)?;
                let created = self.new_change_set(id, spec, policy, mount_dir, rootless)?;
                if let (Some(created), Some(source)) = (&created, &source) {
                    crate::report::changes::copy_layer(source, created)
                        .map_err(CreateError::Changes)?;
                    if let Some((from, to)) = c.reown {
                        super::restore::reown_layer(&created.base.join("upper"), from, to)?;
                    }
                }
                created
            }
            None => self.new_change_set(id, spec, policy, mount_dir, rootless)?,
        })
    }

    /// The change set of a new sandbox that has a workspace (`crate::report::changes`), recorded in
    /// `workspace.json` at once so a failed create drops it again.
    fn new_change_set(
        &self,
        id: &ContainerId,
        spec: &Spec,
        policy: &agent_sandbox_policy::SandboxPolicy,
        mount_dir: &std::path::Path,
        rootless: bool,
    ) -> Result<Option<crate::report::changes::Created>> {
        let annotations = spec.annotations().clone().unwrap_or_default();
        let Some(source) = agent_sandbox_policy::harden::workspace_source(spec, policy) else {
            return Ok(None);
        };
        let store = crate::report::changes::Store::locate().map_err(CreateError::Changes)?;
        let created = crate::report::changes::create(
            &store,
            &crate::report::changes::NewChangeSet {
                container: id.as_str(),
                root: &self.dirs.root,
                annotations: &annotations,
                workspace: &source,
                fs: &policy.filesystem,
                mount_point: &mount_dir.join("workspace"),
                rootless,
            },
        )
        .map_err(CreateError::Changes)?;
        self.record_change_set(id, source, &created)?;
        Ok(Some(created))
    }
}

impl Runtime {
    /// `workspace.json` of a sandbox whose workspace `source` gets the change set `created`.
    fn record_change_set(
        &self,
        id: &ContainerId,
        source: std::path::PathBuf,
        created: &crate::report::changes::Created,
    ) -> Result<()> {
        let ws = mounts::WorkspaceOverlay {
            lower: source,
            upper: created.base.join("upper"),
            change: Some(created.entry.record.change.clone()),
            change_dir: Some(created.entry.dir.clone()),
            held: None,
        };
        self.dirs.sandbox(id).workspace().write(&ws)?;
        Ok(())
    }

    /// `restore`: the sandbox's ended change set `change` reopened (its upper layer holds the
    /// agent's unpromoted edits), recorded in `workspace.json` as a new one is; a sandbox
    /// without a workspace gets none.
    fn reopened_change_set(
        &self,
        id: &ContainerId,
        spec: &Spec,
        policy: &agent_sandbox_policy::SandboxPolicy,
        mount_dir: &std::path::Path,
        restored: &crate::lifecycle::RestoredChange,
    ) -> Result<Option<crate::report::changes::Created>> {
        let Some(source) = agent_sandbox_policy::harden::workspace_source(spec, policy) else {
            return Ok(None);
        };
        let store = crate::report::changes::Store::locate().map_err(CreateError::Changes)?;
        let created = crate::report::changes::reopen(
            &store,
            &restored.image(),
            &self.dirs.root,
            &mount_dir.join("workspace"),
        )
        .map_err(CreateError::Changes)?;
        self.record_change_set(id, source, &created)?;
        Ok(Some(created))
    }
}

/// The ceiling narrowed by the spec's annotations: the sandbox's effective policy, derived
/// here once per create (the hardening phase hardens under it, and saves it in `plan.json`).
fn effective_policy(spec: &Spec, ceiling: &Ceiling) -> Result<agent_sandbox_policy::SandboxPolicy> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    agent_sandbox_policy::harden::effective_policy_with(
        &annotations,
        &ceiling.policy,
        ceiling.admin_profile(),
    )
    .map_err(|e| CreateError::Sandbox(crate::harden::SandboxError::Harden(e)))
}

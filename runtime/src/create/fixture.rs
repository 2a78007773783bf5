//! A sandbox made by `create` through the recording fakes, for the unit tests of the
//! commands that come after it (`crate::lifecycle`).

use libcontainer::oci_spec::runtime::Spec;

/// A sandbox `create` made in a temporary state root, with libcontainer and the host
/// replaced by their recording fakes (`crate::create::engine`, `crate::create::host_procs`):
/// every file of the sandbox is real, nothing touches the host's mounts, cgroups or
/// AppArmor, and the fakes show what later commands asked of them.
pub(crate) struct Sandbox {
    _dir: tempfile::TempDir,
    pub runtime: crate::lifecycle::Runtime,
    pub engine: std::sync::Arc<crate::create::engine::fake::FakeEngine>,
    pub procs: crate::create::host_procs::fake::FakeProcs,
    pub id: crate::state::ContainerId,
}

impl Sandbox {
    /// A sandbox created from `spec` whose init is `init` (a process the test owns).
    pub(crate) fn created(name: &str, spec: &Spec, init: i32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id =
            crate::state::ContainerId::try_from(format!("{name}-{}", std::process::id()).as_str())
                .unwrap();
        let state = dir.path().join("state");
        let engine =
            std::sync::Arc::new(crate::create::engine::fake::FakeEngine::default().building(
                crate::state::paths::StateDirs::new(state.clone()).container(&id),
                init,
            ));
        let procs = crate::create::host_procs::fake::FakeProcs::default();
        let runtime = crate::lifecycle::Runtime::with_engine(&state, Box::new(engine.clone()))
            .unwrap()
            .with_procs(Box::new(procs.clone()));
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
        spec.save(bundle.join("config.json")).unwrap();
        let ceiling = crate::harden::Ceiling::load(None).unwrap();
        runtime.create(&id, &create_opts(bundle), &ceiling).unwrap();
        Self {
            _dir: dir,
            runtime,
            engine,
            procs,
            id,
        }
    }

    /// The sandbox's audit log, one event a line.
    pub(crate) fn audit_events(&self) -> Vec<serde_json::Value> {
        let log = self
            .runtime
            .dirs
            .audit()
            .join(format!("{}.jsonl", self.id.as_str()));
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// `create`'s options for `bundle` as a runtime without flags would get them.
pub(crate) fn create_opts(bundle: std::path::PathBuf) -> crate::lifecycle::CreateOpts {
    crate::lifecycle::CreateOpts {
        bundle,
        pid_file: None,
        console_socket: None,
        no_pivot: false,
        preserve_fds: 0,
        systemd_cgroup: false,
        reuse_change: None,
        keep_placeholders: std::collections::BTreeMap::new(),
    }
}

impl Drop for Sandbox {
    /// Whatever a test left of the sandbox goes as after a failed create (through the fakes:
    /// nothing of the host's), then the per-root directory `mount_dir` makes outside the
    /// temporary root, if empty.
    fn drop(&mut self) {
        self.runtime.cleanup_sandbox(&self.id);
        if let Ok(dir) = crate::harden::mount_dir(&self.runtime.dirs, &self.id)
            && let Some(tagged) = dir.parent()
        {
            let _ = std::fs::remove_dir(tagged);
        }
    }
}

//! A create that fails in a phase leaves nothing of the sandbox behind: `create` hands the
//! failure to `Runtime::cleanup_sandbox`, which removes whatever the phases before it set
//! up. Each test makes one phase fail through its input, in a temporary state root, with
//! libcontainer replaced by [`FakeEngine`], whose recorded calls show how far create got.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;

use super::engine::fake::{Call, FakeEngine};
use crate::harden::Ceiling;
use crate::lifecycle::{CreateOpts, LifecycleError, Runtime};
use crate::state::ContainerId;

/// A bundle (its rootfs an empty directory) beside a temporary state root.
struct Fixture {
    dir: tempfile::TempDir,
    runtime: Runtime,
    engine: Arc<FakeEngine>,
    id: ContainerId,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id =
            ContainerId::try_from(format!("cfail-{name}-{}", std::process::id()).as_str()).unwrap();
        let engine = Arc::new(FakeEngine::default());
        let runtime =
            Runtime::with_engine(&dir.path().join("state"), Box::new(engine.clone())).unwrap();
        std::fs::create_dir_all(dir.path().join("bundle").join("rootfs")).unwrap();
        Self {
            dir,
            runtime,
            engine,
            id,
        }
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    fn opts(&self) -> CreateOpts {
        CreateOpts {
            bundle: self.bundle(),
            pid_file: None,
            console_socket: None,
            no_pivot: false,
            preserve_fds: 0,
            systemd_cgroup: false,
        }
    }

    /// `create` of `spec` under the built-in ceiling; its error.
    fn create_failing(&self, spec: &Spec) -> LifecycleError {
        spec.save(self.bundle().join("config.json")).unwrap();
        let ceiling = Ceiling::load(None).unwrap();
        self.runtime
            .create(&self.id, &self.opts(), &ceiling)
            .expect_err("the create should fail")
    }

    /// Everything under the state root (and the sandbox's mount dir) that names the sandbox,
    /// other than its audit log, which outlives it by design.
    fn leftovers(&self) -> Vec<PathBuf> {
        let dirs = &self.runtime.dirs;
        let log = dirs.audit().join(format!("{}.jsonl", self.id.as_str()));
        let mut found = Vec::new();
        walk(&dirs.root, &mut |p| {
            let names_it = p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains(self.id.as_str()));
            if names_it && p != log {
                found.push(p.to_owned());
            }
        });
        for p in [
            dirs.sandbox(&self.id).path().to_owned(),
            dirs.container(&self.id),
            self.mount_dir(),
        ] {
            if p.exists() && !found.contains(&p) {
                found.push(p);
            }
        }
        if let Ok(db) = std::fs::read_to_string(dirs.idmap_db())
            && db.contains(self.id.as_str())
        {
            found.push(dirs.idmap_db());
        }
        found
    }

    fn mount_dir(&self) -> PathBuf {
        crate::harden::mount_dir(&self.runtime.dirs, &self.id).unwrap()
    }

    /// Whether the audit init ran (its directory of live sandboxes exists): the failure came
    /// after `prepare_host` had set up the sandbox's directories.
    fn audit_initialised(&self) -> bool {
        self.runtime.dirs.audit().join(".live").is_dir()
    }
}

impl Drop for Fixture {
    /// The per-root directory `mount_dir` makes outside the temporary root (empty by now).
    fn drop(&mut self) {
        if let Some(tagged) = self.mount_dir().parent() {
            let _ = std::fs::remove_dir(tagged);
        }
    }
}

fn walk(dir: &Path, each: &mut dyn FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        each(&p);
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, each);
        }
    }
}

fn spec_with_annotations(annotations: &[(&str, &str)]) -> Spec {
    let mut spec = Spec::default();
    spec.set_annotations(Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    ));
    spec
}

/// Phase 1 (ids): a Kubernetes app container that names no pod is refused before any id
/// block is taken or any directory made.
#[test]
fn a_failure_assigning_ids_leaves_nothing() {
    let f = Fixture::new("ids");
    let spec = spec_with_annotations(&[(crate::pod::CONTAINER_TYPE_ANNOTATION, "container")]);
    let err = f.create_failing(&spec);
    assert!(matches!(err, LifecycleError::Pod(_)), "{err:?}");
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert!(!f.audit_initialised());
    assert_eq!(f.engine.calls(), []);
}

/// Phase 2 (host): a bundle whose config has no `root`. The ids were allocated already
/// (as root) and are released again.
#[test]
fn a_bundle_without_root_fails_preparing_the_host_and_leaves_nothing() {
    let f = Fixture::new("noroot");
    let mut spec = Spec::default();
    spec.set_root(None);
    let err = f.create_failing(&spec);
    assert!(
        matches!(&err, LifecycleError::NoRoot { bundle } if bundle == &f.bundle()),
        "{err:?}"
    );
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert_eq!(f.engine.calls(), []);
}

/// Phase 2 (host): an annotation with a bad value is found once the sandbox dir, its audit
/// log, record and ceiling and its mount dir exist; all of them go again (the audit log
/// stays, closed, as after any delete).
#[test]
fn an_invalid_policy_annotation_fails_preparing_the_host_and_leaves_nothing() {
    let f = Fixture::new("badann");
    let spec = spec_with_annotations(&[("io.agent.sandbox.memory", "lots")]);
    let err = f.create_failing(&spec);
    assert!(
        matches!(
            &err,
            LifecycleError::Sandbox(crate::harden::SandboxError::Harden(
                agent_sandbox_policy::harden::HardenError::BadAnnotation { annotation, .. }
            )) if annotation == "io.agent.sandbox.memory"
        ),
        "{err:?}"
    );
    assert!(
        f.audit_initialised(),
        "the failure came after the audit init"
    );
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert_eq!(f.engine.calls(), []);
}

/// Phase 2 (host): an annotation asking for more memory than the ceiling grants (4G
/// above the built-in `agent` profile's 2G) is refused.
#[test]
fn a_widening_annotation_fails_preparing_the_host_and_leaves_nothing() {
    let f = Fixture::new("widen");
    let spec = spec_with_annotations(&[("io.agent.sandbox.memory", "4G")]);
    let err = f.create_failing(&spec);
    assert!(
        matches!(
            &err,
            LifecycleError::Sandbox(crate::harden::SandboxError::Harden(
                agent_sandbox_policy::harden::HardenError::AnnotationWidens { annotation, .. }
            )) if annotation == "io.agent.sandbox.memory"
        ),
        "{err:?}"
    );
    assert!(f.audit_initialised());
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert_eq!(f.engine.calls(), []);
}

/// Phase 3 (harden): the policy compiler refuses a spec without a process. Nothing is
/// installed and libcontainer is never asked to build.
#[test]
fn a_hardening_refusal_leaves_nothing_and_builds_nothing() {
    let f = Fixture::new("harden");
    let mut spec = Spec::default();
    spec.set_process(None);
    let err = f.create_failing(&spec);
    assert!(
        matches!(
            &err,
            LifecycleError::Sandbox(crate::harden::SandboxError::Harden(
                agent_sandbox_policy::harden::HardenError::NoProcess
            ))
        ),
        "{err:?}"
    );
    assert!(f.audit_initialised());
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert!(!f.engine.calls().contains(&Call::Build));
    assert_eq!(f.engine.calls(), []);
}

/// Phase 4 (install): the bundle's rootfs directory is missing, found when the spec's mount
/// points are made in it, after the spec was hardened (and, on an AppArmor host, its profile
/// loaded). Everything goes again and libcontainer is never asked to build.
#[test]
fn a_failure_installing_the_spec_leaves_nothing_and_builds_nothing() {
    let f = Fixture::new("install");
    std::fs::remove_dir(f.bundle().join("rootfs")).unwrap();
    let err = f.create_failing(&Spec::default());
    assert!(
        matches!(
            &err,
            LifecycleError::Mount(crate::enforce::mounts::MountError::MountPoint { path, .. })
                if path == &f.bundle().join("rootfs")
        ),
        "{err:?}"
    );
    assert!(f.audit_initialised());
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert_eq!(f.engine.calls(), []);
}

/// Whether `path` is a mount point in this process's mount namespace.
fn mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.to_string_lossy().as_ref()))
}

/// Phase 5 (build): libcontainer's create fails (the fake engine builds nothing) after
/// install made the spec real: the image bound read-only at the sandbox's rootfs mount, the
/// bundle libcontainer reads, the cgroup record. The phases run here in `create`'s order,
/// up to the build, without the sidecars (the supervisor and the proxy are this executable
/// run again, which a test binary cannot be); the failure is then cleaned up as `create`
/// does. The bind needs root in the initial user namespace; elsewhere install refuses it
/// and its clean-up is what is checked.
#[test]
fn a_failure_in_libcontainers_create_is_cleaned_up_after_install() {
    let f = Fixture::new("build");
    let spec = Spec::default();
    spec.save(f.bundle().join("config.json")).unwrap();
    let opts = f.opts();
    let ceiling = Ceiling::load(None).unwrap();
    let rt = &f.runtime;
    let marks = super::Marks(std::time::Instant::now());
    let mut rootfs_mount = None;
    let result: Result<i32, LifecycleError> = (|| {
        let ids = rt.assign_ids(&f.id, &spec)?;
        let ceiling = ids.ceiling(&ceiling);
        let mut host = rt.prepare_host(&f.id, &opts, &spec, &ids, ceiling, &marks)?;
        rootfs_mount = Some(host.record.rootfs_mount.clone());
        let (hardened, executor) =
            rt.harden(&f.id, &opts, spec.clone(), &ids, ceiling, &mut host)?;
        let bundle = rt.install(&f.id, &ids, &host, &hardened)?;
        assert!(
            mounted(&host.record.rootfs_mount),
            "install bound the rootfs"
        );
        assert!(bundle.join("config.json").exists());
        rt.build(&f.id, &opts, &hardened, executor, &bundle)
    })();
    let err = result.expect_err("the fake engine builds nothing");
    let privileged = !crate::state::paths::rootless().unwrap();
    if privileged {
        assert!(
            matches!(err, LifecycleError::Container { op: "create", .. }),
            "{err:?}"
        );
        assert_eq!(f.engine.calls(), [Call::Build]);
    } else {
        assert!(matches!(err, LifecycleError::Mount(_)), "{err:?}");
        assert_eq!(f.engine.calls(), []);
    }
    rt.cleanup_sandbox(&f.id);
    let rootfs_mount = rootfs_mount.expect("prepare_host ran");
    assert!(!mounted(&rootfs_mount), "the rootfs bind is detached");
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    assert_eq!(
        f.engine
            .calls()
            .iter()
            .filter(|c| **c == Call::Build)
            .count(),
        usize::from(privileged),
        "the clean-up builds nothing"
    );
}

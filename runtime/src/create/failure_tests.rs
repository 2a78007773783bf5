//! A create that fails in a phase leaves nothing of the sandbox behind: `create` hands the
//! failure to `Runtime::cleanup_sandbox`, which removes whatever the phases before it set
//! up and stops every sidecar that started. Each test makes one phase fail, through its
//! input or one step of a fake, in a temporary state root, with libcontainer replaced by
//! [`FakeEngine`] and the sandbox's host processes by [`FakeProcs`], whose recorded calls
//! show how far create got.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;

use super::engine::fake::{Call, FakeEngine};
use super::host_procs::fake::{FakeProcs, Sidecar, Step};
use crate::harden::Ceiling;
use crate::lifecycle::{CreateOpts, LifecycleError, Runtime};
use crate::state::ContainerId;
use crate::test_support::spec_with_annotations;

/// A bundle (its rootfs an empty directory) beside a temporary state root.
struct Fixture {
    dir: tempfile::TempDir,
    runtime: Runtime,
    engine: Arc<FakeEngine>,
    procs: FakeProcs,
    id: ContainerId,
}

impl Fixture {
    /// libcontainer's create fails.
    fn new(name: &str) -> Self {
        Self::with_engine(name, |_| FakeEngine::default())
    }

    /// libcontainer's create makes a container whose init is this test process (read, never
    /// signalled: the fake engine's delete kills nothing), so that create goes on to the
    /// sidecars' attach and the record.
    fn building(name: &str) -> Self {
        let init = i32::try_from(std::process::id()).unwrap();
        Self::with_engine(name, |state_dir| {
            FakeEngine::default().building(state_dir, init)
        })
    }

    /// `engine` is made from the container's state directory.
    fn with_engine(name: &str, engine: impl FnOnce(PathBuf) -> FakeEngine) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id =
            ContainerId::try_from(format!("cfail-{name}-{}", std::process::id()).as_str()).unwrap();
        let state = dir.path().join("state");
        let engine = Arc::new(engine(
            crate::state::paths::StateDirs::new(state.clone()).container(&id),
        ));
        let procs = FakeProcs::default();
        let runtime = Runtime::with_engine(&state, Box::new(engine.clone()))
            .unwrap()
            .with_procs(Box::new(procs.clone()));
        std::fs::create_dir_all(dir.path().join("bundle").join("rootfs")).unwrap();
        Self {
            dir,
            runtime,
            engine,
            procs,
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
            reuse_change: None,
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

    /// `create` of `spec`, which fails after install; its error. None where install may not
    /// bind the rootfs (not root in the initial user namespace): there the create fails in
    /// install, before any sidecar starts, and that is what is checked.
    fn create_failing_past_install(&self, spec: &Spec) -> Option<LifecycleError> {
        let err = self.create_failing(spec);
        if crate::state::paths::rootless().unwrap() {
            assert!(matches!(err, LifecycleError::Mount(_)), "{err:?}");
            assert_eq!(self.procs.steps(), CLEANUP);
            assert_eq!(self.leftovers(), Vec::<PathBuf>::new());
            return None;
        }
        Some(err)
    }

    /// Nothing of the sandbox is left, no sidecar is running, and libcontainer was never
    /// asked for anything.
    fn assert_cleaned_up_before_build(&self) {
        assert_eq!(self.procs.running(), []);
        assert_eq!(self.leftovers(), Vec::<PathBuf>::new());
        assert_eq!(self.engine.calls(), []);
    }

    /// Nothing of the sandbox is left: no file or mount, no sidecar running, and the container
    /// libcontainer built is deleted (force: its init is killed).
    fn assert_cleaned_up_after_build(&self) {
        assert_eq!(self.leftovers(), Vec::<PathBuf>::new());
        assert_eq!(self.procs.running(), []);
        let id = self.id.as_str().to_owned();
        assert_eq!(
            self.engine.calls(),
            [
                Call::Build,
                Call::Load(id.clone()),
                Call::Refresh(id.clone()),
                Call::Delete { id, force: true },
            ]
        );
    }
}

/// What `cleanup_sandbox` stops, whatever the sandbox started (a sidecar it never started
/// has no pid file, and its stop finds nothing).
const CLEANUP: [Step; 3] = [Step::StopProxy, Step::StopOomWatch, Step::StopSupervisor];

/// The sandbox's own user namespace (phase 2, as real root), then `steps`.
fn with_userns(steps: &[Step]) -> Vec<Step> {
    let own: &[Step] = if crate::state::paths::rootless().unwrap() {
        &[]
    } else {
        &[Step::OwnUserns]
    };
    own.iter().chain(steps).copied().collect()
}

/// The sandbox's own user namespace, `steps`, then clean-up's.
fn then_cleanup(steps: &[Step]) -> Vec<Step> {
    with_userns(steps).iter().chain(&CLEANUP).copied().collect()
}

/// The steps of phase 5 before the build: the supervisor starts, the executor connects to
/// it, the proxy starts.
const SPAWN: [Step; 3] = [
    Step::StartSupervisor,
    Step::ConnectSupervisor,
    Step::PrespawnProxy,
];

/// The steps of phase 5 after the build for a sandbox of its own (not a pod's): `lo` up,
/// the proxy bound in the init's namespace, the supervisor's ready line.
const ATTACH: [Step; 3] = [Step::LoopbackUp, Step::FinishProxy, Step::SupervisorReady];

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

/// Phase 2 (host): the sandbox's own user namespace cannot be made (its creator ended
/// before it reported). Nothing is left and libcontainer is never asked; a rootless runtime
/// makes none.
#[test]
fn a_failure_making_the_sandboxs_own_user_namespace_leaves_nothing() {
    let f = Fixture::new("userns");
    f.procs.fail(Step::OwnUserns);
    if crate::state::paths::rootless().unwrap() {
        return;
    }
    let err = f.create_failing(&Spec::default());
    assert!(
        matches!(
            &err,
            LifecycleError::Userns(crate::host::userns::UsernsError::Create { .. })
        ),
        "{err:?}"
    );
    assert!(f.audit_initialised());
    assert_eq!(f.procs.steps(), then_cleanup(&[]));
    f.assert_cleaned_up_before_build();
}

/// Phase 2 and 3: the sandbox's user namespace is asked for with its own host root id as
/// owner and the policy's caps, and the spec libcontainer gets joins exactly its pin.
#[test]
fn the_spec_joins_the_user_namespace_owned_by_the_sandboxs_host_root_id() {
    if crate::state::paths::rootless().unwrap() {
        return;
    }
    let f = Fixture::new("ownns");
    // The fake engine refuses to build: hardening, with `verify_in_userns`, passed.
    let err = f.create_failing(&Spec::default());
    assert!(
        matches!(err, LifecycleError::Container { op: "create", .. }),
        "{err:?}"
    );
    let userns = f.procs.userns().expect("the user namespace was asked for");
    assert!(
        userns.owner >= crate::host::idmap::FIRST_HOST_ID,
        "owner {} is not a sandbox id",
        userns.owner
    );
    assert_eq!(userns.pin, crate::host::userns::pin_path(&f.mount_dir()));
    let agent = agent_sandbox_policy::SandboxPolicy::builtin("agent").unwrap();
    assert_eq!(
        userns.caps.get("inotify_instances"),
        Some(&agent.ucounts.inotify_instances)
    );
    assert_eq!(userns.caps.len(), agent.ucounts.caps().len());
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
/// install made the spec real (the image bound read-only at the sandbox's rootfs mount, the
/// bundle libcontainer reads, the cgroup record) and the supervisor and the proxy started.
/// The phases run here in `create`'s order, up to the build; the failure is then cleaned up
/// as `create` does, which stops both sidecars. The bind needs root in the initial user
/// namespace; elsewhere install refuses it and its clean-up is what is checked.
#[test]
fn a_failure_in_libcontainers_create_is_cleaned_up_after_install() {
    let f = Fixture::new("build");
    let spec = Spec::default();
    spec.save(f.bundle().join("config.json")).unwrap();
    let opts = f.opts();
    let ceiling = Ceiling::load(None).unwrap();
    let rt = &f.runtime;
    let marks = super::Marks::start();
    let mut rootfs_mount = None;
    let result: Result<i32, LifecycleError> = (|| {
        let ids = rt.assign_ids(&f.id, &spec)?;
        let ceiling = ids.ceiling(&ceiling);
        let mut host = rt.prepare_host(&f.id, &opts, &spec, &ids, ceiling, &marks)?;
        rootfs_mount = Some(host.record.rootfs_mount.clone());
        let (hardened, mut executor) =
            rt.harden(&f.id, &opts, spec.clone(), &ids, ceiling, &mut host)?;
        let bundle = rt.install(&f.id, &ids, &host, &hardened)?;
        assert!(
            mounted(&host.record.rootfs_mount),
            "install bound the rootfs"
        );
        assert!(bundle.join("config.json").exists());
        let _sidecars = rt.spawn_sidecars(&f.id, &ids, &host, &hardened, &mut executor)?;
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
        assert_eq!(f.procs.steps(), with_userns(&SPAWN));
        assert_eq!(f.procs.running(), [Sidecar::Supervisor, Sidecar::Proxy]);
    } else {
        assert!(matches!(err, LifecycleError::Mount(_)), "{err:?}");
        assert_eq!(f.engine.calls(), []);
        assert_eq!(f.procs.steps(), []);
    }
    rt.cleanup_sandbox(&f.id);
    let spawned: &[Step] = if privileged { &SPAWN } else { &[] };
    assert_eq!(f.procs.steps(), then_cleanup(spawned));
    assert_eq!(f.procs.running(), [], "both sidecars are stopped");
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

/// Phase 5 (sidecars): the supervisor does not start. Nothing else ran, nothing is left.
#[test]
fn a_supervisor_that_does_not_start_leaves_nothing() {
    let f = Fixture::new("supstart");
    f.procs.fail(Step::StartSupervisor);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(
        matches!(
            err,
            LifecycleError::SyscallAudit(crate::sidecars::syscall_audit::SyscallAuditError::Spawn(
                _
            ))
        ),
        "{err:?}"
    );
    assert_eq!(f.procs.steps(), then_cleanup(&[Step::StartSupervisor]));
    f.assert_cleaned_up_before_build();
}

/// Phase 5 (sidecars): the executor cannot connect to the supervisor that started; it is
/// stopped.
#[test]
fn a_supervisor_that_cannot_be_reached_is_stopped() {
    let f = Fixture::new("supconn");
    f.procs.fail(Step::ConnectSupervisor);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(
        matches!(
            err,
            LifecycleError::SyscallAudit(
                crate::sidecars::syscall_audit::SyscallAuditError::Connect { .. }
            )
        ),
        "{err:?}"
    );
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[Step::StartSupervisor, Step::ConnectSupervisor])
    );
    f.assert_cleaned_up_before_build();
}

/// Phase 5 (sidecars): the proxy does not start; the supervisor that did is stopped, and
/// libcontainer is never asked to build.
#[test]
fn a_proxy_that_does_not_start_stops_the_supervisor() {
    let f = Fixture::new("proxystart");
    f.procs.fail(Step::PrespawnProxy);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(
        matches!(
            err,
            LifecycleError::Egress(crate::sidecars::egress::EgressError::Spawn(_))
        ),
        "{err:?}"
    );
    assert_eq!(f.procs.steps(), then_cleanup(&SPAWN));
    f.assert_cleaned_up_before_build();
}

/// Phase 5 (attach): `lo` cannot be brought up in the init's namespace. The container
/// libcontainer built is deleted, the proxy waiting for that namespace and the supervisor
/// are stopped.
#[test]
fn a_failure_bringing_lo_up_deletes_the_container_and_stops_the_sidecars() {
    let f = Fixture::building("lo");
    f.procs.fail(Step::LoopbackUp);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(matches!(err, LifecycleError::Loopback(_)), "{err:?}");
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[SPAWN.as_slice(), &[Step::LoopbackUp]].concat())
    );
    f.assert_cleaned_up_after_build();
}

/// Phase 5 (attach): a pod's sandbox container whose namespaces cannot be pinned for the
/// pod's members.
#[test]
fn a_failure_pinning_a_pods_namespaces_deletes_the_container_and_stops_the_sidecars() {
    let f = Fixture::building("pin");
    f.procs.fail(Step::PinPod);
    let spec = spec_with_annotations(&[
        (crate::pod::CONTAINER_TYPE_ANNOTATION, "sandbox"),
        (crate::pod::SANDBOX_ID_ANNOTATION, f.id.as_str()),
    ]);
    let Some(err) = f.create_failing_past_install(&spec) else {
        return;
    };
    assert!(
        matches!(err, LifecycleError::Pod(crate::pod::PodError::Pin { .. })),
        "{err:?}"
    );
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[SPAWN.as_slice(), &[Step::LoopbackUp, Step::PinPod]].concat())
    );
    f.assert_cleaned_up_after_build();
}

/// Phase 5 (attach): the proxy cannot bind in the init's namespace; it is still running
/// (its pid file was written when it started) and is stopped with the supervisor.
#[test]
fn a_proxy_that_cannot_bind_is_stopped_with_the_container() {
    let f = Fixture::building("bind");
    f.procs.fail(Step::FinishProxy);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(
        matches!(
            err,
            LifecycleError::Egress(crate::sidecars::egress::EgressError::NotReady { .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[SPAWN.as_slice(), &ATTACH[..2]].concat())
    );
    f.assert_cleaned_up_after_build();
}

/// Phase 5 (attach): the supervisor never says it is ready: a sandbox whose denials nobody
/// answers is not handed out, and the proxy, already serving it, is stopped too.
#[test]
fn a_supervisor_that_is_not_ready_is_stopped_with_the_container_and_the_proxy() {
    let f = Fixture::building("ready");
    f.procs.fail(Step::SupervisorReady);
    let Some(err) = f.create_failing_past_install(&Spec::default()) else {
        return;
    };
    assert!(
        matches!(
            err,
            LifecycleError::SyscallAudit(
                crate::sidecars::syscall_audit::SyscallAuditError::NotReady { .. }
            )
        ),
        "{err:?}"
    );
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[SPAWN.as_slice(), &ATTACH].concat())
    );
    f.assert_cleaned_up_after_build();
}

/// A spec as podman writes it, which gets the OOM watcher.
fn podman_spec() -> Spec {
    spec_with_annotations(&[("io.container.manager", "libpod")])
}

/// Phase 6 (record): the limits read back are not those asked for: libcontainer's create
/// here (the fake) made no cgroup, which the record's check of the limits in force finds.
/// Every sidecar had started, podman's OOM watcher too, and all are stopped.
#[test]
fn a_failure_recording_the_sandbox_deletes_the_container_and_stops_every_sidecar() {
    let f = Fixture::building("record");
    let Some(err) = f.create_failing_past_install(&podman_spec()) else {
        return;
    };
    assert!(matches!(err, LifecycleError::Cgroups(_)), "{err:?}");
    assert_eq!(
        f.procs.steps(),
        then_cleanup(&[SPAWN.as_slice(), &ATTACH, &[Step::WatchOom]].concat())
    );
    f.assert_cleaned_up_after_build();
}

/// Phase 5 (OOM watch): a watcher that fails never fails the create (podman's `OOMKilled`
/// then stays false) and is stopped at once; the create goes on to the record (which fails
/// as above, so that clean-up's stops follow).
#[test]
fn a_failed_oom_watch_is_stopped_at_once_and_the_create_goes_on() {
    let f = Fixture::building("oom");
    f.procs.fail(Step::WatchOom);
    let Some(err) = f.create_failing_past_install(&podman_spec()) else {
        return;
    };
    assert!(matches!(err, LifecycleError::Cgroups(_)), "{err:?}");
    assert_eq!(
        f.procs.steps(),
        then_cleanup(
            &[
                SPAWN.as_slice(),
                &ATTACH,
                &[Step::WatchOom, Step::StopOomWatch]
            ]
            .concat()
        )
    );
    f.assert_cleaned_up_after_build();
}

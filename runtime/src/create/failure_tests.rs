//! A create that fails in a phase leaves nothing of the sandbox behind: `create` hands the
//! failure to `Runtime::cleanup_sandbox`, which removes whatever the phases before it set
//! up, stops every sidecar that started, detaches every mount and releases the AppArmor
//! profile. One table ([`cases`]) makes each step fail in turn, through its input or one
//! step of a fake, in a temporary state root, with libcontainer replaced by [`FakeEngine`]
//! and the host (mounts, cgroups, AppArmor, the sandbox's processes) by [`FakeProcs`], whose
//! recorded steps show how far create got. None of it needs root.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;

use super::CreateError;
use super::engine::fake::{Call, FakeEngine};
use super::host_procs::fake::{FakeProcs, Step};
use crate::harden::Ceiling;
use crate::lifecycle::Runtime;
use crate::sidecars::egress::EgressError;
use crate::sidecars::syscall_audit::SyscallAuditError;
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

    /// `create` of `spec` under the built-in ceiling.
    fn create(&self, spec: &Spec) -> Result<(), CreateError> {
        spec.save(self.bundle().join("config.json")).unwrap();
        let ceiling = Ceiling::load(None).unwrap();
        self.runtime.create(
            &self.id,
            &super::fixture::create_opts(self.bundle()),
            &ceiling,
        )
    }

    fn create_failing(&self, spec: &Spec) -> CreateError {
        self.create(spec).expect_err("the create should fail")
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

    /// What libcontainer was asked for: nothing, a build it refused, or a build whose
    /// container clean-up then deleted (force: its init is killed).
    fn engine_calls(&self, engine: Engine) -> Vec<Call> {
        let id = self.id.as_str().to_owned();
        match engine {
            Engine::Untouched => vec![],
            Engine::Refused => vec![Call::Build],
            Engine::Built => vec![
                Call::Build,
                Call::Load(id.clone()),
                Call::Refresh(id.clone()),
                Call::Delete { id, force: true },
            ],
        }
    }
}

/// What clean-up takes, whatever the sandbox got to: every sidecar's stop (one never
/// started has no pid file, and its stop finds nothing), the AppArmor release, the
/// detach of everything under the sandbox's mount dir.
const CLEANUP: [Step; 5] = [
    Step::StopProxy,
    Step::StopOomWatch,
    Step::StopSupervisor,
    Step::ReleaseApparmor,
    Step::DetachAllUnder,
];

/// Phase 4: the profile loaded, the mount points made, the rootfs bound, the cgroup
/// placement saved.
const INSTALL: [Step; 4] = [
    Step::LoadApparmor,
    Step::MountPoints,
    Step::BindRootfs,
    Step::SaveCgroups,
];

/// The steps of phase 5 before the build: the supervisor starts, the executor connects to
/// it, the proxy starts.
const SPAWN: [Step; 3] = [
    Step::StartSupervisor,
    Step::ConnectSupervisor,
    Step::PrespawnProxy,
];

/// The step of phase 5 right after libcontainer's create: the child that places HOME's
/// guards in the container (`split_home_guards`) starts.
const BUILT: [Step; 1] = [Step::HomeGuards];

/// The steps of phase 5 after the build for a sandbox of its own (not a pod's), while the
/// guards' child runs: `lo` up, the proxy bound in the init's namespace, the supervisor's
/// ready line. A failure among them drops the child, which must not be left running.
const ATTACH: [Step; 3] = [Step::LoopbackUp, Step::FinishProxy, Step::SupervisorReady];

/// The last step of phase 5: the guards' child says every guard is in place.
const PLACED: [Step; 1] = [Step::HomeGuardsPlaced];

/// Every step of phases 4 and 5, then `then`.
fn through_phase_5(then: &[Step]) -> Vec<Step> {
    [
        &INSTALL[..],
        &SPAWN[..],
        &BUILT[..],
        &ATTACH[..],
        &PLACED[..],
        then,
    ]
    .concat()
}

/// How far libcontainer got.
#[derive(Debug, Clone, Copy)]
enum Engine {
    /// Never asked.
    Untouched,
    /// Asked to build, and refused.
    Refused,
    /// Built the container, which clean-up deleted.
    Built,
}

/// One way for a create to fail, and what it must have done before and after.
struct Case {
    name: &'static str,
    spec: fn(&ContainerId) -> Spec,
    /// The steps of the fake host that fail.
    fail: &'static [Step],
    /// Whether libcontainer's create makes a container (else it refuses).
    builds: bool,
    /// The error the create must return.
    error: fn(&CreateError, &Fixture) -> bool,
    /// Whether the failure came after the sandbox's record (and its audit log) was
    /// written: clean-up then also detaches the rootfs mount it names.
    recorded: bool,
    /// Whether phase 2 made the sandbox's own user namespace (as real root).
    userns: bool,
    /// The steps taken after the user namespace, up to the failure.
    taken: Vec<Step>,
    engine: Engine,
}

fn plain(_: &ContainerId) -> Spec {
    Spec::default()
}

/// A spec as podman writes it, which gets the OOM watcher.
fn podman(_: &ContainerId) -> Spec {
    spec_with_annotations(&[("io.container.manager", "libpod")])
}

/// A pod's sandbox container, whose namespaces are pinned for the pod's members.
fn pod_sandbox(id: &ContainerId) -> Spec {
    spec_with_annotations(&[
        (crate::pod::CONTAINER_TYPE_ANNOTATION, "sandbox"),
        (crate::pod::SANDBOX_ID_ANNOTATION, id.as_str()),
    ])
}

fn harden_error(err: &CreateError) -> Option<&agent_sandbox_policy::harden::HardenError> {
    match err {
        CreateError::Sandbox(crate::harden::SandboxError::Harden(e)) => Some(e),
        _ => None,
    }
}

/// A row's defaults: a plain spec, no step failing, the failure after the record and the
/// user namespace, libcontainer never asked (`built`: its create makes the container,
/// which clean-up then deletes).
fn base(built: bool) -> Case {
    Case {
        name: "",
        spec: plain,
        fail: &[],
        builds: built,
        error: |_, _| false,
        recorded: true,
        userns: true,
        taken: vec![],
        engine: if built {
            Engine::Built
        } else {
            Engine::Untouched
        },
    }
}

/// The failures before anything is installed: phases 1 to 3.
fn cases_before_install() -> Vec<Case> {
    use agent_sandbox_policy::harden::HardenError;
    vec![
        // Phase 1 (ids): a Kubernetes app container that names no pod is refused before
        // any id block is taken or any directory made.
        Case {
            name: "ids",
            spec: |_| {
                spec_with_annotations(&[(crate::pod::CONTAINER_TYPE_ANNOTATION, "container")])
            },
            error: |e, _| matches!(e, CreateError::Pod(_)),
            recorded: false,
            userns: false,
            ..base(false)
        },
        // Phase 2 (host): a bundle whose config has no `root`; the ids allocated already
        // (as root) are released again.
        Case {
            name: "noroot",
            spec: |_| {
                let mut spec = Spec::default();
                spec.set_root(None);
                spec
            },
            error: |e, f| matches!(e, CreateError::NoRoot { bundle } if bundle == &f.bundle()),
            recorded: false,
            userns: false,
            ..base(false)
        },
        // Phase 2: an annotation with a bad value, found once the sandbox dir, its audit
        // log, record and ceiling and its mount dir exist.
        Case {
            name: "badann",
            spec: |_| spec_with_annotations(&[("io.agent.sandbox.memory", "lots")]),
            error: |e, _| matches!(harden_error(e), Some(HardenError::BadAnnotation { annotation, .. }) if annotation == "io.agent.sandbox.memory"),
            userns: false,
            ..base(false)
        },
        // Phase 2: an annotation asking for more memory than the ceiling grants (4G above
        // the built-in `agent` profile's 2G).
        Case {
            name: "widen",
            spec: |_| spec_with_annotations(&[("io.agent.sandbox.memory", "4G")]),
            error: |e, _| matches!(harden_error(e), Some(HardenError::AnnotationWidens { annotation, .. }) if annotation == "io.agent.sandbox.memory"),
            userns: false,
            ..base(false)
        },
        // Phase 2: the sandbox's own user namespace cannot be made (its creator ended
        // before it reported); a rootless runtime makes none.
        Case {
            name: "userns",
            fail: &[Step::OwnUserns],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::Userns(crate::host::userns::UsernsError::Create { .. })
                )
            },
            ..base(false)
        },
        // Phase 3 (harden): the policy compiler refuses a spec without a process.
        Case {
            name: "harden",
            spec: |_| {
                let mut spec = Spec::default();
                spec.set_process(None);
                spec
            },
            error: |e, _| matches!(harden_error(e), Some(HardenError::NoProcess)),
            ..base(false)
        },
    ]
}

/// The failures from install to the build: phase 4 and the sidecars' start.
fn cases_before_build() -> Vec<Case> {
    vec![
        // Phase 4 (install): each host step of install fails in turn.
        Case {
            name: "apparmor",
            fail: &[Step::LoadApparmor],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::AppArmor(crate::host::apparmor::AppArmorError::NotLoaded { .. })
                )
            },
            taken: [&INSTALL[..1]].concat(),
            ..base(false)
        },
        Case {
            name: "mountpoints",
            fail: &[Step::MountPoints],
            error: |e, f| matches!(e, CreateError::Mount(crate::enforce::mounts::MountError::MountPoint { path, .. }) if path == &f.bundle().join("rootfs")),
            taken: [&INSTALL[..2]].concat(),
            ..base(false)
        },
        Case {
            name: "bindroot",
            fail: &[Step::BindRootfs],
            error: |e, f| matches!(e, CreateError::Mount(crate::enforce::mounts::MountError::Bind { src, .. }) if src == &f.bundle().join("rootfs")),
            taken: [&INSTALL[..3]].concat(),
            ..base(false)
        },
        Case {
            name: "cgsave",
            fail: &[Step::SaveCgroups],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::Cgroups(crate::host::cgroups::CgroupsError::File(_))
                )
            },
            taken: [&INSTALL[..]].concat(),
            ..base(false)
        },
        // Phase 5 (sidecars): the supervisor does not start.
        Case {
            name: "supstart",
            fail: &[Step::StartSupervisor],
            error: |e, _| matches!(e, CreateError::SyscallAudit(SyscallAuditError::Spawn(_))),
            taken: [&INSTALL[..], &SPAWN[..1]].concat(),
            ..base(false)
        },
        // The executor cannot connect to the supervisor that started; it is stopped.
        Case {
            name: "supconn",
            fail: &[Step::ConnectSupervisor],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::SyscallAudit(SyscallAuditError::Connect { .. })
                )
            },
            taken: [&INSTALL[..], &SPAWN[..2]].concat(),
            ..base(false)
        },
        // The proxy does not start; the supervisor that did is stopped.
        Case {
            name: "proxystart",
            fail: &[Step::PrespawnProxy],
            error: |e, _| matches!(e, CreateError::Egress(EgressError::Spawn(_))),
            taken: [&INSTALL[..], &SPAWN[..]].concat(),
            ..base(false)
        },
        // Phase 5 (build): libcontainer's create fails after both sidecars started.
        Case {
            name: "build",
            error: |e, _| matches!(e, CreateError::Container { op: "create", .. }),
            taken: [&INSTALL[..], &SPAWN[..]].concat(),
            engine: Engine::Refused,
            ..base(false)
        },
    ]
}

/// The failures after libcontainer built the container: the attach of the sidecars and
/// the record. Clean-up deletes the container too.
fn cases_after_build() -> Vec<Case> {
    vec![
        // HOME's guards' child cannot start in the built container: it is deleted, and the
        // sidecars that started beside it are stopped.
        Case {
            name: "guards",
            fail: &[Step::HomeGuards],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::Mount(crate::enforce::mounts::MountError::GuardOption { .. })
                )
            },
            taken: [&INSTALL[..], &SPAWN[..], &BUILT[..]].concat(),
            ..base(true)
        },
        // `lo` cannot be brought up in the init's namespace.
        Case {
            name: "lo",
            fail: &[Step::LoopbackUp],
            error: |e, _| matches!(e, CreateError::Loopback(_)),
            taken: [&INSTALL[..], &SPAWN[..], &BUILT[..], &ATTACH[..1]].concat(),
            ..base(true)
        },
        // A pod's sandbox container whose namespaces cannot be pinned for its members.
        Case {
            name: "pin",
            spec: pod_sandbox,
            fail: &[Step::PinPod],
            error: |e, _| matches!(e, CreateError::Pod(crate::pod::PodError::Pin { .. })),
            taken: [
                &INSTALL[..],
                &SPAWN[..],
                &BUILT[..],
                &[Step::LoopbackUp, Step::PinPod],
            ]
            .concat(),
            ..base(true)
        },
        // The proxy cannot bind in the init's namespace; still running (its pid file was
        // written when it started), it is stopped with the supervisor.
        Case {
            name: "bind",
            fail: &[Step::FinishProxy],
            error: |e, _| matches!(e, CreateError::Egress(EgressError::NotReady { .. })),
            taken: [&INSTALL[..], &SPAWN[..], &BUILT[..], &ATTACH[..2]].concat(),
            ..base(true)
        },
        // The supervisor never says it is ready: a sandbox whose denials nobody answers is
        // not handed out, and the proxy, already serving it, is stopped too.
        Case {
            name: "ready",
            fail: &[Step::SupervisorReady],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::SyscallAudit(SyscallAuditError::NotReady { .. })
                )
            },
            taken: [&INSTALL[..], &SPAWN[..], &BUILT[..], &ATTACH[..]].concat(),
            ..base(true)
        },
        // The guards' child placed a part of them and failed: the sandbox, whose sidecars
        // were all tied to it meanwhile, is not handed out.
        Case {
            name: "placed",
            fail: &[Step::HomeGuardsPlaced],
            error: |e, _| {
                matches!(
                    e,
                    CreateError::Mount(crate::enforce::mounts::MountError::HomeGuards(
                        agent_sandbox_sys::guard_mounts::GuardMountError::Place { .. }
                    ))
                )
            },
            taken: through_phase_5(&[]),
            ..base(true)
        },
        // Phase 6 (record): the limits read back are not those asked for. Every sidecar
        // had started, podman's OOM watcher too, and all are stopped.
        Case {
            name: "record",
            spec: podman,
            fail: &[Step::VerifyLimits],
            error: |e, _| matches!(e, CreateError::Cgroups(_)),
            taken: through_phase_5(&[Step::WatchOom, Step::VerifyLimits]),
            ..base(true)
        },
        // A watcher that fails never fails the create (podman's `OOMKilled` then stays
        // false) and is stopped at once; the create goes on to the record.
        Case {
            name: "oom",
            spec: podman,
            fail: &[Step::WatchOom, Step::VerifyLimits],
            error: |e, _| matches!(e, CreateError::Cgroups(_)),
            taken: through_phase_5(&[Step::WatchOom, Step::StopOomWatch, Step::VerifyLimits]),
            ..base(true)
        },
    ]
}

/// Every case: the steps `create` took, its error, and that nothing of the sandbox is left.
fn cases() -> Vec<Case> {
    let mut all = cases_before_install();
    all.extend(cases_before_build());
    all.extend(cases_after_build());
    all
}

/// The steps a case expects: the user namespace (as real root), the steps it names, then
/// clean-up's (with the rootfs mount's detach where a record names it).
fn expected_steps(case: &Case) -> Vec<Step> {
    let rootless = crate::state::paths::rootless().unwrap();
    let mut steps = Vec::new();
    if case.userns && !rootless {
        steps.push(Step::OwnUserns);
    }
    steps.extend_from_slice(&case.taken);
    steps.extend_from_slice(&CLEANUP);
    if case.recorded {
        steps.push(Step::DetachRootfs);
    }
    steps
}

/// Runs one case; what differs from what it expects, one line each.
fn check(case: &Case) -> Vec<String> {
    let f = if case.builds {
        Fixture::building(case.name)
    } else {
        Fixture::new(case.name)
    };
    for step in case.fail {
        f.procs.fail(*step);
    }
    let err = f.create_failing(&(case.spec)(&f.id));
    let mut wrong = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            wrong.push(format!("{}: {what}", case.name));
        }
    };
    expect((case.error)(&err, &f), format!("unexpected error {err:?}"));
    let steps = f.procs.steps();
    let want = expected_steps(case);
    expect(steps == want, format!("steps {steps:?}, wanted {want:?}"));
    let left = f.leftovers();
    expect(left.is_empty(), format!("left behind: {left:?}"));
    let running = f.procs.running();
    expect(running.is_empty(), format!("still running: {running:?}"));
    let mounted = f.procs.mounted();
    expect(mounted.is_empty(), format!("still mounted: {mounted:?}"));
    expect(
        !f.procs.holds_apparmor(),
        "the AppArmor profile is still held".to_owned(),
    );
    expect(
        f.audit_initialised() == case.recorded,
        format!("audit initialised: {}", f.audit_initialised()),
    );
    let calls = f.engine.calls();
    let want = f.engine_calls(case.engine);
    expect(
        calls == want,
        format!("libcontainer calls {calls:?}, wanted {want:?}"),
    );
    wrong
}

/// Each step of create fails in turn, through its input or the fake host; every failure
/// is cleaned up: no file, mount, sidecar or AppArmor profile of the sandbox is left, and a
/// container libcontainer built is deleted.
#[test]
fn every_failing_step_of_create_is_cleaned_up() {
    let cases = cases();
    let wrong: Vec<String> = cases.iter().flat_map(check).collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The table reaches every step of the fake host that create can fail, so a step added
/// to create without a row here fails this test.
#[test]
fn the_table_fails_every_step_create_takes() {
    let failed: Vec<Step> = cases()
        .iter()
        .flat_map(|c| c.fail.iter().copied())
        .collect();
    let f = Fixture::building("all");
    f.create(&podman(&f.id))
        .expect("the fake host lets create through");
    let taken = f.procs.steps();
    f.runtime.delete(&f.id, false, None).unwrap();
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    for step in taken {
        assert!(
            failed.contains(&step),
            "{step:?} is taken by create but no case fails it"
        );
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
        matches!(err, CreateError::Container { op: "create", .. }),
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

/// A restore whose own policy changes a key the image carries (here the syscall table, whose
/// filter CRIU restores as the image recorded it) is refused naming the key before the host
/// is touched: no user namespace, nothing left. The same restore under the image's own policy
/// goes on.
#[test]
fn a_restore_that_changes_a_carried_key_is_refused_before_the_host_is_touched() {
    let f = Fixture::new("carried");
    podman(&f.id).save(f.bundle().join("config.json")).unwrap();
    let ceiling = Ceiling::load(None).unwrap();
    let agent = agent_sandbox_policy::SandboxPolicy::builtin("agent").unwrap();
    let text = agent_sandbox_policy::policy::builtin_text("agent").unwrap();
    let narrower = agent_sandbox_policy::SandboxPolicy::parse(
        &format!("{text}\n[syscalls]\ndeny = [\"personality\"]\n"),
        "image.toml",
    )
    .unwrap();
    let mut opts = super::fixture::create_opts(f.bundle());
    opts.image_policy = Some(Box::new(narrower));
    let err = f.runtime.create(&f.id, &opts, &ceiling).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("changes syscalls")
            && text.contains("seccomp filters")
            && text.contains("docs/checkpoint.md#the-policy-of-a-fork"),
        "{text}"
    );
    assert!(f.procs.userns().is_none(), "the host was prepared");
    assert_eq!(f.leftovers(), Vec::<PathBuf>::new());
    // The control: the image's policy is the restoring one, and the create goes on to the
    // engine (which fails here).
    opts.image_policy = Some(Box::new(agent));
    let err = f.runtime.create(&f.id, &opts, &ceiling).unwrap_err();
    assert!(
        matches!(err, CreateError::Container { op: "create", .. }),
        "{err:?}"
    );
}

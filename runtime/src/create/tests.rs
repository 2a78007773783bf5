//! Unit tests through the engine seam: `delete --force`'s retries, the ceiling on `update`
//! and the plan create saves, with libcontainer replaced by [`FakeEngine`], which records
//! every call.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::container::ContainerStatus;
use libcontainer::oci_spec::runtime::{LinuxMemoryBuilder, LinuxResourcesBuilder};

use super::engine::fake::{Call, FakeEngine};
use super::fixture::Sandbox;
use crate::lifecycle::{Runtime, SandboxRecord, UpdateError};
use crate::state::ContainerId;
use agent_sandbox_policy::SandboxPlan;
use libcontainer::oci_spec::runtime::{
    LinuxSeccomp, LinuxSeccompAction, LinuxSeccompBuilder, Spec,
};

/// A sandbox as `create` leaves it in state root `root`: libcontainer's state dir, the
/// sandbox dir with its record and saved ceiling, the hardened bundle with `annotations`.
struct Fixture {
    _root: tempfile::TempDir,
    runtime: Runtime,
    engine: Arc<FakeEngine>,
    id: ContainerId,
}

impl Fixture {
    fn new(
        name: &str,
        status: ContainerStatus,
        failing_deletes: u32,
        annotations: &[(&str, &str)],
    ) -> Self {
        let root = tempfile::tempdir().unwrap();
        let id =
            ContainerId::try_from(format!("phh-{name}-{}", std::process::id()).as_str()).unwrap();
        let bundle = root.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let spec = crate::test_support::spec_with_annotations(annotations);
        spec.save(bundle.join("config.json")).unwrap();
        let engine = Arc::new(
            FakeEngine::default()
                .with_container(id.as_str(), status, Some(1), bundle.clone())
                .failing_deletes(failing_deletes),
        );
        let runtime = Runtime::with_engine(root.path(), Box::new(engine.clone())).unwrap();
        runtime.dirs.ensure().unwrap();
        let state = runtime.dirs.container(&id);
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("state.json"), "{}").unwrap();
        let sandbox = runtime.dirs.sandbox(&id);
        std::fs::create_dir_all(sandbox.path()).unwrap();
        crate::harden::Ceiling::load(None)
            .unwrap()
            .save(&sandbox)
            .unwrap();
        // Its mounts under the temporary root, so clean-up touches nothing of the host's.
        let record = SandboxRecord {
            id: id.as_str().to_owned(),
            bundle,
            ids: crate::host::idmap::IdRange {
                host_start: 1_000_000,
                size: 65536,
            },
            allocated: false,
            rootfs_mount: root.path().join("mnt").join("rootfs"),
            profile: "agent".to_owned(),
        };
        sandbox.record().write(&record).unwrap();
        Self {
            _root: root,
            runtime,
            engine,
            id,
        }
    }

    fn deletes(&self) -> Vec<bool> {
        self.engine
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Delete { id, force } if id == self.id.as_str() => Some(force),
                _ => None,
            })
            .collect()
    }

    fn sandbox_dir(&self) -> PathBuf {
        self.runtime.dirs.sandbox(&self.id).path().to_owned()
    }
}

fn exists(p: &Path) -> bool {
    p.exists()
}

/// Killed processes may still be exiting when libcontainer first deletes (a v1 cgroup cannot
/// be removed until they are gone): a forced delete loads the container again and retries
/// until it succeeds, then cleans up the sandbox.
#[test]
fn a_forced_delete_retries_until_libcontainer_succeeds_then_cleans_up() {
    let f = Fixture::new("retry", ContainerStatus::Stopped, 3, &[]);
    f.runtime.delete(&f.id, true, None).unwrap();
    assert_eq!(
        f.deletes(),
        [true, true, true, true],
        "three failures, one success"
    );
    let id = f.id.as_str().to_owned();
    let calls = f.engine.calls();
    // Each retry works on a freshly loaded container.
    let retried: Vec<&Call> = calls
        .iter()
        .skip_while(|c| !matches!(c, Call::Delete { .. }))
        .take(4)
        .collect();
    assert_eq!(
        retried,
        [
            &Call::Delete {
                id: id.clone(),
                force: true
            },
            &Call::Load(id.clone()),
            &Call::Refresh(id.clone()),
            &Call::Delete {
                id: id.clone(),
                force: true
            },
        ]
    );
    assert!(!exists(&f.sandbox_dir()), "the sandbox dir is cleaned up");
    assert!(!exists(&f.runtime.dirs.container(&f.id)));
}

/// The retries end after two seconds: the delete fails naming the operation, and a forced one
/// still removes what the runtime set up (clean-up asks libcontainer once more).
#[test]
fn a_forced_delete_gives_up_after_its_retries_and_still_cleans_up() {
    let f = Fixture::new("giveup", ContainerStatus::Stopped, u32::MAX, &[]);
    let err = f.runtime.delete(&f.id, true, None).unwrap_err();
    assert!(
        matches!(err, crate::lifecycle::DeleteError::Container(_)),
        "{err:?}"
    );
    assert_eq!(
        f.deletes().len(),
        1 + 20 + 1,
        "first try, 20 retries, clean-up"
    );
    assert!(!exists(&f.sandbox_dir()));
}

/// Without `--force` a failed delete is reported at once and the sandbox is left as it is.
#[test]
fn a_delete_without_force_does_not_retry_nor_clean_up() {
    let f = Fixture::new("noforce", ContainerStatus::Stopped, 1, &[]);
    let err = f.runtime.delete(&f.id, false, None).unwrap_err();
    assert!(
        matches!(err, crate::lifecycle::DeleteError::Container(_)),
        "{err:?}"
    );
    assert_eq!(f.deletes(), [false]);
    assert!(exists(&f.sandbox_dir().join("sandbox.json")));
}

fn memory(bytes: i64) -> libcontainer::oci_spec::runtime::LinuxResources {
    LinuxResourcesBuilder::default()
        .memory(LinuxMemoryBuilder::default().limit(bytes).build().unwrap())
        .build()
        .unwrap()
}

/// `update` is held to the sandbox's effective policy: the saved ceiling narrowed by the
/// annotations of its hardened spec. 512M is within the built-in `agent` ceiling (2G) but
/// above the sandbox's `io.agent.sandbox.memory=256M`: refused before any cgroup is touched.
/// The same request to a sandbox without the annotation passes the check (and goes on to
/// libcontainer's saved config, which this fixture does not have).
#[test]
fn update_above_the_sandboxs_effective_policy_is_refused_before_anything_is_applied() {
    let mib = 1024 * 1024;
    let narrowed = Fixture::new(
        "update",
        ContainerStatus::Running,
        0,
        &[("io.agent.sandbox.memory", "256M")],
    );
    let err = narrowed
        .runtime
        .update(&narrowed.id, &memory(512 * mib))
        .unwrap_err();
    match &err {
        UpdateError::Cgroups(crate::host::cgroups::CgroupsError::AboveCeiling {
            what,
            got,
            max,
        }) => {
            assert_eq!(*what, "memory.limit");
            assert_eq!(got, &(512 * mib).to_string());
            assert_eq!(max, &(256 * mib).to_string());
        }
        other => panic!("expected the ceiling to refuse, got {other:?}"),
    }
    let id = narrowed.id.as_str().to_owned();
    assert_eq!(
        narrowed.engine.calls(),
        [Call::Load(id.clone()), Call::Refresh(id)],
        "nothing but the state was read"
    );
    // Within the annotation: the check passes.
    let err = narrowed
        .runtime
        .update(&narrowed.id, &memory(128 * mib))
        .unwrap_err();
    assert!(matches!(err, UpdateError::Container(_)), "{err:?}");
    // Without the annotation 512M is within the ceiling.
    let wide = Fixture::new("update-wide", ContainerStatus::Running, 0, &[]);
    let err = wide
        .runtime
        .update(&wide.id, &memory(512 * mib))
        .unwrap_err();
    assert!(matches!(err, UpdateError::Container(_)), "{err:?}");
}

/// `update` reads the plan create compiled (`plan.json`) rather than deriving the policy
/// again: a sandbox whose plan holds 256M refuses 512M even though its saved ceiling and
/// annotations alone would allow it (the `update-wide` case above).
#[test]
fn update_is_held_to_the_saved_plan() {
    let mib = 1024 * 1024;
    let f = Fixture::new("update-plan", ContainerStatus::Running, 0, &[]);
    let mut policy = agent_sandbox_policy::SandboxPolicy::builtin("agent").unwrap();
    policy.resources.memory = agent_sandbox_policy::value::ByteSize::try_from("256M").unwrap();
    let dir = f.runtime.dirs.sandbox(&f.id);
    dir.plan()
        .write(&agent_sandbox_policy::SandboxPlan {
            policy,
            layers: agent_sandbox_policy::layers::LayerPlan::default(),
            protected: Vec::new(),
            clamped: Vec::new(),
            requested_seccomp: None,
            credential_placeholders: std::collections::BTreeMap::new(),
            not_restored: Vec::new(),
        })
        .unwrap();
    let err = f.runtime.update(&f.id, &memory(512 * mib)).unwrap_err();
    assert!(
        matches!(
            &err,
            UpdateError::Cgroups(crate::host::cgroups::CgroupsError::AboveCeiling { max, .. })
                if max == &(256 * mib).to_string()
        ),
        "{err:?}"
    );
}

// The plan create saves, read back by every later command.

/// A config that asks for its own seccomp profile and a negative OOM score (clamped).
fn asking_spec() -> Spec {
    let mut spec = Spec::default();
    let seccomp = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .build()
        .unwrap();
    let mut linux = spec.linux().clone().unwrap_or_default();
    linux.set_seccomp(Some(seccomp));
    spec.set_linux(Some(linux));
    let mut process = spec.process().clone().unwrap_or_default();
    process.set_oom_score_adj(Some(-500));
    spec.set_process(Some(process));
    spec
}

fn hardened(s: &Sandbox) -> Spec {
    Spec::load(s.runtime.dirs.sandbox(&s.id).hardened_spec()).unwrap()
}

/// Create compiles the plan once and saves all of it: the config's seccomp request and
/// the clamps are in `plan.json`, and no file of their own is written beside it.
#[test]
fn create_saves_the_seccomp_request_and_the_clamps_in_the_plan() {
    let s = Sandbox::created(
        "plan-saved",
        &asking_spec(),
        i32::try_from(std::process::id()).unwrap(),
    );
    let dir = s.runtime.dirs.sandbox(&s.id);
    let plan: SandboxPlan = dir.plan().read().unwrap();
    assert_eq!(
        plan.requested_seccomp,
        asking_spec().linux().as_ref().unwrap().seccomp().clone()
    );
    assert!(
        plan.clamped
            .iter()
            .any(|c| c.key == "process.oomScoreAdj" && c.granted == "0"),
        "{:?}",
        plan.clamped
    );
    assert!(!dir.requested_seccomp().path().exists());
    assert_eq!(
        crate::harden::saved_plan(&dir, &hardened(&s)).unwrap(),
        plan
    );
}

/// A sandbox an older runtime created: its `plan.json` has only the policy and the layer
/// plan, and the seccomp request is in `requested-seccomp.json`; exec still gets it. A
/// sandbox older still has no `plan.json`: its plan is derived from the saved ceiling
/// and the annotations of its hardened spec.
#[test]
fn a_sandbox_from_the_previous_runtime_still_reads_its_plan() {
    let mut spec =
        crate::test_support::spec_with_annotations(&[("io.agent.sandbox.memory", "256M")]);
    let mut linux = spec.linux().clone().unwrap_or_default();
    linux.set_seccomp(asking_spec().linux().as_ref().unwrap().seccomp().clone());
    spec.set_linux(Some(linux));
    let s = Sandbox::created(
        "plan-old",
        &spec,
        i32::try_from(std::process::id()).unwrap(),
    );
    let dir = s.runtime.dirs.sandbox(&s.id);
    let now: SandboxPlan = dir.plan().read().unwrap();
    let requested: LinuxSeccomp = now.requested_seccomp.clone().unwrap();
    let old = serde_json::json!({ "policy": now.policy, "layers": now.layers });
    std::fs::write(dir.plan().path(), old.to_string()).unwrap();
    dir.requested_seccomp().write(&requested).unwrap();
    let read = crate::harden::saved_plan(&dir, &hardened(&s)).unwrap();
    assert_eq!(read.policy, now.policy);
    assert_eq!(read.layers, now.layers);
    assert_eq!(read.requested_seccomp.as_ref(), Some(&requested));
    crate::harden::executor(&read).unwrap();

    std::fs::remove_file(dir.plan().path()).unwrap();
    let derived = crate::harden::saved_plan(&dir, &hardened(&s)).unwrap();
    assert_eq!(
        derived.policy, now.policy,
        "the annotation narrows it again"
    );
    assert_eq!(derived.requested_seccomp.as_ref(), Some(&requested));
}

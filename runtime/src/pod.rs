//! Kubernetes pods. containerd's CRI runs a pod as one sandbox ("pause") container plus the
//! pod's app containers, and marks each with annotations:
//! `io.kubernetes.cri.container-type` (`sandbox` or `container`) and
//! `io.kubernetes.cri.sandbox-id` (the sandbox container's id).
//!
//! The pod model (see docs/pod-network.md for the decision and its trade-off):
//! - the sandbox container is an ordinary sandbox: its own host id block, a *new* network
//!   namespace with only `lo` (never the CNI namespace CRI names), and the pod's one egress
//!   proxy. Right after it is created the runtime pins its user, network, IPC and UTS
//!   namespaces (bind mounts of the nsfs files under its reachable mount dir);
//! - an app container joins exactly those pinned namespaces (never the `/proc/<pid>/ns/...`
//!   paths of its spec), shares the sandbox's host id block (the block stays allocated
//!   until its last holder is deleted), and keeps its own mount, PID and cgroup namespaces
//!   and every other layer. Its ceiling is the pod's saved ceiling, and its network policy
//!   must equal the pod's: one proxy serves the whole pod.

use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{ANNOTATION_PREFIX, PodNamespaces};
use libcontainer::container::ContainerStatus;
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};
use serde::{Deserialize, Serialize};

use crate::enforce::mounts;
use crate::files::FileError;
use crate::harden::Ceiling;
use crate::host::idmap::{self, IdRange};
use crate::state::{ContainerId, SandboxDir, StateDirs};

/// `sandbox` for a pod's pause container, `container` for its app containers.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";
/// The id of the pod's sandbox container, on every container of the pod.
pub const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// Errors of the pod model; each names the annotation or the pod.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error(
        "annotation {CONTAINER_TYPE_ANNOTATION} has a bad value `{value}`: expected `sandbox` or `container`"
    )]
    BadType { value: String },
    #[error("annotation {SANDBOX_ID_ANNOTATION} is missing on a pod's app container")]
    NoSandboxId,
    #[error("annotation {SANDBOX_ID_ANNOTATION} has a bad value `{value}`")]
    BadSandboxId {
        value: String,
        #[source]
        source: crate::state::IdError,
    },
    #[error(
        "annotation {SANDBOX_ID_ANNOTATION} names {pod}, but a pod's sandbox container must name itself ({id})"
    )]
    SandboxIdMismatch { id: String, pod: String },
    #[error("annotation {SANDBOX_ID_ANNOTATION} names the app container itself ({id})")]
    SelfMember { id: String },
    #[error("pod sandbox {pod} does not exist in this runtime's state")]
    NoSandbox { pod: String },
    #[error(
        "container {pod} is not a pod sandbox (it was created without {CONTAINER_TYPE_ANNOTATION}=sandbox)"
    )]
    NotASandbox { pod: String },
    #[error("pod sandbox {pod} has stopped")]
    Stopped { pod: String },
    #[error(
        "pods need the runtime to run as real root (a rootless runtime has no id blocks to share)"
    )]
    Rootless,
    #[error("cannot pin the pod's {kind} namespace at {path}")]
    Pin {
        kind: &'static str,
        path: PathBuf,
        #[source]
        source: mounts::MountError,
    },
    #[error("pod namespace pin {path} is missing")]
    PinMissing { path: PathBuf },
    #[error(
        "annotation {annotation} makes this container's network policy differ from its pod's: the containers of a pod share one network namespace and one egress proxy, so network annotations belong on the pod"
    )]
    NetworkDiffers { annotation: String },
    #[error("pod sandbox {pod}: cannot load its saved policy")]
    PodPolicy {
        pod: String,
        #[source]
        source: Box<crate::harden::SandboxError>,
    },
    #[error("pod sandbox {pod}: cannot read its hardened spec {path}")]
    PodSpec {
        pod: String,
        path: PathBuf,
        #[source]
        source: Box<libcontainer::oci_spec::OciSpecError>,
    },
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    IdMap(#[from] idmap::IdMapError),
    #[error("hardened spec of a pod member violates the sandbox invariant: {invariant}")]
    Invariant { invariant: &'static str },
    #[error(transparent)]
    Enforce(#[from] crate::enforce::EnforceError),
    #[error("pod sandbox {pod}: cannot load its state")]
    Load {
        pod: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

type Result<T> = std::result::Result<T, PodError>;

/// What the pod model needs from the runtime that drives it: its state directories and the
/// status of a pod's sandbox container. The lifecycle implements it (and calls into this
/// module), so this module never names the lifecycle.
pub trait PodStates {
    fn dirs(&self) -> &StateDirs;

    /// The status of container `pod`, or `None` when this runtime's state has no such
    /// container.
    fn status(
        &self,
        pod: &ContainerId,
    ) -> std::result::Result<Option<ContainerStatus>, Box<dyn std::error::Error + Send + Sync>>;
}

/// A container's place in a pod, from its spec's CRI annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not a pod container (podman, ctr): a sandbox of its own.
    Alone,
    /// The pod's sandbox (pause) container.
    Sandbox,
    /// An app container of the pod whose sandbox container is `pod`.
    Member { pod: ContainerId },
}

/// Reads the role of container `id` from `spec`'s annotations. A malformed or inconsistent
/// annotation is an error naming it.
pub fn role(spec: &Spec, id: &ContainerId) -> Result<Role> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    let Some(kind) = annotations.get(CONTAINER_TYPE_ANNOTATION) else {
        return Ok(Role::Alone);
    };
    let sandbox_id = annotations
        .get(SANDBOX_ID_ANNOTATION)
        .filter(|v| !v.is_empty())
        .map(|v| {
            ContainerId::try_from(v.as_str()).map_err(|source| PodError::BadSandboxId {
                value: v.clone(),
                source,
            })
        })
        .transpose()?;
    match kind.as_str() {
        "sandbox" => match sandbox_id {
            Some(pod) if &pod != id => Err(PodError::SandboxIdMismatch {
                id: id.as_str().to_owned(),
                pod: pod.as_str().to_owned(),
            }),
            _ => Ok(Role::Sandbox),
        },
        "container" => match sandbox_id {
            None => Err(PodError::NoSandboxId),
            Some(pod) if &pod == id => Err(PodError::SelfMember {
                id: id.as_str().to_owned(),
            }),
            Some(pod) => Ok(Role::Member { pod }),
        },
        other => Err(PodError::BadType {
            value: other.to_owned(),
        }),
    }
}

/// What `pod.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case")]
enum PodRecord {
    Sandbox {
        user: PathBuf,
        network: PathBuf,
        ipc: PathBuf,
        uts: PathBuf,
    },
    Member {
        pod: String,
    },
}

/// Where the pins of a pod sandbox's namespaces go: under its reachable mount dir, so the
/// runtime's cleanup (which detaches everything there) releases them with the sandbox.
fn pins(mount_dir: &Path) -> PodNamespaces {
    let dir = mount_dir.join("ns");
    PodNamespaces {
        user: dir.join("user"),
        network: dir.join("net"),
        ipc: dir.join("ipc"),
        uts: dir.join("uts"),
    }
}

fn write_record(sandbox_dir: &SandboxDir, record: &PodRecord) -> Result<()> {
    Ok(sandbox_dir.pod().write(record)?)
}

fn read_record(sandbox_dir: &SandboxDir) -> Result<Option<PodRecord>> {
    Ok(sandbox_dir.pod().read_if_present()?)
}

/// The app containers of pod sandbox `pod` in state root `dirs` (their pod records name
/// it), when `pod` is a pod sandbox; none otherwise.
pub fn members_of(dirs: &StateDirs, pod: &ContainerId) -> Vec<ContainerId> {
    if !matches!(
        read_record(&dirs.sandbox(pod)),
        Ok(Some(PodRecord::Sandbox { .. }))
    ) {
        return Vec::new();
    }
    let Ok(rd) = std::fs::read_dir(dirs.sandboxes()) else {
        return Vec::new();
    };
    rd.filter_map(|e| ContainerId::try_from(e.ok()?.file_name().to_str()?).ok())
        .filter(|id| {
            matches!(
                read_record(&dirs.sandbox(id)),
                Ok(Some(PodRecord::Member { pod: p })) if p == pod.as_str()
            )
        })
        .collect()
}

/// What an app container takes from its pod.
#[derive(Debug, Clone)]
pub struct Member {
    pub pod: ContainerId,
    /// The pod's host id block (joined in the allocation file).
    pub ids: IdRange,
    /// The pod's pinned namespaces.
    pub namespaces: PodNamespaces,
    /// The pod's saved ceiling.
    pub ceiling: Ceiling,
    /// The pod's effective policy (its ceiling narrowed by the pod's annotations).
    pub policy: SandboxPolicy,
    /// The pod's credential placeholders: its proxy serves every member, so they are the
    /// members' too.
    pub placeholders: std::collections::BTreeMap<String, String>,
    /// The annotations of the pod's hardened spec.
    annotations: std::collections::HashMap<String, String>,
}

impl Member {
    /// Loads the pod of app container `id` and joins its host id block. The pod's sandbox
    /// container must exist in this runtime's state, be a pod sandbox and not have stopped.
    pub fn join(runtime: &impl PodStates, id: &ContainerId, pod: &ContainerId) -> Result<Self> {
        if crate::state::paths::rootless().unwrap_or(true) {
            return Err(PodError::Rootless);
        }
        let dirs = runtime.dirs();
        let pod_dir = dirs.sandbox(pod);
        let status = match runtime.status(pod) {
            Ok(Some(status)) => status,
            Ok(None) => {
                return Err(PodError::NoSandbox {
                    pod: pod.as_str().to_owned(),
                });
            }
            Err(source) => {
                return Err(PodError::Load {
                    pod: pod.as_str().to_owned(),
                    source,
                });
            }
        };
        let Some(PodRecord::Sandbox {
            user,
            network,
            ipc,
            uts,
        }) = read_record(&pod_dir)?
        else {
            return Err(PodError::NotASandbox {
                pod: pod.as_str().to_owned(),
            });
        };
        if status == ContainerStatus::Stopped {
            return Err(PodError::Stopped {
                pod: pod.as_str().to_owned(),
            });
        }
        let namespaces = PodNamespaces {
            user,
            network,
            ipc,
            uts,
        };
        for path in [
            &namespaces.user,
            &namespaces.network,
            &namespaces.ipc,
            &namespaces.uts,
        ] {
            if !path.exists() {
                return Err(PodError::PinMissing { path: path.clone() });
            }
        }
        let ceiling = Ceiling::load_saved(&pod_dir).map_err(|source| PodError::PodPolicy {
            pod: pod.as_str().to_owned(),
            source: Box::new(source),
        })?;
        let config = pod_dir.hardened_spec();
        let hardened = Spec::load(&config).map_err(|source| PodError::PodSpec {
            pod: pod.as_str().to_owned(),
            path: config.clone(),
            source: Box::new(source),
        })?;
        let plan = crate::harden::saved_plan(&pod_dir, &hardened).map_err(|source| {
            PodError::PodPolicy {
                pod: pod.as_str().to_owned(),
                source: Box::new(source),
            }
        })?;
        let ids = idmap::join(&dirs.idmap_db(), &dirs.idmap_lock(), id, pod)?;
        Ok(Self {
            pod: pod.clone(),
            ids,
            namespaces,
            ceiling,
            policy: plan.policy,
            placeholders: plan.credential_placeholders,
            annotations: hardened.annotations().clone().unwrap_or_default(),
        })
    }

    /// Refuses a member whose effective network policy differs from the pod's (one proxy
    /// and one network namespace serve the whole pod), naming the annotation responsible.
    pub fn check_policy(&self, effective: &SandboxPolicy, spec: &Spec) -> Result<()> {
        if effective.network == self.policy.network {
            return Ok(());
        }
        let mine = spec.annotations().clone().unwrap_or_default();
        let mut differing: Vec<&String> = mine
            .iter()
            .filter(|(k, v)| {
                k.starts_with(ANNOTATION_PREFIX) && self.annotations.get(*k) != Some(v)
            })
            .map(|(k, _)| k)
            .collect();
        differing.extend(
            self.annotations
                .keys()
                .filter(|k| k.starts_with(ANNOTATION_PREFIX) && !mine.contains_key(*k)),
        );
        differing.sort();
        let annotation = differing
            .first()
            .map(|k| (*k).clone())
            .unwrap_or_else(|| format!("{ANNOTATION_PREFIX}*"));
        Err(PodError::NetworkDiffers { annotation })
    }

    /// Records the membership in the member's state dir.
    pub fn record(&self, sandbox_dir: &SandboxDir) -> Result<()> {
        write_record(
            sandbox_dir,
            &PodRecord::Member {
                pod: self.pod.as_str().to_owned(),
            },
        )
    }
}

/// After a pod's sandbox container is created: pins its user, network, IPC and UTS
/// namespaces under `mount_dir/ns/` (the pins live as long as the sandbox's mounts) and
/// records them for the pod's app containers.
pub fn pin_sandbox(sandbox_dir: &SandboxDir, mount_dir: &Path, pid: i32) -> Result<PodNamespaces> {
    let pinned = pins(mount_dir);
    let dir = mount_dir.join("ns");
    mounts::mkdir_traversable(&dir).map_err(|source| PodError::Pin {
        kind: "pins",
        path: dir.clone(),
        source,
    })?;
    for (kind, proc_name, path) in [
        ("user", "user", &pinned.user),
        ("network", "net", &pinned.network),
        ("IPC", "ipc", &pinned.ipc),
        ("UTS", "uts", &pinned.uts),
    ] {
        let src = PathBuf::from(format!("/proc/{pid}/ns/{proc_name}"));
        mounts::bind(&src, path, false).map_err(|source| PodError::Pin {
            kind,
            path: path.clone(),
            source,
        })?;
    }
    write_record(
        sandbox_dir,
        &PodRecord::Sandbox {
            user: pinned.user.clone(),
            network: pinned.network.clone(),
            ipc: pinned.ipc.clone(),
            uts: pinned.uts.clone(),
        },
    )?;
    Ok(pinned)
}

/// The last check before a member's container is built: the namespaces it joins are
/// exactly its pod's pins, its mount namespace is new, and every other sandbox invariant
/// holds (`enforce::verify`, with the pod's pins standing in for fresh user and network
/// namespaces).
pub fn verify_member(spec: &Spec, member: &Member) -> Result<()> {
    let ns = member.namespaces.clone();
    let mut checked = spec.clone();
    let linux = checked.linux_mut().as_mut().ok_or(PodError::Invariant {
        invariant: "a linux section",
    })?;
    let mut list = linux.namespaces().clone().unwrap_or_default();
    for n in &mut list {
        let want = match n.typ() {
            LinuxNamespaceType::User => Some(&ns.user),
            LinuxNamespaceType::Network => Some(&ns.network),
            LinuxNamespaceType::Ipc => Some(&ns.ipc),
            LinuxNamespaceType::Uts => Some(&ns.uts),
            _ => None,
        };
        match (want, n.path()) {
            (Some(want), Some(got)) if got == want => {
                n.set_path(None);
            }
            (Some(_), _) => {
                return Err(PodError::Invariant {
                    invariant: "user, network, IPC and UTS namespaces are the pod's pins",
                });
            }
            (None, Some(_)) => {
                return Err(PodError::Invariant {
                    invariant: "mount, PID and cgroup namespaces are the container's own",
                });
            }
            (None, None) => {}
        }
    }
    for typ in [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
    ] {
        if !list.iter().any(|n| n.typ() == typ) {
            return Err(PodError::Invariant {
                invariant: "user, network, IPC and UTS namespaces are the pod's pins",
            });
        }
    }
    linux.set_namespaces(Some(list));
    crate::enforce::verify(&checked)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::spec_with_annotations;
    use libcontainer::oci_spec::runtime::LinuxNamespaceBuilder;

    fn id(s: &str) -> ContainerId {
        ContainerId::try_from(s).unwrap()
    }

    #[test]
    fn roles_come_from_the_cri_annotations() {
        assert_eq!(
            role(&spec_with_annotations(&[]), &id("c")).unwrap(),
            Role::Alone
        );
        let sandbox = spec_with_annotations(&[
            (CONTAINER_TYPE_ANNOTATION, "sandbox"),
            (SANDBOX_ID_ANNOTATION, "p1"),
        ]);
        assert_eq!(role(&sandbox, &id("p1")).unwrap(), Role::Sandbox);
        let member = spec_with_annotations(&[
            (CONTAINER_TYPE_ANNOTATION, "container"),
            (SANDBOX_ID_ANNOTATION, "p1"),
        ]);
        assert_eq!(
            role(&member, &id("c1")).unwrap(),
            Role::Member { pod: id("p1") }
        );
    }

    #[test]
    fn malformed_pod_annotations_are_named() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 5] = [
            (
                &[(CONTAINER_TYPE_ANNOTATION, "pause")],
                "c1",
                CONTAINER_TYPE_ANNOTATION,
            ),
            (
                &[(CONTAINER_TYPE_ANNOTATION, "container")],
                "c1",
                SANDBOX_ID_ANNOTATION,
            ),
            (
                &[
                    (CONTAINER_TYPE_ANNOTATION, "container"),
                    (SANDBOX_ID_ANNOTATION, "../p"),
                ],
                "c1",
                SANDBOX_ID_ANNOTATION,
            ),
            (
                &[
                    (CONTAINER_TYPE_ANNOTATION, "sandbox"),
                    (SANDBOX_ID_ANNOTATION, "other"),
                ],
                "p1",
                SANDBOX_ID_ANNOTATION,
            ),
            (
                &[
                    (CONTAINER_TYPE_ANNOTATION, "container"),
                    (SANDBOX_ID_ANNOTATION, "c1"),
                ],
                "c1",
                SANDBOX_ID_ANNOTATION,
            ),
        ];
        for (annotations, cid, named) in cases {
            let err = role(&spec_with_annotations(annotations), &id(cid)).unwrap_err();
            assert!(err.to_string().contains(named), "{err}");
        }
    }

    fn member_for(ns: PodNamespaces) -> Member {
        Member {
            pod: id("p1"),
            ids: IdRange {
                host_start: 1_000_000,
                size: 65536,
            },
            namespaces: ns,
            ceiling: Ceiling::load(None).unwrap(),
            policy: SandboxPolicy::builtin("agent").unwrap(),
            placeholders: Default::default(),
            annotations: Default::default(),
        }
    }

    #[test]
    fn member_must_join_exactly_the_pins() {
        let ns = pins(Path::new("/run/agent-sandbox/mnt/t/p1"));
        let member = member_for(ns.clone());
        let mut spec = Spec::default();
        let mk = |typ, path: Option<&PathBuf>| {
            let mut b = LinuxNamespaceBuilder::default().typ(typ);
            if let Some(p) = path {
                b = b.path(p.clone());
            }
            b.build().unwrap()
        };
        let good = vec![
            mk(LinuxNamespaceType::User, Some(&ns.user)),
            mk(LinuxNamespaceType::Network, Some(&ns.network)),
            mk(LinuxNamespaceType::Ipc, Some(&ns.ipc)),
            mk(LinuxNamespaceType::Uts, Some(&ns.uts)),
            mk(LinuxNamespaceType::Mount, None),
            mk(LinuxNamespaceType::Pid, None),
        ];
        let mut linux = spec.linux().clone().unwrap();
        linux.set_namespaces(Some(good.clone()));
        spec.set_linux(Some(linux.clone()));
        // Namespaces are right; the default spec then fails the later invariants (no
        // mappings), which shows the namespace part passed.
        assert!(matches!(
            verify_member(&spec, &member),
            Err(PodError::Enforce(_))
        ));
        let cri_path = PathBuf::from("/proc/4242/ns/net");
        let mut bad = good.clone();
        bad[1] = mk(LinuxNamespaceType::Network, Some(&cri_path));
        linux.set_namespaces(Some(bad));
        spec.set_linux(Some(linux.clone()));
        assert!(matches!(
            verify_member(&spec, &member),
            Err(PodError::Invariant { .. })
        ));
        let mut shared_mnt = good.clone();
        shared_mnt[4] = mk(LinuxNamespaceType::Mount, Some(&cri_path));
        linux.set_namespaces(Some(shared_mnt));
        spec.set_linux(Some(linux.clone()));
        assert!(matches!(
            verify_member(&spec, &member),
            Err(PodError::Invariant { .. })
        ));
        let mut fresh_user = good;
        fresh_user[0] = mk(LinuxNamespaceType::User, None);
        linux.set_namespaces(Some(fresh_user));
        spec.set_linux(Some(linux));
        assert!(matches!(
            verify_member(&spec, &member),
            Err(PodError::Invariant { .. })
        ));
    }

    /// The runtime as the pod model sees it: a state root and a pod sandbox's status.
    struct FakeStates {
        dirs: StateDirs,
        status: std::result::Result<Option<ContainerStatus>, &'static str>,
    }

    impl PodStates for FakeStates {
        fn dirs(&self) -> &StateDirs {
            &self.dirs
        }

        fn status(
            &self,
            _pod: &ContainerId,
        ) -> std::result::Result<Option<ContainerStatus>, Box<dyn std::error::Error + Send + Sync>>
        {
            self.status.map_err(Into::into)
        }
    }

    #[test]
    fn a_member_joins_only_a_live_pod_sandbox() {
        let root = tempfile::tempdir().unwrap();
        let dirs = StateDirs::new(root.path().to_owned());
        let (me, pod) = (id("c1"), id("p1"));
        let join = |status| {
            let states = FakeStates {
                dirs: dirs.clone(),
                status,
            };
            Member::join(&states, &me, &pod).unwrap_err()
        };
        if crate::state::paths::rootless().unwrap_or(true) {
            // A rootless runtime has no id blocks to share: refused before anything is read.
            assert!(matches!(join(Ok(None)), PodError::Rootless));
            return;
        }
        assert!(matches!(join(Ok(None)), PodError::NoSandbox { .. }));
        let load = join(Err("state.json is cut short"));
        assert!(
            matches!(&load, PodError::Load { pod, source } if pod == "p1" && source.to_string() == "state.json is cut short"),
            "{load:?}"
        );
        // A container that was not created as a pod sandbox has no pod record, or a
        // member's.
        let pod_dir = dirs.sandbox(&pod);
        std::fs::create_dir_all(pod_dir.path()).unwrap();
        let running = || Ok(Some(ContainerStatus::Running));
        assert!(matches!(join(running()), PodError::NotASandbox { .. }));
        write_record(
            &pod_dir,
            &PodRecord::Member {
                pod: "other".into(),
            },
        )
        .unwrap();
        assert!(matches!(join(running()), PodError::NotASandbox { .. }));
        let ns = pins(&root.path().join("mnt"));
        write_record(
            &pod_dir,
            &PodRecord::Sandbox {
                user: ns.user.clone(),
                network: ns.network.clone(),
                ipc: ns.ipc.clone(),
                uts: ns.uts.clone(),
            },
        )
        .unwrap();
        assert!(matches!(
            join(Ok(Some(ContainerStatus::Stopped))),
            PodError::Stopped { .. }
        ));
        // The pins are gone (the pod's mounts were cleaned up): named, not followed.
        assert!(matches!(join(running()), PodError::PinMissing { path } if path == ns.user),);
        // A malformed pod record names the file.
        std::fs::write(pod_dir.pod().path(), "{").unwrap();
        let bad = join(running());
        assert!(bad.to_string().contains("pod.json"), "{bad}");
    }

    #[test]
    fn member_network_must_match_the_pod() {
        let member = member_for(pins(Path::new("/x")));
        let spec = spec_with_annotations(&[("io.agent.sandbox.network", "none")]);
        assert!(member.check_policy(&member.policy.clone(), &spec).is_ok());
        // The agent profile's pod has the proxy; the member asks for no network.
        assert_eq!(
            member.policy.network.mode,
            agent_sandbox_policy::policy::NetworkMode::Proxy
        );
        let mut narrowed = member.policy.clone();
        narrowed.network.allow.truncate(0);
        narrowed.network.mode = agent_sandbox_policy::policy::NetworkMode::None;
        let err = member.check_policy(&narrowed, &spec).unwrap_err();
        assert!(
            err.to_string().contains("io.agent.sandbox.network"),
            "{err}"
        );
    }
}

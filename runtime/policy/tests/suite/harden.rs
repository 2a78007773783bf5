//! Spec hardening against realistic incoming specs (oci-spec's default spec is the one
//! `runc spec` writes, with the podman-style mounts added).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{
    self, HardenError, HardenedSpec, HostFacts, IdMapping, OverlayDirs,
};
use agent_sandbox_policy::policy::NetworkMode;
use agent_sandbox_policy::profiles::{AdminProfile, ProfileName};
use oci_spec::runtime::{
    LinuxCapabilities, LinuxDeviceBuilder, LinuxDeviceType, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder, Mount, MountBuilder, Process,
    Spec,
};

pub fn ctx() -> HostFacts {
    HostFacts {
        uid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 200_000,
            size: 65536,
        }],
        gid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 200_000,
            size: 65536,
        }],
        parent_root_unprivileged: false,
        workspace: Some(OverlayDirs {
            upper: "/run/agent-sandbox/c1/upper".into(),
            work: "/run/agent-sandbox/c1/work".into(),
        }),
        protected: Vec::new(),
        network_namespace: None,
        user_namespace: None,
        pod: None,
        host_namespaces: Vec::new(),
        placeholders: Some(harden::Placeholders {
            file: "/run/agent-sandbox/mnt/c1/placeholder/file".into(),
            dir: "/run/agent-sandbox/mnt/c1/placeholder/dir".into(),
        }),
        profile: None,
        support: Default::default(),
    }
}

fn bind(src: &str, dst: &str, opts: &[&str]) -> Mount {
    MountBuilder::default()
        .destination(dst)
        .typ("bind")
        .source(src)
        .options(opts.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        .build()
        .unwrap()
}

/// `runc spec`'s default plus podman-style binds and the workspace.
pub fn podman_like_spec() -> Spec {
    let mut spec = Spec::default();
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(bind("/var/lib/c/hosts", "/etc/hosts", &["rbind", "rw"]));
    mounts.push(bind("/srv/project", "/workspace", &["rbind", "rw"]));
    mounts.push(bind("/dev/null", "/dev/null", &["rbind"]));
    mounts.push(
        MountBuilder::default()
            .destination("/tmp")
            .typ("tmpfs")
            .source("tmpfs")
            .options(vec!["rw".to_owned(), "size=100g".to_owned()])
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    spec
}

/// Asserts that `process` has every capability set, each empty.
pub fn assert_no_capability(process: &Process) {
    let caps = process.capabilities().as_ref().unwrap();
    for set in [
        caps.bounding(),
        caps.effective(),
        caps.permitted(),
        caps.inheritable(),
        caps.ambient(),
    ] {
        assert!(
            set.as_ref().is_some_and(|s| s.is_empty()),
            "capability kept: {set:?}"
        );
    }
}

/// `podman_like_spec()` with `mount` added.
fn with_mount(mount: Mount) -> Spec {
    let mut spec = podman_like_spec();
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    spec
}

/// A tmpfs at `dst`, without options.
fn tmpfs(dst: &str) -> Mount {
    MountBuilder::default()
        .destination(dst)
        .typ("tmpfs")
        .source("tmpfs")
        .build()
        .unwrap()
}

fn agent() -> SandboxPolicy {
    SandboxPolicy::builtin("agent").unwrap()
}

/// The error hardening `spec` under the agent policy gives.
fn refusal(spec: Spec) -> HardenError {
    harden::harden_spec(spec, &agent(), &ctx()).unwrap_err()
}

fn harden_ok(spec: Spec, policy: &SandboxPolicy, ctx: &HostFacts) -> HardenedSpec {
    harden::harden_spec(spec, policy, ctx).unwrap_or_else(|e| panic!("{e}: {e:?}"))
}

fn mount_at<'a>(spec: &'a Spec, dest: &str) -> Vec<&'a Mount> {
    spec.mounts()
        .as_ref()
        .unwrap()
        .iter()
        .filter(|m| m.destination() == Path::new(dest))
        .collect()
}

fn opts(m: &Mount) -> Vec<String> {
    m.options().clone().unwrap_or_default()
}

#[test]
fn default_spec_gets_every_protection() {
    let HardenedSpec {
        spec,
        policy,
        clamped,
    } = harden_ok(podman_like_spec(), &agent(), &ctx());
    assert_eq!(policy, agent());
    // `runc spec`'s default capabilities (in every set) and its lack of a seccomp profile are
    // engine defaults the sandbox narrows: each is reported, nothing is refused.
    let keys: Vec<&str> = clamped.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "process.capabilities.bounding",
            "process.capabilities.effective",
            "process.capabilities.permitted",
            "process.capabilities.inheritable",
            "process.capabilities.ambient",
            "linux.seccomp",
        ],
        "{clamped:?}"
    );
    assert_eq!(
        clamped[0].requested,
        "CAP_AUDIT_WRITE,CAP_KILL,CAP_NET_BIND_SERVICE"
    );
    assert_eq!(clamped[0].granted, "none");
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.no_new_privileges(), Some(true));
    assert_no_capability(process);
    let linux = spec.linux().as_ref().unwrap();
    let ns = linux.namespaces().as_ref().unwrap();
    for typ in [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Pid,
    ] {
        let n = ns.iter().find(|n| n.typ() == typ).unwrap();
        assert_eq!(n.path(), &None);
    }
    let uid = &linux.uid_mappings().as_ref().unwrap()[0];
    assert_eq!(
        (uid.container_id(), uid.host_id(), uid.size()),
        (0, 200_000, 65536)
    );
    assert!(linux.seccomp().is_some());
    let masked = linux.masked_paths().as_ref().unwrap();
    assert!(masked.contains(&"/proc/kcore".to_owned()));
    assert!(
        linux
            .readonly_paths()
            .as_ref()
            .unwrap()
            .contains(&"/proc/sys".to_owned())
    );
    let res = linux.resources().as_ref().unwrap();
    assert_eq!(res.memory().unwrap().limit(), Some(2 << 30));
    assert_eq!(res.memory().unwrap().swap(), Some(2 << 30));
    assert_eq!(res.pids().unwrap().limit(), 1024);
    let devices = res.devices().as_ref().unwrap();
    assert!(!devices[0].allow());

    // Scratch: the incoming 100g /tmp is replaced by the policy's 512M tmpfs.
    let tmp = mount_at(&spec, "/tmp");
    assert_eq!(tmp.len(), 1);
    assert!(opts(tmp[0]).contains(&format!("size={}", 512u64 << 20)));
    // Other binds are read-only.
    let hosts = mount_at(&spec, "/etc/hosts");
    assert!(opts(hosts[0]).contains(&"ro".to_owned()));
    assert!(!opts(hosts[0]).contains(&"rw".to_owned()));
    // sysfs is read-only.
    let sys = mount_at(&spec, "/sys");
    assert!(opts(sys[0]).contains(&"ro".to_owned()));
}

#[test]
fn workspace_becomes_an_overlay_with_protected_binds_on_top() {
    let policy = agent();
    let spec = podman_like_spec();
    let candidates = harden::protected_path_candidates(&spec, &policy);
    let hooks = candidates
        .iter()
        .find(|c| c.container_path == Path::new("/workspace/.git/hooks"))
        .unwrap()
        .clone();
    assert_eq!(hooks.host_path, PathBuf::from("/srv/project/.git/hooks"));
    assert!(hooks.dir);
    assert!(
        candidates
            .iter()
            .any(|c| c.container_path == Path::new("/workspace/.bashrc"))
    );
    let mut ctx = ctx();
    ctx.protected = vec![hooks.clone()];
    let out = harden_ok(spec, &policy, &ctx).spec;
    let mounts = out.mounts().as_ref().unwrap();
    let overlay_idx = mounts
        .iter()
        .position(|m| m.destination() == Path::new("/workspace"))
        .unwrap();
    let overlay = &mounts[overlay_idx];
    assert_eq!(overlay.typ().as_deref(), Some("overlay"));
    let o = opts(overlay);
    assert!(o.contains(&"lowerdir=/srv/project".to_owned()));
    assert!(o.contains(&"upperdir=/run/agent-sandbox/c1/upper".to_owned()));
    let hooks_idx = mounts
        .iter()
        .position(|m| m.destination() == Path::new("/workspace/.git/hooks"))
        .unwrap();
    assert!(
        hooks_idx > overlay_idx,
        "protected bind must come after the overlay"
    );
    let h = &mounts[hooks_idx];
    assert_eq!(
        h.source().as_deref(),
        Some(Path::new("/srv/project/.git/hooks"))
    );
    assert!(opts(h).contains(&"ro".to_owned()));
    // No bind of the workspace itself survives (it would be writable through to the host).
    assert_eq!(mount_at(&out, "/workspace").len(), 1);
}

#[test]
fn workspace_without_overlay_dirs_is_an_error() {
    let mut ctx = ctx();
    ctx.workspace = None;
    let err = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap_err();
    assert!(
        matches!(err, HardenError::MissingOverlayDirs { .. }),
        "{err}"
    );
}

#[test]
fn protected_names_in_workspace_subdirectories_are_bound_and_others_refused() {
    let policy = agent();
    let spec = podman_like_spec();
    let envrc = agent_sandbox_policy::value::ProtectedName::try_from(".envrc".to_owned()).unwrap();
    let nested = harden::protected_path_at(&spec, &policy, Path::new("pkg/sub"), &envrc).unwrap();
    assert_eq!(
        nested.host_path,
        PathBuf::from("/srv/project/pkg/sub/.envrc")
    );
    assert_eq!(
        nested.container_path,
        PathBuf::from("/workspace/pkg/sub/.envrc")
    );
    assert!(harden::protected_path_at(&spec, &policy, Path::new("../up"), &envrc).is_none());
    let mut ctx = ctx();
    ctx.protected = vec![nested.clone()];
    let out = harden_ok(spec.clone(), &policy, &ctx).spec;
    assert!(out.mounts().as_ref().unwrap().iter().any(|m| {
        m.destination() == Path::new("/workspace/pkg/sub/.envrc")
            && m.options().as_ref().unwrap().contains(&"ro".to_owned())
    }));
    // The same name under another directory of the container, or an unprotected name, is not
    // a candidate.
    for wrong in [
        harden::ProtectedMount {
            container_path: "/workspace/other/.envrc".into(),
            ..nested.clone()
        },
        harden::ProtectedMount {
            container_path: "/workspace/pkg/sub/notes.txt".into(),
            host_path: "/srv/project/pkg/sub/notes.txt".into(),
            dir: false,
            secret: false,
        },
    ] {
        let mut bad = self::ctx();
        bad.protected = vec![wrong];
        let err = harden::harden_spec(spec.clone(), &policy, &bad).unwrap_err();
        assert!(
            matches!(err, HardenError::UnexpectedProtectedPath { .. }),
            "{err}"
        );
    }
}

#[test]
fn unexpected_protected_path_is_an_error() {
    let mut ctx = ctx();
    ctx.protected = vec![harden::ProtectedMount {
        container_path: "/etc".into(),
        host_path: "/etc".into(),
        dir: true,
        secret: false,
    }];
    let err = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap_err();
    assert!(
        matches!(err, HardenError::UnexpectedProtectedPath { .. }),
        "{err}"
    );
}

/// A credential store in the workspace is masked: the empty placeholder of its kind is bound
/// read-only over it, never its host path; a runtime that calls it no secret, or gives no
/// placeholders, is refused.
#[test]
fn credential_stores_in_the_workspace_are_masked_with_placeholders() {
    let policy = agent();
    let spec = podman_like_spec();
    let name =
        |n: &str| agent_sandbox_policy::value::ProtectedName::try_from(n.to_owned()).unwrap();
    let ssh = harden::protected_path_at(&spec, &policy, Path::new("home"), &name(".ssh/")).unwrap();
    let netrc = harden::protected_path_at(&spec, &policy, Path::new(""), &name(".netrc")).unwrap();
    let envrc = harden::protected_path_at(&spec, &policy, Path::new(""), &name(".envrc")).unwrap();
    assert!(ssh.secret && netrc.secret && !envrc.secret);
    let mut ctx = ctx();
    ctx.placeholders = Some(harden::Placeholders {
        file: "/run/agent-sandbox/c1/placeholder/file".into(),
        dir: "/run/agent-sandbox/c1/placeholder/dir".into(),
    });
    ctx.protected = vec![ssh.clone(), netrc.clone(), envrc.clone()];
    let out = harden_ok(spec.clone(), &policy, &ctx).spec;
    let source_at = |dest: &str| {
        let m = out
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .rfind(|m| m.destination() == Path::new(dest))
            .unwrap_or_else(|| panic!("no mount at {dest}"));
        assert!(
            m.options().as_ref().unwrap().contains(&"ro".to_owned()),
            "{dest}"
        );
        m.source().clone().unwrap()
    };
    assert_eq!(
        source_at("/workspace/home/.ssh"),
        PathBuf::from("/run/agent-sandbox/c1/placeholder/dir")
    );
    assert_eq!(
        source_at("/workspace/.netrc"),
        PathBuf::from("/run/agent-sandbox/c1/placeholder/file")
    );
    assert_eq!(source_at("/workspace/.envrc"), envrc.host_path);
    // A policy's own name beneath a mask (`.ssh/config`) is not bound over it.
    let mut inner = policy.clone();
    inner.filesystem.protected.push(name(".ssh/config"));
    let config =
        harden::protected_path_at(&spec, &inner, Path::new("home"), &name(".ssh/config")).unwrap();
    assert!(!config.secret);
    let mut both = ctx.clone();
    both.protected = vec![ssh.clone(), config];
    let out = harden_ok(spec.clone(), &inner, &both).spec;
    assert!(
        !out.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.destination() == Path::new("/workspace/home/.ssh/config")),
        "a bind beneath the mask of .ssh/"
    );
    // Under-reporting a secret is refused, as is a mask without placeholders.
    let mut lying = ctx.clone();
    lying.protected = vec![harden::ProtectedMount {
        secret: false,
        ..ssh.clone()
    }];
    let err = harden::harden_spec(spec.clone(), &policy, &lying).unwrap_err();
    assert!(
        matches!(err, HardenError::UnexpectedProtectedPath { .. }),
        "{err}"
    );
    let mut bare = ctx.clone();
    bare.placeholders = None;
    bare.protected = vec![netrc];
    let err = harden::harden_spec(spec, &policy, &bare).unwrap_err();
    assert!(
        matches!(err, HardenError::MissingMaskPlaceholders { .. }),
        "{err}"
    );
}

#[test]
fn host_network_path_is_stripped() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    let mut ns = linux.namespaces().clone().unwrap();
    ns.retain(|n| n.typ() != LinuxNamespaceType::Network);
    ns.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Network)
            .path("/proc/1/ns/net")
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(ns));
    spec.set_linux(Some(linux));
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    let net = out
        .linux()
        .as_ref()
        .unwrap()
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::Network)
        .unwrap()
        .clone();
    assert_eq!(net.path(), &None);
}

#[test]
fn host_root_mapping_is_refused() {
    let mut ctx = ctx();
    ctx.uid_mappings[0].host_id = 0;
    let err = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap_err();
    assert!(matches!(err, HardenError::HostRootMapping { .. }), "{err}");
    // Rootless: id 0 of the runtime's namespace is the invoking user, and may be mapped.
    ctx.gid_mappings[0].host_id = 0;
    ctx.parent_root_unprivileged = true;
    let hardened = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap();
    let linux = hardened.spec.linux().as_ref().unwrap();
    assert_eq!(linux.uid_mappings().as_ref().unwrap()[0].host_id(), 0);
    let mut ctx = self::ctx();
    ctx.gid_mappings[0].size = 1 << 20;
    let err = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap_err();
    assert!(matches!(err, HardenError::MappingTooLarge { .. }), "{err}");
}

#[test]
fn capabilities_are_the_intersection_of_spec_and_policy() {
    let policy = SandboxPolicy::parse(
        "[privileges]\ncapabilities = [\"CAP_CHOWN\", \"CAP_KILL\"]\n",
        "t.toml",
    )
    .unwrap();
    let mut spec = podman_like_spec();
    let mut process = spec.process().clone().unwrap();
    let wanted: oci_spec::runtime::Capabilities = [
        oci_spec::runtime::Capability::Chown,
        oci_spec::runtime::Capability::Mknod,
        oci_spec::runtime::Capability::NetRaw,
    ]
    .into_iter()
    .collect();
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(wanted.clone()));
    caps.set_effective(Some(wanted.clone()));
    caps.set_ambient(Some(wanted));
    caps.set_permitted(Some(oci_spec::runtime::Capabilities::new()));
    process.set_capabilities(Some(caps));
    spec.set_process(Some(process));
    let out = harden_ok(spec, &policy, &ctx()).spec;
    let caps = out
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .clone()
        .unwrap();
    let only_chown: oci_spec::runtime::Capabilities =
        [oci_spec::runtime::Capability::Chown].into_iter().collect();
    assert_eq!(caps.bounding().as_ref(), Some(&only_chown));
    assert_eq!(caps.effective().as_ref(), Some(&only_chown));
    assert!(caps.permitted().as_ref().unwrap().is_empty());
}

#[test]
fn resources_take_the_smaller_of_spec_and_policy() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_resources(Some(
        LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(256i64 << 20)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    ));
    spec.set_linux(Some(linux.clone()));
    let out = harden_ok(spec.clone(), &agent(), &ctx()).spec;
    let mem = out
        .linux()
        .as_ref()
        .unwrap()
        .resources()
        .as_ref()
        .unwrap()
        .memory()
        .unwrap();
    assert_eq!(mem.limit(), Some(256 << 20));

    linux.set_resources(Some(
        LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(64i64 << 30)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    ));
    spec.set_linux(Some(linux));
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    let mem = out
        .linux()
        .as_ref()
        .unwrap()
        .resources()
        .as_ref()
        .unwrap()
        .memory()
        .unwrap();
    assert_eq!(mem.limit(), Some(2 << 30));
}

#[test]
fn host_devices_and_extra_writable_mounts_are_refused() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_devices(Some(vec![
        LinuxDeviceBuilder::default()
            .path("/dev/sda")
            .typ(LinuxDeviceType::B)
            .major(8)
            .minor(0)
            .build()
            .unwrap(),
    ]));
    spec.set_linux(Some(linux));
    let err = refusal(spec);
    assert!(matches!(err, HardenError::Device { .. }), "{err}");

    // The same host device with every capability in the bounding set is `--privileged`'s
    // shape: refused with a sentence about privilege that points at the docs.
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_devices(Some(vec![
        LinuxDeviceBuilder::default()
            .path("/dev/autofs")
            .typ(LinuxDeviceType::C)
            .major(10)
            .minor(235)
            .build()
            .unwrap(),
    ]));
    spec.set_linux(Some(linux));
    let mut process = spec.process().clone().unwrap();
    let all: oci_spec::runtime::Capabilities = [
        oci_spec::runtime::Capability::Chown,
        oci_spec::runtime::Capability::SysAdmin,
        oci_spec::runtime::Capability::NetAdmin,
    ]
    .into_iter()
    .collect();
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(all));
    process.set_capabilities(Some(caps));
    spec.set_process(Some(process));
    let err = refusal(spec);
    let text = err.to_string();
    assert!(matches!(err, HardenError::Privileged { .. }), "{err}");
    assert!(
        text.starts_with("privileged containers are refused")
            && text.contains("docs/threat-model.md"),
        "{text}"
    );

    let err = refusal(with_mount(bind("/dev/kvm", "/dev/kvm", &["rbind"])));
    assert!(matches!(err, HardenError::DeviceMount { .. }), "{err}");

    let err = refusal(with_mount(tmpfs("/data")));
    assert!(matches!(err, HardenError::WritableMount { .. }), "{err}");
}

fn with_annotations(pairs: &[(&str, &str)]) -> Spec {
    let mut spec = podman_like_spec();
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    spec.set_annotations(Some(map));
    spec
}

#[test]
fn annotations_narrow() {
    let spec = with_annotations(&[
        (
            "io.agent.sandbox.network.allow",
            "pypi.org:443, files.pythonhosted.org:443",
        ),
        ("io.agent.sandbox.memory", "512M"),
        ("io.agent.sandbox.pids", "64"),
        ("io.agent.sandbox.wall-clock", "10m"),
        ("org.other.key", "ignored"),
    ]);
    let HardenedSpec { spec, policy, .. } = harden_ok(spec, &agent(), &ctx());
    assert_eq!(policy.network.allow.len(), 2);
    assert!(policy.network.allowlist().decide("pypi.org", 443).allowed);
    assert!(!policy.network.allowlist().decide("github.com", 443).allowed);
    assert_eq!(policy.resources.wall_clock.get(), 600);
    let res = spec.linux().as_ref().unwrap().resources().clone().unwrap();
    assert_eq!(res.memory().unwrap().limit(), Some(512 << 20));
    assert_eq!(res.pids().unwrap().limit(), 64);

    let spec = with_annotations(&[("io.agent.sandbox.profile", "strict")]);
    let policy = harden_ok(spec, &agent(), &ctx()).policy;
    assert_eq!(policy.network.mode, NetworkMode::None);

    let spec = with_annotations(&[("io.agent.sandbox.network", "none")]);
    let policy = harden_ok(spec, &agent(), &ctx()).policy;
    assert_eq!(policy.network.mode, NetworkMode::None);

    let mut ceiling = agent();
    ceiling.network.local_ports = vec![8080, 9090];
    let spec = with_annotations(&[("io.agent.sandbox.network.local-ports", " 9090 ")]);
    assert_eq!(
        harden_ok(spec, &ceiling, &ctx()).policy.network.local_ports,
        [9090]
    );
    let spec = with_annotations(&[("io.agent.sandbox.network.local-ports", "")]);
    assert!(
        harden_ok(spec, &ceiling, &ctx())
            .policy
            .network
            .local_ports
            .is_empty()
    );
    for bad in ["0", "80x", "65536"] {
        let pairs = [("io.agent.sandbox.network.local-ports", bad)];
        let err = harden::harden_spec(with_annotations(&pairs), &ceiling, &ctx()).unwrap_err();
        assert!(
            matches!(&err, HardenError::BadAnnotation { annotation, .. } if annotation == pairs[0].0),
            "{bad}: {err}"
        );
    }
}

fn annotation_error(pairs: &[(&str, &str)], ceiling: &SandboxPolicy) -> HardenError {
    harden::harden_spec(with_annotations(pairs), ceiling, &ctx()).unwrap_err()
}

#[test]
fn annotations_that_widen_are_errors_naming_the_annotation() {
    let cases: &[(&str, &str)] = &[
        ("io.agent.sandbox.network.allow", "evil.example"),
        ("io.agent.sandbox.network.allow", "*.github.com"),
        ("io.agent.sandbox.memory", "64G"),
        ("io.agent.sandbox.pids", "100000"),
        ("io.agent.sandbox.wall-clock", "48h"),
        ("io.agent.sandbox.capabilities", "CAP_CHOWN"),
        ("io.agent.sandbox.cpu-quota-us", "900000"),
        ("io.agent.sandbox.network.local-ports", "8080"),
    ];
    for (key, value) in cases {
        let err = annotation_error(&[(key, value)], &agent());
        match &err {
            HardenError::AnnotationWidens { annotation, .. } => assert_eq!(annotation, key),
            other => panic!("{key}={value}: {other}"),
        }
        assert!(err.to_string().contains(key), "{err}");
    }
    let strict = SandboxPolicy::builtin("strict").unwrap();
    let err = annotation_error(&[("io.agent.sandbox.profile", "agent")], &strict);
    assert!(
        matches!(&err, HardenError::AnnotationWidens { annotation, .. } if annotation == "io.agent.sandbox.profile"),
        "{err}"
    );
    let err = annotation_error(&[("io.agent.sandbox.network", "proxy")], &strict);
    assert!(matches!(err, HardenError::AnnotationWidens { .. }), "{err}");
    let err = annotation_error(&[("io.agent.sandbox.network.allow", "pypi.org")], &strict);
    assert!(
        matches!(&err, HardenError::AnnotationWidens { annotation, .. } if annotation == "io.agent.sandbox.network.allow"),
        "{err}"
    );
}

#[test]
fn unknown_or_malformed_annotations_are_errors() {
    let err = annotation_error(&[("io.agent.sandbox.netwrok", "none")], &agent());
    assert!(
        matches!(&err, HardenError::UnknownAnnotation { annotation } if annotation == "io.agent.sandbox.netwrok"),
        "{err}"
    );
    let err = annotation_error(&[("io.agent.sandbox.memory", "lots")], &agent());
    assert!(matches!(err, HardenError::BadAnnotation { .. }), "{err}");
    let err = annotation_error(&[("io.agent.sandbox.network.allow", "*.com")], &agent());
    assert!(matches!(err, HardenError::BadAnnotation { .. }), "{err}");
    // Not built in, and the runtime read no admin profile of that name.
    let err = annotation_error(&[("io.agent.sandbox.profile", "lax")], &agent());
    assert!(
        matches!(&err, HardenError::ProfileNotLoaded { annotation, name } if annotation == "io.agent.sandbox.profile" && name == "lax"),
        "{err}"
    );
}

/// The admin's profile `name`: the agent profile with `allow` as its allow list.
fn admin_profile(name: &str, allow: &[&str]) -> AdminProfile {
    let mut policy = agent();
    policy.network.allow = allow
        .iter()
        .map(|r| agent_sandbox_policy::network::DomainRule::parse(r).unwrap())
        .collect();
    AdminProfile {
        name: ProfileName::try_from(name).unwrap(),
        origin: format!("/etc/agent-sandbox/profiles/{name}.toml"),
        policy,
    }
}

/// A ceiling that allows what the built-in agent profile refuses (an internal registry).
fn wide_ceiling() -> SandboxPolicy {
    admin_profile(
        "ceiling",
        &["pypi.org:443", "registry.corp.example", "collector.example"],
    )
    .policy
}

fn ctx_with(profile: AdminProfile) -> HostFacts {
    HostFacts {
        profile: Some(profile),
        ..ctx()
    }
}

#[test]
fn admin_profile_named_by_the_annotation_applies_within_the_ceiling() {
    let profile = admin_profile("corp-registry", &["registry.corp.example"]);
    let spec = with_annotations(&[("io.agent.sandbox.profile", "corp-registry")]);
    let policy = harden_ok(spec, &wide_ceiling(), &ctx_with(profile.clone())).policy;
    let decide = |host: &str, port| policy.network.allowlist().decide(host, port).allowed;
    // It lets through what the built-in default refuses...
    assert!(decide("registry.corp.example", 443));
    assert!(
        !agent()
            .network
            .allowlist()
            .decide("registry.corp.example", 443)
            .allowed
    );
    // ...and refuses what the ceiling alone would let through.
    assert!(!decide("collector.example", 443));
    assert!(!decide("pypi.org", 443));
    assert!(
        wide_ceiling()
            .network
            .allowlist()
            .decide("collector.example", 443)
            .allowed
    );
    // Other annotations narrow it further, as they narrow a built-in profile.
    let spec = with_annotations(&[
        ("io.agent.sandbox.profile", " corp-registry "),
        ("io.agent.sandbox.network", "none"),
    ]);
    let policy = harden_ok(spec, &wide_ceiling(), &ctx_with(profile)).policy;
    assert_eq!(policy.network.mode, NetworkMode::None);
    // The same context without the annotation: the profile is not applied.
    let policy = harden_ok(
        podman_like_spec(),
        &wide_ceiling(),
        &ctx_with(admin_profile("corp-registry", &["registry.corp.example"])),
    )
    .policy;
    assert!(
        policy
            .network
            .allowlist()
            .decide("collector.example", 443)
            .allowed
    );
}

#[test]
fn admin_profile_wider_than_the_ceiling_is_refused_naming_the_annotation() {
    let profile = admin_profile("wide", &["registry.corp.example", "evil.example"]);
    let spec = with_annotations(&[("io.agent.sandbox.profile", "wide")]);
    let err = harden::harden_spec(spec, &wide_ceiling(), &ctx_with(profile)).unwrap_err();
    assert!(
        matches!(&err, HardenError::AnnotationWidens { annotation, .. } if annotation == "io.agent.sandbox.profile"),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("io.agent.sandbox.profile"), "{text}");
    assert!(text.contains("docs/policy.md"), "{text}");
}

#[test]
fn admin_profile_names_are_hostile_and_never_a_path() {
    for bad in [
        "../../etc/agent-sandbox/wide",
        "/etc/passwd",
        ".hidden",
        "a/b",
        "A",
        "",
    ] {
        let profile = admin_profile("corp", &["registry.corp.example"]);
        let spec = with_annotations(&[("io.agent.sandbox.profile", bad)]);
        let err = harden::harden_spec(spec, &wide_ceiling(), &ctx_with(profile)).unwrap_err();
        assert!(
            matches!(&err, HardenError::BadAnnotation { annotation, .. } if annotation == "io.agent.sandbox.profile"),
            "{bad:?}: {err}"
        );
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("docs/policy.md#profiles-by-annotation"),
            "{chain}"
        );
    }
    // A profile read for another name is not used for this one.
    let spec = with_annotations(&[("io.agent.sandbox.profile", "other")]);
    let err = harden::harden_spec(
        spec,
        &wide_ceiling(),
        &ctx_with(admin_profile("corp", &["registry.corp.example"])),
    )
    .unwrap_err();
    assert!(matches!(err, HardenError::ProfileNotLoaded { .. }), "{err}");
}

#[test]
fn a_builtin_name_means_the_builtin_profile_whatever_the_runtime_read() {
    // An admin file called `strict.toml` is never consulted: `strict` is the built-in.
    let impostor = admin_profile("strict", &["registry.corp.example"]);
    let spec = with_annotations(&[("io.agent.sandbox.profile", "strict")]);
    let policy = harden_ok(spec, &wide_ceiling(), &ctx_with(impostor)).policy;
    assert_eq!(policy.network.mode, NetworkMode::None);
}

/// `spec` with `caps` in its bounding, effective and permitted sets (as engines send them).
fn with_capabilities(caps: &[oci_spec::runtime::Capability]) -> Spec {
    let mut spec = podman_like_spec();
    let mut process = spec.process().clone().unwrap();
    let set: oci_spec::runtime::Capabilities = caps.iter().copied().collect();
    let mut c = LinuxCapabilities::default();
    c.set_bounding(Some(set.clone()));
    c.set_effective(Some(set.clone()));
    c.set_permitted(Some(set));
    c.set_inheritable(None);
    c.set_ambient(None);
    process.set_capabilities(Some(c));
    spec.set_process(Some(process));
    spec
}

#[test]
fn a_capability_no_engine_sends_by_default_is_refused_naming_the_key() {
    use oci_spec::runtime::Capability as C;
    for cap in [C::NetAdmin, C::SysAdmin, C::SysPtrace, C::SysModule] {
        let err =
            harden::harden_spec(with_capabilities(&[C::Chown, cap]), &agent(), &ctx()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, HardenError::Widens { key, .. } if key == "process.capabilities.bounding"),
            "{text}"
        );
        assert!(text.contains("docs/policy.md#widening-requests"), "{text}");
        assert!(
            !text.contains("not permitted") && !text.contains("permission denied"),
            "{text}"
        );
    }
    // The same capability through an exec's process spec.
    let process = with_capabilities(&[C::NetAdmin]).process().clone().unwrap();
    let err = harden::harden_process(process, &agent()).unwrap_err();
    assert!(matches!(err, HardenError::Widens { .. }), "{err}");
    // A policy that grants it lets it through.
    let policy = SandboxPolicy::parse(
        "[privileges]\ncapabilities = [\"CAP_NET_BIND_SERVICE\"]\n",
        "t.toml",
    )
    .unwrap();
    let out = harden_ok(
        with_capabilities(&[C::NetBindService, C::NetRaw]),
        &policy,
        &ctx(),
    );
    let bounding = out
        .clamped
        .iter()
        .find(|c| c.key == "process.capabilities.bounding");
    assert_eq!(
        bounding.map(|c| (c.requested.as_str(), c.granted.as_str())),
        Some(("CAP_NET_BIND_SERVICE,CAP_NET_RAW", "CAP_NET_BIND_SERVICE"))
    );
}

#[test]
fn every_engines_default_capability_set_is_clamped_and_reported() {
    use oci_spec::runtime::Capability as C;
    // Docker's and containerd's 14 (podman's 11 are a subset).
    let docker = [
        C::AuditWrite,
        C::Chown,
        C::DacOverride,
        C::Fowner,
        C::Fsetid,
        C::Kill,
        C::Mknod,
        C::NetBindService,
        C::NetRaw,
        C::Setfcap,
        C::Setgid,
        C::Setpcap,
        C::Setuid,
        C::SysChroot,
    ];
    let out = harden_ok(with_capabilities(&docker), &agent(), &ctx());
    let caps: Vec<&harden::Clamp> = out
        .clamped
        .iter()
        .filter(|c| c.key.starts_with("process.capabilities."))
        .collect();
    assert_eq!(caps.len(), 3, "{caps:?}");
    assert!(
        caps.iter()
            .all(|c| c.granted == "none" && c.requested.split(',').count() == 14)
    );
    assert_eq!(harden::ENGINE_DEFAULT_CAPABILITIES.len(), 14);
}

fn without_namespace(typ: LinuxNamespaceType) -> Spec {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    let mut ns = linux.namespaces().clone().unwrap();
    ns.retain(|n| n.typ() != typ);
    linux.set_namespaces(Some(ns));
    spec.set_linux(Some(linux));
    spec
}

#[test]
fn host_network_pid_ipc_and_uts_namespaces_are_refused_naming_the_key() {
    for (typ, key) in [
        (LinuxNamespaceType::Network, "linux.namespaces[network]"),
        (LinuxNamespaceType::Pid, "linux.namespaces[pid]"),
        (LinuxNamespaceType::Ipc, "linux.namespaces[ipc]"),
        (LinuxNamespaceType::Uts, "linux.namespaces[uts]"),
    ] {
        let err = harden::harden_spec(without_namespace(typ), &agent(), &ctx()).unwrap_err();
        assert!(
            matches!(&err, HardenError::Widens { key: k, .. } if k == key),
            "{key}: {err}"
        );
        assert!(err.to_string().starts_with(key), "{err}");
    }
    // A path the runtime found to be its own (host) namespace: Docker's `--network host`.
    let mut host = ctx();
    host.host_namespaces = vec![LinuxNamespaceType::Network];
    let mut spec = without_namespace(LinuxNamespaceType::Network);
    let mut linux = spec.linux().clone().unwrap();
    let mut ns = linux.namespaces().clone().unwrap();
    ns.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Network)
            .path("/run/docker/netns/default")
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(ns));
    spec.set_linux(Some(linux));
    let err = harden::harden_spec(spec.clone(), &agent(), &host).unwrap_err();
    assert!(
        matches!(&err, HardenError::Widens { key, .. } if key == "linux.namespaces[network]"),
        "{err}"
    );
    // Another namespace's path is clamped to a new one.
    let out = harden_ok(spec, &agent(), &ctx());
    assert!(
        out.clamped
            .iter()
            .any(|c| c.key == "linux.namespaces[network]"
                && c.requested == "path /run/docker/netns/default")
    );
    // The host's cgroup namespace (podman's and Docker's default on cgroup v1) is clamped.
    let out = harden_ok(
        without_namespace(LinuxNamespaceType::Cgroup),
        &agent(),
        &ctx(),
    );
    let cgroup = out
        .clamped
        .iter()
        .find(|c| c.key == "linux.namespaces[cgroup]")
        .unwrap();
    assert_eq!(cgroup.granted, "a new namespace");
}

#[test]
fn resources_above_the_policy_are_clamped_and_reported() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    let mut res = LinuxResourcesBuilder::default()
        .memory(
            LinuxMemoryBuilder::default()
                .limit(8i64 << 30)
                .swap(16i64 << 30)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let mut pids = oci_spec::runtime::LinuxPids::default();
    pids.set_limit(2048);
    res.set_pids(Some(pids));
    linux.set_resources(Some(res));
    spec.set_linux(Some(linux));
    let mut process = spec.process().clone().unwrap();
    process.set_oom_score_adj(Some(-997));
    spec.set_process(Some(process));
    let out = harden_ok(spec, &agent(), &ctx());
    let got = |key: &str| {
        out.clamped
            .iter()
            .find(|c| c.key == key)
            .map(|c| (c.requested.clone(), c.granted.clone()))
    };
    let two_gib = (2i64 << 30).to_string();
    assert_eq!(
        got("linux.resources.memory.limit"),
        Some(((8i64 << 30).to_string(), two_gib.clone()))
    );
    assert_eq!(
        got("linux.resources.memory.swap"),
        Some(((16i64 << 30).to_string(), two_gib))
    );
    assert_eq!(
        got("linux.resources.pids.limit"),
        Some(("2048".to_owned(), "1024".to_owned()))
    );
    assert_eq!(
        got("process.oomScoreAdj"),
        Some(("-997".to_owned(), "0".to_owned()))
    );
    // A limit within the policy is no clamp.
    let out = harden_ok(podman_like_spec(), &agent(), &ctx());
    assert!(
        !out.clamped
            .iter()
            .any(|c| c.key.starts_with("linux.resources"))
    );
}

#[test]
fn exec_process_is_clamped_too() {
    let mut process = Spec::default().process().clone().unwrap();
    process.set_no_new_privileges(Some(false));
    process.set_oom_score_adj(Some(-999));
    let out = harden::harden_process(process, &agent()).unwrap();
    assert_eq!(out.no_new_privileges(), Some(true));
    assert_eq!(out.oom_score_adj(), Some(0));
    let caps = out.capabilities().clone().unwrap();
    assert!(caps.bounding().as_ref().unwrap().is_empty());
    assert!(caps.effective().as_ref().unwrap().is_empty());
}

/// config.json files captured from real `podman run --runtime <capture script>` on this
/// machine (podman 4.3.1), rootful and rootless, each with `-v DIR:/workspace`.
const PODMAN_ROOTFUL: &str = include_str!("../fixtures/podman-4.3-rootful.json");
const PODMAN_ROOTLESS: &str = include_str!("../fixtures/podman-4.3-rootless.json");

#[test]
fn real_podman_specs_harden() {
    for (name, json, workspace) in [
        ("rootful", PODMAN_ROOTFUL, "/tmp/policy-cap/ws"),
        ("rootless", PODMAN_ROOTLESS, "/tmp/policy-cap/ws2"),
    ] {
        let spec: Spec = serde_json::from_str(json).unwrap();
        // Podman's own seccomp profile is replaced by ours.
        assert!(spec.linux().as_ref().unwrap().seccomp().is_some());
        let policy = agent();
        assert_eq!(
            harden::workspace_source(&spec, &policy),
            Some(PathBuf::from(workspace)),
            "{name}"
        );
        let HardenedSpec {
            spec: out,
            policy: effective,
            ..
        } = harden::harden_spec(spec, &policy, &ctx()).unwrap_or_else(|e| panic!("{name}: {e}"));
        if name == "rootful" {
            // The fixture carries `--annotation io.agent.sandbox.memory=256M`.
            assert_eq!(effective.resources.memory.bytes(), 256 << 20);
        }
        let shm = mount_at(&out, "/dev/shm");
        assert!(
            !opts(shm[0]).contains(&"ro".to_owned()),
            "{name}: /dev/shm must stay writable"
        );
        assert!(opts(shm[0]).contains(&"noexec".to_owned()));
        for ro in [
            "/etc/hosts",
            "/etc/hostname",
            "/run/.containerenv",
            "/sys/fs/cgroup",
        ] {
            assert!(
                opts(mount_at(&out, ro)[0]).contains(&"ro".to_owned()),
                "{name}: {ro}"
            );
        }
        let ws = mount_at(&out, "/workspace");
        assert_eq!(ws.len(), 1);
        assert!(
            opts(ws[0]).contains(&format!("lowerdir={workspace}")),
            "{name}"
        );
        // `/run` scratch comes before `/run/.containerenv` (parents first).
        let mounts = out.mounts().as_ref().unwrap();
        let run = mounts
            .iter()
            .position(|m| m.destination() == Path::new("/run"))
            .unwrap();
        let env = mounts
            .iter()
            .position(|m| m.destination() == Path::new("/run/.containerenv"))
            .unwrap();
        assert!(run < env, "{name}");
        let seccomp = out.linux().as_ref().unwrap().seccomp().clone().unwrap();
        assert_eq!(
            seccomp.default_action(),
            oci_spec::runtime::LinuxSeccompAction::ScmpActErrno
        );
    }
}

#[test]
fn host_network_devices_are_refused_and_propagation_is_not_shared() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_net_devices(Some(HashMap::from([(
        "eth0".to_owned(),
        oci_spec::runtime::LinuxNetDevice::default(),
    )])));
    spec.set_linux(Some(linux));
    let err = refusal(spec);
    assert!(
        matches!(&err, HardenError::NetDevice { device } if device == "eth0"),
        "{err}"
    );

    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_rootfs_propagation(Some("rshared".to_owned()));
    spec.set_linux(Some(linux));
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    assert_eq!(
        out.linux()
            .as_ref()
            .unwrap()
            .rootfs_propagation()
            .as_deref(),
        Some("rslave")
    );
}

#[test]
fn dotdot_destinations_and_sources_are_refused() {
    for (src, dst) in [("/srv/x", "/dev/../etc"), ("/tmp/../dev/kvm", "/data")] {
        let err = refusal(with_mount(bind(src, dst, &["rbind"])));
        assert!(
            matches!(err, HardenError::MountPath { .. }),
            "{src} {dst}: {err}"
        );
    }
    // A tmpfs "under /dev" that is really /etc.
    let err = refusal(with_mount(tmpfs("/dev/../etc")));
    assert!(matches!(err, HardenError::MountPath { .. }), "{err}");
}

#[test]
fn writable_dev_mounts_need_the_sandbox_dev_tmpfs() {
    let mut spec = podman_like_spec();
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.retain(|m| m.destination() != Path::new("/dev"));
    spec.set_mounts(Some(mounts));
    let err = refusal(spec);
    assert!(matches!(err, HardenError::DevNotTmpfs { .. }), "{err}");
}

#[test]
fn writable_destinations_are_listed_for_the_symlink_check() {
    let spec: Spec = serde_json::from_str(PODMAN_ROOTFUL).unwrap();
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    let mut dests = harden::writable_destinations(&out);
    dests.sort();
    let want: Vec<PathBuf> = [
        "/dev",
        "/dev/shm",
        "/home",
        // HOME's directories on the way to nested protected names (guard_home).
        "/home/.cargo",
        "/home/.config",
        "/home/.git",
        "/home/.github",
        "/run",
        "/tmp",
        "/var/tmp",
        "/workspace",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(dests, want);
}

#[test]
fn overlay_option_injection_is_refused() {
    let mut spec = podman_like_spec();
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.retain(|m| m.destination() != Path::new("/workspace"));
    mounts.push(bind("/srv/p,upperdir=/etc", "/workspace", &["rbind"]));
    spec.set_mounts(Some(mounts));
    let err = refusal(spec);
    assert!(matches!(err, HardenError::OverlayPath { .. }), "{err}");

    let mut ctx = ctx();
    ctx.workspace = Some(OverlayDirs {
        upper: "/run/a:b".into(),
        work: "/run/w".into(),
    });
    let err = harden::harden_spec(podman_like_spec(), &agent(), &ctx).unwrap_err();
    assert!(matches!(err, HardenError::OverlayPath { .. }), "{err}");
}

fn pod_namespaces() -> harden::PodNamespaces {
    harden::PodNamespaces {
        user: "/run/agent-sandbox/mnt/t/pod1/ns/user".into(),
        network: "/run/agent-sandbox/mnt/t/pod1/ns/net".into(),
        ipc: "/run/agent-sandbox/mnt/t/pod1/ns/ipc".into(),
        uts: "/run/agent-sandbox/mnt/t/pod1/ns/uts".into(),
    }
}

/// A CRI app container's spec: CRI asks to join the pause container's namespaces by
/// `/proc/<pid>/ns/...` paths and sets the pod's hostname.
fn cri_member_spec() -> Spec {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    let join = |typ, path: &str| {
        LinuxNamespaceBuilder::default()
            .typ(typ)
            .path(path)
            .build()
            .unwrap()
    };
    linux.set_namespaces(Some(vec![
        join(LinuxNamespaceType::Network, "/proc/4242/ns/net"),
        join(LinuxNamespaceType::Ipc, "/proc/4242/ns/ipc"),
        join(LinuxNamespaceType::Uts, "/proc/4242/ns/uts"),
        join(LinuxNamespaceType::Pid, "/proc/4242/ns/pid"),
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Mount)
            .build()
            .unwrap(),
    ]));
    spec.set_linux(Some(linux));
    spec.set_hostname(Some("pod-host".into()));
    spec
}

#[test]
fn pod_member_joins_only_the_pinned_pod_namespaces() {
    let mut c = ctx();
    c.pod = Some(pod_namespaces());
    let HardenedSpec { spec, .. } = harden_ok(cri_member_spec(), &agent(), &c);
    let ns = spec.linux().as_ref().unwrap().namespaces().clone().unwrap();
    let path = |typ| ns.iter().find(|n| n.typ() == typ).unwrap().path().clone();
    let pod = pod_namespaces();
    assert_eq!(path(LinuxNamespaceType::User), Some(pod.user));
    assert_eq!(path(LinuxNamespaceType::Network), Some(pod.network));
    assert_eq!(path(LinuxNamespaceType::Ipc), Some(pod.ipc));
    assert_eq!(path(LinuxNamespaceType::Uts), Some(pod.uts));
    // The spec's /proc/<pid> paths are never used; mount, PID and cgroup stay private.
    for typ in [
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Cgroup,
    ] {
        assert_eq!(path(typ), None, "{typ:?}");
    }
    assert_eq!(spec.hostname(), &None);
    let mut c = ctx();
    c.pod = Some(pod_namespaces());
    c.network_namespace = Some("/run/netns/other".into());
    assert!(matches!(
        harden::harden_spec(cri_member_spec(), &agent(), &c),
        Err(HardenError::PodNetworkConflict { .. })
    ));
    let mut c = ctx();
    let mut relative = pod_namespaces();
    relative.ipc = "ns/ipc".into();
    c.pod = Some(relative);
    assert!(matches!(
        harden::harden_spec(cri_member_spec(), &agent(), &c),
        Err(HardenError::PodNamespacePath { .. })
    ));
}

#[test]
fn pod_sandbox_ignores_the_cni_netns_path() {
    // The pause container: CRI names the CNI network namespace; the sandbox gets a new one.
    let mut spec = cri_member_spec();
    spec.set_hostname(Some("pod-host".into()));
    let HardenedSpec { spec, .. } = harden_ok(spec, &agent(), &ctx());
    let ns = spec.linux().as_ref().unwrap().namespaces().clone().unwrap();
    assert!(ns.iter().all(|n| n.path().is_none()));
    assert_eq!(spec.hostname().as_deref(), Some("pod-host"));
}

#[test]
fn a_bind_of_the_host_proc_becomes_a_fresh_procfs_and_other_proc_binds_are_refused() {
    // What rootless podman sends for `--pid host`: the host's /proc bound over /proc.
    let mut spec = podman_like_spec();
    let mut mounts: Vec<_> = spec
        .mounts()
        .clone()
        .unwrap()
        .into_iter()
        .filter(|m| m.destination() != Path::new("/proc"))
        .collect();
    mounts.push(bind("/proc", "/proc", &["rbind"]));
    spec.set_mounts(Some(mounts));
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    let procs: Vec<_> = out
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .filter(|m| m.destination() == Path::new("/proc"))
        .collect();
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0].typ().as_deref(), Some("proc"));
    assert_eq!(procs[0].source().as_deref(), Some(Path::new("proc")));

    let err = refusal(with_mount(bind("/proc/1/root", "/hostroot", &["rbind"])));
    assert!(matches!(err, HardenError::ProcBind { .. }), "{err}");
    assert!(err.to_string().contains("/hostroot"), "{err}");
}

#[test]
fn a_hardened_spec_covers_every_landlock_right_an_old_kernel_lacks() {
    let hardened = harden_ok(podman_like_spec(), &agent(), &ctx());
    let facts = harden::cover_facts(&hardened.spec);
    assert!(facts.readonly_mounts && facts.network_namespace);
    assert!(facts.safe_devices && facts.namespaces);
    // A spec with a writable root and the host's network namespace covers nothing.
    let mut raw = podman_like_spec();
    let mut root = raw.root().clone().unwrap();
    root.set_readonly(Some(false));
    raw.set_root(Some(root));
    let mut linux = raw.linux().clone().unwrap();
    linux.set_namespaces(Some(vec![
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Pid)
            .build()
            .unwrap(),
    ]));
    raw.set_linux(Some(linux));
    let raw = harden::cover_facts(&raw);
    assert!(!raw.readonly_mounts && !raw.network_namespace && !raw.namespaces);
}

fn with_sysctl(pairs: &[(&str, &str)]) -> Spec {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap_or_default();
    linux.set_sysctl(Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    ));
    spec.set_linux(Some(linux));
    spec
}

fn sysctl_of(spec: &Spec, key: &str) -> Option<String> {
    spec.linux().as_ref()?.sysctl().as_ref()?.get(key).cloned()
}

/// Docker adds `net.ipv4.ping_group_range = "0 2147483647"` to every container on a
/// non-host network; the kernel refuses group ids the sandbox's user namespace does not map.
#[test]
fn dockers_ping_group_range_is_clamped_to_the_gid_mapping_and_reported() {
    let spec = with_sysctl(&[
        (harden::PING_GROUP_RANGE, "0 2147483647"),
        ("net.ipv4.ip_unprivileged_port_start", "0"),
    ]);
    let out = harden_ok(spec, &agent(), &ctx());
    assert_eq!(
        sysctl_of(&out.spec, harden::PING_GROUP_RANGE).as_deref(),
        Some("0 65535")
    );
    // Other sysctls pass through unchanged, as runc would apply them.
    assert_eq!(
        sysctl_of(&out.spec, "net.ipv4.ip_unprivileged_port_start").as_deref(),
        Some("0")
    );
    assert_eq!(
        ping_clamps(&out),
        [harden::Clamp {
            key: harden::PING_GROUP_RANGE.to_owned(),
            requested: "0 2147483647".to_owned(),
            granted: "0 65535".to_owned(),
        }]
    );
}

/// The clamps of `out` for the ping_group_range sysctl (the spec's default capabilities and
/// missing seccomp profile give their own).
fn ping_clamps(out: &HardenedSpec) -> Vec<harden::Clamp> {
    out.clamped
        .iter()
        .filter(|c| c.key == harden::PING_GROUP_RANGE)
        .cloned()
        .collect()
}

#[test]
fn ping_group_range_within_the_mapping_is_kept_and_not_reported() {
    for value in ["0 65535", "100 200", "1 0"] {
        let out = harden_ok(
            with_sysctl(&[(harden::PING_GROUP_RANGE, value)]),
            &agent(),
            &ctx(),
        );
        assert_eq!(
            sysctl_of(&out.spec, harden::PING_GROUP_RANGE).as_deref(),
            Some(value)
        );
        assert!(ping_clamps(&out).is_empty(), "{value}: {:?}", out.clamped);
    }
}

#[test]
fn ping_group_range_outside_the_mapping_becomes_nobody() {
    for (value, granted) in [
        ("70000 80000", "1 0"),
        ("65000 4294967294", "65000 65535"),
        ("4294967294 0", "1 0"),
    ] {
        let out = harden_ok(
            with_sysctl(&[(harden::PING_GROUP_RANGE, value)]),
            &agent(),
            &ctx(),
        );
        assert_eq!(
            sysctl_of(&out.spec, harden::PING_GROUP_RANGE).as_deref(),
            Some(granted),
            "{value}"
        );
        assert_eq!(ping_clamps(&out).len(), 1, "{value}");
    }
}

#[test]
fn bad_ping_group_range_is_refused_naming_the_key() {
    for value in ["0", "0 1 2", "a b", "-1 5", ""] {
        let err = harden::harden_spec(
            with_sysctl(&[(harden::PING_GROUP_RANGE, value)]),
            &agent(),
            &ctx(),
        )
        .unwrap_err();
        assert!(
            matches!(&err, HardenError::SysctlValue { key, .. } if key == harden::PING_GROUP_RANGE),
            "{value}: {err:?}"
        );
        assert!(err.to_string().contains(harden::PING_GROUP_RANGE), "{err}");
    }
}

/// A per-device sysctl for a device the sandbox's namespace lacks fails at create with
/// libcontainer's "open subpath in procfs failed"; the hardening names the key instead.
#[test]
fn sysctl_for_a_device_the_sandbox_lacks_is_refused_naming_key_and_device() {
    let key = "net.ipv4.conf.eth0.forwarding";
    let err = harden::harden_spec(with_sysctl(&[(key, "1")]), &agent(), &ctx()).unwrap_err();
    assert!(
        matches!(&err, HardenError::SysctlDevice { key: k, device } if k == key && device == "eth0"),
        "{err:?}"
    );
    assert!(err.to_string().contains(key), "{err}");
    for ok in [
        "net.ipv4.conf.all.forwarding",
        "net.ipv4.conf.default.rp_filter",
        "net.ipv6.conf.lo.disable_ipv6",
        "net.ipv4.neigh.default.gc_thresh1",
    ] {
        harden_ok(with_sysctl(&[(ok, "1")]), &agent(), &ctx());
    }
}

#[test]
fn mounts_keep_the_order_the_spec_lists_them_in() {
    let mut spec = podman_like_spec();
    let mut mounts = spec.mounts().clone().unwrap();
    // A child listed before a shallower mount stays before it (runc mounts in list order).
    mounts.insert(0, bind("/srv/data", "/opt/deep/data", &["rbind"]));
    spec.set_mounts(Some(mounts));
    let incoming: Vec<PathBuf> = spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.destination().clone())
        .collect();
    let out = harden_ok(spec, &agent(), &ctx()).spec;
    let order: Vec<PathBuf> = out
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.destination().clone())
        .filter(|d| incoming.contains(d))
        .collect();
    let mut expected = incoming.clone();
    expected.dedup();
    assert_eq!(order, expected, "hardened mounts out of the spec's order");
    // The replaced /tmp keeps its place, now the policy's tmpfs.
    let tmp = mount_at(&out, "/tmp");
    assert_eq!(tmp.len(), 1);
    assert!(opts(tmp[0]).iter().any(|o| o == "nodev"));
}

#[test]
fn repeated_additional_gids_are_folded_like_runc() {
    let mut process = Spec::default().process().clone().unwrap();
    let mut user = process.user().clone();
    user.set_additional_gids(Some(vec![5, 7, 5, 7, 9]));
    process.set_user(user);
    let out = harden::harden_process(process, &agent()).unwrap();
    assert_eq!(
        out.user().additional_gids().as_deref(),
        Some(&[5, 7, 9][..])
    );
}

#[test]
fn every_rootfs_propagation_runc_accepts_is_accepted_and_shared_is_narrowed() {
    for (mode, applied) in [
        ("shared", "rslave"),
        ("rshared", "rslave"),
        ("slave", "slave"),
        ("rslave", "rslave"),
        ("private", "private"),
        ("rprivate", "rprivate"),
        ("unbindable", "unbindable"),
        ("runbindable", "runbindable"),
    ] {
        let mut spec = podman_like_spec();
        let mut linux = spec.linux().clone().unwrap();
        linux.set_rootfs_propagation(Some(mode.to_owned()));
        spec.set_linux(Some(linux));
        let out = harden_ok(spec, &agent(), &ctx()).spec;
        assert_eq!(
            out.linux()
                .as_ref()
                .unwrap()
                .rootfs_propagation()
                .as_deref(),
            Some(applied),
            "{mode}"
        );
    }
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_rootfs_propagation(Some("sideways".to_owned()));
    spec.set_linux(Some(linux));
    let err = refusal(spec);
    assert!(err.to_string().contains("rootfsPropagation"), "{err}");
}

/// A devpts mount keeps device nodes (runc's devpts has `nosuid,noexec` only): with `nodev`,
/// `/dev/ptmx` cannot be opened and no terminal works. `nodev` asked for by the caller goes
/// too; `nosuid` is always there.
#[test]
fn devpts_keeps_device_nodes_and_gets_nosuid() {
    let mut spec = podman_like_spec();
    let mut mounts = spec.mounts().clone().unwrap();
    for m in mounts
        .iter_mut()
        .filter(|m| m.typ().as_deref() == Some("devpts"))
    {
        let mut o = m.options().clone().unwrap_or_default();
        o.retain(|o| o != "nosuid");
        o.push("nodev".to_owned());
        o.push("dev".to_owned());
        m.set_options(Some(o));
    }
    spec.set_mounts(Some(mounts));
    let out = harden_ok(spec, &agent(), &ctx());
    let pts = mount_at(&out.spec, "/dev/pts");
    assert_eq!(pts.len(), 1);
    let o = opts(pts[0]);
    assert!(!o.iter().any(|o| o == "nodev" || o == "dev"), "{o:?}");
    assert!(o.iter().any(|o| o == "nosuid"), "{o:?}");
    assert!(o.iter().any(|o| o == "newinstance"), "{o:?}");
    // Other kernel filesystems still get `nodev`.
    assert!(opts(mount_at(&out.spec, "/proc")[0]).contains(&"nodev".to_owned()));
}

/// The init's `HOME` on the read-only image moves to the policy's scratch; `harden_spec` does
/// it, so the spec the runtime verifies is the one the init gets.
#[test]
fn init_home_on_the_read_only_image_moves_to_scratch() {
    let mut spec = podman_like_spec();
    let mut process = spec.process().clone().unwrap();
    process.set_env(Some(vec!["PATH=/bin".to_owned(), "HOME=/root".to_owned()]));
    spec.set_process(Some(process));
    let out = harden_ok(spec, &agent(), &ctx());
    let env = out.spec.process().as_ref().unwrap().env().clone().unwrap();
    let homes: Vec<&String> = env.iter().filter(|e| e.starts_with("HOME=")).collect();
    assert_eq!(homes, ["HOME=/home"]);
}

#[test]
fn home_on_the_read_only_image_moves_to_scratch_and_a_chosen_mount_stays() {
    let policy = agent();
    let mut spec = Spec::default();
    let mut shared = Mount::default();
    shared.set_destination(PathBuf::from("/home/agent"));
    spec.set_mounts(Some(vec![shared]));
    let home_of = |home: Option<&str>| {
        let mut p = oci_spec::runtime::Process::default();
        let mut env = vec!["PATH=/bin".to_owned()];
        env.extend(home.map(|h| format!("HOME={h}")));
        p.set_env(Some(env));
        harden::writable_home(&mut p, &policy, &spec);
        let env = p.env().clone().unwrap();
        assert_eq!(env.iter().filter(|e| e.starts_with("HOME=")).count(), 1);
        env.into_iter()
            .find_map(|e| e.strip_prefix("HOME=").map(str::to_owned))
    };
    assert_eq!(home_of(Some("/root")).as_deref(), Some("/home"));
    assert_eq!(home_of(None).as_deref(), Some("/home"));
    assert_eq!(home_of(Some("/tmp/h")).as_deref(), Some("/tmp/h"));
    assert_eq!(home_of(Some("/workspace")).as_deref(), Some("/workspace"));
    assert_eq!(home_of(Some("/home/agent")).as_deref(), Some("/home/agent"));
}

/// The spec's mounts from the scratch tmpfs at `scratch` on, as (destination, type, source).
fn mounts_after(spec: &Spec, scratch: &str) -> Vec<(String, String, String)> {
    let all = spec.mounts().clone().unwrap_or_default();
    let at = all
        .iter()
        .position(|m| m.destination() == Path::new(scratch) && m.typ().as_deref() == Some("tmpfs"))
        .unwrap_or_else(|| panic!("no tmpfs at {scratch}"));
    all[at..]
        .iter()
        .map(|m| {
            (
                m.destination().display().to_string(),
                m.typ().clone().unwrap_or_default(),
                m.source()
                    .as_ref()
                    .map(|s| s.display().to_string())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn with_home(mut spec: Spec, home: &str) -> Spec {
    let mut process = spec.process().clone().unwrap();
    process.set_env(Some(vec!["PATH=/bin".to_owned(), format!("HOME={home}")]));
    spec.set_process(Some(process));
    spec
}

/// Every protected name of a scratch HOME gets a read-only placeholder right after HOME's
/// tmpfs, before the program runs, whether or not the image has the file: `.bashrc` the
/// empty file, `.claude/` the empty directory, `.config/git/` inside a tmpfs of its own.
#[test]
fn every_protected_name_of_a_scratch_home_is_bound_read_only() {
    let policy = agent();
    let out = harden_ok(with_home(podman_like_spec(), "/root"), &policy, &ctx());
    let after = mounts_after(&out.spec, "/home");
    let placeholders = ctx().placeholders.unwrap();
    let file = placeholders.file.display().to_string();
    let dir = placeholders.dir.display().to_string();
    for name in policy.filesystem.protected_names() {
        let dest = format!("/home/{}", name.as_str());
        let m = mount_at(&out.spec, &dest);
        assert_eq!(m.len(), 1, "{dest}");
        let want = if name.is_dir() { &dir } else { &file };
        assert_eq!(m[0].source().as_ref().unwrap(), Path::new(want), "{dest}");
        let o = opts(m[0]);
        assert!(
            o.contains(&"ro".to_owned()) && o.contains(&"bind".to_owned()),
            "{dest}: {o:?}"
        );
        let pos = after.iter().position(|(d, _, _)| *d == dest);
        assert!(pos.is_some(), "{dest} is not after /home's tmpfs");
    }
    for name in [
        ".bashrc",
        ".claude",
        ".cursor",
        ".husky",
        ".envrc",
        ".gitconfig",
    ] {
        assert!(
            !mount_at(&out.spec, &format!("/home/{name}")).is_empty(),
            "{name}"
        );
    }
    // Each directory on the way to a nested name is a tmpfs mounted before what it holds,
    // so it cannot be renamed away and made again.
    for dir in [
        "/home/.config",
        "/home/.git",
        "/home/.cargo",
        "/home/.github",
    ] {
        let m = mount_at(&out.spec, dir);
        assert_eq!(m.len(), 1, "{dir}");
        assert_eq!(m[0].typ().as_deref(), Some("tmpfs"), "{dir}");
        let at = after.iter().position(|(d, _, _)| d == dir).unwrap();
        for (i, (d, _, _)) in after.iter().enumerate() {
            if d.starts_with(&format!("{dir}/")) {
                assert!(i > at, "{d} before {dir}");
            }
        }
    }
    // The other scratch areas get none.
    assert!(mount_at(&out.spec, "/tmp/.bashrc").is_empty());
}

/// A HOME below a scratch area's top becomes a tmpfs of its own (a directory holding mount
/// points could be renamed away), then gets the placeholders.
#[test]
fn a_home_below_a_scratch_top_is_its_own_tmpfs() {
    let out = harden_ok(
        with_home(podman_like_spec(), "/home/agent/"),
        &agent(),
        &ctx(),
    );
    let m = mount_at(&out.spec, "/home/agent");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].typ().as_deref(), Some("tmpfs"));
    assert_eq!(mount_at(&out.spec, "/home/agent/.bashrc").len(), 1);
    let out = harden_ok(
        with_home(podman_like_spec(), "/tmp/x/../h"),
        &agent(),
        &ctx(),
    );
    assert_eq!(mount_at(&out.spec, "/tmp/h/.zshrc").len(), 1);
}

/// Names inside a protected directory are covered by it (strict protects all of `.git/`).
#[test]
fn names_inside_a_protected_directory_get_no_mount_of_their_own() {
    let strict = SandboxPolicy::builtin("strict").unwrap();
    let out = harden_ok(with_home(podman_like_spec(), "/root"), &strict, &ctx());
    let home = out
        .spec
        .process()
        .as_ref()
        .unwrap()
        .env()
        .iter()
        .flatten()
        .find_map(|e| e.strip_prefix("HOME=").map(str::to_owned))
        .unwrap();
    let git = mount_at(&out.spec, &format!("{home}/.git"));
    assert_eq!(git.len(), 1);
    assert_eq!(git[0].typ().as_deref(), Some("bind"));
    assert!(mount_at(&out.spec, &format!("{home}/.git/hooks")).is_empty());
    assert!(mount_at(&out.spec, &format!("{home}/.git/config")).is_empty());
}

/// HOME in the workspace or on a caller's read-only mount gets no placeholders: the
/// workspace's protected names are its own matter (existing ones bound, new ones refused by
/// promote), a read-only mount cannot be written.
#[test]
fn a_home_off_the_scratch_areas_gets_no_placeholders() {
    let out = harden_ok(
        with_home(podman_like_spec(), "/workspace"),
        &agent(),
        &ctx(),
    );
    assert!(mount_at(&out.spec, "/workspace/.bashrc").is_empty());
    let mut spec = with_home(podman_like_spec(), "/home/shared");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(bind("/srv/home", "/home/shared", &["ro"]));
    spec.set_mounts(Some(mounts));
    let out = harden_ok(spec, &agent(), &ctx());
    assert!(mount_at(&out.spec, "/home/shared/.bashrc").is_empty());
}

/// Without placeholders a scratch HOME is an error, never a HOME left writable.
#[test]
fn a_scratch_home_without_placeholders_is_refused() {
    let mut c = ctx();
    c.placeholders = None;
    let err =
        harden::harden_spec(with_home(podman_like_spec(), "/root"), &agent(), &c).unwrap_err();
    assert!(
        matches!(err, HardenError::MissingPlaceholders { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("/home"), "{err}");
}

/// A caller's read-only bind beneath HOME is mounted after the placeholders, so it is what
/// the sandbox sees.
#[test]
fn a_callers_mount_beneath_home_stays_on_top() {
    let mut spec = with_home(podman_like_spec(), "/root");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(bind("/srv/gitconfig", "/home/.gitconfig", &["ro"]));
    spec.set_mounts(Some(mounts));
    let out = harden_ok(spec, &agent(), &ctx());
    let at: Vec<&Mount> = mount_at(&out.spec, "/home/.gitconfig");
    assert_eq!(at.len(), 2);
    assert_eq!(
        at[1].source().as_ref().unwrap(),
        Path::new("/srv/gitconfig"),
        "the caller's bind must come last"
    );
}

/// The guards split off for the runtime to place are exactly [`harden::harden_spec`]'s,
/// in its order, and the rest of the spec is untouched; nothing is split where placing
/// them after libcontainer's mounts would not make the same tree.
#[test]
fn home_guards_split_off_only_where_placing_them_last_is_the_same() {
    let policy = agent();
    let placeholders = ctx().placeholders.unwrap();
    for home in ["/root", "/home/agent"] {
        let out = harden_ok(with_home(podman_like_spec(), home), &policy, &ctx());
        let all = out.spec.mounts().clone().unwrap();
        let (engine, guards) =
            harden::split_home_guards(&out.spec, &policy, &placeholders).expect(home);
        let rest = engine.mounts().clone().unwrap();
        assert_eq!(rest.len() + guards.len(), all.len(), "{home}");
        let at = all.iter().position(|m| *m == guards[0]).unwrap();
        assert_eq!(&all[at..at + guards.len()], guards.as_slice(), "{home}");
        assert_eq!(&all[..at], &rest[..at], "{home}");
        assert_eq!(&all[at + guards.len()..], &rest[at..], "{home}");
        let left: Vec<_> = rest
            .iter()
            .filter(|m| {
                m.destination().starts_with("/home") && m.destination() != Path::new("/home")
            })
            .collect();
        assert!(left.is_empty(), "{home}: {left:?}");
        let mut without = engine.clone();
        without.set_mounts(None);
        let mut whole = out.spec.clone();
        whole.set_mounts(None);
        assert_eq!(without, whole, "only the mounts differ");
    }
    let split = |spec: Spec| {
        let out = harden_ok(spec, &policy, &ctx());
        harden::split_home_guards(&out.spec, &policy, &placeholders)
    };
    // A caller's mount beneath HOME must stay on top of the guards.
    let mut spec = with_home(podman_like_spec(), "/root");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(bind("/srv/gitconfig", "/home/.gitconfig", &["ro"]));
    spec.set_mounts(Some(mounts));
    assert!(split(spec).is_none(), "a caller's mount beneath HOME");
    // A working directory inside a guard's tmpfs would stay beneath it.
    let mut spec = with_home(podman_like_spec(), "/home/agent");
    let mut process = spec.process().clone().unwrap();
    process.set_cwd("/home/agent".into());
    spec.set_process(Some(process));
    assert!(
        split(spec).is_none(),
        "a working directory in HOME's own tmpfs"
    );
    let mut spec = with_home(podman_like_spec(), "/root");
    let mut process = spec.process().clone().unwrap();
    process.set_cwd("/home".into());
    spec.set_process(Some(process.clone()));
    assert!(
        split(spec.clone()).is_some(),
        "HOME is the scratch top itself"
    );
    process.set_cwd("/home/.config".into());
    spec.set_process(Some(process));
    assert!(
        split(spec).is_none(),
        "a working directory in a guard's tmpfs"
    );
    // No guards (HOME off the scratch areas), or a spec edited after hardening.
    assert!(split(with_home(podman_like_spec(), "/workspace")).is_none());
    let out = harden_ok(with_home(podman_like_spec(), "/root"), &policy, &ctx());
    let mut edited = out.spec.clone();
    let mut mounts = edited.mounts().clone().unwrap();
    let last = mounts
        .iter()
        .rposition(|m| m.destination().starts_with("/home/.bashrc"))
        .unwrap();
    mounts.remove(last);
    edited.set_mounts(Some(mounts));
    assert!(harden::split_home_guards(&edited, &policy, &placeholders).is_none());
}

#[test]
fn joins_the_user_namespace_the_runtime_made_never_the_specs() {
    let ns_path = |spec: &Spec, typ: LinuxNamespaceType| {
        spec.linux()
            .as_ref()
            .unwrap()
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .find(|n| n.typ() == typ)
            .map(|n| n.path().clone())
    };
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    let mut nss = linux.namespaces().clone().unwrap();
    nss.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::User)
            .path("/proc/1/ns/user")
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(nss));
    spec.set_linux(Some(linux));
    let mut c = ctx();
    c.user_namespace = Some("/run/agent-sandbox/c1/userns".into());
    let out = harden::harden_spec(spec.clone(), &agent(), &c)
        .unwrap()
        .spec;
    assert_eq!(
        ns_path(&out, LinuxNamespaceType::User),
        Some(Some(PathBuf::from("/run/agent-sandbox/c1/userns")))
    );
    // The mappings stay: they say what the runtime wrote into that namespace.
    assert!(
        !out.linux()
            .as_ref()
            .unwrap()
            .uid_mappings()
            .clone()
            .unwrap()
            .is_empty()
    );
    // Without one, a new user namespace, whatever the spec named.
    let out = harden::harden_spec(spec, &agent(), &ctx()).unwrap().spec;
    assert_eq!(ns_path(&out, LinuxNamespaceType::User), Some(None));
}

/// docs/contracts.md: `disableOOMKiller` is turned off whatever the spec asks, and a tmpfs
/// outside the policy's scratch areas is refused even read-only.
#[test]
fn disable_oom_killer_is_cleared_and_a_read_only_tmpfs_outside_scratch_is_refused() {
    let mut spec = podman_like_spec();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_resources(Some(
        LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(64_i64 << 20)
                    .disable_oom_killer(true)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    ));
    spec.set_linux(Some(linux));
    let hardened = harden_ok(spec, &agent(), &ctx());
    let memory = hardened
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().clone())
        .and_then(|r| *r.memory())
        .unwrap();
    assert_eq!(memory.disable_oom_killer(), Some(false));

    let mut ro = tmpfs("/data");
    ro.set_options(Some(vec!["ro".to_owned(), "nosuid".to_owned()]));
    let err = refusal(with_mount(ro));
    assert_eq!(
        err.to_string(),
        "mount at /data: a writable tmpfs outside the policy's writable paths"
    );
}

/// A host with every layer, for the plan compiler.
fn full_host() -> agent_sandbox_policy::layers::HostSupport {
    agent_sandbox_policy::layers::HostSupport {
        seccomp: true,
        landlock_abi: u32::from(agent_sandbox_policy::landlock::NEWEST_ABI),
        apparmor: agent_sandbox_policy::layers::AppArmorHost::Usable,
        cgroups: true,
    }
}

/// The plan compiler gives one result: the hardened spec, and a plan whose policy is the
/// annotation-narrowed one, whose clamps and protected binds are the spec step's and the
/// runtime's, whose seccomp request is the incoming config's own, and whose layer plan puts
/// the policy's AppArmor profile on the init where the host can load it.
#[test]
fn compile_gives_the_hardened_spec_and_the_whole_plan() {
    let mut spec = podman_like_spec();
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    annotations.insert("io.agent.sandbox.memory".to_owned(), "256M".to_owned());
    spec.set_annotations(Some(annotations));
    let requested = harden_ok(podman_like_spec(), &agent(), &ctx())
        .spec
        .linux()
        .as_ref()
        .unwrap()
        .seccomp()
        .clone();
    let mut linux = spec.linux().clone().unwrap();
    linux.set_seccomp(requested.clone());
    spec.set_linux(Some(linux));
    let mut process = spec.process().clone().unwrap();
    process.set_oom_score_adj(Some(-999));
    spec.set_process(Some(process));
    let policy = agent();
    let protected = harden::protected_path_candidates(&spec, &policy);
    assert!(!protected.is_empty(), "the fixture binds a workspace");
    let facts = HostFacts {
        protected: protected.clone(),
        support: full_host(),
        ..ctx()
    };
    let compiled = agent_sandbox_policy::compile(&policy, spec.clone(), &facts).unwrap();
    let plan = &compiled.plan;
    assert_eq!(
        plan.policy.resources.memory,
        agent_sandbox_policy::value::ByteSize::try_from("256M").unwrap()
    );
    assert_eq!(plan.protected, protected);
    assert_eq!(plan.requested_seccomp, requested);
    assert!(
        plan.clamped
            .iter()
            .any(|c| c.key == "process.oomScoreAdj" && c.granted == "0")
    );
    assert!(
        plan.layers
            .apply
            .contains(&agent_sandbox_policy::Layer::Apparmor)
    );
    let profile = agent_sandbox_policy::apparmor::loaded_profile(&plan.policy).name;
    let process = compiled.spec.process().as_ref().unwrap();
    assert_eq!(
        process.apparmor_profile().as_deref(),
        Some(profile.as_str())
    );
    // The spec step alone gives the same spec, save the profile the layer plan adds.
    let alone = harden_ok(spec, &policy, &facts).spec;
    assert_eq!(alone.process().as_ref().unwrap().apparmor_profile(), &None);
}

/// A layer the policy requires and the host lacks fails the compile, naming the layer.
#[test]
fn compile_refuses_a_required_layer_the_host_lacks() {
    let facts = HostFacts {
        support: agent_sandbox_policy::layers::HostSupport {
            seccomp: false,
            ..full_host()
        },
        ..ctx()
    };
    let err = agent_sandbox_policy::compile(&agent(), podman_like_spec(), &facts).unwrap_err();
    assert!(
        matches!(
            &err,
            agent_sandbox_policy::CompileError::Layer(
                agent_sandbox_policy::layers::LayerError::Unavailable {
                    layer: agent_sandbox_policy::Layer::Seccomp
                }
            )
        ),
        "{err:?}"
    );
}

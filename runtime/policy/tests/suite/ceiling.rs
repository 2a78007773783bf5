//! Property tests of the ceiling rule: whatever the incoming spec and annotations say, a
//! hardened spec has no capability, a read-only root, its own network namespace, no host
//! uid 0 mapping and a seccomp filter — and its effective policy is within the ceiling.

use std::collections::HashMap;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{self, IdMapping};
use agent_sandbox_policy::narrow;
use oci_spec::runtime::{
    Capabilities, Capability, LinuxCapabilities, LinuxIdMappingBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxSeccompAction, LinuxSeccompBuilder, Spec,
};
use proptest::prelude::*;

use super::harden::{assert_no_capability, ctx, podman_like_spec};

const CAPS: &[Capability] = &[
    Capability::SysAdmin,
    Capability::NetAdmin,
    Capability::NetRaw,
    Capability::SysPtrace,
    Capability::Chown,
    Capability::DacOverride,
    Capability::Setuid,
    Capability::SysModule,
];

const NS_TYPES: &[LinuxNamespaceType] = &[
    LinuxNamespaceType::Network,
    LinuxNamespaceType::User,
    LinuxNamespaceType::Pid,
    LinuxNamespaceType::Ipc,
    LinuxNamespaceType::Mount,
];

const NS_PATHS: &[Option<&str>] = &[None, Some("/proc/1/ns/net"), Some("/var/run/netns/host")];

const ANNOTATIONS: &[(&str, &str)] = &[
    ("io.agent.sandbox.profile", "strict"),
    ("io.agent.sandbox.profile", "agent"),
    ("io.agent.sandbox.network", "proxy"),
    ("io.agent.sandbox.network", "none"),
    ("io.agent.sandbox.network.allow", "pypi.org:443"),
    ("io.agent.sandbox.network.allow", "evil.example"),
    ("io.agent.sandbox.network.deny", "pypi.org"),
    ("io.agent.sandbox.memory", "128M"),
    ("io.agent.sandbox.memory", "1T"),
    ("io.agent.sandbox.pids", "10"),
    ("io.agent.sandbox.capabilities", "CAP_SYS_ADMIN"),
    ("io.agent.sandbox.capabilities", ""),
    ("io.agent.sandbox.cpu-shares", "4096"),
    ("io.agent.sandbox.wall-clock", "1m"),
    ("io.agent.sandbox.readonly", "false"),
    ("other.key", "x"),
];

#[derive(Debug, Clone)]
struct Incoming {
    caps: Vec<usize>,
    readonly: Option<bool>,
    namespaces: Vec<(usize, usize)>,
    spec_uid_host: u32,
    seccomp: bool,
    annotations: Vec<usize>,
    no_new_privs: Option<bool>,
}

fn incoming() -> impl Strategy<Value = Incoming> {
    (
        proptest::collection::vec(0..CAPS.len(), 0..6),
        proptest::option::of(any::<bool>()),
        proptest::collection::vec((0..NS_TYPES.len(), 0..NS_PATHS.len()), 0..6),
        prop_oneof![Just(0u32), Just(1000u32), any::<u32>()],
        any::<bool>(),
        proptest::collection::vec(0..ANNOTATIONS.len(), 0..4),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(
            |(caps, readonly, namespaces, spec_uid_host, seccomp, annotations, no_new_privs)| {
                Incoming {
                    caps,
                    readonly,
                    namespaces,
                    spec_uid_host,
                    seccomp,
                    annotations,
                    no_new_privs,
                }
            },
        )
}

fn build(i: &Incoming) -> Spec {
    let mut spec = podman_like_spec();
    let caps: Capabilities = i.caps.iter().map(|&n| CAPS[n]).collect();
    let mut lc = LinuxCapabilities::default();
    lc.set_bounding(Some(caps.clone()));
    lc.set_effective(Some(caps.clone()));
    lc.set_permitted(Some(caps.clone()));
    lc.set_inheritable(Some(caps.clone()));
    lc.set_ambient(Some(caps));
    let mut process = spec.process().clone().unwrap();
    process.set_capabilities(Some(lc));
    process.set_no_new_privileges(i.no_new_privs);
    spec.set_process(Some(process));
    let mut root = spec.root().clone().unwrap();
    root.set_readonly(i.readonly);
    spec.set_root(Some(root));
    let mut linux = spec.linux().clone().unwrap();
    linux.set_namespaces(Some(
        i.namespaces
            .iter()
            .map(|&(t, p)| {
                let mut b = LinuxNamespaceBuilder::default().typ(NS_TYPES[t]);
                if let Some(path) = NS_PATHS[p] {
                    b = b.path(path);
                }
                b.build().unwrap()
            })
            .collect(),
    ));
    linux.set_uid_mappings(Some(vec![
        LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(i.spec_uid_host)
            .size(1u32)
            .build()
            .unwrap(),
    ]));
    linux.set_seccomp(i.seccomp.then(|| {
        LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .build()
            .unwrap()
    }));
    spec.set_linux(Some(linux));
    let annotations: HashMap<String, String> = i
        .annotations
        .iter()
        .map(|&n| (ANNOTATIONS[n].0.to_owned(), ANNOTATIONS[n].1.to_owned()))
        .collect();
    spec.set_annotations(Some(annotations));
    spec
}

fn assert_sandboxed(spec: &Spec) {
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.no_new_privileges(), Some(true));
    assert_no_capability(process);
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    let linux = spec.linux().as_ref().unwrap();
    let ns = linux.namespaces().as_ref().unwrap();
    let net = ns.iter().filter(|n| n.typ() == LinuxNamespaceType::Network);
    assert_eq!(net.clone().count(), 1);
    assert!(
        net.clone().all(|n| n.path().is_none()),
        "network namespace path kept"
    );
    assert!(
        ns.iter()
            .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none())
    );
    for m in linux
        .uid_mappings()
        .iter()
        .chain(linux.gid_mappings().iter())
        .flatten()
    {
        assert_ne!(m.host_id(), 0, "host uid 0 mapped");
    }
    let seccomp = linux.seccomp().as_ref().expect("seccomp missing");
    assert_ne!(seccomp.default_action(), LinuxSeccompAction::ScmpActAllow);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_input_widens_the_sandbox(i in incoming()) {
        let ceiling = SandboxPolicy::builtin("agent").unwrap();
        match harden::harden_spec(build(&i), &ceiling, &ctx()) {
            Ok(out) => {
                assert_sandboxed(&out.spec);
                prop_assert!(narrow::within(&out.policy, &ceiling).is_ok());
            }
            // Refusals are fine (fail closed), but only widening requests may cause them
            // here: a host namespace or a capability no engine sends by default
            // (docs/policy.md#widening-requests), or an annotation.
            Err(harden::HardenError::Widens { key, .. }) => {
                prop_assert!(
                    key.starts_with("linux.namespaces[") || key.starts_with("process.capabilities."),
                    "unexpected widening refusal: {key}"
                );
            }
            Err(e) => {
                prop_assert!(!i.annotations.is_empty(), "refused without annotations: {e}");
                prop_assert!(
                    matches!(
                        e,
                        harden::HardenError::AnnotationWidens { .. }
                            | harden::HardenError::BadAnnotation { .. }
                            | harden::HardenError::UnknownAnnotation { .. }
                    ),
                    "unexpected refusal: {e}"
                );
            }
        }
    }

    #[test]
    fn contexts_mapping_host_root_are_refused(host in 0u32..3, size in 1u32..70000) {
        let ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut ctx = ctx();
        ctx.uid_mappings = vec![IdMapping { container_id: 0, host_id: host, size }];
        let result = harden::harden_spec(podman_like_spec(), &ceiling, &ctx);
        if host == 0 {
            prop_assert!(result.is_err());
        }
        if let Ok(out) = result {
            assert_sandboxed(&out.spec);
        }
    }
}

#[test]
fn the_checker_catches_an_unhardened_spec() {
    // Control for the properties above: the raw incoming specs fail the same checks, so
    // the properties would notice a harden_spec that let them through.
    let raw = build(&Incoming {
        caps: vec![0],
        readonly: Some(false),
        namespaces: vec![(0, 1)],
        spec_uid_host: 0,
        seccomp: true,
        annotations: vec![],
        no_new_privs: Some(false),
    });
    assert!(std::panic::catch_unwind(|| assert_sandboxed(&raw)).is_err());
    let podman: Spec =
        serde_json::from_str(include_str!("../fixtures/podman-4.3-rootful.json")).unwrap();
    assert!(std::panic::catch_unwind(|| assert_sandboxed(&podman)).is_err());
}

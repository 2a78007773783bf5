//! Criterion micro-benchmarks of the policy crate: what every `create` pays (loading the
//! policy, compiling its seccomp filter and Landlock rules, hardening a real podman
//! config.json) and what the proxy pays per connection (allowlist matching).
//!
//! `cargo bench -p agent-sandbox-policy --bench policy` (hack/bench runs it too).
// A benchmark binary: a failed set-up step must stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::hint::black_box;
use std::path::Path;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{self, HostFacts, IdMapping, OverlayDirs};
use agent_sandbox_policy::network::{Allowlist, DomainRule};
use agent_sandbox_policy::seccomp::{Arch, compile_bpf, oci_seccomp_json};
use criterion::{Criterion, criterion_group, criterion_main};

fn fixture(name: &str) -> oci_spec::runtime::Spec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn compilation(c: &mut Criterion) {
    let text = agent_sandbox_policy::policy::builtin_text("agent").unwrap();
    let policy = SandboxPolicy::builtin("agent").unwrap();
    let mut g = c.benchmark_group("compile");
    g.bench_function("parse agent.toml", |b| {
        b.iter(|| SandboxPolicy::parse(black_box(text), "agent.toml").unwrap())
    });
    g.bench_function("seccomp bpf", |b| {
        b.iter(|| compile_bpf(black_box(&policy.syscalls), Arch::X86_64).unwrap())
    });
    g.bench_function("seccomp oci json", |b| {
        b.iter(|| oci_seccomp_json(black_box(&policy.syscalls)).unwrap())
    });
    g.bench_function("landlock ruleset", |b| {
        b.iter(|| agent_sandbox_policy::landlock::ruleset(black_box(&policy)))
    });
    let spec = fixture("podman-4.3-rootful.json");
    let mapping = IdMapping {
        container_id: 0,
        host_id: 1_000_000,
        size: 65536,
    };
    // The fixture binds a workspace: the runtime would give it overlay dirs and report the
    // protected paths it found.
    let ctx = HostFacts {
        uid_mappings: vec![mapping],
        gid_mappings: vec![mapping],
        parent_root_unprivileged: false,
        workspace: harden::workspace_source(&spec, &policy).map(|_| OverlayDirs {
            upper: "/run/agent-sandbox/bench/upper".into(),
            work: "/run/agent-sandbox/bench/work".into(),
        }),
        protected: harden::protected_path_candidates(&spec, &policy),
        network_namespace: None,
        user_namespace: None,
        pod: None,
        host_namespaces: Vec::new(),
        placeholders: Some(harden::Placeholders {
            file: "/run/agent-sandbox/bench/placeholder/file".into(),
            dir: "/run/agent-sandbox/bench/placeholder/dir".into(),
        }),
        profile: None,
        support: Default::default(),
    };
    g.bench_function("harden podman config.json", |b| {
        b.iter(|| harden::harden_spec(black_box(spec.clone()), &policy, &ctx).unwrap())
    });
    g.finish();
}

fn matching(c: &mut Criterion) {
    let agent = SandboxPolicy::builtin("agent").unwrap().network.allowlist();
    // A large list: 1,000 exact hosts and 100 wildcards, the last one matching.
    let mut allow: Vec<DomainRule> = (0..1000)
        .map(|i| DomainRule::parse(&format!("host{i}.example.com:443")).unwrap())
        .collect();
    allow.extend((0..100).map(|i| DomainRule::parse(&format!("*.zone{i}.example.net")).unwrap()));
    let large = Allowlist::new(
        allow,
        vec![DomainRule::parse("bad.zone99.example.net").unwrap()],
    );
    let mut g = c.benchmark_group("allowlist");
    for (name, list, host, port) in [
        ("agent: exact hit", &agent, "pypi.org", 443),
        ("agent: wildcard hit", &agent, "index.crates.io", 443),
        ("agent: miss", &agent, "collector.evil.example", 443),
        (
            "1100 rules: last wildcard",
            &large,
            "a.b.zone99.example.net",
            8443,
        ),
        ("1100 rules: deny", &large, "bad.zone99.example.net", 443),
        ("1100 rules: miss", &large, "nowhere.example.org", 443),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| list.decide(black_box(host), black_box(port)))
        });
    }
    g.finish();
}

criterion_group!(benches, compilation, matching);
criterion_main!(benches);

//! What each fuzz target does with its input. The cargo-fuzz binaries in `fuzz/fuzz_targets`
//! call these, and `tests/regressions.rs` replays every saved input in
//! `fuzz/regressions/<target>/` through the same function on the stable toolchain.
//!
//! A target fails by panicking: besides "no panic, no hang" on any input, each checks the
//! property its code exists for (a parsed policy compiles, narrowing never widens, a hardened
//! spec is hardened, a refused proxy request names no target).
#![cfg_attr(test, allow(clippy::too_many_lines))]
// a unit test may be a long scenario
// A fuzz harness reports a violated property by panicking; that is its only way to fail.
#![allow(clippy::panic)]
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{self, HostFacts, IdMapping, OverlayDirs};
use agent_sandbox_policy::policy::NetworkMode;
use agent_sandbox_policy::seccomp::{Arch, compile_bpf, oci_seccomp_json};
use agent_sandbox_proxy::fuzzing::{FirstRequest, first_request};

/// What a fuzz target does with one input.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/regressions/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("policy_toml", policy_toml),
    ("annotations", annotations),
    ("harden_spec", harden_spec),
    ("proxy_request", proxy_request),
    ("client_hello", client_hello),
    ("dns_query", dns_query),
];

/// The built-in `agent` policy, parsed once (parsing it per input would dominate the run).
fn agent() -> SandboxPolicy {
    static AGENT: std::sync::OnceLock<SandboxPolicy> = std::sync::OnceLock::new();
    AGENT
        .get_or_init(|| match SandboxPolicy::builtin("agent") {
            Ok(p) => p,
            Err(e) => panic!("the built-in agent policy does not load: {e}"),
        })
        .clone()
}

/// A policy file: parsing never panics; a policy that parses compiles to every artifact
/// (seccomp BPF and OCI JSON, Landlock, AppArmor, explain, the allowlist).
pub fn policy_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policy = match SandboxPolicy::parse(text, "fuzz.toml") {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
            return;
        }
    };
    if let Err(e) = compile_bpf(&policy.syscalls, Arch::X86_64) {
        panic!("a valid policy's seccomp filter does not compile: {e}");
    }
    if let Err(e) = oci_seccomp_json(&policy.syscalls) {
        panic!("a valid policy's OCI seccomp does not compile: {e}");
    }
    let _ = agent_sandbox_policy::landlock::ruleset(&policy).to_json();
    let _ = agent_sandbox_policy::apparmor::profile(&policy, "fuzz");
    let _ = agent_sandbox_policy::explain::explain(&policy);
    let list = policy.network.allowlist();
    if policy.network.mode == NetworkMode::None {
        assert!(
            !list.decide("pypi.org", 443).allowed,
            "mode none allows a host"
        );
    }
}

/// Splits `data` into `key=value` lines; keys without the prefix get `io.agent.sandbox.`.
fn annotation_map(data: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let key = if k.starts_with("io.") {
                k.to_owned()
            } else {
                format!("io.agent.sandbox.{k}")
            };
            (key, v.to_owned())
        })
        .collect()
}

/// Annotations narrowing the `agent` ceiling: whatever they say, the effective policy is
/// within the ceiling (`narrow::within`) or the annotations are refused.
pub fn annotations(data: &[u8]) {
    let ceiling = agent();
    let map = annotation_map(data);
    match harden::effective_policy(&map, &ceiling) {
        Ok(effective) => {
            if let Err(e) = agent_sandbox_policy::narrow::within(&effective, &ceiling) {
                panic!("annotations {map:?} widened the policy: {e}");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an error without a message"),
    }
}

fn context(spec: &oci_spec::runtime::Spec, policy: &SandboxPolicy) -> HostFacts {
    let mapping = IdMapping {
        container_id: 0,
        host_id: 1_000_000,
        size: 65536,
    };
    HostFacts {
        uid_mappings: vec![mapping],
        gid_mappings: vec![mapping],
        parent_root_unprivileged: false,
        workspace: harden::workspace_source(spec, policy).map(|_| OverlayDirs {
            upper: PathBuf::from("/run/agent-sandbox/fuzz/upper"),
            work: PathBuf::from("/run/agent-sandbox/fuzz/work"),
        }),
        protected: harden::protected_path_candidates(spec, policy),
        network_namespace: None,
        user_namespace: None,
        host_namespaces: Vec::new(),
        pod: None,
        placeholders: Some(harden::Placeholders {
            file: PathBuf::from("/run/agent-sandbox/fuzz/placeholder/file"),
            dir: PathBuf::from("/run/agent-sandbox/fuzz/placeholder/dir"),
        }),
        profile: None,
        support: Default::default(),
    }
}

/// An arbitrary config.json through `harden_spec` with the `agent` ceiling: either an error,
/// or a spec that is hardened whatever it asked for (read-only root, no_new_privs, no
/// capabilities, user and network namespaces without paths, no host uid 0, every bind but the
/// engine's `/dev/shm` read-only).
pub fn harden_spec(data: &[u8]) {
    let Ok(spec) = serde_json::from_slice::<oci_spec::runtime::Spec>(data) else {
        return;
    };
    let ceiling = agent();
    let ctx = context(&spec, &ceiling);
    let hardened = match harden::harden_spec(spec, &ceiling, &ctx) {
        Ok(h) => h,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
            return;
        }
    };
    let spec = &hardened.spec;
    let root_ro = spec
        .root()
        .as_ref()
        .is_some_and(|r| r.readonly() == Some(true));
    assert!(root_ro, "root not read-only: {:?}", spec.root());
    if let Some(process) = spec.process() {
        assert_eq!(
            process.no_new_privileges(),
            Some(true),
            "no_new_privs not set"
        );
        if let Some(caps) = process.capabilities() {
            for set in [
                caps.bounding(),
                caps.effective(),
                caps.permitted(),
                caps.inheritable(),
                caps.ambient(),
            ] {
                assert!(
                    set.as_ref().is_none_or(|s| s.is_empty()),
                    "capabilities left: {caps:?}"
                );
            }
        }
    }
    let linux = spec.linux().as_ref();
    let namespaces = linux
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default();
    for want in [
        oci_spec::runtime::LinuxNamespaceType::User,
        oci_spec::runtime::LinuxNamespaceType::Network,
    ] {
        let ns = namespaces.iter().find(|n| n.typ() == want);
        assert!(
            ns.is_some_and(|n| n.path().is_none()),
            "{want:?} namespace missing or joined by path: {namespaces:?}"
        );
    }
    for m in linux
        .and_then(|l| l.uid_mappings().clone())
        .unwrap_or_default()
    {
        let end = u64::from(m.host_id()) + u64::from(m.size());
        assert!(
            m.host_id() > 0 && end > u64::from(m.host_id()),
            "host uid 0 mapped: {m:?}"
        );
    }
    for m in spec.mounts().iter().flatten() {
        let opts = m.options().clone().unwrap_or_default();
        // A bind mount as the kernel and libcontainer see it: type `bind`, or the exact
        // option `bind`/`rbind` (an option like `mode=bind` is not one; that loose test was
        // this harness's first "crash", kept in fuzz/regressions/harden_spec/).
        let bind =
            m.typ().as_deref() == Some("bind") || opts.iter().any(|o| o == "bind" || o == "rbind");
        if bind && m.destination() != std::path::Path::new("/dev/shm") {
            assert!(opts.iter().any(|o| o == "ro"), "writable bind mount: {m:?}");
        }
    }
}

/// A client's first bytes as the proxy reads them (HTTP CONNECT / absolute form, SOCKS5):
/// never a panic or a hang, and an accepted request names a host the rules can judge.
pub fn proxy_request(data: &[u8]) {
    let Some(&first) = data.first() else {
        return;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(r) => r,
        Err(e) => panic!("no tokio runtime: {e}"),
    };
    let mut stream = tokio::io::join(data, tokio::io::sink());
    let result = runtime.block_on(first_request(first, &mut stream, 32 * 1024));
    let list = agent().network.allowlist();
    match result {
        Ok(
            FirstRequest::Connect { host, port }
            | FirstRequest::Socks { host, port }
            | FirstRequest::Forward { host, port, .. },
        ) => {
            let _ = list.decide(&host.to_string(), port);
        }
        Ok(FirstRequest::Unrecognised { first: b }) => {
            assert!(
                b != 0x05 && !b.is_ascii_alphabetic(),
                "{b:#04x} unrecognised"
            );
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an error without a message"),
    }
}

/// A tunnel's first bytes as the proxy reads them for the TLS server name: never a panic, and
/// a name it reports is one the rules can judge (a normalised domain, never an address).
pub fn client_hello(data: &[u8]) {
    use agent_sandbox_proxy::Host;
    use agent_sandbox_proxy::sni::{Peek, parse};
    match parse(data) {
        Peek::Sni(name) => match Host::parse(&name) {
            Ok(Host::Domain(d)) if d == name => {}
            other => panic!("server name {name:?} is not a normalised domain: {other:?}"),
        },
        Peek::Malformed(why) => assert!(!why.is_empty(), "a refusal without a reason"),
        Peek::NoSni | Peek::NotTls | Peek::Incomplete => {}
    }
}

/// A datagram to the sandbox's DNS stub: never a panic; a name no rule allows is refused and
/// gets no stand-in; an answer, if any, is a response with the query's id.
pub fn dns_query(data: &[u8]) {
    use agent_sandbox_proxy::dns_stub::{StandIns, answer};
    use agent_sandbox_proxy::{EgressRules, Host};
    let list = agent().network.allowlist();
    let table = StandIns::new();
    let reply = answer(data, &|h: &Host| list.may_allow(h), &table);
    if reply.refused
        && let Some(Host::Domain(name)) = reply.question.as_ref().and_then(|q| q.host.clone())
    {
        assert!(
            table
                .addresses(&name)
                .is_some_and(|(v4, _)| v4.octets() == [198, 18, 0, 1]),
            "a refused name {name:?} got a stand-in before"
        );
    }
    if let (Some(r), Some(q)) = (reply.bytes.get(..3), data.get(..2)) {
        assert_eq!(&r[..2], q, "a response with another id");
        assert!(r[2] & 0x80 != 0, "an answer that is not a response");
    }
}

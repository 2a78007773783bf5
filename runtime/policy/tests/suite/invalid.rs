//! Invalid policies: each mistake gets its own specific error naming file, line and key.

use agent_sandbox_policy::{PolicyError, SandboxPolicy, Violation};

const ORIGIN: &str = "test/policy.toml";

fn err(text: &str) -> PolicyError {
    match SandboxPolicy::parse(text, ORIGIN) {
        Ok(p) => panic!("policy was accepted: {p:?}"),
        Err(e) => e,
    }
}

/// A parse-stage error: check line, key and a fragment of the message.
fn parse_err(text: &str, line: usize, key: &str, fragment: &str) {
    match err(text) {
        PolicyError::Parse {
            origin,
            line: l,
            key: k,
            message,
            ..
        } => {
            assert_eq!(origin, ORIGIN);
            assert_eq!((l, k.as_str()), (line, key), "message: {message}");
            assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
        }
        other => panic!("expected a parse error, got {other}"),
    }
}

/// A validation-stage error: check line and key, return the violation.
fn invalid(text: &str, line: usize, key: &str) -> Violation {
    match err(text) {
        PolicyError::Invalid {
            origin,
            line: l,
            key: k,
            violation,
            ..
        } => {
            assert_eq!(origin, ORIGIN);
            assert_eq!((l, k.as_str()), (line, key), "violation: {violation}");
            *violation
        }
        other => panic!("expected a validation error, got {other}"),
    }
}

#[test]
fn valid_policy_is_accepted() {
    let text = "[network]\nmode = \"proxy\"\nallow = [\"example.com\", \"*.example.org:443\"]\n";
    let p = SandboxPolicy::parse(text, ORIGIN).unwrap();
    assert_eq!(p.network.allow.len(), 2);
    // An empty file is the tightest policy.
    assert!(SandboxPolicy::parse("", ORIGIN).is_ok());
}

#[test]
fn unknown_key() {
    parse_err(
        "[network]\nmode = \"none\"\nmodee = \"proxy\"\n",
        3,
        "network.modee",
        "unknown field `modee`",
    );
    parse_err("[netwrk]\n", 1, "netwrk", "unknown field `netwrk`");
}

#[test]
fn syntax_error_names_line() {
    parse_err("[resources]\npids = \n", 2, "resources", "");
}

#[test]
fn bad_size() {
    parse_err(
        "[resources]\nmemory = \"12MB\"\n",
        2,
        "resources.memory",
        "size `12MB` is not a number of bytes",
    );
    parse_err(
        "[filesystem]\nscratch = [\n  { path = \"/tmp\", size = \"0\" },\n]\n",
        3,
        "filesystem.scratch[0].size",
        "must be larger than zero",
    );
}

#[test]
fn relative_path() {
    parse_err(
        "[filesystem]\nworkspace = \"workspace\"\n",
        2,
        "filesystem.workspace",
        "path `workspace` is not absolute",
    );
}

#[test]
fn dotdot_path() {
    parse_err(
        "[filesystem]\nscratch = [{ path = \"/tmp/../etc\", size = \"1M\" }]\n",
        2,
        "filesystem.scratch[0].path",
        "contains `..`",
    );
}

#[test]
fn star_wildcard() {
    parse_err(
        "[network]\nmode = \"proxy\"\nallow = [\"example.com\", \"*\"]\n",
        3,
        "network.allow[1]",
        "allows every host",
    );
}

#[test]
fn public_suffix_wildcard() {
    parse_err(
        "[network]\nmode = \"proxy\"\nallow = [\"*.com\"]\n",
        3,
        "network.allow[0]",
        "public suffix `com`",
    );
    parse_err(
        "[network]\nmode = \"proxy\"\nallow = [\"*.co.uk\"]\n",
        3,
        "network.allow[0]",
        "public suffix `co.uk`",
    );
}

#[test]
fn bad_port() {
    parse_err(
        "[network]\nmode = \"proxy\"\nallow = [\"example.com:70000\"]\n",
        3,
        "network.allow[0]",
        "bad port",
    );
    let v = invalid(
        "[network]\nmode = \"proxy\"\nproxy_port = 0\nallow = [\"example.com\"]\n",
        3,
        "network.proxy_port",
    );
    assert!(matches!(v, Violation::BadProxyPort), "{v}");
    let v = invalid(
        "[network]\nmode = \"none\"\nlocal_ports = [8080, 0]\n",
        3,
        "network.local_ports[1]",
    );
    assert!(matches!(v, Violation::BadLocalPort), "{v}");
}

#[test]
fn deny_contradicts_allow() {
    let v = invalid(
        "[network]\nmode = \"proxy\"\nallow = [\n  \"api.example.com\",\n  \"*.internal.example.com\",\n]\ndeny = [\"*.example.com\"]\n",
        4,
        "network.allow[0]",
    );
    match v {
        Violation::AllowShadowedByDeny { allow, deny } => {
            assert_eq!(allow.to_string(), "api.example.com");
            assert_eq!(deny.to_string(), "*.example.com");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn overlapping_writable_paths() {
    let v = invalid(
        "[filesystem]\nworkspace = \"/tmp/work\"\nscratch = [\n  { path = \"/tmp\", size = \"1M\" },\n]\n",
        2,
        "filesystem.workspace",
    );
    assert!(
        matches!(&v, Violation::OverlappingWritable { path, other }
            if path.as_str() == "/tmp/work" && other.as_str() == "/tmp"),
        "{v}"
    );
}

#[test]
fn capability_beyond_ceiling() {
    let v = invalid(
        "[privileges]\ncapabilities = [\"CAP_CHOWN\", \"CAP_SYS_ADMIN\"]\n",
        2,
        "privileges.capabilities[1]",
    );
    assert!(
        matches!(&v, Violation::CapabilityForbidden { capability } if capability.as_str() == "CAP_SYS_ADMIN"),
        "{v}"
    );
    parse_err(
        "[privileges]\ncapabilities = [\"CAP_FLY\"]\n",
        2,
        "privileges.capabilities[0]",
        "unknown capability `CAP_FLY`",
    );
}

#[test]
fn host_uid_zero_mapping() {
    let v = invalid(
        "[identity]\nid_range = 65536\nhost_start = 0\n",
        3,
        "identity.host_start",
    );
    assert!(matches!(v, Violation::HostRootMapped), "{v}");
}

#[test]
fn proxy_without_allow_list() {
    let v = invalid("\n[network]\nmode = \"proxy\"\n", 2, "network.allow");
    assert!(matches!(v, Violation::ProxyWithoutAllow), "{v}");
}

#[test]
fn rules_without_proxy() {
    let v = invalid("[network]\nallow = [\"example.com\"]\n", 2, "network.allow");
    assert!(matches!(v, Violation::RulesWithoutProxy), "{v}");
}

#[test]
fn writable_rootfs() {
    let v = invalid(
        "[filesystem]\nreadonly_rootfs = false\n",
        2,
        "filesystem.readonly_rootfs",
    );
    assert!(matches!(v, Violation::WritableRootfs), "{v}");
}

#[test]
fn no_new_privs_off() {
    let v = invalid(
        "[privileges]\nno_new_privs = false\n",
        2,
        "privileges.no_new_privs",
    );
    assert!(matches!(v, Violation::NoNewPrivsRequired), "{v}");
}

#[test]
fn user_namespace_off() {
    let v = invalid(
        "[identity]\nuser_namespace = false\n",
        2,
        "identity.user_namespace",
    );
    assert!(matches!(v, Violation::UserNamespaceRequired), "{v}");
}

#[test]
fn seccomp_optional() {
    let v = invalid("[layers]\nseccomp = \"optional\"\n", 2, "layers.seccomp");
    assert!(matches!(v, Violation::SeccompOptional), "{v}");
    parse_err(
        "[layers]\nseccomp = \"landlock-fallback\"\n",
        2,
        "layers.seccomp",
        "unknown variant",
    );
}

#[test]
fn masked_path_outside_proc_and_sys() {
    let v = invalid(
        "[filesystem]\nmasked_paths = [\"/proc/kallsyms\", \"/etc/shadow\"]\n",
        2,
        "filesystem.masked_paths[1]",
    );
    assert!(matches!(v, Violation::NotProcOrSys { .. }), "{v}");
}

#[test]
fn scratch_at_root() {
    let v = invalid(
        "[filesystem]\nscratch = [{ path = \"/\", size = \"1M\" }]\n",
        2,
        "filesystem.scratch[0].path",
    );
    assert!(matches!(v, Violation::ScratchAtRoot), "{v}");
}

#[test]
fn resource_ranges() {
    let v = invalid("[resources]\npids = 0\n", 2, "resources.pids");
    assert!(matches!(v, Violation::ZeroPids), "{v}");
    let v = invalid("[resources]\ncpu_shares = 1\n", 2, "resources.cpu_shares");
    assert!(matches!(v, Violation::CpuSharesRange), "{v}");
    parse_err(
        "[resources]\nwall_clock = \"10\"\n",
        2,
        "resources.wall_clock",
        "duration `10`",
    );
}

#[test]
fn syscall_table_errors_are_located() {
    let v = invalid(
        "[syscalls]\ndeny = [\"memfd_create\", \"memfd_create\"]\n",
        2,
        "syscalls.deny",
    );
    assert!(matches!(v, Violation::Syscalls { .. }), "{v}");
}

#[test]
fn error_display_names_file_line_and_key() {
    let e = err("[network]\nmode = \"proxy\"\nallow = [\"*.com\"]\n");
    let shown = e.to_string();
    assert!(shown.starts_with("test/policy.toml:3:"), "{shown}");
    assert!(shown.contains("network.allow[0]"), "{shown}");
}

#[test]
fn builtins_load_and_unknown_is_an_error() {
    for name in agent_sandbox_policy::builtin_names() {
        SandboxPolicy::builtin(name).unwrap();
    }
    assert!(matches!(
        SandboxPolicy::builtin("lax"),
        Err(PolicyError::UnknownProfile { .. })
    ));
}

mod fuzz {
    use agent_sandbox_policy::{PolicyError, SandboxPolicy};
    use proptest::prelude::*;

    const BASE: &str = include_str!("../../../../profiles/agent.toml");

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any edit of a real profile either parses or names a line inside the file.
        #[test]
        fn edits_never_panic_and_errors_are_located(
            at in 0usize..BASE.len(),
            cut in 0usize..40,
            insert in "[a-z_=\\[\\]\"*.:0-9 \n/-]{0,12}",
        ) {
            let mut text = BASE.to_owned();
            let start = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            let end = (start + cut).min(text.len());
            let end = (end..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
            text.replace_range(start..end, &insert);
            if let Err(e) = SandboxPolicy::parse(&text, "fuzz.toml") {
                let lines = text.lines().count() + 1;
                match &e {
                    PolicyError::Parse { line, .. } | PolicyError::Invalid { line, .. } => {
                        prop_assert!(*line >= 1 && *line <= lines, "{e}");
                    }
                    PolicyError::UnknownProfile { .. } => prop_assert!(false, "{e}"),
                }
                prop_assert!(e.to_string().starts_with("fuzz.toml:"));
            }
        }
    }
}

const CREDENTIAL_BASE: &str =
    "[network]\nmode = \"proxy\"\nallow = [\"registry.example:8080\", \"api.example:443\"]\n";

fn with_credential(body: &str) -> String {
    format!("{CREDENTIAL_BASE}[[network.credentials]]\n{body}")
}

#[test]
fn credential_is_accepted_for_plain_http() {
    let text = with_credential(
        "domain = \"registry.example:8080\"\nheader = \"Authorization\"\nprefix = \"Bearer \"\nenv = \"REGISTRY_TOKEN\"\n",
    );
    let p = SandboxPolicy::parse(&text, ORIGIN).unwrap();
    assert_eq!(p.network.credentials.len(), 1);
    assert_eq!(p.network.credentials[0].header, "Authorization");
}

#[test]
fn credential_for_https_is_refused_at_load() {
    let v = invalid(
        &with_credential(
            "domain = \"api.example:443\"\nheader = \"Authorization\"\nfile = \"/run/secrets/api\"\n",
        ),
        5,
        "network.credentials[0].domain",
    );
    assert!(matches!(v, Violation::CredentialNeedsTls { .. }), "{v}");
    assert!(v.to_string().contains("https = true"), "{v}");
}

#[test]
fn https_credential_is_accepted_with_its_placeholder_and_upstream_ca() {
    let text = with_credential(
        "domain = \"api.example:443\"\nheader = \"Authorization\"\nprefix = \"Bearer \"\n\
         file = \"/run/secrets/api\"\nhttps = true\nplaceholder_env = \"API_TOKEN\"\n\
         upstream_ca = \"/etc/ssl/api-ca.pem\"\n",
    );
    let p = SandboxPolicy::parse(&text, ORIGIN).unwrap();
    let c = &p.network.credentials[0];
    assert!(c.https && p.network.terminates_tls());
    assert_eq!(c.placeholder_env.as_deref(), Some("API_TOKEN"));
    // Round trip (the runtime stores the effective policy as JSON for execs).
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<SandboxPolicy>(&json).unwrap(), p);
}

#[test]
fn https_credential_keys_are_checked_by_name() {
    let v = invalid(
        &with_credential(
            "domain = \"registry.example:8080\"\nheader = \"X-Key\"\nenv = \"T\"\nupstream_ca = \"/ca.pem\"\n",
        ),
        8,
        "network.credentials[0].upstream_ca",
    );
    assert!(
        matches!(v, Violation::NeedsHttps { key: "upstream_ca" }),
        "{v}"
    );
    let v = invalid(
        &with_credential(
            "domain = \"api.example:443\"\nheader = \"X-Key\"\nenv = \"T\"\nhttps = true\nplaceholder_env = \"HTTPS_PROXY\"\n",
        ),
        9,
        "network.credentials[0].placeholder_env",
    );
    assert!(matches!(v, Violation::CredentialPlaceholder { .. }), "{v}");
    parse_err(
        &with_credential(
            "domain = \"api.example:443\"\nheader = \"X-Key\"\nenv = \"T\"\nhttps = \"yes\"\n",
        ),
        8,
        "network.credentials[0].https",
        "bool",
    );
    parse_err(
        &with_credential(
            "domain = \"api.example:443\"\nheader = \"X-Key\"\nenv = \"T\"\nupstream_ca = \"ca.pem\"\n",
        ),
        8,
        "network.credentials[0].upstream_ca",
        "not absolute",
    );
}

#[test]
fn credential_errors_name_their_key() {
    let v = invalid(
        &with_credential(
            "domain = \"other.example:80\"\nheader = \"Authorization\"\nenv = \"T\"\n",
        ),
        5,
        "network.credentials[0].domain",
    );
    assert!(matches!(v, Violation::CredentialNotAllowed { .. }), "{v}");
    let v = invalid(
        &with_credential("domain = \"registry.example:8080\"\nheader = \"Host\"\nenv = \"T\"\n"),
        6,
        "network.credentials[0].header",
    );
    assert!(matches!(v, Violation::CredentialHeader { .. }), "{v}");
    let v = invalid(
        &with_credential(
            "domain = \"registry.example:8080\"\nheader = \"X-Key\"\nprefix = \"a\\r\\nX-Evil: 1\"\nenv = \"T\"\n",
        ),
        7,
        "network.credentials[0].prefix",
    );
    assert!(matches!(v, Violation::CredentialPrefix), "{v}");
    let v = invalid(
        &with_credential("domain = \"registry.example:8080\"\nheader = \"X-Key\"\nenv = \"A=B\"\n"),
        7,
        "network.credentials[0].env",
    );
    assert!(matches!(v, Violation::CredentialEnv { .. }), "{v}");
    parse_err(
        &with_credential(
            "domain = \"registry.example:8080\"\nheader = \"X-Key\"\nfile = \"relative\"\n",
        ),
        7,
        "network.credentials[0].file",
        "not absolute",
    );
    let v = invalid(
        &with_credential(
            "domain = \"registry.example:8080\"\nheader = \"X-Key\"\nenv = \"T\"\nfile = \"/run/t\"\n",
        ),
        4,
        "network.credentials[0]",
    );
    assert!(matches!(v, Violation::CredentialSource), "{v}");
    let v = invalid(
        "[[network.credentials]]\ndomain = \"registry.example:8080\"\nheader = \"X-Key\"\nenv = \"T\"\n",
        1,
        "network.credentials",
    );
    assert!(matches!(v, Violation::CredentialsWithoutProxy), "{v}");
}

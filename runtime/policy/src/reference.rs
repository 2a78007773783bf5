//! The policy reference: one row per key of a profile, with the annotation that may narrow it
//! and the layer that enforces it. `docs/policy-reference.md` is generated from [`KEYS`] and
//! the built-in defaults by [`markdown`]; the tests fail when a key the parser accepts has no
//! row, or when the page and the table disagree, so adding a key starts here.

/// One policy key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    /// The dotted key, as written in a profile (`resources.memory`).
    pub key: &'static str,
    /// The `io.agent.sandbox.*` annotation that may narrow it, if any.
    pub annotation: Option<&'static str>,
    /// What enforces it.
    pub layer: &'static str,
    /// What it means, with the page that tells more.
    pub meaning: &'static str,
}

const fn row(
    key: &'static str,
    annotation: Option<&'static str>,
    layer: &'static str,
    meaning: &'static str,
) -> KeyDoc {
    KeyDoc {
        key,
        annotation,
        layer,
        meaning,
    }
}

/// Tables whose own keys have rows (an array of tables, such as `network.credentials`, is one
/// row; its fields are on the page it links).
pub const TABLES: &[&str] = &[
    "filesystem",
    "identity",
    "privileges",
    "syscalls",
    "network",
    "network.approvals",
    "resources",
    "ucounts",
    "layers",
];

const UCOUNT: &str = "the sandbox's user namespace (`/proc/sys/user/max_*` inside it)";

/// Every key, in the order of a profile.
pub const KEYS: &[KeyDoc] = &[
    row("description", None, "none", "One line for people."),
    row(
        "filesystem.readonly_rootfs",
        None,
        "mounts: the root is read-only",
        "Must be `true`; a `false` is refused.",
    ),
    row(
        "filesystem.scratch",
        None,
        "mounts: a fresh tmpfs per entry",
        "Writable areas (`{ path, size }`), thrown away at delete.",
    ),
    row(
        "filesystem.workspace",
        None,
        "mounts: an overlay over the host directory",
        "Where the workspace appears; its writes are a change set (docs/workspace.md).",
    ),
    row(
        "filesystem.workspace_size",
        None,
        "an ext4 image under the overlay's upper layer (rootful)",
        "The most the agent may write in the workspace (ENOSPC past it).",
    ),
    row(
        "filesystem.changes_max_age",
        None,
        "the change-set store",
        "How long an unpromoted change set is kept after its sandbox ends.",
    ),
    row(
        "filesystem.changes_max_total",
        None,
        "the change-set store",
        "The most disk all kept change sets may take; the oldest ended ones go first.",
    ),
    row(
        "filesystem.protected",
        None,
        "read-only binds; promote's refusals",
        "Names added to the mandatory protected names (docs/policy.md#protected-names).",
    ),
    row(
        "filesystem.masked_paths",
        None,
        "mounts",
        "Paths under /proc or /sys hidden besides the mandatory ones.",
    ),
    row(
        "filesystem.readonly_paths",
        None,
        "mounts",
        "Paths under /proc or /sys read-only besides the mandatory ones.",
    ),
    row(
        "identity.user_namespace",
        None,
        "the user namespace",
        "Must be `true`.",
    ),
    row(
        "identity.id_range",
        None,
        "the user namespace",
        "How many ids the sandbox gets (container ids `0..id_range`).",
    ),
    row(
        "identity.host_start",
        None,
        "the user namespace",
        "A fixed first host id; absent, the runtime allocates a range of its own.",
    ),
    row(
        "privileges.no_new_privs",
        None,
        "`PR_SET_NO_NEW_PRIVS`",
        "Must be `true`.",
    ),
    row(
        "privileges.capabilities",
        Some("io.agent.sandbox.capabilities"),
        "capability sets",
        "The capabilities a container may keep if its config asks (a ceiling; docs/policy.md#widening-requests).",
    ),
    row(
        "syscalls.errno",
        None,
        "seccomp",
        "The errno a denied system call returns.",
    ),
    row(
        "syscalls.level",
        None,
        "seccomp",
        "`standard`, or `strict` to drop facilities agent tools do not need.",
    ),
    row(
        "syscalls.deny",
        None,
        "seccomp",
        "System calls removed from the allowlist.",
    ),
    row(
        "network.mode",
        Some("io.agent.sandbox.network"),
        "network namespace with only `lo`; the egress proxy",
        "`none` (loopback only) or `proxy` (loopback plus the proxy).",
    ),
    row(
        "network.proxy_port",
        None,
        "the egress proxy",
        "The proxy's port on the sandbox's 127.0.0.1.",
    ),
    row(
        "network.local_ports",
        Some("io.agent.sandbox.network.local-ports"),
        "Landlock TCP rules (ABI 4+)",
        "Ports the sandbox may connect to on its own loopback besides the proxy's.",
    ),
    row(
        "network.allow",
        Some("io.agent.sandbox.network.allow"),
        "the egress proxy",
        "Domain rules the proxy lets through (docs/egress.md).",
    ),
    row(
        "network.deny",
        Some("io.agent.sandbox.network.deny"),
        "the egress proxy",
        "Domain rules refused even when `allow` or an approval covers them.",
    ),
    row(
        "network.credentials",
        None,
        "the egress proxy",
        "Headers the proxy adds with secrets read on the host (docs/egress.md#https-credential-injection).",
    ),
    row(
        "network.audit_max_bytes",
        None,
        "the audit writers",
        "Size cap of what the sandbox can make its audit log hold (docs/audit.md).",
    ),
    row(
        "network.audit_at_cap",
        None,
        "the audit writers",
        "`stop` the sandbox at the cap, or `aggregate` its records into counts.",
    ),
    row(
        "network.approvals",
        None,
        "the egress proxy",
        "Live changes to the allowlist within a ceiling (docs/egress.md#approvals-asking-about-unknown-domains-and-changing-a-running-sandboxs-list).",
    ),
    row(
        "network.approvals.decider",
        None,
        "the egress proxy",
        "The host program asked about unlisted hosts (a Unix socket or loopback URL).",
    ),
    row(
        "network.approvals.timeout",
        None,
        "the egress proxy",
        "How long a connection is held for an answer.",
    ),
    row(
        "network.approvals.default",
        None,
        "the egress proxy",
        "The answer when the decider gives none: `deny` or `allow-once`.",
    ),
    row(
        "network.approvals.ceiling",
        None,
        "the egress proxy",
        "The hosts that may be opened while the sandbox runs.",
    ),
    row(
        "network.sni_mismatch",
        None,
        "the egress proxy",
        "A tunnel whose TLS server name is another host: `deny` or `record`.",
    ),
    row(
        "network.transparent",
        None,
        "a DNS stub and a redirect in the sandbox's namespace; the egress proxy",
        "Proxy-unaware tools are sent through the proxy (docs/egress.md).",
    ),
    row(
        "resources.memory",
        Some("io.agent.sandbox.memory"),
        "cgroup `memory.max` (and swap)",
        "Memory limit (docs/limits.md#memory-memory).",
    ),
    row(
        "resources.pids",
        Some("io.agent.sandbox.pids"),
        "cgroup `pids.max`",
        "Process and thread limit (docs/limits.md).",
    ),
    row(
        "resources.cpu_shares",
        Some("io.agent.sandbox.cpu-shares"),
        "cgroup CPU weight",
        "Relative CPU share.",
    ),
    row(
        "resources.cpu_quota_us",
        Some("io.agent.sandbox.cpu-quota-us"),
        "cgroup `cpu.max`",
        "CPU time per period, in microseconds.",
    ),
    row(
        "resources.cpu_period_us",
        None,
        "cgroup `cpu.max`",
        "The period of `cpu_quota_us`.",
    ),
    row(
        "resources.wall_clock",
        Some("io.agent.sandbox.wall-clock"),
        "the wall-clock watchdog",
        "The sandbox is killed after this long (docs/limits.md).",
    ),
    row(
        "resources.init",
        None,
        "the reaping init",
        "Who is PID 1: `auto`, `always` or `never` (docs/limits.md).",
    ),
    row(
        "ucounts.inotify_instances",
        None,
        UCOUNT,
        "inotify instances per user.",
    ),
    row(
        "ucounts.inotify_watches",
        None,
        UCOUNT,
        "inotify watches per user.",
    ),
    row(
        "ucounts.fanotify_groups",
        None,
        UCOUNT,
        "fanotify groups per user.",
    ),
    row(
        "ucounts.fanotify_marks",
        None,
        UCOUNT,
        "fanotify marks per user.",
    ),
    row(
        "ucounts.user_namespaces",
        None,
        UCOUNT,
        "user namespaces per user.",
    ),
    row(
        "ucounts.mnt_namespaces",
        None,
        UCOUNT,
        "mount namespaces per user.",
    ),
    row(
        "ucounts.pid_namespaces",
        None,
        UCOUNT,
        "pid namespaces per user.",
    ),
    row(
        "ucounts.net_namespaces",
        None,
        UCOUNT,
        "network namespaces per user.",
    ),
    row(
        "ucounts.ipc_namespaces",
        None,
        UCOUNT,
        "IPC namespaces per user.",
    ),
    row(
        "ucounts.uts_namespaces",
        None,
        UCOUNT,
        "UTS namespaces per user.",
    ),
    row(
        "ucounts.cgroup_namespaces",
        None,
        UCOUNT,
        "cgroup namespaces per user.",
    ),
    row(
        "ucounts.time_namespaces",
        None,
        UCOUNT,
        "time namespaces per user.",
    ),
    row(
        "layers.seccomp",
        None,
        "create (fails closed)",
        "Whether a sandbox may start without seccomp (docs/lsm.md).",
    ),
    row(
        "layers.landlock",
        None,
        "create (fails closed)",
        "Whether a sandbox may start without Landlock (docs/lsm.md).",
    ),
    row(
        "layers.apparmor",
        None,
        "create (fails closed)",
        "Whether AppArmor is required, or Landlock stands in for it (docs/lsm.md).",
    ),
    row(
        "layers.cgroups",
        None,
        "create (fails closed)",
        "Whether a sandbox may start without its cgroup limits.",
    ),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fmt::Write as _;
    use std::path::PathBuf;

    use super::*;
    use crate::SandboxPolicy;

    /// The value `key` has in `policy`, as a profile would write it, or `none` when it is unset.
    fn value_of(policy: &toml::Value, key: &str) -> String {
        let mut at = policy;
        for part in key.split('.') {
            match at.get(part) {
                Some(next) => at = next,
                None => return "none".to_owned(),
            }
        }
        match at {
            toml::Value::String(s) if s.is_empty() => "\"\"".to_owned(),
            toml::Value::Table(_) => "(table)".to_owned(),
            toml::Value::Array(a) if a.len() > 3 => format!("{} entries", a.len()),
            other => other.to_string(),
        }
    }

    fn as_value(policy: &SandboxPolicy) -> toml::Value {
        toml::Value::try_from(policy).expect("a policy always serializes")
    }

    /// `docs/policy-reference.md`.
    pub fn markdown() -> String {
        let default = as_value(&SandboxPolicy::default());
        let agent =
            as_value(&SandboxPolicy::builtin("agent").expect("the agent profile is built in"));
        let mut out = String::from(
            "# Policy reference\n\n\
             Generated from `runtime/policy/src/reference.rs` by its tests (run\n\
             `UPDATE_POLICY_REFERENCE=1 cargo test -p agent-sandbox-policy reference` after adding a\n\
             row); a key the policy parser accepts without a row here fails the tests.\n\n\
             - **default**: the value when a profile leaves the key out; **agent**: the built-in\n  \
             `agent` profile's (`profiles/agent.toml`).\n\
             - **annotation**: the `io.agent.sandbox.*` annotation that may narrow the key for one\n  \
             sandbox; it can never widen it past the ceiling (docs/policy.md). Any key can also be\n  \
             narrowed as a whole by naming a profile with `io.agent.sandbox.profile`\n  \
             (docs/policy.md#profiles-by-annotation).\n\
             - **enforced by**: the layer that makes it true; `agent-sandbox layers ID` shows which are in\n  \
             force for a sandbox.\n\n\
             | key | default | agent | annotation | enforced by | meaning |\n\
             | --- | --- | --- | --- | --- | --- |\n",
        );
        for k in KEYS {
            let annotation = k.annotation.map_or("—".to_owned(), |a| format!("`{a}`"));
            let cell = |v: String| v.replace('|', "\\|");
            writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                k.key,
                cell(format!("`{}`", value_of(&default, k.key))),
                cell(format!("`{}`", value_of(&agent, k.key))),
                annotation,
                k.layer,
                k.meaning
            )
            .expect("writing to a String");
        }
        out
    }

    /// The fields serde accepts in the table at `path`, read from the error it gives for an
    /// unknown one (every policy table denies unknown fields and names the expected ones).
    fn accepted_fields(path: &str) -> Vec<String> {
        let doc = match path {
            "" => "zz_unknown_key = 1\n".to_owned(),
            // Its required key first, so the parser gets as far as the unknown one.
            "network.approvals" => {
                "[network.approvals]\nceiling = [\"example.com:443\"]\nzz_unknown_key = 1\n"
                    .to_owned()
            }
            _ => format!("[{path}]\nzz_unknown_key = 1\n"),
        };
        let err = toml::from_str::<SandboxPolicy>(&doc)
            .expect_err("an unknown key is refused")
            .to_string();
        let list = err
            .split_once("expected one of ")
            .or_else(|| err.split_once("expected "))
            .unwrap_or_else(|| panic!("no expected fields in: {err}"))
            .1;
        // "`a`, `b`, `c`" or "`a` or `b`": the names are what the backquotes hold.
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_key_the_parser_accepts_has_a_row_and_every_row_is_a_key() {
        let rows: BTreeSet<&str> = KEYS.iter().map(|k| k.key).collect();
        assert_eq!(rows.len(), KEYS.len(), "a key has two rows");
        let mut accepted = BTreeSet::new();
        for table in std::iter::once("").chain(TABLES.iter().copied()) {
            for field in accepted_fields(table) {
                let key = if table.is_empty() {
                    field
                } else {
                    format!("{table}.{field}")
                };
                if !TABLES.contains(&key.as_str()) || key == "network.approvals" {
                    accepted.insert(key);
                }
            }
        }
        let accepted: BTreeSet<&str> = accepted.iter().map(String::as_str).collect();
        let missing: Vec<_> = accepted.difference(&rows).collect();
        assert!(
            missing.is_empty(),
            "keys without a row in runtime/policy/src/reference.rs: {missing:?}"
        );
        let stale: Vec<_> = rows.difference(&accepted).collect();
        assert!(
            stale.is_empty(),
            "rows for keys the parser refuses: {stale:?}"
        );
    }

    #[test]
    fn every_annotation_in_the_table_is_one_the_runtime_reads() {
        let ceiling = SandboxPolicy::builtin("agent").unwrap();
        for annotation in KEYS.iter().filter_map(|k| k.annotation) {
            let asked = [(annotation.to_owned(), "\u{1}not a value".to_owned())].into();
            let err = crate::harden::effective_policy(&asked, &ceiling)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                !err.contains("unknown annotation"),
                "{annotation}: the runtime does not read it: {err}"
            );
        }
    }

    #[test]
    fn the_page_is_generated_from_the_table() {
        let page = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/policy-reference.md");
        let want = markdown();
        if std::env::var_os("UPDATE_POLICY_REFERENCE").is_some() {
            std::fs::write(&page, &want).unwrap();
        }
        let have = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            have == want,
            "docs/policy-reference.md is stale: run UPDATE_POLICY_REFERENCE=1 cargo test -p agent-sandbox-policy reference"
        );
    }
}

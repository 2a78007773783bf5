//! `SandboxPolicy`: the typed policy, its TOML parser with located errors, the built-in
//! profiles and the semantic validation that runs on every load.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::layers::{Layers, Requirement};
use crate::network::{self, Allowlist, Credential, DomainRule, SecretSource};
use crate::seccomp::SyscallPolicy;
use crate::span::{self, KeyPath};
use crate::value::{AbsPath, ByteSize, Capability, ProtectedName, Seconds};

/// One name of [`MANDATORY_PROTECTED`] and why it is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtectedEntry {
    /// The name, relative to a writable place; a trailing `/` marks a directory.
    pub name: &'static str,
    /// What a tool does with it that runs code or hands over credentials.
    pub why: &'static str,
    /// A credential store: besides staying unwritable, it is masked (an empty read-only
    /// file or directory bound over it) wherever the runtime finds it in a workspace, so the
    /// sandbox cannot read it even where it has the owner's uid (rootless podman,
    /// docs/workspace.md#secret-names).
    pub secret: bool,
}

const fn entry(name: &'static str, why: &'static str) -> ProtectedEntry {
    ProtectedEntry {
        name,
        why,
        secret: false,
    }
}

/// An entry that is also a credential store ([`ProtectedEntry::secret`]).
const fn secret(name: &'static str, why: &'static str) -> ProtectedEntry {
    ProtectedEntry {
        name,
        why,
        secret: true,
    }
}

const SHELL: &str = "read by a shell at start: runs commands in every later shell";
const GIT_CONFIG: &str =
    "git configuration: names programs git runs (core.fsmonitor, core.pager, hooks path)";
const HOOK_MANAGER: &str = "a git hook manager's configuration: commands run on commit";
const MISE: &str = "mise configuration: tasks, hooks and environment run on entering the directory";
const AGENT: &str =
    "an AI agent's or editor's configuration: hooks and MCP servers it starts are commands";

/// Names that stay unwritable inside every writable place, whatever the policy says: each
/// is read by a tool that then runs code or uses credentials without the user asking for it
/// (a shell starting, an editor or an agent opening the folder, `git commit`, `cd`, a
/// package install, a push to CI). Written in the sandbox they would act in the sandbox's
/// next tool call; promoted to the host, on the developer's machine. The in-sandbox
/// protection (`harden`), promotion's refusals (`agent_sandbox_audit::promote::Rules`) and
/// the AppArmor profile all use this list; docs/policy.md#protected-names says why each
/// name is here. A trailing `/` marks a directory.
pub const MANDATORY_PROTECTED: &[ProtectedEntry] = &[
    // Shell start-up files.
    entry(".bashrc", SHELL),
    entry(".bash_profile", SHELL),
    entry(".bash_login", SHELL),
    entry(".bash_logout", SHELL),
    entry(".profile", SHELL),
    entry(".zshrc", SHELL),
    entry(".zshenv", SHELL),
    entry(".zprofile", SHELL),
    entry(".zlogin", SHELL),
    entry(".zlogout", SHELL),
    entry(".config/fish/", SHELL),
    // Git.
    entry(
        ".git/hooks/",
        "git runs these scripts on commit, checkout, merge and push",
    ),
    entry(".git/config", GIT_CONFIG),
    entry(".gitconfig", GIT_CONFIG),
    entry(".config/git/", GIT_CONFIG),
    entry(
        ".gitmodules",
        "submodule URLs and paths git clones and checks out on `submodule update`",
    ),
    entry(
        ".githooks/",
        "the usual core.hooksPath directory: run on commit",
    ),
    entry(".husky/", HOOK_MANAGER),
    entry(".pre-commit-config.yaml", HOOK_MANAGER),
    entry("lefthook.yml", HOOK_MANAGER),
    entry(".lefthook.yml", HOOK_MANAGER),
    entry("lefthook.yaml", HOOK_MANAGER),
    entry(".lefthook.yaml", HOOK_MANAGER),
    entry("lefthook-local.yml", HOOK_MANAGER),
    entry(".lefthook-local.yml", HOOK_MANAGER),
    // Credential stores: also masked (ProtectedEntry::secret).
    secret(
        ".ssh/",
        "keys, authorized_keys and a config whose ProxyCommand is a command",
    ),
    secret(
        ".gnupg/",
        "GnuPG's private keys, and agent settings that name programs",
    ),
    secret(
        ".aws/",
        "AWS keys, and a config whose credential_process is a command",
    ),
    secret(
        ".netrc",
        "logins and passwords that curl, git and ftp hand to servers",
    ),
    secret(
        ".git-credentials",
        "passwords and tokens git's store helper hands to servers",
    ),
    secret(
        ".docker/",
        "registry logins, and credential helpers Docker runs",
    ),
    secret(
        ".kube/",
        "cluster credentials, and kubeconfig exec plugins that are commands",
    ),
    secret(
        ".config/gh/",
        "the GitHub CLI's token, and aliases that run commands",
    ),
    secret(".pypirc", "package index passwords and tokens uploads use"),
    secret(
        ".cargo/credentials.toml",
        "registry tokens cargo publishes with",
    ),
    secret(
        ".cargo/credentials",
        "registry tokens cargo publishes with (old name)",
    ),
    // Editors and dev containers.
    entry(
        ".vscode/",
        "tasks run on folder open, settings that name programs",
    ),
    entry(
        ".idea/",
        "run configurations and startup tasks of JetBrains IDEs",
    ),
    entry(".zed/", "language and context servers Zed starts on open"),
    entry(".helix/", "language servers Helix starts on open"),
    entry(
        ".exrc",
        "Vim's and Neovim's per-directory startup commands (exrc)",
    ),
    entry(".nvimrc", "Neovim's per-directory startup commands (exrc)"),
    entry(".nvim.lua", "Neovim's per-directory startup Lua (exrc)"),
    entry(
        ".devcontainer/",
        "dev container definitions: lifecycle commands run when the folder is opened",
    ),
    entry(
        ".devcontainer.json",
        "a dev container definition: lifecycle commands run when the folder is opened",
    ),
    // AI agents.
    entry(".mcp.json", AGENT),
    entry(".claude/", AGENT),
    entry(".cursor/", AGENT),
    entry(".gemini/", AGENT),
    entry(".codex/", AGENT),
    entry(".amazonq/", AGENT),
    entry(".roo/", AGENT),
    entry(".kiro/", AGENT),
    entry(".continue/", AGENT),
    entry(".opencode/", AGENT),
    entry("opencode.json", AGENT),
    entry("opencode.jsonc", AGENT),
    entry(".aider.conf.yml", AGENT),
    // Directory environments.
    entry(".envrc", "direnv runs it on entering the directory"),
    entry("mise.toml", MISE),
    entry(".mise.toml", MISE),
    entry("mise.local.toml", MISE),
    entry(".mise.local.toml", MISE),
    entry(".mise/", MISE),
    entry(".config/mise/", MISE),
    entry(".config/mise.toml", MISE),
    entry(
        ".tool-versions",
        "asdf and mise install and run the tool versions named there",
    ),
    // Package managers.
    entry(
        ".npmrc",
        "npm settings that name programs (script-shell, node-options) and registry tokens",
    ),
    entry(".yarnrc", "yarn 1's yarn-path: the program run as yarn"),
    entry(
        ".yarnrc.yml",
        "yarn's yarnPath and plugins: code run as yarn",
    ),
    entry(".pnpmfile.cjs", "pnpm runs its hooks on every install"),
    entry(
        ".cargo/config.toml",
        "cargo's rustc-wrapper, runners and registries",
    ),
    entry(
        ".cargo/config",
        "cargo's rustc-wrapper, runners and registries (old name)",
    ),
    // Continuous integration.
    entry(
        ".github/workflows/",
        "CI jobs run on the next push with the repository's secrets and tokens",
    ),
    entry(
        ".gitlab-ci.yml",
        "CI jobs run on the next push with the repository's secrets and tokens",
    ),
];

/// The names of [`MANDATORY_PROTECTED`].
pub fn mandatory_protected_names() -> impl Iterator<Item = &'static str> {
    MANDATORY_PROTECTED.iter().map(|e| e.name)
}

/// Whether `name` is a credential store of [`MANDATORY_PROTECTED`], masked wherever it is
/// found ([`ProtectedEntry::secret`]). A policy's extra names are never secrets: masking
/// hides a file the tools may need, so only this list decides it.
pub fn is_secret(name: &ProtectedName) -> bool {
    MANDATORY_PROTECTED
        .iter()
        .any(|e| e.secret && ProtectedName::try_from(e.name).is_ok_and(|n| n == *name))
}

/// Paths hidden from the sandbox in every policy (kernel state it has no business reading).
pub const MANDATORY_MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/sys/devices/virtual/powercap",
    "/sys/firmware",
];

/// Paths mounted read-only in every policy.
pub const MANDATORY_READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The names of the built-in profiles; the first is the default.
pub fn builtin_names() -> &'static [&'static str] {
    &["agent", "strict"]
}

const BUILTIN_AGENT: &str = include_str!("../../../profiles/agent.toml");
const BUILTIN_STRICT: &str = include_str!("../../../profiles/strict.toml");

/// Why a policy text was refused. Every variant names the file (`origin`), the 1-based
/// line and column, and the key path.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// TOML syntax, an unknown key, a wrong type or a malformed value.
    #[error("{origin}:{line}:{column}: {key}: {message}")]
    Parse {
        origin: String,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    /// Well-formed, but the values contradict each other or break a rule of the sandbox.
    #[error("{origin}:{line}:{column}: {key}: invalid policy")]
    Invalid {
        origin: String,
        line: usize,
        column: usize,
        key: String,
        #[source]
        violation: Box<Violation>,
    },
    #[error("unknown built-in profile `{name}` (known: agent, strict)")]
    UnknownProfile { name: String },
}

impl PolicyError {
    /// The violated rule, for errors found after parsing.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            PolicyError::Invalid { violation, .. } => Some(violation.as_ref()),
            _ => None,
        }
    }

    /// The key path the error is about (`network.allow[1]`).
    pub fn key(&self) -> Option<&str> {
        match self {
            PolicyError::Parse { key, .. } | PolicyError::Invalid { key, .. } => Some(key),
            PolicyError::UnknownProfile { .. } => None,
        }
    }

    /// The 1-based line of the error.
    pub fn line(&self) -> Option<usize> {
        match self {
            PolicyError::Parse { line, .. } | PolicyError::Invalid { line, .. } => Some(*line),
            PolicyError::UnknownProfile { .. } => None,
        }
    }
}

/// A rule of the sandbox that a well-formed policy broke.
#[derive(Debug, thiserror::Error)]
pub enum Violation {
    #[error("the root filesystem is always read-only")]
    WritableRootfs,
    #[error("the root directory cannot be a writable scratch area")]
    ScratchAtRoot,
    #[error("the workspace's writable layer needs at least {min} (a filesystem of its own)")]
    WorkspaceSizeTooSmall { min: ByteSize },
    #[error("writable path `{path}` overlaps writable path `{other}`")]
    OverlappingWritable { path: AbsPath, other: AbsPath },
    #[error("`{path}` is not under /proc or /sys")]
    NotProcOrSys { path: AbsPath },
    #[error("a sandbox always has its own user namespace")]
    UserNamespaceRequired,
    #[error("the id range must hold at least one id")]
    EmptyIdRange,
    #[error("host id range would include host uid 0")]
    HostRootMapped,
    #[error("host id range {start}+{size} does not fit in 32 bits")]
    IdRangeOverflow { start: u32, size: u32 },
    #[error("no_new_privs is always set")]
    NoNewPrivsRequired,
    #[error("capability {capability} cannot be granted to a sandbox")]
    CapabilityForbidden { capability: Capability },
    #[error("network mode `none` cannot have allow or deny rules")]
    RulesWithoutProxy,
    #[error("network mode `proxy` needs at least one allow rule")]
    ProxyWithoutAllow,
    #[error("allow rule `{allow}` is always denied by deny rule `{deny}`")]
    AllowShadowedByDeny { allow: DomainRule, deny: DomainRule },
    #[error("credentials need network mode `proxy`")]
    CredentialsWithoutProxy,
    #[error(
        "credential for `{domain}` cannot be injected into https without `https = true` (the proxy then terminates TLS for this domain with the sandbox's CA: docs/egress.md)"
    )]
    CredentialNeedsTls { domain: DomainRule },
    #[error("`{key}` needs `https = true`")]
    NeedsHttps { key: &'static str },
    #[error(
        "`{name}` cannot be a placeholder variable (a shell name the runtime does not set itself, used once)"
    )]
    CredentialPlaceholder { name: String },
    #[error("credential domain `{domain}` is not covered by an allow rule")]
    CredentialNotAllowed { domain: DomainRule },
    #[error(
        "`{header}` cannot carry a credential (not a header name, or one that frames or routes the request)"
    )]
    CredentialHeader { header: String },
    #[error("credential prefix contains a control character")]
    CredentialPrefix,
    #[error("a credential needs exactly one secret source: `env` or `file`")]
    CredentialSource,
    #[error("`{name}` is not an environment variable name")]
    CredentialEnv { name: String },
    #[error("approvals need network mode `proxy`")]
    ApprovalsWithoutProxy,
    #[error(
        "the approvals ceiling is empty: list the hosts a decider or `agent-sandbox allow` may open"
    )]
    EmptyApprovalCeiling,
    #[error("the decider timeout must be at most {max} seconds")]
    ApprovalTimeout { max: u64 },
    #[error("proxy port must be between 1 and 65535")]
    BadProxyPort,
    #[error("local port must be between 1 and 65535")]
    BadLocalPort,
    #[error("pids limit must be at least 1")]
    ZeroPids,
    #[error("cpu shares must be between 2 and 262144")]
    CpuSharesRange,
    #[error("cpu period must be between 1000 and 1000000 microseconds")]
    CpuPeriodRange,
    #[error("cpu quota must be at least 1000 microseconds")]
    CpuQuotaRange,
    #[error("the seccomp layer cannot be optional")]
    SeccompOptional,
    #[error("{0}")]
    Ucounts(crate::ucounts::UcountsViolation),
    #[error("bad syscall table")]
    Syscalls {
        #[source]
        source: crate::seccomp::SeccompError,
    },
}

/// The smallest `workspace_size`: an ext4 filesystem of its own needs a few megabytes.
pub const MIN_WORKSPACE_SIZE: ByteSize = ByteSize::from_trusted(16 << 20);

/// One writable scratch area: a fresh tmpfs of at most `size`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scratch {
    pub path: AbsPath,
    pub size: ByteSize,
}

/// The `[filesystem]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filesystem {
    /// Must be `true`; present so a profile can say it and a `false` is refused loudly.
    pub readonly_rootfs: bool,
    /// Writable tmpfs areas.
    pub scratch: Vec<Scratch>,
    /// Where the workspace appears: the host directory bind-mounted there becomes the
    /// read-only lower layer of an overlay whose writes stay in the sandbox.
    pub workspace: Option<AbsPath>,
    /// The size of the workspace's writable layer (its overlay upper and work dirs live on
    /// a filesystem of this size: past it the sandbox gets ENOSPC). None: no cap.
    pub workspace_size: Option<ByteSize>,
    /// How long a sandbox's unpromoted workspace changes are kept after it ends.
    pub changes_max_age: Seconds,
    /// The most disk all kept change sets may take; past it the oldest ended ones go.
    pub changes_max_total: ByteSize,
    /// Extra protected names, added to [`MANDATORY_PROTECTED`].
    pub protected: Vec<ProtectedName>,
    /// Extra masked paths under /proc or /sys, added to [`MANDATORY_MASKED`].
    pub masked_paths: Vec<AbsPath>,
    /// Extra read-only paths under /proc or /sys, added to [`MANDATORY_READONLY`].
    pub readonly_paths: Vec<AbsPath>,
}

impl Default for Filesystem {
    fn default() -> Self {
        Filesystem {
            readonly_rootfs: true,
            scratch: vec![Scratch {
                path: AbsPath::from_trusted("/tmp"),
                size: ByteSize::from_trusted(64 << 20),
            }],
            workspace: None,
            workspace_size: None,
            changes_max_age: Seconds::from_trusted(7 * 86_400),
            changes_max_total: ByteSize::from_trusted(20 << 30),
            protected: Vec::new(),
            masked_paths: Vec::new(),
            readonly_paths: Vec::new(),
        }
    }
}

fn parse_all<T: TryFrom<&'static str>>(items: &'static [&'static str]) -> Vec<T> {
    items.iter().filter_map(|s| T::try_from(s).ok()).collect()
}

fn merged<T: Clone + Ord>(mandatory: Vec<T>, extra: &[T]) -> Vec<T> {
    let mut all = mandatory;
    all.extend(extra.iter().cloned());
    all.sort();
    all.dedup();
    all
}

impl Filesystem {
    /// Every protected name: the mandatory ones plus the policy's extras, sorted.
    pub fn protected_names(&self) -> Vec<ProtectedName> {
        merged(
            mandatory_protected_names()
                .filter_map(|n| ProtectedName::try_from(n).ok())
                .collect(),
            &self.protected,
        )
    }

    /// Every masked path: the mandatory ones plus the policy's extras, sorted.
    pub fn all_masked_paths(&self) -> Vec<AbsPath> {
        merged(parse_all(MANDATORY_MASKED), &self.masked_paths)
    }

    /// Every read-only /proc or /sys path, sorted.
    pub fn all_readonly_paths(&self) -> Vec<AbsPath> {
        merged(parse_all(MANDATORY_READONLY), &self.readonly_paths)
    }

    /// The writable areas: scratch paths and the workspace.
    pub fn writable_paths(&self) -> Vec<AbsPath> {
        let mut paths: Vec<AbsPath> = self.scratch.iter().map(|s| s.path.clone()).collect();
        paths.extend(self.workspace.clone());
        paths
    }
}

/// The `[identity]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Identity {
    /// Must be `true`.
    pub user_namespace: bool,
    /// How many ids the sandbox gets (container ids `0..id_range`).
    pub id_range: u32,
    /// A fixed first host id for the range; when absent the runtime allocates one.
    pub host_start: Option<u32>,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            user_namespace: true,
            id_range: 65536,
            host_start: None,
        }
    }
}

/// The `[privileges]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Privileges {
    /// Must be `true`.
    pub no_new_privs: bool,
    /// The capabilities a container may keep if its config asks for them (a ceiling).
    pub capabilities: Vec<Capability>,
}

impl Default for Privileges {
    fn default() -> Self {
        Privileges {
            no_new_privs: true,
            capabilities: Vec::new(),
        }
    }
}

/// How the sandbox reaches the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Loopback plus the egress proxy, which allows only the allow list.
    Proxy,
}

/// The `[network]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    pub mode: NetworkMode,
    /// The port the proxy listens on inside the sandbox (127.0.0.1).
    pub proxy_port: u16,
    /// TCP ports the sandbox may connect to on its own loopback, besides the proxy's: a
    /// server that a tool starts for itself, or a pod's sidecar. Landlock names ports, not
    /// addresses; these stay local because the sandbox's network namespace has only `lo`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub local_ports: Vec<u16>,
    pub allow: Vec<DomainRule>,
    pub deny: Vec<DomainRule>,
    /// Headers the proxy adds to plain-HTTP requests, with secrets read on the host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<Credential>,
    /// Size cap of what the sandbox can make its audit log hold (connections, approvals,
    /// denials): allowed connections fill the first three quarters, the last quarter is a
    /// reserve for denials, approvals and credential uses; what does not fit is counted in
    /// `summary` records (docs/audit.md, "The size cap").
    #[serde(skip_serializing_if = "is_default_audit_cap")]
    pub audit_max_bytes: ByteSize,
    /// What happens when the sandbox's records reach `audit_max_bytes`: `stop` the sandbox
    /// (the default) or keep it running while its records are only counted (`aggregate`).
    #[serde(skip_serializing_if = "AuditAtCap::is_stop")]
    pub audit_at_cap: AuditAtCap,
    /// Live changes to the allowlist: a decider asked about unlisted hosts, and
    /// `agent-sandbox allow`/`deny`, both bounded by the table's ceiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::approvals::Approvals>,
    /// What a tunnel gets whose TLS ClientHello names another server (SNI) than the host it
    /// was opened to: refused (the default) or only recorded.
    #[serde(skip_serializing_if = "SniMismatch::is_deny")]
    pub sni_mismatch: SniMismatch,
    /// Proxy-unaware tools (mode `proxy` only): a DNS stub in the sandbox answers allowed
    /// names with addresses the proxy maps back to them, and every TCP connection that leaves
    /// the sandbox's loopback is redirected to the proxy, which decides it on name, port and
    /// SNI and records it (docs/egress.md).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub transparent: bool,
}

/// The `network.sni_mismatch` choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SniMismatch {
    /// Refuse the tunnel (and a ClientHello that cannot be read); record the refusal.
    #[default]
    Deny,
    /// Let the tunnel through; its record names the server the ClientHello asked for.
    Record,
}

impl SniMismatch {
    fn is_deny(&self) -> bool {
        *self == SniMismatch::Deny
    }
}

/// The `network.audit_at_cap` choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditAtCap {
    /// Fail closed: SIGKILL the sandbox once its records reach the cap, after recording why.
    #[default]
    Stop,
    /// Keep the sandbox running; from the cap on, allowed connections are only counted and
    /// the other records use the reserve, then are counted too.
    Aggregate,
}

impl AuditAtCap {
    fn is_stop(&self) -> bool {
        *self == AuditAtCap::Stop
    }
}

/// The default of `network.audit_max_bytes` (16 MiB, tens of thousands of records).
pub const DEFAULT_AUDIT_MAX_BYTES: ByteSize = ByteSize::from_trusted(16 << 20);

fn is_default_audit_cap(size: &ByteSize) -> bool {
    *size == DEFAULT_AUDIT_MAX_BYTES
}

impl Default for Network {
    fn default() -> Self {
        Network {
            mode: NetworkMode::None,
            proxy_port: 3128,
            local_ports: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            credentials: Vec::new(),
            audit_max_bytes: DEFAULT_AUDIT_MAX_BYTES,
            audit_at_cap: AuditAtCap::Stop,
            approvals: None,
            sni_mismatch: SniMismatch::Deny,
            transparent: false,
        }
    }
}

impl Network {
    /// Whether any credential makes the proxy terminate TLS (so the sandbox needs its CA).
    pub fn terminates_tls(&self) -> bool {
        self.mode == NetworkMode::Proxy && self.credentials.iter().any(|c| c.https)
    }

    /// The proxy's decision table (empty, so everything denied, in mode `none`).
    pub fn allowlist(&self) -> Allowlist {
        match self.mode {
            NetworkMode::None => Allowlist::default(),
            NetworkMode::Proxy => Allowlist::new(self.allow.clone(), self.deny.clone()),
        }
    }
}

/// The `[resources]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// Memory limit (swap is limited to the same figure: no extra swap).
    pub memory: ByteSize,
    pub pids: u32,
    pub cpu_shares: u64,
    /// CPU time per period, in microseconds.
    pub cpu_quota_us: u64,
    pub cpu_period_us: u64,
    /// The sandbox is killed after this long.
    pub wall_clock: Seconds,
    /// Whether agent-sandbox's reaping init runs as the sandbox's PID 1 (docs/limits.md).
    pub init: InitMode,
}

/// `resources.init`: who is the sandbox's PID 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitMode {
    /// The reaper, unless the program is an init itself (its file name is a known init's).
    #[default]
    Auto,
    /// Always the reaper, whatever the program.
    Always,
    /// Never: the program is PID 1, as under runc (zombies it does not wait for stay).
    Never,
}

impl InitMode {
    /// The policy-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            InitMode::Auto => "auto",
            InitMode::Always => "always",
            InitMode::Never => "never",
        }
    }
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            memory: ByteSize::from_trusted(1 << 30),
            pids: 512,
            cpu_shares: 1024,
            cpu_quota_us: 100_000,
            cpu_period_us: 100_000,
            wall_clock: Seconds::from_trusted(3600),
            init: InitMode::Auto,
        }
    }
}

/// A sandbox policy: everything the sandbox allows. Written as TOML (see
/// `profiles/agent.toml`); every table may be omitted, and its defaults are the
/// tightest sensible values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxPolicy {
    /// One line for people.
    pub description: String,
    pub filesystem: Filesystem,
    pub identity: Identity,
    pub privileges: Privileges,
    pub syscalls: SyscallPolicy,
    pub network: Network,
    pub resources: Resources,
    /// Caps on the per-user kernel counts inside the sandbox (`crate::ucounts`).
    pub ucounts: crate::ucounts::Ucounts,
    pub layers: Layers,
}

impl SandboxPolicy {
    /// Parse and validate a policy. `origin` names the text in errors (a file path or
    /// `builtin:agent`).
    pub fn parse(text: &str, origin: &str) -> Result<SandboxPolicy, PolicyError> {
        let policy: SandboxPolicy = toml::from_str(text).map_err(|err| {
            let message = err.message().trim_end_matches('\n').to_owned();
            let mut offset = err.span().map_or(0, |s| s.start);
            let mut path = span::path_at(text, offset);
            // toml reports a bad array element at the array; point at the element.
            if let Some((element, start)) = span::refine_to_element(text, &path, &message) {
                path = element;
                offset = start;
            }
            let (line, column) = span::line_col(text, offset);
            PolicyError::Parse {
                origin: origin.to_owned(),
                line,
                column,
                key: path.to_string(),
                message,
            }
        })?;
        policy.validate().map_err(|(path, violation)| {
            let (line, column) = span::line_col(text, span::offset_of(text, &path));
            PolicyError::Invalid {
                origin: origin.to_owned(),
                line,
                column,
                key: path.to_string(),
                violation: Box::new(violation),
            }
        })?;
        Ok(policy)
    }

    /// A built-in profile by name (see [`builtin_names`]).
    pub fn builtin(name: &str) -> Result<SandboxPolicy, PolicyError> {
        let text = builtin_text(name)?;
        SandboxPolicy::parse(text, &format!("profiles/{name}.toml"))
    }

    /// Check the rules that span several values. Returns the first violation with the
    /// key it is about.
    pub fn check(&self) -> Result<(), Violation> {
        self.validate().map_err(|(_, v)| v)
    }

    fn validate(&self) -> Result<(), (KeyPath, Violation)> {
        self.validate_filesystem()?;
        self.validate_identity()?;
        self.validate_privileges()?;
        self.validate_network()?;
        self.validate_resources()?;
        if let Err((key, violation)) = self.ucounts.validate() {
            return Err((
                KeyPath::new("ucounts").key(key),
                Violation::Ucounts(violation),
            ));
        }
        if let Err(source) = self.syscalls.validate() {
            return Err((
                KeyPath::new("syscalls").key("deny"),
                Violation::Syscalls { source },
            ));
        }
        if self.layers.seccomp == Requirement::Optional {
            return Err((
                KeyPath::new("layers").key("seccomp"),
                Violation::SeccompOptional,
            ));
        }
        Ok(())
    }

    fn validate_filesystem(&self) -> Result<(), (KeyPath, Violation)> {
        let fs = &self.filesystem;
        let root = KeyPath::new("filesystem");
        if !fs.readonly_rootfs {
            return Err((root.key("readonly_rootfs"), Violation::WritableRootfs));
        }
        let mut writable: Vec<(KeyPath, &AbsPath)> = fs
            .scratch
            .iter()
            .enumerate()
            .map(|(i, s)| (root.key("scratch").index(i).key("path"), &s.path))
            .collect();
        if let Some(workspace) = &fs.workspace {
            writable.push((root.key("workspace"), workspace));
        }
        for (i, (key, path)) in writable.iter().enumerate() {
            if path.as_str() == "/" {
                return Err((key.clone(), Violation::ScratchAtRoot));
            }
            if let Some((_, other)) = writable[..i].iter().find(|(_, o)| o.overlaps(path)) {
                return Err((
                    key.clone(),
                    Violation::OverlappingWritable {
                        path: (*path).clone(),
                        other: (*other).clone(),
                    },
                ));
            }
        }
        if let Some(size) = fs.workspace_size
            && size.bytes() < MIN_WORKSPACE_SIZE.bytes()
        {
            return Err((
                root.key("workspace_size"),
                Violation::WorkspaceSizeTooSmall {
                    min: MIN_WORKSPACE_SIZE,
                },
            ));
        }
        for (name, list) in [
            ("masked_paths", &fs.masked_paths),
            ("readonly_paths", &fs.readonly_paths),
        ] {
            for (i, path) in list.iter().enumerate() {
                let proc_or_sys = ["/proc", "/sys"]
                    .iter()
                    .filter_map(|p| AbsPath::try_from(*p).ok())
                    .any(|base| path.is_within(&base) && *path != base);
                if !proc_or_sys {
                    return Err((
                        root.key(name).index(i),
                        Violation::NotProcOrSys { path: path.clone() },
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_identity(&self) -> Result<(), (KeyPath, Violation)> {
        let id = &self.identity;
        let root = KeyPath::new("identity");
        if !id.user_namespace {
            return Err((root.key("user_namespace"), Violation::UserNamespaceRequired));
        }
        if id.id_range == 0 {
            return Err((root.key("id_range"), Violation::EmptyIdRange));
        }
        if let Some(start) = id.host_start {
            if start == 0 {
                return Err((root.key("host_start"), Violation::HostRootMapped));
            }
            if start.checked_add(id.id_range - 1).is_none() {
                return Err((
                    root.key("host_start"),
                    Violation::IdRangeOverflow {
                        start,
                        size: id.id_range,
                    },
                ));
            }
        }
        Ok(())
    }

    fn validate_privileges(&self) -> Result<(), (KeyPath, Violation)> {
        let root = KeyPath::new("privileges");
        if !self.privileges.no_new_privs {
            return Err((root.key("no_new_privs"), Violation::NoNewPrivsRequired));
        }
        for (i, cap) in self.privileges.capabilities.iter().enumerate() {
            if !cap.is_grantable() {
                return Err((
                    root.key("capabilities").index(i),
                    Violation::CapabilityForbidden {
                        capability: cap.clone(),
                    },
                ));
            }
        }
        Ok(())
    }

    fn validate_network(&self) -> Result<(), (KeyPath, Violation)> {
        let net = &self.network;
        let root = KeyPath::new("network");
        if net.proxy_port == 0 {
            return Err((root.key("proxy_port"), Violation::BadProxyPort));
        }
        if let Some(i) = net.local_ports.iter().position(|&p| p == 0) {
            return Err((root.key("local_ports").index(i), Violation::BadLocalPort));
        }
        match net.mode {
            NetworkMode::None => {
                if !net.allow.is_empty() {
                    return Err((root.key("allow"), Violation::RulesWithoutProxy));
                }
                if !net.deny.is_empty() {
                    return Err((root.key("deny"), Violation::RulesWithoutProxy));
                }
            }
            NetworkMode::Proxy => {
                if net.allow.is_empty() {
                    return Err((root.key("allow"), Violation::ProxyWithoutAllow));
                }
            }
        }
        for (i, allow) in net.allow.iter().enumerate() {
            if let Some(deny) = net.deny.iter().find(|d| d.covers(allow)) {
                return Err((
                    root.key("allow").index(i),
                    Violation::AllowShadowedByDeny {
                        allow: allow.clone(),
                        deny: deny.clone(),
                    },
                ));
            }
        }
        self.validate_credentials()?;
        self.validate_approvals()
    }

    fn validate_approvals(&self) -> Result<(), (KeyPath, Violation)> {
        let net = &self.network;
        let Some(approvals) = &net.approvals else {
            return Ok(());
        };
        let root = KeyPath::new("network").key("approvals");
        if net.mode != NetworkMode::Proxy {
            return Err((root, Violation::ApprovalsWithoutProxy));
        }
        if approvals.ceiling.is_empty() {
            return Err((root.key("ceiling"), Violation::EmptyApprovalCeiling));
        }
        if approvals.timeout.get() > crate::approvals::MAX_TIMEOUT_SECS {
            return Err((
                root.key("timeout"),
                Violation::ApprovalTimeout {
                    max: crate::approvals::MAX_TIMEOUT_SECS,
                },
            ));
        }
        Ok(())
    }

    fn validate_credentials(&self) -> Result<(), (KeyPath, Violation)> {
        let net = &self.network;
        let root = KeyPath::new("network").key("credentials");
        if net.mode != NetworkMode::Proxy && !net.credentials.is_empty() {
            return Err((root, Violation::CredentialsWithoutProxy));
        }
        for (i, c) in net.credentials.iter().enumerate() {
            let at = root.index(i);
            if c.domain.port() == Some(443) && !c.https {
                return Err((
                    at.key("domain"),
                    Violation::CredentialNeedsTls {
                        domain: c.domain.clone(),
                    },
                ));
            }
            if !net.allow.iter().any(|a| a.covers(&c.domain)) {
                return Err((
                    at.key("domain"),
                    Violation::CredentialNotAllowed {
                        domain: c.domain.clone(),
                    },
                ));
            }
            if !network::credential_header_ok(&c.header) {
                return Err((
                    at.key("header"),
                    Violation::CredentialHeader {
                        header: c.header.clone(),
                    },
                ));
            }
            if !network::header_value_ok(&c.prefix) {
                return Err((at.key("prefix"), Violation::CredentialPrefix));
            }
            for (key, set) in [
                ("upstream_ca", c.upstream_ca.is_some()),
                ("placeholder_env", c.placeholder_env.is_some()),
            ] {
                if set && !c.https {
                    return Err((at.key(key), Violation::NeedsHttps { key }));
                }
            }
            if let Some(name) = &c.placeholder_env {
                let reused = net.credentials[..i]
                    .iter()
                    .any(|o| o.placeholder_env.as_ref() == Some(name));
                if reused || !network::placeholder_env_ok(name) {
                    return Err((
                        at.key("placeholder_env"),
                        Violation::CredentialPlaceholder { name: name.clone() },
                    ));
                }
            }
            match c.source() {
                None => return Err((at, Violation::CredentialSource)),
                Some(SecretSource::Env(name)) if !network::env_name_ok(name) => {
                    return Err((
                        at.key("env"),
                        Violation::CredentialEnv {
                            name: name.to_owned(),
                        },
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn validate_resources(&self) -> Result<(), (KeyPath, Violation)> {
        let r = &self.resources;
        let root = KeyPath::new("resources");
        if r.pids == 0 {
            return Err((root.key("pids"), Violation::ZeroPids));
        }
        if !(2..=262_144).contains(&r.cpu_shares) {
            return Err((root.key("cpu_shares"), Violation::CpuSharesRange));
        }
        if !(1000..=1_000_000).contains(&r.cpu_period_us) {
            return Err((root.key("cpu_period_us"), Violation::CpuPeriodRange));
        }
        if r.cpu_quota_us < 1000 {
            return Err((root.key("cpu_quota_us"), Violation::CpuQuotaRange));
        }
        Ok(())
    }
}

/// The TOML text of a built-in profile.
pub fn builtin_text(name: &str) -> Result<&'static str, PolicyError> {
    match name {
        "agent" => Ok(BUILTIN_AGENT),
        "strict" => Ok(BUILTIN_STRICT),
        _ => Err(PolicyError::UnknownProfile {
            name: name.to_owned(),
        }),
    }
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkMode::None => "none",
            NetworkMode::Proxy => "proxy",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/policy.md#protected-names says why each mandatory name is there, in its words.
    #[test]
    fn every_protected_name_is_documented_with_its_reason() {
        let doc = include_str!("../../../docs/policy.md");
        for e in MANDATORY_PROTECTED {
            let row = format!("| `{}` | {} |", e.name, e.why);
            assert!(doc.contains(&row), "docs/policy.md lacks the row {row}");
        }
    }

    /// The credential stores a home holds are secret (masked), the other names are not.
    #[test]
    fn credential_stores_are_secret() {
        let name = |n: &str| ProtectedName::try_from(n).unwrap();
        for n in [
            ".ssh/", ".gnupg/", ".aws/", ".netrc", ".docker/", ".kube/", ".pypirc",
        ] {
            assert!(is_secret(&name(n)), "{n}");
        }
        for n in [".envrc", ".git/hooks/", ".npmrc", ".bashrc"] {
            assert!(!is_secret(&name(n)), "{n}");
        }
    }

    #[test]
    fn mandatory_lists_are_valid() {
        for e in MANDATORY_PROTECTED {
            assert!(ProtectedName::try_from(e.name).is_ok(), "{}", e.name);
            assert!(!e.why.is_empty(), "{}", e.name);
        }
        assert_eq!(
            Filesystem::default().protected_names().len(),
            MANDATORY_PROTECTED.len(),
            "a mandatory name is listed twice"
        );
        assert_eq!(
            parse_all::<AbsPath>(MANDATORY_MASKED).len(),
            MANDATORY_MASKED.len()
        );
        assert_eq!(
            parse_all::<AbsPath>(MANDATORY_READONLY).len(),
            MANDATORY_READONLY.len()
        );
        assert_eq!(Filesystem::default().scratch[0].path.as_str(), "/tmp");
    }

    #[test]
    fn policies_round_trip_through_json_and_toml() {
        // The runtime stores the effective policy (JSON) for later execs.
        for name in builtin_names() {
            let policy = SandboxPolicy::builtin(name).unwrap();
            let json = serde_json::to_string(&policy).unwrap();
            assert_eq!(
                serde_json::from_str::<SandboxPolicy>(&json).unwrap(),
                policy
            );
            let toml_text = toml::to_string(&policy).unwrap();
            assert_eq!(SandboxPolicy::parse(&toml_text, "rt.toml").unwrap(), policy);
        }
    }

    #[test]
    fn approvals_are_validated_and_errors_name_the_key() {
        let base = "[network]\nmode = \"proxy\"\nallow = [\"pypi.org:443\"]\n[network.approvals]\n";
        let ok = format!("{base}decider = \"/run/d.sock\"\nceiling = [\"*.example.com:443\"]\n");
        let policy = SandboxPolicy::parse(&ok, "p.toml").unwrap();
        let a = policy.network.approvals.unwrap();
        assert_eq!(a.timeout, crate::approvals::DEFAULT_TIMEOUT);
        assert_eq!(a.default, crate::approvals::DefaultAnswer::Deny);
        for (text, key, needle) in [
            (
                "ceiling = []\n",
                "network.approvals.ceiling",
                "ceiling is empty",
            ),
            (
                "timeout = \"10m\"\nceiling = [\"a.example.com\"]\n",
                "network.approvals.timeout",
                "at most 300",
            ),
            (
                "decider = \"http://10.0.0.1:80/\"\nceiling = [\"a.example.com\"]\n",
                "network.approvals.decider",
                "loopback",
            ),
            (
                "default = \"allow-always\"\nceiling = [\"a.example.com\"]\n",
                "network.approvals.default",
                "allow-always",
            ),
            ("decider = \"/d.sock\"\n", "network.approvals", "ceiling"),
        ] {
            let e = SandboxPolicy::parse(&format!("{base}{text}"), "p.toml").unwrap_err();
            let shown = format!(
                "{e}: {}",
                e.violation().map(|v| v.to_string()).unwrap_or_default()
            );
            assert!(
                e.key().is_some_and(|k| k.starts_with(key)),
                "{key}: {shown}"
            );
            assert!(
                shown.contains(needle) || format!("{e:?}").contains(needle),
                "{needle}: {shown}"
            );
        }
        let none =
            "[network]\nmode = \"none\"\n[network.approvals]\nceiling = [\"a.example.com\"]\n";
        let e = SandboxPolicy::parse(none, "p.toml").unwrap_err();
        assert!(
            matches!(e.violation(), Some(Violation::ApprovalsWithoutProxy)),
            "{e}"
        );
    }

    #[test]
    fn default_policy_is_the_tightest_network() {
        let policy = SandboxPolicy::default();
        assert_eq!(policy.network.mode, NetworkMode::None);
        assert!(policy.check().is_ok());
        assert!(
            !policy
                .network
                .allowlist()
                .decide("example.com", 443)
                .allowed
        );
    }
}

//! Audit record types: what one line of the log says.

use serde::{Deserialize, Serialize};

/// Version of the line format written by this crate (the `v` field).
pub const FORMAT_VERSION: u32 = 1;

/// Most paths a `files_changed` record lists; the counts always cover every change.
pub const MAX_CHANGED_PATHS: usize = 256;

/// One line of an audit log, as read back.
///
/// The JSON field order on disk is `v, seq, time, sandbox, kind, data, prev, hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Line format version ([`FORMAT_VERSION`]).
    pub v: u32,
    /// Position in the log, starting at 1 (equal to the line number).
    pub seq: u64,
    /// RFC 3339 UTC time with nanoseconds, taken while holding the log lock.
    pub time: String,
    /// The sandbox (container) id the log belongs to.
    pub sandbox: String,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
    /// sha256 (hex) of the previous line's exact bytes (without its newline), or the
    /// genesis value for the first record.
    pub prev: String,
    /// sha256 (hex) of this line's bytes with the `,"hash":"…"` member removed.
    pub hash: String,
}

/// What a record reports: `kind` names the variant, `data` holds its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum Event {
    /// The sandbox was created.
    Create {
        /// Digest of the effective policy (e.g. `sha256:…`).
        policy_digest: String,
        /// Protection layers that are in force.
        layers_active: Vec<String>,
        /// Optional layers that could not be applied.
        layers_inactive: Vec<String>,
    },
    /// A process was started in the sandbox (init or exec).
    Exec {
        /// Command line.
        argv: Vec<String>,
        /// Names of the environment variables; never their values.
        env_keys: Vec<String>,
        /// Working directory inside the sandbox.
        cwd: String,
        /// User id inside the sandbox.
        uid: u32,
        /// The agent's tool-call id, when the caller tagged the exec.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// `init`, or the exec's id as its caller named it (containerd's exec id, podman's
        /// exec session): the same as on the process's `exit` record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process: Option<String>,
    },
    /// A process ended.
    Exit {
        /// Exit code or terminating signal, or `unknown` when another process reaped it.
        status: ExitStatus,
        /// Whether the sandbox's memory cgroup counted an OOM kill since the previous
        /// `exit` record (the cgroup counts kills, not which process took them).
        oom: bool,
        /// Tool-call id of the exec that ended, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// `init`, or the exec's id as its caller named it (e.g. containerd's exec id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process: Option<String>,
        /// Host pid of the process, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// Who reaped the process when the status is `unknown` (e.g. `caller`: podman's
        /// conmon), or what reported it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reaped_by: Option<String>,
        /// What ended the process when a sandbox limit did (`wall_clock`: the policy's
        /// wall-clock watchdog killed it). Wins over `oom`, which only says the memory
        /// cgroup counted a kill of some process since the previous `exit` record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<ExitCause>,
    },
    /// An egress proxy decision.
    Net {
        /// Allowed or denied.
        verdict: Verdict,
        /// The policy rule that decided (or the reason for a default deny).
        rule: String,
        /// Requested host name or address.
        host: String,
        /// Requested port.
        port: u16,
        /// Bytes sent by the sandbox.
        bytes_up: u64,
        /// Bytes received by the sandbox.
        bytes_down: u64,
        /// Connection duration in milliseconds.
        duration_ms: u64,
        /// Method of a plain HTTP request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        /// Path of a plain HTTP request, without its query string.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// Server name (SNI) of the TLS ClientHello a tunnel's client sent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sni: Option<String>,
        /// Denials left out by the proxy's rate limit since the previous `net` record.
        #[serde(default, skip_serializing_if = "is_zero")]
        suppressed: u64,
        /// The credential the proxy added to the connection's requests (never its value).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<CredentialUse>,
        /// The tool call of the exec whose process opened the connection, as the runtime
        /// knows it (the exec's annotation or environment when the harness started it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// The tool call the request's header named: written by the sandbox, so only a claim.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_claimed: Option<String>,
        /// In a pod's log (one proxy serves every container of the pod), the id of the
        /// member container whose process opened the connection, as the runtime found it
        /// from the host; none when no member holds it (the pod sandbox's own processes) or
        /// it could not be told.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// The seccomp filter refused a syscall.
    SyscallDenied {
        /// Syscall name, when known.
        syscall: String,
        /// Syscall number.
        nr: i64,
        /// Process id (as seen from the host).
        pid: i32,
        /// Process command name.
        comm: String,
        /// The process's executable (host view of `/proc/PID/exe`), when readable.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exe: Option<String>,
        /// The errno the call failed with (the policy's, or ENOSYS for a syscall newer
        /// than the policy's review).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errno: Option<i32>,
        /// Denials left out by the writer's rate limit since the previous record.
        #[serde(default, skip_serializing_if = "is_zero")]
        suppressed: u64,
    },
    /// Landlock (or another filesystem layer) refused an access.
    FsDenied {
        /// Path as reported, in the sandbox's view (for a refused create or remove, the
        /// directory the entry was to be made in or removed from).
        path: String,
        /// Access that was refused, as the kernel names it (e.g. `fs.make_reg`; several are
        /// comma-separated).
        access: String,
        /// Process id (as seen from the host), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// Process command name, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        comm: Option<String>,
        /// The process's executable (in the sandbox's view), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exe: Option<String>,
        /// The syscall that was refused, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        syscall: Option<String>,
        /// The Landlock domain that refused it (the kernel's id, hex).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domain: Option<String>,
        /// Denials not recorded since the previous record: left out by the writer's rate
        /// limit, or dropped by the kernel's audit queue (counted from the kernel's own
        /// tally when the process's Landlock domain ends).
        #[serde(default, skip_serializing_if = "is_zero")]
        suppressed: u64,
    },
    /// Summary of the writable overlay at exit (see [`crate::scratch::files_changed`]).
    FilesChanged {
        /// Number of added entries.
        added: u64,
        /// Number of modified entries.
        modified: u64,
        /// Number of deleted entries.
        deleted: u64,
        /// Number of directories that replace their lower directory wholesale.
        opaque_dirs: u64,
        /// Up to [`MAX_CHANGED_PATHS`] entries, each `A /path`, `M /path`, `D /path` or `O /path`.
        paths: Vec<String>,
        /// True when `paths` was cut at [`MAX_CHANGED_PATHS`].
        truncated: bool,
    },
    /// Workspace changes were applied to a host directory (`agent-sandbox promote`).
    Promoted {
        /// The target directory.
        target: String,
        /// Digest of the change set as planned (`sha256:…`, see the promote module).
        digest: String,
        /// Number of entries applied.
        entries: u64,
        /// Up to [`MAX_CHANGED_PATHS`] applied entries, each `A /path`, `M /path`,
        /// `D /path` or `O /path`.
        paths: Vec<String>,
        /// True when `paths` was cut at [`MAX_CHANGED_PATHS`].
        truncated: bool,
        /// False when an apply step failed: `paths` then lists what was applied before it.
        complete: bool,
    },
    /// The sandbox was deleted.
    Delete {},
    /// A setting of the incoming spec that the sandbox granted only in part (e.g. Docker's
    /// `net.ipv4.ping_group_range`, narrowed to the sandbox's gid mapping).
    Clamped {
        /// The setting, as the spec names it.
        key: String,
        /// What the spec asked.
        requested: String,
        /// What the sandbox got.
        granted: String,
    },
    /// The log reached its size cap: records of the kinds that can flood (`net`) are no
    /// longer written after this one (lifecycle records still are). Written once.
    Truncated {
        /// The cap in bytes (the policy's `network.audit_max_bytes`).
        limit_bytes: u64,
        /// The log's size when the cap was reached.
        size_bytes: u64,
        /// The kind of the first record that was not written.
        dropped_kind: String,
    },
    /// A live change to the sandbox's egress allowlist: a decider's answer to a connection
    /// held for approval (or the policy's default when it gave none), or `agent-sandbox
    /// allow`/`deny` on the host.
    Approval {
        /// `allow-once`, `allow-always` or `deny`.
        answer: String,
        /// `host:port` asked about, or the rule a command added.
        target: String,
        /// `decider`, `default` (the decider gave no valid answer in time) or `command`.
        by: String,
        /// The decider's reason, or why the default applied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The tool call of the exec whose process opened the connection, as the runtime
        /// knows it (never a header the sandbox wrote).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// The tool call the request's header named: written by the sandbox, so only a claim.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_claimed: Option<String>,
    },
    /// Records a writer counted instead of writing them one by one: over its rate limit
    /// (`cause` `rate`), or after the log reached its cap (`cap`: written at the latest when
    /// the sandbox ends, with what was left out after the `truncated` record).
    Summary {
        /// `rate` or `cap`.
        cause: SummaryCause,
        /// Connections, per verdict and `host:port`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        net: Vec<NetCount>,
        /// Applied approvals, per answer, target and who answered.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        approvals: Vec<ApprovalCount>,
        /// Other records, per kind (`syscall_denied`, `fs_denied`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        records: Vec<KindCount>,
    },
    /// An optional protection layer is not in force.
    LayerInactive {
        /// Layer name (e.g. `apparmor`).
        layer: String,
        /// Why it could not be applied.
        reason: String,
    },
    /// The sandbox was frozen (`pause`): its wall clock stands still until `resumed`.
    Paused {},
    /// The sandbox was thawed (`resume`) after `frozen_ms` frozen, which its wall clock does
    /// not count.
    Resumed {
        /// How long this freeze lasted, in milliseconds.
        frozen_ms: u64,
    },
    /// The sandbox's processes were saved to a checkpoint image (`checkpoint`,
    /// docs/checkpoint.md).
    Checkpointed {
        /// SHA-256 of the image's CRIU files (`sha256:…`), which `restored` names.
        image_digest: String,
        /// Whether the sandbox ran on (`--leave-running`) or ended with the checkpoint.
        leave_running: bool,
    },
    /// The sandbox's processes were restored from a checkpoint image and checked against
    /// its plan before they ran on; the first record of a restored sandbox.
    Restored {
        /// SHA-256 of the image's CRIU files (`sha256:…`), as `checkpointed` named it.
        image_digest: String,
        /// The sandbox the image was taken of (another id after podman's `--import`).
        from: String,
        /// Layers the image could not carry and the restore applies without (each also has
        /// a `layer_inactive` record).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        not_carried: Vec<String>,
        /// Live egress rules the image names that the restored sandbox's ceiling does not
        /// cover: not applied (the others are applied again, each an `approval` record).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rules_dropped: Vec<String>,
        /// The end of `from`'s audit chain at the checkpoint, as the image records it: the
        /// fork's lineage (`from`'s log verifies up to it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_head: Option<crate::log::Anchor>,
    },
    /// A cgroup limit refused the sandbox something during its life; written once, at
    /// delete, with the kernel's count.
    LimitHit {
        /// The limit (`pids`: the pids cgroup refused a fork or clone).
        limit: String,
        /// How often the kernel refused (pids: the `max` counter of `pids.events`).
        count: u64,
        /// The limit's value, when readable.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u64>,
    },
}

/// What ended a process, when a sandbox limit did rather than the process itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitCause {
    /// The policy's `wall_clock` limit ran out and the watchdog SIGKILLed the sandbox.
    WallClock,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// Normal exit with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
    /// Not known to the writer: the process was reaped by another process (podman's conmon
    /// reaps a sandbox's init and execs), which keeps the status to itself.
    Unknown,
}

impl ExitStatus {
    /// Decodes a status the way containerd's reaper and conmon fold it into one number:
    /// `128 + N` for a process killed by signal N (N in 1..=64), the code otherwise. A
    /// process that exits on purpose with such a code reads as killed; the folded number
    /// holds no more than that.
    pub fn from_folded(status: i32) -> Self {
        if (129..=128 + 64).contains(&status) {
            ExitStatus::Signal(status - 128)
        } else {
            ExitStatus::Code(status)
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A network decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The connection was allowed.
    #[default]
    Allow,
    /// The connection was refused.
    Deny,
}

impl Event {
    /// An `exec` record from a process's `KEY=VALUE` environment: only the keys are kept.
    pub fn exec(
        argv: Vec<String>,
        env: &[String],
        cwd: impl Into<String>,
        uid: u32,
        tool_call_id: Option<String>,
        process: Option<String>,
    ) -> Self {
        let env_keys = env
            .iter()
            .map(|kv| {
                kv.split_once('=')
                    .map_or(kv.as_str(), |(k, _)| k)
                    .to_owned()
            })
            .collect();
        Event::Exec {
            argv,
            env_keys,
            cwd: cwd.into(),
            uid,
            tool_call_id,
            process,
        }
    }

    /// The `kind` string of this event.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Create { .. } => "create",
            Event::Exec { .. } => "exec",
            Event::Exit { .. } => "exit",
            Event::Net { .. } => "net",
            Event::SyscallDenied { .. } => "syscall_denied",
            Event::FsDenied { .. } => "fs_denied",
            Event::FilesChanged { .. } => "files_changed",
            Event::Promoted { .. } => "promoted",
            Event::Delete {} => "delete",
            Event::Clamped { .. } => "clamped",
            Event::LayerInactive { .. } => "layer_inactive",
            Event::Approval { .. } => "approval",
            Event::LimitHit { .. } => "limit_hit",
            Event::Paused {} => "paused",
            Event::Resumed { .. } => "resumed",
            Event::Checkpointed { .. } => "checkpointed",
            Event::Restored { .. } => "restored",
            Event::Truncated { .. } => "truncated",
            Event::Summary { .. } => "summary",
        }
    }
}

/// Why a [`Event::Summary`] counts records instead of listing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryCause {
    /// Over the writer's rate limit.
    Rate,
    /// After the log's size cap (`network.audit_max_bytes`).
    Cap,
}

/// Connections to one `host:port` with one verdict, counted in a [`Event::Summary`]. The
/// host `*` (port 0) counts the hosts beyond the most a summary lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetCount {
    /// Allowed or denied.
    pub verdict: Verdict,
    /// Requested host name or address.
    pub host: String,
    /// Requested port.
    pub port: u16,
    /// How many connections.
    pub connections: u64,
    /// Bytes sent by the sandbox, over all of them.
    pub bytes_up: u64,
    /// Bytes received by the sandbox, over all of them.
    pub bytes_down: u64,
    /// The most bytes one of them sent (an upload hidden among many small connections).
    pub largest_up: u64,
    /// Plain HTTP requests among them, per method (`POST`: 1).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub methods: std::collections::BTreeMap<String, u64>,
    /// Requests that carried an injected credential.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub credential_requests: u64,
}

/// Applied approvals with one answer, target and answerer, counted in a [`Event::Summary`].
/// The target `*` counts the targets beyond the most a summary lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalCount {
    /// `allow-once`, `allow-always` or `deny`.
    pub answer: String,
    /// `host:port` asked about.
    pub target: String,
    /// `decider`, `default` or `command`.
    pub by: String,
    /// How many.
    pub count: u64,
}

/// Records of one kind counted in a [`Event::Summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindCount {
    /// The record kind (`syscall_denied`, `fs_denied`).
    pub kind: String,
    /// How many.
    pub count: u64,
}

/// A credential header the egress proxy added to a connection's requests: its name, never
/// its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialUse {
    /// The header set.
    pub header: String,
    /// How many requests carried it.
    pub requests: u64,
    /// Added inside TLS the proxy terminated (an `https` credential).
    #[serde(default)]
    pub https: bool,
}

/// Annotation (in config.json, or on an exec's process spec) naming the agent's tool call.
pub const TOOL_CALL_ANNOTATION: &str = "io.agent-sandbox.tool-call-id";

/// Environment variable of an exec'd process naming the agent's tool call.
pub const TOOL_CALL_ENV: &str = "AGENT_SANDBOX_TOOL_CALL_ID";

/// The tool-call id of an exec: the annotation if present, else the [`TOOL_CALL_ENV`] entry
/// of its `KEY=VALUE` environment. Empty values count as absent.
pub fn tool_call_id(annotation: Option<&str>, env: &[String]) -> Option<String> {
    annotation
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            env.iter()
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, v)| *k == TOOL_CALL_ENV && !v.is_empty())
                .map(|(_, v)| v.to_owned())
        })
}

/// The most characters of a tool-call id.
pub const MAX_TOOL_CALL_CHARS: usize = 128;

/// Whether `value` may name a tool call: 1 to [`MAX_TOOL_CALL_CHARS`] characters of
/// `A-Z a-z 0-9 . _ : -` (what model APIs use, e.g. `toolu_01ABC`, `call_abc`). Every form
/// is held to it: the annotation, the environment, the argv prefix, an exec id.
pub fn valid_tool_call_id(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_TOOL_CALL_CHARS
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// A tool-call id a caller gave that is not one; each names where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    #[error(
        "{TOOL_CALL_ENV} in {place} is {value}, not 1 to 128 characters of A-Z a-z 0-9 . _ : - (docs/audit.md#tool-call-ids)"
    )]
    Invalid { place: &'static str, value: String },
    #[error(
        "the exec's argv starts `env {TOOL_CALL_ENV}=ID` but names no program after it (one assignment, then the program: docs/audit.md#tool-call-ids)"
    )]
    NoProgram,
}

impl ToolCallError {
    fn invalid(place: &'static str, value: &str) -> Self {
        Self::Invalid {
            place,
            value: format!("\"{}\"", crate::escape::escape(value).replace('"', "\\\"")),
        }
    }
}

/// The argv form of a tool-call id, for callers whose exec has no environment of its own
/// (CRI's `ExecSync`): `env AGENT_SANDBOX_TOOL_CALL_ID=ID PROGRAM ARGS...`, exactly that
/// leading form (`env` as the whole first word, then that one assignment, then the program).
/// Returns the id and the argv the program runs with, or `None` when argv does not start so.
/// The harness writes argv on the host; what runs in the sandbox never reaches it, so a
/// process there cannot use this form to name another call.
pub fn split_tool_call_argv(argv: &[String]) -> Result<Option<(String, &[String])>, ToolCallError> {
    let [first, assignment, rest @ ..] = argv else {
        return Ok(None);
    };
    let Some(id) = assignment
        .strip_prefix(TOOL_CALL_ENV)
        .and_then(|a| a.strip_prefix('='))
        .filter(|_| first == "env")
    else {
        return Ok(None);
    };
    if !valid_tool_call_id(id) {
        return Err(ToolCallError::invalid("the exec's argv", id));
    }
    // `env` would take a second assignment, or an option, as more of its own arguments.
    match rest.first() {
        Some(p) if !p.is_empty() && !p.starts_with('-') && !p.contains('=') => {
            Ok(Some((id.to_owned(), rest)))
        }
        _ => Err(ToolCallError::NoProgram),
    }
}

/// Checks the [`TOOL_CALL_ENV`] entry of an exec's environment, if it has one.
pub fn check_tool_call_env(env: &[String]) -> Result<(), ToolCallError> {
    match env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, v)| *k == TOOL_CALL_ENV && !v.is_empty())
    {
        Some((_, v)) if !valid_tool_call_id(v) => {
            Err(ToolCallError::invalid("the exec's environment", v))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_argv_form_is_recognised_only_as_the_exact_leading_form() {
        let a = argv(&[
            "env",
            "AGENT_SANDBOX_TOOL_CALL_ID=toolu_01ABC",
            "sh",
            "-c",
            "echo $0",
        ]);
        let (id, rest) = split_tool_call_argv(&a).unwrap().unwrap();
        assert_eq!((id.as_str(), rest), ("toolu_01ABC", &a[2..]));
        // Not the form: left alone, the program runs as asked.
        for other in [
            argv(&["/usr/bin/env", "AGENT_SANDBOX_TOOL_CALL_ID=x", "sh"]),
            argv(&["sh", "-c", "env AGENT_SANDBOX_TOOL_CALL_ID=x sh"]),
            argv(&["env", "OTHER=1", "AGENT_SANDBOX_TOOL_CALL_ID=x", "sh"]),
            argv(&["env", "AGENT_SANDBOX_TOOL_CALL_IDX=x", "sh"]),
            argv(&["env"]),
            argv(&[]),
        ] {
            assert_eq!(split_tool_call_argv(&other), Ok(None), "{other:?}");
        }
        // The form with a bad id or no program: refused, never run as something else.
        let bad = split_tool_call_argv(&argv(&[
            "env",
            "AGENT_SANDBOX_TOOL_CALL_ID=a b\x1b[2J",
            "sh",
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("a b\\x1b[2J") && !bad.contains('\x1b'),
            "{bad}"
        );
        for no_program in [
            argv(&["env", "AGENT_SANDBOX_TOOL_CALL_ID=t1"]),
            argv(&["env", "AGENT_SANDBOX_TOOL_CALL_ID=t1", "B=2", "sh"]),
            argv(&["env", "AGENT_SANDBOX_TOOL_CALL_ID=t1", "-i", "sh"]),
        ] {
            assert_eq!(
                split_tool_call_argv(&no_program),
                Err(ToolCallError::NoProgram),
                "{no_program:?}"
            );
        }
        assert!(
            split_tool_call_argv(&argv(&["env", "AGENT_SANDBOX_TOOL_CALL_ID=", "sh"])).is_err()
        );
        let long = format!("AGENT_SANDBOX_TOOL_CALL_ID={}", "a".repeat(129));
        assert!(split_tool_call_argv(&argv(&["env", &long, "sh"])).is_err());
    }

    #[test]
    fn the_env_form_is_held_to_the_same_rule() {
        assert_eq!(
            check_tool_call_env(&argv(&["AGENT_SANDBOX_TOOL_CALL_ID=call_9:x-1.y"])),
            Ok(())
        );
        assert_eq!(check_tool_call_env(&argv(&["PATH=/bin"])), Ok(()));
        assert!(check_tool_call_env(&argv(&["AGENT_SANDBOX_TOOL_CALL_ID=a;b"])).is_err());
    }

    #[test]
    fn exec_keeps_env_names_only_and_finds_the_tool_call() {
        let env = vec![
            "PATH=/bin".to_owned(),
            format!("{TOOL_CALL_ENV}=toolu_9"),
            "SECRET=x=y".to_owned(),
            "BARE".to_owned(),
        ];
        let id = tool_call_id(None, &env);
        assert_eq!(id.as_deref(), Some("toolu_9"));
        assert_eq!(
            tool_call_id(Some("toolu_a"), &env).as_deref(),
            Some("toolu_a")
        );
        assert_eq!(tool_call_id(Some(""), &[]), None);
        let Event::Exec { env_keys, .. } = Event::exec(vec!["sh".into()], &env, "/", 0, id, None)
        else {
            return;
        };
        assert_eq!(env_keys, ["PATH", TOOL_CALL_ENV, "SECRET", "BARE"]);
    }

    #[test]
    fn folded_statuses_decode_to_code_or_signal() {
        assert_eq!(ExitStatus::from_folded(0), ExitStatus::Code(0));
        assert_eq!(ExitStatus::from_folded(3), ExitStatus::Code(3));
        assert_eq!(ExitStatus::from_folded(128), ExitStatus::Code(128));
        assert_eq!(ExitStatus::from_folded(137), ExitStatus::Signal(9));
        assert_eq!(ExitStatus::from_folded(192), ExitStatus::Signal(64));
        assert_eq!(ExitStatus::from_folded(193), ExitStatus::Code(193));
        assert_eq!(ExitStatus::from_folded(255), ExitStatus::Code(255));
    }

    #[test]
    fn exit_records_serialise_status_and_omit_unknown_fields() {
        let e = Event::Exit {
            status: ExitStatus::Unknown,
            oom: true,
            tool_call_id: None,
            process: Some("init".into()),
            pid: None,
            reaped_by: Some("caller".into()),
            cause: None,
        };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"exit","data":{"status":"unknown","oom":true,"process":"init","reaped_by":"caller"}}"#
        );
        let old = r#"{"kind":"exit","data":{"status":{"signal":9},"oom":false}}"#;
        let back: Event = serde_json::from_str(old).unwrap();
        assert!(matches!(
            back,
            Event::Exit {
                status: ExitStatus::Signal(9),
                process: None,
                pid: None,
                ..
            }
        ));
    }
}

//! The audit trail's writer: where each sandbox's log lives, and the records the runtime
//! and its sidecars write (create, exec, exit, files_changed, delete). The proxy writes
//! `net` records to the same log (see [`super::egress`]). The `audit` command's reader
//! (`show`, `prune`) is in `report/audit.rs`, which none of the writers import.
//!
//! Logs live in `<state root>/audit/<id>.jsonl` unless `--audit-dir` /
//! `AGENT_SANDBOX_AUDIT_DIR` names another directory at create; the directory
//! chosen at create is saved in the sandbox dir, so exec, the proxy, the shim's
//! exit hook and delete all append to the same file. Logs outlive `delete` until
//! `audit prune` removes them; a live sandbox's log is never pruned. Nothing
//! inside the sandbox can reach them: the log directory is created 0700 by
//! host root and never mounted into a container.
//!
//! `exit` records: containerd's path reports them through the shim (which
//! reaps the processes and runs the hidden `audit-exit` command before it
//! publishes TaskExit). podman's conmon reaps the init and every exec itself and
//! keeps their statuses, so for podman the runtime writes the init's `exit` at
//! `delete` with status `unknown`, `reaped_by: "caller"`, and the OOM flag from
//! the sandbox's memory cgroup, which it can read; a detached exec's exit comes from
//! the watcher of [`super::exec_exit`], which reads it through a pidfd.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_audit::{AuditError, AuditLog, Event, ExitCause, ExitStatus};
use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::layers::LayerPlan;
use libcontainer::oci_spec::runtime::{Process, Spec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::state::ContainerId;
use crate::state::StateDirs;

/// Dir in the log directory: one marker per live sandbox (content: its state root).
pub(crate) const LIVE_DIR: &str = ".live";

/// The default directory holding every sandbox's log.
pub fn dir(dirs: &StateDirs) -> PathBuf {
    dirs.audit()
}

/// The log directory of sandbox `id`: the one saved at its create, else
/// `configured` (flag or env), else the default.
pub fn dir_of(dirs: &StateDirs, id: &ContainerId, configured: Option<&Path>) -> PathBuf {
    std::fs::read_to_string(dirs.sandbox(id).audit_dir())
        .ok()
        .map(|s| PathBuf::from(s.trim_end_matches('\n')))
        .or_else(|| configured.map(Path::to_path_buf))
        .unwrap_or_else(|| dir(dirs))
}

fn mkdir_0700(dir: &Path) -> Result<(), AuditError> {
    crate::files::create_private_dir(dir).map_err(|source| AuditError::Open {
        path: dir.to_owned(),
        source,
    })
}

/// The log of sandbox `id` (in the directory saved at create, else the
/// default), creating its directory (mode 0700) if needed.
pub fn path(dirs: &StateDirs, id: &ContainerId) -> Result<PathBuf, AuditError> {
    let dir = dir_of(dirs, id, None);
    mkdir_0700(&dir)?;
    agent_sandbox_audit::log_path(&dir, id.as_str())
}

/// At create, before the first record: fixes the sandbox's log directory
/// (`configured` or the default), creates it 0700, saves the choice in the
/// sandbox dir and marks the sandbox live there (so `prune` keeps its log).
pub fn init(
    dirs: &StateDirs,
    id: &ContainerId,
    configured: Option<&Path>,
) -> Result<PathBuf, AuditError> {
    let chosen = match configured {
        Some(d) => std::path::absolute(d).map_err(|source| AuditError::Open {
            path: d.to_owned(),
            source,
        })?,
        None => dir(dirs),
    };
    mkdir_0700(&chosen)?;
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).map_err(|source| AuditError::Open { path, source })
    };
    write(dirs.sandbox(id).audit_dir(), &chosen.display().to_string())?;
    let live = chosen.join(LIVE_DIR);
    mkdir_0700(&live)?;
    write(live.join(id.as_str()), &dirs.root.display().to_string())?;
    agent_sandbox_audit::log_path(&chosen, id.as_str())
}

/// At the end of delete: the sandbox is no longer live.
pub fn release(dirs: &StateDirs, id: &ContainerId) {
    let marker = dir_of(dirs, id, None).join(LIVE_DIR).join(id.as_str());
    if let Err(e) = std::fs::remove_file(&marker)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %marker.display(), error = %e, "cannot remove the live marker");
    }
}

pub(crate) fn append(
    dirs: &StateDirs,
    id: &ContainerId,
    events: &[Event],
) -> Result<(), AuditError> {
    let log = AuditLog::open(path(dirs, id)?, id.as_str())?;
    log.append_all(events)?;
    Ok(())
}

/// The `create` record: a digest of the effective policy and the layers in force.
pub fn created(
    dirs: &StateDirs,
    id: &ContainerId,
    policy: &SandboxPolicy,
    plan: &LayerPlan,
    clamped: &[agent_sandbox_policy::harden::Clamp],
) -> Result<(), AuditError> {
    let mut events = vec![Event::Create {
        policy_digest: policy_digest(policy),
        layers_active: plan.apply.iter().map(|l| l.to_string()).collect(),
        layers_inactive: plan.inactive.iter().map(|(l, _)| l.to_string()).collect(),
    }];
    events.extend(
        plan.inactive
            .iter()
            .map(|(layer, reason)| Event::LayerInactive {
                layer: layer.to_string(),
                reason: reason.to_string(),
            }),
    );
    events.extend(clamped.iter().map(|c| Event::Clamped {
        key: c.key.clone(),
        requested: c.requested.clone(),
        granted: c.granted.clone(),
    }));
    append(dirs, id, &events)
}

/// `clamped` records of a later request (an exec's process): none when `clamped` is empty.
pub fn clamped(
    dirs: &StateDirs,
    id: &ContainerId,
    clamped: &[agent_sandbox_policy::harden::Clamp],
) -> Result<(), AuditError> {
    if clamped.is_empty() {
        return Ok(());
    }
    let events: Vec<Event> = clamped
        .iter()
        .map(|c| Event::Clamped {
            key: c.key.clone(),
            requested: c.requested.clone(),
            granted: c.granted.clone(),
        })
        .collect();
    append(dirs, id, &events)
}

/// How the caller named a process: `init`, or its exec id (containerd's, podman's exec
/// session), and whether that id also names the agent's tool call (ctr's `--exec-id`,
/// which the harness chooses; CRI's and podman's are generated).
#[derive(Debug, Clone, Default)]
pub struct ProcessName {
    pub id: Option<String>,
    pub is_tool_call: bool,
}

impl ProcessName {
    /// The sandbox's init.
    pub fn init() -> Self {
        Self {
            id: Some("init".to_owned()),
            is_tool_call: false,
        }
    }
}

/// The tool-call id of a process: the sandbox's annotation, else the process env (where
/// the exec's argv form was moved, the runtime's `exec`), else the exec id when the
/// caller chose it.
fn tool_call_of(process: &Process, hardened: &Spec, name: &ProcessName) -> Option<String> {
    let env = process.env().clone().unwrap_or_default();
    let annotation = hardened
        .annotations()
        .as_ref()
        .and_then(|a| a.get(agent_sandbox_audit::TOOL_CALL_ANNOTATION));
    agent_sandbox_audit::tool_call_id(annotation.map(String::as_str), &env).or_else(|| {
        name.id
            .clone()
            .filter(|id| name.is_tool_call && agent_sandbox_audit::valid_tool_call_id(id))
    })
}

/// The `exec` record of a process about to run in the sandbox (env keys only), with its
/// name and its tool-call id ([`tool_call_of`]).
pub fn exec(
    dirs: &StateDirs,
    id: &ContainerId,
    process: &Process,
    hardened: &Spec,
    name: &ProcessName,
) -> Result<(), AuditError> {
    let env = process.env().clone().unwrap_or_default();
    let event = Event::exec(
        process.args().clone().unwrap_or_default(),
        &env,
        process.cwd().to_string_lossy().into_owned(),
        process.user().uid(),
        tool_call_of(process, hardened, name),
        name.id.clone(),
    );
    append(dirs, id, &[event])
}

/// What `exit` records need between runtime invocations.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ExitState {
    /// The sandbox's memory cgroup directory (host path), found from its init at create.
    memory_cgroup: Option<PathBuf>,
    /// OOM kills already attributed to an earlier `exit` record.
    oom_seen: u64,
    /// Whether the init's `exit` record is written.
    init_exit_recorded: bool,
    /// The sandbox's pids cgroup directory (host path), found from its init at create.
    #[serde(default)]
    pids_cgroup: Option<PathBuf>,
    /// The pids cgroup's refusal counter at create (the baseline of the `limit_hit` record).
    #[serde(default)]
    pids_refused_at_create: u64,
    /// Whether the `limit_hit` records are written (once per sandbox, at delete).
    #[serde(default)]
    limits_recorded: bool,
}

fn load_state(dirs: &StateDirs, id: &ContainerId) -> ExitState {
    dirs.sandbox(id).audit_state().read().unwrap_or_default()
}

fn save_state(dirs: &StateDirs, id: &ContainerId, st: &ExitState) {
    if let Err(e) = dirs.sandbox(id).audit_state().write(st) {
        tracing::warn!(error = %e, "cannot save the audit exit state");
    }
}

/// At create, once the init exists: remembers its memory cgroup for OOM
/// accounting (the kill counter at that point is the baseline).
pub fn track_init(dirs: &StateDirs, id: &ContainerId, init_pid: i32) {
    let memory_cgroup = memory_cgroup_of(init_pid);
    let oom_seen = memory_cgroup
        .as_deref()
        .and_then(oom_kills)
        .unwrap_or_default();
    let pids_cgroup = pids_cgroup_of(init_pid);
    let pids_refused_at_create = pids_cgroup
        .as_deref()
        .and_then(pids_refused)
        .unwrap_or_default();
    save_state(
        dirs,
        id,
        &ExitState {
            memory_cgroup,
            oom_seen,
            init_exit_recorded: false,
            pids_cgroup,
            pids_refused_at_create,
            limits_recorded: false,
        },
    );
}

/// The pids cgroup directory of `pid` as seen from the host: v1 `pids`, else the v2 one.
fn pids_cgroup_of(pid: i32) -> Option<PathBuf> {
    let dirs = crate::host::cgroups::dirs_of(&crate::host::cgroups::RealHost, pid);
    ["pids", "unified"]
        .iter()
        .filter_map(|k| dirs.get(*k))
        .find(|d| d.join("pids.events").is_file())
        .cloned()
}

/// How often the pids cgroup refused a fork or clone: `max` in `pids.events` (v1 and v2).
fn pids_refused(cgroup: &Path) -> Option<u64> {
    counter(
        &std::fs::read_to_string(cgroup.join("pids.events")).ok()?,
        "max",
    )
}

/// The value of `key` in a flat-keyed cgroup file (`key N` per line).
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The sandbox was frozen (`pause`).
pub fn paused(dirs: &StateDirs, id: &ContainerId) -> Result<(), AuditError> {
    append(dirs, id, &[Event::Paused {}])
}

/// The sandbox was thawed (`resume`) after `frozen_ms` frozen.
pub fn resumed(dirs: &StateDirs, id: &ContainerId, frozen_ms: u64) -> Result<(), AuditError> {
    append(dirs, id, &[Event::Resumed { frozen_ms }])
}

/// The live egress rules of sandbox `id` as its audit log has them, oldest first: each
/// applied `allow-always` (a decider's or `agent-sandbox allow`) is an allow, each `deny`
/// by `agent-sandbox deny` a deny; the proxy writes these records itself, so the log is the
/// host's word on them (a checkpoint saves them, docs/checkpoint.md#what-is-carried).
pub fn live_rules(dirs: &StateDirs, id: &ContainerId) -> Vec<(bool, String)> {
    let Ok(log) = path(dirs, id) else {
        return Vec::new();
    };
    let records = agent_sandbox_audit::read_records(&log).unwrap_or_default();
    let all = records.into_iter().filter_map(|r| match r.event {
        Event::Approval { answer, target, .. } if answer == "allow-always" => Some((true, target)),
        Event::Approval {
            answer, target, by, ..
        } if answer == "deny" && by == "command" => Some((false, target)),
        _ => None,
    });
    // The latest word on each rule, in the order they were last given (a restored sandbox's
    // log has the rules again after `restored`).
    let mut rules: Vec<(bool, String)> = Vec::new();
    for (allow, rule) in all {
        rules.retain(|(_, r)| *r != rule);
        rules.push((allow, rule));
    }
    rules
}

/// The sandbox was saved to a checkpoint image whose CRIU files have `image_digest`.
/// Returns the chain's new end, which the image keeps (docs/checkpoint.md).
pub fn checkpointed(
    dirs: &StateDirs,
    id: &ContainerId,
    image_digest: &str,
    leave_running: bool,
) -> Result<agent_sandbox_audit::Anchor, AuditError> {
    let log = AuditLog::open(path(dirs, id)?, id.as_str())?;
    let appended = log.append(&Event::Checkpointed {
        image_digest: image_digest.to_owned(),
        leave_running,
    })?;
    Ok(appended.anchor)
}

/// Where a restored sandbox comes from, as its image says: the image's digest, the sandbox
/// it was taken of and that sandbox's audit chain head at the checkpoint.
pub struct Lineage<'a> {
    pub digest: &'a str,
    pub from: &'a str,
    pub from_head: Option<&'a agent_sandbox_audit::Anchor>,
}

/// The sandbox was restored from `image` (its digest, the sandbox it was taken of and that
/// sandbox's chain head) and its tasks passed the check; each layer in `not_carried` also
/// gets a `layer_inactive` record.
pub fn restored(
    dirs: &StateDirs,
    id: &ContainerId,
    image: &Lineage<'_>,
    not_carried: &[(String, String)],
    rules_dropped: &[String],
) -> Result<(), AuditError> {
    let mut events = vec![Event::Restored {
        image_digest: image.digest.to_owned(),
        from: image.from.to_owned(),
        not_carried: not_carried.iter().map(|(l, _)| l.clone()).collect(),
        rules_dropped: rules_dropped.to_vec(),
        from_head: image.from_head.cloned(),
    }];
    events.extend(
        not_carried
            .iter()
            .map(|(layer, reason)| Event::LayerInactive {
                layer: layer.clone(),
                reason: reason.clone(),
            }),
    );
    append(dirs, id, &events)
}

/// The watchdog is about to SIGKILL the sandbox for its `wall_clock` limit of `seconds`:
/// the `exit` records of the processes it kills name the wall clock as their cause.
pub fn wall_clock_fired(dirs: &StateDirs, id: &ContainerId, seconds: u64) {
    let path = dirs.sandbox(id).wall_clock_fired();
    if let Err(e) = std::fs::write(&path, seconds.to_string()) {
        tracing::warn!(path = %path.display(), error = %e, "cannot mark the wall-clock kill");
    }
}

/// The cause of an exit with `status`: the wall clock when the watchdog fired and the
/// process died of SIGKILL (or its reaper kept the status).
fn exit_cause(dirs: &StateDirs, id: &ContainerId, status: ExitStatus) -> Option<ExitCause> {
    let killed = matches!(status, ExitStatus::Signal(9) | ExitStatus::Unknown);
    (killed && dirs.sandbox(id).wall_clock_fired().exists()).then_some(ExitCause::WallClock)
}

/// At delete, while the cgroups still exist: one `limit_hit` record for the pids limit
/// when its cgroup refused forks during the sandbox's life, with the count. Written once.
pub fn limits_at_delete(dirs: &StateDirs, id: &ContainerId) -> Result<(), AuditError> {
    let mut st = load_state(dirs, id);
    if st.limits_recorded
        || !agent_sandbox_audit::log_path(&dir_of(dirs, id, None), id.as_str())?.exists()
    {
        return Ok(());
    }
    let Some(cgroup) = st.pids_cgroup.clone() else {
        return Ok(());
    };
    let refused = pids_refused(&cgroup)
        .unwrap_or_default()
        .saturating_sub(st.pids_refused_at_create);
    if refused > 0 {
        let max = std::fs::read_to_string(cgroup.join("pids.max"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        append(
            dirs,
            id,
            &[Event::LimitHit {
                limit: "pids".to_owned(),
                count: refused,
                max,
            }],
        )?;
    }
    st.limits_recorded = true;
    save_state(dirs, id, &st);
    Ok(())
}

/// The memory cgroup directory of `pid` as seen from the host (`crate::host::cgroups`).
pub fn memory_cgroup_of(pid: i32) -> Option<PathBuf> {
    crate::host::cgroups::memory_dir_of(&crate::host::cgroups::RealHost, pid)
}

/// The cgroup's OOM kill counter (`crate::host::cgroups::oom_kills`).
pub fn oom_kills(cgroup: &Path) -> Option<u64> {
    crate::host::cgroups::oom_kills(cgroup)
}

/// A process started with host pid `pid` (the init, or an exec): remembers its tool-call
/// id so its `exit` record carries it, and so the egress proxy attributes its connections
/// to it (`super::tool_calls`).
pub fn tag_exec(
    dirs: &StateDirs,
    id: &ContainerId,
    pid: i32,
    process: &Process,
    hardened: &Spec,
    name: &ProcessName,
) {
    let Some(tool_call) = tool_call_of(process, hardened, name) else {
        return;
    };
    if let Err(e) = super::tool_calls::tag(&dirs.sandbox(id), pid, &tool_call) {
        tracing::warn!(id = %id, pid, error = %e, "cannot remember the exec's tool-call id");
    }
}

/// One process's end, as its reaper reported it.
#[derive(Debug, Clone)]
pub struct ExitReport {
    /// `init`, or the exec's id.
    pub process: String,
    pub pid: Option<i32>,
    pub status: ExitStatus,
    /// Who reaped it, when the status is not known here.
    pub reaped_by: Option<String>,
}

/// How long an `exit` record waits for the supervisor to have written the process's
/// `fs_denied` records ([`super::fs_audit::fence`]).
const EXIT_FENCE_LIMIT: Duration = Duration::from_millis(500);

/// Appends the `exit` record of one process: the OOM flag is set when the
/// sandbox's memory cgroup counted kills since the previous `exit` record.
pub fn exited(dirs: &StateDirs, id: &ContainerId, report: &ExitReport) -> Result<(), AuditError> {
    if !claim_exec_exit(dirs, id, report) {
        return Ok(());
    }
    // The process's Landlock denials, which the supervisor reads from the kernel after the
    // fact, go before its exit.
    super::fs_audit::fence(&dirs.sandbox(id), EXIT_FENCE_LIMIT);
    let mut st = load_state(dirs, id);
    let kills = st.memory_cgroup.as_deref().and_then(oom_kills);
    let oom = kills.is_some_and(|k| k > st.oom_seen);
    let tool_call_id = report.pid.and_then(|pid| {
        let f = dirs.sandbox(id).audit_exec_tag(pid);
        let tag = std::fs::read_to_string(&f).ok();
        let _ = std::fs::remove_file(&f);
        tag.as_deref().and_then(super::tool_calls::tag_id)
    });
    append(
        dirs,
        id,
        &[Event::Exit {
            status: report.status,
            oom,
            tool_call_id,
            process: Some(report.process.clone()),
            pid: report.pid,
            reaped_by: report.reaped_by.clone(),
            cause: exit_cause(dirs, id, report.status),
        }],
    )?;
    if let Some(k) = kills {
        st.oom_seen = st.oom_seen.max(k);
    }
    if report.process == "init" {
        st.init_exit_recorded = true;
    }
    save_state(dirs, id, &st);
    Ok(())
}

/// Whether this report may write the `exit` record of an exec: the first report of an
/// exec (its id and pid) claims it; a second one (the shim's `audit-exit` and the runtime's
/// pidfd watcher may both see the same exit) is dropped. The init has its own flag.
fn claim_exec_exit(dirs: &StateDirs, id: &ContainerId, report: &ExitReport) -> bool {
    let Some(pid) = report.pid else { return true };
    if report.process == "init" {
        return true;
    }
    let name: String = report
        .process
        .chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = dirs.sandbox(id).audit_exec_exits();
    let claimed = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(format!("{pid}-{name}")))
    });
    match claimed {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        // A marker that cannot be made must not cost the record.
        Err(_) => true,
    }
}

/// At delete, before the cgroup goes: the init's `exit` record if no reaper
/// reported one (podman: conmon reaped it, `Unknown` by `caller`; containerd
/// after a dead shim: the forced delete's SIGKILL).
pub fn init_exit_at_delete(
    dirs: &StateDirs,
    id: &ContainerId,
    init_pid: Option<i32>,
    status: ExitStatus,
    reaped_by: &str,
) -> Result<(), AuditError> {
    if load_state(dirs, id).init_exit_recorded
        || !agent_sandbox_audit::log_path(&dir_of(dirs, id, None), id.as_str())?.exists()
    {
        return Ok(());
    }
    exited(
        dirs,
        id,
        &ExitReport {
            process: "init".to_owned(),
            pid: init_pid,
            status,
            reaped_by: Some(reaped_by.to_owned()),
        },
    )
}

/// Which of the sandbox's host processes `delete` found dead (not ended on their own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Died {
    /// The egress proxy.
    pub proxy: bool,
    /// The helper: the seccomp supervisor, with the wall clock when it held it.
    pub helper: bool,
}

/// The `layer_inactive` reason of a helper that died before delete.
pub const HELPER_DIED: &str = "the sandbox's helper (its seccomp supervisor) had died before \
    delete; denied syscalls were answered ENOSYS without records from then on, and a \
    sandbox whose wall clock it held was ended at once (docs/limits.md)";

/// The closing records: what died before delete, what changed in the workspace overlay (if
/// the sandbox had one: its `(upper, lower)` dirs), then `delete`. Called before the
/// overlay's upper dir is removed.
pub fn deleted(
    dirs: &StateDirs,
    id: &ContainerId,
    workspace: Option<(&Path, &Path)>,
    died: Died,
) -> Result<(), AuditError> {
    let log_path = path(dirs, id)?;
    if !log_path.exists() {
        // Create failed before the sandbox existed: nothing to close.
        return Ok(());
    }
    let mut events = Vec::new();
    if died.proxy {
        events.push(Event::LayerInactive {
            layer: "egress-proxy".to_owned(),
            reason: "the proxy had died before delete; the sandbox had no network from then on"
                .to_owned(),
        });
    }
    if died.helper {
        events.push(Event::LayerInactive {
            layer: "helper".to_owned(),
            reason: HELPER_DIED.to_owned(),
        });
    }
    if let Some((upper, lower)) = workspace {
        match agent_sandbox_audit::diff(upper, Some(lower)) {
            Ok(changes) => events.push(agent_sandbox_audit::files_changed(&changes)),
            Err(e) => {
                tracing::warn!(id = %id, error = %e, "cannot summarise the workspace changes")
            }
        }
    }
    events.push(Event::Delete {});
    let log = AuditLog::open(log_path, id.as_str())?;
    log.append_all(&events)?;
    Ok(())
}

/// sha256 of the effective policy as JSON: two sandboxes with the same digest
/// ran under the same rules.
pub(crate) fn policy_digest(policy: &SandboxPolicy) -> String {
    let json = serde_json::to_vec(policy).unwrap_or_default();
    format!("sha256:{:x}", Sha256::digest(&json))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn fake_sandbox(root: &Path, id: &str) -> (StateDirs, ContainerId) {
        let dirs = StateDirs::new(root.to_owned());
        let id = ContainerId::try_from(id).unwrap();
        std::fs::create_dir_all(dirs.sandbox(&id).path()).unwrap();
        (dirs, id)
    }

    /// A sandbox with an audit log whose memory cgroup (a plain directory under `root`) shows
    /// `oom_kill 1`, and whose saved exit state has seen `oom_seen` kills.
    fn sandbox_with_oom_counter(
        root: &Path,
        id: &str,
        oom_seen: u64,
    ) -> (StateDirs, ContainerId, PathBuf, PathBuf) {
        let (dirs, id) = fake_sandbox(root, id);
        let log = init(&dirs, &id, None).unwrap();
        let cg = root.join("cg");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("memory.oom_control"), "oom_kill 1\n").unwrap();
        save_state(
            &dirs,
            &id,
            &ExitState {
                memory_cgroup: Some(cg.clone()),
                oom_seen,
                ..ExitState::default()
            },
        );
        (dirs, id, log, cg)
    }

    #[test]
    fn live_rules_are_the_latest_word_on_each_applied_allow_and_commanded_deny() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, id) = fake_sandbox(root.path(), "rules1");
        init(&dirs, &id, None).unwrap();
        let approval = |answer: &str, target: &str, by: &str| Event::Approval {
            answer: answer.to_owned(),
            target: target.to_owned(),
            by: by.to_owned(),
            reason: None,
            tool_call_id: None,
            tool_call_claimed: None,
        };
        append(
            &dirs,
            &id,
            &[
                approval("allow-always", "a.example.com:443", "command"),
                approval("allow-always", "b.example.com:443", "decider"),
                // Not live rules: one connection each.
                approval("allow-once", "c.example.com:443", "decider"),
                approval("deny", "d.example.com:443", "decider"),
                approval("deny", "a.example.com:443", "command"),
            ],
        )
        .unwrap();
        assert_eq!(
            live_rules(&dirs, &id),
            [
                (true, "b.example.com:443".to_owned()),
                (false, "a.example.com:443".to_owned()),
            ]
        );
    }

    #[test]
    fn exit_records_take_the_oom_counter_delta_and_the_exec_tag_once() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, id, log, cg) = sandbox_with_oom_counter(root.path(), "ex1", 1);
        let mut p = Process::default();
        p.set_env(Some(vec![format!(
            "{}=toolu_e",
            agent_sandbox_audit::TOOL_CALL_ENV
        )]));
        tag_exec(
            &dirs,
            &id,
            77,
            &p,
            &Spec::default(),
            &ProcessName::default(),
        );
        let report = |process: &str, pid| ExitReport {
            process: process.into(),
            pid: Some(pid),
            status: ExitStatus::Signal(9),
            reaped_by: None,
        };
        exited(&dirs, &id, &report("e1", 77)).unwrap();
        // The same exec reported again (the shim and the pidfd watcher): dropped.
        exited(&dirs, &id, &report("e1", 77)).unwrap();
        std::fs::write(cg.join("memory.oom_control"), "oom_kill 2\n").unwrap();
        exited(&dirs, &id, &report("e2", 77)).unwrap();
        exited(&dirs, &id, &report("init", 1)).unwrap();
        init_exit_at_delete(&dirs, &id, Some(1), ExitStatus::Unknown, "caller").unwrap();
        let recs = agent_sandbox_audit::read_records(&log).unwrap();
        let got: Vec<(bool, Option<String>)> = recs
            .iter()
            .map(|r| match &r.event {
                Event::Exit {
                    oom, tool_call_id, ..
                } => (*oom, tool_call_id.clone()),
                e => panic!("unexpected {e:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [(false, Some("toolu_e".into())), (true, None), (false, None)]
        );
    }

    #[test]
    fn delete_writes_an_unknown_init_exit_only_when_no_reaper_did() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, id) = fake_sandbox(root.path(), "ex2");
        let log = init(&dirs, &id, None).unwrap();
        append(&dirs, &id, &[Event::Delete {}]).unwrap();
        init_exit_at_delete(&dirs, &id, Some(5), ExitStatus::Unknown, "caller").unwrap();
        init_exit_at_delete(&dirs, &id, Some(5), ExitStatus::Unknown, "caller").unwrap();
        let recs = agent_sandbox_audit::read_records(&log).unwrap();
        assert_eq!(recs.len(), 2);
        assert!(matches!(
            &recs[1].event,
            Event::Exit { status: ExitStatus::Unknown, reaped_by: Some(r), .. } if r == "caller"
        ));
    }

    #[test]
    fn a_wall_clock_kill_is_the_cause_of_killed_exits_and_wins_over_an_earlier_oom() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, id, log, _cg) = sandbox_with_oom_counter(root.path(), "wc1", 0);
        let report = |process: &str, status| ExitReport {
            process: process.into(),
            pid: Some(3),
            status,
            reaped_by: None,
        };
        exited(&dirs, &id, &report("before", ExitStatus::Signal(9))).unwrap();
        wall_clock_fired(&dirs, &id, 2);
        exited(&dirs, &id, &report("done", ExitStatus::Code(0))).unwrap();
        exited(&dirs, &id, &report("init", ExitStatus::Signal(9))).unwrap();
        let recs = agent_sandbox_audit::read_records(&log).unwrap();
        let got: Vec<(bool, Option<ExitCause>)> = recs
            .iter()
            .map(|r| match &r.event {
                Event::Exit { oom, cause, .. } => (*oom, *cause),
                e => panic!("unexpected {e:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (true, None),
                (false, None),
                (false, Some(ExitCause::WallClock))
            ]
        );
        let (_, id2) = fake_sandbox(root.path(), "wc2");
        let log2 = init(&dirs, &id2, None).unwrap();
        append(&dirs, &id2, &[Event::Delete {}]).unwrap();
        wall_clock_fired(&dirs, &id2, 2);
        init_exit_at_delete(&dirs, &id2, Some(1), ExitStatus::Unknown, "caller").unwrap();
        let recs = agent_sandbox_audit::read_records(&log2).unwrap();
        assert!(matches!(
            &recs[1].event,
            Event::Exit {
                cause: Some(ExitCause::WallClock),
                ..
            }
        ));
    }

    #[test]
    fn pids_refusals_are_recorded_once_with_the_count_since_create() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, id) = fake_sandbox(root.path(), "pid1");
        let log = init(&dirs, &id, None).unwrap();
        append(&dirs, &id, &[Event::Delete {}]).unwrap();
        let cg = root.path().join("pids");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("pids.events"), "max 3\n").unwrap();
        std::fs::write(cg.join("pids.max"), "64\n").unwrap();
        save_state(
            &dirs,
            &id,
            &ExitState {
                pids_cgroup: Some(cg.clone()),
                pids_refused_at_create: 3,
                ..ExitState::default()
            },
        );
        limits_at_delete(&dirs, &id).unwrap();
        assert_eq!(agent_sandbox_audit::read_records(&log).unwrap().len(), 1);
        let mut st = load_state(&dirs, &id);
        st.limits_recorded = false;
        save_state(&dirs, &id, &st);
        std::fs::write(cg.join("pids.events"), "max 10\n").unwrap();
        limits_at_delete(&dirs, &id).unwrap();
        limits_at_delete(&dirs, &id).unwrap();
        let recs = agent_sandbox_audit::read_records(&log).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(
            recs[1].event,
            Event::LimitHit {
                limit: "pids".into(),
                count: 7,
                max: Some(64)
            }
        );
        assert_eq!(counter("max 5\nother 1\n", "other"), Some(1));
        assert_eq!(counter("maximum 5\n", "max"), None);
    }
}

//! The runtime's side of the audit trail: where each sandbox's log lives, and
//! the records the runtime writes itself (create, exec, files_changed, delete).
//! The proxy writes `net` records to the same log (see [`crate::egress`]).
//!
//! Logs live in `<state root>/audit/<id>.jsonl`, apart from the per-container
//! state, so they outlive `delete`. Nothing inside the sandbox can reach them: the
//! state root is never mounted into a container.

use std::path::{Path, PathBuf};

use agent_sandbox_audit::{AuditError, AuditLog, Event};
use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::layers::LayerPlan;
use libcontainer::oci_spec::runtime::{Process, Spec};
use sha2::{Digest, Sha256};

use crate::id::ContainerId;
use crate::mounts::WorkspaceOverlay;
use crate::paths::StateDirs;

/// The directory holding every sandbox's log.
pub fn dir(dirs: &StateDirs) -> PathBuf {
    dirs.root.join("audit")
}

/// The log of sandbox `id`, creating its directory (mode 0700) if needed.
pub fn path(dirs: &StateDirs, id: &ContainerId) -> Result<PathBuf, AuditError> {
    let dir = dir(dirs);
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| AuditError::Open {
                path: dir.clone(),
                source,
            })?;
    }
    agent_sandbox_audit::log_path(&dir, id.as_str())
}

fn append(dirs: &StateDirs, id: &ContainerId, events: &[Event]) -> Result<(), AuditError> {
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
    append(dirs, id, &events)
}

/// The `exec` record of a process about to run in the sandbox (env keys only),
/// tagged with the tool-call id from the sandbox's annotation or the process env.
pub fn exec(
    dirs: &StateDirs,
    id: &ContainerId,
    process: &Process,
    hardened: &Spec,
) -> Result<(), AuditError> {
    let env = process.env().clone().unwrap_or_default();
    let annotation = hardened
        .annotations()
        .as_ref()
        .and_then(|a| a.get(agent_sandbox_audit::TOOL_CALL_ANNOTATION));
    let event = Event::exec(
        process.args().clone().unwrap_or_default(),
        &env,
        process.cwd().to_string_lossy().into_owned(),
        process.user().uid(),
        agent_sandbox_audit::tool_call_id(annotation.map(String::as_str), &env),
    );
    append(dirs, id, &[event])
}

/// The closing records: what changed in the workspace overlay (if the sandbox
/// had one), then `delete`. Called before the overlay's upper dir is removed.
pub fn deleted(
    dirs: &StateDirs,
    id: &ContainerId,
    workspace: Option<&WorkspaceOverlay>,
    proxy: crate::egress::Stopped,
) -> Result<(), AuditError> {
    let log_path = path(dirs, id)?;
    if !log_path.exists() {
        // Create failed before the sandbox existed: nothing to close.
        return Ok(());
    }
    let mut events = Vec::new();
    if proxy == crate::egress::Stopped::WasDead {
        events.push(Event::LayerInactive {
            layer: "egress-proxy".to_owned(),
            reason: "the proxy had died before delete; the sandbox had no network from then on"
                .to_owned(),
        });
    }
    if let Some(ws) = workspace {
        match agent_sandbox_audit::diff(&ws.upper, Some(&ws.lower)) {
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
fn policy_digest(policy: &SandboxPolicy) -> String {
    let json = serde_json::to_vec(policy).unwrap_or_default();
    format!("sha256:{:x}", Sha256::digest(&json))
}

/// The sandbox's log as a readable timeline, or its raw lines with `json`.
pub fn show(log: &Path, json: bool) -> Result<String, AuditError> {
    if json {
        return std::fs::read_to_string(log).map_err(|source| AuditError::Read {
            path: log.to_owned(),
            source,
        });
    }
    let records = agent_sandbox_audit::read_records(log)?;
    Ok(agent_sandbox_audit::render_timeline(&records))
}

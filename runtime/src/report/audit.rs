//! The `audit` command's reader: a sandbox's log found (`locate`) and shown as a timeline,
//! with a pod member's view of its pod's log, and `audit prune`, which never removes a live
//! sandbox's log. The writer is `crate::sidecars::trail`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use agent_sandbox_audit::{AuditError, Event};

use crate::sidecars::trail::{LIVE_DIR, dir_of};
use crate::state::ContainerId;
use crate::state::StateDirs;

/// Errors of pruning logs.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error("sandbox {id} is live; its audit log {path} is kept")]
    Live { id: String, path: PathBuf },
    #[error("sandbox {id} has no audit log at {path}")]
    NoLog { id: String, path: PathBuf },
    #[error("cannot read audit log directory {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove audit log {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--older-than {value:?}: {reason}")]
    Duration { value: String, reason: &'static str },
}

/// Where `audit`, `audit verify` and `audit prune` look for `id`'s log (live or deleted).
pub fn locate(
    dirs: &StateDirs,
    id: &ContainerId,
    configured: Option<&Path>,
) -> Result<PathBuf, AuditError> {
    agent_sandbox_audit::log_path(&dir_of(dirs, id, configured), id.as_str())
}

/// The sandbox's log as a readable timeline, or its raw lines with `json`.
pub fn show(log: &Path, pod: Option<&PodLog>, json: bool) -> Result<String, AuditError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| AuditError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let mut out = if json {
        read(log)?
    } else {
        agent_sandbox_audit::render_timeline(&agent_sandbox_audit::read_records(log)?)
    };
    let Some(pod) = pod else { return Ok(out) };
    if json {
        // The pod's lines as written (their `sandbox` is the pod's id), so each still
        // verifies against the pod's log.
        for line in read(&pod.path)?.lines() {
            let Ok(r) = serde_json::from_str::<agent_sandbox_audit::Record>(line) else {
                continue;
            };
            if pod.shows(&r.event) {
                out.push_str(line);
                out.push('\n');
            }
        }
        return Ok(out);
    }
    let records: Vec<_> = agent_sandbox_audit::read_records(&pod.path)?
        .into_iter()
        .filter(|r| pod.shows(&r.event))
        .collect();
    out.push_str(&format!(
        "# the pod's network records: one egress proxy serves every container of pod sandbox {} (its log: {}); shown: this container's connections, the pod's approvals and summaries\n",
        pod.pod,
        agent_sandbox_audit::escape::escape_path(&pod.path)
    ));
    out.push_str(&agent_sandbox_audit::render_timeline(&records));
    Ok(out)
}

/// Where the network records of a pod's app container are: the log of its pod's sandbox
/// (the pod's one egress proxy writes there, docs/audit.md#pods).
#[derive(Debug, Clone)]
pub struct PodLog {
    pub pod: ContainerId,
    pub path: PathBuf,
    /// The app container whose view this is.
    pub member: ContainerId,
}

impl PodLog {
    /// Whether the member's view shows a record of the pod's log: the `net` records of its
    /// own connections (the proxy names the container, docs/audit.md#pods), and the pod's
    /// approvals and summaries, which name no container.
    fn shows(&self, event: &Event) -> bool {
        match event {
            Event::Net { container, .. } => container.as_deref() == Some(self.member.as_str()),
            Event::Approval { .. } | Event::Summary { .. } => true,
            _ => false,
        }
    }
}

/// The pod log of sandbox `id`, when it is a pod's app container whose pod's log is kept
/// (`crate::report::find::pod_of`: written at its create).
pub fn pod_log(dirs: &StateDirs, id: &ContainerId, configured: Option<&Path>) -> Option<PodLog> {
    let pod = crate::report::find::pod_of(&dir_of(dirs, id, configured), id)?;
    let path = locate(dirs, &pod, configured).ok()?;
    path.exists().then_some(PodLog {
        pod,
        path,
        member: id.clone(),
    })
}

/// Parses `--older-than`: a number with `s`, `m`, `h` or `d` (`90m`, `7d`).
pub fn parse_age(value: &str) -> Result<Duration, PruneError> {
    let bad = |reason| PruneError::Duration {
        value: value.to_owned(),
        reason,
    };
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad("needs a unit: s, m, h or d"))?;
    let (num, unit) = value.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad("must start with a number"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad("unit must be s, m, h or d")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| bad("too large"))
}

/// What `prune` did.
#[derive(Debug, Default)]
pub struct Pruned {
    pub removed: Vec<PathBuf>,
    /// Logs kept because their sandbox is live.
    pub live: Vec<PathBuf>,
    /// Logs kept because they are newer than the cut-off.
    pub recent: Vec<PathBuf>,
}

/// Whether the sandbox of `id`'s log in `dir` is live: it exists in this state
/// root, or its live marker names a state root where it still exists.
fn is_live(dirs: &StateDirs, dir: &Path, id: &str) -> bool {
    if let Ok(cid) = ContainerId::try_from(id)
        && (dirs.sandbox(&cid).exists() || dirs.container(&cid).exists())
    {
        return true;
    }
    match std::fs::read_to_string(dir.join(LIVE_DIR).join(id)) {
        Ok(root) => {
            let other = StateDirs::new(PathBuf::from(root.trim_end_matches('\n')));
            ContainerId::try_from(id).map_or(true, |cid| {
                other.sandbox(&cid).exists() || other.container(&cid).exists()
            })
        }
        Err(_) => false,
    }
}

/// Removes the logs in `dir` (or only `id`'s) whose sandbox is gone and that
/// were last written more than `older_than` ago. A live sandbox's log is never
/// removed; naming one is an error.
pub fn prune(
    dirs: &StateDirs,
    dir: &Path,
    older_than: Duration,
    only: Option<&ContainerId>,
) -> Result<Pruned, PruneError> {
    let cutoff = SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let ids: BTreeSet<String> = match only {
        Some(id) => {
            let path = dir.join(format!("{id}.jsonl"));
            if !path.exists() {
                return Err(PruneError::NoLog {
                    id: id.to_string(),
                    path,
                });
            }
            if is_live(dirs, dir, id.as_str()) {
                return Err(PruneError::Live {
                    id: id.to_string(),
                    path,
                });
            }
            [id.to_string()].into()
        }
        None => std::fs::read_dir(dir)
            .map_err(|source| PruneError::Read {
                path: dir.to_owned(),
                source,
            })?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".jsonl"))
                    .map(str::to_owned)
            })
            .collect(),
    };
    let mut out = Pruned::default();
    for id in ids {
        let path = dir.join(format!("{id}.jsonl"));
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if is_live(dirs, dir, &id) {
            out.live.push(path);
            continue;
        }
        if meta.modified().is_ok_and(|m| m > cutoff) {
            out.recent.push(path);
            continue;
        }
        std::fs::remove_file(&path).map_err(|source| PruneError::Remove {
            path: path.clone(),
            source,
        })?;
        let _ = std::fs::remove_file(dir.join(LIVE_DIR).join(&id));
        crate::report::find::forget(dir, &id);
        tracing::info!(path = %path.display(), "audit log pruned");
        out.removed.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sidecars::trail::tests::fake_sandbox;
    use crate::sidecars::trail::{append, init, release};

    #[test]
    fn ages_parse_with_units_and_errors_name_the_value() {
        assert_eq!(parse_age("90m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_age("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_age("0s").unwrap(), Duration::ZERO);
        for bad in ["", "10", "d", "5w", "1.5h", "-1d"] {
            let e = parse_age(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn prune_removes_old_logs_of_gone_sandboxes_and_never_a_live_one() {
        let root = tempfile::tempdir().unwrap();
        let (dirs, live) = fake_sandbox(root.path(), "live1");
        let logs = root.path().join("logs");
        init(&dirs, &live, Some(&logs)).unwrap();
        append(&dirs, &live, &[Event::Delete {}]).unwrap();
        let (_, gone) = fake_sandbox(root.path(), "gone1");
        init(&dirs, &gone, Some(&logs)).unwrap();
        append(&dirs, &gone, &[Event::Delete {}]).unwrap();
        release(&dirs, &gone);
        std::fs::remove_dir_all(dirs.sandbox(&gone).path()).unwrap();

        // Naming the live one is refused and changes nothing.
        let e = prune(&dirs, &logs, Duration::ZERO, Some(&live)).unwrap_err();
        assert!(matches!(e, PruneError::Live { .. }), "{e}");
        // Too recent for an hour's cut-off.
        let p = prune(&dirs, &logs, Duration::from_secs(3600), None).unwrap();
        assert!(p.removed.is_empty() && p.recent.len() == 1 && p.live.len() == 1);
        let p = prune(&dirs, &logs, Duration::ZERO, None).unwrap();
        assert_eq!(p.removed, [logs.join("gone1.jsonl")]);
        assert_eq!(p.live, [logs.join("live1.jsonl")]);
        assert!(logs.join("live1.jsonl").exists() && !logs.join("gone1.jsonl").exists());

        // A live marker from another state root keeps the log while that sandbox exists.
        let other = tempfile::tempdir().unwrap();
        let (odirs, oid) = fake_sandbox(other.path(), "elsewhere");
        init(&odirs, &oid, Some(&logs)).unwrap();
        append(&odirs, &oid, &[Event::Delete {}]).unwrap();
        let e = prune(&dirs, &logs, Duration::ZERO, Some(&oid)).unwrap_err();
        assert!(matches!(e, PruneError::Live { .. }), "{e}");
        // Once that sandbox is gone (even if its marker was left behind), it can go.
        std::fs::remove_dir_all(odirs.sandbox(&oid).path()).unwrap();
        let p = prune(&dirs, &logs, Duration::ZERO, Some(&oid)).unwrap();
        assert_eq!(p.removed, [logs.join("elsewhere.jsonl")]);
        let e = prune(&dirs, &logs, Duration::ZERO, Some(&oid)).unwrap_err();
        assert!(matches!(e, PruneError::NoLog { .. }), "{e}");
    }
}

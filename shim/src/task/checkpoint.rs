//! Checkpoint, and the Start of a task created from a checkpoint (its restore).
//!
//! The mapping of containerd's options onto the runtime's flags is in [`crate::checkpoint`];
//! here the runtime runs and the task's lifecycle and events follow, as in containerd's runc
//! shim: a checkpoint that lets the task exit ends it through the usual reaped exit (TaskExit),
//! and a restored init is tracked like a started one (pid, exits, TaskStart).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use containerd_shim::api::{Empty, StartResponse};
use containerd_shim::protos::events::task::TaskCheckpointed;
use containerd_shim::protos::shim::shim::CheckpointTaskRequest;
use log::{info, warn};

use crate::cgroup::Cgroups;
use crate::checkpoint::{CheckpointPlan, DEFAULT_WORK_DIR, DUMP_LOG, RESTORE_LOG, RestorePlan};
use crate::container::create_init;
use crate::error::TaskError;
use crate::exits::{self, Kind};
use crate::process::{ProcState, WrongState};
use crate::runtime::Runtime;

use super::{Result, TaskService};

impl TaskService {
    /// Checkpoint: the runtime's `checkpoint` of a running or paused task, then
    /// TaskCheckpointed. With `exit` the runtime ends the task after the dump, and its exit is
    /// reaped and published like any other.
    pub(super) async fn do_checkpoint(&self, req: CheckpointTaskRequest) -> Result<Empty> {
        let plan = CheckpointPlan::from_request(&req.path, req.options.as_ref())?;
        let (runtime, bundle) = {
            let table = self.inner.table.lock().await;
            let c = table.container(&req.id)?;
            let state = c.init.life.state();
            if !matches!(state, ProcState::Running | ProcState::Paused) {
                let wrong = WrongState {
                    state,
                    expected: "running or paused",
                };
                return Err(TaskError::wrong_state(&req.id, wrong));
            }
            (c.runtime.clone(), c.bundle.clone())
        };
        let work = plan
            .work_path
            .clone()
            .unwrap_or_else(|| bundle.join(DEFAULT_WORK_DIR));
        make_dir(&work)?;
        info!(
            "checkpoint {} to {} (leave running: {})",
            req.id,
            plan.image_path.display(),
            plan.leave_running
        );
        let result = runtime.checkpoint(&req.id, &plan, &work).await;
        let log = result
            .is_err()
            .then(|| keep_log(&work.join("dump.log"), &bundle.join(DUMP_LOG)))
            .flatten();
        if plan.work_path.is_none() {
            let _ = std::fs::remove_dir_all(&work);
        }
        result.map_err(|source| TaskError::Criu {
            operation: "checkpoint",
            id: req.id.clone(),
            log,
            source: Box::new(source),
        })?;
        self.publish(TaskCheckpointed {
            container_id: req.id.clone(),
            checkpoint: plan.image_path.display().to_string(),
            ..Default::default()
        })
        .await;
        Ok(Empty::new())
    }

    /// Start of an init created from a checkpoint: the runtime's `restore` with the init's
    /// streams, then the restored init is tracked as a started one. Its pid is known only
    /// once the restore returns, so exits reaped meanwhile are buffered as for an exec start.
    pub(super) async fn start_restored(
        &self,
        id: &str,
        runtime: Runtime,
        plan: RestorePlan,
    ) -> Result<StartResponse> {
        let (bundle, paths) = {
            let mut table = self.inner.table.lock().await;
            let c = table.container(id)?;
            let found = (c.bundle.clone(), c.init.stdio.clone());
            table.early_exits.start_begins();
            found
        };
        let result = match make_dir(&plan.work_path) {
            Ok(()) => create_init(id, &bundle, &runtime, &paths, Some(&plan)).await,
            Err(e) => Err(e),
        };
        let log = result
            .is_err()
            .then(|| {
                keep_log(
                    &plan.work_path.join("restore.log"),
                    &bundle.join(RESTORE_LOG),
                )
            })
            .flatten();
        let _ = std::fs::remove_dir_all(&plan.work_path);

        let started = result.as_ref().ok().map(|(pid, _)| *pid);
        let cgroups = started.and_then(|pid| {
            Cgroups::of_pid(pid)
                .inspect_err(|e| warn!("cgroups of {pid}: {e}"))
                .ok()
        });
        let mut table = self.inner.table.lock().await;
        let early = table.early_exits.start_ends(started);
        let c = table.container_mut(id)?;
        let held = match started {
            Some(pid) => c.init.life.start_succeeded(pid),
            None => c.init.life.start_failed(),
        };
        let next = exits::after_start(Kind::Init, started.is_some(), held.or(early), None);
        let (pid, copies) = result.map_err(|e| match e {
            TaskError::Runtime(source) => TaskError::Criu {
                operation: "restore",
                id: id.to_owned(),
                log,
                source: Box::new(source),
            },
            other => other,
        })?;
        c.init.copies = copies;
        c.oom_kills_at_create = cgroups.as_ref().and_then(Cgroups::oom_kills).unwrap_or(0);
        c.oom_published = Arc::new(AtomicBool::new(false));
        c.oom_task = cgroups
            .as_ref()
            .and_then(|cg| self.watch_oom(cg, id, &c.oom_published));
        c.cgroups = cgroups;
        drop(table);
        info!("restored {id} as pid {pid}");
        self.init_started(id, pid, next).await;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| TaskError::File {
        path: dir.to_owned(),
        source,
    })
}

/// Copies CRIU's log out of a work directory that is about to go; the copy's path, if any.
fn keep_log(from: &Path, to: &Path) -> Option<PathBuf> {
    match std::fs::copy(from, to) {
        Ok(_) => Some(to.to_owned()),
        Err(e) => {
            warn!("no CRIU log kept from {}: {e}", from.display());
            None
        }
    }
}

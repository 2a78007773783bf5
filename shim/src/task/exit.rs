//! Reaped exits: routed to their process, then finished in the order containerd expects.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use containerd_shim::protos::events::task::{TaskExit, TaskOOM};
use log::{debug, info};
use tokio::sync::{Mutex, watch};

use crate::cgroup::Cgroups;
use crate::exits::{self, InitExitRecord, Kind, Route};
use crate::process::Exit;
use crate::runtime::Runtime;
use crate::stdio;

use super::{TaskService, now, process_name};

/// How long an exit waits for the process's last output to be taken by the client.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// How long the init's `exit` record waits for the task's Delete (which writes it in the
/// same runtime run) before a separate `audit-exit` writes it.
const LATE_EXIT_RECORD: Duration = Duration::from_secs(1);

impl TaskService {
    /// A reaped child, routed by [`exits::route`]: finished (on a task of its own), held by a
    /// starting process, buffered for an exec start in flight, or ignored.
    pub(super) async fn on_exit(&self, pid: u32, code: u32) {
        let exit = Exit { code, at: now() };
        let mut table = self.inner.table.lock().await;
        let (procs, early) = table.lifecycles_mut();
        match exits::route(pid, exit, procs, early) {
            Route::Finish((cid, exec_id), exit) => {
                let (cid, exec_id) = (cid.to_owned(), exec_id.to_owned());
                drop(table);
                self.finish_in_background(&cid, &exec_id, exit).await;
            }
            Route::Held | Route::Buffered => {}
            Route::Ignored => debug!("reaped pid {pid} (exit {code})"),
        }
    }

    /// Finishes an exit ([`Self::finish_exit`]) on a task of its own, so that neither the
    /// loop of reaped exits nor a Start reply waits for a client to read the output: every
    /// exit is published as soon as its own output is taken, whoever reads it and whenever
    /// it opens its reader. Returns once the exit's place in the order is taken: an exec's
    /// finish holds its container's `exits_in_flight` for reading, and the init's takes it
    /// for writing, so the init's TaskExit never overtakes an exec's reaped before it.
    pub(super) async fn finish_in_background(&self, cid: &str, exec_id: &str, exit: Exit) {
        let Some(gate) = self
            .inner
            .table
            .lock()
            .await
            .container(cid)
            .ok()
            .map(|c| c.exits_in_flight.clone())
        else {
            return;
        };
        let (cid, exec_id, service) = (cid.to_owned(), exec_id.to_owned(), self.clone());
        if exec_id.is_empty() {
            tokio::spawn(async move {
                let _turn = gate.write_owned().await;
                service.finish_exit(&cid, &exec_id, exit).await;
            });
        } else {
            let turn = gate.read_owned().await;
            tokio::spawn(async move {
                service.finish_exit(&cid, &exec_id, exit).await;
                drop(turn);
            });
        }
    }

    /// Drains the process's output and writes or hands over its audit `exit` record (the two
    /// at once), publishes TaskOOM if the init was OOM-killed, records the exit and
    /// publishes TaskExit, in that order.
    async fn finish_exit(&self, cid: &str, exec_id: &str, exit: Exit) {
        let kind = if exec_id.is_empty() {
            Kind::Init
        } else {
            Kind::Exec
        };
        let (drain, outputs, audit, kills) = {
            let mut table = self.inner.table.lock().await;
            let Ok(c) = table.container_mut(cid) else {
                return;
            };
            // The OOM-kill counter now, as the init is reaped: under the systemd driver the
            // scope's cgroup goes once it is empty, and draining the output and writing the
            // audit record first gave systemd time to remove it (TaskOOM was lost under load).
            let kills = match kind {
                Kind::Init => c.cgroups.as_ref().and_then(Cgroups::oom_kills),
                Kind::Exec => None,
            };
            let runtime = c.runtime.clone();
            let record = c.init_exit_record.clone();
            let Ok(p) = c.process_mut(cid, exec_id) else {
                return;
            };
            let outputs = p.copies.take_outputs();
            (
                p.copies.output_watch(),
                outputs,
                (runtime, p.life.pid(), record),
                kills,
            )
        };
        // Both before the exit is published, side by side: the process has ended, so its
        // record need not wait for its output to be read, nor the other way round.
        let (drained, recorded) = tokio::join!(
            timed(drain_output(drain, outputs)),
            timed(record_exit(kind, cid, exec_id, audit, exit.code))
        );
        debug!("exit of {cid}/{exec_id}: output taken in {drained:?}, recorded in {recorded:?}");
        let mut table = self.inner.table.lock().await;
        if let Ok(c) = table.container(cid)
            && exits::oom_before_exit(
                kind,
                kills.or_else(|| c.cgroups.as_ref().and_then(Cgroups::oom_kills)),
                c.oom_kills_at_create,
                || !c.oom_published.swap(true, Ordering::SeqCst),
            )
        {
            info!("container {cid} was OOM-killed");
            self.publish(TaskOOM {
                container_id: cid.to_owned(),
                ..Default::default()
            })
            .await;
        }
        let Ok(p) = table
            .container_mut(cid)
            .and_then(|c| c.process_mut(cid, exec_id))
        else {
            return;
        };
        p.stop(exit.clone());
        let pid = p.life.pid();
        info!(
            "process {cid}/{exec_id} pid {pid} exited with {}",
            exit.code
        );
        self.publish(TaskExit {
            container_id: cid.to_owned(),
            id: process_name(cid, exec_id).to_owned(),
            pid,
            exit_status: exit.code,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
        .await;
    }
}

/// Waits for the process's output to be taken by the client. Keep this before the exit is
/// published: a client that hears of the exit stops waiting for a reader it has not opened
/// yet, and the output would be lost.
async fn drain_output(terminal: Option<watch::Receiver<bool>>, outputs: Vec<OwnedFd>) {
    if let Some(mut rx) = terminal {
        let _ = tokio::time::timeout(DRAIN_LIMIT, rx.wait_for(|done| *done)).await;
    }
    stdio::drain_outputs(outputs, DRAIN_LIMIT).await;
}

/// Audit trail: the runtime appends the `exit` record, always before the `delete` record.
/// An exec's is written now, before containerd hears of the exit (outside the table's lock),
/// by the container's exit recorder. The init's goes with the Delete that usually follows at
/// once (`ctr run --rm`, CRI): one runtime run instead of two; without a Delete, a separate
/// `audit-exit` writes it after LATE_EXIT_RECORD.
async fn record_exit(
    kind: Kind,
    cid: &str,
    exec_id: &str,
    (runtime, pid, record): (Runtime, u32, Arc<Mutex<InitExitRecord>>),
    code: u32,
) {
    match kind {
        Kind::Init => {
            record.lock().await.reaped(pid, code);
            let cid = cid.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(LATE_EXIT_RECORD).await;
                let mut record = record.lock().await;
                if let Some((pid, code)) = record.take() {
                    runtime.audit_exit(&cid, "", pid, code).await;
                }
            });
        }
        Kind::Exec => runtime.audit_exit(cid, exec_id, pid, code).await,
    }
}

/// How long `step` took (for the shim's debug log: where an exit's time goes).
async fn timed(step: impl Future<Output = ()>) -> Duration {
    let began = std::time::Instant::now();
    step.await;
    began.elapsed()
}

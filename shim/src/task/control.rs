//! The RPCs that act on or report on a process without moving its lifecycle: Kill, State,
//! Wait, Pids, Pause/Resume, Update, Stats, CloseIO, ResizePty, Connect and Shutdown.

use std::collections::HashMap;

use containerd_shim::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, Empty, KillRequest, PidsRequest, PidsResponse,
    ResizePtyRequest, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
    WaitRequest, WaitResponse,
};
use containerd_shim::protos::events::task::{TaskPaused, TaskResumed};
use containerd_shim::protos::types::task::ProcessInfo;

use crate::container::exec_info;
use crate::error::TaskError;
use crate::process::{Exit, ProcState};

use super::{Result, TaskService, now, process_name};

impl TaskService {
    pub(super) async fn do_kill(&self, req: KillRequest) -> Result<Empty> {
        let id = req.id.as_str();
        let (runtime, state, pid) = {
            let table = self.inner.table.lock().await;
            let c = table.container(id)?;
            let p = c.process(id, &req.exec_id)?;
            (c.runtime.clone(), p.life.state(), p.life.pid())
        };
        let finished = || TaskError::Finished {
            id: process_name(id, &req.exec_id).to_owned(),
        };
        if state == ProcState::Stopped && !req.all {
            return Err(finished());
        }
        if req.exec_id.is_empty() {
            // The init can exit between the state check above and the runtime's kill (its
            // exit is recorded only once its output is drained): the runtime then answers
            // that the container is not running, which is NotFound to containerd, as from
            // its own runc shim, and not a failure of the kill. So is a container the
            // runtime no longer knows.
            return match runtime.kill(id, req.signal, req.all).await {
                Err(e) if e.is_process_gone() => Err(finished()),
                Err(e) if e.is_missing_container() => {
                    Err(TaskError::ContainerNotFound { id: id.to_owned() })
                }
                other => other.map(|()| Empty::new()).map_err(Into::into),
            };
        }
        let signal = i32::try_from(req.signal)
            .ok()
            .and_then(rustix::process::Signal::from_named_raw)
            .ok_or(TaskError::Signal { signal: req.signal })?;
        let pid =
            rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)).ok_or_else(finished)?;
        rustix::process::kill_process(pid, signal).map_err(|_| finished())?;
        Ok(Empty::new())
    }

    pub(super) async fn do_state(&self, req: StateRequest) -> Result<StateResponse> {
        let table = self.inner.table.lock().await;
        let c = table.container(&req.id)?;
        let p = c.process(&req.id, &req.exec_id)?;
        let exit = p.exit();
        Ok(StateResponse {
            id: process_name(&req.id, &req.exec_id).to_owned(),
            bundle: c.bundle.display().to_string(),
            pid: p.life.pid(),
            status: p.life.state().status().into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.as_ref().map(|e| e.code).unwrap_or(0),
            exited_at: exit.map(|e| e.at).into(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    pub(super) async fn do_wait(&self, req: WaitRequest) -> Result<WaitResponse> {
        let mut rx = {
            let table = self.inner.table.lock().await;
            table
                .container(&req.id)?
                .process(&req.id, &req.exec_id)?
                .exit_watch()
        };
        let exit = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or(Exit {
                code: 255,
                at: now(),
            });
        Ok(WaitResponse {
            exit_status: exit.code,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    pub(super) async fn do_pids(&self, req: PidsRequest) -> Result<PidsResponse> {
        let (runtime, exec_pids) = {
            let table = self.inner.table.lock().await;
            let c = table.container(&req.id)?;
            let exec_pids: HashMap<u32, String> = c
                .execs
                .iter()
                .filter(|(_, p)| p.life.pid() != 0)
                .map(|(exec_id, p)| (p.life.pid(), exec_id.clone()))
                .collect();
            (c.runtime.clone(), exec_pids)
        };
        let pids = runtime.ps(&req.id).await?;
        Ok(PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| ProcessInfo {
                    pid,
                    info: exec_pids.get(&pid).and_then(|id| exec_info(id)).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    pub(super) async fn pause_resume(&self, id: &str, pause: bool) -> Result<Empty> {
        let runtime = {
            let table = self.inner.table.lock().await;
            let c = table.container(id)?;
            let from = if pause {
                ProcState::Running
            } else {
                ProcState::Paused
            };
            c.init
                .life
                .require(from)
                .map_err(|w| TaskError::wrong_state(id, w))?;
            c.runtime.clone()
        };
        if pause {
            runtime.pause(id).await?;
        } else {
            runtime.resume(id).await?;
        }
        if let Ok(c) = self.inner.table.lock().await.container_mut(id) {
            if pause {
                c.init.life.paused();
            } else {
                c.init.life.resumed();
            }
        }
        if pause {
            self.publish(TaskPaused {
                container_id: id.to_owned(),
                ..Default::default()
            })
            .await;
        } else {
            self.publish(TaskResumed {
                container_id: id.to_owned(),
                ..Default::default()
            })
            .await;
        }
        Ok(Empty::new())
    }

    pub(super) async fn do_update(&self, req: UpdateTaskRequest) -> Result<Empty> {
        let (runtime, bundle) = {
            let table = self.inner.table.lock().await;
            let c = table.container(&req.id)?;
            (c.runtime.clone(), c.bundle.clone())
        };
        let file = bundle.join("update-resources.json");
        let body = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        std::fs::write(&file, body).map_err(|source| TaskError::File {
            path: file.clone(),
            source,
        })?;
        let result = runtime.update(&req.id, &file).await;
        let _ = std::fs::remove_file(&file);
        result?;
        Ok(Empty::new())
    }

    pub(super) async fn do_stats(&self, req: StatsRequest) -> Result<StatsResponse> {
        let cgroups = self
            .inner
            .table
            .lock()
            .await
            .container(&req.id)?
            .cgroups
            .clone()
            .ok_or_else(|| TaskError::NoCgroup { id: req.id.clone() })?;
        let metrics = cgroups.metrics()?;
        let any = containerd_shim::util::convert_to_any(metrics).map_err(TaskError::Encode)?;
        Ok(StatsResponse {
            stats: Some(any).into(),
            ..Default::default()
        })
    }

    pub(super) async fn do_close_io(&self, req: CloseIORequest) -> Result<Empty> {
        let mut table = self.inner.table.lock().await;
        let p = table
            .container_mut(&req.id)?
            .process_mut(&req.id, &req.exec_id)?;
        if req.stdin {
            p.copies.close_stdin();
        }
        Ok(Empty::new())
    }

    pub(super) async fn do_resize(&self, req: ResizePtyRequest) -> Result<Empty> {
        let table = self.inner.table.lock().await;
        let p = table.container(&req.id)?.process(&req.id, &req.exec_id)?;
        p.copies.resize(req.width, req.height)?;
        Ok(Empty::new())
    }

    pub(super) async fn do_connect(&self, req: ConnectRequest) -> Result<ConnectResponse> {
        let table = self.inner.table.lock().await;
        let task_pid = table
            .container(&req.id)
            .map(|c| c.init.life.pid())
            .unwrap_or(0);
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        })
    }

    pub(super) async fn do_shutdown(&self) -> Result<Empty> {
        if self.inner.table.lock().await.containers.is_empty() {
            self.inner.exit.signal();
        }
        Ok(Empty::new())
    }
}

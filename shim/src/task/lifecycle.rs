//! Create, Start, Exec and Delete: the RPCs that move a process through its lifecycle.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use containerd_shim::api::{
    CreateTaskRequest, CreateTaskResponse, DeleteRequest, DeleteResponse, Empty,
    ExecProcessRequest, StartRequest, StartResponse,
};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskOOM, TaskStart,
};
use log::{debug, info, warn};

use crate::cgroup::Cgroups;
use crate::checkpoint::RestorePlan;
use crate::container::{Container, Process, check_id, create_init, run_exec};
use crate::error::TaskError;
use crate::exits::{self, Kind};
use crate::options::RuntimeOptions;
use crate::process::{Exit, ProcState};
use crate::rootfs;
use crate::runtime::Runtime;
use crate::stdio::{Copies, StdioPaths};

use super::{DELETED_MARKER, Result, TaskService, now};

impl TaskService {
    pub(super) async fn do_create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
        check_id("container id", &req.id)?;
        if self
            .inner
            .table
            .lock()
            .await
            .containers
            .contains_key(&req.id)
        {
            return Err(TaskError::ContainerExists { id: req.id });
        }
        let bundle = PathBuf::from(&req.bundle);
        // A marker left by an earlier task of this id would make the `delete` action skip
        // the runtime (see `DELETED_MARKER`).
        let _ = std::fs::remove_file(bundle.join(DELETED_MARKER));
        let opts = RuntimeOptions::from_any(req.options.as_ref(), &self.inner.namespace)?;
        // A checkpoint to restore from: the restore itself runs at Start (task/checkpoint.rs).
        let restore = (!req.checkpoint.is_empty())
            .then(|| RestorePlan::new(&req.checkpoint, &bundle))
            .transpose()?;
        opts.persist(&bundle)?;
        let runtime = Runtime::new(&opts, &bundle);

        let rootfs_mounted = !req.rootfs.is_empty();
        if rootfs_mounted {
            rootfs::mount(&bundle, &req.rootfs)?;
        }

        let paths = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let created = match restore {
            None => create_init(&req.id, &bundle, &runtime, &paths, None).await,
            Some(_) => Ok((0, Copies::default())),
        };
        let (pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                if rootfs_mounted {
                    rootfs::unmount(&bundle);
                }
                return Err(e);
            }
        };

        let cgroups = init_cgroups(pid);
        let oom_published = Arc::new(AtomicBool::new(false));
        let oom_kills_at_create = cgroups.as_ref().and_then(Cgroups::oom_kills).unwrap_or(0);
        let oom_task = cgroups
            .as_ref()
            .and_then(|cg| self.watch_oom(cg, &req.id, &oom_published));

        let mut init = Process::new(pid, paths.clone());
        init.copies = copies;
        let container = Container {
            bundle: bundle.clone(),
            runtime,
            init,
            execs: HashMap::new(),
            init_exit_record: Arc::default(),
            exits_in_flight: Arc::default(),
            cgroups,
            oom_task,
            oom_published,
            oom_kills_at_create,
            rootfs_mounted,
            restore,
        };
        self.inner
            .table
            .lock()
            .await
            .containers
            .insert(req.id.clone(), container);

        self.publish_create(&req, paths, pid).await;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    /// The `TaskCreate` event of the task `req` created, with init `pid`.
    async fn publish_create(&self, req: &CreateTaskRequest, paths: StdioPaths, pid: u32) {
        self.publish(TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            io: Some(TaskIO {
                stdin: paths.stdin,
                stdout: paths.stdout,
                stderr: paths.stderr,
                terminal: paths.terminal,
                ..Default::default()
            })
            .into(),
            checkpoint: req.checkpoint.clone(),
            pid,
            ..Default::default()
        })
        .await;
    }

    /// Publishes TaskOOM for every OOM notification of the container's memory cgroup.
    pub(super) fn watch_oom(
        &self,
        cgroups: &Cgroups,
        id: &str,
        published: &Arc<AtomicBool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        match cgroups.oom_watch() {
            Ok(mut watch) => {
                let s = self.clone();
                let id = id.to_owned();
                let published = published.clone();
                Some(tokio::spawn(async move {
                    while watch.next().await.is_some() {
                        info!("container {id} hit its memory limit");
                        // Every notification is reported (a container can survive an OOM
                        // kill of one of its processes and hit the limit again).
                        published.store(true, Ordering::SeqCst);
                        s.publish(TaskOOM {
                            container_id: id.clone(),
                            ..Default::default()
                        })
                        .await;
                    }
                }))
            }
            Err(e) => {
                warn!("no OOM notifications for {id}: {e}");
                None
            }
        }
    }

    pub(super) async fn do_start(&self, req: StartRequest) -> Result<StartResponse> {
        if req.exec_id.is_empty() {
            self.start_init(&req.id).await
        } else {
            self.start_exec(&req.id, &req.exec_id).await
        }
    }

    async fn start_init(&self, id: &str) -> Result<StartResponse> {
        let (runtime, restore) = {
            let mut table = self.inner.table.lock().await;
            let c = table.container_mut(id)?;
            c.init
                .life
                .begin_start()
                .map_err(|w| TaskError::wrong_state(id, w))?;
            (c.runtime.clone(), c.restore.take())
        };
        if let Some(plan) = restore {
            return self.start_restored(id, runtime, plan).await;
        }
        let result = runtime.start(id).await;
        let (pid, next) = {
            let mut table = self.inner.table.lock().await;
            let life = &mut table.container_mut(id)?.init.life;
            let held = match result {
                Ok(()) => life.start_succeeded(life.pid()),
                Err(_) => life.start_failed(),
            };
            (
                life.pid(),
                exits::after_start(Kind::Init, result.is_ok(), held, None),
            )
        };
        self.init_started(id, pid, next).await;
        result?;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    /// After the init's start (or restore) returned: TaskStart if it started, then the exit
    /// it held meanwhile, in that order.
    pub(super) async fn init_started(&self, id: &str, pid: u32, next: exits::AfterStart) {
        if next.announce {
            self.publish(TaskStart {
                container_id: id.to_owned(),
                pid,
                ..Default::default()
            })
            .await;
        }
        if let Some(exit) = next.finish {
            self.finish_in_background(id, "", exit).await;
        }
    }

    async fn start_exec(&self, id: &str, exec_id: &str) -> Result<StartResponse> {
        let (runtime, bundle, paths, spec) = {
            let mut table = self.inner.table.lock().await;
            let c = table.container_mut(id)?;
            c.init
                .life
                .require(ProcState::Running)
                .map_err(|w| TaskError::wrong_state(id, w))?;
            let (runtime, bundle) = (c.runtime.clone(), c.bundle.clone());
            let p = c.process_mut(id, exec_id)?;
            p.life
                .require(ProcState::Created)
                .map_err(|w| TaskError::wrong_state(exec_id, w))?;
            let spec = p.spec.clone().ok_or_else(|| TaskError::NoSpec {
                exec_id: exec_id.to_owned(),
            })?;
            p.life
                .begin_start()
                .map_err(|w| TaskError::wrong_state(exec_id, w))?;
            let paths = p.stdio.clone();
            table.early_exits.start_begins();
            (runtime, bundle, paths, spec)
        };
        runtime.warm_exit_recorder(id);
        let began = std::time::Instant::now();
        let result = run_exec(id, exec_id, &runtime, &bundle, &paths, &spec).await;
        debug!(
            "exec {id}/{exec_id}: the runtime's exec took {:?}",
            began.elapsed()
        );
        let mut table = self.inner.table.lock().await;
        let started = result.as_ref().ok().map(|(pid, _)| *pid);
        let early = table.early_exits.start_ends(started);
        let p = table.container_mut(id)?.process_mut(id, exec_id)?;
        let held = match started {
            Some(pid) => p.life.start_succeeded(pid),
            None => p.life.start_failed(),
        };
        let next = exits::after_start(Kind::Exec, started.is_some(), held, early);
        let (pid, copies) = match result {
            Ok(v) => v,
            Err(e) => {
                // Containerd hears of the failure from Start; no TaskExit follows.
                p.stop(Exit {
                    code: 255,
                    at: now(),
                });
                return Err(e);
            }
        };
        p.copies = copies;
        drop(table);
        if next.announce {
            self.publish(TaskExecStarted {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
                pid,
                ..Default::default()
            })
            .await;
        }
        // On a task of its own: CRI's ExecSync opens its reader only once Start has returned,
        // so a Start that waited for the output to be read would wait out the drain limit.
        if let Some(exit) = next.finish {
            self.finish_in_background(id, exec_id, exit).await;
        }
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    pub(super) async fn do_delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        if req.exec_id.is_empty() {
            self.delete_init(&req.id).await
        } else {
            self.delete_exec(&req.id, &req.exec_id).await
        }
    }

    async fn delete_exec(&self, id: &str, exec_id: &str) -> Result<DeleteResponse> {
        let mut table = self.inner.table.lock().await;
        let c = table.container_mut(id)?;
        c.process(id, exec_id)?
            .life
            .require_not_live("stopped")
            .map_err(|w| TaskError::wrong_state(exec_id, w))?;
        let p = c
            .execs
            .remove(exec_id)
            .ok_or_else(|| TaskError::ExecNotFound {
                id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            })?;
        let exit = p.exit().unwrap_or(Exit { code: 0, at: now() });
        Ok(DeleteResponse {
            pid: p.life.pid(),
            exit_status: exit.code,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn delete_init(&self, id: &str) -> Result<DeleteResponse> {
        let (runtime, state, record) = {
            let table = self.inner.table.lock().await;
            let c = table.container(id)?;
            c.init
                .life
                .require_not_live("stopped or created")
                .map_err(|w| TaskError::wrong_state(id, w))?;
            (
                c.runtime.clone(),
                c.init.life.state(),
                c.init_exit_record.clone(),
            )
        };
        // Every exec's exit is recorded by now (the init's exit waited for theirs).
        runtime.close_exit_recorder().await;
        // Held while the runtime deletes: a late `audit-exit` either ran already (and
        // took the exit) or never runs.
        let mut record = record.lock().await;
        let reaped = record.take();
        let deleted = match runtime
            .delete(id, state == ProcState::Created, reaped)
            .await
        {
            Err(e) if !e.is_missing_container() => {
                record.restore(reaped);
                return Err(e.into());
            }
            Err(_) => false,
            Ok(()) => true,
        };
        drop(record);
        let c = {
            let mut table = self.inner.table.lock().await;
            table
                .containers
                .remove(id)
                .ok_or_else(|| TaskError::ContainerNotFound { id: id.to_owned() })?
        };
        if deleted && let Err(e) = std::fs::write(c.bundle.join(DELETED_MARKER), id) {
            // Only a missed shortcut: the `delete` action then runs the runtime again.
            warn!("write {DELETED_MARKER} for {id}: {e}");
        }
        if let Some(t) = &c.oom_task {
            t.abort();
        }
        if c.rootfs_mounted {
            rootfs::unmount(&c.bundle);
        }
        let exit = c.init.exit().unwrap_or(Exit {
            code: 137,
            at: now(),
        });
        self.publish(TaskDelete {
            container_id: id.to_owned(),
            pid: c.init.life.pid(),
            exit_status: exit.code,
            exited_at: Some(exit.at.clone()).into(),
            id: id.to_owned(),
            ..Default::default()
        })
        .await;
        Ok(DeleteResponse {
            pid: c.init.life.pid(),
            exit_status: exit.code,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    pub(super) async fn do_exec(&self, req: ExecProcessRequest) -> Result<Empty> {
        check_id("exec id", &req.exec_id)?;
        {
            let mut table = self.inner.table.lock().await;
            let c = table.container_mut(&req.id)?;
            if c.execs.contains_key(&req.exec_id) {
                return Err(TaskError::ExecExists {
                    id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                });
            }
            c.init
                .life
                .require(ProcState::Running)
                .map_err(|w| TaskError::wrong_state(&req.id, w))?;
            let mut p = Process::new(
                0,
                StdioPaths {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                },
            );
            p.spec = req.spec.as_ref().map(|any| any.value.clone());
            if p.spec.as_ref().is_none_or(Vec::is_empty) {
                return Err(TaskError::NoSpec {
                    exec_id: req.exec_id.clone(),
                });
            }
            c.execs.insert(req.exec_id.clone(), p);
        }
        self.publish(TaskExecAdded {
            container_id: req.id.clone(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
        .await;
        Ok(Empty::new())
    }
}

/// The cgroups of the task's init `pid` (none for a restore's placeholder pid 0, or when
/// they cannot be read: logged).
fn init_cgroups(pid: u32) -> Option<Cgroups> {
    (pid != 0)
        .then(|| {
            Cgroups::of_pid(pid)
                .inspect_err(|e| warn!("cgroups of {pid}: {e}"))
                .ok()
        })
        .flatten()
}

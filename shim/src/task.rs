//! The task service: containerd's Task API (v2) on top of the runtime binary.
//!
//! Each RPC looks its container up in the [`Table`], checks the move with the process's
//! [`Lifecycle`](crate::process::Lifecycle), runs the runtime binary outside the table's lock
//! and publishes the matching event. The order of exits, start events and OOMs is decided in
//! [`crate::exits`]; every decision about the sandbox itself is left to the runtime binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
    DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
    WaitRequest, WaitResponse,
};
use containerd_shim::event::Event;
use containerd_shim::monitor::{Subject, Topic, monitor_subscribe};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::shim::shim::CheckpointTaskRequest;
use containerd_shim::protos::types::task::ProcessInfo;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Context, ExitSignal, TtrpcContext, TtrpcResult};
use log::{debug, info, warn};
use tokio::sync::Mutex;

use crate::cgroup::Cgroups;
use crate::container::{Container, Process, Table, check_id, exec_info, open_streams, read_pid};
use crate::error::{TaskError, error_chain};
use crate::exits::{self, Kind, Route};
use crate::options::RuntimeOptions;
use crate::process::{Exit, ProcState};
use crate::rootfs;
use crate::runtime::Runtime;
use crate::stdio::{self, ConsoleSocket, Copies, StdioPaths};

/// How long an exit waits for the process's last output to be taken by the client.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// How long the init's `exit` record waits for the task's Delete (which writes it in the
/// same runtime run) before a separate `audit-exit` writes it.
const LATE_EXIT_RECORD: Duration = Duration::from_secs(1);

/// Written into a task's bundle once the runtime has deleted the container (state, cgroups,
/// helpers, id block all released). The shim's `delete` action, which containerd runs after
/// every shim exit, then skips running the runtime's `delete --force` for nothing: that run
/// is on the critical path of every `ctr run --rm` and pod teardown. Without the marker (the
/// daemon was killed, or the runtime's delete failed) the action runs the runtime as before.
pub const DELETED_MARKER: &str = "agent-sandbox-deleted";

type Result<T> = std::result::Result<T, TaskError>;

struct Inner {
    table: Mutex<Table>,
    publisher: RemotePublisher,
    namespace: String,
    exit: Arc<ExitSignal>,
}

/// The ttrpc Task service.
#[derive(Clone)]
pub struct TaskService {
    inner: Arc<Inner>,
}

fn now() -> Timestamp {
    containerd_shim::util::timestamp().unwrap_or_default()
}

/// The process's name in errors and events: the exec id, or the container id for the init.
fn process_name<'a>(id: &'a str, exec_id: &'a str) -> &'a str {
    if exec_id.is_empty() { id } else { exec_id }
}

impl TaskService {
    /// Creates the service and starts the loop that turns reaped exits into TaskExit events.
    pub async fn new(publisher: RemotePublisher, namespace: String, exit: Arc<ExitSignal>) -> Self {
        let service = Self {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::default()),
                publisher,
                namespace,
                exit,
            }),
        };
        match monitor_subscribe(Topic::Pid).await {
            Ok(mut sub) => {
                let s = service.clone();
                tokio::spawn(async move {
                    while let Some(ev) = sub.rx.recv().await {
                        if let Subject::Pid(pid) = ev.subject {
                            let code = u32::try_from(ev.exit_code).unwrap_or(255);
                            s.on_exit(u32::try_from(pid).unwrap_or(0), code).await;
                        }
                    }
                });
            }
            Err(e) => warn!("cannot subscribe to exits: {e}"),
        }
        service
    }

    async fn publish(&self, event: impl Event + 'static) {
        let topic = event.topic();
        if let Err(e) = self
            .inner
            .publisher
            .publish(
                Context::default(),
                &topic,
                &self.inner.namespace,
                Box::new(event),
            )
            .await
        {
            warn!("publish {topic}: {e}");
        }
    }

    /// A reaped child, routed by [`exits::route`]: finished now, held by a starting process,
    /// buffered for an exec start in flight, or ignored.
    async fn on_exit(&self, pid: u32, code: u32) {
        let exit = Exit { code, at: now() };
        let mut table = self.inner.table.lock().await;
        let (procs, early) = table.lifecycles_mut();
        match exits::route(pid, exit, procs, early) {
            Route::Finish((cid, exec_id), exit) => {
                drop(table);
                self.finish_exit(&cid, &exec_id, exit).await;
            }
            Route::Held | Route::Buffered => {}
            Route::Ignored => debug!("reaped pid {pid} (exit {code})"),
        }
    }

    /// Drains the process's output, writes or hands over its audit `exit` record, publishes
    /// TaskOOM if the init was OOM-killed, records the exit and publishes TaskExit, in that
    /// order.
    async fn finish_exit(&self, cid: &str, exec_id: &str, exit: Exit) {
        let kind = if exec_id.is_empty() {
            Kind::Init
        } else {
            Kind::Exec
        };
        let (drain, outputs, audit) = {
            let mut table = self.inner.table.lock().await;
            let Ok(c) = table.container_mut(cid) else {
                return;
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
            )
        };
        if let Some(mut rx) = drain {
            let _ = tokio::time::timeout(DRAIN_LIMIT, rx.wait_for(|done| *done)).await;
        }
        // Keep this before the exit is published: a client that hears of the exit stops
        // waiting for a reader it has not opened yet, and the output would be lost.
        stdio::drain_outputs(outputs, DRAIN_LIMIT).await;
        // Audit trail: the runtime appends the `exit` record, always before the `delete`
        // record. An exec's is written now, before containerd hears of the exit (outside the
        // table's lock). The init's goes with the Delete that usually follows at once (`ctr
        // run --rm`, CRI): one runtime run instead of two; without a Delete, a separate
        // `audit-exit` writes it after LATE_EXIT_RECORD.
        let (runtime, pid, record) = audit;
        match kind {
            Kind::Init => {
                record.lock().await.reaped(pid, exit.code);
                let cid = cid.to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep(LATE_EXIT_RECORD).await;
                    let mut record = record.lock().await;
                    if let Some((pid, code)) = record.take() {
                        runtime.audit_exit(&cid, "", pid, code).await;
                    }
                });
            }
            Kind::Exec => runtime.audit_exit(cid, exec_id, pid, exit.code).await,
        }
        let mut table = self.inner.table.lock().await;
        if let Ok(c) = table.container(cid)
            && exits::oom_before_exit(
                kind,
                c.cgroups.as_ref().and_then(Cgroups::oom_kills),
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

    async fn do_create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
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
        let created = self.create_init(&req.id, &bundle, &runtime, &paths).await;
        let (pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                if rootfs_mounted {
                    rootfs::unmount(&bundle);
                }
                return Err(e);
            }
        };

        let cgroups = Cgroups::of_pid(pid)
            .inspect_err(|e| warn!("cgroups of {pid}: {e}"))
            .ok();
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
            cgroups,
            oom_task,
            oom_published,
            oom_kills_at_create,
            rootfs_mounted,
        };
        self.inner
            .table
            .lock()
            .await
            .containers
            .insert(req.id.clone(), container);

        let rootfs = req.rootfs.clone();
        self.publish(TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.clone(),
            rootfs,
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
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    /// Publishes TaskOOM for every OOM notification of the container's memory cgroup.
    fn watch_oom(
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

    async fn create_init(
        &self,
        id: &str,
        bundle: &Path,
        runtime: &Runtime,
        paths: &StdioPaths,
    ) -> Result<(u32, Copies)> {
        let (stdio, mut copies, socket) = open_streams(paths)?;
        let pid_file = bundle.join("init.pid");
        let socket_path = socket.as_ref().map(ConsoleSocket::path);
        runtime
            .create(id, bundle, &pid_file, socket_path.as_deref(), stdio)
            .await?;
        if let Some(socket) = socket {
            let master = match socket.receive().await {
                Ok(m) => m,
                Err(e) => {
                    let _ = runtime.delete(id, true, None).await;
                    return Err(e.into());
                }
            };
            copies = stdio::console(master, paths)?;
        }
        let pid = read_pid(&pid_file)?;
        Ok((pid, copies))
    }

    async fn do_start(&self, req: StartRequest) -> Result<StartResponse> {
        if req.exec_id.is_empty() {
            self.start_init(&req.id).await
        } else {
            self.start_exec(&req.id, &req.exec_id).await
        }
    }

    async fn start_init(&self, id: &str) -> Result<StartResponse> {
        let runtime = {
            let mut table = self.inner.table.lock().await;
            let c = table.container_mut(id)?;
            c.init
                .life
                .begin_start()
                .map_err(|w| TaskError::wrong_state(id, w))?;
            c.runtime.clone()
        };
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
        if next.announce {
            self.publish(TaskStart {
                container_id: id.to_owned(),
                pid,
                ..Default::default()
            })
            .await;
        }
        if let Some(exit) = next.finish {
            self.finish_exit(id, "", exit).await;
        }
        result?;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
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
        let result = self
            .run_exec(id, exec_id, &runtime, &bundle, &paths, &spec)
            .await;
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
        if let Some(exit) = next.finish {
            self.finish_exit(id, exec_id, exit).await;
        }
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn run_exec(
        &self,
        id: &str,
        exec_id: &str,
        runtime: &Runtime,
        bundle: &Path,
        paths: &StdioPaths,
        spec: &[u8],
    ) -> Result<(u32, Copies)> {
        let process_file = bundle.join(format!("exec-{exec_id}.json"));
        let pid_file = bundle.join(format!("exec-{exec_id}.pid"));
        std::fs::write(&process_file, spec).map_err(|source| TaskError::File {
            path: process_file.clone(),
            source,
        })?;
        let result = async {
            let (stdio, mut copies, socket) = open_streams(paths)?;
            let socket_path = socket.as_ref().map(ConsoleSocket::path);
            runtime
                .exec(id, &process_file, &pid_file, socket_path.as_deref(), stdio)
                .await?;
            if let Some(socket) = socket {
                copies = stdio::console(socket.receive().await?, paths)?;
            }
            Ok((read_pid(&pid_file)?, copies))
        }
        .await;
        let _ = std::fs::remove_file(&process_file);
        let _ = std::fs::remove_file(&pid_file);
        result
    }

    async fn do_delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
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
        // Held while the runtime deletes: a late `audit-exit` either ran already (and
        // took the exit) or never runs.
        let mut record = record.lock().await;
        let reaped = record.take();
        let deleted = match runtime
            .delete(id, state == ProcState::Created, reaped)
            .await
        {
            Err(e) if !e.is_not_found() => {
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

    async fn do_exec(&self, req: ExecProcessRequest) -> Result<Empty> {
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

    async fn do_kill(&self, req: KillRequest) -> Result<Empty> {
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
            // its own runc shim, and not a failure of the kill.
            return match runtime.kill(id, req.signal, req.all).await {
                Err(e) if e.is_process_gone() => Err(finished()),
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

    async fn do_state(&self, req: StateRequest) -> Result<StateResponse> {
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

    async fn do_wait(&self, req: WaitRequest) -> Result<WaitResponse> {
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

    async fn do_pids(&self, req: PidsRequest) -> Result<PidsResponse> {
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

    async fn pause_resume(&self, id: &str, pause: bool) -> Result<Empty> {
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

    async fn do_update(&self, req: UpdateTaskRequest) -> Result<Empty> {
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

    async fn do_stats(&self, req: StatsRequest) -> Result<StatsResponse> {
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

    async fn do_close_io(&self, req: CloseIORequest) -> Result<Empty> {
        let mut table = self.inner.table.lock().await;
        let p = table
            .container_mut(&req.id)?
            .process_mut(&req.id, &req.exec_id)?;
        if req.stdin {
            p.copies.close_stdin();
        }
        Ok(Empty::new())
    }

    async fn do_resize(&self, req: ResizePtyRequest) -> Result<Empty> {
        let table = self.inner.table.lock().await;
        let p = table.container(&req.id)?.process(&req.id, &req.exec_id)?;
        p.copies.resize(req.width, req.height)?;
        Ok(Empty::new())
    }

    async fn do_connect(&self, req: ConnectRequest) -> Result<ConnectResponse> {
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

    async fn do_shutdown(&self) -> Result<Empty> {
        if self.inner.table.lock().await.containers.is_empty() {
            self.inner.exit.signal();
        }
        Ok(Empty::new())
    }
}

fn log_result<T>(method: &str, r: Result<T>) -> TtrpcResult<T> {
    r.map_err(|e| {
        warn!("{method}: {}", error_chain(&e));
        e.into()
    })
}

#[async_trait]
impl containerd_shim::Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        info!("create {} bundle {}", req.id, req.bundle);
        log_result("create", self.do_create(req).await)
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        log_result("start", self.do_start(req).await)
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        log_result("delete", self.do_delete(req).await)
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        log_result("pids", self.do_pids(req).await)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        log_result("pause", self.pause_resume(&req.id, true).await)
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        log_result("resume", self.pause_resume(&req.id, false).await)
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        _req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        log_result(
            "checkpoint",
            Err(TaskError::Unimplemented {
                method: "checkpoint",
            }),
        )
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        log_result("kill", self.do_kill(req).await)
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        log_result("exec", self.do_exec(req).await)
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        log_result("resize_pty", self.do_resize(req).await)
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        log_result("close_io", self.do_close_io(req).await)
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        log_result("update", self.do_update(req).await)
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        log_result("wait", self.do_wait(req).await)
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        log_result("stats", self.do_stats(req).await)
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        log_result("connect", self.do_connect(req).await)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        log_result("shutdown", self.do_shutdown().await)
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        log_result("state", self.do_state(req).await)
    }
}

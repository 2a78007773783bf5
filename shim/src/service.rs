//! The task service: containerd's Task API (v2) on top of the runtime binary.
//!
//! Every state change is recorded here, in an explicit per-process state machine
//! (`Created -> Running <-> Paused -> Stopped`), and every decision about the sandbox itself is
//! left to the runtime binary. Exit handling follows two rules:
//! - an exit that arrives while the process's Start is still in flight is held, and published
//!   after TaskStart / TaskExecStarted, so TaskExit never precedes the start event;
//! - exits of pids not known yet (an exec that died before its pid file was read) are buffered
//!   while any start is in flight and matched once the pid is known.

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
use containerd_shim::protos::types::task::{ProcessInfo, Status};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Context, ExitSignal, TtrpcContext, TtrpcResult};
use log::{debug, info, warn};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

use crate::cgroup::{CgroupError, Cgroups};
use crate::options::{OptionsError, RuntimeOptions};
use crate::rootfs::{self, RootfsError};
use crate::runtime::{Runtime, RuntimeError, Stdio3};
use crate::stdio::{self, ConsoleSocket, Copies, StdioError, StdioPaths};

/// How long an exit waits for the process's last output to be taken by the client.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// How long the init's `exit` record waits for the task's Delete (which writes it in the
/// same runtime run) before a separate `audit-exit` writes it.
/// Written into a task's bundle once the runtime has deleted the container (state, cgroups,
/// helpers, id block all released). The shim's `delete` action, which containerd runs after
/// every shim exit, then skips running the runtime's `delete --force` for nothing: that run
/// is on the critical path of every `ctr run --rm` and pod teardown. Without the marker (the
/// daemon was killed, or the runtime's delete failed) the action runs the runtime as before.
pub const DELETED_MARKER: &str = "agent-sandbox-deleted";

const LATE_EXIT_RECORD: Duration = Duration::from_secs(1);

/// The init's exit (pid, status) while its `exit` record is not yet written: Delete takes it
/// (and holds the lock while the runtime deletes), or after [`LATE_EXIT_RECORD`] a
/// separate `audit-exit` does; whoever takes it writes it, exactly once, before `delete`.
type PendingExit = Arc<Mutex<Option<(u32, u32)>>>;

/// Errors of the task service. Converted to ttrpc status codes in one place, below.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("Container {id} not found")]
    ContainerNotFound { id: String },
    #[error("Exec {exec_id} not found in container {id}")]
    ExecNotFound { id: String, exec_id: String },
    #[error("Container {id} already exists")]
    ContainerExists { id: String },
    #[error("Exec {exec_id} already exists in container {id}")]
    ExecExists { id: String, exec_id: String },
    #[error("Invalid {field} {value:?}: use letters, digits, '.', '_' or '-'")]
    InvalidId { field: &'static str, value: String },
    #[error("Process {id} is {state}, expected {expected}")]
    WrongState {
        id: String,
        state: &'static str,
        expected: &'static str,
    },
    #[error("Process {id} already finished")]
    Finished { id: String },
    #[error("Invalid signal {signal}")]
    Signal { signal: u32 },
    #[error("Exec {exec_id} has no process spec")]
    NoSpec { exec_id: String },
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Stdio(#[from] StdioError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("Container {id} has no cgroup to read")]
    NoCgroup { id: String },
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("Cannot encode the metrics")]
    Encode(#[source] containerd_shim::Error),
    #[error("Cannot access {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Invalid pid in {path}")]
    PidFile { path: PathBuf },
    #[error("{method} is not supported by containerd-shim-agent-sandbox")]
    Unimplemented { method: &'static str },
}

impl From<ServiceError> for containerd_shim::protos::ttrpc::Error {
    fn from(e: ServiceError) -> Self {
        use containerd_shim::protos::ttrpc::{Code, Error, get_status};
        let code = match &e {
            ServiceError::ContainerNotFound { .. }
            | ServiceError::ExecNotFound { .. }
            | ServiceError::Finished { .. } => Code::NOT_FOUND,
            ServiceError::ContainerExists { .. } | ServiceError::ExecExists { .. } => {
                Code::ALREADY_EXISTS
            }
            ServiceError::InvalidId { .. }
            | ServiceError::Signal { .. }
            | ServiceError::NoSpec { .. }
            | ServiceError::Options(_) => Code::INVALID_ARGUMENT,
            ServiceError::WrongState { .. } | ServiceError::NoCgroup { .. } => {
                Code::FAILED_PRECONDITION
            }
            ServiceError::Runtime(r) if r.is_not_found() => Code::NOT_FOUND,
            ServiceError::Unimplemented { .. } => Code::UNIMPLEMENTED,
            ServiceError::Runtime(_)
            | ServiceError::Stdio(_)
            | ServiceError::Cgroup(_)
            | ServiceError::Rootfs(_)
            | ServiceError::Encode(_)
            | ServiceError::File { .. }
            | ServiceError::PidFile { .. } => Code::UNKNOWN,
        };
        Error::RpcStatus(get_status(code, error_chain(&e)))
    }
}

/// "outer: inner: innermost", the whole chain for the client.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

type Result<T> = std::result::Result<T, ServiceError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcState {
    Created,
    Running,
    Paused,
    Stopped,
}

impl ProcState {
    fn name(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
        }
    }

    fn status(self) -> Status {
        match self {
            Self::Created => Status::CREATED,
            Self::Running => Status::RUNNING,
            Self::Paused => Status::PAUSED,
            Self::Stopped => Status::STOPPED,
        }
    }
}

#[derive(Debug, Clone)]
struct Exit {
    code: u32,
    at: Timestamp,
}

struct Process {
    pid: u32,
    state: ProcState,
    /// Start is in flight: an exit now is held until the start event went out.
    starting: bool,
    held_exit: Option<Exit>,
    exit_tx: watch::Sender<Option<Exit>>,
    stdio: StdioPaths,
    copies: Copies,
    /// Exec only: the OCI process spec (JSON) containerd sent.
    spec: Option<Vec<u8>>,
}

impl Process {
    fn new(stdio: StdioPaths) -> Self {
        Self {
            pid: 0,
            state: ProcState::Created,
            starting: false,
            held_exit: None,
            exit_tx: watch::channel(None).0,
            stdio,
            copies: Copies::default(),
            spec: None,
        }
    }

    fn exit(&self) -> Option<Exit> {
        self.exit_tx.borrow().clone()
    }
}

/// The `Info` of an exec process in `Pids` (`ctr task ps`): its exec id as runc-v2 reports
/// it, a `containerd.runc.v1.ProcessDetails`.
fn exec_info(
    exec_id: &str,
) -> Option<containerd_shim::protos::protobuf::well_known_types::any::Any> {
    let details = containerd_shim::protos::shim::oci::ProcessDetails {
        exec_id: exec_id.to_owned(),
        ..Default::default()
    };
    match containerd_shim::util::convert_to_any(Box::new(details)) {
        Ok(any) => Some(any),
        Err(e) => {
            warn!("cannot encode the exec id {exec_id} for ps: {e}");
            None
        }
    }
}

struct Container {
    bundle: PathBuf,
    runtime: Runtime,
    init: Process,
    execs: HashMap<String, Process>,
    cgroups: Option<Cgroups>,
    oom_task: Option<JoinHandle<()>>,
    /// Set once TaskOOM went out (by the notification or the exit check, whichever is first).
    oom_published: Arc<AtomicBool>,
    /// The cgroup's `oom_kill` counter when the container was created.
    oom_kills_at_create: u64,
    rootfs_mounted: bool,
    pending_init_exit: PendingExit,
}

impl Container {
    fn process(&self, id: &str, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs
            .get(exec_id)
            .ok_or_else(|| ServiceError::ExecNotFound {
                id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            })
    }

    fn process_mut(&mut self, id: &str, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| ServiceError::ExecNotFound {
                id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            })
    }
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Container>,
    /// Exec starts whose pid is not known yet.
    exec_starts_in_flight: usize,
    /// Exits of unknown pids seen while exec starts were in flight.
    early_exits: Vec<(u32, Exit)>,
}

impl State {
    fn container(&self, id: &str) -> Result<&Container> {
        self.containers
            .get(id)
            .ok_or_else(|| ServiceError::ContainerNotFound { id: id.to_owned() })
    }

    fn container_mut(&mut self, id: &str) -> Result<&mut Container> {
        self.containers
            .get_mut(id)
            .ok_or_else(|| ServiceError::ContainerNotFound { id: id.to_owned() })
    }
}

struct Inner {
    state: Mutex<State>,
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

fn check_id(field: &'static str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 1024
        && !value.starts_with('.')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ServiceError::InvalidId {
            field,
            value: value.to_owned(),
        })
    }
}

fn read_pid(path: &Path) -> Result<u32> {
    let text = std::fs::read_to_string(path).map_err(|source| ServiceError::File {
        path: path.to_owned(),
        source,
    })?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ServiceError::PidFile {
            path: path.to_owned(),
        })
}

/// Opens the process's streams: the runtime's stdio, plus a console socket with a terminal.
fn open_streams(paths: &StdioPaths) -> Result<(Stdio3, Copies, Option<ConsoleSocket>)> {
    if paths.terminal {
        let socket = ConsoleSocket::new()?;
        let null = || std::process::Stdio::null();
        Ok((
            Stdio3 {
                stdin: null(),
                stdout: null(),
                stderr: null(),
            },
            Copies::default(),
            Some(socket),
        ))
    } else {
        let (stdio, copies) = stdio::direct(paths)?;
        Ok((stdio, copies, None))
    }
}

impl TaskService {
    /// Creates the service and starts the loop that turns reaped exits into TaskExit events.
    pub async fn new(publisher: RemotePublisher, namespace: String, exit: Arc<ExitSignal>) -> Self {
        let service = Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
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

    /// A reaped child: a container process (its exit is recorded and published), an exec
    /// whose pid is not known yet (buffered), or anything else (ignored).
    async fn on_exit(&self, pid: u32, code: u32) {
        let exit = Exit { code, at: now() };
        let mut st = self.inner.state.lock().await;
        let mut found = None;
        for (cid, c) in st.containers.iter_mut() {
            let procs = std::iter::once((String::new(), &mut c.init))
                .chain(c.execs.iter_mut().map(|(k, v)| (k.clone(), v)));
            for (exec_id, p) in procs {
                if p.pid == pid && p.state != ProcState::Stopped && p.exit().is_none() {
                    if p.starting {
                        p.held_exit = Some(exit.clone());
                        return;
                    }
                    found = Some((cid.clone(), exec_id));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some((cid, exec_id)) => {
                drop(st);
                self.finish_exit(&cid, &exec_id, exit).await;
            }
            None if st.exec_starts_in_flight > 0 => st.early_exits.push((pid, exit)),
            None => debug!("reaped pid {pid} (exit {code})"),
        }
    }

    /// Records an exit (after the terminal's output is drained) and publishes TaskExit.
    async fn finish_exit(&self, cid: &str, exec_id: &str, exit: Exit) {
        let (drain, outputs, audit) = {
            let mut st = self.inner.state.lock().await;
            let Ok(c) = st.container_mut(cid) else {
                return;
            };
            let runtime = c.runtime.clone();
            let pending = c.pending_init_exit.clone();
            let Ok(p) = c.process_mut(cid, exec_id) else {
                return;
            };
            let outputs = p.copies.take_outputs();
            (p.copies.output_watch(), outputs, (runtime, p.pid, pending))
        };
        if let Some(mut rx) = drain {
            let _ = tokio::time::timeout(DRAIN_LIMIT, rx.wait_for(|done| *done)).await;
        }
        // Keep this before the exit is published: a client that hears of the exit stops
        // waiting for a reader it has not opened yet, and the output would be lost.
        stdio::drain_outputs(outputs, DRAIN_LIMIT).await;
        // Audit trail: the runtime appends the `exit` record, always before the `delete`
        // record. An exec's is written now, before containerd hears of the exit (outside the
        // state lock). The init's goes with the Delete that usually follows at once (`ctr run
        // --rm`, CRI): one runtime run instead of two; without a Delete, a separate
        // `audit-exit` writes it after LATE_EXIT_RECORD.
        let (runtime, pid, pending) = audit;
        if exec_id.is_empty() {
            *pending.lock().await = Some((pid, exit.code));
            let cid = cid.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(LATE_EXIT_RECORD).await;
                let mut slot = pending.lock().await;
                if let Some((pid, code)) = slot.take() {
                    runtime.audit_exit(&cid, "", pid, code).await;
                }
            });
        } else {
            runtime.audit_exit(cid, exec_id, pid, exit.code).await;
        }
        let mut st = self.inner.state.lock().await;
        if exec_id.is_empty()
            && let Ok(c) = st.container(cid)
            && let Some(kills) = c.cgroups.as_ref().and_then(Cgroups::oom_kills)
            && kills > c.oom_kills_at_create
            && !c.oom_published.swap(true, Ordering::SeqCst)
        {
            // The kernel's notification can be missed (it is sent only by the task that wins
            // the cgroup's OOM lock); the kill counter is authoritative.
            info!("container {cid} was OOM-killed");
            self.publish(TaskOOM {
                container_id: cid.to_owned(),
                ..Default::default()
            })
            .await;
        }
        let Ok(p) = st
            .container_mut(cid)
            .and_then(|c| c.process_mut(cid, exec_id))
        else {
            return;
        };
        p.state = ProcState::Stopped;
        let pid = p.pid;
        p.exit_tx.send_replace(Some(exit.clone()));
        info!(
            "process {cid}/{exec_id} pid {pid} exited with {}",
            exit.code
        );
        let id = if exec_id.is_empty() { cid } else { exec_id };
        self.publish(TaskExit {
            container_id: cid.to_owned(),
            id: id.to_owned(),
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
            .state
            .lock()
            .await
            .containers
            .contains_key(&req.id)
        {
            return Err(ServiceError::ContainerExists { id: req.id });
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
        let oom_task = cgroups.as_ref().and_then(|cg| match cg.oom_watch() {
            Ok(mut watch) => {
                let s = self.clone();
                let id = req.id.clone();
                let published = oom_published.clone();
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
                warn!("no OOM notifications for {}: {e}", req.id);
                None
            }
        });

        let mut init = Process::new(paths.clone());
        init.pid = pid;
        init.copies = copies;
        let container = Container {
            bundle: bundle.clone(),
            runtime,
            init,
            execs: HashMap::new(),
            pending_init_exit: PendingExit::default(),
            cgroups,
            oom_task,
            oom_published,
            oom_kills_at_create,
            rootfs_mounted,
        };
        self.inner
            .state
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
            let mut st = self.inner.state.lock().await;
            let c = st.container_mut(id)?;
            if c.init.state != ProcState::Created {
                return Err(ServiceError::WrongState {
                    id: id.to_owned(),
                    state: c.init.state.name(),
                    expected: "created",
                });
            }
            c.init.starting = true;
            c.runtime.clone()
        };
        let result = runtime.start(id).await;
        let (pid, held) = {
            let mut st = self.inner.state.lock().await;
            let c = st.container_mut(id)?;
            c.init.starting = false;
            let held = c.init.held_exit.take();
            if result.is_ok() {
                c.init.state = ProcState::Running;
            }
            (c.init.pid, held)
        };
        if result.is_ok() {
            self.publish(TaskStart {
                container_id: id.to_owned(),
                pid,
                ..Default::default()
            })
            .await;
        }
        if let Some(exit) = held {
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
            let mut st = self.inner.state.lock().await;
            let c = st.container_mut(id)?;
            if c.init.state != ProcState::Running {
                return Err(ServiceError::WrongState {
                    id: id.to_owned(),
                    state: c.init.state.name(),
                    expected: "running",
                });
            }
            let (runtime, bundle) = (c.runtime.clone(), c.bundle.clone());
            let p = c.process_mut(id, exec_id)?;
            if p.state != ProcState::Created {
                return Err(ServiceError::WrongState {
                    id: exec_id.to_owned(),
                    state: p.state.name(),
                    expected: "created",
                });
            }
            let spec = p.spec.clone().ok_or_else(|| ServiceError::NoSpec {
                exec_id: exec_id.to_owned(),
            })?;
            p.starting = true;
            let paths = p.stdio.clone();
            st.exec_starts_in_flight += 1;
            (runtime, bundle, paths, spec)
        };
        let result = self
            .run_exec(id, exec_id, &runtime, &bundle, &paths, &spec)
            .await;
        let mut st = self.inner.state.lock().await;
        st.exec_starts_in_flight = st.exec_starts_in_flight.saturating_sub(1);
        let early = match &result {
            Ok((pid, _)) => st
                .early_exits
                .iter()
                .position(|(p, _)| p == pid)
                .map(|i| st.early_exits.remove(i).1),
            Err(_) => None,
        };
        if st.exec_starts_in_flight == 0 {
            st.early_exits.clear();
        }
        let p = st.container_mut(id)?.process_mut(id, exec_id)?;
        p.starting = false;
        let held = p.held_exit.take().or(early);
        let (pid, copies) = match result {
            Ok(v) => v,
            Err(e) => {
                p.state = ProcState::Stopped;
                p.exit_tx.send_replace(Some(Exit {
                    code: 255,
                    at: now(),
                }));
                return Err(e);
            }
        };
        p.pid = pid;
        p.copies = copies;
        p.state = ProcState::Running;
        drop(st);
        self.publish(TaskExecStarted {
            container_id: id.to_owned(),
            exec_id: exec_id.to_owned(),
            pid,
            ..Default::default()
        })
        .await;
        if let Some(exit) = held {
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
        std::fs::write(&process_file, spec).map_err(|source| ServiceError::File {
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
        let id = req.id.as_str();
        if !req.exec_id.is_empty() {
            let mut st = self.inner.state.lock().await;
            let c = st.container_mut(id)?;
            let p = c.process(id, &req.exec_id)?;
            if matches!(p.state, ProcState::Running | ProcState::Paused) {
                return Err(ServiceError::WrongState {
                    id: req.exec_id.clone(),
                    state: p.state.name(),
                    expected: "stopped",
                });
            }
            let p = c
                .execs
                .remove(&req.exec_id)
                .ok_or(ServiceError::ExecNotFound {
                    id: id.to_owned(),
                    exec_id: req.exec_id.clone(),
                })?;
            let exit = p.exit().unwrap_or(Exit { code: 0, at: now() });
            return Ok(DeleteResponse {
                pid: p.pid,
                exit_status: exit.code,
                exited_at: Some(exit.at).into(),
                ..Default::default()
            });
        }
        let (runtime, state, pending) = {
            let st = self.inner.state.lock().await;
            let c = st.container(id)?;
            (c.runtime.clone(), c.init.state, c.pending_init_exit.clone())
        };
        if matches!(state, ProcState::Running | ProcState::Paused) {
            return Err(ServiceError::WrongState {
                id: id.to_owned(),
                state: state.name(),
                expected: "stopped or created",
            });
        }
        // Held while the runtime deletes: a late `audit-exit` either ran already (and
        // took the exit) or never runs.
        let mut slot = pending.lock().await;
        let reaped = slot.take();
        let deleted = match runtime
            .delete(id, state == ProcState::Created, reaped)
            .await
        {
            Err(e) if !e.is_not_found() => {
                *slot = reaped;
                return Err(e.into());
            }
            Err(_) => false,
            Ok(()) => true,
        };
        drop(slot);
        let c = {
            let mut st = self.inner.state.lock().await;
            st.containers
                .remove(id)
                .ok_or_else(|| ServiceError::ContainerNotFound { id: id.to_owned() })?
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
            pid: c.init.pid,
            exit_status: exit.code,
            exited_at: Some(exit.at.clone()).into(),
            id: id.to_owned(),
            ..Default::default()
        })
        .await;
        Ok(DeleteResponse {
            pid: c.init.pid,
            exit_status: exit.code,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn do_exec(&self, req: ExecProcessRequest) -> Result<Empty> {
        check_id("exec id", &req.exec_id)?;
        {
            let mut st = self.inner.state.lock().await;
            let c = st.container_mut(&req.id)?;
            if c.execs.contains_key(&req.exec_id) {
                return Err(ServiceError::ExecExists {
                    id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                });
            }
            if c.init.state != ProcState::Running {
                return Err(ServiceError::WrongState {
                    id: req.id.clone(),
                    state: c.init.state.name(),
                    expected: "running",
                });
            }
            let mut p = Process::new(StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
            });
            p.spec = req.spec.as_ref().map(|any| any.value.clone());
            if p.spec.as_ref().is_none_or(Vec::is_empty) {
                return Err(ServiceError::NoSpec {
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
            let st = self.inner.state.lock().await;
            let c = st.container(id)?;
            let p = c.process(id, &req.exec_id)?;
            (c.runtime.clone(), p.state, p.pid)
        };
        let name = if req.exec_id.is_empty() {
            id
        } else {
            &req.exec_id
        };
        if state == ProcState::Stopped && !req.all {
            return Err(ServiceError::Finished {
                id: name.to_owned(),
            });
        }
        if req.exec_id.is_empty() {
            // The init can exit between the state check above and the runtime's kill (its
            // exit is recorded only once its output is drained): the runtime then answers
            // that the container is not running, which is NotFound to containerd, as from
            // its own runc shim, and not a failure of the kill.
            return match runtime.kill(id, req.signal, req.all).await {
                Err(e) if e.is_process_gone() => Err(ServiceError::Finished {
                    id: name.to_owned(),
                }),
                other => other.map(|()| Empty::new()).map_err(Into::into),
            };
        }
        let signal = i32::try_from(req.signal)
            .ok()
            .and_then(rustix::process::Signal::from_named_raw)
            .ok_or(ServiceError::Signal { signal: req.signal })?;
        let pid =
            rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)).ok_or_else(|| {
                ServiceError::Finished {
                    id: name.to_owned(),
                }
            })?;
        rustix::process::kill_process(pid, signal).map_err(|_| ServiceError::Finished {
            id: name.to_owned(),
        })?;
        Ok(Empty::new())
    }

    async fn do_state(&self, req: StateRequest) -> Result<StateResponse> {
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        let p = c.process(&req.id, &req.exec_id)?;
        let exit = p.exit();
        Ok(StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            bundle: c.bundle.display().to_string(),
            pid: p.pid,
            status: p.state.status().into(),
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
            let st = self.inner.state.lock().await;
            st.container(&req.id)?
                .process(&req.id, &req.exec_id)?
                .exit_tx
                .subscribe()
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
            let st = self.inner.state.lock().await;
            let c = st.container(&req.id)?;
            let exec_pids: HashMap<u32, String> = c
                .execs
                .iter()
                .filter(|(_, p)| p.pid != 0)
                .map(|(exec_id, p)| (p.pid, exec_id.clone()))
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
        let (runtime, state) = {
            let st = self.inner.state.lock().await;
            let c = st.container(id)?;
            (c.runtime.clone(), c.init.state)
        };
        let (from, to) = if pause {
            (ProcState::Running, ProcState::Paused)
        } else {
            (ProcState::Paused, ProcState::Running)
        };
        if state != from {
            return Err(ServiceError::WrongState {
                id: id.to_owned(),
                state: state.name(),
                expected: from.name(),
            });
        }
        if pause {
            runtime.pause(id).await?;
        } else {
            runtime.resume(id).await?;
        }
        if let Ok(c) = self.inner.state.lock().await.container_mut(id)
            && c.init.state == from
        {
            c.init.state = to;
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
            let st = self.inner.state.lock().await;
            let c = st.container(&req.id)?;
            (c.runtime.clone(), c.bundle.clone())
        };
        let file = bundle.join("update-resources.json");
        let body = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        std::fs::write(&file, body).map_err(|source| ServiceError::File {
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
            .state
            .lock()
            .await
            .container(&req.id)?
            .cgroups
            .clone()
            .ok_or_else(|| ServiceError::NoCgroup { id: req.id.clone() })?;
        let metrics = cgroups.metrics()?;
        let any = containerd_shim::util::convert_to_any(metrics).map_err(ServiceError::Encode)?;
        Ok(StatsResponse {
            stats: Some(any).into(),
            ..Default::default()
        })
    }

    async fn do_close_io(&self, req: CloseIORequest) -> Result<Empty> {
        let mut st = self.inner.state.lock().await;
        let p = st
            .container_mut(&req.id)?
            .process_mut(&req.id, &req.exec_id)?;
        if req.stdin {
            p.copies.close_stdin();
        }
        Ok(Empty::new())
    }

    async fn do_resize(&self, req: ResizePtyRequest) -> Result<Empty> {
        let st = self.inner.state.lock().await;
        let p = st.container(&req.id)?.process(&req.id, &req.exec_id)?;
        p.copies.resize(req.width, req.height)?;
        Ok(Empty::new())
    }

    async fn do_connect(&self, req: ConnectRequest) -> Result<ConnectResponse> {
        let st = self.inner.state.lock().await;
        let task_pid = st.container(&req.id).map(|c| c.init.pid).unwrap_or(0);
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        })
    }

    async fn do_shutdown(&self) -> Result<Empty> {
        if self.inner.state.lock().await.containers.is_empty() {
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
            Err(ServiceError::Unimplemented {
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

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::ttrpc::{Code, Error};

    fn code(e: ServiceError) -> Code {
        match Error::from(e) {
            Error::RpcStatus(s) => s.code(),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn exec_info_is_runc_v2_process_details() {
        use containerd_shim::protos::protobuf::Message;
        let any = exec_info("probe-1").unwrap();
        // containerd's ctr decodes it by this name (runc-v2 sends the same type).
        assert_eq!(any.type_url, "containerd.runc.v1.ProcessDetails");
        let back = containerd_shim::protos::shim::oci::ProcessDetails::parse_from_bytes(&any.value)
            .unwrap();
        assert_eq!(back.exec_id, "probe-1");
    }

    #[test]
    fn errors_map_to_ttrpc_codes() {
        assert_eq!(
            code(ServiceError::ContainerNotFound { id: "a".into() }),
            Code::NOT_FOUND
        );
        assert_eq!(
            code(ServiceError::ContainerExists { id: "a".into() }),
            Code::ALREADY_EXISTS
        );
        assert_eq!(
            code(ServiceError::InvalidId {
                field: "exec id",
                value: "../x".into()
            }),
            Code::INVALID_ARGUMENT
        );
        assert_eq!(
            code(ServiceError::Unimplemented {
                method: "checkpoint"
            }),
            Code::UNIMPLEMENTED
        );
        assert_eq!(
            code(ServiceError::Runtime(RuntimeError::Failed {
                binary: "/r".into(),
                command: "kill",
                code: 1,
                message: "container \"x\" does not exist".into(),
            })),
            Code::NOT_FOUND
        );
    }

    #[test]
    fn chain_carries_the_cause() {
        let e = ServiceError::Runtime(RuntimeError::Failed {
            binary: "/r".into(),
            command: "create",
            code: 1,
            message: "seccomp layer cannot be applied".into(),
        });
        let Error::RpcStatus(s) = Error::from(e) else {
            panic!()
        };
        assert!(
            s.message().contains("seccomp layer cannot be applied"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("exec id", "exec-1.a_b").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(check_id("exec id", bad).is_err(), "{bad}");
        }
    }
}

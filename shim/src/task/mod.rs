//! The task service: containerd's Task API (v2) on top of the runtime binary.
//!
//! Each RPC looks its container up in the [`Table`], checks the move with the process's
//! [`Lifecycle`](crate::process::Lifecycle), runs the runtime binary outside the table's lock
//! and publishes the matching event. The order of exits, start events and OOMs is decided in
//! [`crate::exits`]; every decision about the sandbox itself is left to the runtime binary.

mod checkpoint;
mod control;
mod exit;
mod lifecycle;
#[cfg(test)]
mod tests;

use std::sync::Arc;

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
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::shim::shim::CheckpointTaskRequest;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Context, ExitSignal, TtrpcContext, TtrpcResult};
use log::{info, warn};
use tokio::sync::Mutex;

use crate::container::Table;
use crate::error::{TaskError, error_chain};

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
        req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        log_result("checkpoint", self.do_checkpoint(req).await)
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

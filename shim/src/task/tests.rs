//! The task service driven as containerd drives it, over a fake runtime binary (a shell
//! script standing in for `agent-sandbox`, as containerd's runc shim tests stand one in for
//! runc): it records each command line and answers as the runtime would, or fails with the
//! message a test gives it, on the runtime's JSON log. The events go to a real ttrpc Events
//! server; the exits of the script and of the process standing in for the init are reaped
//! here and broadcast as the shim's own reaper does.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use containerd_shim::api::{
    CreateTaskRequest, DeleteRequest, Empty, KillRequest, StartRequest, StateRequest, WaitRequest,
};
use containerd_shim::protos::api::ForwardRequest;
use containerd_shim::protos::shim_async::{Events, create_events};
use containerd_shim::protos::ttrpc::asynchronous::{Server, TtrpcContext};
use containerd_shim::protos::ttrpc::{Code, Error};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{ExitSignal, protos::types::task::Status};

use super::TaskService;
use crate::error::TaskError;
use crate::test_util::write_script;

/// The runtime binary: global flags first (`--root R --log L --log-format json`), then the
/// command. Each run appends its command line, without the global flags, to `argv`. A file
/// `fail-CMD` makes `CMD` fail: its text goes to the JSON log as an error, exit 1. `create`
/// copies `init.pid` (the stand-in init the test started) to its `--pid-file`; `kill`
/// signals that init; `ps` lists it; `update` keeps the resources it got; `exec` keeps the
/// process spec it got and copies `exec.pid` to its `--pid-file`.
const SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")
while :; do
  case "$1" in
    --root|--log-format) shift 2 ;;
    --log) log=$2; shift 2 ;;
    --systemd-cgroup) shift ;;
    *) break ;;
  esac
done
echo "$*" >>"$dir/argv"
cmd=$1
shift
if [ -f "$dir/fail-$cmd" ]; then
  printf '{"level":"error","msg":"%s"}\n' "$(cat "$dir/fail-$cmd")" >>"$log"
  exit 1
fi
case $cmd in
  create)
    while [ $# -gt 1 ]; do
      [ "$1" = --pid-file ] && cp "$dir/init.pid" "$2"
      shift
    done ;;
  kill)
    [ "$1" = --all ] && shift
    kill -"$2" "$(cat "$dir/init.pid")" ;;
  ps) printf '[%s]\n' "$(cat "$dir/init.pid")" ;;
  update) cp "$2" "$dir/resources.json" ;;
  exec)
    case "$*" in *--help*) exit 0 ;; esac
    while [ $# -gt 1 ]; do
      [ "$1" = --process ] && cp "$2" "$dir/exec-process.json"
      [ "$1" = --pid-file ] && cp "$dir/exec.pid" "$2"
      shift
    done ;;
esac
exit 0
"#;

/// What the fake runtime and the stand-in init are called (their `comm`): the reaper here
/// collects only those, never another test's children.
const OURS: [&str; 2] = ["fake-runtime", "fake-init"];

/// Reaps this process's exited children named in [`OURS`] and broadcasts each exit as the
/// shim's SIGCHLD handler does (128 + N for signal N). Started once for the test binary.
fn start_reaper() {
    static REAPER: Once = Once::new();
    REAPER.call_once(|| {
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            loop {
                for pid in exited_children() {
                    use rustix::process::{Pid, WaitOptions, waitpid};
                    let Some(child) = Pid::from_raw(pid) else {
                        continue;
                    };
                    let Ok(Some((_, status))) = waitpid(Some(child), WaitOptions::NOHANG) else {
                        continue;
                    };
                    let code = status
                        .terminating_signal()
                        .map_or_else(|| status.exit_status().unwrap_or(255), |n| 128 + n);
                    rt.block_on(containerd_shim::monitor::monitor_notify_by_pid(pid, code))
                        .unwrap();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
    });
}

/// This process's zombie children named in [`OURS`], from `/proc`.
fn exited_children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let comm = head.split_once(" (").map_or("", |(_, c)| c);
            let mut fields = rest.split(' ');
            let state = fields.next();
            let ppid = fields.next();
            state == Some("Z") && ppid == Some(me.as_str()) && OURS.contains(&comm)
        })
        .collect()
}

/// The topics of the events the shim published, in order.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl Events for Recorded {
    async fn forward(
        &self,
        _ctx: &TtrpcContext,
        req: ForwardRequest,
    ) -> containerd_shim::protos::ttrpc::Result<Empty> {
        self.0
            .lock()
            .unwrap()
            .push(req.envelope().topic().to_owned());
        Ok(Empty::new())
    }
}

/// A task service over the fake runtime in a temporary bundle, publishing to a real
/// Events server.
struct Harness {
    dir: tempfile::TempDir,
    service: TaskService,
    events: Recorded,
    _server: Server,
    /// The processes standing in for the init and the execs, reaped by [`start_reaper`].
    stand_ins: Vec<std::process::Child>,
}

const ID: &str = "task1";

impl Harness {
    async fn new() -> Self {
        start_reaper();
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("fake-runtime");
        write_script(&bin, SCRIPT);
        std::os::unix::fs::symlink("/bin/sleep", dir.path().join("fake-init")).unwrap();
        std::fs::create_dir(dir.path().join("bundle")).unwrap();
        let events = Recorded::default();
        let socket = dir.path().join("events.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let mut server = Server::new()
            .add_listener(listener.try_into().unwrap())
            .register_service(create_events(Arc::new(events.clone())));
        server.start().await.unwrap();
        let publisher = RemotePublisher::new(socket.to_str().unwrap())
            .await
            .unwrap();
        let service = TaskService::new(
            publisher,
            "default".to_owned(),
            Arc::new(ExitSignal::default()),
        )
        .await;
        Self {
            dir,
            service,
            events,
            _server: server,
            stand_ins: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `CMD` of the fake runtime fails with `message`.
    fn fail(&self, cmd: &str, message: &str) {
        std::fs::write(self.path(&format!("fail-{cmd}")), message).unwrap();
    }

    /// The runtime's command lines so far, without its global flags.
    fn argv(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("argv"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The topics published so far, once `want` of them are there (events are sent on a
    /// queue of their own).
    async fn events(&self, want: usize) -> Vec<String> {
        for _ in 0..500 {
            if self.events.0.lock().unwrap().len() >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.events.0.lock().unwrap().clone()
    }

    /// Create, as containerd sends it (the runtime named in the options, no rootfs
    /// mounts, no stdio), with a stand-in init the fake's `create` reports.
    async fn create(&mut self) -> Result<u32, TaskError> {
        self.stand_in("init.pid");
        let options = format!(
            "BinaryName = \"{}\"\nRoot = \"{}\"\n",
            self.path("fake-runtime").display(),
            self.path("root").display()
        );
        let req = CreateTaskRequest {
            id: ID.to_owned(),
            bundle: self.path("bundle").display().to_string(),
            options: Some(crate::options::runtime_any("", &options)).into(),
            ..Default::default()
        };
        self.service.do_create(req).await.map(|r| r.pid)
    }

    async fn start(&self) -> Result<u32, TaskError> {
        let req = StartRequest {
            id: ID.to_owned(),
            ..Default::default()
        };
        self.service.do_start(req).await.map(|r| r.pid)
    }

    async fn kill(&self, signal: u32) -> Result<Empty, TaskError> {
        let req = KillRequest {
            id: ID.to_owned(),
            signal,
            ..Default::default()
        };
        self.service.do_kill(req).await
    }

    async fn wait(&self) -> u32 {
        let req = WaitRequest {
            id: ID.to_owned(),
            ..Default::default()
        };
        let wait = self.service.do_wait(req);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the init's exit reaches Wait")
            .unwrap()
            .exit_status
    }

    async fn state(&self) -> Result<(Status, u32), TaskError> {
        let req = StateRequest {
            id: ID.to_owned(),
            ..Default::default()
        };
        let s = self.service.do_state(req).await?;
        Ok((s.status.enum_value_or_default(), s.exit_status))
    }

    async fn delete(&self) -> Result<u32, TaskError> {
        let req = DeleteRequest {
            id: ID.to_owned(),
            ..Default::default()
        };
        self.service.do_delete(req).await.map(|r| r.exit_status)
    }

    /// Starts a process standing in for the init or an exec, its pid in `pid_file` for the
    /// fake runtime to report; returns that pid.
    fn stand_in(&mut self, pid_file: &str) -> u32 {
        let child = std::process::Command::new(self.path("fake-init"))
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(self.path(pid_file), child.id().to_string()).unwrap();
        let pid = child.id();
        self.stand_ins.push(child);
        pid
    }

    /// The pid of the stand-in init.
    fn init_pid(&self) -> u32 {
        self.stand_ins[0].id()
    }
}

/// SIGKILLs the process `pid` (a stand-in).
fn sigkill(pid: u32) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

impl Drop for Harness {
    /// Stand-ins still running are killed (the reaper collects them).
    fn drop(&mut self) {
        for child in &mut self.stand_ins {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
        }
    }
}

/// The ttrpc code containerd gets for `e` (the one `From` impl every RPC goes through).
fn code(e: TaskError) -> (Code, String) {
    match Error::from(e) {
        Error::RpcStatus(s) => (s.code(), s.message().to_owned()),
        other => panic!("not a status: {other:?}"),
    }
}

/// A task's whole life: each RPC runs the runtime with runc's command line, the init's exit
/// (the signal Kill sent) reaches Wait, State and Delete, and the events follow in
/// containerd's order.
#[tokio::test]
async fn a_task_runs_the_runtime_with_runcs_command_lines_and_reports_its_exit() {
    let mut h = Harness::new().await;
    let pid = h.create().await.unwrap();
    assert_eq!(pid, h.init_pid());
    assert_eq!(h.start().await.unwrap(), pid);
    assert_eq!(h.state().await.unwrap(), (Status::RUNNING, 0));
    h.kill(15).await.unwrap();
    assert_eq!(h.wait().await, 128 + 15);
    assert_eq!(h.state().await.unwrap(), (Status::STOPPED, 143));
    assert_eq!(h.delete().await.unwrap(), 143);
    let bundle = h.path("bundle").display().to_string();
    assert_eq!(
        h.argv(),
        [
            format!("create --bundle {bundle} --pid-file {bundle}/init.pid {ID}"),
            format!("start {ID}"),
            format!("kill {ID} 15"),
            // The init's exit, recorded by the runtime in the run that deletes it.
            format!("delete --exit-pid {pid} --exit-status 143 {ID}"),
        ]
    );
    assert_eq!(
        h.events(4).await,
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ]
    );
    assert!(
        h.path("bundle").join(super::DELETED_MARKER).exists(),
        "the delete action will not run the runtime again"
    );
}

/// The global flags every run gets: the runtime's root and its JSON log in the bundle.
#[tokio::test]
async fn every_run_gets_the_root_and_the_json_log_of_the_options() {
    let mut h = Harness::new().await;
    // The whole argv, global flags included, before the script parses them.
    let bin = h.path("fake-runtime");
    write_script(
        &bin,
        &SCRIPT.replacen(
            "dir=$(dirname \"$0\")\n",
            "dir=$(dirname \"$0\")\necho \"$*\" >>\"$dir/global\"\n",
            1,
        ),
    );
    h.create().await.unwrap();
    let global = std::fs::read_to_string(h.path("global")).unwrap();
    let root = h.path("root").display().to_string();
    let log = h.path("bundle").join("log.json").display().to_string();
    assert!(
        global.starts_with(&format!(
            "--root {root} --log {log} --log-format json create "
        )),
        "{global}"
    );
}

/// A failed create: the runtime's own message (from its JSON log) reaches containerd as
/// Unknown, the task is not kept, and no TaskCreate is published.
#[tokio::test]
async fn a_failed_create_keeps_no_task_and_passes_the_runtimes_message() {
    let mut h = Harness::new().await;
    h.fail("create", "cannot load the policy /etc/agent-sandbox/x.toml");
    let (code, message) = code(h.create().await.unwrap_err());
    assert_eq!(code, Code::UNKNOWN);
    assert!(
        message
            .ends_with("create failed (exit 1): cannot load the policy /etc/agent-sandbox/x.toml"),
        "{message}"
    );
    assert_eq!(code_of(h.state().await), Code::NOT_FOUND);
    assert_eq!(h.events(0).await, Vec::<String>::new());
}

/// A failed start is Unknown with the runtime's message, whatever its text (a "not found"
/// from the program would otherwise read as a missing container to CRI).
#[tokio::test]
async fn a_failed_start_is_unknown_even_when_it_says_not_found() {
    let mut h = Harness::new().await;
    h.create().await.unwrap();
    h.fail(
        "start",
        "exec: \\\"nope\\\": executable file not found in $PATH",
    );
    let (code, message) = code(h.start().await.unwrap_err());
    assert_eq!(code, Code::UNKNOWN);
    assert!(message.contains("executable file not found"), "{message}");
}

/// Kill's answers, as containerd's runc shim gives them: a gone process or container is
/// NotFound (containerd reads it as "already stopped"), another failure Unknown, and a kill
/// of an init this shim saw exit never runs the runtime.
#[tokio::test]
async fn kill_maps_the_runtimes_answers_to_containerds_codes() {
    let mut h = Harness::new().await;
    h.create().await.unwrap();
    h.start().await.unwrap();
    for (answer, want) in [
        ("container not running", Code::NOT_FOUND),
        ("container task1 does not exist", Code::NOT_FOUND),
        ("cannot signal process 7", Code::UNKNOWN),
    ] {
        h.fail("kill", answer);
        let (code, message) = code(h.kill(9).await.unwrap_err());
        assert_eq!(code, want, "{answer}: {message}");
    }
    std::fs::remove_file(h.path("fail-kill")).unwrap();
    // The init ends on its own.
    sigkill(h.init_pid());
    assert_eq!(h.wait().await, 137);
    let runs = h.argv().len();
    let (code, message) = code(h.kill(15).await.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (Code::NOT_FOUND, "process task1 already finished")
    );
    assert_eq!(h.argv().len(), runs, "the runtime was not run");
}

/// Requests the shim refuses itself, before any run of the runtime.
#[tokio::test]
async fn bad_requests_are_refused_with_their_codes_before_the_runtime_runs() {
    let mut h = Harness::new().await;
    assert_eq!(code_of(h.start().await), Code::NOT_FOUND);
    h.create().await.unwrap();
    assert_eq!(code_of(h.create().await), Code::ALREADY_EXISTS);
    // Delete of a running init, Start of a started one: wrong state.
    h.start().await.unwrap();
    assert_eq!(code_of(h.start().await), Code::FAILED_PRECONDITION);
    assert_eq!(code_of(h.delete().await), Code::FAILED_PRECONDITION);
    let bad = CreateTaskRequest {
        id: "../x".to_owned(),
        ..Default::default()
    };
    assert_eq!(
        code_of(h.service.do_create(bad).await),
        Code::INVALID_ARGUMENT
    );
    let bundle = h.path("bundle").display().to_string();
    assert_eq!(
        h.argv(),
        [
            format!("create --bundle {bundle} --pid-file {bundle}/init.pid {ID}"),
            format!("start {ID}"),
        ]
    );
}

/// A runtime that refuses agent-sandbox's own delete flags (runc, named by `BinaryName`)
/// is asked again with runc's plain command line.
#[tokio::test]
async fn a_runtime_without_exit_records_gets_a_plain_delete() {
    let mut h = Harness::new().await;
    let pid = h.create().await.unwrap();
    h.start().await.unwrap();
    h.kill(9).await.unwrap();
    assert_eq!(h.wait().await, 137);
    let bin = h.path("fake-runtime");
    let refusing = SCRIPT.replacen(
        "case $cmd in",
        "case \"$*\" in *--exit-pid*) printf '{\"level\":\"error\",\"msg\":\"flag provided but not defined: -exit-pid\"}\\n' >>\"$log\"; exit 1 ;; esac\ncase $cmd in",
        1,
    );
    write_script(&bin, &refusing);
    assert_eq!(h.delete().await.unwrap(), 137);
    let argv = h.argv();
    assert_eq!(
        argv[argv.len() - 2..],
        [
            format!("delete --exit-pid {pid} --exit-status 137 {ID}"),
            format!("delete {ID}"),
        ]
    );
}

/// An exec: added with containerd's process spec, which reaches the runtime as it came;
/// started with the exec id on the runtime's command line (once the binary, not named
/// `agent-sandbox`, accepted `--exec-id` when asked); its exit reaches Wait.
#[tokio::test]
async fn an_exec_runs_with_its_id_and_spec_and_its_exit_reaches_wait() {
    let mut h = Harness::new().await;
    h.create().await.unwrap();
    h.start().await.unwrap();
    let spec = br#"{"args":["sh","-c","true"],"cwd":"/"}"#;
    let add = containerd_shim::api::ExecProcessRequest {
        id: ID.to_owned(),
        exec_id: "e1".to_owned(),
        spec: Some(
            containerd_shim::protos::protobuf::well_known_types::any::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".to_owned(),
                value: spec.to_vec(),
                ..Default::default()
            },
        )
        .into(),
        ..Default::default()
    };
    h.service.do_exec(add.clone()).await.unwrap();
    assert_eq!(code_of(h.service.do_exec(add).await), Code::ALREADY_EXISTS);
    let exec = h.stand_in("exec.pid");
    let start = StartRequest {
        id: ID.to_owned(),
        exec_id: "e1".to_owned(),
        ..Default::default()
    };
    let pid = h.service.do_start(start).await.unwrap().pid;
    assert_eq!(pid, exec);
    assert_eq!(std::fs::read(h.path("exec-process.json")).unwrap(), spec);
    sigkill(exec);
    let wait = WaitRequest {
        id: ID.to_owned(),
        exec_id: "e1".to_owned(),
        ..Default::default()
    };
    let waited = tokio::time::timeout(Duration::from_secs(10), h.service.do_wait(wait));
    assert_eq!(waited.await.unwrap().unwrap().exit_status, 137);
    let bundle = h.path("bundle").display().to_string();
    let execs: Vec<String> = h
        .argv()
        .into_iter()
        .filter(|l| l.starts_with("exec "))
        .collect();
    assert_eq!(
        execs,
        [
            "exec --exec-id probe --help".to_owned(),
            format!(
                "exec --exec-id e1 --process {bundle}/exec-e1.json --detach --pid-file {bundle}/exec-e1.pid {ID}"
            ),
        ]
    );
    assert_eq!(
        h.events(5).await,
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exec-added",
            "/tasks/exec-started",
            "/tasks/exit"
        ]
    );
}

/// Pause, Resume, Pids and Update: runc's command lines, the state moves and events, the
/// resources passed through as containerd sent them, and a Resume of a running init
/// refused before the runtime runs.
#[tokio::test]
async fn pause_resume_pids_and_update_map_to_the_runtimes_commands() {
    use containerd_shim::api::{PidsRequest, UpdateTaskRequest};
    let mut h = Harness::new().await;
    let pid = h.create().await.unwrap();
    h.start().await.unwrap();
    h.service.pause_resume(ID, true).await.unwrap();
    assert_eq!(h.state().await.unwrap(), (Status::PAUSED, 0));
    h.service.pause_resume(ID, false).await.unwrap();
    assert_eq!(h.state().await.unwrap(), (Status::RUNNING, 0));
    let refused = h.service.pause_resume(ID, false).await;
    assert_eq!(code_of(refused), Code::FAILED_PRECONDITION);
    let pids = PidsRequest {
        id: ID.to_owned(),
        ..Default::default()
    };
    let listed = h.service.do_pids(pids).await.unwrap();
    let listed: Vec<u32> = listed.processes.iter().map(|p| p.pid).collect();
    assert_eq!(listed, [pid]);
    let resources = br#"{"memory":{"limit":268435456}}"#;
    let update = UpdateTaskRequest {
        id: ID.to_owned(),
        resources: Some(
            containerd_shim::protos::protobuf::well_known_types::any::Any {
                value: resources.to_vec(),
                ..Default::default()
            },
        )
        .into(),
        ..Default::default()
    };
    h.service.do_update(update).await.unwrap();
    assert_eq!(std::fs::read(h.path("resources.json")).unwrap(), resources);
    let bundle = h.path("bundle").display().to_string();
    assert_eq!(
        h.argv()[2..],
        [
            format!("pause {ID}"),
            format!("resume {ID}"),
            format!("ps --format json {ID}"),
            format!("update --resources {bundle}/update-resources.json {ID}"),
        ]
    );
    assert!(
        !h.path("bundle").join("update-resources.json").exists(),
        "the resources file lives only during the run"
    );
    assert_eq!(
        h.events(4).await,
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/paused",
            "/tasks/resumed"
        ]
    );
}

fn code_of<T: std::fmt::Debug>(r: Result<T, TaskError>) -> Code {
    code(r.unwrap_err()).0
}

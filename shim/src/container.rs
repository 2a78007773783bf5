//! What the task service knows of each container: its processes (the init and its execs, each
//! with its lifecycle, streams and exit watch), its runtime, cgroups and bundle, and the table
//! of all containers this shim serves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use log::warn;
use tokio::sync::{Mutex, RwLock, watch};
use tokio::task::JoinHandle;

use crate::cgroup::Cgroups;
use crate::checkpoint::RestorePlan;
use crate::error::TaskError;
use crate::exits::{EarlyExits, InitExitRecord};
use crate::process::{Exit, Lifecycle};
use crate::runtime::{Runtime, Stdio3};
use crate::stdio::{self, ConsoleSocket, Copies, StdioPaths};

type Result<T> = std::result::Result<T, TaskError>;

/// One container process: its lifecycle, its streams and the watch that Wait listens on.
pub struct Process {
    pub life: Lifecycle,
    exit_tx: watch::Sender<Option<Exit>>,
    pub stdio: StdioPaths,
    pub copies: Copies,
    /// Exec only: the OCI process spec (JSON) containerd sent.
    pub spec: Option<Vec<u8>>,
}

impl Process {
    /// A created process; `pid` is 0 for an exec until its start reports one.
    pub fn new(pid: u32, stdio: StdioPaths) -> Self {
        Self {
            life: Lifecycle::created(pid),
            exit_tx: watch::channel(None).0,
            stdio,
            copies: Copies::default(),
            spec: None,
        }
    }

    pub fn exit(&self) -> Option<Exit> {
        self.life.exit().cloned()
    }

    /// Records the exit and wakes every Wait.
    pub fn stop(&mut self, exit: Exit) {
        self.life.stop(exit.clone());
        self.exit_tx.send_replace(Some(exit));
    }

    /// A receiver that sees the exit once [`Process::stop`] recorded it.
    pub fn exit_watch(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_tx.subscribe()
    }
}

pub struct Container {
    pub bundle: PathBuf,
    pub runtime: Runtime,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    pub cgroups: Option<Cgroups>,
    pub oom_task: Option<JoinHandle<()>>,
    /// Set once TaskOOM went out (by the notification or the exit check, whichever is first).
    pub oom_published: Arc<AtomicBool>,
    /// The cgroup's `oom_kill` counter when the container was created.
    pub oom_kills_at_create: u64,
    pub rootfs_mounted: bool,
    /// Created from a checkpoint: the runtime's `restore` that the init's Start runs.
    pub restore: Option<RestorePlan>,
    /// Held while the runtime deletes, so that the late writer and Delete never both write.
    pub init_exit_record: Arc<Mutex<InitExitRecord>>,
    /// Exits being finished: each exec's finish holds it for reading, the init's takes it
    /// for writing, so the init's TaskExit follows those of the execs that exited first.
    pub exits_in_flight: Arc<RwLock<()>>,
}

impl Container {
    pub fn process(&self, id: &str, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs
            .get(exec_id)
            .ok_or_else(|| TaskError::ExecNotFound {
                id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            })
    }

    pub fn process_mut(&mut self, id: &str, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| TaskError::ExecNotFound {
                id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            })
    }
}

/// Every container this shim serves, and the exits no process has claimed yet.
#[derive(Default)]
pub struct Table {
    pub containers: HashMap<String, Container>,
    pub early_exits: EarlyExits,
}

impl Table {
    pub fn container(&self, id: &str) -> Result<&Container> {
        self.containers
            .get(id)
            .ok_or_else(|| TaskError::ContainerNotFound { id: id.to_owned() })
    }

    pub fn container_mut(&mut self, id: &str) -> Result<&mut Container> {
        self.containers
            .get_mut(id)
            .ok_or_else(|| TaskError::ContainerNotFound { id: id.to_owned() })
    }

    /// Every process's lifecycle, keyed `(container id, exec id)` ("" for the init), and the
    /// early-exit buffer, for [`crate::exits::route`].
    pub fn lifecycles_mut(
        &mut self,
    ) -> (
        impl Iterator<Item = ((&str, &str), &mut Lifecycle)>,
        &mut EarlyExits,
    ) {
        let procs = self.containers.iter_mut().flat_map(|(cid, c)| {
            std::iter::once(((cid.as_str(), ""), &mut c.init.life)).chain(
                c.execs
                    .iter_mut()
                    .map(move |(exec_id, p)| ((cid.as_str(), exec_id.as_str()), &mut p.life)),
            )
        });
        (procs, &mut self.early_exits)
    }
}

/// The `Info` of an exec process in `Pids` (`ctr task ps`): its exec id as runc-v2 reports
/// it, a `containerd.runc.v1.ProcessDetails`.
pub fn exec_info(exec_id: &str) -> Option<Any> {
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

/// Refuses a container or exec id that could not be a file name in the bundle.
pub fn check_id(field: &'static str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 1024
        && !value.starts_with('.')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(TaskError::InvalidId {
            field,
            value: value.to_owned(),
        })
    }
}

/// The pid the runtime wrote to `path`.
fn read_pid(path: &Path) -> Result<u32> {
    let text = std::fs::read_to_string(path).map_err(|source| TaskError::File {
        path: path.to_owned(),
        source,
    })?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| TaskError::PidFile {
            path: path.to_owned(),
        })
}

/// Opens the process's streams: the runtime's stdio, plus a console socket with a terminal.
/// `piped`: output through pipes the shim copies (the init, which a checkpoint dumps; see
/// [`stdio::piped`]), else straight into the fifos (execs).
fn open_streams(
    paths: &StdioPaths,
    piped: bool,
) -> Result<(Stdio3, Copies, Option<ConsoleSocket>)> {
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
        let (stdio, copies) = if piped {
            stdio::piped(paths)?
        } else {
            stdio::direct(paths)?
        };
        Ok((stdio, copies, None))
    }
}

/// Runs the runtime's `create` for the init (or, with `restore`, its `restore` from a
/// checkpoint) and returns its pid and the copies of its streams; with a terminal, the pty
/// master comes over the console socket.
pub async fn create_init(
    id: &str,
    bundle: &Path,
    runtime: &Runtime,
    paths: &StdioPaths,
    restore: Option<&RestorePlan>,
) -> Result<(u32, Copies)> {
    let (stdio, mut copies, socket) = open_streams(paths, true)?;
    let pid_file = bundle.join("init.pid");
    let socket_path = socket.as_ref().map(ConsoleSocket::path);
    let socket_path = socket_path.as_deref();
    match restore {
        None => {
            runtime
                .create(id, bundle, &pid_file, socket_path, stdio)
                .await?
        }
        Some(plan) => {
            runtime
                .restore(id, plan, bundle, &pid_file, socket_path, stdio)
                .await?;
        }
    }
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

/// Runs the runtime's `exec` with the process spec containerd sent and returns the pid and
/// the copies of its streams. The spec and pid files live in the bundle only meanwhile.
pub async fn run_exec(
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
        let (stdio, mut copies, socket) = open_streams(paths, false)?;
        let socket_path = socket.as_ref().map(ConsoleSocket::path);
        runtime
            .exec(
                id,
                exec_id,
                &process_file,
                &pid_file,
                socket_path.as_deref(),
                stdio,
            )
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn ids_are_checked() {
        assert!(check_id("exec id", "exec-1.a_b").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(check_id("exec id", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pid_files_are_checked_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("init.pid");
        std::fs::write(&file, "123\n").unwrap();
        assert_eq!(read_pid(&file).unwrap(), 123);
        for bad in ["0", "-1", "x", ""] {
            std::fs::write(&file, bad).unwrap();
            let e = read_pid(&file).unwrap_err();
            assert!(e.to_string().contains("init.pid"), "{bad}: {e}");
        }
        let gone = dir.path().join("gone.pid");
        assert!(
            read_pid(&gone)
                .unwrap_err()
                .to_string()
                .contains("gone.pid")
        );
    }

    #[test]
    fn a_stopped_process_wakes_its_waiters() {
        let mut p = Process::new(0, StdioPaths::default());
        let rx = p.exit_watch();
        assert!(rx.borrow().is_none());
        let exit = Exit {
            code: 3,
            at: Default::default(),
        };
        p.stop(exit.clone());
        assert_eq!(rx.borrow().as_ref(), Some(&exit));
        assert_eq!(p.exit(), Some(exit));
    }

    fn container(init_pid: u32, execs: &[(&str, u32)]) -> Container {
        let opts = crate::options::RuntimeOptions::defaults("default");
        let mut init = Process::new(init_pid, StdioPaths::default());
        init.life.begin_start().unwrap();
        init.life.start_succeeded(init_pid);
        let execs = execs
            .iter()
            .map(|(id, pid)| {
                let mut p = Process::new(0, StdioPaths::default());
                p.life.begin_start().unwrap();
                p.life.start_succeeded(*pid);
                ((*id).to_owned(), p)
            })
            .collect();
        Container {
            bundle: PathBuf::from("/b"),
            runtime: Runtime::new(&opts, Path::new("/b")),
            init,
            execs,
            cgroups: None,
            oom_task: None,
            oom_published: Arc::default(),
            oom_kills_at_create: 0,
            rootfs_mounted: false,
            restore: None,
            init_exit_record: Arc::default(),
            exits_in_flight: Arc::default(),
        }
    }

    #[test]
    fn a_reaped_pid_finds_its_container_and_exec() {
        use crate::exits::{Route, route};
        let mut table = Table::default();
        table
            .containers
            .insert("a".into(), container(10, &[("x", 11)]));
        table
            .containers
            .insert("b".into(), container(20, &[("y", 21)]));
        let exit = Exit {
            code: 0,
            at: Default::default(),
        };
        for (pid, want) in [(21, ("b", "y")), (10, ("a", "")), (11, ("a", "x"))] {
            let (procs, early) = table.lifecycles_mut();
            assert_eq!(
                route(pid, exit.clone(), procs, early),
                Route::Finish(want, exit.clone())
            );
        }
        let (procs, early) = table.lifecycles_mut();
        assert_eq!(route(99, exit, procs, early), Route::Ignored);
    }
}

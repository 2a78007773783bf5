//! A small client for a runc-compatible runtime CLI (`agent-sandbox`, or `runc` itself).
//!
//! The shim is a subreaper whose SIGCHLD handler (in containerd-shim) reaps every child and
//! broadcasts the exit codes. A runtime command is therefore never `wait`ed on directly: the
//! caller subscribes to the exit broadcast before spawning and picks its own pid out of it, so
//! neither side steals the other's exit status.
//!
//! The `runc` crate from rust-extensions pins its own process plumbing and oci-spec version;
//! the handful of subcommands the shim needs are simpler to drive here.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use containerd_shim::monitor::{Subject, Topic, monitor_subscribe, monitor_unsubscribe};
use serde::Deserialize;

use crate::checkpoint::{CheckpointPlan, RestorePlan};
use crate::exit_recorder::{ExitRecorder, RecorderError};
use crate::options::{POLICY_ENV, PROFILES_DIR_ENV, RuntimeOptions};

/// Errors from running the runtime binary.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot run {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot capture the output of {binary} {command}")]
    Capture {
        binary: PathBuf,
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{binary} {command} failed (exit {code}): {message}")]
    Failed {
        binary: PathBuf,
        command: &'static str,
        code: i32,
        message: String,
    },
    #[error("unexpected output from {binary} {command}")]
    Output {
        binary: PathBuf,
        command: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot subscribe to child exits")]
    Monitor(#[source] containerd_shim::Error),
    #[error("child exit monitor closed before {binary} {command} exited")]
    MonitorClosed {
        binary: PathBuf,
        command: &'static str,
    },
}

impl RuntimeError {
    /// True if the runtime said the container does not exist (runc's wording: `container
    /// "ID" does not exist`). Only this means the container is missing; other failures that
    /// mention "not found" (an exec of a program not in `$PATH`) are the process's own.
    pub fn is_missing_container(&self) -> bool {
        matches!(self, Self::Failed { message, .. } if message.contains("does not exist"))
    }

    /// True if the runtime refused `flag` as unknown: runc's (Go) and clap's wordings.
    pub fn is_unknown_flag(&self, flag: &str) -> bool {
        matches!(self, Self::Failed { message, .. } if message.contains(flag)
            && (message.contains("flag provided but not defined")
                || message.contains("unexpected argument")))
    }

    /// True if a `kill` failed because the process is gone: the runtime found the container
    /// stopped (runc and this runtime say "container not running") or the signal found no
    /// process. containerd's own runc shim answers these with NotFound, the one kill error
    /// containerd and the CRI plugin treat as "already stopped".
    pub fn is_process_gone(&self) -> bool {
        matches!(self, Self::Failed { message, .. } if {
            let lower = message.to_ascii_lowercase();
            lower.contains("container not running")
                || lower.contains("process already finished")
                || lower.contains("no such process")
        })
    }
}

/// Not yet known whether the binary takes agent-sandbox's own flags.
const FLAGS_UNKNOWN: u8 = 0;
/// The binary takes them.
const FLAGS_AGENT: u8 = 1;
/// The binary refuses them (runc): it gets runc's command lines.
const FLAGS_RUNC: u8 = 2;

/// The standard streams given to a runtime command that starts a container process.
pub struct Stdio3 {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// One runtime binary with its root, log file and policy.
#[derive(Debug, Clone)]
pub struct Runtime {
    binary: PathBuf,
    root: PathBuf,
    policy: Option<PathBuf>,
    profiles_dir: Option<PathBuf>,
    systemd_cgroup: bool,
    log: PathBuf,
    /// Whether the binary takes agent-sandbox's own flags (`exec --exec-id`, `delete
    /// --exit-pid`): [`FLAGS_UNKNOWN`], [`FLAGS_AGENT`], or [`FLAGS_RUNC`] for runc or alike
    /// (`BinaryName`), which gets runc's command lines. Shared by the clones of one client.
    agent_flags: Arc<AtomicU8>,
    /// The container's writer of exec `exit` records, shared by every clone.
    exit_recorder: Arc<ExitRecorder>,
}

impl Runtime {
    /// A client whose JSON log goes to `bundle/log.json` (as containerd-shim-runc-v2 does).
    pub fn new(opts: &RuntimeOptions, bundle: &Path) -> Self {
        Self {
            binary: opts.runtime.clone(),
            root: opts.root.clone(),
            policy: opts.policy.clone(),
            profiles_dir: opts.profiles_dir.clone(),
            systemd_cgroup: opts.systemd_cgroup,
            log: bundle.join("log.json"),
            agent_flags: Arc::new(AtomicU8::new(FLAGS_UNKNOWN)),
            exit_recorder: Arc::default(),
        }
    }

    /// `create --bundle B --pid-file P [--console-socket S] ID` with the process's streams.
    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: Stdio3,
    ) -> Result<(), RuntimeError> {
        let mut args: Vec<&OsStr> = vec![
            "create".as_ref(),
            "--bundle".as_ref(),
            bundle.as_os_str(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
        ];
        if let Some(socket) = console_socket {
            args.extend([OsStr::new("--console-socket"), socket.as_os_str()]);
        }
        args.push(id.as_ref());
        self.run("create", &args, Some(stdio), false)
            .await
            .map(drop)
    }

    /// `exec --exec-id E --process F --detach --pid-file P [--console-socket S] ID`: the
    /// exec id goes on the `exec` record (and names the tool call of a ctr exec). A binary
    /// that refuses `--exec-id` (runc, see [`Runtime::takes_agent_flags`]) gets runc's line.
    pub async fn exec(
        &self,
        id: &str,
        exec_id: &str,
        process: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: Stdio3,
    ) -> Result<(), RuntimeError> {
        let mut args: Vec<&OsStr> = vec!["exec".as_ref()];
        if self.takes_agent_flags().await {
            args.extend([OsStr::new("--exec-id"), exec_id.as_ref()]);
        }
        args.extend::<[&OsStr; 5]>([
            "--process".as_ref(),
            process.as_os_str(),
            "--detach".as_ref(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
        ]);
        if let Some(socket) = console_socket {
            args.extend([OsStr::new("--console-socket"), socket.as_os_str()]);
        }
        args.push(id.as_ref());
        self.run("exec", &args, Some(stdio), false).await.map(drop)
    }

    /// Whether the binary takes agent-sandbox's own flags. A binary named `agent-sandbox`
    /// does; another (`BinaryName`) is asked once, with `exec --exec-id probe --help`, which
    /// runc refuses, so that an exec's output never carries runc's usage text.
    async fn takes_agent_flags(&self) -> bool {
        match self.agent_flags.load(Ordering::Relaxed) {
            FLAGS_AGENT => return true,
            FLAGS_RUNC => return false,
            _ => {}
        }
        let takes = self
            .binary
            .file_name()
            .is_some_and(|n| n == "agent-sandbox")
            || self
                .simple("exec", &["exec", "--exec-id", "probe", "--help"])
                .await
                .is_ok();
        if takes {
            self.agent_flags.store(FLAGS_AGENT, Ordering::Relaxed);
        } else {
            self.refuses_agent_flags();
        }
        takes
    }

    /// The binary refused an agent-sandbox flag: runc's command lines from now on.
    fn refuses_agent_flags(&self) {
        if self.agent_flags.swap(FLAGS_RUNC, Ordering::Relaxed) != FLAGS_RUNC {
            log::warn!(
                "{} takes no agent-sandbox flags (--exec-id, --exit-pid): \
                 running it as runc, without exec ids and exit records",
                self.binary.display()
            );
        }
    }

    /// True once the binary is known to refuse agent-sandbox's flags.
    fn is_runc_only(&self) -> bool {
        self.agent_flags.load(Ordering::Relaxed) == FLAGS_RUNC
    }

    /// `checkpoint --image-path I --work-path W [flags] ID` (see [`CheckpointPlan::args`]).
    pub async fn checkpoint(
        &self,
        id: &str,
        plan: &CheckpointPlan,
        work_path: &Path,
    ) -> Result<(), RuntimeError> {
        let args = plan.args(id, work_path);
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        self.run("checkpoint", &args, None, false).await.map(drop)
    }

    /// `restore ... --bundle B --detach --pid-file P [--console-socket S] ID` with the
    /// restored init's streams (see [`RestorePlan::args`]).
    pub async fn restore(
        &self,
        id: &str,
        plan: &RestorePlan,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: Stdio3,
    ) -> Result<(), RuntimeError> {
        let args = plan.args(id, bundle, pid_file, console_socket);
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        self.run("restore", &args, Some(stdio), false)
            .await
            .map(drop)
    }

    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.simple("start", &["start", id]).await
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        let signal = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, signal.as_str()]);
        self.simple("kill", &args).await
    }

    /// `delete [--force] [--exit-pid PID --exit-status CODE] ID`: with `reaped` (the init's
    /// pid and status as this shim reaped it), the runtime writes the init's `exit` record
    /// before deleting, in the same run (no separate `audit-exit`). A runtime without the
    /// audit trail (runc, named by `BinaryName`) refuses those flags: it is asked again
    /// without them, as a plain runc delete.
    pub async fn delete(
        &self,
        id: &str,
        force: bool,
        reaped: Option<(u32, u32)>,
    ) -> Result<(), RuntimeError> {
        let (pid, code) = reaped.map_or((String::new(), String::new()), |(p, c)| {
            (p.to_string(), c.to_string())
        });
        let mut args = vec!["delete"];
        if force {
            args.push("--force");
        }
        let plain = args.iter().copied().chain([id]).collect::<Vec<_>>();
        let record = reaped.is_some() && !self.is_runc_only();
        if record {
            args.extend(["--exit-pid", &pid, "--exit-status", &code]);
        }
        args.push(id);
        match self.simple("delete", &args).await {
            Err(e) if record && e.is_unknown_flag("exit-pid") => {
                self.refuses_agent_flags();
                self.simple("delete", &plain).await
            }
            other => other,
        }
    }

    pub async fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.simple("pause", &["pause", id]).await
    }

    pub async fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.simple("resume", &["resume", id]).await
    }

    pub async fn update(&self, id: &str, resources: &Path) -> Result<(), RuntimeError> {
        let args: [&OsStr; 4] = [
            "update".as_ref(),
            "--resources".as_ref(),
            resources.as_os_str(),
            id.as_ref(),
        ];
        self.run("update", &args, None, false).await.map(drop)
    }

    /// Starts the container's exit recorder, on a task of its own, unless it runs: called as
    /// an exec starts, so that the recorder is up by the time that exec exits.
    pub fn warm_exit_recorder(&self, id: &str) {
        if self.is_runc_only() {
            return;
        }
        let (runtime, id) = (self.clone(), id.to_owned());
        tokio::spawn(async move { runtime.exit_recorder.warm(&runtime, &id).await });
    }

    /// Ends the container's exit recorder and waits until it is gone.
    pub async fn close_exit_recorder(&self) {
        self.exit_recorder.close().await;
    }

    /// Audit trail: the runtime's `exit` record of a process this shim reaped (`code` as the
    /// reaper folds it: 128 + N for signal N). An exec's goes to the container's exit
    /// recorder; the init's, or an exec's the recorder did not answer for, to `audit-exit
    /// --process init|EXEC_ID --pid PID --status CODE ID`. A failure is logged, never
    /// returned: the exit must still reach containerd.
    pub async fn audit_exit(&self, id: &str, exec_id: &str, pid: u32, code: u32) {
        if self.is_runc_only() {
            return;
        }
        if !exec_id.is_empty() {
            match self
                .exit_recorder
                .record(self, id, exec_id, pid, code)
                .await
            {
                Ok(()) => return,
                // Said once, when it gave up.
                Err(RecorderError::GivenUp) => {}
                Err(e) if e.unanswered() => {
                    log::warn!("exit record of {id}/{exec_id} pid {pid}: {e}; running audit-exit");
                }
                Err(e) => {
                    log::error!("audit exit record of {id}/{exec_id} pid {pid}: {e}");
                    return;
                }
            }
        }
        let (pid, code) = (pid.to_string(), code.to_string());
        let process = if exec_id.is_empty() { "init" } else { exec_id };
        let args = [
            "audit-exit",
            "--process",
            process,
            "--pid",
            &pid,
            "--status",
            &code,
            id,
        ];
        if let Err(e) = self.simple("audit-exit", &args).await {
            log::error!("audit exit record of {id}/{process} pid {pid}: {e}");
        }
    }

    /// `ps --format json ID`: the pids of every process in the container.
    pub async fn ps(&self, id: &str) -> Result<Vec<u32>, RuntimeError> {
        let args: [&OsStr; 4] = [
            "ps".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
            id.as_ref(),
        ];
        let out = self.run("ps", &args, None, true).await?;
        let pids: Option<Vec<u32>> =
            serde_json::from_slice(&out).map_err(|source| self.output_error("ps", source))?;
        Ok(pids.unwrap_or_default())
    }

    fn output_error(&self, command: &'static str, source: serde_json::Error) -> RuntimeError {
        RuntimeError::Output {
            binary: self.binary.clone(),
            command,
            source,
        }
    }

    async fn simple(&self, command: &'static str, args: &[&str]) -> Result<(), RuntimeError> {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        self.run(command, &args, None, false).await.map(drop)
    }

    /// The runtime with its global flags, its policy's environment and `args`.
    fn command(&self, args: &[&OsStr]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&self.log)
            .arg("--log-format")
            .arg("json");
        if self.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        cmd.args(args);
        match &self.policy {
            Some(policy) => cmd.env(POLICY_ENV, policy),
            None => cmd.env_remove(POLICY_ENV),
        };
        match &self.profiles_dir {
            Some(dir) => cmd.env(PROFILES_DIR_ENV, dir),
            None => cmd.env_remove(PROFILES_DIR_ENV),
        };
        cmd
    }

    /// Starts `exit-recorder ID` (the runtime's writer of exec `exit` records) on one end
    /// of a socket pair, as its stdin and stdout; returns the other end. The child is not
    /// waited for: the shim's reaper collects it when it ends (at the end of its input or
    /// after its idle time).
    pub fn spawn_exit_recorder(
        &self,
        id: &str,
    ) -> Result<std::os::unix::net::UnixStream, RuntimeError> {
        let spawn_err = |source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        };
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(spawn_err)?;
        let input = theirs.try_clone().map_err(spawn_err)?;
        let mut cmd = self.command(&["exit-recorder".as_ref(), id.as_ref()]);
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(input)))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stderr(Stdio::null())
            .current_dir("/");
        let child = cmd.spawn().map_err(spawn_err)?;
        // Its end of the pair must not stay open here, or it would never see the end of
        // its input; dropping a std Child neither waits nor kills.
        drop((cmd, child));
        Ok(ours)
    }

    /// Runs one command to completion; returns its stdout when `capture` is set. Output goes
    /// to anonymous temporary files rather than pipes: nothing to drain while waiting.
    async fn run(
        &self,
        command: &'static str,
        args: &[&OsStr],
        stdio: Option<Stdio3>,
        capture: bool,
    ) -> Result<Vec<u8>, RuntimeError> {
        let log_offset = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.command(args);
        let (out_file, err_file) =
            wire_stdio(&mut cmd, stdio, capture).map_err(|source| RuntimeError::Capture {
                binary: self.binary.clone(),
                command,
                source,
            })?;
        let code = self.spawn_and_wait(cmd, command).await?;
        if code != 0 {
            let stderr = err_file.map(read_all).unwrap_or_default();
            let message = log_error(&self.log, log_offset)
                .or_else(|| {
                    let text = String::from_utf8_lossy(&stderr).trim().to_owned();
                    (!text.is_empty()).then_some(text)
                })
                .unwrap_or_else(|| "no error message".to_owned());
            return Err(RuntimeError::Failed {
                binary: self.binary.clone(),
                command,
                code,
                message,
            });
        }
        Ok(out_file.map(read_all).unwrap_or_default())
    }

    /// Spawns `cmd` and waits for the reaper to see it exit; its exit code.
    async fn spawn_and_wait(
        &self,
        cmd: Command,
        command: &'static str,
    ) -> Result<i32, RuntimeError> {
        let mut cmd = cmd;
        let mut exits = monitor_subscribe(Topic::Pid)
            .await
            .map_err(RuntimeError::Monitor)?;
        let spawned = cmd.spawn();
        // The streams handed to the child must not stay open here (a reader would never see
        // EOF), so the command goes before the wait.
        drop(cmd);
        let child = match spawned {
            Ok(child) => child,
            Err(source) => {
                let _ = monitor_unsubscribe(exits.id).await;
                return Err(RuntimeError::Spawn {
                    binary: self.binary.clone(),
                    source,
                });
            }
        };
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        // Dropping a std Child neither waits nor kills; the reaper collects it.
        drop(child);
        let code = loop {
            match exits.rx.recv().await {
                Some(ev) => {
                    if matches!(ev.subject, Subject::Pid(p) if p == pid) {
                        break Some(ev.exit_code);
                    }
                }
                None => break None,
            }
        };
        let _ = monitor_unsubscribe(exits.id).await;
        code.ok_or_else(|| RuntimeError::MonitorClosed {
            binary: self.binary.clone(),
            command,
        })
    }
}

/// Gives `cmd` the caller's stdio; without one, no stdin, and stdout (when `capture`) and
/// stderr to anonymous temporary files, returned to be read after the exit.
fn wire_stdio(
    cmd: &mut Command,
    stdio: Option<Stdio3>,
    capture: bool,
) -> std::io::Result<(Option<File>, Option<File>)> {
    let Some(stdio) = stdio else {
        cmd.stdin(Stdio::null());
        let out_file = if capture {
            let f = tempfile::tempfile()?;
            cmd.stdout(f.try_clone()?);
            Some(f)
        } else {
            cmd.stdout(Stdio::null());
            None
        };
        let f = tempfile::tempfile()?;
        cmd.stderr(f.try_clone()?);
        return Ok((out_file, Some(f)));
    };
    cmd.stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr);
    Ok((None, None))
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(0)).is_ok() {
        let _ = f.read_to_end(&mut buf);
    }
    buf
}

/// The last error message the runtime wrote to its JSON log after `offset`
/// (logrus-style lines: `{"level":"error","msg":"..."}`).
fn log_error(log: &Path, offset: u64) -> Option<String> {
    #[derive(Deserialize)]
    struct Line {
        #[serde(default)]
        level: String,
        #[serde(default)]
        msg: String,
    }
    let mut f = File::open(log).ok()?;
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Line>(l).ok())
        .filter(|l| matches!(l.level.as_str(), "error" | "fatal" | "panic"))
        .map(|l| l.msg)
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_after_offset_wins() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.json");
        std::fs::write(&log, "{\"level\":\"error\",\"msg\":\"old\"}\n").unwrap();
        let offset = std::fs::metadata(&log).unwrap().len();
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str("{\"level\":\"info\",\"msg\":\"x\"}\n{\"level\":\"error\",\"msg\":\"container \\\"a\\\" does not exist\"}\nnot json\n");
        std::fs::write(&log, text).unwrap();
        assert_eq!(
            log_error(&log, offset).as_deref(),
            Some("container \"a\" does not exist")
        );
        assert_eq!(log_error(&log, 10_000), None);
    }

    #[test]
    fn a_missing_container_is_recognised_and_a_missing_program_is_not() {
        let failed = |message: &str| RuntimeError::Failed {
            binary: "/x".into(),
            command: "exec",
            code: 1,
            message: message.into(),
        };
        assert!(failed("container \"a\" does not exist").is_missing_container());
        assert!(failed("container a does not exist").is_missing_container());
        assert!(
            !failed("exec: \"nonexistent-binary\": executable file not found in $PATH")
                .is_missing_container()
        );
    }

    #[test]
    fn a_kill_of_a_finished_process_is_recognised() {
        let failed = |message: &str| RuntimeError::Failed {
            binary: "/x".into(),
            command: "kill",
            code: 1,
            message: message.into(),
        };
        for gone in [
            "container not running",
            "kill failed: ESRCH: No such process",
            "os: process already finished",
        ] {
            assert!(failed(gone).is_process_gone(), "{gone}");
        }
        assert!(!failed("invalid signal \"FOO\"").is_process_gone());
        assert!(!failed("load state failed").is_process_gone());
    }

    #[test]
    fn a_flag_the_runtime_lacks_is_recognised() {
        let failed = |message: &str| RuntimeError::Failed {
            binary: "/x".into(),
            command: "delete",
            code: 1,
            message: message.into(),
        };
        // runc 1.1's and clap's wordings.
        assert!(failed("flag provided but not defined: -exit-pid").is_unknown_flag("exit-pid"));
        assert!(
            failed("error: unexpected argument '--exit-pid' found").is_unknown_flag("exit-pid")
        );
        assert!(!failed("flag provided but not defined: -x").is_unknown_flag("exit-pid"));
        assert!(!failed("container \"a\" does not exist").is_unknown_flag("exit-pid"));
    }
}

//! The `exit` record of a detached exec whose caller reaps it (podman's conmon, Docker's and
//! containerd's runc shim): the runtime exits right after starting the process, and the
//! caller, not the runtime, gets its status from `wait`.
//!
//! While the exec'd process is still the runtime's child (libcontainer clones it as the
//! runtime's own child, and nothing else can reap it before the runtime exits), the runtime
//! opens a pidfd for it and hands it to a detached watcher (`agent-sandbox exec-exit`, hidden),
//! which waits for the process to end and be reaped, reads its wait status from the kernel
//! (`agent_sandbox_sys::pidfd_exit`, Linux 6.15+) and appends the `exit` record under the
//! exec's id. On an older kernel no watcher starts and no record is written
//! (docs/audit.md). Our own shim reports every exit itself, so no watcher starts under it;
//! if both reported, [`crate::sidecars::trail::exited`] keeps the first.
//!
//! The shim's reports of exec exits go to its exit recorder ([`serve`], `agent-sandbox
//! exit-recorder`, hidden): one process per container that writes each exec's `exit` record
//! as the shim reports it, where an `audit-exit` run per exec cost a runtime start (about
//! 4 ms here) on the path of every TaskExit.

use std::io::{BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use agent_sandbox_audit::ExitStatus;

use crate::state::ContainerId;
use crate::state::StateDirs;

/// The hidden subcommand of the watcher.
pub const SUBCOMMAND: &str = "exec-exit";

/// How long the watcher waits, once the process ended, for its caller to reap it.
const REAP_LIMIT: Duration = Duration::from_secs(60);

/// The exec's id, from the name of the pid file its caller asked for: podman writes
/// `SESSION/exec_pid`, the runc shim `ID.pid`, ours `exec-ID.pid`. `exec` if none fits.
pub fn exec_id(pid_file: Option<&Path>) -> String {
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    let found = pid_file.and_then(|p| match name(p)?.as_str() {
        "exec_pid" => name(p.parent()?),
        file => {
            let stem = file.strip_suffix(".pid")?;
            Some(stem.strip_prefix("exec-").unwrap_or(stem).to_owned())
        }
    });
    found
        .filter(|id| valid_exec_id(id))
        .unwrap_or_else(|| "exec".to_owned())
}

/// Whether `id` may name an exec in records: 1 to 128 characters of `A-Z a-z 0-9 . _ -`
/// (containerd's exec ids are a subset; podman's are hex).
pub fn valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Whether the runtime's caller is our shim (it reports each exit itself).
fn called_by_our_shim() -> bool {
    std::fs::read_link(format!("/proc/{}/exe", std::os::unix::process::parent_id()))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()))
        .is_some_and(|n| n == "containerd-shim-agent-sandbox")
}

/// After a detached exec of `pid` (still this runtime's child): starts the watcher that
/// records its exit as `exec_id`. Failing to start it costs the record, never the exec.
pub fn watch(dirs: &StateDirs, id: &ContainerId, pid: i32, exec_id: &str) {
    use std::os::unix::process::CommandExt;
    if called_by_our_shim() {
        return;
    }
    let pidfd = match agent_sandbox_sys::pidfd_exit::open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(id = %id, pid, error = %e, "no pidfd for the exec: its exit goes unrecorded");
            return;
        }
    };
    if !agent_sandbox_sys::pidfd_exit::supported(pidfd.as_fd()) {
        tracing::debug!(id = %id, pid, "the kernel keeps no exit status for pidfds (Linux < 6.15): the exec's exit goes unrecorded");
        return;
    }
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg("--root")
        .arg(&dirs.root)
        .arg(SUBCOMMAND)
        .arg("--exec-id")
        .arg(exec_id)
        .arg(format!("--pid={pid}"))
        .arg(id.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    agent_sandbox_sys::inherit::pass_fds(&mut cmd, vec![pidfd]);
    if let Err(e) = cmd.spawn() {
        tracing::warn!(id = %id, pid, error = %e, "cannot start the exec's exit watcher");
    }
}

/// One exit as the shim reports it to its recorder (a line of JSON).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExitLine {
    /// `init` or the exec's id.
    process: String,
    pid: Option<i32>,
    /// The status as the reaper folds it (128 + N for signal N).
    status: i32,
}

/// The shim's exit recorder: reads one exit per line from `input` (`{"process":"e1",
/// "pid":7,"status":0}`) and answers on `output` once its `exit` record is in the log
/// (`{"ok":true}`, or `{"error":"..."}`). Each record goes through
/// [`crate::sidecars::trail::exited`], as `audit-exit`'s does: the claim of the exec's exit,
/// the fence after the supervisor's Landlock records, the log's chain lock. Returns at the
/// end of the input, or once no exit came for `idle`; an exit sent as it ends gets no answer
/// and the shim records it with `audit-exit` instead.
pub fn serve(
    dirs: &StateDirs,
    id: &ContainerId,
    input: OwnedFd,
    output: OwnedFd,
    idle: Duration,
) -> std::io::Result<()> {
    let input = std::fs::File::from(input);
    let mut output = std::fs::File::from(output);
    let mut reader = std::io::BufReader::new(&input);
    let mut line = String::new();
    loop {
        // An input that cannot be polled is read as it is (a read ends at its end).
        if reader.buffer().is_empty()
            && !crate::sidecars::readable_within(input.as_fd(), idle).unwrap_or(true)
        {
            return Ok(());
        }
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let answer = match record_line(dirs, id, &line) {
            Ok(()) => serde_json::json!({ "ok": true }),
            Err(error) => serde_json::json!({ "error": error }),
        };
        output.write_all(format!("{answer}\n").as_bytes())?;
    }
}

/// Writes the `exit` record one line asks for; the error's whole chain as text.
fn record_line(dirs: &StateDirs, id: &ContainerId, line: &str) -> Result<(), String> {
    let exit: ExitLine =
        serde_json::from_str(line).map_err(|e| format!("unreadable exit report: {e}"))?;
    let report = crate::sidecars::trail::ExitReport {
        process: exit.process,
        pid: exit.pid,
        status: ExitStatus::from_folded(exit.status),
        reaped_by: None,
    };
    crate::sidecars::trail::exited(dirs, id, &report).map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    })
}

/// A wait status as the audit records it.
fn status_of(wait: i32) -> ExitStatus {
    if libc::WIFEXITED(wait) {
        ExitStatus::Code(libc::WEXITSTATUS(wait))
    } else if libc::WIFSIGNALED(wait) {
        ExitStatus::Signal(libc::WTERMSIG(wait))
    } else {
        ExitStatus::Unknown
    }
}

/// The watcher (descriptor 3: the exec's pidfd): waits for the exec's end and appends its
/// `exit` record.
pub fn run(
    dirs: &StateDirs,
    id: &ContainerId,
    exec_id: &str,
    pid: i32,
) -> Result<(), agent_sandbox_audit::AuditError> {
    let pidfd = agent_sandbox_sys::inherit::take_fd(agent_sandbox_sys::inherit::FIRST_FD);
    // Whatever else the caller left open (its pipes) must not wait for this process.
    agent_sandbox_sys::reaper::close_from(4);
    let Ok(pidfd) = pidfd else {
        tracing::warn!(id = %id, pid, "the exit watcher got no pidfd");
        return Ok(());
    };
    let Some(wait) = agent_sandbox_sys::pidfd_exit::exit_status(pidfd.as_fd(), REAP_LIMIT) else {
        tracing::warn!(id = %id, pid, "the exec ended but its status never became known");
        return Ok(());
    };
    crate::sidecars::trail::exited(
        dirs,
        id,
        &crate::sidecars::trail::ExitReport {
            process: exec_id.to_owned(),
            pid: Some(pid),
            status: status_of(wait),
            reaped_by: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_id_comes_from_the_callers_pid_file() {
        let id = |p: &str| exec_id(Some(Path::new(p)));
        let session = "4f2c0e0a9b6d1c3e5f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e";
        assert_eq!(
            id(&format!(
                "/var/lib/containers/storage/overlay-containers/C/userdata/{session}/exec_pid"
            )),
            session
        );
        assert_eq!(
            id("/run/containerd/io.containerd.runtime.v2.task/moby/C/e1.pid"),
            "e1"
        );
        assert_eq!(
            id("/run/containerd/x/default/C/exec-probe-3.pid"),
            "probe-3"
        );
        assert_eq!(id("/tmp/pid"), "exec");
        assert_eq!(id("/tmp/bad\nname.pid"), "exec");
        assert_eq!(exec_id(None), "exec");
    }

    /// The recorder answers each line once its record is in the log, a second report of
    /// the same exec writes nothing, a line it cannot read is an error naming it, and it
    /// ends at the end of its input.
    #[test]
    fn the_recorder_writes_each_reported_exit_once_and_answers_each_line() {
        use std::io::{BufRead, BufReader, Write};
        use std::os::unix::net::UnixStream;
        let root = tempfile::tempdir().unwrap();
        let dirs = StateDirs::new(root.path().to_owned());
        let id = ContainerId::try_from("rec1").unwrap();
        std::fs::create_dir_all(dirs.sandbox(&id).path()).unwrap();
        let log = crate::sidecars::trail::init(&dirs, &id, None).unwrap();
        let (shim, recorder) = UnixStream::pair().unwrap();
        let (input, output) = (recorder.try_clone().unwrap(), recorder);
        let server = std::thread::spawn({
            let (dirs, id) = (dirs.clone(), id.clone());
            move || {
                serve(
                    &dirs,
                    &id,
                    input.into(),
                    output.into(),
                    Duration::from_secs(30),
                )
            }
        });
        let mut answers = BufReader::new(shim.try_clone().unwrap());
        let mut ask = |line: &str| {
            (&shim).write_all(line.as_bytes()).unwrap();
            let mut answer = String::new();
            answers.read_line(&mut answer).unwrap();
            answer
        };
        let first = r#"{"process":"e1","pid":41,"status":137}"#;
        assert_eq!(ask(&format!("{first}\n")), "{\"ok\":true}\n");
        assert_eq!(ask(&format!("{first}\n")), "{\"ok\":true}\n");
        let bad = ask("{\"process\":\"e2\"}\n");
        assert!(bad.contains("unreadable exit report"), "{bad}");
        shim.shutdown(std::net::Shutdown::Write).unwrap();
        server.join().unwrap().unwrap();
        let exits: Vec<_> = agent_sandbox_audit::read_records(&log)
            .unwrap()
            .into_iter()
            .map(|r| r.event)
            .collect();
        assert!(
            matches!(
                exits.as_slice(),
                [agent_sandbox_audit::Event::Exit {
                    status: ExitStatus::Signal(9),
                    process: Some(p),
                    pid: Some(41),
                    ..
                }] if p == "e1"
            ),
            "{exits:?}"
        );
    }

    #[test]
    fn the_recorder_ends_when_no_exit_comes_for_its_idle_time() {
        let root = tempfile::tempdir().unwrap();
        let dirs = StateDirs::new(root.path().to_owned());
        let id = ContainerId::try_from("rec2").unwrap();
        let (_shim, recorder) = std::os::unix::net::UnixStream::pair().unwrap();
        let input = recorder.try_clone().unwrap();
        let started = std::time::Instant::now();
        serve(
            &dirs,
            &id,
            input.into(),
            recorder.into(),
            Duration::from_millis(50),
        )
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn wait_statuses_become_codes_and_signals() {
        assert_eq!(status_of(7 << 8), ExitStatus::Code(7));
        assert_eq!(status_of(libc::SIGKILL), ExitStatus::Signal(9));
        assert_eq!(status_of(0), ExitStatus::Code(0));
    }
}

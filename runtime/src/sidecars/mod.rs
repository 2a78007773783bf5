//! Host-side processes the runtime starts beside a sandbox: the egress proxy (`egress`, its
//! live allowlist changes in `allow`, its CA in the sandbox's trust store in `tls_trust`), the
//! seccomp supervisor (`syscall_audit`, with Landlock's denials from kernel audit in
//! `fs_audit`) and the watcher of a detached exec's exit (`exec_exit`).
//!
//! This module is what the long-lived ones share (the proxy, the supervisor), killed at
//! delete: one way to start them, wait for their ready line, record their pid, and later kill
//! them only if the pid still names that process.

pub mod allow;
pub mod egress;
pub mod exec_exit;
pub mod fs_audit;
pub mod podman_oom;
pub mod syscall_audit;
pub mod tls_trust;
pub mod tool_calls;
pub mod trail;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The line a sidecar prints on stdout once it serves.
pub const READY: &str = "ready";

/// Why a sidecar did not start; each caller maps it onto its own error.
#[derive(Debug)]
pub enum SpawnError {
    Spawn(std::io::Error),
    /// The pid file could not be written (the sidecar was killed).
    File(crate::files::FileError),
    NotReady {
        reason: String,
    },
}

/// A sidecar started by [`start`] whose ready line has not been read yet. Dropping it closes
/// the sidecar's stdin: one still waiting for its input line then exits.
pub struct Pending {
    child: std::process::Child,
}

/// Runs `/proc/self/exe ARGS...` in its own process group (`/proc/self/exe`, not
/// `current_exe()`: create runs from a sealed memfd copy whose name is not a path on disk),
/// writes its pid to `pid_file`, with its stdin a pipe, without waiting: it can load what
/// it needs while the caller works, and [`Pending::ready`] hands it the line it waits for
/// and reads its [`READY`] line. The sidecar gets `fds` as its descriptors 3, 4, ...
/// (`agent_sandbox_sys::inherit`).
pub fn start(
    args: &[&std::ffi::OsStr],
    pid_file: &Path,
    fds: Vec<std::os::fd::OwnedFd>,
) -> Result<Pending, SpawnError> {
    start_program(Path::new("/proc/self/exe"), args, pid_file, fds)
}

/// [`start`] of `program` (a unit test's stand-in for this executable).
fn start_program(
    program: &Path,
    args: &[&std::ffi::OsStr],
    pid_file: &Path,
    fds: Vec<std::os::fd::OwnedFd>,
) -> Result<Pending, SpawnError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0);
    if !fds.is_empty() {
        agent_sandbox_sys::inherit::pass_fds(&mut cmd, fds);
    }
    let mut child = cmd.spawn().map_err(SpawnError::Spawn)?;
    // The parent's copies of `fds` close here, with `cmd`.
    drop(cmd);
    if let Err(e) = crate::files::write(pid_file, child.id().to_string()) {
        // Clean-up finds a sidecar by its pid file only: without one, it goes now.
        let _ = child.kill();
        let _ = child.wait();
        return Err(SpawnError::File(e));
    }
    Ok(Pending { child })
}

impl Pending {
    /// Writes `input` (one line) to the sidecar's stdin, closes it, and waits for the
    /// [`READY`] line; returns the sidecar's pid.
    pub fn ready(mut self, input: Option<&str>) -> Result<u32, SpawnError> {
        use std::io::Write;
        let pid = self.child.id();
        if let Some(mut stdin) = self.child.stdin.take()
            && let Some(line) = input
        {
            // A sidecar that died already shows as EPIPE here; its status says more below.
            let _ = writeln!(stdin, "{line}");
        }
        let Some(stdout) = self.child.stdout.take() else {
            return Err(SpawnError::NotReady {
                reason: "no status pipe".to_owned(),
            });
        };
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(SpawnError::Spawn)?;
        if line.trim() != READY {
            let status = self.child.try_wait().ok().flatten();
            return Err(SpawnError::NotReady {
                reason: match (line.trim(), status) {
                    ("", Some(s)) => format!("it exited ({s})"),
                    ("", None) => "it closed its status pipe".to_owned(),
                    (other, _) => other.to_owned(),
                },
            });
        }
        Ok(pid)
    }
}

/// What [`stop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// No pid file: the sandbox had no such sidecar.
    NoPidFile,
    /// The sidecar was running and got SIGKILL.
    Killed,
    /// The pid file named no live `SUBCOMMAND ... ID` process.
    WasDead,
}

/// Removes `pid_file` and SIGKILLs the process it names if that is still a live
/// `agent-sandbox ... SUBCOMMAND ... ID` (a reused pid is left alone).
pub fn stop(pid_file: &Path, subcommand: &str, id: &str) -> Stopped {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return Stopped::NoPidFile;
    };
    let _ = std::fs::remove_file(pid_file);
    let Ok(pid) = text.trim().parse::<i32>() else {
        return Stopped::WasDead;
    };
    if !is_ours(pid, subcommand, id) {
        return Stopped::WasDead;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    Stopped::Killed
}

/// [`stop`], but first SIGTERM and up to `grace` for the sidecar to end on its own (the
/// egress proxy writes what its audit writer still counts). The pid file is removed before
/// the signal, which tells the sidecar the sandbox ends (not an outage to record).
pub fn stop_after(
    pid_file: &Path,
    subcommand: &str,
    id: &str,
    grace: std::time::Duration,
) -> Stopped {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return Stopped::NoPidFile;
    };
    let _ = std::fs::remove_file(pid_file);
    let Ok(pid) = text.trim().parse::<i32>() else {
        return Stopped::WasDead;
    };
    if !is_ours(pid, subcommand, id) {
        return Stopped::WasDead;
    }
    let target = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
    let deadline = std::time::Instant::now() + grace;
    while is_ours(pid, subcommand, id) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if is_ours(pid, subcommand, id) {
        let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    }
    Stopped::Killed
}

/// The sandbox's init, watched by a helper so that the helper ends with it whoever removes
/// the sandbox (or its state root) or kills its init: a pidfd, which polls readable once
/// the process has exited.
pub struct InitWatch(std::os::fd::OwnedFd);

impl InitWatch {
    /// A watch of `pid`; `Ok(None)` if it is gone already. An error (a kernel without
    /// pidfds) leaves the helper to the old way: it ends when `delete` kills it.
    pub fn open(pid: i32) -> std::io::Result<Option<Self>> {
        match agent_sandbox_sys::pidfd_exit::open(pid) {
            Ok(fd) => Ok(Some(Self(fd))),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A watch of the process of `pidfd` (one the sandbox's helper was handed).
    pub fn from_fd(pidfd: std::os::fd::OwnedFd) -> Self {
        Self(pidfd)
    }

    /// The descriptor to poll (readable once the init exited).
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }

    /// Waits up to `limit` for the init to exit; whether it did.
    pub fn exited_within(&self, limit: std::time::Duration) -> bool {
        readable_within(self.as_fd(), limit).unwrap_or_else(|_| {
            // A pidfd that cannot be polled tells nothing: wait the whole limit.
            std::thread::sleep(limit);
            false
        })
    }
}

/// Waits up to `limit` for `fd` to turn readable (or hung up); whether it did.
pub fn readable_within(
    fd: std::os::fd::BorrowedFd<'_>,
    limit: std::time::Duration,
) -> nix::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // poll's timeout is an i32 of milliseconds: a long limit is waited in pieces.
        let piece = PollTimeout::try_from(left.min(std::time::Duration::from_secs(3600)))
            .unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, piece) {
            Ok(_) if fds[0].any().unwrap_or(false) => return Ok(true),
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(e),
        }
        if left.is_zero() {
            return Ok(false);
        }
    }
}

/// Whether `pid` is a live `agent-sandbox ... SUBCOMMAND ... ID` process.
fn is_ours(pid: i32, subcommand: &str, id: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    args.contains(&subcommand.as_bytes()) && args.last() == Some(&id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pids of live processes whose arguments include `arg`.
    fn processes_with_arg(arg: &str) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
            })
            .collect()
    }

    /// Clean-up finds a sidecar by its pid file only: one whose pid file cannot be written
    /// would outlive the sandbox (the supervisor serves until killed), so it is killed at
    /// once.
    #[test]
    fn a_sidecar_whose_pid_file_cannot_be_written_does_not_outlive_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("no-such-dir").join("sidecar.pid");
        // A duration no other process has in its arguments.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let arg = format!("{}.{nanos:09}", 900 + std::process::id() % 100);
        let result = start_program(Path::new("sleep"), &[arg.as_ref()], &pid_file, Vec::new());
        // Until it has run `sleep` (which a leaked one does within milliseconds).
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let leaked = loop {
            let found = processes_with_arg(&arg);
            if !found.is_empty() || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        for pid in &leaked {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(
            matches!(&result, Err(SpawnError::File(e))
                if e.path() == pid_file && e.op() == crate::files::FileOp::Write),
            "{:?}",
            result.err()
        );
        assert_eq!(leaked, Vec::<i32>::new(), "the sidecar is still running");
    }

    /// A helper's watch of the init: it sees the exit (a zombie not yet reaped counts as
    /// exited), it waits out its limit for a live one, and a gone pid is told apart.
    #[test]
    fn an_init_watch_sees_the_exit_and_waits_out_a_live_init() {
        let pid_of = |c: &std::process::Child| i32::try_from(c.id()).unwrap();
        let mut quick = Command::new("sleep").arg("0.1").spawn().unwrap();
        let watch = InitWatch::open(pid_of(&quick)).unwrap().unwrap();
        assert!(watch.exited_within(std::time::Duration::from_secs(30)));
        quick.wait().unwrap();
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let watch = InitWatch::open(pid_of(&slow)).unwrap().unwrap();
        assert!(!watch.exited_within(std::time::Duration::from_millis(50)));
        slow.kill().unwrap();
        slow.wait().unwrap();
        assert!(watch.exited_within(std::time::Duration::from_secs(30)));
        assert!(
            InitWatch::open(pid_of(&slow)).unwrap().is_none(),
            "reaped: gone"
        );
    }
}

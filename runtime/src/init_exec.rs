//! `start` returns once the container's program runs, as runc's does.
//!
//! After `start` tells the init to go on, the init still runs the runtime's code for a while
//! (startContainer hooks, Landlock, the seccomp filter and its supervisor) before it executes
//! the program. The init is the first process of its PID namespace, and the kernel drops any
//! signal sent to such a process that has no handler for it: a SIGTERM sent in that window
//! (containerd's StopContainer right after StartContainer) is lost, and the container dies
//! only to the SIGKILL at the end of the grace period. runc's `start` returns only when the
//! init's close-on-exec fifo reaches end-of-file, that is after the program was executed;
//! here `start` watches the init's executable change instead.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// Gives up waiting after this long (the caller's `start` then returns as before).
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// The executable a process runs, as (device, inode); None if it cannot be read.
pub fn executable(pid: i32) -> Option<(u64, u64)> {
    std::fs::metadata(format!("/proc/{pid}/exe"))
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// True once `pid` is gone or a zombie.
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|state| matches!(state, 'Z' | 'X' | 'x')),
        Err(_) => true,
    }
}

/// How `wait` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The process runs another executable than `before`.
    Executed,
    /// The process ended (its program failed to start, or ran and exited).
    Ended,
    /// Still the runtime's code after the limit.
    TimedOut,
}

/// Waits until process `pid`, which ran the executable `before`, has executed another one or
/// ended, for at most `limit`.
pub fn wait(pid: i32, before: (u64, u64), limit: Duration) -> Outcome {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        match executable(pid) {
            Some(now) if now != before => return Outcome::Executed,
            Some(_) if !ended(pid) => {}
            _ => return Outcome::Ended,
        }
        if start.elapsed() >= limit {
            return Outcome::TimedOut;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn pid_of(child: &std::process::Child) -> i32 {
        i32::try_from(child.id()).unwrap()
    }

    #[test]
    fn waits_for_the_exec_and_not_longer() {
        // sh waits ~300 ms for a child, then executes sleep (another binary) itself.
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let sleep = std::fs::canonicalize("/bin/sleep").unwrap();
        assert_ne!(
            std::fs::metadata(&sh).unwrap().ino(),
            std::fs::metadata(&sleep).unwrap().ino()
        );
        let mut child = Command::new(&sh)
            .args(["-c", "/bin/sleep 0.3; exec /bin/sleep 5"])
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        let before = executable(pid).unwrap();
        let started = Instant::now();
        let outcome = wait(pid, before, Duration::from_secs(20));
        let waited = started.elapsed();
        let after = executable(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(outcome, Outcome::Executed);
        assert_ne!(after, Some(before), "returned before the exec ({waited:?})");
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
    }

    #[test]
    fn an_ended_process_ends_the_wait() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "exit 0"])
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        let before = executable(pid).unwrap_or((0, 0));
        std::thread::sleep(Duration::from_millis(100));
        // A zombie (not reaped yet) counts as ended.
        assert_eq!(wait(pid, before, Duration::from_secs(5)), Outcome::Ended);
        child.wait().unwrap();
        assert_eq!(wait(pid, before, Duration::from_secs(5)), Outcome::Ended);
    }

    #[test]
    fn a_process_that_never_executes_times_out() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "while :; do sleep 1; done"])
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        let before = executable(pid).unwrap();
        let outcome = wait(pid, before, Duration::from_millis(200));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(outcome, Outcome::TimedOut);
    }
}

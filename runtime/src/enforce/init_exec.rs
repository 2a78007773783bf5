//! `start` returns once the container's program runs, as runc's does.
//!
//! After `start` tells the init to go on, the init still runs the runtime's code for a while
//! (startContainer hooks, Landlock, the seccomp filter and its supervisor) before it executes
//! the program. The init is the first process of its PID namespace, and the kernel drops any
//! signal sent to such a process that has no handler for it: a SIGTERM sent in that window
//! (containerd's StopContainer right after StartContainer) is lost, and the container dies
//! only to the SIGKILL at the end of the grace period. runc's `start` returns only when the
//! init's close-on-exec fifo reaches end-of-file, that is after the program was executed;
//! here `start` watches the init's executable change instead. With agent-sandbox's reaper
//! as PID 1 (`crate::enforce::reaper`), the init never executes anything: its child does, once the
//! reaper has blocked (and so queues) every signal it forwards.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
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

/// Whether a process listed in `procs` (a `cgroup.procs` file), other than `pid`, runs
/// another executable than `before`.
fn another_executed(procs: &Path, pid: i32, before: (u64, u64)) -> bool {
    std::fs::read_to_string(procs).is_ok_and(|text| {
        text.lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter(|p| *p != pid)
            .any(|p| executable(p).is_some_and(|e| e != before))
    })
}

/// Waits until process `pid`, which ran the executable `before`, has executed another one or
/// ended, for at most `limit`. With the reaper as `pid`, `procs` lists the sandbox's
/// processes, and the wait also ends when one of them executed another executable.
pub fn wait(pid: i32, before: (u64, u64), procs: Option<&Path>, limit: Duration) -> Outcome {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        match executable(pid) {
            Some(now) if now != before => return Outcome::Executed,
            Some(_) if !ended(pid) => {}
            _ => return Outcome::Ended,
        }
        if procs.is_some_and(|p| another_executed(p, pid, before)) {
            return Outcome::Executed;
        }
        if start.elapsed() >= limit {
            return Outcome::TimedOut;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// After `start`, how long a signal that would end the init (SIGTERM, ...) waits for the
/// program to install its handler for it.
///
/// The window between the program's exec and its first `trap`/`signal()` exists under runc
/// too, but the sandbox's filters make a program's start-up slower, and a TERM sent in that
/// window is dropped (the init of a PID namespace ignores signals it has no handler for). A
/// CRI StopContainer right after StartContainer then ends only in the SIGKILL after the
/// grace period. Holding such a signal until the program caught or ignored it, for at most
/// this long after the start, delivers it where the program wanted it.
pub const HANDLER_GRACE: Duration = Duration::from_secs(2);

/// Seconds since boot (`/proc/uptime`), the clock of the sandbox's `started` file
/// ([`crate::state::SandboxDir::started`]), where `start` notes when the program ran.
pub fn uptime() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether `sig`'s bit is set in the `field` mask (`SigCgt`, `SigIgn`) of a `/proc/PID/status`.
fn mask_has(status: &str, field: &str, sig: i32) -> bool {
    let Some(bit) = u32::try_from(sig).ok().and_then(|s| s.checked_sub(1)) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| bit < 64 && mask & (1 << bit) != 0)
}

/// Whether a signal's default action ends the process while a program may catch it: the
/// signals a PID namespace's init drops until it has a handler.
pub fn ends_unless_caught(sig: i32) -> bool {
    use nix::sys::signal::Signal as S;
    [
        S::SIGHUP,
        S::SIGINT,
        S::SIGQUIT,
        S::SIGTERM,
        S::SIGUSR1,
        S::SIGUSR2,
        S::SIGALRM,
        S::SIGPIPE,
    ]
    .iter()
    .any(|s| *s as i32 == sig)
}

/// Holds `sig` for the init `pid`, whose program `start` saw run at `started` (uptime), until
/// the program caught, ignored or blocked it (a blocked signal is queued, never dropped: the
/// reaper blocks every signal it forwards), the init ended, or [`HANDLER_GRACE`] after the
/// start.
/// Returns at once for a program that set up long ago.
pub fn await_handler(pid: i32, sig: i32, started: f64) {
    if !ends_unless_caught(sig) {
        return;
    }
    let grace = HANDLER_GRACE.as_secs_f64();
    loop {
        let Some(now) = uptime() else { return };
        if now - started >= grace || now < started {
            return;
        }
        match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(status)
                if ["SigCgt", "SigIgn", "SigBlk"]
                    .iter()
                    .any(|f| mask_has(&status, f, sig)) =>
            {
                return;
            }
            Ok(_) if !ended(pid) => {}
            _ => return,
        }
        std::thread::sleep(Duration::from_millis(2));
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
    fn reads_caught_and_ignored_signals_from_proc_status() {
        let status = "Name:\tsh\nSigIgn:\t0000000000000004\nSigCgt:\t0000000000004002\n";
        assert!(mask_has(status, "SigCgt", 15));
        assert!(mask_has(status, "SigCgt", 2));
        assert!(!mask_has(status, "SigCgt", 1));
        assert!(mask_has(status, "SigIgn", 3));
        assert!(!mask_has(status, "SigIgn", 15));
        assert!(!mask_has(status, "SigCgt", 0));
        assert!(!mask_has("SigCgt:\tzz\n", "SigCgt", 15));
        assert!(ends_unless_caught(15) && !ends_unless_caught(9) && !ends_unless_caught(17));
        assert!(mask_has("SigBlk:\t0000000000004000\n", "SigBlk", 15));
    }

    #[test]
    fn with_the_reaper_the_wait_ends_when_its_child_executed() {
        // `reaper` never executes anything; `program` executes sleep after ~300 ms.
        let mut reaper = Command::new("/bin/sh")
            .args(["-c", "while :; do /bin/sleep 1; done"])
            .spawn()
            .unwrap();
        let mut program = Command::new("/bin/sh")
            .args(["-c", "/bin/sleep 0.3; exec /bin/sleep 5"])
            .spawn()
            .unwrap();
        let (r, p) = (pid_of(&reaper), pid_of(&program));
        let before = executable(r).unwrap();
        let dir = std::env::temp_dir().join(format!("init-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, format!("{r}\n{p}\n")).unwrap();
        let t = Instant::now();
        let outcome = wait(r, before, Some(&procs), Duration::from_secs(20));
        let waited = t.elapsed();
        // Without the list, the reaper's own exe never changes.
        let alone = wait(r, before, None, Duration::from_millis(200));
        for c in [&mut reaper, &mut program] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(outcome, Outcome::Executed);
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert_eq!(alone, Outcome::TimedOut);
    }

    #[test]
    fn holds_a_term_until_the_program_traps_it_and_no_longer_than_the_grace() {
        // sh traps TERM only once the test creates `go`, ~300 ms after the clock starts (not
        // after a sleep in sh: on a loaded machine the spawn alone can take that long): the
        // hold ends when SigCgt shows the handler. Until then sh spins on builtins: a shell
        // waiting for a foreground child blocks every signal for moments, which ends the hold.
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        let mut child = Command::new("sh")
            .args([
                "-c",
                "while [ ! -e \"$1\" ]; do :; done; trap 'exit 0' TERM; while :; do sleep 0.05; done",
                "sh",
            ])
            .arg(&go)
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        let t = Instant::now();
        let started = uptime().unwrap();
        let creator = std::thread::spawn({
            let go = go.clone();
            move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(go, b"").unwrap();
            }
        });
        await_handler(pid, 15, started);
        let held = t.elapsed();
        creator.join().unwrap();
        assert!(held >= Duration::from_millis(250), "{held:?}");
        assert!(held < HANDLER_GRACE, "{held:?}");
        // A start long ago: no hold at all.
        let t = Instant::now();
        await_handler(pid, 15, 0.0);
        assert!(t.elapsed() < Duration::from_millis(100));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0));
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
        let outcome = wait(pid, before, None, Duration::from_secs(20));
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
        assert_eq!(
            wait(pid, before, None, Duration::from_secs(5)),
            Outcome::Ended
        );
        child.wait().unwrap();
        assert_eq!(
            wait(pid, before, None, Duration::from_secs(5)),
            Outcome::Ended
        );
    }

    #[test]
    fn a_process_that_never_executes_times_out() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "while :; do sleep 1; done"])
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        let before = executable(pid).unwrap();
        let outcome = wait(pid, before, None, Duration::from_millis(200));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(outcome, Outcome::TimedOut);
    }
}

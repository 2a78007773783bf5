//! The sandbox's reaping init: the container's first process forks, the child goes on to
//! execute the program, and the parent stays PID 1 of the PID namespace, reaping every
//! process that ends there and forwarding signals to the program.
//!
//! Without it the program is PID 1, and a program that is not an init never waits for the
//! orphans the kernel hands it: their zombies hold pids of the sandbox's pids limit until
//! it runs out. The reaper is the runtime's own code, already running in the container's
//! init after every layer was applied (no capabilities, no_new_privs, Landlock, seccomp):
//! the fork keeps all of them for both processes, and nothing new is executed.
//!
//! Only async-signal-safe calls follow the fork in either process, and the caller checks
//! that it is single-threaded (so no lock can be held by a thread that is not copied).

use std::io;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, setpgid, tcsetpgrp};

/// Why the reaper could not be set up (the start then fails: the caller asked for it).
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("the init has {threads} threads; the reaper forks only a single-threaded init")]
    Threads { threads: usize },
    #[error("cannot read the init's thread count")]
    Status(#[source] io::Error),
    #[error("cannot block signals for the reaper")]
    Mask(#[source] nix::Error),
    #[error("cannot fork the program's process")]
    Fork(#[source] nix::Error),
}

/// Signals the kernel raises for a fault in the process itself: left unblocked (blocking
/// them would make a fault loop), never forwarded. SIGKILL and SIGSTOP cannot be blocked.
const SYNCHRONOUS: [Signal; 6] = [
    Signal::SIGSEGV,
    Signal::SIGBUS,
    Signal::SIGILL,
    Signal::SIGFPE,
    Signal::SIGTRAP,
    Signal::SIGSYS,
];

/// Every signal the reaper waits for: all but the synchronous ones (SIGCHLD is reaped, the
/// rest forwarded, real-time signals included).
fn waited() -> SigSet {
    let mut set = SigSet::all();
    for s in SYNCHRONOUS {
        set.remove(s);
    }
    set
}

fn threads() -> Result<usize, ReaperError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(ReaperError::Status)?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

/// The status the reaper exits with for the program's `status`: its code, or 128 + N for
/// a death by signal N (what a shell, runc's callers and `docker run --init` report).
pub fn folded(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// Where the reaper keeps the read end of its dead-man pipe (see [`arm_dead_man`]).
const DEAD_MAN_FD: i32 = 3;

/// The line the reaper writes on its stderr when the helper died.
const HELPER_DIED: &[u8] =
    b"agent-sandbox: the sandbox's helper process died: ending the sandbox (see docs/limits.md)\n";

/// Makes `fd`, the read end of a pipe whose only write end the sandbox's helper holds (the
/// host process that holds its wall clock and answers its denials), tell this process
/// when the helper is gone: non-blocking, and the kernel sends SIGIO to this process when
/// the last writer closes. Called in the init before the layers (no filter need allow
/// these `fcntl`s), so the owner is the init, which stays PID 1 as the reaper.
pub fn arm_dead_man(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller borrows; F_GETFL reads its flags.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETOWN names this process, F_SETFL sets status flags only.
    let ok = unsafe {
        libc::fcntl(raw, libc::F_SETOWN, libc::getpid()) == 0
            && libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK | libc::O_ASYNC) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the helper is gone: the dead-man pipe reads end-of-file (the helper never
/// writes; any byte or error other than EOF counts as alive, so a spurious wake-up ends
/// nothing).
fn helper_gone() -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte read into a local, from the descriptor the reaper keeps.
    let n = unsafe { libc::read(DEAD_MAN_FD, (&raw mut byte).cast(), 1) };
    n == 0
}

/// The helper died: every process of the sandbox ends with the reaper (PID 1 of the PID
/// namespace, whose exit makes the kernel kill the rest).
fn end_sandbox() -> ! {
    // SAFETY: a write of a static buffer to stderr, then kill and _exit, which return
    // nothing the reaper uses.
    unsafe {
        let _ = libc::write(2, HELPER_DIED.as_ptr().cast(), HELPER_DIED.len());
        let _ = libc::kill(-1, libc::SIGKILL);
        libc::_exit(128 + libc::SIGKILL)
    }
}

/// Forks the program's process. Returns in the child, with the caller's signal mask, as
/// the leader of its own process group, which is also the terminal's foreground group
/// when stdin is the controlling terminal (so Ctrl-C and window changes reach the program,
/// as they would reach it as PID 1). In the parent it never returns: see [`reap`].
/// With `dead_man` (armed by [`arm_dead_man`]) the reaper also ends the sandbox once the
/// helper is gone.
pub fn fork_program(dead_man: Option<std::os::fd::RawFd>) -> Result<(), ReaperError> {
    let n = threads()?;
    if n != 1 {
        return Err(ReaperError::Threads { threads: n });
    }
    let mut old = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&waited()), Some(&mut old))
        .map_err(ReaperError::Mask)?;
    // SAFETY: the process is single-threaded (checked above), so the child cannot inherit
    // a lock held by another thread; both sides go on with the process's own state.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let me = getpid();
            let _ = setpgid(me, me);
            // SIGTTOU is blocked here, so a background group may take the terminal.
            let stdin = std::io::stdin();
            if nix::unistd::isatty(0).unwrap_or(false) {
                let _ = tcsetpgrp(&stdin, me);
            }
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            Ok(())
        }
        Ok(ForkResult::Parent { child }) => reap(child, dead_man),
        Err(e) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            Err(ReaperError::Fork(e))
        }
    }
}

/// The reaper's loop (signals blocked by [`fork_program`]): forwards every signal it is
/// sent to `program`, reaps every process that ends in the namespace, and once `program`
/// ended exits with its [`folded`] status. Keeps stdin, stdout and stderr (the wall-clock
/// line is written to the init's stderr) and the dead-man pipe, and closes every other
/// descriptor; after every wake-up, a helper found gone ends the sandbox.
fn reap(program: Pid, dead_man: Option<std::os::fd::RawFd>) -> ! {
    let watching = match dead_man {
        None => false,
        Some(fd) if fd == DEAD_MAN_FD => true,
        // SAFETY: dup2 onto a fixed number, above stdio; whatever it held is closed below
        // anyway. A pipe that cannot be kept cannot be watched: fail closed.
        Some(fd) if unsafe { libc::dup2(fd, DEAD_MAN_FD) } == DEAD_MAN_FD => true,
        Some(_) => end_sandbox(),
    };
    close_from(if watching { 4 } else { 3 });
    retitle();
    // The helper may have died before SIGIO was armed.
    if watching && helper_gone() {
        end_sandbox();
    }
    let set = waited();
    loop {
        // SAFETY: `set` is a valid sigset; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigwaitinfo(set.as_ref(), std::ptr::null_mut()) };
        if watching && helper_gone() {
            end_sandbox();
        }
        if sig == libc::SIGCHLD {
            if let Some(code) = reap_all(program) {
                // SAFETY: _exit ends the process without running anything else.
                unsafe { libc::_exit(code) }
            }
        } else if sig > 0 {
            // SAFETY: kill with a signal number the kernel just delivered.
            let _ = unsafe { libc::kill(program.as_raw(), sig) };
        }
    }
}

/// What `ps` in the sandbox shows for the reaper.
const TITLE: &[u8] = b"agent-sandbox-init";

/// Renames the reaper (`/proc/1/comm` and `/proc/1/cmdline`): it still carries the runtime's
/// `create` arguments (host paths of the caller's bundle and logs), which the sandbox has no
/// business reading. The argument area is overwritten in place, as `setproctitle` does.
fn retitle() {
    let _ = nix::sys::prctl::set_name(c"agent-sandbox-init");
    let Some((start, end)) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| arg_area(&stat))
    else {
        return;
    };
    let Some(len) = end.checked_sub(start).filter(|l| *l > TITLE.len()) else {
        return;
    };
    // SAFETY: [arg_start, arg_end) is this process's argument area, as the kernel reports
    // it: mapped, writable (the initial stack) and referred to by nothing that reads it
    // again (std copied the arguments at start-up, and this process never returns to code
    // that asks for them). The last byte stays NUL, so the kernel reads a plain list.
    unsafe {
        let area = start as *mut u8;
        std::ptr::write_bytes(area, 0, len);
        std::ptr::copy_nonoverlapping(TITLE.as_ptr(), area, TITLE.len());
    }
}

/// `arg_start` and `arg_end` (fields 48 and 49) of a `/proc/PID/stat` line.
fn arg_area(stat: &str) -> Option<(usize, usize)> {
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<usize>().ok();
    let (start, end) = (field(48)?, field(49)?);
    (start > 0 && end > start).then_some((start, end))
}

/// Closes every descriptor from `first` up (`close_range`), for a process that was handed
/// descriptors it must not keep (the reaper, a detached watcher).
pub fn close_from(first: u32) {
    // SAFETY: close_range only closes this process's descriptors from `first` up; callers
    // never again use (or drop) an object that owns one of them: the reaper never returns,
    // the watcher calls it before anything else opens a descriptor.
    let _ = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
}

/// Waits for every ended child; returns the exit status once `program` is among them.
fn reap_all(program: Pid) -> Option<i32> {
    let mut ended = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(status) if status.pid() == Some(program) => {
                ended = folded(status).or(ended);
            }
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_codes_and_signals_as_a_shell_does() {
        let p = Pid::from_raw(7);
        assert_eq!(folded(WaitStatus::Exited(p, 3)), Some(3));
        assert_eq!(
            folded(WaitStatus::Signaled(p, Signal::SIGTERM, false)),
            Some(143)
        );
        assert_eq!(
            folded(WaitStatus::Signaled(p, Signal::SIGKILL, true)),
            Some(137)
        );
        assert_eq!(folded(WaitStatus::StillAlive), None);
    }

    #[test]
    fn a_multi_threaded_process_is_refused_before_anything_changes() {
        let _t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        let before = std::fs::read_to_string("/proc/self/status").unwrap();
        let err = fork_program(None).unwrap_err();
        assert!(
            matches!(err, ReaperError::Threads { threads } if threads > 1),
            "{err}"
        );
        let blk = |s: &str| {
            s.lines()
                .find(|l| l.starts_with("SigBlk:"))
                .map(str::to_owned)
        };
        let after = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(blk(&before), blk(&after));
    }

    #[test]
    fn reads_the_argument_area_from_stat() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let (start, end) = arg_area(&stat).unwrap();
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
        assert_eq!(end - start, cmdline.len());
        assert_eq!(arg_area("1 (a b) S 0"), None);
    }

    #[test]
    fn waits_for_everything_but_faults() {
        let set = waited();
        for s in [
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGUSR1,
            Signal::SIGWINCH,
            Signal::SIGCHLD,
            Signal::SIGQUIT,
        ] {
            assert!(set.contains(s), "{s}");
        }
        for s in SYNCHRONOUS {
            assert!(!set.contains(s), "{s}");
        }
    }
}

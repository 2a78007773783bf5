//! Signal state at the program's `execve`, as runc leaves it: every signal at its default
//! action and none blocked.
//!
//! The process that executes the program is a fork of the runtime, and Rust's standard
//! library sets SIGPIPE to "ignore" before `main`. `execve` resets caught signals to their
//! default but keeps ignored ones ignored, and keeps the mask, so without this every program
//! in a sandbox would start with SIGPIPE ignored: a writer to a closed pipe (`yes | head`)
//! gets EPIPE instead of dying and may spin on it. Under runc the program's `SigIgn` and
//! `SigBlk` are zero.

use std::io;

/// The kernel's `struct sigaction` for `rt_sigaction` on x86_64 and aarch64 (the handler,
/// flags, restorer, then a 64-bit mask), which is not glibc's layout.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The highest signal number the kernel knows on x86_64 and aarch64.
const NSIG: i32 = 64;

/// Sets every signal but SIGKILL and SIGSTOP to its default action and unblocks all of
/// them. The raw system call also reaches the two real-time signals glibc reserves for
/// itself (32 and 33), which its `sigaction` refuses to touch. Call it last before `execve`,
/// in a single-threaded process: no handler of this process may run afterwards.
pub fn reset_for_exec() -> io::Result<()> {
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=NSIG {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `default` is a valid kernel sigaction that installs no handler (SIG_DFL
        // needs no restorer); the old action is not asked for (null), and the size is the
        // kernel's sigset size (8 bytes) on the architectures above.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &raw const default,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let empty: u64 = 0;
    // SAFETY: an 8-byte empty mask replaces the thread's mask; the old one is not asked for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &raw const empty,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_mask(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .unwrap();
        u64::from_str_radix(hex.trim(), 16).unwrap()
    }

    #[test]
    fn ignored_and_blocked_signals_are_cleared_in_a_forked_child() {
        // A forked child, so the test harness's own threads and signals stay untouched.
        // SAFETY: the child only calls async-signal-safe code paths and `_exit`s.
        match unsafe { libc::fork() } {
            0 => {
                // The state a Rust runtime's child starts with, and a blocked signal.
                // SAFETY: plain libc calls in the single-threaded child.
                unsafe {
                    libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&raw mut set);
                    libc::sigaddset(&raw mut set, libc::SIGUSR1);
                    libc::sigprocmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
                }
                let before = status_mask("SigIgn") != 0 && status_mask("SigBlk") != 0;
                let reset = reset_for_exec().is_ok();
                let after = status_mask("SigIgn") == 0 && status_mask("SigBlk") == 0;
                let code = if before && reset && after { 0 } else { 1 };
                // SAFETY: ends the child without running the harness's exit handlers.
                unsafe { libc::_exit(code) }
            }
            pid if pid > 0 => {
                let mut status = 0;
                // SAFETY: waits for the child forked above.
                unsafe { libc::waitpid(pid, &raw mut status, 0) };
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            }
            _ => panic!("fork failed: {}", io::Error::last_os_error()),
        }
    }
}

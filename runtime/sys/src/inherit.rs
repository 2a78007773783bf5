//! Descriptors handed to a child process at fixed numbers (3, 4, ...), and taken over by
//! the child. std's `Command` only passes stdin/stdout/stderr; the runtime passes a helper
//! the sockets it opened for it (the seccomp supervisor's listening socket and its kernel
//! audit subscription), so the helper's start-up runs beside the create instead of before it.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The first descriptor number [`pass_fds`] uses.
pub const FIRST_FD: RawFd = 3;
/// Where the copies are parked in the child before they are moved into place, above any
/// number std or the caller may have open.
const PARK_FROM: RawFd = 100;

/// When `cmd` spawns, the child gets `fds[i]` as descriptor `FIRST_FD + i` (without
/// `FD_CLOEXEC`); the parent's copies stay with `cmd` and close when it is dropped.
pub fn pass_fds(cmd: &mut Command, fds: Vec<OwnedFd>) {
    let raw: Vec<RawFd> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let hook = move || {
        // Keeps the parent's descriptors open until the child has its copies.
        let _owned = &fds;
        // Copy every source above PARK_FROM first, so that moving one into place never
        // overwrites another source that happens to sit at a target number.
        let mut parked = Vec::with_capacity(raw.len());
        for fd in &raw {
            // SAFETY: fcntl(F_DUPFD_CLOEXEC) only reads `fd`, which `fds` keeps open; it is
            // async-signal-safe, as code between fork and exec must be.
            let copy = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, PARK_FROM) };
            if copy < 0 {
                return Err(std::io::Error::last_os_error());
            }
            parked.push(copy);
        }
        for (target, copy) in (FIRST_FD..).zip(&parked) {
            // SAFETY: dup2 on descriptors of this (forked, about to exec) process only; the
            // new descriptor has FD_CLOEXEC clear, so it survives the exec. Async-signal-safe.
            if unsafe { libc::dup2(*copy, target) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // The parked copies are FD_CLOEXEC: the exec closes them.
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec and calls only fcntl and
    // dup2 (async-signal-safe); it allocates nothing (the Vec has its capacity) and touches
    // no lock.
    unsafe { cmd.pre_exec(hook) };
}

/// Takes descriptor `fd`, which this process was started with (see [`pass_fds`]), marking
/// it close-on-exec. Call it once per descriptor, before anything else can open one.
pub fn take_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the descriptor's flags; a closed number gives EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; sets FD_CLOEXEC on a descriptor checked to be open.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked above) and was inherited at exec for this process to
    // own; the caller takes each number once, so it gets the only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Turns an owned descriptor into a `T` that owns it (a socket type of another crate that
/// only implements `FromRawFd`).
pub fn into_owner<T: FromRawFd>(fd: OwnedFd) -> T {
    // SAFETY: `into_raw_fd` gives up OwnedFd's ownership of an open descriptor, so `T`
    // becomes its only owner, which is FromRawFd's contract.
    unsafe { T::from_raw_fd(fd.into_raw_fd()) }
}

/// The descriptor a `T` owned (a socket type of another crate that only implements
/// `IntoRawFd`), owned.
pub fn owned_from<T: IntoRawFd>(owner: T) -> OwnedFd {
    // SAFETY: `into_raw_fd` hands the caller the ownership of an open descriptor (IntoRawFd's
    // contract), which the OwnedFd takes.
    unsafe { OwnedFd::from_raw_fd(owner.into_raw_fd()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_child_finds_the_descriptors_at_three_and_four() {
        let (mut r1, w1) = std::io::pipe().unwrap();
        let (mut r2, w2) = std::io::pipe().unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "echo one >&3; echo two >&4"]);
        // Passed in the order that makes the naive dup2 clobber one of them when the
        // sources sit at 3 or 4 themselves.
        pass_fds(&mut cmd, vec![OwnedFd::from(w2), OwnedFd::from(w1)]);
        let status = cmd.status().unwrap();
        drop(cmd);
        assert!(status.success());
        let (mut a, mut b) = (String::new(), String::new());
        r2.read_to_string(&mut a).unwrap();
        r1.read_to_string(&mut b).unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("one\n", "two\n"));
    }

    #[test]
    fn taking_a_closed_number_is_an_error() {
        assert!(take_fd(987).is_err());
    }
}

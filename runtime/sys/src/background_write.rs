//! A write that may block for a while, done by a forked child so that the caller goes on at
//! once and stays single-threaded.
//!
//! Why not a thread: libcontainer forks its intermediate process with a raw `clone3`, which
//! skips glibc's fork handlers. A second thread that holds a malloc arena lock (or any other
//! userspace lock) at that moment leaves the lock held forever in the child. Under parallel
//! `exec`s that happened: the intermediate process hung in `futex_wait` (a loop of 6 x 40
//! `ctr task exec` hung 3 of them). A child made by glibc's `fork` holds no such lock, and
//! between fork and `_exit` it only calls `write`, which is async-signal-safe.

use std::os::fd::{AsRawFd, OwnedFd};

/// Forks a child that closes every other descriptor, writes `data` to `fd` once and exits;
/// returns the child's pid without waiting for it. The child's exit status is not looked at: whoever reaps it (this process
/// at exit, or a subreaper such as containerd's shim or conmon) may ignore it. The caller's
/// copy of `fd` is closed when this returns.
pub fn write_in_child(fd: OwnedFd, data: &'static [u8]) -> nix::Result<nix::unistd::Pid> {
    // SAFETY: the child only calls write(2) and _exit(2), both async-signal-safe, on memory
    // (`data`, a 'static slice) and a descriptor (`fd`) that the fork copied; it never
    // returns into Rust code of the parent's, so no lock held by another thread is touched.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let fd = fd.as_raw_fd();
            // A descriptor is never negative.
            let raw = fd.cast_unsigned();
            // SAFETY: close_range(2), write(2) and _exit(2) are async-signal-safe. Every other
            // descriptor is closed first, so that the child does not keep the caller's pipes
            // (its stdio, a reader's pending EOF) open while the write blocks.
            unsafe {
                if raw > 0 {
                    libc::syscall(
                        libc::SYS_close_range,
                        0 as libc::c_uint,
                        raw - 1,
                        0 as libc::c_uint,
                    );
                }
                libc::syscall(
                    libc::SYS_close_range,
                    raw + 1,
                    libc::c_uint::MAX,
                    0 as libc::c_uint,
                );
                libc::write(fd, data.as_ptr().cast(), data.len());
                libc::_exit(0)
            }
        }
        nix::unistd::ForkResult::Parent { child } => Ok(child),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_child_writes_once_and_exits_holding_no_other_descriptor() {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let (read, write) = nix::unistd::pipe().unwrap();
        // Fill the pipe so that the child's write blocks until the test reads.
        fcntl(write.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let mut filled = 0;
        while let Ok(n) = nix::unistd::write(&write, &[b'x'; 4096]) {
            filled += n;
        }
        fcntl(write.as_raw_fd(), FcntlArg::F_SETFL(OFlag::empty())).unwrap();
        // A pipe of the caller's whose EOF must not wait for the blocked child.
        let (held_read, held_write) = nix::unistd::pipe().unwrap();
        let child = write_in_child(write, b"0").unwrap();
        drop(held_write);
        let mut rest = Vec::new();
        std::fs::File::from(held_read)
            .read_to_end(&mut rest)
            .unwrap();
        assert!(rest.is_empty());
        // The parent's copy of the write end is closed: EOF comes when the child exits.
        let mut got = Vec::new();
        std::fs::File::from(read).read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), filled + 1);
        assert_eq!(got.last(), Some(&b'0'));
        let status = nix::sys::wait::waitpid(child, None).unwrap();
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
    }
}

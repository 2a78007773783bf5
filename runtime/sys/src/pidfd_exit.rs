//! A process's exit status read through a pidfd, whoever reaps the process (Linux 6.15+:
//! `PIDFD_GET_INFO` with `PIDFD_INFO_EXIT`).
//!
//! podman's conmon is the parent that reaps an exec'd process, so the runtime never sees
//! its status from `wait`. A pidfd opened while the process is still the runtime's child
//! (no reuse of its pid is possible then) outlives the process, and once the process is
//! reaped the kernel keeps its wait status for every holder of such a pidfd.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// `PIDFD_INFO_EXIT` in `struct pidfd_info.mask` (`<linux/pidfd.h>`).
const PIDFD_INFO_EXIT: u64 = 1 << 3;

/// `struct pidfd_info` as of its first version (`PIDFD_INFO_SIZE_VER0`, 64 bytes); the
/// kernel takes any size from that one up and fills what both know.
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    ids: [u32; 11],
    exit_code: i32,
}

/// `PIDFD_GET_INFO`: `_IOWR(0xFF, 11, struct pidfd_info)` with the size above.
const PIDFD_GET_INFO: libc::c_ulong = {
    let size = std::mem::size_of::<PidfdInfo>() as libc::c_ulong;
    (3 << 30) | (size << 16) | (0xFF << 8) | 11
};

/// A pidfd for `pid` (see the module's note on when that is free of pid reuse).
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

fn info(pidfd: BorrowedFd<'_>, mask: u64) -> io::Result<PidfdInfo> {
    let mut info = PidfdInfo {
        mask,
        ..PidfdInfo::default()
    };
    // SAFETY: `info` is a live, writable `struct pidfd_info` of the size encoded in the
    // request number; the kernel writes at most that many bytes into it.
    let r = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO,
            std::ptr::from_mut(&mut info),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// Whether this kernel answers `PIDFD_GET_INFO` (6.13+) on the live `pidfd`; exit
/// information came with 6.15, which [`exit_status`] needs.
pub fn supported(pidfd: BorrowedFd<'_>) -> bool {
    info(pidfd, 0).is_ok()
}

/// Waits until the process of `pidfd` ended and was reaped, for at most `limit` after it
/// ended; returns its wait status (as `waitpid` gives it), or None if the kernel has no
/// exit information for it (older than 6.15, or not reaped in time).
pub fn exit_status(pidfd: BorrowedFd<'_>, limit: Duration) -> Option<i32> {
    use rustix::event::{PollFd, PollFlags, poll};
    // A pidfd polls readable once the process exited.
    loop {
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) if fds[0].revents().intersects(PollFlags::IN | PollFlags::HUP) => break,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    // The exit information appears when the parent reaps it.
    let start = std::time::Instant::now();
    loop {
        match info(pidfd.as_fd(), PIDFD_INFO_EXIT) {
            Ok(i) if i.mask & PIDFD_INFO_EXIT != 0 => return Some(i.exit_code),
            Ok(_) | Err(_) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_request_number_is_the_kernels() {
        assert_eq!(std::mem::size_of::<PidfdInfo>(), 64);
        assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
    }

    /// The status is read after someone else (here: this test, as the parent) reaped it.
    #[test]
    fn reads_the_status_of_a_process_another_reaped() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "sleep 0.2; exit 7"])
            .spawn()
            .unwrap();
        let pidfd = open(i32::try_from(child.id()).unwrap()).unwrap();
        assert!(supported(pidfd.as_fd()), "this kernel has PIDFD_GET_INFO");
        let reaper = std::thread::spawn(move || child.wait().unwrap());
        let status = exit_status(pidfd.as_fd(), Duration::from_secs(10));
        let code = reaper.join().unwrap().code();
        assert_eq!(code, Some(7));
        assert_eq!(status, Some(7 << 8), "a wait status: exit code 7");

        let mut killed = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let pidfd = open(i32::try_from(killed.id()).unwrap()).unwrap();
        killed.kill().unwrap();
        killed.wait().unwrap();
        assert_eq!(
            exit_status(pidfd.as_fd(), Duration::from_secs(10)),
            Some(libc::SIGKILL)
        );
    }
}

//! Seccomp user notification (`SECCOMP_RET_USER_NOTIF`): the sandbox side installs a filter
//! and gets its listener descriptor; the supervisor side (a host process outside the sandbox)
//! receives each notification and answers it at once.
//!
//! seccompiler has no user-notification action and no listener flag, so these calls are made
//! here with the kernel's own structures from `libc`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `SECCOMP_SET_MODE_FILTER` from `<linux/seccomp.h>`.
const SET_MODE_FILTER: libc::c_uint = 1;

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter`.
pub type Instruction = libc::sock_filter;

/// A syscall the filter handed to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// Cookie to answer with (and to check with [`id_valid`]).
    pub id: u64,
    /// The caller's pid in the supervisor's pid namespace.
    pub pid: u32,
    /// Syscall number.
    pub nr: i32,
    /// `AUDIT_ARCH_*` of the call.
    pub arch: u32,
}

/// Installs `program` on the calling thread with `SECCOMP_FILTER_FLAG_NEW_LISTENER` and
/// returns the listener. The caller must have set no_new_privs (or hold CAP_SYS_ADMIN).
/// The listener is close-on-exec.
pub fn install_with_listener(program: &[Instruction]) -> io::Result<OwnedFd> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call and holds `len`
    // instructions; the kernel copies the program and only reads through the pointer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Receives the next notification (blocks unless the listener has one pending; poll it for
/// `POLLIN` first). `ENOENT` means the caller died before it was received.
pub fn receive(listener: BorrowedFd<'_>) -> io::Result<Notification> {
    // SAFETY: `seccomp_notif` is plain old data; all-zero is a valid value, and the kernel
    // requires the buffer to be zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: NOTIF_RECV writes one `seccomp_notif` into `n`, which is that size and
    // writable; the descriptor is borrowed for the call.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut n as *mut libc::seccomp_notif,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Notification {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr,
        arch: n.data.arch,
    })
}

/// Whether notification `id` is still pending (its caller alive and waiting): checked after
/// reading `/proc/PID/...` so the pid was not reused meanwhile.
pub fn id_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: NOTIF_ID_VALID reads one u64 through the pointer, which points at `id`.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &id as *const u64,
        )
    };
    r == 0
}

/// Answers notification `id`: the syscall fails with `errno` in the caller.
/// `ENOENT` means the caller died meanwhile (nothing to answer).
pub fn deny(listener: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: NOTIF_SEND reads one `seccomp_notif_resp` through the pointer, which points at
    // `resp`; the descriptor is borrowed for the call.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &resp as *const libc::seccomp_notif_resp,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a sandboxed process sends the supervisor with its listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Only the listener.
    Listener,
    /// The listener, and the process made a Landlock probe connect to this port and waits
    /// for one byte back before it goes on (see `agent_sandbox_audit::kernel`).
    Probed { port: u16 },
    /// Not a listener: `start` arms the wall clock of `seconds`, and the descriptor is a
    /// pidfd of the sandbox's init (the helper's timer ends with it).
    WallClock { seconds: u64 },
}

/// Sends `fd` over the connected Unix stream `sock` (SCM_RIGHTS) with the caller's
/// credentials (SCM_CREDENTIALS: the kernel checks them and shows the receiver the pid in
/// its own pid namespace) and the [`Handover`] as data.
pub fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>, what: Handover) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixCredentials, sendmsg};
    let fds = [fd.as_raw_fd()];
    let data: Vec<u8> = match what {
        Handover::Listener => b"L".to_vec(),
        Handover::Probed { port } => {
            let mut d = b"P".to_vec();
            d.extend_from_slice(&port.to_le_bytes());
            d
        }
        Handover::WallClock { seconds } => {
            let mut d = b"W".to_vec();
            d.extend_from_slice(&seconds.to_le_bytes());
            d
        }
    };
    let iov = [io::IoSlice::new(&data)];
    let creds = UnixCredentials::new();
    sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[
            ControlMessage::ScmRights(&fds),
            ControlMessage::ScmCredentials(&creds),
        ],
        MsgFlags::empty(),
        None,
    )
    .map(drop)
    .map_err(io::Error::from)
}

/// A listener received with [`recv_fd`].
#[derive(Debug)]
pub struct Received {
    pub fd: OwnedFd,
    /// The sender's pid in this process's pid namespace (0 if it has none here).
    pub pid: Option<i32>,
    pub what: Handover,
}

/// Lets `sock` receive its peer's credentials (SO_PASSCRED); set it before [`recv_fd`].
pub fn pass_credentials(sock: BorrowedFd<'_>) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::PassCred};
    setsockopt(&sock, PassCred, &true).map_err(io::Error::from)
}

/// Receives one descriptor sent with [`send_fd`]; `Ok(None)` when the peer closed the stream.
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<Option<Received>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut data = [0u8; 9];
    let mut iov = [io::IoSliceMut::new(&mut data)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1], libc::ucred);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let len = msg.bytes;
    if len == 0 {
        return Ok(None);
    }
    let mut fd = None;
    let mut pid = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        match cmsg {
            ControlMessageOwned::ScmRights(fds) => {
                for (i, &raw) in fds.iter().enumerate() {
                    // SAFETY: SCM_RIGHTS just installed `raw` in this process; nothing else
                    // owns it. Only the first is kept; extra ones are closed on drop.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if i == 0 {
                        fd = Some(owned);
                    }
                }
            }
            ControlMessageOwned::ScmCredentials(c) => pid = Some(c.pid()),
            _ => {}
        }
    }
    let what = match (&data[..len], len) {
        ([b'P', lo, hi], 3) => Handover::Probed {
            port: u16::from_le_bytes([*lo, *hi]),
        },
        ([b'W', rest @ ..], 9) => Handover::WallClock {
            seconds: u64::from_le_bytes(rest.try_into().unwrap_or_default()),
        },
        _ => Handover::Listener,
    };
    match fd {
        Some(fd) => Ok(Some(Received { fd, pid, what })),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message without a descriptor",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn stmt(code: u32, k: u32) -> Instruction {
        libc::sock_filter {
            code: u16::try_from(code).unwrap(),
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn getppid() -> (i64, i32) {
        // SAFETY: getppid takes no arguments and touches no memory.
        let r = unsafe { libc::syscall(libc::SYS_getppid) };
        (r, io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The forked child: installs `program`, sends the listener to the parent, closes its copy,
    /// then reports two getppid calls (before and after the parent drops the listener).
    fn child(program: &[Instruction], sock: &UnixStream) -> i32 {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointers.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return 2;
        }
        let Ok(listener) = install_with_listener(program) else {
            return 3;
        };
        if send_fd(sock.as_fd(), listener.as_fd(), Handover::Probed { port: 7 }).is_err() {
            return 4;
        }
        drop(listener);
        let mut out = sock;
        let mut buf = [0u8; 1];
        for _ in 0..2 {
            let (r, e) = getppid();
            if writeln!(out, "{r} {e}").is_err() || (&mut &*sock).read(&mut buf).is_err() {
                return 5;
            }
        }
        0
    }

    /// A child's `getppid` goes to the supervisor (this process), which answers EACCES; once
    /// the supervisor's listener is closed the kernel fails the call with ENOSYS (fail closed).
    #[test]
    fn notifications_are_answered_by_the_supervisor_and_fail_closed_without_it() {
        let nr = u32::try_from(libc::SYS_getppid).unwrap();
        let program = [
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
            libc::sock_filter {
                code: u16::try_from(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K).unwrap(),
                jt: 0,
                jf: 1,
                k: nr,
            },
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_USER_NOTIF),
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        ];
        let (parent_end, child_end) = UnixStream::pair().unwrap();
        // SAFETY: the test binary may run other threads; the child only makes syscalls
        // (no allocation-dependent locks are taken before `_exit` beyond what `child` does
        // with its own stack and the socket).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = child(&program, &child_end);
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        pass_credentials(parent_end.as_fd()).unwrap();
        let got = recv_fd(parent_end.as_fd()).unwrap().unwrap();
        assert_eq!(got.pid, Some(pid));
        assert_eq!(got.what, Handover::Probed { port: 7 });
        let listener = got.fd;
        let n = receive(listener.as_fd()).unwrap();
        assert_eq!(n.nr, i32::try_from(nr).unwrap());
        assert_eq!(n.pid, u32::try_from(pid).unwrap());
        assert!(id_valid(listener.as_fd(), n.id));
        deny(listener.as_fd(), n.id, libc::EACCES).unwrap();
        assert!(!id_valid(listener.as_fd(), n.id));
        let mut lines = std::io::BufReader::new(&parent_end).lines();
        assert_eq!(
            lines.next().unwrap().unwrap(),
            format!("-1 {}", libc::EACCES)
        );
        drop(listener);
        (&parent_end).write_all(b"x").unwrap();
        assert_eq!(
            lines.next().unwrap().unwrap(),
            format!("-1 {}", libc::ENOSYS)
        );
        (&parent_end).write_all(b"x").unwrap();
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` is a valid out pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:#x}"
        );
    }

    /// `start` arms the helper's wall clock with a message that carries the seconds and a
    /// descriptor (the init's pidfd); the helper tells it apart from a listener.
    #[test]
    fn a_wall_clock_message_carries_its_seconds_and_descriptor() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (r, _w) = std::io::pipe().unwrap();
        let seconds = 7_200_000_000_123;
        send_fd(ours.as_fd(), r.as_fd(), Handover::WallClock { seconds }).unwrap();
        send_fd(ours.as_fd(), r.as_fd(), Handover::Listener).unwrap();
        let armed = recv_fd(theirs.as_fd()).unwrap().unwrap();
        assert_eq!(armed.what, Handover::WallClock { seconds });
        let listener = recv_fd(theirs.as_fd()).unwrap().unwrap();
        assert_eq!(listener.what, Handover::Listener);
    }
}

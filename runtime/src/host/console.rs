//! A sandbox's terminal across a checkpoint (docs/checkpoint.md#terminals).
//!
//! The terminal of a sandbox made with `process.terminal` is a pty whose slave the sandbox
//! holds and whose master the engine holds (conmon, a shim), got over `--console-socket`
//! at `create`. CRIU cannot save the master's side, so the dump names the slave external
//! (`--external tty[RDEV:DEV]`, [`TtyKey`]) and the restore hands CRIU a new slave in its
//! place (`--inherit-fd fd[N]:tty[RDEV:DEV]`), whose master goes to the restoring caller's
//! console socket as `create` sends it. CRIU puts the image's terminal settings and window
//! size on the new pty.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Errors of carrying a terminal.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error(
        "the image's terminal {key:?} is not CRIU's name of a terminal (tty[RDEV:DEV]) \
         (docs/checkpoint.md#terminals)"
    )]
    Key { key: String },
    #[error("cannot read the sandbox's terminal ({path})")]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make a terminal for the restored sandbox")]
    Open(#[source] nix::Error),
    #[error("cannot give the restored sandbox's terminal to its host id {uid}")]
    Own {
        uid: u32,
        #[source]
        source: nix::Error,
    },
    #[error("cannot send the terminal to the console socket {path}")]
    Send {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The major numbers of pty slaves (`UNIX98_PTY_SLAVE_MAJOR`, 136 up to 143).
const PTY_SLAVE_MAJORS: std::ops::RangeInclusive<u64> = 136..=143;

/// CRIU's name of a terminal, `tty[RDEV:DEV]` (hex `st_rdev` and `st_dev` of the slave, as
/// CRIU's `--external` and `--inherit-fd` take it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtyKey {
    rdev: u64,
    dev: u64,
}

impl TtyKey {
    /// The pty slave that `pid` holds among its descriptors 0, 1 and 2, if any: a sandbox's
    /// init holds its terminal there (libcontainer makes it the init's standard streams).
    pub fn of_init(proc: &Path, pid: i32) -> Result<Option<Self>, ConsoleError> {
        for fd in 0..3 {
            let path = proc.join(format!("{pid}/fd/{fd}"));
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(ConsoleError::Stat { path, source }),
            };
            let rdev = meta.rdev();
            if std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type())
                && PTY_SLAVE_MAJORS.contains(&nix::sys::stat::major(rdev))
            {
                return Ok(Some(Self {
                    rdev,
                    dev: meta.dev(),
                }));
            }
        }
        Ok(None)
    }

    /// The key as the image's manifest has it: an edited one that is not CRIU's form of a
    /// terminal's name is refused (it is passed to CRIU as an argument).
    pub fn parse(text: &str) -> Result<Self, ConsoleError> {
        let bad = || ConsoleError::Key {
            key: text.to_owned(),
        };
        let inner = text
            .strip_prefix("tty[")
            .and_then(|r| r.strip_suffix(']'))
            .ok_or_else(bad)?;
        let (rdev, dev) = inner.split_once(':').ok_or_else(bad)?;
        let hex = |s: &str| {
            (!s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
                .ok_or_else(bad)
        };
        Ok(Self {
            rdev: hex(rdev)?,
            dev: hex(dev)?,
        })
    }
}

impl std::fmt::Display for TtyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tty[{:x}:{:x}]", self.rdev, self.dev)
    }
}

/// A new terminal for a restored sandbox: its slave goes to CRIU, its master to the
/// caller's console socket.
pub struct NewTerminal {
    /// Inherited by CRIU (no close-on-exec), which gives it to the restored tasks.
    slave: OwnedFd,
    /// The slave's path on the host (`/dev/pts/N`), the source of the sandbox's
    /// `/dev/console`.
    path: PathBuf,
}

impl NewTerminal {
    /// Makes a pty pair on the host, gives the slave to the sandbox's host root id `uid`
    /// (as the sandbox's own devpts made it at `create`) and sends the master over the
    /// console socket at `socket`, as `create` does.
    pub fn make(uid: u32, socket: &Path) -> Result<Self, ConsoleError> {
        let pty = nix::pty::openpty(None, None).map_err(ConsoleError::Open)?;
        nix::fcntl::fcntl(
            pty.master.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(ConsoleError::Open)?;
        let id = nix::unistd::Uid::from_raw(uid);
        nix::unistd::fchown(
            pty.slave.as_raw_fd(),
            Some(id),
            Some(nix::unistd::Gid::from_raw(uid)),
        )
        .map_err(|source| ConsoleError::Own { uid, source })?;
        let link = PathBuf::from(format!("/proc/self/fd/{}", pty.slave.as_raw_fd()));
        let path = std::fs::read_link(&link)
            .map_err(|source| ConsoleError::Stat { path: link, source })?;
        send_master(socket, &pty.master).map_err(|source| ConsoleError::Send {
            path: socket.to_owned(),
            source,
        })?;
        Ok(Self {
            slave: pty.slave,
            path,
        })
    }

    /// CRIU's `--inherit-fd` for the image's terminal `key`.
    pub fn inherit_args(&self, key: TtyKey) -> [String; 2] {
        [
            "--inherit-fd".to_owned(),
            format!("fd[{}]:{key}", self.slave.as_raw_fd()),
        ]
    }

    /// The slave's path on the host: what the restored `/dev/console` binds.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The master over the console socket, with `/dev/ptmx` as the message (what
/// libcontainer's `create` sends). The socket is reached through its directory's
/// descriptor, so a path longer than a socket address holds still works.
fn send_master(socket: &Path, master: &OwnedFd) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    let name = socket
        .file_name()
        .ok_or_else(|| std::io::Error::other("the console socket's path has no file name"))?;
    let dir = std::fs::File::open(socket.parent().unwrap_or(Path::new("/")))?;
    let reachable = Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let stream = std::os::unix::net::UnixStream::connect(reachable)?;
    let fds = [master.as_raw_fd()];
    sendmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &[std::io::IoSlice::new(b"/dev/ptmx")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_criu_s_form_and_nothing_else() {
        let key = TtyKey::parse("tty[8800:4a]").unwrap();
        assert_eq!(key.to_string(), "tty[8800:4a]");
        for bad in [
            "tty[8800]",
            "tty[8800:4a",
            "pipe:[12]",
            "tty[:4a]",
            "tty[88 00:4a]",
            "tty[8800:4a]:fd[3]",
            "tty[11111111111111111:1]",
            "",
        ] {
            let err = TtyKey::parse(bad).unwrap_err().to_string();
            assert!(err.contains("docs/checkpoint.md#terminals"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_init_s_terminal_is_its_pty_slave_among_its_standard_streams() {
        let proc = tempfile::tempdir().unwrap();
        let fd = proc.path().join("7/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::os::unix::fs::symlink("/dev/null", fd.join("0")).unwrap();
        assert_eq!(TtyKey::of_init(proc.path(), 7).unwrap(), None);
        let pty = nix::pty::openpty(None, None).unwrap();
        let slave = format!("/proc/self/fd/{}", pty.slave.as_raw_fd());
        let real = std::fs::read_link(&slave).unwrap();
        std::os::unix::fs::symlink(&real, fd.join("2")).unwrap();
        let meta = std::fs::metadata(&real).unwrap();
        let key = TtyKey::of_init(proc.path(), 7).unwrap().unwrap();
        assert_eq!(
            key.to_string(),
            format!("tty[{:x}:{:x}]", meta.rdev(), meta.dev())
        );
    }

    #[test]
    fn the_master_reaches_the_console_socket_and_talks_to_the_slave() {
        let dir = tempfile::tempdir().unwrap();
        // Longer than a socket address holds (108 bytes).
        let deep = dir.path().join("d".repeat(100));
        std::fs::create_dir(&deep).unwrap();
        let socket = deep.join("console.sock");
        let held = std::fs::File::open(&deep).unwrap();
        let short = format!("/proc/self/fd/{}/console.sock", held.as_raw_fd());
        let listener = std::os::unix::net::UnixListener::bind(short).unwrap();
        let me = nix::unistd::getuid().as_raw();
        let receiver = std::thread::spawn(move || {
            use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
            let (stream, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg = recvmsg::<()>(
                stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::empty(),
            )
            .unwrap();
            let fd = msg
                .cmsgs()
                .unwrap()
                .find_map(|c| match c {
                    ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
                    _ => None,
                })
                .unwrap();
            let n = msg.bytes;
            (fd, buf[..n].to_vec())
        });
        let term = NewTerminal::make(me, &socket).unwrap();
        let (master, name) = receiver.join().unwrap();
        assert_eq!(name, b"/dev/ptmx");
        assert!(
            term.path().starts_with("/dev/pts"),
            "{}",
            term.path().display()
        );
        // What the slave's holder writes, the master's holder reads.
        nix::unistd::write(&term.slave, b"hi\n").unwrap();
        let mut buf = [0u8; 16];
        let n = nix::unistd::read(master, &mut buf).unwrap();
        assert!(buf[..n].starts_with(b"hi"), "{:?}", &buf[..n]);
        nix::unistd::close(master).unwrap();
        let [flag, value] = term.inherit_args(TtyKey::parse("tty[8800:4a]").unwrap());
        assert_eq!(flag, "--inherit-fd");
        assert_eq!(
            value,
            format!("fd[{}]:tty[8800:4a]", term.slave.as_raw_fd())
        );
    }
}

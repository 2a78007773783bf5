//! The standard streams of container processes.
//!
//! Without a terminal, stdout and stderr fifos go straight to the runtime (and so to the
//! process): the shim copies nothing. Stdin goes through a pipe that the shim feeds from the
//! fifo, because a client opens its end of the stdin fifo only after the shim opened the read
//! end, and a process reading a fifo that never had a writer would see end-of-file at once.
//!
//! With a terminal, the runtime sends the pty master over a console socket; the shim copies
//! between the master and the fifos and resizes the master on request.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
use tokio::io::unix::AsyncFd;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::runtime::Stdio3;

/// Errors while wiring up a process's streams.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("Cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a fifo")]
    NotFifo { path: PathBuf },
    #[error("Cannot set up the stdin pipe")]
    Pipe(#[source] io::Error),
    #[error("Cannot create the console socket")]
    Socket(#[source] io::Error),
    #[error("The runtime did not send a terminal over the console socket")]
    NoConsole,
    #[error("Timed out waiting for the runtime to send a terminal")]
    ConsoleTimeout,
    #[error("Cannot receive the terminal from the console socket")]
    Receive(#[source] io::Error),
    #[error("Cannot resize the terminal")]
    Resize(#[source] io::Error),
}

/// Streams of a process as containerd names them (fifo paths; empty means none).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// Background copies belonging to one process; aborted when the process is deleted.
#[derive(Debug, Default)]
pub struct Copies {
    tasks: Vec<JoinHandle<()>>,
    /// Becomes true once the terminal's output reached end-of-file.
    output_done: Option<watch::Receiver<bool>>,
    /// The pty master, kept for resizing.
    master: Option<std::sync::Arc<AsyncFd<OwnedFd>>>,
}

impl Copies {
    /// A receiver that turns true once the terminal output is copied out (None: no terminal).
    pub fn output_watch(&self) -> Option<watch::Receiver<bool>> {
        self.output_done.clone()
    }

    pub fn resize(&self, width: u32, height: u32) -> Result<(), StdioError> {
        let Some(master) = &self.master else {
            return Err(StdioError::NoConsole);
        };
        let clamp = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
        let size = rustix::termios::Winsize {
            ws_row: clamp(height),
            ws_col: clamp(width),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(master.get_ref(), size)
            .map_err(|e| StdioError::Resize(e.into()))
    }

    /// Stops feeding stdin: the process sees end-of-file (CloseIO).
    pub fn close_stdin(&mut self) {
        // The stdin copy is always the first task when present; aborting it drops the pipe's
        // write end.
        if let Some(task) = self.tasks.first() {
            task.abort();
        }
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn open_fifo(path: &str, read: bool) -> Result<File, StdioError> {
    let p = Path::new(path);
    let mut opts = OpenOptions::new();
    if read {
        opts.read(true);
    } else {
        // Read-write: opening never blocks and never fails for want of a reader, and a client
        // that went away does not turn writes into EPIPE.
        opts.read(true).write(true);
    }
    let file = opts
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(p)
        .map_err(|source| StdioError::Open {
            path: p.to_owned(),
            source,
        })?;
    let is_fifo = file
        .metadata()
        .map(|m| m.file_type().is_fifo())
        .map_err(|source| StdioError::Open {
            path: p.to_owned(),
            source,
        })?;
    if !is_fifo {
        return Err(StdioError::NotFifo { path: p.to_owned() });
    }
    Ok(file)
}

fn set_blocking(fd: impl AsFd, blocking: bool) -> io::Result<()> {
    let flags = fcntl_getfl(&fd)?;
    let flags = if blocking {
        flags - OFlags::NONBLOCK
    } else {
        flags | OFlags::NONBLOCK
    };
    fcntl_setfl(&fd, flags)?;
    Ok(())
}

/// Streams for a process without a terminal. Returns the runtime's stdio and the copies.
pub fn direct(paths: &StdioPaths) -> Result<(Stdio3, Copies), StdioError> {
    let mut copies = Copies::default();
    let stdin = if paths.stdin.is_empty() {
        Stdio::null()
    } else {
        let fifo = open_fifo(&paths.stdin, true)?;
        let (reader, writer) = io::pipe().map_err(StdioError::Pipe)?;
        let writer = OwnedFd::from(writer);
        set_blocking(&writer, false).map_err(StdioError::Pipe)?;
        let src = async_fd(OwnedFd::from(fifo)).map_err(StdioError::Pipe)?;
        let dst = async_fd(writer).map_err(StdioError::Pipe)?;
        copies.tasks.push(tokio::spawn(async move {
            let _ = copy(&src, &dst).await;
        }));
        Stdio::from(reader)
    };
    let out = |path: &str| -> Result<Stdio, StdioError> {
        if path.is_empty() {
            return Ok(Stdio::null());
        }
        let f = open_fifo(path, false)?;
        set_blocking(&f, true).map_err(|source| StdioError::Open {
            path: path.into(),
            source,
        })?;
        Ok(Stdio::from(f))
    };
    Ok((
        Stdio3 {
            stdin,
            stdout: out(&paths.stdout)?,
            stderr: out(&paths.stderr)?,
        },
        copies,
    ))
}

/// A console socket the runtime connects to and sends the pty master over.
pub struct ConsoleSocket {
    listener: UnixListener,
    dir: tempfile::TempDir,
}

impl ConsoleSocket {
    pub fn new() -> Result<Self, StdioError> {
        let dir = tempfile::Builder::new()
            .prefix("agent-sandbox-shim-")
            .tempdir_in("/run")
            .map_err(StdioError::Socket)?;
        let listener =
            UnixListener::bind(dir.path().join("console.sock")).map_err(StdioError::Socket)?;
        Ok(Self { listener, dir })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("console.sock")
    }

    /// Accepts the runtime's connection and receives the master fd.
    pub async fn receive(self) -> Result<OwnedFd, StdioError> {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(10), self.listener.accept())
            .await
            .map_err(|_| StdioError::ConsoleTimeout)?
            .map_err(StdioError::Receive)?;
        let stream = stream.into_std().map_err(StdioError::Receive)?;
        set_blocking(&stream, true).map_err(StdioError::Receive)?;
        let mut name = [0u8; 4096];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut name)];
        recvmsg(&stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
            .map_err(|e| StdioError::Receive(e.into()))?;
        let mut fds = control.drain().filter_map(|msg| match msg {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        });
        let fd = fds
            .next()
            .and_then(|mut fds| fds.next())
            .ok_or(StdioError::NoConsole)?;
        Ok(fd)
    }
}

/// Streams for a process with a terminal: copies master -> stdout and stdin -> master.
pub fn console(master: OwnedFd, paths: &StdioPaths) -> Result<Copies, StdioError> {
    set_blocking(&master, false).map_err(StdioError::Receive)?;
    let master = std::sync::Arc::new(async_fd(master).map_err(StdioError::Receive)?);
    let mut copies = Copies::default();
    copies.master = Some(master.clone());
    if !paths.stdin.is_empty() {
        let fifo = open_fifo(&paths.stdin, true)?;
        let src = async_fd(OwnedFd::from(fifo)).map_err(StdioError::Pipe)?;
        let dst = master.clone();
        copies.tasks.push(tokio::spawn(async move {
            let _ = copy(&src, &dst).await;
        }));
    }
    let (tx, rx) = watch::channel(false);
    copies.output_done = Some(rx);
    if paths.stdout.is_empty() {
        let _ = tx.send(true);
    } else {
        let fifo = open_fifo(&paths.stdout, false)?;
        let dst = async_fd(OwnedFd::from(fifo)).map_err(StdioError::Pipe)?;
        let src = master;
        copies.tasks.push(tokio::spawn(async move {
            let _ = copy(&src, &dst).await;
            let _ = tx.send(true);
        }));
    }
    Ok(copies)
}

/// Registers an owned fd with the reactor.
///
/// tokio 1.54 deprecated the safe `AsyncFd::new` in favour of an `unsafe fn register` whose
/// contract is that the fd stays open and unchanged while registered. An `OwnedFd` moved into
/// the `AsyncFd` satisfies that by construction, and this crate forbids `unsafe`, so the
/// deprecated safe constructor is the right one here.
#[allow(deprecated)]
pub fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

/// Copies until end-of-file (or EIO, which a pty master reports once the last slave closed).
async fn copy(src: &AsyncFd<OwnedFd>, dst: &AsyncFd<OwnedFd>) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = loop {
            let mut guard = src.readable().await?;
            match guard
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf[..]).map_err(io::Error::from))
            {
                Ok(result) => break result,
                Err(_would_block) => continue,
            }
        };
        let n = match n {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut written = 0;
        while written < n {
            let mut guard = dst.writable().await?;
            let chunk = &buf[written..n];
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), chunk).map_err(io::Error::from))
            {
                Ok(Ok(w)) => written += w,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

//! The standard streams of container processes.
//!
//! Without a terminal, an exec's stdout and stderr fifos go straight to the runtime (and so to
//! the process): the shim copies nothing ([`direct`]). The init's output goes through pipes
//! that the shim copies into the fifos ([`piped`]), as containerd's runc shim does for every
//! process: CRIU cannot checkpoint a process that writes to a fifo outside its mount
//! namespace. Stdin goes through a pipe that the shim feeds from the fifo, because a client
//! opens its end of the stdin fifo only after the shim opened the read end, and a process
//! reading a fifo that never had a writer would see end-of-file at once.
//!
//! The shim keeps a handle of its own on each output fifo while the process runs, and lets go
//! of it only once the client has read everything ([`drain_outputs`]), before the exit is
//! published. A fifo's buffer lives only while some descriptor holds the fifo open: a fast
//! process (`echo`) can write and exit before the client's reader (ctr opens its end in a
//! goroutine) has opened, and once the process's descriptors are gone its output would be
//! freed unread, leaving the client with an exit 0 and no output.
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
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a fifo")]
    NotFifo { path: PathBuf },
    #[error("cannot set up the stdin pipe")]
    Pipe(#[source] io::Error),
    #[error("cannot create the console socket")]
    Socket(#[source] io::Error),
    #[error("the runtime did not send a terminal over the console socket")]
    NoConsole,
    #[error("timed out waiting for the runtime to send a terminal")]
    ConsoleTimeout,
    #[error("cannot receive the terminal from the console socket")]
    Receive(#[source] io::Error),
    #[error("cannot resize the terminal")]
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
    /// The stdin copy, kept apart so CloseIO stops it and nothing else.
    stdin: Option<JoinHandle<()>>,
    /// The output copies (the terminal's master -> stdout).
    tasks: Vec<JoinHandle<()>>,
    /// Becomes true once the terminal's output reached end-of-file.
    output_done: Option<watch::Receiver<bool>>,
    /// The pty master, kept for resizing.
    master: Option<std::sync::Arc<AsyncFd<OwnedFd>>>,
    /// The shim's own handles on the stdout and stderr fifos (no terminal), which keep the
    /// process's unread output alive until the client's reader has taken it.
    outputs: Vec<OwnedFd>,
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

    /// The shim's handles on the output fifos, for [`drain_outputs`] once the process exited.
    pub fn take_outputs(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.outputs)
    }

    /// Stops feeding stdin: the process sees end-of-file (CloseIO).
    /// Aborting the stdin copy drops its write end; a process without stdin (a terminal with
    /// only output) keeps its output copy.
    pub fn close_stdin(&mut self) {
        if let Some(task) = self.stdin.take() {
            task.abort();
        }
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        for t in self.stdin.iter().chain(&self.tasks) {
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

/// Opens an output fifo and keeps a handle of the shim's own on it in `outputs` (see
/// [`drain_outputs`]).
fn held_output(path: &str, outputs: &mut Vec<OwnedFd>) -> Result<File, StdioError> {
    let fifo = open_fifo(path, false)?;
    let held = fifo.try_clone().map_err(|source| StdioError::Open {
        path: path.into(),
        source,
    })?;
    outputs.push(OwnedFd::from(held));
    Ok(fifo)
}

/// Stdin through a pipe the shim feeds from the stdin fifo, if the process has one.
fn piped_stdin(paths: &StdioPaths, copies: &mut Copies) -> Result<Stdio, StdioError> {
    if paths.stdin.is_empty() {
        return Ok(Stdio::null());
    }
    let fifo = open_fifo(&paths.stdin, true)?;
    let (reader, writer) = io::pipe().map_err(StdioError::Pipe)?;
    let writer = OwnedFd::from(writer);
    set_blocking(&writer, false).map_err(StdioError::Pipe)?;
    let src = async_fd(OwnedFd::from(fifo)).map_err(StdioError::Pipe)?;
    let dst = async_fd(writer).map_err(StdioError::Pipe)?;
    copies.stdin = Some(tokio::spawn(async move {
        let _ = copy(&src, &dst).await;
    }));
    Ok(Stdio::from(reader))
}

/// Streams for a process without a terminal whose output goes through pipes that the shim
/// copies into the stdout and stderr fifos, as containerd's runc shim gives every process.
/// CRIU can checkpoint (and the runtime restore) a process writing to a pipe, but not one
/// writing to a fifo outside its mount namespace ("Can't lookup mount" for its fd 1), so the
/// init, which Checkpoint dumps, gets these. The output watch turns true once both pipes
/// reached end-of-file; the shim's handles on the fifos then keep unread output alive for
/// [`drain_outputs`], as with [`direct`].
pub fn piped(paths: &StdioPaths) -> Result<(Stdio3, Copies), StdioError> {
    let mut copies = Copies::default();
    let stdin = piped_stdin(paths, &mut copies)?;
    let mut pairs = Vec::new();
    let mut out = |path: &str| -> Result<Stdio, StdioError> {
        if path.is_empty() {
            return Ok(Stdio::null());
        }
        let fifo = held_output(path, &mut copies.outputs)?;
        let (reader, writer) = io::pipe().map_err(StdioError::Pipe)?;
        let reader = OwnedFd::from(reader);
        set_blocking(&reader, false).map_err(StdioError::Pipe)?;
        let src = async_fd(reader).map_err(StdioError::Pipe)?;
        let dst = async_fd(OwnedFd::from(fifo)).map_err(StdioError::Pipe)?;
        pairs.push((src, dst));
        Ok(Stdio::from(writer))
    };
    let stdout = out(&paths.stdout)?;
    let stderr = out(&paths.stderr)?;
    let (tx, rx) = watch::channel(false);
    copies.output_done = Some(rx);
    copies.tasks.push(tokio::spawn(async move {
        // stdout and stderr side by side: a process may fill either first.
        let mut pairs = pairs.into_iter();
        let (first, second) = (pairs.next(), pairs.next());
        let run = |pair: Option<(AsyncFd<OwnedFd>, AsyncFd<OwnedFd>)>| async move {
            if let Some((src, dst)) = pair {
                let _ = copy(&src, &dst).await;
            }
        };
        tokio::join!(run(first), run(second));
        let _ = tx.send(true);
    }));
    Ok((
        Stdio3 {
            stdin,
            stdout,
            stderr,
        },
        copies,
    ))
}

/// Streams for a process without a terminal. Returns the runtime's stdio and the copies.
pub fn direct(paths: &StdioPaths) -> Result<(Stdio3, Copies), StdioError> {
    let mut copies = Copies::default();
    let stdin = piped_stdin(paths, &mut copies)?;
    let mut out = |path: &str| -> Result<Stdio, StdioError> {
        if path.is_empty() {
            return Ok(Stdio::null());
        }
        let f = held_output(path, &mut copies.outputs)?;
        set_blocking(&f, true).map_err(|source| StdioError::Open {
            path: path.into(),
            source,
        })?;
        Ok(Stdio::from(f))
    };
    let stdout = out(&paths.stdout)?;
    let stderr = out(&paths.stderr)?;
    Ok((
        Stdio3 {
            stdin,
            stdout,
            stderr,
        },
        copies,
    ))
}

/// The longest pause between two looks at a fifo being drained: the most a drained fifo adds
/// to an exit's latency (an ExecSync of `echo` takes some 20-60 ms end to end).
const DRAIN_POLL_MAX: Duration = Duration::from_millis(2);

/// Waits until the client has read every byte the process left in its output fifos, or until
/// `limit` passes (a client that never reads), then closes the shim's handles: the client's
/// reader sees end-of-file once the process's own descriptors are gone too.
///
/// `FIONREAD` on any descriptor of a fifo counts the bytes buffered in it. Zero means the
/// output was taken by a reader, or there was none; either way nothing is lost by closing.
/// No event says that a fifo became empty (it polls writable while any page is free), so
/// this looks again after a pause that grows from 0.5 ms to [`DRAIN_POLL_MAX`].
pub async fn drain_outputs(outputs: Vec<OwnedFd>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_micros(500);
    for fd in &outputs {
        while rustix::io::ioctl_fionread(fd).is_ok_and(|n| n > 0) {
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(DRAIN_POLL_MAX);
        }
    }
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
        copies.stdin = Some(tokio::spawn(async move {
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

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::process::Command;

    use super::*;

    fn fifo(dir: &Path) -> PathBuf {
        let path = dir.join("stdout");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        path
    }

    /// A process that writes and exits before the client's reader opened the fifo.
    fn exited_writer(path: &Path) -> Copies {
        let paths = StdioPaths {
            stdout: path.display().to_string(),
            ..Default::default()
        };
        let (stdio, copies) = direct(&paths).expect("open streams");
        let status = Command::new("/bin/sh")
            .args(["-c", "printf done"])
            .stdout(stdio.stdout)
            .status()
            .expect("run sh");
        assert!(status.success());
        copies
    }

    #[tokio::test]
    async fn close_stdin_stops_only_the_stdin_copy() {
        // A terminal without stdin: the only copy is the output one, which CloseIO must keep.
        let mut copies = Copies::default();
        copies
            .tasks
            .push(tokio::spawn(std::future::pending::<()>()));
        copies.close_stdin();
        tokio::task::yield_now().await;
        assert!(!copies.tasks[0].is_finished(), "output copy was stopped");
        // With stdin, its copy stops and the output copy runs on.
        copies.stdin = Some(tokio::spawn(std::future::pending::<()>()));
        let stdin = copies.stdin.as_ref().map(JoinHandle::abort_handle).unwrap();
        copies.close_stdin();
        for _ in 0..100 {
            if stdin.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(stdin.is_finished(), "stdin copy still runs");
        assert!(!copies.tasks[0].is_finished(), "output copy was stopped");
        let output = copies.tasks[0].abort_handle();
        drop(copies);
        tokio::task::yield_now().await;
        assert!(output.is_finished(), "drop leaves the output copy running");
    }

    #[tokio::test]
    async fn output_of_a_process_gone_before_the_reader_opened_reaches_the_reader() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = fifo(dir.path());
        let mut copies = exited_writer(&path);
        let reader = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::read_to_string(&path)
        });
        drain_outputs(copies.take_outputs(), Duration::from_secs(10)).await;
        assert_eq!(reader.await.expect("join").expect("read"), "done");
    }

    /// The same late reader when nothing holds the fifo after the process exited (the shim
    /// before it kept handles of its own): the output is gone.
    #[test]
    fn without_the_shims_handle_a_late_reader_finds_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = fifo(dir.path());
        drop(exited_writer(&path));
        // A child another test forks in the same moment may hold a copy of the writer until
        // its exec closes it (EAGAIN meanwhile); once no writer is left, the read ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let text = loop {
            let mut text = String::new();
            let read = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .expect("open reader")
                .read_to_string(&mut text);
            match read {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "a writer stays open");
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.map(|_| text).expect("read"),
            }
        };
        assert_eq!(text, "");
    }

    #[tokio::test]
    async fn piped_output_reaches_a_late_reader_and_is_not_a_fifo_for_the_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = fifo(dir.path());
        let paths = StdioPaths {
            stdout: path.display().to_string(),
            ..Default::default()
        };
        let (stdio, mut copies) = piped(&paths).expect("open streams");
        // What CRIU sees as the process's fd 1: a pipe, not the fifo's path.
        let status = Command::new("/bin/sh")
            .args(["-c", "readlink /proc/self/fd/1 >&2; printf done"])
            .stdout(stdio.stdout)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run sh");
        assert!(status.status.success());
        let fd1 = String::from_utf8_lossy(&status.stderr);
        assert!(fd1.starts_with("pipe:"), "{fd1}");
        let mut done = copies.output_watch().expect("an output watch");
        tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d))
            .await
            .expect("the copy ends at end-of-file")
            .expect("watch");
        let reader = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::read_to_string(&path)
        });
        drain_outputs(copies.take_outputs(), Duration::from_secs(10)).await;
        drop(copies);
        assert_eq!(reader.await.expect("join").expect("read"), "done");
    }

    #[tokio::test]
    async fn a_client_that_never_reads_holds_the_exit_no_longer_than_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = fifo(dir.path());
        let mut copies = exited_writer(&path);
        let start = std::time::Instant::now();
        drain_outputs(copies.take_outputs(), Duration::from_millis(200)).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
    }
}

//! `syscall_denied` records through seccomp user notification.
//!
//! The sandbox's filter answers a denied syscall with `SECCOMP_RET_USER_NOTIF` instead of
//! `SECCOMP_RET_ERRNO`. A supervisor process on the host (spawned at create, like the egress
//! proxy, and killed at delete) holds the filters' listeners: it answers every notification
//! at once with the policy's errno, then writes a rate-limited `syscall_denied` record
//! (syscall name, pid, comm, exe). The sandbox cannot block it (answers never wait for the
//! log) nor flood the log (token bucket; what was left out is counted in the next record).
//! If the supervisor dies, the kernel fails every notified syscall with ENOSYS: still denied.
//!
//! Getting the listener out: the filter is installed by our executor inside the container's
//! init (and each exec'd process), after pivot_root, so the listener fd is born inside the
//! sandbox. Before forking, the runtime connects a Unix stream to the supervisor's socket
//! (`seccomp.sock` in the sandbox dir, root-only, never mounted into a container); the
//! executor inherits that stream, sends the listener over it (SCM_RIGHTS) and closes both
//! before `execve`, so the workload never holds the listener (it could answer its own
//! notifications). `pidfd_getfd` from the host would need the init to pause until the host
//! has taken the fd and to tell it the fd number: the stream does both in one message.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

use agent_sandbox_audit::kernel::{Found, LandlockTracker};
use agent_sandbox_audit::{AuditLog, Event, Gate, RateLimit, Stream as RecordStream};
use agent_sandbox_policy::seccomp::Arch;
use agent_sandbox_sys::seccomp_notify::{self, Handover, Instruction};
use seccompiler::BpfProgram;

use crate::sidecars::fs_audit::{FsAuditStatus, KernelAudit};
use crate::sidecars::{self, READY};
use crate::state::SandboxDir;

/// Errors of the syscall-denial supervisor.
#[derive(Debug, thiserror::Error)]
pub enum SyscallAuditError {
    #[error("cannot start the seccomp supervisor")]
    Spawn(#[source] std::io::Error),
    #[error("the seccomp supervisor did not start: {reason}")]
    NotReady { reason: String },
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the seccomp supervisor of this sandbox is not reachable at {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the seccomp supervisor was started without its sockets")]
    Inherited(#[source] std::io::Error),
    #[error("seccomp supervisor poll")]
    Poll(#[source] nix::Error),
    #[error("audit trail")]
    Audit(#[source] agent_sandbox_audit::AuditError),
    #[error("BPF instruction {index} does not fit the kernel's format")]
    Program { index: usize },
    #[error("fs_denied reporting")]
    FsAudit(#[source] crate::sidecars::fs_audit::FsAuditError),
}

/// `BPF_RET | BPF_K` (`<linux/bpf_common.h>`: 0x06 | 0x00).
const RET_K: u16 = 0x06;
/// `BPF_JMP | BPF_JEQ | BPF_K` and `BPF_JMP | BPF_JGE | BPF_K`.
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;

/// The sandbox's filter with its denials turned into `SECCOMP_RET_USER_NOTIF`, so the
/// supervisor answers and records them. seccompiler has no user-notification action, so the
/// compiled program is rewritten here; which returns change follows the layout the policy
/// compiler pins (`policy::seccomp::bpf::prologue`):
/// - in the allowlist, every `SECCOMP_RET_ERRNO | errno` (the policy's default deny, which
///   is also what an argument check that does not match returns);
/// - in the prologue, the ENOSYS answer to syscalls newer than the policy's review (the
///   return after its `jge`): a denial like any other, answered with ENOSYS as compiled;
/// - not the prologue's per-syscall compatibility answers (clone3's ENOSYS, after a `jeq`):
///   libc calls clone3 for every thread and process, falls back to clone (whose flags the
///   allowlist checks) and nothing is refused, so they stay in the kernel, unrecorded and
///   without a round trip; nor the architecture check's kill.
pub fn notify_program(bpf: &BpfProgram, errno: u32) -> Vec<Instruction> {
    let deny = libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA);
    // `ld [arch]; jeq AUDIT_ARCH, 0, SKIP`: the prologue is these two and SKIP more.
    let prologue_end = match bpf.get(1) {
        Some(i) if i.code == JEQ_K => 2 + usize::from(i.jf),
        _ => 0,
    };
    bpf.iter()
        .enumerate()
        .map(|(at, i)| {
            let after = |code| at > 0 && bpf.get(at - 1).is_some_and(|p| p.code == code);
            let is_errno = i.k & libc::SECCOMP_RET_ACTION_FULL == libc::SECCOMP_RET_ERRNO;
            let notify = i.code == RET_K
                && if at < prologue_end {
                    is_errno && after(JGE_K)
                } else {
                    i.k == deny
                };
            Instruction {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: if notify {
                    libc::SECCOMP_RET_USER_NOTIF
                } else {
                    i.k
                },
            }
        })
        .collect()
}

/// The errno the supervisor answers a notified syscall with: what the compiled filter would
/// have returned for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answers {
    /// The policy's errno (default deny and argument mismatches).
    pub deny: i32,
    /// Syscall numbers from here on are newer than the policy's review (or foreign ABIs
    /// such as x32): the filter answers them ENOSYS.
    pub unreviewed_from: Option<u32>,
}

impl Answers {
    /// The answers of the policy compiler's filter for `arch` with policy errno `deny`.
    pub fn new(arch: Arch, deny: i32) -> Self {
        let unreviewed_from = arch
            .syscall_number(agent_sandbox_policy::seccomp::allowlist::REVIEWED_THROUGH)
            .and_then(|nr| u32::try_from(nr + 1).ok());
        Self {
            deny,
            unreviewed_from,
        }
    }

    /// The errno for syscall `nr` (the kernel compares numbers unsigned).
    pub fn errno_for(&self, nr: i32) -> i32 {
        match self.unreviewed_from {
            Some(from) if nr.cast_unsigned() >= from => libc::ENOSYS,
            _ => self.deny,
        }
    }
}

/// The supervisor's listening socket: its descriptor number in the supervisor.
const LISTENER_FD: i32 = agent_sandbox_sys::inherit::FIRST_FD;
/// The dead-man pipe's write end (`--dead-man`): its descriptor number in the supervisor.
const DEAD_MAN_FD: i32 = LISTENER_FD + 1;

/// A supervisor started by [`start`] whose ready line has not been read yet.
pub struct Starting(sidecars::Pending);

fn spawn_error(e: sidecars::SpawnError) -> SyscallAuditError {
    match e {
        sidecars::SpawnError::Spawn(source) => SyscallAuditError::Spawn(source),
        sidecars::SpawnError::File(e) => SyscallAuditError::File(e),
        sidecars::SpawnError::NotReady { reason } => SyscallAuditError::NotReady { reason },
    }
}

/// Starts the sandbox's supervisor without waiting for it. Everything an executor depends
/// on is done here, before it returns: the socket listens (so [`connect`] succeeds at once
/// and the listeners queue until the supervisor accepts), and the kernel audit log is
/// subscribed (so the Landlock probe of the init, which may run before the supervisor is
/// up, is already delivered to it) and its verdict saved. The supervisor inherits both
/// sockets; its own start-up (exec, audit log) runs beside libcontainer's create, and
/// [`Starting::ready`] checks it afterwards. With `dead_man` (the write end of the pipe the
/// sandbox's reaper watches) the supervisor is the sandbox's helper: it holds that end, the
/// only one, for as long as it lives, and the wall clock is armed in it at `start`.
pub fn start(
    root: &Path,
    sandbox_dir: &SandboxDir,
    id: &str,
    errno: u32,
    dead_man: Option<OwnedFd>,
) -> Result<Starting, SyscallAuditError> {
    let listen_err = |source| SyscallAuditError::Listen {
        path: sandbox_dir.seccomp_socket(),
        source,
    };
    let _ = std::fs::remove_file(sandbox_dir.seccomp_socket());
    let server = socket_path(sandbox_dir)
        .and_then(|(_dir, path)| UnixListener::bind(&path))
        .map_err(listen_err)?;
    // Only the runtime's own user may connect (the sandbox dir is never mounted into a
    // container; this is defence in depth against other host users).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            sandbox_dir.seccomp_socket(),
            std::fs::Permissions::from_mode(0o600),
        )
        .map_err(listen_err)?;
    }
    // Landlock denials: subscribe to the kernel audit log if the kernel can report them.
    let (kernel, fs_status) = match KernelAudit::open() {
        Ok(k) => (
            Some(k),
            FsAuditStatus {
                active: true,
                reason: None,
            },
        ),
        Err(status) => (None, status),
    };
    if let Some(reason) = &fs_status.reason {
        tracing::warn!(id, layer = "fs_denied", %reason, "fs_denied reporting inactive");
    }
    fs_status
        .save(sandbox_dir)
        .map_err(SyscallAuditError::FsAudit)?;
    let errno = errno.to_string();
    let mut args: Vec<&OsStr> = vec![
        "--root".as_ref(),
        root.as_os_str(),
        "seccomp-supervise".as_ref(),
        "--errno".as_ref(),
        errno.as_ref(),
    ];
    let mut fds = vec![OwnedFd::from(server)];
    if let Some(w) = dead_man {
        args.push("--dead-man".as_ref());
        fds.push(w);
    }
    if let Some(k) = kernel {
        args.push("--kernel-audit".as_ref());
        fds.push(k.into_fd());
    }
    // The id stays last: `sidecars::stop` recognises its process by it.
    args.push(id.as_ref());
    sidecars::start(&args, &sandbox_dir.supervisor_pid(), fds)
        .map(Starting)
        .map_err(spawn_error)
}

impl Starting {
    /// Writes the init's pid on the supervisor's stdin (its exit ends the supervisor, see
    /// [`supervise`]) and waits for its ready line; returns its pid.
    pub fn ready(self, init: i32) -> Result<u32, SyscallAuditError> {
        self.0.ready(Some(&init.to_string())).map_err(spawn_error)
    }
}

/// Kills the supervisor (at delete), if it still is this sandbox's. `WasDead` means it died:
/// one that ended on its own (after its init) removed its pid file.
pub fn stop(sandbox_dir: &SandboxDir, id: &str) -> sidecars::Stopped {
    // SIGTERM first: the supervisor writes the denials its rate limits still count.
    sidecars::stop_after(
        &sandbox_dir.supervisor_pid(),
        "seccomp-supervise",
        id,
        std::time::Duration::from_secs(1),
    )
}

/// `start` of a sandbox whose supervisor is its helper: arms the wall clock of `seconds`
/// in it, handing it a pidfd of the init (the timer ends with the init).
pub fn arm_wall_clock(
    sandbox_dir: &SandboxDir,
    seconds: u64,
    init: std::os::fd::BorrowedFd<'_>,
) -> Result<(), SyscallAuditError> {
    let stream = connect(sandbox_dir)?;
    seccomp_notify::send_fd(stream.as_fd(), init, Handover::WallClock { seconds }).map_err(
        |source| SyscallAuditError::Connect {
            path: sandbox_dir.seccomp_socket(),
            source,
        },
    )
}

/// The supervisor ends: the denials its rate limits left out since the last record they
/// counted into are written as one `summary` record, so no count is lost at delete.
fn write_pending(log: &AuditLog, id: &str, syscalls: &mut RateLimit, files: &mut RateLimit) {
    let mut tally = agent_sandbox_audit::Tally::default();
    tally.add("syscall_denied", syscalls.take_suppressed());
    tally.add("fs_denied", files.take_suppressed());
    if let Some(summary) = tally.take(agent_sandbox_audit::SummaryCause::Rate)
        && let Err(e) = log.append(&summary)
    {
        tracing::error!(id, error = %e, "cannot write the pending denial counts");
    }
}

/// The socket's path through a descriptor of the sandbox dir (`/proc/self/fd/N/seccomp.sock`):
/// a rootless state dir plus a 64-character id exceeds `sun_path`'s 108 bytes. The returned
/// file must stay open while the path is used.
fn socket_path(sandbox_dir: &SandboxDir) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(sandbox_dir.path())?;
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}/{}",
        dir.as_raw_fd(),
        SandboxDir::SECCOMP_SOCKET
    ));
    Ok((dir, path))
}

/// A stream to the sandbox's supervisor, for one executor to send its listener over.
pub fn connect(sandbox_dir: &SandboxDir) -> Result<OwnedFd, SyscallAuditError> {
    let err = |source| SyscallAuditError::Connect {
        path: sandbox_dir.seccomp_socket(),
        source,
    };
    let (_dir, path) = socket_path(sandbox_dir).map_err(err)?;
    UnixStream::connect(&path).map(OwnedFd::from).map_err(err)
}

/// The name of syscall `nr` on `arch` (the `syscalls` crate's kernel-generated tables).
fn syscall_name(arch: Arch, nr: i32) -> Option<String> {
    let nr = usize::try_from(nr).ok()?;
    match arch {
        Arch::X86_64 => syscalls::x86_64::Sysno::new(nr).map(|s| s.name().to_owned()),
        Arch::Aarch64 => syscalls::aarch64::Sysno::new(nr).map(|s| s.name().to_owned()),
    }
}

fn proc_text(pid: u32, what: &str) -> Option<String> {
    if what == "exe" {
        return std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.display().to_string());
    }
    std::fs::read_to_string(format!("/proc/{pid}/{what}"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// How long the supervisor serves on after the sandbox's init exited: the kernel audit
/// records of its last processes' Landlock denials arrive after their exit.
const AFTER_INIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What ends the supervisor besides `delete`'s SIGTERM, so that it never outlives its
/// sandbox (a caller that removes the state root without `delete`, a killed init): the
/// init's exit. `create` writes the init's pid on the supervisor's stdin once libcontainer
/// made it ([`Starting::ready`]); stdin closed without a pid means the create died before.
enum InitEnd {
    /// Reading the pid from stdin (a copy of descriptor 0).
    Reading(std::fs::File, Vec<u8>),
    Watching(sidecars::InitWatch),
    /// A kernel without pidfds: `delete` ends the supervisor, as before.
    Unwatched,
    /// The init is gone; the supervisor ends at this instant.
    At(Instant),
}

impl InitEnd {
    /// The descriptor to poll for this state.
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            InitEnd::Reading(stdin, _) => Some(stdin.as_fd()),
            InitEnd::Watching(w) => Some(w.as_fd()),
            InitEnd::Unwatched | InitEnd::At(_) => None,
        }
    }

    /// Its descriptor polled ready.
    fn on_ready(&mut self, id: &str) {
        use std::io::Read as _;
        match self {
            InitEnd::Reading(stdin, buf) => {
                let mut chunk = [0u8; 32];
                match stdin.read(&mut chunk) {
                    Ok(0) | Err(_) => {
                        let text = String::from_utf8_lossy(buf);
                        *self = match text.trim().parse::<i32>().map(sidecars::InitWatch::open) {
                            Ok(Ok(Some(w))) => InitEnd::Watching(w),
                            Ok(Err(e)) => {
                                tracing::debug!(id, error = %e, "no pidfd for the init: the supervisor ends at delete");
                                InitEnd::Unwatched
                            }
                            // Gone already, or no pid: the create did not finish.
                            Ok(Ok(None)) | Err(_) => InitEnd::At(Instant::now() + AFTER_INIT),
                        };
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            InitEnd::Watching(_) => {
                tracing::debug!(id, "the sandbox's init exited: the supervisor ends");
                *self = InitEnd::At(Instant::now() + AFTER_INIT);
            }
            InitEnd::Unwatched | InitEnd::At(_) => {}
        }
    }

    fn due(&self, now: Instant) -> bool {
        matches!(self, InitEnd::At(at) if now >= *at)
    }
}

/// What makes the supervisor the sandbox's helper (ARCHITECTURE.md, "One helper per
/// sandbox"), beside answering denials.
pub struct Helper<'a> {
    /// `--dead-man`: descriptor 4 is the dead-man pipe's write end, held until the end.
    pub dead_man: bool,
    /// Removed when the supervisor ends on its own (after its init): a pid file left with
    /// no process behind it then means the helper died (recorded at delete).
    pub pid_file: &'a Path,
    /// Called when `start` arms the wall clock: its seconds and a pidfd of the init.
    pub arm: &'a mut dyn FnMut(u64, OwnedFd),
}

/// The supervisor's body: listens on `sandbox_dir/seccomp.sock`, reports ready on stdout,
/// then answers and records notifications until killed or until its sandbox's init has
/// exited ([`InitEnd`]).
pub fn supervise(
    log: &Path,
    id: &str,
    errno: i32,
    arch: Arch,
    kernel_audit: bool,
    cap: u64,
    helper: Helper<'_>,
) -> Result<(), SyscallAuditError> {
    let mut sup = Supervisor::open(log, id, errno, arch, kernel_audit, cap, helper)?;
    println!("{READY}");
    // Nothing else goes to stdout: the runtime closed its end after the ready line.
    loop {
        let Some(ready) = sup.poll()? else {
            continue;
        };
        if sup.ends(&ready) {
            sup.finish();
            return Ok(());
        }
        // Notifications first: a caller is waiting for each.
        sup.answer_notifications(&ready.listeners);
        let now = Instant::now();
        let mut found = sup.take_handovers(&ready.streams, now);
        found.extend(sup.read_kernel(ready.kernel, now));
        sup.record(found, now);
        if ready.server.contains(nix::poll::PollFlags::POLLIN) {
            sup.accept();
        }
    }
}

/// The supervisor between two polls: its descriptors, the executors' streams and the
/// notification listeners they handed over, and what its records are counted against.
struct Supervisor<'a, 'h> {
    id: &'a str,
    arch: Arch,
    server: UnixListener,
    /// Held, never written, until this process ends: its end is the reaper's EOF.
    _dead_man: Option<OwnedFd>,
    kernel: Option<KernelAudit>,
    /// `stop` sends SIGTERM: it arrives as a readable descriptor in the poll.
    term: Option<nix::sys::signalfd::SignalFd>,
    log: AuditLog,
    streams: Vec<Stream>,
    listeners: Vec<OwnedFd>,
    bucket: RateLimit,
    fs_bucket: RateLimit,
    /// The denials' share of the log's cap (their own rate limits are the buckets above).
    gate: Gate,
    tracker: LandlockTracker,
    names: HashMap<i32, String>,
    answers: Answers,
    init_end: InitEnd,
    helper: Helper<'h>,
}

/// Which of the supervisor's descriptors one poll found ready, in [`Supervisor::poll`]'s
/// order.
struct Ready {
    server: nix::poll::PollFlags,
    streams: Vec<nix::poll::PollFlags>,
    listeners: Vec<nix::poll::PollFlags>,
    kernel: Option<nix::poll::PollFlags>,
    term: Option<nix::poll::PollFlags>,
    end: Option<nix::poll::PollFlags>,
}

impl<'a, 'h> Supervisor<'a, 'h> {
    /// Takes the descriptors `start` handed over (before anything else can open one) and
    /// opens the log; a failure is printed as the reason the runtime reads instead of the
    /// ready line.
    fn open(
        log: &Path,
        id: &'a str,
        errno: i32,
        arch: Arch,
        kernel_audit: bool,
        cap: u64,
        helper: Helper<'h>,
    ) -> Result<Self, SyscallAuditError> {
        let not_ready = |e: SyscallAuditError| {
            // The runtime reads this line as the reason (stderr goes nowhere).
            println!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
            e
        };
        let inherited =
            |fd| agent_sandbox_sys::inherit::take_fd(fd).map_err(SyscallAuditError::Inherited);
        let server = UnixListener::from(inherited(LISTENER_FD).map_err(not_ready)?);
        let dead_man = if helper.dead_man {
            Some(inherited(DEAD_MAN_FD).map_err(not_ready)?)
        } else {
            None
        };
        let kernel = if kernel_audit {
            let fd = DEAD_MAN_FD + i32::from(helper.dead_man);
            Some(KernelAudit::from_fd(inherited(fd).map_err(not_ready)?))
        } else {
            None
        };
        let log = AuditLog::open(log, id)
            .map_err(SyscallAuditError::Audit)
            .map_err(not_ready)?;
        let init_end = match std::io::stdin().as_fd().try_clone_to_owned() {
            Ok(fd) => InitEnd::Reading(fd.into(), Vec::new()),
            Err(_) => InitEnd::Unwatched,
        };
        Ok(Self {
            id,
            arch,
            server,
            _dead_man: dead_man,
            kernel,
            term: sigterm_fd(),
            log,
            streams: Vec::new(),
            listeners: Vec::new(),
            bucket: RateLimit::new(),
            fs_bucket: RateLimit::new(),
            gate: Gate::new(cap, Instant::now()),
            tracker: LandlockTracker::default(),
            names: HashMap::new(),
            answers: Answers::new(arch, errno),
            init_end,
            helper,
        })
    }

    /// Waits for a descriptor to be ready, or for a deadline; `None` when a signal broke
    /// the wait.
    fn poll(&self) -> Result<Option<Ready>, SyscallAuditError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = vec![PollFd::new(self.server.as_fd(), PollFlags::POLLIN)];
        fds.extend(
            self.streams
                .iter()
                .map(|s| PollFd::new(s.stream.as_fd(), PollFlags::POLLIN)),
        );
        fds.extend(
            self.listeners
                .iter()
                .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
        );
        if let Some(k) = &self.kernel {
            fds.push(PollFd::new(k.as_fd(), PollFlags::POLLIN));
        }
        if let Some(t) = &self.term {
            fds.push(PollFd::new(t.as_fd(), PollFlags::POLLIN));
        }
        if let Some(e) = self.init_end.fd() {
            fds.push(PollFd::new(e, PollFlags::POLLIN));
        }
        // Pending kernel events, waiting probes and the end after the init have deadlines.
        let timeout = if self.tracker.busy() || matches!(self.init_end, InitEnd::At(_)) {
            PollTimeout::from(100u8)
        } else {
            PollTimeout::NONE
        };
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => return Ok(None),
            Err(e) => return Err(SyscallAuditError::Poll(e)),
        }
        let flags: Vec<PollFlags> = fds
            .iter()
            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
            .collect();
        let (first, rest) = flags.split_at(1);
        let (s, rest) = rest.split_at(self.streams.len());
        let (l, rest) = rest.split_at(self.listeners.len());
        let (k, rest) = rest.split_at(usize::from(self.kernel.is_some()));
        let (t, e) = rest.split_at(usize::from(self.term.is_some()));
        Ok(Some(Ready {
            server: first[0],
            streams: s.to_vec(),
            listeners: l.to_vec(),
            kernel: k.first().copied(),
            term: t.first().copied(),
            end: e.first().copied(),
        }))
    }

    /// Whether the supervisor ends now: `stop`'s SIGTERM, or the init's end (then on its
    /// own, not died: see [`Helper::pid_file`]).
    fn ends(&mut self, ready: &Ready) -> bool {
        use nix::poll::PollFlags;
        if ready.end.is_some_and(|f| !f.is_empty()) {
            self.init_end.on_ready(self.id);
        }
        let ended = self.init_end.due(Instant::now());
        if ended {
            let _ = std::fs::remove_file(self.helper.pid_file);
        }
        ready.term.is_some_and(|f| f.contains(PollFlags::POLLIN)) || ended
    }

    /// The last records: what the rate limits and the cap counted.
    fn finish(&mut self) {
        write_pending(&self.log, self.id, &mut self.bucket, &mut self.fs_bucket);
        if let Err(e) = self.gate.finish(&self.log) {
            tracing::error!(id = self.id, error = %e, "cannot write the denials counted after the cap");
        }
    }

    /// Answers each pending notification with its errno, recording it as the rate limit
    /// lets through; drops the listeners whose filter is gone.
    fn answer_notifications(&mut self, ready: &[nix::poll::PollFlags]) {
        use nix::poll::PollFlags;
        let mut gone = Vec::new();
        for (i, flags) in ready.iter().enumerate() {
            if flags.contains(PollFlags::POLLIN) {
                self.answer_one(i);
            } else if flags.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                gone.push(i);
            }
        }
        for i in gone.into_iter().rev() {
            self.listeners.remove(i);
        }
    }

    /// Answers the notification pending on listener `i`.
    fn answer_one(&mut self, i: usize) {
        let listener = self.listeners[i].as_fd();
        let Ok(n) = seccomp_notify::receive(listener) else {
            return;
        };
        // The caller waits for the answer, so its /proc entries are stable until then:
        // read them first (only for records the rate limit lets through), check the
        // notification is still pending (the pid was not reused), then answer.
        let record = self.bucket.take(Instant::now());
        let who = record.then(|| (proc_text(n.pid, "comm"), proc_text(n.pid, "exe")));
        let valid = seccomp_notify::id_valid(listener, n.id);
        let errno = self.answers.errno_for(n.nr);
        let answered = seccomp_notify::deny(listener, n.id, errno);
        let Some((comm, exe)) = who.filter(|_| valid && answered.is_ok()) else {
            return;
        };
        let event = Event::SyscallDenied {
            syscall: name_of(&mut self.names, self.arch, i64::from(n.nr)),
            nr: i64::from(n.nr),
            pid: i32::try_from(n.pid).unwrap_or(-1),
            comm: comm.unwrap_or_default(),
            exe,
            errno: Some(errno),
            suppressed: self.bucket.take_suppressed(),
        };
        if let Err(e) = self.gate.write(&self.log, RecordStream::Kernel, &event) {
            tracing::error!(id = self.id, error = %e, "cannot write a syscall_denied record");
        }
    }

    /// What the executors' streams handed over: a notification listener (with, after a
    /// Landlock probe, the probing process to wait for), or the wall clock to arm. Drops the
    /// streams that ended.
    fn take_handovers(&mut self, ready: &[nix::poll::PollFlags], now: Instant) -> Vec<Found> {
        let mut found = Vec::new();
        let mut gone = Vec::new();
        for (i, flags) in ready.iter().enumerate() {
            if flags.is_empty() {
                continue;
            }
            match seccomp_notify::recv_fd(self.streams[i].stream.as_fd()) {
                Ok(Some(got)) => {
                    if let Handover::WallClock { seconds } = got.what {
                        (self.helper.arm)(seconds, got.fd);
                        continue;
                    }
                    self.listeners.push(got.fd);
                    if let Handover::Probed { port } = got.what {
                        match (got.pid.filter(|p| *p > 0), &self.kernel) {
                            (Some(pid), Some(_)) => {
                                self.streams[i].waiting = Some(pid);
                                found.extend(self.tracker.wait_for(pid, port, now));
                            }
                            // Nothing to wait for: answer at once.
                            _ => self.streams[i].answer(),
                        }
                    }
                }
                Ok(None) | Err(_) => gone.push(i),
            }
        }
        for i in gone.into_iter().rev() {
            self.streams.remove(i);
        }
        found
    }

    /// The kernel audit records read now and what the Landlock tracker makes of them, with
    /// the waits that expired.
    fn read_kernel(&mut self, ready: Option<nix::poll::PollFlags>, now: Instant) -> Vec<Found> {
        let mut found = Vec::new();
        let Some(k) = &self.kernel else {
            return found;
        };
        if ready.is_some_and(|f| f.contains(nix::poll::PollFlags::POLLIN)) {
            let (records, lost) = k.drain(256);
            if lost {
                tracing::warn!(
                    id = self.id,
                    "kernel audit records were dropped for this reader"
                );
            }
            for r in &records {
                found.extend(self.tracker.feed(r, now));
            }
        }
        found.extend(self.tracker.expire(now));
        found
    }

    /// Records what the tracker found (the filesystem denials as their rate limit lets
    /// through) and lets the executors it names go on.
    fn record(&mut self, found: Vec<Found>, now: Instant) {
        for f in found {
            let event = match f {
                Found::Denied(d) => {
                    if !self.fs_bucket.take(now) {
                        continue;
                    }
                    Event::FsDenied {
                        path: d.path,
                        access: d.access,
                        pid: d.pid,
                        comm: d.comm,
                        exe: d.exe,
                        syscall: d
                            .syscall_nr
                            .map(|nr| name_of(&mut self.names, self.arch, nr)),
                        domain: Some(d.domain),
                        suppressed: self.fs_bucket.take_suppressed(),
                    }
                }
                Found::Unrecorded { count, .. } => {
                    // Reported with the next record, like what the rate limit leaves out.
                    self.fs_bucket.add_suppressed(count);
                    continue;
                }
                Found::Claimed { pid, .. } => {
                    answer(&mut self.streams, pid);
                    continue;
                }
                Found::TimedOut { pid } => {
                    answer(&mut self.streams, pid);
                    Event::LayerInactive {
                        layer: "fs_denied".to_owned(),
                        reason: format!(
                            "no kernel audit record named the Landlock domain of process {pid} in time; its filesystem denials are not recorded"
                        ),
                    }
                }
            };
            let written = match RecordStream::of(&event) {
                Some(stream) => self.gate.write(&self.log, stream, &event).map(drop),
                None => self.log.append(&event).map(drop),
            };
            if let Err(e) = written {
                tracing::error!(id = self.id, error = %e, kind = event.kind(), "cannot write a record");
            }
        }
    }

    /// A new executor's stream.
    fn accept(&mut self) {
        if let Ok((s, _)) = self.server.accept() {
            // The executor sends its credentials; the kernel shows them only to a receiver
            // that asked for them.
            let _ = seccomp_notify::pass_credentials(s.as_fd());
            self.streams.push(Stream {
                stream: s,
                waiting: None,
            });
        }
    }
}

/// SIGTERM blocked and read from a descriptor (none if that fails: `stop` then kills).
fn sigterm_fd() -> Option<nix::sys::signalfd::SignalFd> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.thread_block().ok()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()
}

/// One executor's stream, and the pid of the creator waiting on it for its probe answer.
struct Stream {
    stream: UnixStream,
    waiting: Option<i32>,
}

impl Stream {
    /// Lets the waiting executor go on (one byte; it ignores what).
    fn answer(&mut self) {
        use std::io::Write;
        let _ = (&self.stream).write_all(b"k");
        self.waiting = None;
    }
}

/// Answers the stream whose executor `pid` waits.
fn answer(streams: &mut [Stream], pid: i32) {
    if let Some(s) = streams.iter_mut().find(|s| s.waiting == Some(pid)) {
        s.answer();
    }
}

/// The cached name of syscall `nr`.
fn name_of(names: &mut HashMap<i32, String>, arch: Arch, nr: i64) -> String {
    let Ok(key) = i32::try_from(nr) else {
        return format!("syscall {nr}");
    };
    names
        .entry(key)
        .or_insert_with(|| syscall_name(arch, key).unwrap_or_else(|| format!("syscall {nr}")))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_deny_becomes_a_notification() {
        use seccompiler::sock_filter;
        let ret = u16::try_from(libc::BPF_RET | libc::BPF_K).unwrap();
        let eperm = libc::SECCOMP_RET_ERRNO | 1;
        let prog = vec![
            sock_filter {
                code: ret,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_KILL_PROCESS,
            },
            sock_filter {
                code: ret,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ERRNO | 38,
            },
            sock_filter {
                code: ret,
                jt: 0,
                jf: 0,
                k: eperm,
            },
            // A load whose constant happens to equal the deny value is not a return.
            sock_filter {
                code: u16::try_from(libc::BPF_LD | libc::BPF_IMM).unwrap(),
                jt: 0,
                jf: 0,
                k: eperm,
            },
            sock_filter {
                code: ret,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ALLOW,
            },
        ];
        let ks: Vec<u32> = notify_program(&prog, 1).iter().map(|i| i.k).collect();
        assert_eq!(
            ks,
            [
                libc::SECCOMP_RET_KILL_PROCESS,
                libc::SECCOMP_RET_ERRNO | 38,
                libc::SECCOMP_RET_USER_NOTIF,
                eperm,
                libc::SECCOMP_RET_ALLOW
            ]
        );
    }

    /// On the real compiled policy: the allowlist's deny and the unreviewed-syscall answer
    /// are notified, clone3's compatibility ENOSYS is not, whatever the policy's errno.
    #[test]
    fn the_unreviewed_answer_is_notified_and_clone3_stays_in_the_kernel() {
        use agent_sandbox_policy::seccomp::{DenyErrno, compile_bpf};
        let arch = Arch::host().unwrap();
        let mut policy = agent_sandbox_policy::SandboxPolicy::builtin("agent")
            .unwrap()
            .syscalls;
        for errno in [DenyErrno::Eperm, DenyErrno::Enosys] {
            policy.errno = errno;
            let bpf = compile_bpf(&policy, arch).unwrap();
            let prog = notify_program(&bpf, policy.errno.number());
            let enosys = libc::SECCOMP_RET_ERRNO | 38;
            let clone3 = u32::try_from(arch.syscall_number("clone3").unwrap()).unwrap();
            let from = Answers::new(arch, 1).unreviewed_from.unwrap();
            let ret_after = |code: u16, k: u32| {
                prog.windows(2)
                    .find(|w| w[0].code == code && w[0].k == k && w[1].code == RET_K)
                    .map(|w| w[1].k)
            };
            assert_eq!(ret_after(JEQ_K, clone3), Some(enosys), "{errno:?}");
            assert_eq!(
                ret_after(JGE_K, from),
                Some(libc::SECCOMP_RET_USER_NOTIF),
                "{errno:?}"
            );
            let notified = prog
                .iter()
                .filter(|i| i.code == RET_K && i.k == libc::SECCOMP_RET_USER_NOTIF)
                .count();
            assert!(notified >= 2, "{errno:?}: {notified}");
            // Nothing else changed.
            assert_eq!(prog.len(), bpf.len());
        }
    }

    #[test]
    fn answers_keep_the_errno_the_filter_would_give() {
        let arch = Arch::X86_64;
        let a = Answers::new(arch, libc::EPERM);
        assert_eq!(a.unreviewed_from, Some(470));
        assert_eq!(a.errno_for(250), libc::EPERM);
        assert_eq!(a.errno_for(1000), libc::ENOSYS);
        // x32 numbers have bit 30 set: above every reviewed number.
        assert_eq!(a.errno_for(0x4000_0000 | 250), libc::ENOSYS);
    }

    #[test]
    fn syscall_numbers_name_the_syscall() {
        assert_eq!(syscall_name(Arch::X86_64, 250).as_deref(), Some("keyctl"));
        assert_eq!(syscall_name(Arch::Aarch64, 219).as_deref(), Some("keyctl"));
        assert_eq!(syscall_name(Arch::X86_64, -1), None);
    }
}

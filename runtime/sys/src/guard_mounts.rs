//! Small mounts placed in a created container's mount namespace from the host side, with
//! a few raw system calls each: the read-only placeholders over HOME's protected names and
//! the tmpfs directories that hold them (`agent_sandbox_policy::harden::split_home_guards`).
//!
//! libcontainer's generic path checks every mount again (a procfs handle, a `readlink` per
//! component of the source, several resolutions of the destination): about 80 calls a bind.
//! Here each of the runtime's own placeholders is cloned once on the host side
//! (`open_tree(OPEN_TREE_CLONE)` and `mount_setattr`), and a forked child joins the init's
//! user and mount namespaces (`setns` through a pidfd, then ids 0 there, as the init is
//! while it mounts) and places the guards: a placeholder's clone at its first guard, a
//! clone of that attached mount at each of the others. [`start`] returns once the child is
//! forked, so the caller ties the sidecars to the init meanwhile; [`Placing::wait`] gives
//! the verdict. The path to the scratch area holding HOME is opened once, beneath the
//! init's root (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, a link of the image
//! resolved inside it as libcontainer resolved it when it mounted the scratch area); from
//! there on every directory is a descriptor: each mount point is made in its parent's
//! descriptor with `O_NOFOLLOW` (and `O_EXCL` for a file), each tmpfs's children go into
//! the descriptor of its new mount, and each mount is attached with `move_mount` from one
//! descriptor to another. No name is looked up twice and none through a link, so nothing
//! planted can redirect a guard; nothing of the sandbox runs yet either (its init waits for
//! `start`, which its caller must not allow before the verdict). The mounts are what
//! libcontainer would have made: same types, flags, options, owners and modes, tmpfs
//! superblocks of the sandbox's user namespace.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Why the guards could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum GuardMountError {
    #[error("{path} is not an absolute, normal path without NUL bytes")]
    BadPath { path: PathBuf },
    #[error("{path} has no mount of a directory it lies in among the guards")]
    NoParent { path: PathBuf },
    #[error("cannot open {what} of the init (pid {pid})")]
    Init {
        what: &'static str,
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("cannot clone the mount of {path}")]
    Clone {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the process that places the guards")]
    Fork(#[source] io::Error),
    #[error("cannot enter the init's user and mount namespaces")]
    Enter(#[source] io::Error),
    #[error("cannot {stage} {path} in the sandbox")]
    Place {
        stage: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the process that places the guards ended without a verdict")]
    Lost,
}

/// One mount to place, destination absolute in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardMount {
    pub dest: PathBuf,
    pub kind: GuardKind,
}

/// What a guard mount is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardKind {
    /// A new tmpfs named `source` with these `key=value` options (`mode`, `uid`, `gid`,
    /// `size`).
    Tmpfs {
        source: String,
        options: Vec<(String, String)>,
    },
    /// A clone of the host mount at `source` (a file or a directory), not recursive.
    Bind { source: PathBuf },
}

/// `MOUNT_ATTR_*` bits (linux/mount.h) a guard may ask for.
pub const ATTR_RDONLY: u64 = 0x1;
pub const ATTR_NOSUID: u64 = 0x2;
pub const ATTR_NODEV: u64 = 0x4;
pub const ATTR_NOEXEC: u64 = 0x8;

/// A guard mount with the attributes its options set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub mount: GuardMount,
    pub attrs: u64,
}

// linux/mount.h and linux/openat2.h constants the libc crate may lack.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Where a guard's mount point is made: beneath a path from the init's root, or in the
/// directory an earlier guard mounted.
enum Parent {
    Root(usize),
    Guard(usize),
}

enum What {
    Tmpfs {
        options: Vec<(CString, CString)>,
        attrs: u64,
    },
    /// A bind of `Plan::sources[source]`.
    Bind { source: usize, dir: bool },
}

struct Op {
    parent: Parent,
    leaf: CString,
    what: What,
}

/// What the child needs, made before the fork: it only makes system calls on it.
struct Plan {
    /// The components of the paths (from the init's root) of parents no guard mounts.
    roots: Vec<Vec<CString>>,
    /// One host-side clone per placeholder and attributes, whatever the number of guards
    /// bound from it: the child attaches it at the first of them and clones that attached
    /// mount, in the sandbox's namespace, for each of the others (a clone keeps the
    /// attributes and the peer group of its original, so each still is the mount
    /// libcontainer made).
    sources: Vec<OwnedFd>,
    ops: Vec<Op>,
}

/// The stages the child reports a failure in (the high 16 bits of its verdict).
const RESOLVE: i32 = 0;
const MAKE_POINT: i32 = 1;
const OPEN_POINT: i32 = 2;
const TMPFS: i32 = 3;
const MOUNT: i32 = 4;
const ENTER: i32 = 5;
const CLONE: i32 = 6;
const STAGES: [&str; 7] = [
    "resolve the directory of",
    "make the mount point",
    "open the mount point",
    "create the tmpfs for",
    "mount",
    "enter the namespaces for",
    "clone the placeholder for",
];

/// The child placing the guards, started by [`start`] so that the caller goes on meanwhile;
/// [`Placing::wait`] gives its verdict. Dropped without it, the child is killed and reaped:
/// a create that fails elsewhere leaves no process behind.
#[must_use = "the guards are in place only once `wait` says so"]
pub struct Placing {
    /// The child and the pipe its verdict comes through; `None` with no guard to place.
    child: Option<(nix::unistd::Pid, std::fs::File)>,
    /// The guards' destinations, to name the one a failure is about.
    dests: Vec<PathBuf>,
}

impl Placing {
    /// Waits for the child's verdict: `Ok` once every guard is in place.
    pub fn wait(mut self) -> Result<(), GuardMountError> {
        let Some((child, mut pipe)) = self.child.take() else {
            return Ok(());
        };
        let mut out = [0u8; 8];
        let read = pipe.read_exact(&mut out);
        reap(child);
        read.map_err(|_| GuardMountError::Lost)?;
        let code = i32::from_ne_bytes([out[0], out[1], out[2], out[3]]);
        let index = u32::from_ne_bytes([out[4], out[5], out[6], out[7]]);
        verdict(code, index, &self.dests)
    }
}

impl Drop for Placing {
    fn drop(&mut self) {
        if let Some((child, _)) = self.child.take() {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            reap(child);
        }
    }
}

/// Waits for our own child `child` to end (it stays ours until reaped: no pid reuse).
fn reap(child: nix::unistd::Pid) {
    while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(child, None) {}
}

/// The child's verdict as a result: 0, or the stage (high 16 bits) and errno (low 16 bits)
/// of its failure at the guard `index`.
fn verdict(code: i32, index: u32, dests: &[PathBuf]) -> Result<(), GuardMountError> {
    if code == 0 {
        return Ok(());
    }
    let (stage, errno) = (code >> 16, code & 0xffff);
    let source = io::Error::from_raw_os_error(errno);
    if stage == ENTER {
        return Err(GuardMountError::Enter(source));
    }
    let path = dests
        .get(usize::try_from(index).unwrap_or(usize::MAX))
        .cloned()
        .unwrap_or_default();
    let stage = STAGES
        .get(usize::try_from(stage).unwrap_or(usize::MAX))
        .copied()
        .unwrap_or("place");
    Err(GuardMountError::Place {
        stage,
        path,
        source,
    })
}

/// Starts placing `guards`, in order (a directory's mount before the mounts in it), in the
/// mount namespace of the created container whose init is `pid`: the sources are cloned
/// here, then a child places them while the caller goes on. Nothing of the sandbox may run
/// before [`Placing::wait`] has returned `Ok`.
pub fn start(pid: i32, guards: &[Guard]) -> Result<Placing, GuardMountError> {
    let dests: Vec<PathBuf> = guards.iter().map(|g| g.mount.dest.clone()).collect();
    if guards.is_empty() {
        return Ok(Placing { child: None, dests });
    }
    let pidfd = crate::pidfd_exit::open(pid).map_err(|source| GuardMountError::Init {
        what: "a pidfd",
        pid,
        source,
    })?;
    let root = std::fs::File::open(format!("/proc/{pid}/root"))
        .map(OwnedFd::from)
        .map_err(|source| GuardMountError::Init {
            what: "the root",
            pid,
            source,
        })?;
    // The pidfd pins the process: alive now, the root opened above was its own.
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) of one valid pollfd for no time; a pidfd polls readable once its
    // process has exited.
    let exited = unsafe { libc::poll(&mut poll, 1, 0) } != 0;
    if exited {
        return Err(GuardMountError::Init {
            what: "the root",
            pid,
            source: io::Error::from_raw_os_error(libc::ESRCH),
        });
    }
    let plan = plan(guards)?;
    let child = spawn_child(&pidfd, &root, &plan)?;
    Ok(Placing {
        child: Some(child),
        dests,
    })
}

fn cstring(path: &Path, bytes: &[u8]) -> Result<CString, GuardMountError> {
    CString::new(bytes).map_err(|_| GuardMountError::BadPath {
        path: path.to_owned(),
    })
}

/// The normal components of an absolute path; `None` for `.`, `..` or a relative path.
fn normal(path: &Path) -> Option<Vec<&std::ffi::OsStr>> {
    let mut parts = Vec::new();
    for (i, c) in path.components().enumerate() {
        match c {
            Component::RootDir if i == 0 => {}
            Component::Normal(n) => parts.push(n),
            _ => return None,
        }
    }
    (path.is_absolute() && !parts.is_empty()).then_some(parts)
}

fn plan(guards: &[Guard]) -> Result<Plan, GuardMountError> {
    // Per source: its path, the attributes of its clone, and whether it is a directory.
    let mut sources: Vec<(&Path, u64, bool)> = Vec::new();
    let mut clones = Vec::new();
    let mut roots: Vec<(PathBuf, Vec<CString>)> = Vec::new();
    let mut ops = Vec::with_capacity(guards.len());
    for (i, g) in guards.iter().enumerate() {
        let dest = &g.mount.dest;
        let bad = || GuardMountError::BadPath { path: dest.clone() };
        let parts = normal(dest).ok_or_else(bad)?;
        let leaf = cstring(dest, parts[parts.len() - 1].as_bytes())?;
        let parent_path = dest.parent().ok_or_else(bad)?;
        // The latest earlier tmpfs at the parent holds it; else a path from the root.
        let by_guard = guards[..i].iter().rposition(|e| {
            e.mount.dest == parent_path && matches!(e.mount.kind, GuardKind::Tmpfs { .. })
        });
        let parent = match by_guard {
            Some(j) => Parent::Guard(j),
            None if guards[..i].iter().any(|e| dest.starts_with(&e.mount.dest)) => {
                return Err(GuardMountError::NoParent { path: dest.clone() });
            }
            None => {
                let at = match roots.iter().position(|(p, _)| p == parent_path) {
                    Some(at) => at,
                    None => {
                        let walk = parts[..parts.len() - 1]
                            .iter()
                            .map(|p| cstring(dest, p.as_bytes()))
                            .collect::<Result<_, _>>()?;
                        roots.push((parent_path.to_owned(), walk));
                        roots.len() - 1
                    }
                };
                Parent::Root(at)
            }
        };
        let what = match &g.mount.kind {
            GuardKind::Tmpfs { source, options } => What::Tmpfs {
                options: std::iter::once(("source", source))
                    .chain(options.iter().map(|(k, v)| (k.as_str(), v)))
                    .map(|(k, v)| Ok((cstring(dest, k.as_bytes())?, cstring(dest, v.as_bytes())?)))
                    .collect::<Result<_, GuardMountError>>()?,
                attrs: g.attrs,
            },
            GuardKind::Bind { source } => {
                let known = sources
                    .iter()
                    .position(|(p, a, _)| *p == source.as_path() && *a == g.attrs);
                let at = match known {
                    Some(at) => at,
                    None => {
                        let (tree, dir) = clone_source(source, g.attrs)?;
                        clones.push(tree);
                        sources.push((source, g.attrs, dir));
                        sources.len() - 1
                    }
                };
                What::Bind {
                    source: at,
                    dir: sources[at].2,
                }
            }
        };
        ops.push(Op { parent, leaf, what });
    }
    Ok(Plan {
        roots: roots.into_iter().map(|(_, c)| c).collect(),
        sources: clones,
        ops,
    })
}

/// The detached clone of the placeholder at `source` with `attrs` set, and whether it is
/// a directory.
fn clone_source(source: &Path, attrs: u64) -> Result<(OwnedFd, bool), GuardMountError> {
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(source)
        .map_err(|e| clone_err(source, e))?;
    let dir = file.metadata().map_err(|e| clone_err(source, e))?.is_dir();
    let tree = clone_tree(&OwnedFd::from(file), attrs).map_err(|e| clone_err(source, e))?;
    Ok((tree, dir))
}

fn clone_err(path: &Path, source: io::Error) -> GuardMountError {
    GuardMountError::Clone {
        path: path.to_owned(),
        source,
    }
}

/// A detached clone of the mount of `fd` with `attrs` set, a slave of the mount's peer
/// group as libcontainer's clone from the container's copy of the host's mounts is (a
/// clone of a shared host mount would otherwise join its peer group).
fn clone_tree(fd: &OwnedFd, attrs: u64) -> io::Result<OwnedFd> {
    let raw = open_tree_clone(fd.as_raw_fd());
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(raw) };
    setattr(tree.as_raw_fd(), attrs, libc::MS_SLAVE)?;
    Ok(tree)
}

/// `open_tree(fd, "", OPEN_TREE_CLONE)`: a detached clone of the mount `fd` names (not
/// recursive), or -1 with errno set. Allocates nothing: the guards' child calls it.
fn open_tree_clone(fd: RawFd) -> RawFd {
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `fd` is an open descriptor, the empty C string is static and AT_EMPTY_PATH
    // makes open_tree name the descriptor itself; the caller checks the result.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd,
            c"".as_ptr(),
            libc::c_uint::try_from(flags).unwrap_or(libc::c_uint::MAX),
        )
    };
    RawFd::try_from(r).unwrap_or(-1)
}

/// `mount_setattr` of the detached mount `fd`: sets `attrs` and `propagation`.
fn setattr(fd: RawFd, attrs: u64, propagation: u64) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation,
        userns_fd: 0,
    };
    // SAFETY: `fd` is an open mount descriptor named by the empty path with AT_EMPTY_PATH,
    // and `attr` is a valid mount_attr whose size is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Forks the child that places the plan; returns it and the read end of the pipe its
/// verdict comes through: 0, or the stage (high 16 bits) and errno (low 16 bits) of its
/// failure, then the index of the guard it failed on.
fn spawn_child(
    pidfd: &OwnedFd,
    root: &OwnedFd,
    plan: &Plan,
) -> Result<(nix::unistd::Pid, std::fs::File), GuardMountError> {
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (rd, wr) = nix::unistd::pipe2(cloexec).map_err(|e| GuardMountError::Fork(e.into()))?;
    // Descriptors the child fills, allocated before the fork: the child never allocates.
    let mut fds = ChildFds {
        roots: vec![-1; plan.roots.len()],
        ops: vec![-1; plan.ops.len()],
        placed: vec![-1; plan.sources.len()],
    };
    // SAFETY: the child only makes system calls (setns, setresuid, openat2, mkdirat, openat,
    // fsopen, fsconfig, fsmount, open_tree, move_mount, write, _exit) on memory allocated
    // before the fork, so forking a multi-threaded process is sound.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(GuardMountError::Fork(e.into())),
        Ok(nix::unistd::ForkResult::Child) => {
            let (code, index) = child(pidfd, root, plan, &mut fds);
            let mut out = [0u8; 8];
            out[..4].copy_from_slice(&code.to_ne_bytes());
            out[4..].copy_from_slice(&index.to_ne_bytes());
            // SAFETY: write(2) of a local buffer to the pipe's open write end, then _exit(2),
            // which never returns.
            unsafe {
                libc::write(wr.as_raw_fd(), out.as_ptr().cast(), out.len());
                libc::_exit(0)
            }
        }
        // The write end closes here: the verdict's read sees the end if the child dies.
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok((child, std::fs::File::from(rd))),
    }
}

/// The descriptors the child opens: per path from the root, per guard (a tmpfs's root, or
/// its mount point) and per source (its mount once attached at its first guard).
struct ChildFds {
    roots: Vec<RawFd>,
    ops: Vec<RawFd>,
    placed: Vec<RawFd>,
}

/// The last errno as a verdict of `stage`.
fn failed(stage: i32) -> i32 {
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    (stage << 16) | (errno & 0xffff)
}

/// The child's body: enters the namespaces, then places each guard. Returns its verdict
/// and the index of the guard it stopped at.
fn child(pidfd: &OwnedFd, root: &OwnedFd, plan: &Plan, fds: &mut ChildFds) -> (i32, u32) {
    // SAFETY: setns(2) with an open pidfd and namespace flags; setresgid/setresuid(2) take
    // plain ids. The child is single-threaded, as joining a user namespace requires.
    let entered = unsafe {
        libc::setns(pidfd.as_raw_fd(), libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0
            && libc::syscall(libc::SYS_setresgid, 0, 0, 0) == 0
            && libc::syscall(libc::SYS_setresuid, 0, 0, 0) == 0
    };
    if !entered {
        return (failed(ENTER), 0);
    }
    for (i, op) in plan.ops.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let dir = match op.parent {
            Parent::Guard(j) => fds.ops[j],
            Parent::Root(r) => {
                if fds.roots[r] < 0 {
                    fds.roots[r] = resolve(root.as_raw_fd(), &plan.roots[r]);
                }
                fds.roots[r]
            }
        };
        if dir < 0 {
            return (failed(RESOLVE), index);
        }
        let target = match mount_point(dir, op) {
            Ok(fd) => fd,
            Err(stage) => return (failed(stage), index),
        };
        // A tmpfs's children go into the new mount (its descriptor names its root), not
        // into the directory beneath it.
        match attach(plan, op, target, &mut fds.placed) {
            Ok(Some(mount)) => fds.ops[i] = mount,
            Ok(None) => fds.ops[i] = target,
            Err(stage) => return (failed(stage), index),
        }
    }
    (0, 0)
}

/// The directory at `walk` beneath `root`, each component made (0755) where missing, as
/// libcontainer makes a mount point's parents. A symbolic link of the image on the way is
/// resolved as libcontainer resolved it when it mounted the scratch area there: beneath the
/// root (`RESOLVE_IN_ROOT`: `..` and absolute targets stop at it), never through a magic
/// link of /proc.
fn resolve(root: RawFd, walk: &[CString]) -> RawFd {
    let how = OpenHow {
        flags: u64::try_from(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC).unwrap_or(0),
        mode: 0,
        resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    let open = |dir: RawFd, name: &CString| {
        // SAFETY: openat2(2) with an open directory, a NUL-terminated name and a valid
        // open_how whose size is passed; the result is checked by the caller.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        RawFd::try_from(r).unwrap_or(-1)
    };
    let mut dir = root;
    for name in walk {
        let mut next = open(dir, name);
        if next < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            // SAFETY: mkdirat(2) with an open directory and a NUL-terminated name.
            if unsafe { libc::mkdirat(dir, name.as_ptr(), 0o755) } != 0 {
                return -1;
            }
            next = open(dir, name);
        }
        if next < 0 {
            return -1;
        }
        dir = next;
    }
    dir
}

/// Makes (or finds) the mount point of `op` in `dir`, never through a link; returns an fd.
fn mount_point(dir: RawFd, op: &Op) -> Result<RawFd, i32> {
    let is_dir = match op.what {
        What::Tmpfs { .. } => true,
        What::Bind { dir, .. } => dir,
    };
    if is_dir {
        // SAFETY: mkdirat(2) and openat(2) with an open directory and a NUL-terminated name.
        unsafe {
            if libc::mkdirat(dir, op.leaf.as_ptr(), 0o755) != 0
                && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
            {
                return Err(MAKE_POINT);
            }
            let fd = libc::openat(
                dir,
                op.leaf.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(OPEN_POINT);
            }
            Ok(fd)
        }
    } else {
        // SAFETY: openat(2) with an open directory and a NUL-terminated name.
        unsafe {
            let fd = libc::openat(
                dir,
                op.leaf.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644,
            );
            if fd >= 0 {
                return Ok(fd);
            }
            if io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(MAKE_POINT);
            }
            // There already: a regular file only (a link or anything else is refused).
            let fd = libc::openat(
                dir,
                op.leaf.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(OPEN_POINT);
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(OPEN_POINT);
            }
            Ok(fd)
        }
    }
}

/// Mounts `op` on the mount point `target`: for a tmpfs, the descriptor of its root;
/// the failing stage otherwise. A bind attaches its source's clone at the source's first
/// guard (`placed` then holds it) and a clone of that attached mount at the others.
fn attach(plan: &Plan, op: &Op, target: RawFd, placed: &mut [RawFd]) -> Result<Option<RawFd>, i32> {
    let (mount, new) = match &op.what {
        What::Bind { source, .. } => {
            let first = placed[*source];
            let mount = if first < 0 {
                plan.sources[*source].as_raw_fd()
            } else {
                open_tree_clone(first)
            };
            if mount < 0 {
                return Err(CLONE);
            }
            if first < 0 {
                placed[*source] = mount;
            }
            (mount, false)
        }
        What::Tmpfs { options, attrs } => (new_tmpfs(options, *attrs)?, true),
    };
    // SAFETY: move_mount(2) from a detached mount descriptor onto an open mount point, both
    // named by the empty path with the *_EMPTY_PATH flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(MOUNT);
    }
    Ok(new.then_some(mount))
}

/// A detached tmpfs with `options` and the mount attributes `attrs`; its descriptor.
fn new_tmpfs(options: &[(CString, CString)], attrs: u64) -> Result<RawFd, i32> {
    // SAFETY: fsopen/fsconfig/fsmount(2) with NUL-terminated strings that outlive the
    // calls; every result is checked.
    unsafe {
        let fs = libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC);
        let fs = RawFd::try_from(fs).unwrap_or(-1);
        if fs < 0 {
            return Err(TMPFS);
        }
        for (k, v) in options {
            let r = libc::syscall(
                libc::SYS_fsconfig,
                fs,
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            );
            if r != 0 {
                return Err(TMPFS);
            }
        }
        let r = libc::syscall(
            libc::SYS_fsconfig,
            fs,
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        );
        if r != 0 {
            return Err(TMPFS);
        }
        let m = libc::syscall(libc::SYS_fsmount, fs, FSMOUNT_CLOEXEC, attrs);
        let m = RawFd::try_from(m).unwrap_or(-1);
        if m < 0 {
            return Err(TMPFS);
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpfs(dest: &str) -> Guard {
        Guard {
            mount: GuardMount {
                dest: PathBuf::from(dest),
                kind: GuardKind::Tmpfs {
                    source: "tmpfs".to_owned(),
                    options: vec![],
                },
            },
            attrs: ATTR_NOSUID | ATTR_NODEV,
        }
    }

    fn bind(dest: &Path, source: &Path) -> Guard {
        Guard {
            mount: GuardMount {
                dest: dest.to_owned(),
                kind: GuardKind::Bind {
                    source: source.to_owned(),
                },
            },
            attrs: ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC,
        }
    }

    /// A process in a user and a mount namespace of its own (ids 0 mapped to root), as a
    /// created container's init is, asleep until dropped.
    struct Init(std::process::Child);

    impl Init {
        fn start() -> Self {
            // Owned at once: dropped on the panic below, it is killed and reaped.
            let init = Self(
                std::process::Command::new("unshare")
                    .args([
                        "--user",
                        "--map-root-user",
                        "--mount",
                        "--propagation",
                        "slave",
                    ])
                    .args(["sleep", "60"])
                    .spawn()
                    .expect("unshare(1) runs"),
            );
            let comm = format!("/proc/{}/comm", init.0.id());
            for _ in 0..500 {
                if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep") {
                    return init;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            panic!("unshare never ran sleep in its namespaces");
        }

        fn pid(&self) -> i32 {
            i32::try_from(self.0.id()).unwrap()
        }
    }

    impl Drop for Init {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Three guards of one placeholder file and one of a directory take two host-side
    /// clones; each guard in the init's namespace is read-only, where the same name in the
    /// host's view (no guard) takes a write.
    #[test]
    fn each_placeholder_is_cloned_once_and_every_guard_is_read_only() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (mounts in a namespace of its own)");
        }
        let dir = tempfile::tempdir().unwrap();
        let (file, pdir, home) = (
            dir.path().join("file"),
            dir.path().join("dir"),
            dir.path().join("home"),
        );
        std::fs::write(&file, "").unwrap();
        std::fs::create_dir(&pdir).unwrap();
        std::fs::create_dir(&home).unwrap();
        let mut config = tmpfs(home.join(".config").to_str().unwrap());
        config.mount.kind = GuardKind::Tmpfs {
            source: "tmpfs".to_owned(),
            options: vec![("mode".to_owned(), "0755".to_owned())],
        };
        let files = [".bashrc", ".profile", ".config/git-credentials"].map(|n| home.join(n));
        let mut guards = vec![config];
        guards.extend(files.iter().map(|f| bind(f, &file)));
        guards.push(bind(&home.join(".vscode"), &pdir));
        assert_eq!(
            plan(&guards).unwrap().sources.len(),
            2,
            "one clone per placeholder"
        );
        let init = Init::start();
        start(init.pid(), &guards).unwrap().wait().unwrap();
        let inside = |p: &Path| PathBuf::from(format!("/proc/{}/root{}", init.pid(), p.display()));
        for f in files.iter().chain([&home.join(".vscode/x")]) {
            let err = std::fs::write(inside(f), "x").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{}", f.display());
        }
        std::fs::write(home.join(".bashrc"), "x").expect("the host's view has no guard");
        let mountinfo = std::fs::read_to_string(format!("/proc/{}/mountinfo", init.pid())).unwrap();
        let guarded = mountinfo
            .lines()
            .filter(|l| l.contains(home.to_str().unwrap()))
            .filter(|l| {
                l.split(' ')
                    .nth(5)
                    .unwrap()
                    .starts_with("ro,nosuid,nodev,noexec")
            })
            .count();
        assert_eq!(guarded, 4, "{mountinfo}");
    }

    /// A verdict names the stage and the guard it failed at; entering is its own error.
    #[test]
    fn a_verdict_names_its_stage_errno_and_guard() {
        let dests = [PathBuf::from("/h/a"), PathBuf::from("/h/b")];
        assert!(verdict(0, 0, &dests).is_ok());
        match verdict((CLONE << 16) | libc::EMFILE, 1, &dests) {
            Err(GuardMountError::Place {
                stage,
                path,
                source,
            }) => {
                assert_eq!(
                    (stage, path),
                    ("clone the placeholder for", dests[1].clone())
                );
                assert_eq!(source.raw_os_error(), Some(libc::EMFILE));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            verdict((ENTER << 16) | libc::EPERM, 0, &dests),
            Err(GuardMountError::Enter(_))
        ));
    }

    #[test]
    fn parents_are_earlier_tmpfs_guards_or_paths_from_the_root() {
        let guards = [
            tmpfs("/home/u"),
            tmpfs("/home/u/.config"),
            tmpfs("/home/u/.config/git"),
            tmpfs("/home/v"),
        ];
        let p = plan(&guards).unwrap();
        assert_eq!(p.roots, vec![vec![CString::new("home").unwrap()]]);
        let parents: Vec<String> = p
            .ops
            .iter()
            .map(|o| match o.parent {
                Parent::Root(r) => format!("root{r}"),
                Parent::Guard(g) => format!("guard{g}"),
            })
            .collect();
        assert_eq!(parents, ["root0", "guard0", "guard1", "root0"]);
        assert_eq!(p.ops[2].leaf, CString::new("git").unwrap());
    }

    #[test]
    fn a_guard_beneath_another_without_its_parent_or_an_abnormal_path_is_refused() {
        assert!(matches!(
            plan(&[tmpfs("/home/u"), tmpfs("/home/u/a/b")]),
            Err(GuardMountError::NoParent { .. })
        ));
        for bad in ["/home/../etc", "home/u", "/"] {
            assert!(
                matches!(plan(&[tmpfs(bad)]), Err(GuardMountError::BadPath { .. })),
                "{bad}"
            );
        }
    }
}

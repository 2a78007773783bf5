//! Small mounts placed in a created container's mount namespace from the host side, with
//! a few raw system calls each: the read-only placeholders over HOME's protected names and
//! the tmpfs directories that hold them (`agent_sandbox_policy::harden::split_home_guards`).
//!
//! libcontainer's generic path checks every mount again (a procfs handle, a `readlink` per
//! component of the source, several resolutions of the destination): about 80 calls a bind.
//! Here the binds' sources are the runtime's own placeholders, cloned on the host side
//! (`open_tree(OPEN_TREE_CLONE)` and `mount_setattr`), and a forked child joins the init's
//! user and mount namespaces (`setns` through a pidfd, then ids 0 there, as the init is while
//! it mounts) and places each one. The path to the scratch area holding HOME is opened once,
//! beneath the init's root (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, a link of
//! the image resolved inside it as libcontainer resolved it when it mounted the scratch
//! area); from there on every directory is a descriptor: each mount point is made in its
//! parent's descriptor with `O_NOFOLLOW` (and `O_EXCL` for a file), each tmpfs's children go
//! into the descriptor of its new mount, and each mount is attached with `move_mount` from
//! one descriptor to another. No name is looked up twice and none through a link, so
//! nothing planted can redirect a guard; nothing of the sandbox runs yet either (its init
//! waits for `start`). The mounts are what libcontainer would have made: same types, flags,
//! options, owners and modes, tmpfs superblocks of the sandbox's user namespace.

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
    Bind {
        tree: OwnedFd,
        dir: bool,
    },
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
    ops: Vec<Op>,
}

/// The stages the child reports a failure in.
const STAGES: [&str; 6] = [
    "resolve the directory of",
    "make the mount point",
    "open the mount point",
    "create the tmpfs for",
    "mount",
    "enter the namespaces for",
];

/// Places `guards`, in order (a directory's mount before the mounts in it), in the mount
/// namespace of the created container whose init is `pid`.
pub fn place(pid: i32, guards: &[Guard]) -> Result<(), GuardMountError> {
    if guards.is_empty() {
        return Ok(());
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
    let (code, index) = run_child(&pidfd, &root, &plan)?;
    if code == 0 {
        return Ok(());
    }
    let (stage, errno) = (code >> 16, code & 0xffff);
    let path = guards
        .get(usize::try_from(index).unwrap_or(usize::MAX))
        .map_or_else(PathBuf::new, |g| g.mount.dest.clone());
    let source = io::Error::from_raw_os_error(errno);
    let stage = STAGES
        .get(usize::try_from(stage).unwrap_or(usize::MAX))
        .copied()
        .unwrap_or("place");
    if stage == STAGES[5] {
        return Err(GuardMountError::Enter(source));
    }
    Err(GuardMountError::Place {
        stage,
        path,
        source,
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
    let mut sources: Vec<(PathBuf, OwnedFd, bool)> = Vec::new();
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
                if !sources.iter().any(|(p, _, _)| p == source) {
                    let file = std::fs::File::options()
                        .read(true)
                        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                        .open(source)
                        .map_err(|e| clone_err(source, e))?;
                    let dir = file.metadata().map_err(|e| clone_err(source, e))?.is_dir();
                    sources.push((source.clone(), OwnedFd::from(file), dir));
                }
                let (_, fd, dir) = sources
                    .iter()
                    .find(|(p, _, _)| p == source)
                    .ok_or_else(bad)?;
                What::Bind {
                    tree: clone_tree(fd, g.attrs).map_err(|e| clone_err(source, e))?,
                    dir: *dir,
                }
            }
        };
        ops.push(Op { parent, leaf, what });
    }
    Ok(Plan {
        roots: roots.into_iter().map(|(_, c)| c).collect(),
        ops,
    })
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
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `fd` is an open descriptor, the empty C string outlives the call and
    // AT_EMPTY_PATH makes open_tree name the descriptor itself; the result is checked.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::c_uint::try_from(flags).unwrap_or(libc::c_uint::MAX),
        )
    };
    let raw = RawFd::try_from(r).map_err(|_| io::Error::other("descriptor out of range"))?;
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(raw) };
    setattr(tree.as_raw_fd(), attrs, libc::MS_SLAVE)?;
    Ok(tree)
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

/// Forks the child that places the plan; returns its verdict: 0, or the stage (high 16
/// bits) and errno (low 16 bits) of its failure, and the index of the guard it failed on.
fn run_child(pidfd: &OwnedFd, root: &OwnedFd, plan: &Plan) -> Result<(i32, u32), GuardMountError> {
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (rd, wr) = nix::unistd::pipe2(cloexec).map_err(|e| GuardMountError::Fork(e.into()))?;
    // Descriptors the child fills, allocated before the fork: the child never allocates.
    let mut root_fds: Vec<RawFd> = vec![-1; plan.roots.len()];
    let mut op_fds: Vec<RawFd> = vec![-1; plan.ops.len()];
    // SAFETY: the child only makes system calls (setns, setresuid, openat2, mkdirat, openat,
    // fsopen, fsconfig, fsmount, move_mount, mount_setattr, close, write, _exit) on memory
    // allocated before the fork, so forking a multi-threaded process is sound.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(GuardMountError::Fork(e.into())),
        Ok(nix::unistd::ForkResult::Child) => {
            let (code, index) = child(pidfd, root, plan, &mut root_fds, &mut op_fds);
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
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(wr);
            let mut out = [0u8; 8];
            let read = std::fs::File::from(rd).read_exact(&mut out);
            let _ = nix::sys::wait::waitpid(child, None);
            read.map_err(|_| GuardMountError::Lost)?;
            let code = i32::from_ne_bytes([out[0], out[1], out[2], out[3]]);
            let index = u32::from_ne_bytes([out[4], out[5], out[6], out[7]]);
            Ok((code, index))
        }
    }
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
fn child(
    pidfd: &OwnedFd,
    root: &OwnedFd,
    plan: &Plan,
    root_fds: &mut [RawFd],
    op_fds: &mut [RawFd],
) -> (i32, u32) {
    // SAFETY: setns(2) with an open pidfd and namespace flags; setresgid/setresuid(2) take
    // plain ids. The child is single-threaded, as joining a user namespace requires.
    let entered = unsafe {
        libc::setns(pidfd.as_raw_fd(), libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0
            && libc::syscall(libc::SYS_setresgid, 0, 0, 0) == 0
            && libc::syscall(libc::SYS_setresuid, 0, 0, 0) == 0
    };
    if !entered {
        return (failed(5), 0);
    }
    for (i, op) in plan.ops.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let dir = match op.parent {
            Parent::Guard(j) => op_fds[j],
            Parent::Root(r) => {
                if root_fds[r] < 0 {
                    root_fds[r] = resolve(root.as_raw_fd(), &plan.roots[r]);
                }
                root_fds[r]
            }
        };
        if dir < 0 {
            return (failed(0), index);
        }
        let target = match mount_point(dir, op) {
            Ok(fd) => fd,
            Err(stage) => return (failed(stage), index),
        };
        // A tmpfs's children go into the new mount (its descriptor names its root), not
        // into the directory beneath it.
        match attach(op, target) {
            Ok(Some(mount)) => op_fds[i] = mount,
            Ok(None) => op_fds[i] = target,
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
                return Err(1);
            }
            let fd = libc::openat(
                dir,
                op.leaf.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(2);
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
                return Err(1);
            }
            // There already: a regular file only (a link or anything else is refused).
            let fd = libc::openat(
                dir,
                op.leaf.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(2);
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(2);
            }
            Ok(fd)
        }
    }
}

/// Mounts `op` on the mount point `target`: for a tmpfs, the descriptor of its root;
/// the failing stage otherwise.
fn attach(op: &Op, target: RawFd) -> Result<Option<RawFd>, i32> {
    let (mount, new) = match &op.what {
        What::Bind { tree, .. } => (tree.as_raw_fd(), false),
        What::Tmpfs { options, attrs } => {
            // SAFETY: fsopen/fsconfig/fsmount(2) with NUL-terminated strings that outlive
            // the calls; every result is checked.
            unsafe {
                let fs = libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC);
                let Ok(fs) = RawFd::try_from(fs) else {
                    return Err(3);
                };
                if fs < 0 {
                    return Err(3);
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
                        return Err(3);
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
                    return Err(3);
                }
                let m = libc::syscall(libc::SYS_fsmount, fs, FSMOUNT_CLOEXEC, *attrs);
                let Ok(m) = RawFd::try_from(m) else {
                    return Err(3);
                };
                if m < 0 {
                    return Err(3);
                }
                (m, true)
            }
        }
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
        return Err(4);
    }
    Ok(new.then_some(mount))
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

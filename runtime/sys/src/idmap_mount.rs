//! An idmapped, detached, read-only clone of a directory's mount: the workspace's lower
//! layer, seen with its owner's ids swapped for the sandbox user's.
//!
//! `open_tree(OPEN_TREE_CLONE)` copies the mount that holds the directory without
//! attaching it anywhere; `mount_setattr(MOUNT_ATTR_IDMAP)` then gives that copy the id
//! mapping of a user namespace made for the purpose (a child that only unshares its user
//! namespace and waits while its maps are written). Nothing on disk changes: the mapping
//! is a property of this one mount, and the mount is only ever an overlay's lower layer,
//! which overlayfs never writes.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why the idmapped clone could not be made.
#[derive(Debug, thiserror::Error)]
pub enum IdmapMountError {
    #[error("{path} contains a NUL byte")]
    Nul { path: PathBuf },
    #[error("cannot create the user namespace that carries the mapping")]
    Userns(#[source] io::Error),
    #[error("cannot write {file} of the mapping namespace")]
    Map {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot clone the mount of {path}")]
    OpenTree {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot attach the idmapped clone at {path}")]
    Attach {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot idmap the clone of {path} (the filesystem may not support idmapped mounts)")]
    SetAttr {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The largest id count of one user namespace (ids 0..=4294967294; -1 is invalid).
const ALL_IDS: u64 = 4_294_967_295;

/// The lines of a `uid_map`/`gid_map` that is the identity except that `a` and `b` trade
/// places: a bijection, so no id of the filesystem becomes unmapped.
pub fn swap_map(a: u32, b: u32) -> String {
    let (lo, hi) = (u64::from(a.min(b)), u64::from(a.max(b)));
    if lo == hi {
        return format!("0 0 {ALL_IDS}\n");
    }
    let mut lines = Vec::new();
    if lo > 0 {
        lines.push(format!("0 0 {lo}"));
    }
    lines.push(format!("{lo} {hi} 1"));
    if hi - lo > 1 {
        lines.push(format!("{} {} {}", lo + 1, lo + 1, hi - lo - 1));
    }
    lines.push(format!("{hi} {lo} 1"));
    if ALL_IDS - hi > 1 {
        lines.push(format!("{} {} {}", hi + 1, hi + 1, ALL_IDS - hi - 1));
    }
    lines.join("\n") + "\n"
}

/// A user namespace whose maps are `uid_map` and `gid_map`, as an fd of `/proc/PID/ns/user`.
fn userns_with(uid_map: &str, gid_map: &str) -> Result<OwnedFd, IdmapMountError> {
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (ready_r, ready_w) =
        nix::unistd::pipe2(cloexec).map_err(|e| IdmapMountError::Userns(e.into()))?;
    let (done_r, done_w) =
        nix::unistd::pipe2(cloexec).map_err(|e| IdmapMountError::Userns(e.into()))?;
    // SAFETY: the child only calls async-signal-safe functions (unshare, write, read,
    // _exit) on descriptors it owns, so forking a multi-threaded process is sound.
    let child = match unsafe { nix::unistd::fork() } {
        Err(e) => return Err(IdmapMountError::Userns(e.into())),
        Ok(nix::unistd::ForkResult::Child) => {
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let byte = [u8::from(ok)];
            // SAFETY: close(2), write(2) and read(2) on open pipe ends with valid buffers,
            // then _exit(2), which never returns. The child closes its copy of the write end
            // of `done` first, or its read would never see the parent close it.
            unsafe {
                libc::close(done_w.as_raw_fd());
                libc::close(ready_r.as_raw_fd());
                libc::write(ready_w.as_raw_fd(), byte.as_ptr().cast(), 1);
                let mut buf = [0u8; 1];
                libc::read(done_r.as_raw_fd(), buf.as_mut_ptr().cast(), 1);
                libc::_exit(0)
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
    };
    drop(ready_w);
    drop(done_r);
    let result = (|| {
        let mut byte = [0u8; 1];
        std::fs::File::from(ready_r)
            .read_exact(&mut byte)
            .map_err(IdmapMountError::Userns)?;
        if byte[0] != 1 {
            return Err(IdmapMountError::Userns(io::Error::other(
                "the child could not unshare its user namespace",
            )));
        }
        for (name, map) in [("uid_map", uid_map), ("gid_map", gid_map)] {
            let file = PathBuf::from(format!("/proc/{child}/{name}"));
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .and_then(|mut f| f.write_all(map.as_bytes()))
                .map_err(|source| IdmapMountError::Map { file, source })?;
        }
        let ns = std::fs::File::open(format!("/proc/{child}/ns/user"))
            .map_err(IdmapMountError::Userns)?;
        Ok(OwnedFd::from(ns))
    })();
    drop(done_w);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}

/// A detached, read-only, nosuid, nodev clone of the mount at `path` (not its submounts),
/// on which host uid `uid.0` and host uid `uid.1` trade places (gids likewise). Name it as
/// `/proc/self/fd/N`, or [`attach`] it where a kernel needs an attached mount (an overlay
/// layer before 6.15); a detached clone disappears with its last user.
pub fn idmapped_clone(
    path: &Path,
    uid: (u32, u32),
    gid: (u32, u32),
) -> Result<OwnedFd, IdmapMountError> {
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| IdmapMountError::Nul {
        path: path.to_owned(),
    })?;
    let userns = userns_with(&swap_map(uid.0, uid.1), &swap_map(gid.0, gid.1))?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    // SAFETY: `cpath` is a valid NUL-terminated string that outlives the call; the result
    // is checked before it is wrapped.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            cpath.as_ptr(),
            libc::c_uint::try_from(flags).unwrap_or(libc::c_uint::MAX),
        )
    };
    if fd < 0 {
        return Err(IdmapMountError::OpenTree {
            path: path.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    let raw = i32::try_from(fd).map_err(|_| IdmapMountError::OpenTree {
        path: path.to_owned(),
        source: io::Error::other("descriptor out of range"),
    })?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(raw) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP
            | libc::MOUNT_ATTR_RDONLY
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: u64::try_from(userns.as_raw_fd()).unwrap_or(u64::MAX),
    };
    // SAFETY: `tree` is an open mount descriptor, the empty path with AT_EMPTY_PATH names
    // it, and `attr` is a valid mount_attr whose size is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err(IdmapMountError::SetAttr {
            path: path.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(tree)
}

/// Attaches the detached mount `tree` (an [`idmapped_clone`]) at the existing directory `at`.
///
/// Kernels before 6.15 refuse a detached mount as an overlay layer (overlayfs clones each
/// layer with `clone_private_mount`, which there requires a mount of the caller's
/// namespace: EINVAL, e.g. Debian 13's 6.12), so the clone is attached before the overlay
/// is mounted and detached again once the overlay holds its own copy.
pub fn attach(tree: &OwnedFd, at: &Path) -> Result<(), IdmapMountError> {
    let cpath = CString::new(at.as_os_str().as_bytes()).map_err(|_| IdmapMountError::Nul {
        path: at.to_owned(),
    })?;
    // MOVE_MOUNT_F_EMPTY_PATH (linux/mount.h): the source is the descriptor itself.
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    // SAFETY: `tree` is an open mount descriptor named by the empty path with
    // MOVE_MOUNT_F_EMPTY_PATH; `cpath` is a valid NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            cpath.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(IdmapMountError::Attach {
            path: at.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn swap_maps_are_bijections_of_every_id() {
        assert_eq!(swap_map(7, 7), "0 0 4294967295\n");
        let m = swap_map(1000, 1_000_000);
        assert_eq!(
            m,
            "0 0 1000\n1000 1000000 1\n1001 1001 998999\n1000000 1000 1\n1000001 1000001 4293967294\n"
        );
        let total: u64 = m
            .lines()
            .map(|l| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, ALL_IDS);
        assert_eq!(swap_map(0, 5), "0 5 1\n1 1 4\n5 0 1\n6 6 4294967289\n");
    }

    /// Through the clone, the owner's files belong to the other id; on disk nothing changed;
    /// an overlay over the clone copies a file up owned by the mapped id.
    #[test]
    fn the_clone_shows_the_owner_as_the_mapped_id_and_overlay_copies_up_with_it() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (idmapped mounts)");
        }
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        std::fs::create_dir(&lower).unwrap();
        std::fs::write(lower.join("f"), "x").unwrap();
        for p in [lower.clone(), lower.join("f")] {
            std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
        }
        let tree = idmapped_clone(&lower, (1000, 1_234_567), (1000, 1_234_568)).unwrap();
        let seen = std::fs::metadata(format!("/proc/self/fd/{}/f", tree.as_raw_fd())).unwrap();
        assert_eq!((seen.uid(), seen.gid()), (1_234_567, 1_234_568));
        assert_eq!(std::fs::metadata(lower.join("f")).unwrap().uid(), 1000);
        for d in ["upper", "work", "merged"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let data = format!(
            "lowerdir=/proc/self/fd/{},upperdir={},workdir={}",
            tree.as_raw_fd(),
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        let merged = dir.path().join("merged");
        nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(data.as_str()),
        )
        .unwrap();
        drop(tree);
        let wrote = std::fs::OpenOptions::new()
            .append(true)
            .open(merged.join("f"))
            .and_then(|mut f| f.write_all(b"y"));
        let up = std::fs::metadata(dir.path().join("upper/f"));
        nix::mount::umount2(&merged, nix::mount::MntFlags::MNT_DETACH).unwrap();
        wrote.unwrap();
        assert_eq!(
            up.unwrap().uid(),
            1_234_567,
            "copied up with the mapped owner"
        );
        assert_eq!(std::fs::read(lower.join("f")).unwrap(), b"x");
    }

    /// Attached, the clone is a path of this namespace (what an overlay layer must be before
    /// kernel 6.15) that shows the mapped owner, and detaching it leaves the directory empty.
    #[test]
    fn the_attached_clone_shows_the_mapped_owner_at_its_path() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (idmapped mounts)");
        }
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        let at = dir.path().join("at");
        std::fs::create_dir(&lower).unwrap();
        std::fs::create_dir(&at).unwrap();
        std::fs::write(lower.join("f"), "x").unwrap();
        std::os::unix::fs::chown(lower.join("f"), Some(1000), Some(1000)).unwrap();
        let tree = idmapped_clone(&lower, (1000, 1_234_567), (1000, 1_234_568)).unwrap();
        attach(&tree, &at).unwrap();
        drop(tree);
        let seen = std::fs::metadata(at.join("f"));
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let seen = seen.unwrap();
        assert_eq!((seen.uid(), seen.gid()), (1_234_567, 1_234_568));
        assert!(
            mountinfo.contains(&format!(" {} ", at.display())),
            "attached in this namespace"
        );
        assert!(!at.join("f").exists(), "detached again");
    }
}

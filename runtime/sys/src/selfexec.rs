//! The CVE-2019-5736 defence: before the runtime touches a container, it
//! re-executes itself from a copy of its binary that nothing can write.
//!
//! A process inside the container that opens `/proc/<runtime pid>/exe` (and
//! later reopens it for writing) must not reach the host binary. Two ways, the
//! first preferred:
//!
//! 1. A detached, read-only overlayfs mount whose layers are the binary's own
//!    directory and an empty tmpfs (no upper layer, so no write can ever copy up; the
//!    mount belongs to no mount namespace and disappears with its last user). `/proc/PID/exe` then
//!    names a file on that mount: every open for writing fails with EROFS. This
//!    costs a few system calls: the binary's pages come from the page cache.
//! 2. If the overlay cannot be made (no overlayfs, a directory name overlayfs
//!    cannot take, a user namespace that may not mount), a sealed anonymous
//!    memfd copy of the binary (sealed against writes, shrinking and growing).
//!    This copies the whole binary (10 MB) on every call.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, fsconfig_create, fsconfig_set_string, fsmount,
    fsopen,
};

/// Why re-executing from a protected copy failed.
#[derive(Debug, thiserror::Error)]
pub enum SelfExecError {
    #[error("cannot open /proc/self/exe")]
    OpenSelf(#[source] io::Error),
    #[error("cannot create the memfd copy of the runtime")]
    MemfdCreate(#[source] nix::Error),
    #[error("cannot copy the runtime binary into the memfd")]
    Copy(#[source] io::Error),
    #[error("cannot seal the memfd copy of the runtime")]
    Seal(#[source] nix::Error),
    #[error("argument or environment entry contains a NUL byte")]
    Nul(#[source] std::ffi::NulError),
    #[error("cannot execute the protected copy of the runtime")]
    Exec(#[source] nix::Error),
}

/// Why the read-only overlay of the binary's directory could not be made (the
/// caller then falls back to the memfd copy).
#[derive(Debug, thiserror::Error)]
pub enum OverlayExeError {
    #[error("cannot read the link /proc/self/exe")]
    ReadLink(#[source] io::Error),
    #[error("the runtime binary {path} has no usable directory and file name")]
    Unusable { path: PathBuf },
    #[error("overlayfs refused the runtime directory {dir}")]
    Mount {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open {name:?} on the read-only overlay")]
    Open {
        name: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{name:?} on the overlay is not the binary that runs")]
    NotSame { name: PathBuf },
}

/// `OVERLAYFS_SUPER_MAGIC` from `<linux/magic.h>`.
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
/// `ST_RDONLY` in `statfs`'s `f_flags`.
const ST_RDONLY: i64 = 0x0001;

/// The seals that make the copy immutable.
fn required_seals() -> SealFlag {
    SealFlag::F_SEAL_SEAL | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_WRITE
}

/// Whether the running binary already is a protected copy (either kind).
///
/// Decided from what the kernel says about `/proc/self/exe` (its seals, or the
/// file system and mount flags it lives on), not from an environment variable a
/// caller could set.
pub fn running_from_sealed_copy() -> Result<bool, SelfExecError> {
    let exe = File::open("/proc/self/exe").map_err(SelfExecError::OpenSelf)?;
    Ok(is_protected(&exe))
}

fn is_protected<F: AsFd>(file: &F) -> bool {
    is_sealed(file) || on_readonly_overlay(file)
}

fn is_sealed<F: AsFd>(file: &F) -> bool {
    match fcntl(file.as_fd().as_raw_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits).contains(required_seals()),
        // Regular files (and anything that is not a memfd) answer EINVAL.
        Err(_) => false,
    }
}

/// A file on a read-only overlayfs mount: no open for writing can succeed
/// through it (EROFS), and without an upper layer nothing can be copied up.
fn on_readonly_overlay<F: AsFd>(file: &F) -> bool {
    match rustix::fs::fstatfs(file.as_fd()) {
        Ok(st) => st.f_type == OVERLAYFS_SUPER_MAGIC && (st.f_flags & ST_RDONLY) != 0,
        Err(_) => false,
    }
}

/// Adds the required seals. F_SEAL_WRITE fails with EBUSY while the kernel
/// still holds transient extra references to the copy's freshly written pages
/// (seen under load, about once in a few hundred creates); the kernel waits
/// only briefly for them, so retry a bounded number of times before failing.
fn seal(copy: &File) -> Result<(), SelfExecError> {
    const ATTEMPTS: u32 = 100;
    let mut attempt = 1;
    loop {
        match fcntl(
            copy.as_fd().as_raw_fd(),
            FcntlArg::F_ADD_SEALS(required_seals()),
        ) {
            Ok(_) => return Ok(()),
            Err(nix::Error::EBUSY) if attempt < ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(err) => return Err(SelfExecError::Seal(err)),
        }
    }
}

/// Opens the running binary through a new detached, read-only overlayfs mount of
/// its directory. The returned file is checked to be the same inode as `exe`
/// (so a binary replaced on disk meanwhile is not run instead).
pub fn open_on_readonly_overlay(exe: &File) -> Result<File, OverlayExeError> {
    let path = std::fs::read_link("/proc/self/exe").map_err(OverlayExeError::ReadLink)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(OverlayExeError::Unusable { path });
    };
    // overlayfs splits `lowerdir` at ':' and unescapes '\\'; a directory holding
    // either (or a deleted binary, whose link ends in " (deleted)") goes the memfd way.
    let dir_bytes = dir.as_os_str().as_bytes();
    if !dir.is_absolute()
        || dir_bytes.contains(&b':')
        || dir_bytes.contains(&b'\\')
        || dir_bytes.contains(&b',')
    {
        return Err(OverlayExeError::Unusable { path });
    }
    let mount_err = |source: rustix::io::Errno| OverlayExeError::Mount {
        dir: dir.to_owned(),
        source: source.into(),
    };
    // overlayfs wants two lower layers when it has no upper one: the second is an empty,
    // detached tmpfs, named through this process's fd of it.
    let empty = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(mount_err)?;
    fsconfig_create(empty.as_fd()).map_err(mount_err)?;
    let empty = fsmount(
        empty.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY,
    )
    .map_err(mount_err)?;
    let mut lower = dir.as_os_str().to_owned();
    lower.push(format!(":/proc/self/fd/{}", empty.as_raw_fd()));
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(mount_err)?;
    fsconfig_set_string(fs.as_fd(), "lowerdir", &lower).map_err(mount_err)?;
    fsconfig_create(fs.as_fd()).map_err(mount_err)?;
    let mnt = fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY
            | MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(mount_err)?;
    let fd = rustix::fs::openat(
        mnt.as_fd(),
        name,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOFOLLOW,
        rustix::fs::Mode::empty(),
    )
    .map_err(|source| OverlayExeError::Open {
        name: PathBuf::from(name),
        source: source.into(),
    })?;
    let file = File::from(fd);
    let same = match (exe.metadata(), file.metadata()) {
        (Ok(a), Ok(b)) => {
            use std::os::unix::fs::MetadataExt;
            // overlayfs reports its own st_dev, the lower file's inode number.
            a.ino() == b.ino() && a.size() == b.size() && a.mtime_nsec() == b.mtime_nsec()
        }
        _ => false,
    };
    if !same || !on_readonly_overlay(&file) {
        return Err(OverlayExeError::NotSame {
            name: PathBuf::from(name),
        });
    }
    Ok(file)
}

/// A sealed memfd copy of `exe`.
fn sealed_copy(exe: &mut File) -> Result<File, SelfExecError> {
    let memfd: OwnedFd = memfd_create(
        c"agent-sandbox",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(SelfExecError::MemfdCreate)?;
    let mut copy = File::from(memfd);
    io::copy(exe, &mut copy).map_err(SelfExecError::Copy)?;
    seal(&copy)?;
    Ok(copy)
}

/// Re-executes the current binary from a protected copy (the read-only overlay,
/// else a sealed memfd), with the same arguments and environment. Returns
/// `Ok(())` without doing anything when the process already runs from such a
/// copy; otherwise it does not return on success.
pub fn reexec_from_sealed_copy() -> Result<(), SelfExecError> {
    let mut exe = File::open("/proc/self/exe").map_err(SelfExecError::OpenSelf)?;
    if is_protected(&exe) {
        return Ok(());
    }
    let target = match open_on_readonly_overlay(&exe) {
        Ok(file) => file,
        Err(_) => sealed_copy(&mut exe)?,
    };
    exec_fd(&target)
}

fn exec_fd(target: &File) -> Result<(), SelfExecError> {
    let args = std::env::args_os()
        .map(|a| CString::new(a.into_encoded_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(SelfExecError::Nul)?;
    let env = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            CString::new(kv)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(SelfExecError::Nul)?;
    // fexecve (execveat with AT_EMPTY_PATH) of a close-on-exec fd works for ELF
    // binaries (no interpreter needs to reopen the fd), which the runtime is.
    match nix::unistd::fexecve(target.as_fd().as_raw_fd(), &args, &env) {
        Ok(never) => match never {},
        Err(err) => Err(SelfExecError::Exec(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_not_a_sealed_copy() {
        let exe = File::open("/proc/self/exe").unwrap();
        assert!(!is_protected(&exe));
    }

    #[test]
    fn a_sealed_memfd_is_recognised() {
        let fd = memfd_create(c"t", MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        assert!(!is_sealed(&file));
        fcntl(
            file.as_fd().as_raw_fd(),
            FcntlArg::F_ADD_SEALS(required_seals()),
        )
        .unwrap();
        assert!(is_sealed(&file));
        assert!(is_protected(&file));
    }

    /// Needs root (or a user namespace allowed to mount overlayfs), as the runtime.
    #[test]
    fn the_overlay_copy_is_the_same_binary_and_refuses_writes() {
        let exe = File::open("/proc/self/exe").unwrap();
        let copy = open_on_readonly_overlay(&exe).unwrap();
        assert!(is_protected(&copy));
        // Reopening the copy for writing, as CVE-2019-5736 does through
        // /proc/PID/exe, fails: the mount is read-only and has no upper layer.
        let reopen = format!("/proc/self/fd/{}", copy.as_raw_fd());
        let err = std::fs::OpenOptions::new()
            .write(true)
            .open(&reopen)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        // The same reopen of the binary itself (not running from it: a copy in a
        // temporary directory) succeeds: the check above is what protects.
        let dir = tempfile_dir();
        let plain = dir.join("plain");
        std::fs::copy("/proc/self/exe", &plain).unwrap();
        let held = File::open(&plain).unwrap();
        let reopen = format!("/proc/self/fd/{}", held.as_raw_fd());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&reopen)
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("selfexec-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

//! The task's rootfs: containerd's mounts made at `bundle/rootfs`, and undone at delete.
//!
//! A writable overlay (the snapshot's upper and work dirs) is mounted `volatile`. Unmounting
//! a non-volatile overlay syncs its upper layer's whole filesystem (`sync_filesystem` of the
//! ext4 holding `/var/lib/containerd`): every dirty page on that disk, not only the
//! container's, is written before `umount2` returns. That sync sits on the critical path of
//! every `ctr run --rm` and every container removal (measured here: 8-17 ms after 20 MB of
//! unrelated writes, 0.5 s while a build was writing; 2.5 ms with `volatile`). A sandbox's
//! root is read-only inside it (the policy's ceiling), so its upper layer only ever holds
//! the mount points the runtime adds from the host side: nothing worth a sync.
//!
//! Overlayfs marks a volatile work dir (`work/incompat/volatile`) and refuses to mount it
//! again, so that a snapshot whose upper layer may have lost writes in a crash is never
//! reused silently. After a clean unmount nothing was lost, and [`unmount`] removes the
//! mark (the snapshot can run another task); after a crash the mark stays and the next
//! mount of that snapshot fails with overlayfs' error instead of running on a torn layer.
//! A kernel without `volatile` (before 5.10) gets containerd's options unchanged.

use std::path::{Path, PathBuf};

use containerd_shim::protos::types::mount::Mount;
use log::{debug, warn};

/// Lists, one per line, the work dirs mounted volatile for this bundle's rootfs, so that
/// the `delete` action of a shim that was killed can still clear their marks.
const VOLATILE_WORKDIRS: &str = "agent-sandbox-volatile-workdirs";

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot create the rootfs mount point {path}")]
    MountPoint {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount the rootfs at {target}")]
    Mount {
        target: PathBuf,
        #[source]
        source: containerd_shim::Error,
    },
    #[error("cannot record the volatile work dirs in {path}")]
    Record {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The `workdir=` of a writable overlay mount, if this is one and not volatile already.
fn writable_overlay_workdir(m: &Mount) -> Option<&str> {
    if m.type_ != "overlay" {
        return None;
    }
    let mut upper = false;
    let mut workdir = None;
    for o in &m.options {
        if let Some(w) = o.strip_prefix("workdir=") {
            workdir = Some(w);
        } else if o.starts_with("upperdir=") {
            upper = true;
        } else if o == "volatile" || o == "fsync=volatile" {
            return None;
        }
    }
    workdir.filter(|w| upper && Path::new(w).is_absolute())
}

fn mount_one(m: &Mount, options: &[String], target: &Path) -> Result<(), RootfsError> {
    let fs_type = (!m.type_.is_empty()).then_some(m.type_.as_str());
    let source = (!m.source.is_empty()).then_some(m.source.as_str());
    containerd_shim::mount::mount_rootfs(fs_type, source, options, target).map_err(|source| {
        RootfsError::Mount {
            target: target.to_path_buf(),
            source,
        }
    })
}

/// Mounts containerd's `mounts` at `bundle/rootfs`; on an error, what was mounted is undone.
pub fn mount(bundle: &Path, mounts: &[Mount]) -> Result<(), RootfsError> {
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(|source| RootfsError::MountPoint {
        path: target.clone(),
        source,
    })?;
    let mut volatile = Vec::new();
    for m in mounts {
        let done = match writable_overlay_workdir(m) {
            Some(workdir) => {
                let mut options = m.options.clone();
                options.push("volatile".to_owned());
                match mount_one(m, &options, &target) {
                    Ok(()) => {
                        volatile.push(workdir.to_owned());
                        record_volatile(bundle, &volatile)
                    }
                    Err(e) => {
                        debug!("volatile overlay refused, mounting as asked: {e}");
                        mount_one(m, &m.options, &target)
                    }
                }
            }
            None => mount_one(m, &m.options, &target),
        };
        if let Err(e) = done {
            unmount(bundle);
            return Err(e);
        }
    }
    Ok(())
}

fn record_volatile(bundle: &Path, workdirs: &[String]) -> Result<(), RootfsError> {
    let path = bundle.join(VOLATILE_WORKDIRS);
    let mut text = workdirs.join("\n");
    text.push('\n');
    agent_sandbox_sys::atomic_file::write_atomic(&path, text)
        .map_err(|source| RootfsError::Record { path, source })
}

/// Unmounts `bundle/rootfs` and everything below it; once nothing is mounted there any more,
/// clears the volatile marks of the work dirs [`mount`] recorded. Best effort (logged).
pub fn unmount(bundle: &Path) {
    let rootfs = bundle.join("rootfs");
    let Some(target) = rootfs.to_str() else {
        warn!("unmount {}: not UTF-8", rootfs.display());
        return;
    };
    if let Err(e) = containerd_shim::mount::umount_recursive(Some(target), 0) {
        // The overlay may still be in use: its mark stays, as after a crash.
        warn!("unmount {target}: {e}");
        return;
    }
    let record = bundle.join(VOLATILE_WORKDIRS);
    let Ok(text) = std::fs::read_to_string(&record) else {
        return;
    };
    for workdir in text.lines().filter(|l| !l.is_empty()) {
        let mark = volatile_mark(Path::new(workdir));
        match std::fs::remove_dir_all(&mark) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!("clear the volatile mark {}: {e}", mark.display()),
        }
    }
    let _ = std::fs::remove_file(&record);
}

/// Where overlayfs marks a work dir that was mounted volatile.
fn volatile_mark(workdir: &Path) -> PathBuf {
    workdir.join("work").join("incompat").join("volatile")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(options: &[&str]) -> Mount {
        Mount {
            type_: "overlay".to_owned(),
            source: "overlay".to_owned(),
            options: options.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_writable_overlay_with_an_absolute_workdir_is_made_volatile() {
        let rw = overlay(&[
            "index=off",
            "workdir=/s/2/work",
            "upperdir=/s/2/fs",
            "lowerdir=/s/1/fs",
        ]);
        assert_eq!(writable_overlay_workdir(&rw), Some("/s/2/work"));
        let ro = overlay(&["lowerdir=/s/2/fs:/s/1/fs"]);
        assert_eq!(writable_overlay_workdir(&ro), None);
        let already = overlay(&["workdir=/w", "upperdir=/u", "lowerdir=/l", "volatile"]);
        assert_eq!(writable_overlay_workdir(&already), None);
        let relative = overlay(&["workdir=w", "upperdir=u", "lowerdir=l"]);
        assert_eq!(writable_overlay_workdir(&relative), None);
        let bind = Mount {
            type_: "bind".to_owned(),
            source: "/s/2/fs".to_owned(),
            options: vec!["rbind".to_owned(), "rw".to_owned()],
            ..Default::default()
        };
        assert_eq!(writable_overlay_workdir(&bind), None);
    }

    #[test]
    fn the_mark_is_the_one_overlayfs_writes() {
        assert_eq!(
            volatile_mark(Path::new("/s/2/work")),
            PathBuf::from("/s/2/work/work/incompat/volatile")
        );
    }
}

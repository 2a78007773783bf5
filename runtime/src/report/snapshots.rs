//! Workspace snapshots: a change set's upper layer as it was at a checkpoint, kept in the
//! change set's own entry of the root-owned store (`<entry>/snapshots/<digest>/upper`), one
//! per checkpoint image, named by the image's digest (docs/checkpoint.md#what-is-carried).
//!
//! A restore of an image (a fork, a restore in place) starts its workspace from the
//! snapshot of that image, never from the change set as it is at restore time: a sandbox
//! checkpointed with `--leave-running` writes on, and those later writes are not the image's.
//!
//! The copy is taken while CRIU holds the dumped tasks stopped: CRIU runs its action script
//! at `post-dump` after the image is written and before the tasks resume (`--leave-running`)
//! or are killed; the script (`crate::host::criu::ActionScript`) starts the runtime's own
//! binary there with [`HOOK_ENV`] set ([`run_hook`]), which copies the layer into a pending
//! directory; `checkpoint` names it by the digest once it has computed that ([`keep`]). A
//! failed copy fails the hook, and CRIU then fails the dump and leaves the tasks running.
//!
//! The layer is the sandbox's data: it is copied by `cp -a --reflink=auto` (clones where the
//! filesystem can, `FICLONE`, else a plain copy), which never follows a link and keeps owners,
//! modes, hard links, xattrs (`user.overlay.opaque`) and overlay whiteouts (0:0 character
//! devices). A snapshot goes with its change set (discarded, promoted, expired).

use std::path::{Path, PathBuf};

use super::changes::{ChangesError, Entry, run_tool};

/// The directory of an entry that holds its snapshots.
pub const DIR: &str = "snapshots";
/// The variable that makes the runtime's own binary CRIU's action script at a checkpoint:
/// the layer to copy and the pending directory to copy it into, a newline between.
pub const HOOK_ENV: &str = "AGENT_SANDBOX_DUMP_HOOK";

type Result<T> = std::result::Result<T, ChangesError>;

fn store_err(path: &Path, source: std::io::Error) -> ChangesError {
    ChangesError::Store {
        path: path.to_owned(),
        source,
    }
}

/// A new, empty pending directory for a snapshot of the change set whose entry is `entry_dir`
/// (root's, 0700: only the hook, with the runtime's capabilities, writes into it).
pub fn pending(entry_dir: &Path) -> Result<PathBuf> {
    let dir = entry_dir.join(DIR);
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&dir)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(store_err(&dir, e))
            }
        })?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let at = dir.join(format!(".pending-{}-{nanos}", std::process::id()));
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&at)
        .map_err(|e| store_err(&at, e))?;
    Ok(at)
}

/// The value of [`HOOK_ENV`] for copying `upper` into `pending`.
pub fn hook_env(upper: &Path, pending: &Path) -> String {
    format!("{}\n{}", upper.display(), pending.display())
}

/// As CRIU's action script at a checkpoint (run without arguments, [`HOOK_ENV`] set): at
/// `post-dump` the layer is copied, at every other stage nothing. Returns the exit code, or
/// `None` for any other run of the binary.
pub fn run_hook() -> Option<i32> {
    if std::env::args_os().nth(1).is_some() {
        return None;
    }
    let hook = std::env::var(HOOK_ENV).ok()?;
    let action = std::env::var("CRTOOLS_SCRIPT_ACTION").ok()?;
    if action != "post-dump" {
        return Some(0);
    }
    let Some((upper, pending)) = hook.split_once('\n') else {
        eprintln!("agent-sandbox: {HOOK_ENV} is not LAYER\\nPENDING");
        return Some(1);
    };
    match copy_tree(Path::new(upper), &Path::new(pending).join("upper")) {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("agent-sandbox: the workspace snapshot failed: {e}");
            Some(1)
        }
    }
}

/// Copies the tree `from` into `into` (made if missing): `cp -a --reflink=auto`, never
/// following a link.
pub fn copy_tree(from: &Path, into: &Path) -> Result<()> {
    std::fs::create_dir_all(into).map_err(|e| store_err(into, e))?;
    let mut from_dir = from.to_owned().into_os_string();
    from_dir.push("/.");
    run_tool(
        "cp",
        &[
            "-a".as_ref(),
            "--reflink=auto".as_ref(),
            "--".as_ref(),
            from_dir.as_os_str(),
            into.as_os_str(),
        ],
        from,
    )
}

/// The directory name of the snapshot of the image `digest` (`sha256:HEX`, as the runtime
/// computed it): `sha256-HEX`.
fn name(digest: &str) -> String {
    digest
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The snapshot `pending` of the change set at `entry_dir`, now the one of image `digest`
/// (replacing one of the same digest). A pending directory the hook never filled (the dump
/// did not reach `post-dump`) is an error.
pub fn keep(entry_dir: &Path, pending: &Path, digest: &str) -> Result<PathBuf> {
    if !pending.join("upper").is_dir() {
        let _ = std::fs::remove_dir_all(pending);
        return Err(store_err(
            pending,
            std::io::Error::other("CRIU never ran the snapshot hook (post-dump)"),
        ));
    }
    let at = entry_dir.join(DIR).join(name(digest));
    if at.exists() {
        std::fs::remove_dir_all(&at).map_err(|e| store_err(&at, e))?;
    }
    std::fs::rename(pending, &at).map_err(|e| store_err(&at, e))?;
    Ok(at.join("upper"))
}

/// The snapshot of image `digest` in `entry`: its upper layer, if it was kept.
pub fn of_image(entry: &Entry, digest: &str) -> Result<PathBuf> {
    let upper = entry.dir.join(DIR).join(name(digest)).join("upper");
    if std::fs::symlink_metadata(&upper).is_ok_and(|m| m.is_dir()) {
        return Ok(upper);
    }
    Err(ChangesError::NoSnapshot {
        change: entry.record.change.clone(),
        digest: digest.to_owned(),
    })
}

/// The layer `upper` emptied, then made the snapshot `snapshot` again (a restore in place).
pub fn restore_into(snapshot: &Path, upper: &Path) -> Result<()> {
    if let Ok(rd) = std::fs::read_dir(upper) {
        for e in rd.filter_map(|e| e.ok()) {
            let path = e.path();
            let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
                super::changes::remove_tree(&path)
            } else {
                std::fs::remove_file(&path)
            };
            gone.map_err(|source| ChangesError::Remove { path, source })?;
        }
    }
    copy_tree(snapshot, upper)
}

/// Drops pending directories left by checkpoints that failed or were killed.
pub fn drop_pending(entry_dir: &Path) {
    let Ok(rd) = std::fs::read_dir(entry_dir.join(DIR)) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        if e.file_name().to_string_lossy().starts_with(".pending-") {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn entry(dir: &Path) -> Entry {
        Entry {
            dir: dir.to_owned(),
            record: serde_json::from_value(serde_json::json!({
                "change": "abc", "container": "c", "name": null, "entry_point": "runtime",
                "root": "/run/x", "created": 0, "workspace": "/ws", "quota_bytes": null,
                "keep_until": 1, "ended": null, "size_bytes": null,
            }))
            .unwrap(),
        }
    }

    #[test]
    fn a_snapshot_is_the_layer_at_the_copy_kept_by_digest_and_restored_over_later_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/a.txt"), "before").unwrap();
        std::fs::hard_link(upper.join("d/a.txt"), upper.join("link.txt")).unwrap();
        // A link out of the layer is copied as a link, never followed.
        symlink("/etc/shadow", upper.join("out")).unwrap();
        // An overlay whiteout (a 0:0 character device; only root makes one).
        let root = nix::unistd::geteuid().is_root();
        if root {
            nix::sys::stat::mknod(
                &upper.join("gone"),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::empty(),
                0,
            )
            .unwrap();
        }
        let store = tmp.path().join("entry");
        std::fs::create_dir(&store).unwrap();
        let pending = pending(&store).unwrap();
        copy_tree(&upper, &pending.join("upper")).unwrap();
        let digest = "sha256:0123abcd";
        let kept = keep(&store, &pending, digest).unwrap();
        assert_eq!(kept, store.join("snapshots/sha256-0123abcd/upper"));
        assert!(!pending.exists());
        // Later writes of the live layer are not the snapshot's.
        std::fs::write(upper.join("later.txt"), "later").unwrap();
        std::fs::write(upper.join("d/a.txt"), "after").unwrap();
        let e = entry(&store);
        let snap = of_image(&e, digest).unwrap();
        assert_eq!(
            std::fs::read_to_string(snap.join("d/a.txt")).unwrap(),
            "before"
        );
        // A hard link is one file in the copy too.
        assert_eq!(
            std::fs::metadata(snap.join("d/a.txt")).unwrap().ino(),
            std::fs::metadata(snap.join("link.txt")).unwrap().ino()
        );
        assert!(!snap.join("later.txt").exists());
        assert_eq!(
            std::fs::read_link(snap.join("out")).unwrap(),
            Path::new("/etc/shadow")
        );
        if root {
            let w = std::fs::symlink_metadata(snap.join("gone")).unwrap();
            assert!(std::os::unix::fs::FileTypeExt::is_char_device(
                &w.file_type()
            ));
            assert_eq!(w.rdev(), 0);
        }
        restore_into(&snap, &upper).unwrap();
        assert!(!upper.join("later.txt").exists());
        assert!(upper.join("d/a.txt").exists());
        assert!(matches!(
            of_image(&e, "sha256:ffff"),
            Err(ChangesError::NoSnapshot { .. })
        ));
    }

    #[test]
    fn a_pending_snapshot_the_hook_never_filled_is_refused_and_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let p = pending(tmp.path()).unwrap();
        assert!(keep(tmp.path(), &p, "sha256:00").is_err());
        assert!(!p.exists());
        let left = pending(tmp.path()).unwrap();
        drop_pending(tmp.path());
        assert!(!left.exists());
        assert!(tmp.path().join(DIR).is_dir());
    }
}

//! One writer at a time for a container's state.
//!
//! libcontainer rewrites `state.json` in place (truncate, then write) on create, start, kill,
//! pause, resume and delete. containerd runs several of these at once for one container: its
//! exit handler sends `kill --all` while the CRI plugin sends its own kill, and each kill saves
//! the state. Two in-place writes interleave (the shorter one leaves the longer one's tail),
//! and a command reading meanwhile finds an empty file ("EOF while parsing"). Every command
//! that may write the state takes the container's lock here first; commands that only read
//! take no lock (a hook may run `state` while its `create` or `start` holds the lock) and
//! retry a read that finds the file mid-write (`Runtime::load`).
//!
//! The lock is an advisory `flock` on `ROOT/locks/ID.lock`, released when the guard drops or
//! the process dies; `delete` removes the file while it still holds the lock. `create` takes
//! none: the init it forks would inherit the lock's open file until it executes the program
//! (after `start`, which then could never take it), and nothing else acts on a container
//! that its `create` has not yet reported.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::id::ContainerId;

/// How long a command waits for another command on the same container. A hook that runs a
/// writing command on its own container while `start` waits for the hook would otherwise
/// wait forever: after this it fails, naming the lock.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error("cannot open the state lock {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("container {id} is busy: another runtime command held {path} for {waited:?}")]
    Busy {
        id: ContainerId,
        path: PathBuf,
        waited: Duration,
    },
}

/// A held lock on one container's state; released on drop.
#[derive(Debug)]
pub struct StateLock {
    path: PathBuf,
    file: File,
}

/// The lock file of container `id` under the state root.
pub fn path(root: &Path, id: &ContainerId) -> PathBuf {
    root.join("locks").join(format!("{}.lock", id.as_str()))
}

/// Takes container `id`'s state lock, waiting up to `limit` for the command holding it.
pub fn acquire(
    root: &Path,
    id: &ContainerId,
    limit: Duration,
) -> Result<StateLock, StateLockError> {
    let path = path(root, id);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| StateLockError::Open {
            path: dir.to_owned(),
            source,
        })?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| StateLockError::Open {
            path: path.clone(),
            source,
        })?;
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(StateLock { path, file }),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => return Err(StateLockError::Lock { path, source }),
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(StateLockError::Busy {
                id: id.clone(),
                path,
                waited,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

impl StateLock {
    /// Removes the lock file of a deleted container, still holding the lock: a command
    /// waiting on it then finds the container gone.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ContainerId {
        ContainerId::try_from(s).unwrap()
    }

    #[test]
    fn a_second_writer_waits_for_the_first() {
        let root = tempfile::tempdir().unwrap();
        let held = acquire(root.path(), &id("c1"), WAIT_LIMIT).unwrap();
        // Another open file description of the same file, as another process would have.
        let busy = acquire(root.path(), &id("c1"), Duration::from_millis(50)).unwrap_err();
        assert!(
            matches!(&busy, StateLockError::Busy { waited, .. } if *waited >= Duration::from_millis(50)),
            "{busy:?}"
        );
        assert!(busy.to_string().contains("c1.lock"), "{busy}");
        // Other containers are independent.
        drop(acquire(root.path(), &id("c2"), Duration::ZERO).unwrap());
        let root_path = root.path().to_owned();
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            let got = acquire(&root_path, &id("c1"), WAIT_LIMIT).map(drop);
            (got.is_ok(), started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        let (ok, waited) = waiter.join().unwrap();
        assert!(ok);
        assert!(waited >= Duration::from_millis(90), "{waited:?}");
    }

    #[test]
    fn remove_deletes_the_file() {
        let root = tempfile::tempdir().unwrap();
        let lock = acquire(root.path(), &id("gone"), WAIT_LIMIT).unwrap();
        let file = path(root.path(), &id("gone"));
        assert!(file.exists());
        lock.remove();
        assert!(!file.exists());
    }
}

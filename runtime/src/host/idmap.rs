//! Host id ranges for sandbox user namespaces.
//!
//! As real root, every sandbox gets its own block of 65536 host ids, starting at
//! 1_000_000 and stepping by 65536 (slot `n` is `1_000_000 + n * 65536`), so no
//! two sandboxes share an owner and none maps host root. The allocation lives in
//! `R/idmap.json` (container id -> slot), read-modify-written under an exclusive
//! `flock` on `R/idmap.lock`; `delete` releases the slot.
//!
//! Inside podman's rootless user namespace the runtime only owns the ids of that
//! namespace (0 = the invoking user, 1.. = its subordinate ids). The sandbox then
//! maps its root to id 1 of the parent namespace (a subordinate id, never the
//! user itself) and covers as many ids as the parent has left.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::state::ContainerId;

pub const FIRST_HOST_ID: u32 = 1_000_000;
pub const BLOCK: u32 = 65_536;
/// Keeps every block below 2^32 - 1.
pub const MAX_SLOTS: u32 = 60_000;

/// Why an id range could not be allocated.
#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    #[error("cannot open id allocation file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock id allocation file {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot read or write id allocation file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("id allocation file {path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("all {MAX_SLOTS} host id blocks are in use")]
    Exhausted,
    #[error("pod sandbox {owner} holds no host id block")]
    NoPodBlock { owner: String },
    #[error("cannot read /proc/self/uid_map")]
    ReadMap(#[source] std::io::Error),
    #[error("the parent user namespace has no subordinate ids to map (uid_map: {map:?})")]
    NoSubordinateIds { map: String },
}

/// One contiguous mapping: container ids `0..size` -> host (or parent) ids
/// `host_start..host_start+size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdRange {
    pub host_start: u32,
    pub size: u32,
}

struct LockedDb {
    _lock: Flock<File>,
    file: File,
    path: PathBuf,
    slots: BTreeMap<String, u32>,
}

fn open_db(db: &Path, lock: &Path) -> Result<LockedDb, IdMapError> {
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock)
        .map_err(|source| IdMapError::Open {
            path: lock.to_owned(),
            source,
        })?;
    let guard = Flock::lock(lock_file, FlockArg::LockExclusive).map_err(|(_, source)| {
        IdMapError::Lock {
            path: lock.to_owned(),
            source,
        }
    })?;
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(db)
        .map_err(|source| IdMapError::Open {
            path: db.to_owned(),
            source,
        })?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|source| IdMapError::Io {
            path: db.to_owned(),
            source,
        })?;
    let slots = if text.trim().is_empty() {
        BTreeMap::new()
    } else {
        serde_json::from_str(&text).map_err(|source| IdMapError::Corrupt {
            path: db.to_owned(),
            source,
        })?
    };
    Ok(LockedDb {
        _lock: guard,
        file,
        path: db.to_owned(),
        slots,
    })
}

impl LockedDb {
    fn save(mut self) -> Result<(), IdMapError> {
        let text = serde_json::to_string(&self.slots).map_err(|source| IdMapError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        let io = |source| IdMapError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.set_len(0).map_err(io)?;
        self.file.rewind().map_err(io)?;
        self.file.write_all(text.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// Lowest slot not in `used`.
fn first_free(used: impl Iterator<Item = u32>) -> Option<u32> {
    let used: std::collections::BTreeSet<u32> = used.collect();
    (0..MAX_SLOTS).find(|s| !used.contains(s))
}

/// Allocates (or returns the existing) host block for `id` (real root only).
pub fn allocate(db: &Path, lock: &Path, id: &ContainerId) -> Result<IdRange, IdMapError> {
    let mut locked = open_db(db, lock)?;
    let slot = match locked.slots.get(id.as_str()) {
        Some(slot) => *slot,
        None => {
            let slot = first_free(locked.slots.values().copied()).ok_or(IdMapError::Exhausted)?;
            locked.slots.insert(id.as_str().to_owned(), slot);
            slot
        }
    };
    locked.save()?;
    Ok(IdRange {
        host_start: FIRST_HOST_ID + slot * BLOCK,
        size: BLOCK,
    })
}

/// Gives `member` the block of `owner`: a pod's app containers live in the user namespace
/// of the pod's sandbox container. A block stays allocated while any id holds it, so it
/// outlives its owner until the last member is released too.
pub fn join(
    db: &Path,
    lock: &Path,
    member: &ContainerId,
    owner: &ContainerId,
) -> Result<IdRange, IdMapError> {
    let mut locked = open_db(db, lock)?;
    let slot = *locked
        .slots
        .get(owner.as_str())
        .ok_or_else(|| IdMapError::NoPodBlock {
            owner: owner.as_str().to_owned(),
        })?;
    locked.slots.insert(member.as_str().to_owned(), slot);
    locked.save()?;
    Ok(IdRange {
        host_start: FIRST_HOST_ID + slot * BLOCK,
        size: BLOCK,
    })
}

/// Releases the block of `id`; releasing an unknown id is not an error.
pub fn release(db: &Path, lock: &Path, id: &ContainerId) -> Result<(), IdMapError> {
    if !db.exists() {
        return Ok(());
    }
    let mut locked = open_db(db, lock)?;
    if locked.slots.remove(id.as_str()).is_some() {
        locked.save()?;
    }
    Ok(())
}

/// The range to use inside a user namespace we did not create (rootless):
/// container root -> parent id 1, as many ids as the parent namespace holds.
pub fn nested_range() -> Result<IdRange, IdMapError> {
    let map = std::fs::read_to_string("/proc/self/uid_map").map_err(IdMapError::ReadMap)?;
    nested_range_from(&map)
}

fn nested_range_from(map: &str) -> Result<IdRange, IdMapError> {
    // Count ids inside our namespace that are contiguous from 0.
    let mut ranges: Vec<(u64, u64)> = map
        .lines()
        .filter_map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (f.len() == 3).then(|| (f[0], f[2]))
        })
        .collect();
    ranges.sort_unstable();
    let mut end: u64 = 0;
    for (start, len) in ranges {
        if start > end {
            break;
        }
        end = end.max(start + len);
    }
    let avail = end.saturating_sub(1).min(u64::from(BLOCK));
    let size = u32::try_from(avail).unwrap_or(0);
    if size == 0 {
        return Err(IdMapError::NoSubordinateIds {
            map: map.trim().to_owned(),
        });
    }
    Ok(IdRange {
        host_start: 1,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_blocks_per_sandbox_and_release() {
        let dir = tempfile::tempdir().unwrap();
        let (db, lock) = (dir.path().join("db"), dir.path().join("lock"));
        let a = ContainerId::try_from("a").unwrap();
        let b = ContainerId::try_from("b").unwrap();
        let ra = allocate(&db, &lock, &a).unwrap();
        let rb = allocate(&db, &lock, &b).unwrap();
        assert_eq!(ra.host_start, FIRST_HOST_ID);
        assert_eq!(rb.host_start, FIRST_HOST_ID + BLOCK);
        assert_eq!(allocate(&db, &lock, &a).unwrap(), ra);
        release(&db, &lock, &a).unwrap();
        let c = ContainerId::try_from("c").unwrap();
        assert_eq!(allocate(&db, &lock, &c).unwrap().host_start, FIRST_HOST_ID);
    }

    #[test]
    fn pod_members_share_the_block_until_the_last_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let (db, lock) = (dir.path().join("db"), dir.path().join("lock"));
        let id = |s: &str| ContainerId::try_from(s).unwrap();
        assert!(matches!(
            join(&db, &lock, &id("app"), &id("pod")),
            Err(IdMapError::NoPodBlock { .. })
        ));
        let pod = allocate(&db, &lock, &id("pod")).unwrap();
        assert_eq!(join(&db, &lock, &id("app"), &id("pod")).unwrap(), pod);
        // The sandbox goes first (out of order): its member still holds the block.
        release(&db, &lock, &id("pod")).unwrap();
        let other = allocate(&db, &lock, &id("other")).unwrap();
        assert_ne!(other, pod);
        release(&db, &lock, &id("app")).unwrap();
        assert_eq!(allocate(&db, &lock, &id("next")).unwrap(), pod);
    }

    #[test]
    fn nested_range_skips_the_invoking_user() {
        let r = nested_range_from("0 1500 1\n1 100000 65536\n").unwrap();
        assert_eq!(
            r,
            IdRange {
                host_start: 1,
                size: 65536
            }
        );
        assert!(nested_range_from("0 1500 1\n").is_err());
    }
}

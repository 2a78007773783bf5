//! Host id ranges for sandbox user namespaces.
//!
//! As real root, every sandbox gets its own block of 65536 host ids, starting at
//! 1_000_000 and stepping by 65536 (slot `n` is `1_000_000 + n * 65536`), so no
//! two sandboxes share an owner and none maps host root. The allocation lives in
//! `R/idmap.json` (container id -> slot), read-modify-written under an exclusive
//! `flock` on `R/idmap.lock`; `delete` releases the slot. A sandbox checkpointed without
//! `--leave-running` keeps its slot held for its restore in place, with the image directory
//! it was written to in `R/idmap-holds/ID.json`; the next allocation that needs a new slot
//! releases every held slot whose image directory is gone ([`hold_for_checkpoint`]).
//!
//! Inside podman's rootless user namespace the runtime only owns the ids of that
//! namespace (0 = the invoking user, 1.. = its subordinate ids). The sandbox then
//! maps its ids one to one onto that namespace's, from 0: the sandbox's root is the
//! invoking user, the only id that owns the user's checkout where idmapped mounts are
//! out of reach (docs/workspace.md, "Rootless"), and its other ids are subordinate ids.
//! [`parent_root_is_host_root`] and [`maps_host_id_0`] keep "never host root" exact: an
//! id is judged by what it is in the initial namespace, not by its number here.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
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
    #[error("cannot read {path}")]
    ReadMap {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
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

/// For the unit tests: a sandbox's host id block (slot 1) and another one (slot 3), an
/// image's and a fork's.
#[cfg(test)]
pub(crate) const OLD_BLOCK: IdRange = IdRange {
    host_start: 1_065_536,
    size: 65_536,
};
#[cfg(test)]
pub(crate) const NEW_BLOCK: IdRange = IdRange {
    host_start: 1_196_608,
    size: 65_536,
};

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
    fn save(self) -> Result<(), IdMapError> {
        let text = serde_json::to_string(&self.slots).map_err(|source| IdMapError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        let io = |source| IdMapError::Io {
            path: self.path.clone(),
            source,
        };
        // Over the old bytes, then the tail cut: the file keeps its data block. Emptying it
        // first freed that block and allocated a new one on every create and delete, and
        // where the disk is mounted with `discard` (this project's test machine) freeing a
        // block is a synchronous discard: 3-4 ms, and the sync after it 8-12 ms
        // (docs/benchmarks.md). Nor is the file ever empty between the two steps, which
        // would read back as "no block allocated"; a crash between them leaves a tail that
        // fails to parse, and the next create stops on `Corrupt` naming the file.
        let len = u64::try_from(text.len()).map_err(|e| io(std::io::Error::other(e)))?;
        self.file.write_all_at(text.as_bytes(), 0).map_err(io)?;
        self.file.set_len(len).map_err(io)?;
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
            sweep_holds(&mut locked);
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

/// The entry that keeps a checkpointed sandbox's block taken until its restore (`:` is in
/// no container id, so it names no sandbox).
fn checkpoint_key(id: &ContainerId) -> String {
    format!("checkpoint:{id}")
}

/// Where the held blocks' image directories are recorded, beside the allocation file.
fn holds_dir(db: &Path) -> PathBuf {
    db.with_file_name("idmap-holds")
}

/// What a held block waits for: the image directory its checkpoint wrote, as it was then
/// (device and inode: a directory made again at the same path is another one).
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Hold {
    image: PathBuf,
    dev: u64,
    ino: u64,
}

impl Hold {
    fn of(image: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(image)?;
        Ok(Self {
            image: image.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// The image can no longer be restored in place: its directory is gone or another one
    /// (podman removes a container's checkpoint directory with the container, and calls no
    /// runtime for a checkpointed one). Anything else, an unreadable directory included,
    /// keeps the block held.
    fn image_gone(&self) -> bool {
        match Self::of(&self.image) {
            Ok(now) => now.dev != self.dev || now.ino != self.ino,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// At `checkpoint` of `id` (which then ends): its block stays taken after its delete, for
/// the restore in place, whose image (in `image`) holds id maps of that block. Released by
/// that restore, or by [`sweep_holds`] once `image` is gone.
pub fn hold_for_checkpoint(
    db: &Path,
    lock: &Path,
    id: &ContainerId,
    image: &Path,
) -> Result<(), IdMapError> {
    let mut locked = open_db(db, lock)?;
    if let Some(slot) = locked.slots.get(id.as_str()).copied() {
        let hold = Hold::of(image).map_err(|source| IdMapError::Io {
            path: image.to_owned(),
            source,
        })?;
        let dir = holds_dir(db);
        let path = dir.join(format!("{id}.json"));
        let io = |source| IdMapError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let text = serde_json::to_vec(&hold).map_err(|source| IdMapError::Corrupt {
            path: path.clone(),
            source,
        })?;
        crate::state::paths::write_atomic(&path, &text).map_err(io)?;
        locked.slots.insert(checkpoint_key(id), slot);
        locked.save()?;
    }
    Ok(())
}

/// Releases, in `locked`, every checkpoint hold whose image directory is gone (a hold with
/// no record, from a runtime before the records, stays). Returns whether one was released.
fn sweep_holds(locked: &mut LockedDb) -> bool {
    let dir = holds_dir(&locked.path);
    let held: Vec<String> = locked
        .slots
        .keys()
        .filter_map(|k| k.strip_prefix("checkpoint:"))
        .map(str::to_owned)
        .collect();
    let mut released = false;
    for id in held {
        let path = dir.join(format!("{id}.json"));
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let gone = serde_json::from_slice::<Hold>(&text).is_ok_and(|h| h.image_gone());
        if gone {
            locked.slots.remove(&format!("checkpoint:{id}"));
            let _ = std::fs::remove_file(&path);
            tracing::info!(id = %id, "checkpoint image gone: its held host id block released");
            released = true;
        }
    }
    released
}

/// The hold of `id`'s checkpoint, dropped (its restore in place took the block back).
fn drop_hold(locked: &mut LockedDb, id: &ContainerId) {
    if locked.slots.remove(&checkpoint_key(id)).is_some() {
        let _ = std::fs::remove_file(holds_dir(&locked.path).join(format!("{id}.json")));
    }
}

/// At `restore` of `id` from its own image (a restore under another id, a fork, gets a new
/// block from [`allocate`]): the block starting at `host_start` (the image's) when it is
/// free or held for `id`'s checkpoint, else the first free one (and the restore then refuses
/// the image's id maps).
pub fn allocate_for_restore(
    db: &Path,
    lock: &Path,
    id: &ContainerId,
    host_start: u32,
) -> Result<IdRange, IdMapError> {
    let mut locked = open_db(db, lock)?;
    drop_hold(&mut locked, id);
    let want = host_start
        .checked_sub(FIRST_HOST_ID)
        .filter(|off| off % BLOCK == 0)
        .map(|off| off / BLOCK)
        .filter(|slot| *slot < MAX_SLOTS && !locked.slots.values().any(|s| s == slot));
    let slot = match (locked.slots.get(id.as_str()), want) {
        (Some(slot), _) => *slot,
        (None, Some(slot)) => slot,
        (None, None) => first_free(locked.slots.values().copied()).ok_or(IdMapError::Exhausted)?,
    };
    locked.slots.insert(id.as_str().to_owned(), slot);
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

/// The range to use inside a user namespace we did not create (rootless): container ids
/// from 0 onto the parent's from 0 (root is the invoking user), as many as the parent
/// namespace holds contiguously from 0, at most [`BLOCK`].
pub fn nested_range() -> Result<IdRange, IdMapError> {
    nested_range_from(&own_map(IdKind::Uid)?)
}

fn nested_range_from(map: &str) -> Result<IdRange, IdMapError> {
    // Count ids inside our namespace that are contiguous from 0.
    let mut ranges: Vec<(u64, u64)> = extents(map)
        .unwrap_or_default()
        .into_iter()
        .map(|(inside, _, len)| (inside, len))
        .collect();
    ranges.sort_unstable();
    let mut end: u64 = 0;
    for (start, len) in ranges {
        if start > end {
            break;
        }
        end = end.max(start + len);
    }
    // The invoking user alone (no subordinate ids) would leave nothing for the image's
    // other users; podman itself refuses such a namespace for most images.
    if end < 2 {
        return Err(IdMapError::NoSubordinateIds {
            map: map.trim().to_owned(),
        });
    }
    let size = u32::try_from(end.min(u64::from(BLOCK))).unwrap_or(BLOCK);
    Ok(IdRange {
        host_start: 0,
        size,
    })
}

/// Which of the runtime's own id maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Uid,
    Gid,
}

/// The runtime's own id map (`/proc/self/uid_map` or `gid_map`).
pub fn own_map(kind: IdKind) -> Result<String, IdMapError> {
    let path = match kind {
        IdKind::Uid => "/proc/self/uid_map",
        IdKind::Gid => "/proc/self/gid_map",
    };
    std::fs::read_to_string(path).map_err(|source| IdMapError::ReadMap { path, source })
}

/// Id `id` of the runtime's user namespace as a host id (of the initial namespace), through
/// `own_map`; `None` where the map leaves it out.
pub fn to_host(id: u32, own_map: &str) -> Option<u32> {
    let id = u64::from(id);
    extents(own_map)?
        .into_iter()
        .find(|&(inside, _, len)| inside <= id && id < inside + len)
        .and_then(|(inside, outside, _)| u32::try_from(outside + (id - inside)).ok())
}

/// The extents (inside, outside, count) of an id map's text (`/proc/PID/uid_map`); `None`
/// if a line is not three numbers.
pub fn extents(map: &str) -> Option<Vec<(u64, u64, u64)>> {
    map.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            match f[..] {
                [inside, outside, len] => Some((inside, outside, len)),
                _ => None,
            }
        })
        .collect()
}

/// Whether id 0 of the runtime's user namespace is host id 0 (the runtime is real root, or
/// in a namespace that maps host root): read from its own `uid_map` text.
pub fn parent_root_is_host_root(own_map: &str) -> bool {
    maps_host_id_0(&[(0, 1)], own_map)
}

/// Whether any of `ranges` (start, count; ids of the runtime's own user namespace, as a
/// spec's `hostID`s are) is host id 0 in the initial namespace, through `own_map` (the
/// runtime's `uid_map` or `gid_map` text). An id the map leaves out cannot be mapped at all;
/// a line that cannot be read counts as mapping host id 0 (fail closed).
pub fn maps_host_id_0(ranges: &[(u32, u32)], own_map: &str) -> bool {
    let Some(extents) = extents(own_map) else {
        return true;
    };
    // Host id 0 is id `inside` of a line only when the line starts at host 0.
    extents.iter().any(|&(inside, outside, len)| {
        outside == 0
            && len > 0
            && ranges.iter().any(|&(start, count)| {
                let (start, count) = (u64::from(start), u64::from(count));
                count > 0 && start <= inside && inside < start + count
            })
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
    fn a_save_leaves_exactly_the_new_map_in_the_same_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (db, lock) = (dir.path().join("db"), dir.path().join("lock"));
        let ids: Vec<ContainerId> = (0..40)
            .map(|n| {
                ContainerId::try_from(format!("sandbox-with-a-long-name-{n}").as_str()).unwrap()
            })
            .collect();
        for id in &ids {
            allocate(&db, &lock, id).unwrap();
        }
        let inode = std::fs::metadata(&db).unwrap().ino();
        let long = std::fs::metadata(&db).unwrap().len();
        for id in &ids[1..] {
            release(&db, &lock, id).unwrap();
        }
        // One entry left: the file shrank to exactly its JSON, in the same inode.
        let text = std::fs::read_to_string(&db).unwrap();
        let slots: BTreeMap<String, u32> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            slots.into_iter().collect::<Vec<_>>(),
            [(ids[0].to_string(), 0)]
        );
        assert!(u64::try_from(text.len()).unwrap() < long);
        assert_eq!(std::fs::metadata(&db).unwrap().ino(), inode);
        // A tail left by a crash between the write and the cut is refused, never read as
        // fewer allocations.
        std::fs::write(&db, format!("{text}{}", &text[1..])).unwrap();
        assert!(matches!(
            allocate(&db, &lock, &ids[1]),
            Err(IdMapError::Corrupt { .. })
        ));
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
    fn nested_range_starts_at_the_invoking_user() {
        let r = nested_range_from("0 1500 1\n1 100000 65536\n").unwrap();
        assert_eq!(
            r,
            IdRange {
                host_start: 0,
                size: 65536
            }
        );
        let small = nested_range_from("0 1500 1\n1 100000 999\n").unwrap();
        assert_eq!(small.size, 1000);
        assert!(nested_range_from("0 1500 1\n").is_err());
    }

    /// Id 0 of rootless podman's namespace is the invoking user, not host root; as real root
    /// (the identity map) or in a namespace that maps host root, 0 is host root.
    #[test]
    fn host_id_0_is_judged_in_the_initial_namespace() {
        let podman = "         0       1500          1\n         1     100000      65536\n";
        assert!(!parent_root_is_host_root(podman));
        assert!(!maps_host_id_0(&[(0, 65536)], podman));
        let real_root = "         0          0 4294967295\n";
        assert!(parent_root_is_host_root(real_root));
        assert!(maps_host_id_0(&[(0, 1)], real_root));
        assert!(!maps_host_id_0(&[(1_000_000, 65536)], real_root));
        // A namespace whose id 5000 is host root: a range over 5000 maps it.
        let odd = "0 1500 1\n5000 0 1\n";
        assert!(!parent_root_is_host_root(odd));
        assert!(maps_host_id_0(&[(4000, 2000)], odd));
        assert!(!maps_host_id_0(&[(0, 4000)], odd));
        assert_eq!(to_host(0, podman), Some(1500));
        assert_eq!(to_host(2, podman), Some(100_001));
        assert_eq!(to_host(70_000, podman), None);
        // Unreadable text fails closed.
        assert!(maps_host_id_0(&[(1, 1)], "0 x 1\n"));
    }

    #[test]
    fn a_checkpointed_block_waits_for_its_restore() {
        let dir = tempfile::tempdir().unwrap();
        let (db, lock) = (dir.path().join("idmap.json"), dir.path().join("idmap.lock"));
        let a = ContainerId::try_from("a").unwrap();
        let b = ContainerId::try_from("b").unwrap();
        let first = allocate(&db, &lock, &a).unwrap();
        hold_for_checkpoint(&db, &lock, &a, dir.path()).unwrap();
        release(&db, &lock, &a).unwrap();
        // Another sandbox does not get the held block.
        assert_ne!(allocate(&db, &lock, &b).unwrap(), first);
        assert_eq!(
            allocate_for_restore(&db, &lock, &a, first.host_start).unwrap(),
            first
        );
        // Held no longer: released with its sandbox, it is free again.
        release(&db, &lock, &a).unwrap();
        let c = ContainerId::try_from("c").unwrap();
        assert_eq!(allocate(&db, &lock, &c).unwrap(), first);
    }

    /// A held block whose image directory is gone (podman removed the checkpointed
    /// container) is released by the next allocation; one whose image is still there, or
    /// was made again as another directory at its path, is kept or released accordingly.
    #[test]
    fn a_held_block_is_released_once_its_image_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (db, lock) = (dir.path().join("idmap.json"), dir.path().join("idmap.lock"));
        let id = |s: &str| ContainerId::try_from(s).unwrap();
        let image = |s: &str| {
            let p = dir.path().join(s);
            std::fs::create_dir(&p).unwrap();
            p
        };
        let (kept_image, removed_image) = (image("kept"), image("removed"));
        let kept = allocate(&db, &lock, &id("kept")).unwrap();
        let removed = allocate(&db, &lock, &id("removed")).unwrap();
        hold_for_checkpoint(&db, &lock, &id("kept"), &kept_image).unwrap();
        hold_for_checkpoint(&db, &lock, &id("removed"), &removed_image).unwrap();
        release(&db, &lock, &id("kept")).unwrap();
        release(&db, &lock, &id("removed")).unwrap();
        let holds = |want: &[&str]| {
            let text = std::fs::read_to_string(&db).unwrap();
            let slots: BTreeMap<String, u32> = serde_json::from_str(&text).unwrap();
            let got: Vec<&str> = slots
                .keys()
                .filter_map(|k| k.strip_prefix("checkpoint:"))
                .collect();
            assert_eq!(got, want, "{text}");
        };
        // Both images there: a new sandbox gets neither block.
        let other = allocate(&db, &lock, &id("other")).unwrap();
        assert!(other != kept && other != removed);
        holds(&["kept", "removed"]);
        // One removed (podman rm): the next allocation releases its block, and gets it.
        std::fs::remove_dir(&removed_image).unwrap();
        assert_eq!(allocate(&db, &lock, &id("next")).unwrap(), removed);
        holds(&["kept"]);
        assert!(!holds_dir(&db).join("removed.json").exists());
        // The kept one restores in place under its block, and its hold is gone.
        assert_eq!(
            allocate_for_restore(&db, &lock, &id("kept"), kept.host_start).unwrap(),
            kept
        );
        holds(&[]);
        assert!(!holds_dir(&db).join("kept.json").exists());
        // A directory made again at the image's path is not the image (the old one moved
        // away, so the new one cannot get its inode).
        hold_for_checkpoint(&db, &lock, &id("kept"), &kept_image).unwrap();
        release(&db, &lock, &id("kept")).unwrap();
        std::fs::rename(&kept_image, dir.path().join("moved")).unwrap();
        std::fs::create_dir(&kept_image).unwrap();
        allocate(&db, &lock, &id("last")).unwrap();
        holds(&[]);
    }
}

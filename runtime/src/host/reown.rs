//! Re-owning a copied workspace layer into another host id block (a fork's copy of its
//! parent's change set: docs/checkpoint.md#fork).
//!
//! The layer was written by a sandbox, so it is hostile data: the walk never follows a link
//! (every entry is looked at with `lstat` and changed with `lchown`), stays on the layer's
//! filesystem, and is bounded in depth. Nothing else writes to the copy while it runs: it
//! belongs to a sandbox whose processes do not exist yet.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::host::idmap::IdRange;

/// The id inside a sandbox that an owner outside its block becomes: the kernel's overflow
/// id (`nobody`), as the sandbox would see an unmapped owner anyway.
pub const OVERFLOW: u32 = 65_534;
/// Deeper than any path the kernel resolves (`PATH_MAX` / 2).
const MAX_DEPTH: usize = 2048;

/// Errors of re-owning a layer.
#[derive(Debug, thiserror::Error)]
pub enum ReownError {
    #[error("cannot re-own {path} into the sandbox's id block")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is nested deeper than {MAX_DEPTH} directories")]
    TooDeep { path: PathBuf },
}

/// The owner `id` of the old block's layer as an owner in the new block: shifted by the
/// blocks' distance, or the new block's [`OVERFLOW`] id if `id` is outside the old block.
pub fn shifted(id: u32, from: IdRange, to: IdRange) -> u32 {
    let inside = id
        .checked_sub(from.host_start)
        .filter(|off| *off < from.size && *off < to.size)
        .unwrap_or(OVERFLOW.min(to.size.saturating_sub(1)));
    to.host_start.saturating_add(inside)
}

/// Every entry beneath and including `root`, owned by ids of `from`, owned by the same ids
/// of `to` ([`shifted`]); modes (set-id bits, which `chown` clears) kept. Returns how many
/// entries had an owner outside `from` (now [`OVERFLOW`]).
pub fn shift_tree(root: &Path, from: IdRange, to: IdRange) -> Result<u64, ReownError> {
    let dev = lstat(root)?.dev();
    let mut outside = 0;
    let mut stack = vec![(root.to_owned(), 0usize)];
    while let Some((path, depth)) = stack.pop() {
        let meta = lstat(&path)?;
        outside += shift_one(&path, &meta, from, to)?;
        if !meta.file_type().is_dir() || meta.dev() != dev {
            continue;
        }
        if depth >= MAX_DEPTH {
            return Err(ReownError::TooDeep { path });
        }
        let io = |source| ReownError::Io {
            path: path.clone(),
            source,
        };
        for entry in std::fs::read_dir(&path).map_err(io)? {
            stack.push((entry.map_err(io)?.path(), depth + 1));
        }
    }
    Ok(outside)
}

fn lstat(path: &Path) -> Result<std::fs::Metadata, ReownError> {
    std::fs::symlink_metadata(path).map_err(|source| ReownError::Io {
        path: path.to_owned(),
        source,
    })
}

/// One entry re-owned without following it; its mode back as it was (not for a link,
/// whose mode is not its own to set).
fn shift_one(
    path: &Path,
    meta: &std::fs::Metadata,
    from: IdRange,
    to: IdRange,
) -> Result<u64, ReownError> {
    let io = |source| ReownError::Io {
        path: path.to_owned(),
        source,
    };
    let (uid, gid) = (shifted(meta.uid(), from, to), shifted(meta.gid(), from, to));
    let inside = |id: u32| {
        id.checked_sub(from.host_start)
            .is_some_and(|o| o < from.size)
    };
    let outside = u64::from(!inside(meta.uid())) + u64::from(!inside(meta.gid()));
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io)?;
    if !meta.file_type().is_symlink() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(io)?;
    }
    Ok(outside)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::host::idmap::{NEW_BLOCK as NEW, OLD_BLOCK as OLD};

    #[test]
    fn ids_shift_by_the_blocks_distance_and_strangers_become_nobody() {
        assert_eq!(shifted(1_065_536, OLD, NEW), 1_196_608);
        assert_eq!(shifted(1_066_536, OLD, NEW), 1_197_608);
        assert_eq!(shifted(1_131_071, OLD, NEW), 1_262_143);
        for stranger in [0, 1000, 1_065_535, 1_131_072, u32::MAX] {
            assert_eq!(shifted(stranger, OLD, NEW), NEW.host_start + OVERFLOW);
        }
    }

    #[test]
    fn a_tree_is_reowned_without_following_its_links() {
        // Needs root (CAP_CHOWN), as the suite runs: without it the first lchown fails loudly.
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("host-file");
        std::fs::write(&outside, "host").unwrap();
        let layer = dir.path().join("upper");
        std::fs::create_dir_all(layer.join("d/e")).unwrap();
        std::fs::write(layer.join("d/e/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, layer.join("link")).unwrap();
        for p in ["", "d", "d/e", "d/e/f", "link"] {
            let p = layer.join(p);
            std::os::unix::fs::lchown(&p, Some(OLD.host_start + 1000), Some(OLD.host_start))
                .unwrap();
        }
        std::os::unix::fs::lchown(layer.join("d"), Some(0), Some(0)).unwrap();
        // After the chowns, which clear it: a set-id bit the re-owning must keep.
        std::fs::set_permissions(layer.join("d/e/f"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        assert_eq!(shift_tree(&layer, OLD, NEW).unwrap(), 2);
        for p in ["", "d/e", "d/e/f", "link"] {
            let m = std::fs::symlink_metadata(layer.join(p)).unwrap();
            assert_eq!(
                (m.uid(), m.gid()),
                (NEW.host_start + 1000, NEW.host_start),
                "{p}"
            );
        }
        let d = std::fs::symlink_metadata(layer.join("d")).unwrap();
        assert_eq!(d.uid(), NEW.host_start + OVERFLOW);
        let f = std::fs::metadata(layer.join("d/e/f")).unwrap();
        assert_eq!(f.mode() & 0o7777, 0o4755);
        let host = std::fs::metadata(&outside).unwrap();
        assert_eq!((host.uid(), host.gid()), (0, 0), "the link was followed");
    }
}

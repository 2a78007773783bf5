//! What a changed file takes, measured without reading it: its data segments
//! (`SEEK_DATA`/`SEEK_HOLE`; holes are never read, hashed or written) and the change set's
//! footprint on a target that keeps holes and hard links (each file once, however many names
//! it has). `diff`, `export` and `promote` refuse a change set whose footprint is past the
//! sandbox's `workspace_size` before they read any of it (docs/promote.md#size).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};

use crate::scratch::{Change, ChangeKind, FileKind, ScratchError, open_source, size_of};

/// The data segments of a regular file: `(offset, length)` pairs in order, maximal (a hole
/// lies between two of them), together no longer than the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// The file's apparent size.
    pub size: u64,
    /// Its data segments.
    pub segments: Vec<(u64, u64)>,
}

impl Layout {
    /// Maps the data of the open file `fd` of apparent size `size` with `SEEK_DATA` and
    /// `SEEK_HOLE` (a filesystem without them reports the whole file as data).
    pub fn of(fd: BorrowedFd<'_>, size: u64) -> io::Result<Layout> {
        let mut segments = Vec::new();
        let mut pos = 0;
        while pos < size {
            let start = match rustix::fs::seek(fd, SeekFrom::Data(pos)) {
                Ok(s) => s,
                // No data past `pos`: the rest is a hole.
                Err(Errno::NXIO) => break,
                // No hole support at all: everything is data.
                Err(Errno::INVAL) if pos == 0 => {
                    segments.push((0, size));
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            if start >= size {
                break;
            }
            let end = match rustix::fs::seek(fd, SeekFrom::Hole(start)) {
                Ok(e) => e.min(size),
                Err(Errno::NXIO) => size,
                Err(e) => return Err(e.into()),
            };
            if end <= start {
                return Err(io::Error::other(
                    "the file changed while its holes were mapped",
                ));
            }
            segments.push((start, end - start));
            pos = end;
        }
        Ok(Layout { size, segments })
    }

    /// Bytes of data (what a copy that keeps holes reads and writes).
    pub fn data(&self) -> u64 {
        self.segments.iter().map(|(_, len)| len).sum()
    }

    /// Feeds the layout's header to `h`: the apparent size, then the segment count. Each
    /// segment then goes in as its offset, its length and its bytes ([`copy_segments`]), so
    /// the encoding is unambiguous and a hole is never expanded to be hashed.
    fn hash_header(&self, h: &mut Sha256) {
        h.update(b"layout-v1\0");
        h.update(self.size.to_be_bytes());
        h.update((self.segments.len() as u64).to_be_bytes());
    }
}

/// Why [`copy_segments`] stopped.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// Reading the source failed.
    Read(io::Error),
    /// Writing the copy failed.
    Write(io::Error),
    /// The source is not what its layout says any more (it shrank, grew, or its holes moved).
    Changed,
}

/// Reads the data segments `layout` names from `src` (never a hole), feeds them to `hasher`
/// (the layout, then each segment's offset, length and bytes) and writes them at their
/// offsets into `dst`, which is first given the source's length so its holes stay holes.
/// Afterwards the source must still have `layout`: anything else is [`CopyError::Changed`].
pub(crate) fn copy_segments(
    src: &File,
    layout: &Layout,
    hasher: Option<&mut Sha256>,
    dst: Option<&File>,
) -> Result<(), CopyError> {
    if let Some(d) = dst {
        d.set_len(layout.size).map_err(CopyError::Write)?;
    }
    read_segments(src, layout, hasher, |offset, data| match dst {
        Some(d) => d.write_all_at(data, offset),
        None => Ok(()),
    })
}

/// [`copy_segments`] into `sink`, which gets each chunk of data with its offset, in order.
pub(crate) fn read_segments(
    src: &File,
    layout: &Layout,
    mut hasher: Option<&mut Sha256>,
    mut sink: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    if let Some(h) = hasher.as_deref_mut() {
        layout.hash_header(h);
    }
    let mut buf = vec![0u8; 128 * 1024];
    for &(offset, len) in &layout.segments {
        if let Some(h) = hasher.as_deref_mut() {
            h.update(offset.to_be_bytes());
            h.update(len.to_be_bytes());
        }
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from(len - done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let chunk = buf.get_mut(..want).unwrap_or_default();
            let n = match src.read_at(chunk, offset + done) {
                Ok(0) => return Err(CopyError::Changed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(CopyError::Read(e)),
            };
            let data = chunk.get(..n).unwrap_or_default();
            if let Some(h) = hasher.as_deref_mut() {
                h.update(data);
            }
            sink(offset + done, data).map_err(CopyError::Write)?;
            done += n as u64;
        }
    }
    let st = rustix::fs::fstat(src).map_err(|e| CopyError::Read(e.into()))?;
    let after = Layout::of(src.as_fd(), size_of(&st)).map_err(CopyError::Read)?;
    if after != *layout {
        return Err(CopyError::Changed);
    }
    Ok(())
}

/// A changed regular file as measured without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Device and inode: names with the same pair are hard links of one file.
    pub id: (u64, u64),
    /// Its link count.
    pub nlink: u64,
    /// Apparent size.
    pub size: u64,
    /// Bytes of data ([`Layout::data`]).
    pub data: u64,
}

/// What the regular files of a change set take on a target that keeps holes and hard links.
#[derive(Debug, Clone, Default)]
pub struct Footprint {
    /// Bytes of data, each file once however many names it has: what `promote` and
    /// `export --to-dir` read and write.
    pub data: u64,
    /// Apparent bytes, each file once: what a copy that fills holes but keeps links writes
    /// (an `export --to-tar`).
    pub apparent: u64,
    /// Apparent bytes of every name: what a copy that fills holes and breaks links writes.
    pub naive: u64,
    /// Distinct files.
    pub files: u64,
    /// Names of regular files.
    pub names: u64,
    by_path: HashMap<PathBuf, Measured>,
    inside: HashMap<(u64, u64), u64>,
}

impl Footprint {
    /// The measurement of the file at `path`, if it is one of the change set's files.
    pub fn file(&self, path: &Path) -> Option<&Measured> {
        self.by_path.get(path)
    }

    /// How many names of the file `m` the change set holds.
    pub fn names_of(&self, m: &Measured) -> u64 {
        self.inside.get(&m.id).copied().unwrap_or(0)
    }

    /// Refuses a footprint of more than `limit` (`bytes` is [`Footprint::data`] for a copy
    /// that keeps holes, [`Footprint::apparent`] for one that fills them).
    pub fn check(&self, bytes: u64, limit: &SizeLimit) -> Result<(), TooLarge> {
        if bytes > limit.bytes {
            return Err(TooLarge {
                bytes,
                limit: limit.clone(),
                files: self.files,
                names: self.names,
            });
        }
        Ok(())
    }
}

/// Stats every added or modified regular file of `changes` in `upper` and maps its holes,
/// reading none of them.
pub fn measure(
    upper_fd: &OwnedFd,
    upper: &Path,
    changes: &[Change],
) -> Result<Footprint, ScratchError> {
    let mut fp = Footprint::default();
    for c in changes {
        if c.kind == ChangeKind::Deleted || c.file_type != FileKind::File {
            continue;
        }
        let (src, st) = open_source(upper_fd, upper, &c.path)?;
        let size = size_of(&st);
        let layout = Layout::of(src.as_fd(), size).map_err(|source| ScratchError::Io {
            op: "map the holes of",
            path: upper.join(&c.path),
            source,
        })?;
        let m = Measured {
            id: (st.st_dev, st.st_ino),
            nlink: st.st_nlink,
            size,
            data: layout.data(),
        };
        fp.names += 1;
        fp.naive = fp.naive.saturating_add(size);
        let seen = fp.inside.entry(m.id).or_insert(0);
        if *seen == 0 {
            fp.files += 1;
            fp.data = fp.data.saturating_add(m.data);
            fp.apparent = fp.apparent.saturating_add(size);
        }
        *seen += 1;
        fp.by_path.insert(c.path.clone(), m);
    }
    Ok(fp)
}

/// [`measure`] of the changes of the upper dir `upper` (as [`crate::diff`] listed them).
pub fn footprint(upper: &Path, changes: &[Change]) -> Result<Footprint, ScratchError> {
    let fd = crate::scratch::open_root(upper, rustix::fs::OFlags::RDONLY)?;
    measure(&fd, upper, changes)
}

/// The most a review or promotion may write, and where that number comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeLimit {
    /// Bytes.
    pub bytes: u64,
    /// Where it comes from, for the error (`the sandbox's workspace_size`).
    pub source: String,
}

impl SizeLimit {
    /// No limit (tests, and callers that bound the copy themselves).
    pub fn none() -> SizeLimit {
        SizeLimit {
            bytes: u64::MAX,
            source: "no limit".to_owned(),
        }
    }
}

/// A change set past its [`SizeLimit`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the change set would write {} to the target ({files} files, {names} names), more than {}, {}; nothing was read or written (docs/promote.md#size)",
    human(*bytes),
    human(limit.bytes),
    limit.source
)]
pub struct TooLarge {
    /// What it would write.
    pub bytes: u64,
    /// The limit.
    pub limit: SizeLimit,
    /// Distinct files.
    pub files: u64,
    /// Names of regular files.
    pub names: u64,
}

/// `52428800` -> `50.0 MiB (52428800 bytes)`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut unit = 0;
    let mut scaled = bytes;
    while scaled >= 1024 * 1024 && unit + 1 < UNITS.len() {
        scaled /= 1024;
        unit += 1;
    }
    // One decimal from integer arithmetic: tenths of the unit.
    let tenths = (u128::from(bytes) * 10) >> (10 * (unit + 1));
    format!(
        "{}.{} {} ({bytes} bytes)",
        tenths / 10,
        tenths % 10,
        UNITS.get(unit).copied().unwrap_or("PiB")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A 64 MiB sparse file with data at 0, 1 MiB and its last 4 KiB.
    fn sparse(path: &Path) -> io::Result<File> {
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len(64 << 20)?;
        f.write_all_at(&[1u8; 4096], 0)?;
        f.write_all_at(&[2u8; 8192], 1 << 20)?;
        f.write_all_at(&[3u8; 4096], (64 << 20) - 4096)?;
        f.sync_all()?;
        Ok(f)
    }

    #[test]
    fn the_walk_finds_only_the_data_segments() -> TestResult {
        let dir = tempfile::tempdir()?;
        let f = sparse(&dir.path().join("s"))?;
        let l = Layout::of(f.as_fd(), 64 << 20)?;
        assert_eq!(
            l.segments,
            [(0, 4096), (1 << 20, 8192), ((64 << 20) - 4096, 4096)]
        );
        assert_eq!(l.data(), 16384);
        // All hole; and a dense file is one segment.
        let empty = File::create(dir.path().join("e"))?;
        empty.set_len(1 << 30)?;
        assert!(Layout::of(empty.as_fd(), 1 << 30)?.segments.is_empty());
        std::fs::write(dir.path().join("d"), b"dense")?;
        let d = File::open(dir.path().join("d"))?;
        assert_eq!(Layout::of(d.as_fd(), 5)?.segments, [(0, 5)]);
        Ok(())
    }

    #[test]
    fn a_sparse_copy_keeps_its_holes_and_its_bytes() -> TestResult {
        let dir = tempfile::tempdir()?;
        let src = sparse(&dir.path().join("s"))?;
        let layout = Layout::of(src.as_fd(), 64 << 20)?;
        let dst = File::create_new(dir.path().join("copy"))?;
        let mut h = Sha256::new();
        copy_segments(&src, &layout, Some(&mut h), Some(&dst)).map_err(|e| format!("{e:?}"))?;
        dst.sync_all()?;
        let m = std::fs::metadata(dir.path().join("copy"))?;
        assert_eq!(m.len(), 64 << 20);
        assert!(
            m.blocks() * 512 <= 64 * 1024,
            "holes filled: {} blocks",
            m.blocks()
        );
        assert!(std::fs::read(dir.path().join("s"))? == std::fs::read(dir.path().join("copy"))?);
        // The same content with its holes written as zeros is another layout, another hash.
        let dense = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("dense"))?;
        dense.write_all_at(&std::fs::read(dir.path().join("s"))?, 0)?;
        let dl = Layout::of(dense.as_fd(), 64 << 20)?;
        let mut h2 = Sha256::new();
        copy_segments(&dense, &dl, Some(&mut h2), None).map_err(|e| format!("{e:?}"))?;
        assert_ne!(h.finalize(), h2.finalize());
        Ok(())
    }

    #[test]
    fn a_source_that_changes_during_the_copy_is_caught() -> TestResult {
        let dir = tempfile::tempdir()?;
        let src = sparse(&dir.path().join("s"))?;
        let layout = Layout::of(src.as_fd(), 64 << 20)?;
        // Data written into a hole after the map: the copy would miss it.
        src.write_all_at(b"late", 32 << 20)?;
        let r = copy_segments(&src, &layout, None, None);
        assert!(matches!(r, Err(CopyError::Changed)), "{r:?}");
        src.set_len(1000)?;
        let r = copy_segments(&src, &layout, None, None);
        assert!(matches!(r, Err(CopyError::Changed)), "{r:?}");
        Ok(())
    }

    #[test]
    fn the_footprint_counts_data_once_per_file() -> TestResult {
        let dir = tempfile::tempdir()?;
        let upper = dir.path().join("upper");
        std::fs::create_dir(&upper)?;
        drop(sparse(&upper.join("big"))?);
        std::fs::write(upper.join("a"), vec![7u8; 10_000])?;
        for i in 0..5 {
            std::fs::hard_link(upper.join("a"), upper.join(format!("l{i}")))?;
        }
        let changes = crate::diff(&upper, None)?;
        let fd = crate::scratch::open_root(&upper, rustix::fs::OFlags::RDONLY)?;
        let fp = measure(&fd, &upper, &changes)?;
        assert_eq!((fp.files, fp.names), (2, 7));
        assert_eq!(fp.data, 16384 + 10_000);
        assert_eq!(fp.apparent, (64 << 20) + 10_000);
        assert_eq!(fp.naive, (64 << 20) + 6 * 10_000);
        let a = fp.file(Path::new("l3")).ok_or("no l3")?;
        assert_eq!((a.nlink, fp.names_of(a)), (6, 6));
        let limit = SizeLimit {
            bytes: 20_000,
            source: "the sandbox's workspace_size".to_owned(),
        };
        let err = fp.check(fp.data, &limit).err().ok_or("not refused")?;
        assert_eq!(
            err.to_string(),
            "the change set would write 25.7 KiB (26384 bytes) to the target (2 files, 7 names), \
             more than 19.5 KiB (20000 bytes), the sandbox's workspace_size; nothing was read or \
             written (docs/promote.md#size)"
        );
        assert!(fp.check(fp.data, &SizeLimit::none()).is_ok());
        Ok(())
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(52_428_800), "50.0 MiB (52428800 bytes)");
        assert_eq!(human(8 << 30), "8.0 GiB (8589934592 bytes)");
        assert_eq!(human(268_435_456), "256.0 MiB (268435456 bytes)");
    }
}

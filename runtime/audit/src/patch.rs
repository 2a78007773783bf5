//! The content of a change set: a unified diff of each changed file against the host's
//! (lower) file, and per-file line counts (`diff --patch`, `diff --stat`).
//!
//! Both sides are hostile text on a terminal (the sandbox wrote one, and may have written
//! the host checkout's earlier too): every line passes through [`escape_line`], so control
//! characters, ANSI escapes and bidirectional overrides print as `\xNN` / `\u{NNNN}`.
//! Files are opened below their layer's root without following a link (a symlink is shown
//! as its escaped target), binary files (a NUL byte in their first 8000 bytes, git's rule)
//! and files over [`MAX_PATCH_FILE`] are summarised by size and SHA-256, and the line diff is
//! computed here (`similar`'s Myers diff, with a deadline), never by a tool run on the data.

use std::ffi::{CStr, OsString};
use std::fs::File;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};
use similar::{Algorithm, DiffTag};

use crate::escape::{escape_line, escape_path};
use crate::layout::human;
use crate::scratch::{
    Change, ChangeKind, FileKind, ScratchError, io_err, open_parent, open_root, size_of,
};

/// The largest file (either side) shown line by line; a larger one is summarised.
pub const MAX_PATCH_FILE: u64 = 1 << 20;
/// The most data hashed for a summary; a larger file is summarised by its size alone.
pub const MAX_HASH_FILE: u64 = 256 << 20;
/// Lines of context around each change.
const CONTEXT: usize = 3;
/// How long the line diff of one file may search for the smallest diff before it settles
/// for a larger one (still correct).
const DEADLINE: Duration = Duration::from_secs(2);
/// Git's binary test looks at this many leading bytes for a NUL.
const BINARY_PROBE: usize = 8000;

/// One side of a changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    /// Nothing there.
    Missing,
    /// A regular file read whole.
    Text {
        data: Vec<u8>,
        mode: u32,
    },
    /// A regular file not shown line by line.
    Summary {
        size: u64,
        sha256: Option<String>,
        mode: u32,
        binary: bool,
    },
    Symlink(PathBuf),
    Dir,
    Other(FileKind),
}

/// The patch of one changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The path, relative to the workspace root.
    pub path: PathBuf,
    /// How it changed.
    pub kind: ChangeKind,
    /// Lines added.
    pub added: usize,
    /// Lines removed.
    pub removed: usize,
    /// What `--stat` prints after the counts when the file is not text (`Bin 10 -> 20
    /// bytes`), escaped.
    pub note: Option<String>,
    /// The patch text, every line escaped, each ending in `\n`.
    pub text: String,
}

/// The patches of `changes` (from [`crate::diff`] of `upper` over `lower`), in order. A
/// directory that is added or kept gets no patch of its own (its files do).
pub fn patches<'a>(
    upper: &Path,
    lower: Option<&Path>,
    changes: impl IntoIterator<Item = &'a Change>,
) -> Result<Vec<FilePatch>, ScratchError> {
    let upper_fd = open_root(upper, OFlags::PATH)?;
    let lower_fd = lower.map(|l| open_root(l, OFlags::PATH)).transpose()?;
    let mut out = Vec::new();
    for c in changes {
        let old = match (&lower_fd, lower, c.kind) {
            (_, _, ChangeKind::Added) => Side::Missing,
            (Some(fd), Some(l), _) => side(fd, l, &c.path)?,
            _ => Side::Missing,
        };
        let new = if c.kind == ChangeKind::Deleted {
            Side::Missing
        } else {
            side(&upper_fd, upper, &c.path)?
        };
        if let Some(p) = file_patch(c, &old, &new) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Reads `rel` below `root` (nothing followed).
fn side(root: &OwnedFd, root_path: &Path, rel: &Path) -> Result<Side, ScratchError> {
    let full = root_path.join(rel);
    let (parent, name) = match open_parent(root, rel, root_path) {
        Ok(p) => p,
        // A parent that is gone or no directory on this side: nothing there.
        Err(ScratchError::Io { source, .. })
            if matches!(
                Errno::from_io_error(&source),
                Some(Errno::NOENT | Errno::NOTDIR | Errno::LOOP)
            ) =>
        {
            return Ok(Side::Missing);
        }
        Err(e) => return Err(e),
    };
    let st = match rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(Side::Missing),
        Err(e) => return Err(io_err("stat", full)(e)),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => return Ok(Side::Dir),
        FileType::Symlink => {
            let t = rustix::fs::readlinkat(&parent, name.as_c_str(), Vec::new())
                .map_err(io_err("read symlink", full))?;
            return Ok(Side::Symlink(PathBuf::from(OsString::from_vec(
                t.into_bytes(),
            ))));
        }
        FileType::RegularFile => {}
        _ => return Ok(Side::Other(FileKind::of(&st))),
    }
    read_regular(&parent, name.as_c_str(), full)
}

/// A regular file's content for a patch: its text, or a summary (size, hash, whether it
/// looks binary) when it is binary or past [`MAX_PATCH_FILE`].
fn read_regular(parent: &OwnedFd, name: &CStr, full: PathBuf) -> Result<Side, ScratchError> {
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err("open", full.clone()))?;
    let st = rustix::fs::fstat(&fd).map_err(io_err("stat", full.clone()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(ScratchError::Changed { path: full });
    }
    let mode = st.st_mode & 0o7777;
    let size = size_of(&st);
    let read_err = |source| ScratchError::Io {
        op: "read",
        path: full.clone(),
        source,
    };
    let mut file = File::from(fd);
    if size > MAX_PATCH_FILE {
        let mut probe = Vec::new();
        (&mut file)
            .take(BINARY_PROBE as u64)
            .read_to_end(&mut probe)
            .map_err(read_err)?;
        let binary = probe.contains(&0);
        let sha256 = if size <= MAX_HASH_FILE {
            let mut h = Sha256::new();
            h.update(&probe);
            std::io::copy(&mut (&mut file).take(MAX_HASH_FILE), &mut h).map_err(read_err)?;
            Some(hex::encode(h.finalize()))
        } else {
            None
        };
        return Ok(Side::Summary {
            size,
            sha256,
            mode,
            binary,
        });
    }
    let mut data = Vec::new();
    file.take(MAX_PATCH_FILE + 1)
        .read_to_end(&mut data)
        .map_err(read_err)?;
    if is_binary(&data) {
        return Ok(Side::Summary {
            size: data.len() as u64,
            sha256: Some(hex::encode(Sha256::digest(&data))),
            mode,
            binary: true,
        });
    }
    Ok(Side::Text { data, mode })
}

fn is_binary(data: &[u8]) -> bool {
    data.iter().take(BINARY_PROBE).any(|&b| b == 0)
}

/// `12 bytes sha256:0123abcd`, or the size alone.
fn summary(size: u64, sha256: Option<&str>) -> String {
    match sha256 {
        Some(h) => format!("{} sha256:{}", human(size), h.get(..16).unwrap_or(h)),
        None => format!("{} (not hashed)", human(size)),
    }
}

/// The patch of one change, or `None` for a directory that has nothing to say itself.
fn file_patch(c: &Change, old: &Side, new: &Side) -> Option<FilePatch> {
    let path = escape_path(&c.path);
    let mut p = FilePatch {
        path: c.path.clone(),
        kind: c.kind,
        added: 0,
        removed: 0,
        note: None,
        text: String::new(),
    };
    let header = |p: &mut FilePatch| {
        let from = if matches!(old, Side::Missing) {
            "/dev/null".to_owned()
        } else {
            format!("a/{path}")
        };
        let to = if matches!(new, Side::Missing) {
            "/dev/null".to_owned()
        } else {
            format!("b/{path}")
        };
        p.text.push_str(&format!("--- {from}\n+++ {to}\n"));
    };
    match (old, new) {
        (Side::Dir, Side::Dir) | (Side::Missing, Side::Dir) if c.kind != ChangeKind::OpaqueDir => {
            return None;
        }
        (_, Side::Dir) => {
            p.text = format!(
                "replaced directory /{path}: what the host had below it is gone; its new entries follow\n"
            );
            p.note = Some("directory replaced".to_owned());
        }
        (Side::Dir, Side::Missing) => {
            p.text = format!("deleted directory /{path} and everything below it\n");
            p.note = Some("directory deleted".to_owned());
        }
        (Side::Text { data: a, mode: ma }, Side::Text { data: b, mode: mb }) => {
            header(&mut p);
            mode_line(&mut p, Some(*ma), Some(*mb));
            lines(&mut p, a, b);
        }
        (Side::Missing, Side::Text { data, mode }) => {
            header(&mut p);
            p.text.push_str(&format!("new file mode {mode:o}\n"));
            lines(&mut p, &[], data);
        }
        (Side::Text { data, mode }, Side::Missing) => {
            header(&mut p);
            p.text.push_str(&format!("deleted file mode {mode:o}\n"));
            lines(&mut p, data, &[]);
        }
        (Side::Symlink(_), _) | (_, Side::Symlink(_)) => {
            let show = |s: &Side| match s {
                Side::Symlink(t) => format!("symlink -> {}", escape_path(t)),
                other => describe(other),
            };
            p.text = format!("/{path}: {} => {}\n", show(old), show(new));
            p.note = Some(format!("{} => {}", show(old), show(new)));
        }
        _ => {
            let binary = [old, new]
                .iter()
                .any(|s| matches!(s, Side::Summary { binary: true, .. }));
            let what = if binary { "binary" } else { "not shown" };
            p.text = format!("/{path} ({what}): {} => {}\n", describe(old), describe(new));
            p.note = Some(format!(
                "{} {} => {}",
                if binary { "Bin" } else { "Large" },
                describe(old),
                describe(new)
            ));
        }
    }
    Some(p)
}

/// One side in a summary line.
fn describe(s: &Side) -> String {
    match s {
        Side::Missing => "nothing".to_owned(),
        Side::Text { data, .. } => {
            summary(data.len() as u64, Some(&hex::encode(Sha256::digest(data))))
        }
        Side::Summary { size, sha256, .. } => summary(*size, sha256.as_deref()),
        Side::Symlink(t) => format!("symlink -> {}", escape_path(t)),
        Side::Dir => "directory".to_owned(),
        Side::Other(k) => k.name().to_owned(),
    }
}

fn mode_line(p: &mut FilePatch, old: Option<u32>, new: Option<u32>) {
    if let (Some(a), Some(b)) = (old, new)
        && a != b
    {
        p.text
            .push_str(&format!("old mode {a:o}\nnew mode {b:o}\n"));
    }
}

/// Splits `data` into lines, each without its `\n`; whether the last one had none.
fn split_lines(data: &[u8]) -> (Vec<&[u8]>, bool) {
    if data.is_empty() {
        return (Vec::new(), false);
    }
    let mut v: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let missing_newline = data.last() != Some(&b'\n');
    if !missing_newline {
        v.pop();
    }
    (v, missing_newline)
}

/// The hunks of a line diff of `old` and `new`, escaped, into `p`.
fn lines(p: &mut FilePatch, old: &[u8], new: &[u8]) {
    let (a, a_open) = split_lines(old);
    let (b, b_open) = split_lines(new);
    let ops = similar::capture_diff_slices_deadline(
        Algorithm::Myers,
        &a,
        &b,
        Some(Instant::now() + DEADLINE),
    );
    for group in similar::group_diff_ops(ops, CONTEXT) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let (os, ns) = (first.old_range().start, first.new_range().start);
        let (ol, nl) = (last.old_range().end - os, last.new_range().end - ns);
        let start = |s: usize, l: usize| if l == 0 { s } else { s + 1 };
        p.text.push_str(&format!(
            "@@ -{},{ol} +{},{nl} @@\n",
            start(os, ol),
            start(ns, nl)
        ));
        for op in &group {
            let (tag, or, nr) = op.as_tag_tuple();
            let mut emit = |sign: char, lines: &[&[u8]], range: std::ops::Range<usize>, open| {
                for i in range {
                    let line = lines.get(i).copied().unwrap_or_default();
                    p.text.push(sign);
                    p.text.push_str(&escape_line(line));
                    p.text.push('\n');
                    if open && i + 1 == lines.len() {
                        p.text.push_str("\\ No newline at end of file\n");
                    }
                }
            };
            match tag {
                DiffTag::Equal => emit(' ', &a, or, a_open),
                DiffTag::Delete => {
                    p.removed += or.len();
                    emit('-', &a, or, a_open);
                }
                DiffTag::Insert => {
                    p.added += nr.len();
                    emit('+', &b, nr, b_open);
                }
                DiffTag::Replace => {
                    p.removed += or.len();
                    p.added += nr.len();
                    emit('-', &a, or, a_open);
                    emit('+', &b, nr, b_open);
                }
            }
        }
    }
}

/// `--stat`: one line per patch (`path | +A -R`, or its note), then the totals.
pub fn stat_lines(patches: &[FilePatch]) -> Vec<String> {
    let names: Vec<String> = patches.iter().map(|p| escape_path(&p.path)).collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    let mut out = Vec::with_capacity(patches.len() + 1);
    let (mut added, mut removed) = (0, 0);
    for (p, name) in patches.iter().zip(&names) {
        added += p.added;
        removed += p.removed;
        let what = match &p.note {
            Some(n) => n.clone(),
            None => format!("+{} -{}", p.added, p.removed),
        };
        out.push(format!(" {name:<width$} | {what}"));
    }
    out.push(format!(
        " {} files changed, {added} insertions(+), {removed} deletions(-)",
        patches.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, kind: ChangeKind, file_type: FileKind) -> Change {
        Change::bare(path, kind, file_type)
    }

    fn setup() -> std::io::Result<(tempfile::TempDir, PathBuf, PathBuf)> {
        let dir = tempfile::tempdir()?;
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        std::fs::create_dir_all(&upper)?;
        std::fs::create_dir_all(&lower)?;
        Ok((dir, upper, lower))
    }

    #[test]
    fn a_modified_file_gets_hunks_with_context_and_counts() -> Result<(), Box<dyn std::error::Error>>
    {
        let (_d, upper, lower) = setup()?;
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 5\n", "line five\n")
            .replace("line 18\n", "");
        std::fs::write(lower.join("f.txt"), &old)?;
        std::fs::write(upper.join("f.txt"), format!("{new}tail"))?;
        let c = change("f.txt", ChangeKind::Modified, FileKind::File);
        let p = patches(&upper, Some(&lower), [&c])?;
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].text,
            "--- a/f.txt\n+++ b/f.txt\n\
             @@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+line five\n line 6\n line 7\n line 8\n\
             @@ -15,6 +15,6 @@\n line 15\n line 16\n line 17\n-line 18\n line 19\n line 20\n\
             +tail\n\\ No newline at end of file\n"
        );
        assert_eq!((p[0].added, p[0].removed), (2, 2));
        Ok(())
    }

    #[test]
    fn hostile_bytes_in_lines_and_names_are_escaped_and_tabs_kept()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_d, upper, lower) = setup()?;
        let name = "ok\x1b[1A\x1b[2K.py";
        // Cursor up + erase line, an OSC title, a bidi override, a C1 CSI, a bare CR.
        let evil = "x = 1\x1b[1A\x1b[2K\n\x1b]0;pwned\x07\n\u{202e}gnp.exe\n\u{9b}2J\nsafe\rhidden\n\tindented\n";
        std::fs::write(upper.join(name), evil)?;
        let c = change(name, ChangeKind::Added, FileKind::File);
        let p = patches(&upper, Some(&lower), [&c])?;
        let text = &p[0].text;
        assert_eq!(
            text,
            "--- /dev/null\n+++ b/ok\\x1b[1A\\x1b[2K.py\nnew file mode 644\n@@ -0,0 +1,6 @@\n\
             +x = 1\\x1b[1A\\x1b[2K\n+\\x1b]0;pwned\\x07\n+\\u{202e}gnp.exe\n+\\u{009b}2J\n\
             +safe\\x0dhidden\n+\tindented\n"
        );
        assert!(
            !text
                .chars()
                .any(|c| crate::escape::is_unsafe_char(c) && c != '\n' && c != '\t'),
            "{text:?}"
        );
        Ok(())
    }

    #[test]
    fn binary_large_symlink_and_deleted_files_are_summarised()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_d, upper, lower) = setup()?;
        std::fs::write(lower.join("img.bin"), b"\x89PNG\0\x1b[2J")?;
        std::fs::write(upper.join("img.bin"), b"\x89PNG\0\0\0")?;
        std::fs::write(upper.join("big.txt"), "y\n".repeat(600_000))?;
        std::os::unix::fs::symlink("../\x1b[2Jetc/passwd", upper.join("link"))?;
        std::fs::write(lower.join("gone.py"), "a\nb\n")?;
        std::fs::create_dir_all(lower.join("olddir/sub"))?;
        std::fs::create_dir_all(upper.join("newdir"))?;
        let cs = [
            change("big.txt", ChangeKind::Added, FileKind::File),
            change("gone.py", ChangeKind::Deleted, FileKind::File),
            change("img.bin", ChangeKind::Modified, FileKind::File),
            change("link", ChangeKind::Added, FileKind::Symlink),
            change("newdir", ChangeKind::Added, FileKind::Dir),
            change("olddir", ChangeKind::Deleted, FileKind::Dir),
        ];
        let p = patches(&upper, Some(&lower), &cs)?;
        let texts: Vec<&str> = p.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts.len(), 5, "{texts:#?}");
        assert!(
            texts[0]
                .starts_with("/big.txt (not shown): nothing => 1.1 MiB (1200000 bytes) sha256:"),
            "{}",
            texts[0]
        );
        assert_eq!(
            texts[1],
            "--- a/gone.py\n+++ /dev/null\ndeleted file mode 644\n@@ -1,2 +0,0 @@\n-a\n-b\n"
        );
        assert!(
            texts[2].starts_with("/img.bin (binary): 9 bytes sha256:"),
            "{}",
            texts[2]
        );
        assert!(!texts[2].contains('\x1b'));
        assert_eq!(
            texts[3],
            "/link: nothing => symlink -> ../\\x1b[2Jetc/passwd\n"
        );
        assert_eq!(
            texts[4],
            "deleted directory /olddir and everything below it\n"
        );
        let stat = stat_lines(&p);
        assert_eq!(stat[1], " gone.py | +0 -2");
        assert!(stat[2].starts_with(" img.bin | Bin 9 bytes"), "{}", stat[2]);
        assert_eq!(
            stat.last().map(String::as_str),
            Some(" 5 files changed, 0 insertions(+), 2 deletions(-)")
        );
        Ok(())
    }

    #[test]
    fn a_symlink_is_never_followed_on_either_side() -> Result<(), Box<dyn std::error::Error>> {
        let (d, upper, lower) = setup()?;
        std::fs::write(d.path().join("secret"), "TOKEN=hunter2\n")?;
        // The sandbox made a directory a link to outside; the change below it must not be
        // read through it.
        std::os::unix::fs::symlink(d.path(), upper.join("dir"))?;
        let c = change("dir/secret", ChangeKind::Added, FileKind::File);
        let p = patches(&upper, Some(&lower), [&c])?;
        assert!(!p.iter().any(|p| p.text.contains("hunter2")), "{p:?}");
        Ok(())
    }
}

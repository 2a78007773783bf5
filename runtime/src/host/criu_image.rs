//! The seccomp filters a CRIU image gives its threads, read before CRIU restores it.
//!
//! A checkpoint image is a file a user may have edited, so it is read as hostile data:
//! every size is bounded, every index checked, a field that may appear once appears once,
//! and anything else is an error, never a panic or a guess. The pre-resume check
//! (`enforce::restored`) sees only the filters' count in `/proc`; this reads what they are.
//!
//! CRIU's image files are two 32-bit magic numbers, then entries: a 32-bit little-endian
//! size and a protobuf message. The field numbers are CRIU's (`images/seccomp.proto`,
//! `images/core.proto`):
//! - `seccomp.img`, one `seccomp_entry`: `seccomp_filters` (1), each a `seccomp_filter` of
//!   `filter` (1, the BPF program's `struct sock_filter`s), `prev` (2) and `flags` (3);
//! - `core-TID.img`, one `core_entry` per thread: `thread_core` (5), whose `seccomp_mode`
//!   (11) and `seccomp_filter` (12) CRIU restores.
//!
//! A zombie (a child that exited and was not reaped yet) is dumped with only `tc` (3), whose
//! `task_state` (1) is `TASK_DEAD`, and no `thread_core`: CRIU restores it as a task that
//! exits at once with the recorded code, running none of the image's code, so it has no
//! filters to check (`criu/cr-dump.c`, `dump_one_zombie`; `restore_one_zombie`).
//!
//! Despite the names, CRIU 4's dump writes each thread's filters newest first, so a thread's
//! `seccomp_filter` is its first-installed filter and each `prev` leads to the one installed
//! after it; CRIU's restorer installs them in that walk's order (`criu/seccomp.c`,
//! `prepare_seccomp_filters`).
//!
//! Two more things a restore does with an image, in the same style: [`private_copy`] copies
//! it into the sandbox's own directory (every check and CRIU read that copy, which the user
//! can no longer edit), and [`rebase_userns`] moves a copy's id maps (`userns-N.img`) to the
//! restoring sandbox's own host id block (a fork: docs/checkpoint.md#fork).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::host::idmap::IdRange;

/// CRIU's `seccomp.img` in an image directory.
pub const SECCOMP_IMG: &str = "seccomp.img";
/// The largest image file read (a thread's core is kilobytes, a seccomp image at most the
/// kernel's 256Ki instructions per thread, 2 MiB).
const MAX_FILE: u64 = 16 << 20;
/// CRIU's `TASK_DEAD`, the `task_state` of a dumped zombie.
const TASK_DEAD: u64 = 2;
/// `SECCOMP_MODE_FILTER`.
const MODE_FILTER: u64 = 2;
/// `SECCOMP_FILTER_FLAG_TSYNC`, which CRIU 4 records on every filter it dumps: the only flag
/// allowed (`LOG`, `SPEC_ALLOW` and the others would change what the filter does).
const FLAG_TSYNC: u64 = 1;
/// The most a private copy of an image may hold, all its files together (the memory of the
/// sandbox's processes is most of it).
pub const MAX_IMAGE: u64 = 8 << 30;
/// The most files an image directory may hold (CRIU writes a few per task).
const MAX_FILES: usize = 65_536;

/// Errors of reading and checking an image's seccomp filters.
#[derive(Debug, thiserror::Error)]
pub enum CriuImageError {
    #[error("cannot read the image file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the image file {path} is malformed: {why}")]
    Malformed { path: PathBuf, why: String },
    #[error("thread {tid} of the image: {why}")]
    Thread { tid: String, why: String },
    #[error("cannot copy the image into {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the image {path} is larger than {MAX_IMAGE} bytes or {MAX_FILES} files")]
    TooLarge { path: PathBuf },
    #[error(
        "the image's id maps ({path}) are not the block it was taken in, {start}+{size}: {why}"
    )]
    Userns {
        path: PathBuf,
        start: u32,
        size: u32,
        why: String,
    },
}

/// One filter the sandbox installs, in the order installed: what it is, for errors, and the
/// programs it may be (the sandbox's own filter is one of two: with or without the
/// supervisor's notifications).
#[derive(Debug, Clone)]
pub struct Slot {
    pub what: &'static str,
    pub programs: Vec<Vec<u8>>,
}

/// A BPF program as the kernel and CRIU store it: `struct sock_filter`s, each `code` (16
/// bits), `jt`, `jf` (8 bits), `k` (32 bits), in native byte order.
pub fn program_bytes(program: impl IntoIterator<Item = (u16, u8, u8, u32)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (code, jt, jf, k) in program {
        out.extend_from_slice(&code.to_ne_bytes());
        out.extend_from_slice(&[jt, jf]);
        out.extend_from_slice(&k.to_ne_bytes());
    }
    out
}

/// Checks that every thread of the image in `dir` gets exactly `expected`, in that order
/// (first installed first), byte for byte, with no flag but TSYNC.
pub fn check_seccomp(dir: &Path, expected: &[Slot]) -> Result<(), CriuImageError> {
    let filters = read_filters(dir)?;
    let mut threads = 0;
    for (name, path) in entries(dir)? {
        let Some(tid) = name
            .strip_prefix("core-")
            .and_then(|n| n.strip_suffix(".img"))
        else {
            continue;
        };
        // A zombie's core has no seccomp state: it counts, with nothing to check.
        if let Some((mode, last)) = thread_seccomp(&path)? {
            let thread = |why: String| CriuImageError::Thread {
                tid: tid.to_owned(),
                why,
            };
            let chain = chain(mode, last, &filters).map_err(thread)?;
            compare(&chain, &filters, expected).map_err(thread)?;
        }
        threads += 1;
    }
    if threads == 0 {
        return Err(CriuImageError::Malformed {
            path: dir.to_owned(),
            why: "no thread core (core-TID.img)".to_owned(),
        });
    }
    Ok(())
}

/// Copies the image directory `from` into `to` (made here, mode 0700), as hostile data: only
/// regular files, opened without following a link, named as CRIU and the runtime name them
/// (`[A-Za-z0-9._-]`, no leading dot), at most [`MAX_IMAGE`] bytes and [`MAX_FILES`] files in
/// all; anything else (a link, a directory, a device, a FIFO) is an error naming it. The
/// copy's files are mode 0600.
pub fn private_copy(from: &Path, to: &Path) -> Result<(), CriuImageError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let write = |path: &Path| {
        let path = path.to_owned();
        move |source| CriuImageError::Write { path, source }
    };
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(to)
        .map_err(write(to))?;
    let mut left = MAX_IMAGE;
    for (name, source) in entries(from)? {
        // A name that is not UTF-8 came back lossy, with U+FFFD: not a name CRIU gives.
        if !image_file_name(&name) {
            return Err(malformed(&source, "not a name CRIU gives its files"));
        }
        let mut file = open_regular(&source)?;
        let target = to.join(&name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(write(&target))?;
        let copied =
            std::io::copy(&mut (&mut file).take(left + 1), &mut out).map_err(write(&target))?;
        left = left
            .checked_sub(copied)
            .ok_or_else(|| CriuImageError::TooLarge {
                path: from.to_owned(),
            })?;
        out.flush().map_err(write(&target))?;
    }
    Ok(())
}

/// A file name CRIU or the runtime gives an image file: `core-1.img`, `agent-sandbox.json`,
/// `tmpfs-dev-68.tar.gz.img`; never `..`, a hidden name or a path.
fn image_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Moves the id maps of the image copy in `dir` from the block it was taken in, `from`, to
/// `to`: its one `userns-N.img` must hold exactly `0 from.host_start from.size` as its only
/// uid and gid extent (as the runtime writes every sandbox's maps), and nothing else; any
/// other content, a second user namespace or none is an error. The file is replaced whole.
pub fn rebase_userns(dir: &Path, from: IdRange, to: IdRange) -> Result<(), CriuImageError> {
    let found: Vec<PathBuf> = entries(dir)?
        .into_iter()
        .filter(|(name, _)| name.starts_with("userns-") && name.ends_with(".img"))
        .map(|(_, path)| path)
        .collect();
    let refuse = |path: &Path, why: &str| CriuImageError::Userns {
        path: path.to_owned(),
        start: from.host_start,
        size: from.size,
        why: why.to_owned(),
    };
    let path = match found.as_slice() {
        [one] => one.clone(),
        [] => return Err(refuse(dir, "the image has no userns-N.img")),
        _ => return Err(refuse(dir, "the image has more than one user namespace")),
    };
    let bytes = read_capped(&path)?;
    let (body, rest) = split_entry(&path, &bytes)?;
    if !rest.is_empty() {
        return Err(refuse(&path, "more than one entry"));
    }
    userns_maps(body, from).map_err(|why| refuse(&path, &why))?;
    let mut out = bytes.get(..8).unwrap_or_default().to_vec();
    let new = userns_body(to);
    out.extend_from_slice(&u32::try_from(new.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&new);
    let tmp = path.with_extension("img.new");
    let write = |source| CriuImageError::Write {
        path: path.clone(),
        source,
    };
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(write)?;
        f.write_all(&out).map_err(write)?;
    }
    std::fs::rename(&tmp, &path).map_err(write)
}

/// Checks a `userns_entry`: `uid_map` (1) and `gid_map` (2), each one `uid_gid_extent` of
/// `first` (1) 0, `lower_first` (2) the block's start and `count` (3) its size.
fn userns_maps(body: &[u8], block: IdRange) -> Result<(), String> {
    let entry = fields(body)?;
    if let Some((n, _)) = entry.iter().find(|(n, _)| *n != 1 && *n != 2) {
        return Err(format!("field {n} is not a map"));
    }
    for (n, what) in [(1, "uid_map"), (2, "gid_map")] {
        let extent = single_bytes(&entry, n)?.ok_or(format!("no {what}"))?;
        let e = fields(extent)?;
        if let Some((m, _)) = e.iter().find(|(m, _)| !(1..=3).contains(m)) {
            return Err(format!("{what}: field {m} is not of an extent"));
        }
        let got = (
            single_varint(&e, 1)?.unwrap_or(0),
            single_varint(&e, 2)?.unwrap_or(0),
            single_varint(&e, 3)?.unwrap_or(0),
        );
        let want = (0, u64::from(block.host_start), u64::from(block.size));
        if got != want {
            return Err(format!(
                "{what} is {} {} {}, not {} {} {}",
                got.0, got.1, got.2, want.0, want.1, want.2
            ));
        }
    }
    Ok(())
}

/// A `userns_entry` mapping ids `0..to.size` onto the block `to`, uid and gid alike.
fn userns_body(to: IdRange) -> Vec<u8> {
    let mut extent = vec![0x08, 0x00, 0x10];
    put_varint(&mut extent, u64::from(to.host_start));
    extent.push(0x18);
    put_varint(&mut extent, u64::from(to.size));
    let mut body = Vec::new();
    for key in [0x0a, 0x12] {
        body.push(key);
        put_varint(&mut body, u64::try_from(extent.len()).unwrap_or(0));
        body.extend_from_slice(&extent);
    }
    body
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or(0) | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or(0));
}

/// The image directory's entries: names (lossy) and paths, at most [`MAX_FILES`].
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, CriuImageError> {
    let read = |source| CriuImageError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        if out.len() >= MAX_FILES {
            return Err(CriuImageError::TooLarge {
                path: dir.to_owned(),
            });
        }
        let entry = entry.map_err(read)?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.path(),
        ));
    }
    Ok(out)
}

/// A thread's filters as image indexes, in the order CRIU installs them.
fn chain(mode: Option<u64>, first: Option<u64>, filters: &[Filter]) -> Result<Vec<usize>, String> {
    match mode.unwrap_or(0) {
        0 => return Ok(Vec::new()),
        MODE_FILTER => {}
        m => return Err(format!("seccomp mode {m}, not {MODE_FILTER} (filter)")),
    }
    let mut at = first.ok_or("seccomp mode 2 without a filter index")?;
    let mut out = Vec::new();
    loop {
        let index = usize::try_from(at)
            .ok()
            .filter(|i| *i < filters.len())
            .ok_or_else(|| {
                format!(
                    "seccomp filter index {at} is not in seccomp.img ({} filters)",
                    filters.len()
                )
            })?;
        if out.contains(&index) {
            return Err(format!(
                "seccomp filter {index} comes back in its own chain"
            ));
        }
        out.push(index);
        match filters[index].prev {
            Some(prev) => at = prev,
            None => break,
        }
    }
    Ok(out)
}

fn compare(chain: &[usize], filters: &[Filter], expected: &[Slot]) -> Result<(), String> {
    if chain.len() != expected.len() {
        return Err(format!(
            "{} seccomp filters, the sandbox installs {}",
            chain.len(),
            expected.len()
        ));
    }
    for (n, (index, slot)) in chain.iter().zip(expected).enumerate() {
        let filter = &filters[*index];
        if !slot.programs.contains(&filter.program) {
            return Err(format!(
                "seccomp filter {} of {} (seccomp.img filter {index}) is not {}",
                n + 1,
                expected.len(),
                slot.what
            ));
        }
        if filter.flags & !FLAG_TSYNC != 0 {
            return Err(format!(
                "seccomp filter {} of {} (seccomp.img filter {index}) has flags {:#x}, \
                 the sandbox's have none but TSYNC",
                n + 1,
                expected.len(),
                filter.flags
            ));
        }
    }
    Ok(())
}

struct Filter {
    program: Vec<u8>,
    prev: Option<u64>,
    flags: u64,
}

/// `seccomp.img`'s filters; none if the image has no such file.
fn read_filters(dir: &Path) -> Result<Vec<Filter>, CriuImageError> {
    let path = dir.join(SECCOMP_IMG);
    if std::fs::symlink_metadata(&path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(Vec::new());
    }
    let body = entry(&path)?;
    let bad = |why: String| CriuImageError::Malformed {
        path: path.clone(),
        why,
    };
    let entry = fields(&body).map_err(bad)?;
    let mut out = Vec::new();
    for filter in repeated_bytes(&entry, 1).map_err(bad)? {
        let f = fields(filter).map_err(bad)?;
        out.push(Filter {
            program: single_bytes(&f, 1)
                .map_err(bad)?
                .ok_or_else(|| bad("a seccomp filter without its program".to_owned()))?
                .to_vec(),
            prev: single_varint(&f, 2).map_err(bad)?,
            flags: single_varint(&f, 3).map_err(bad)?.unwrap_or(0),
        });
    }
    Ok(out)
}

/// A thread core's `seccomp_mode` and `seccomp_filter`, or `None` for a zombie's core (no
/// `thread_core`, `task_state` `TASK_DEAD`): it runs no code after restore.
type ThreadSeccomp = Option<(Option<u64>, Option<u64>)>;

fn thread_seccomp(path: &Path) -> Result<ThreadSeccomp, CriuImageError> {
    let body = entry(path)?;
    let bad = |why: String| CriuImageError::Malformed {
        path: path.to_owned(),
        why,
    };
    let core = fields(&body).map_err(bad)?;
    let Some(thread_core) = single_bytes(&core, 5).map_err(bad)? else {
        let state = match single_bytes(&core, 3).map_err(bad)? {
            Some(task) => single_varint(&fields(task).map_err(bad)?, 1).map_err(bad)?,
            None => None,
        };
        return match state {
            Some(TASK_DEAD) => Ok(None),
            _ => Err(bad("no thread_core, and not a zombie's core".to_owned())),
        };
    };
    let tc = fields(thread_core).map_err(bad)?;
    Ok(Some((
        single_varint(&tc, 11).map_err(bad)?,
        single_varint(&tc, 12).map_err(bad)?,
    )))
}

/// The first entry's message of the image file at `path` (CRIU reads one from each of
/// these files). Not a link, not a device, at most [`MAX_FILE`] bytes.
fn entry(path: &Path) -> Result<Vec<u8>, CriuImageError> {
    let bytes = read_capped(path)?;
    let (body, _) = split_entry(path, &bytes)?;
    Ok(body.to_vec())
}

/// The whole image file at `path`: not a link, not a device, at most [`MAX_FILE`] bytes.
fn read_capped(path: &Path) -> Result<Vec<u8>, CriuImageError> {
    let read = |source| CriuImageError::Read {
        path: path.to_owned(),
        source,
    };
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_FILE {
        return Err(malformed(path, "larger than 16 MiB"));
    }
    Ok(bytes)
}

/// `path` opened for reading if it is a regular file (never through a link, never blocking
/// on a FIFO).
fn open_regular(path: &Path) -> Result<std::fs::File, CriuImageError> {
    use std::os::unix::fs::OpenOptionsExt;
    let read = |source| CriuImageError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(read)?;
    if !file.metadata().map_err(read)?.is_file() {
        return Err(malformed(path, "not a regular file"));
    }
    Ok(file)
}

fn malformed(path: &Path, why: &str) -> CriuImageError {
    CriuImageError::Malformed {
        path: path.to_owned(),
        why: why.to_owned(),
    }
}

/// An image file's first entry's message and what follows it.
fn split_entry<'a>(path: &Path, bytes: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), CriuImageError> {
    let bad = |why: &str| malformed(path, why);
    let size = bytes
        .get(8..12)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad("shorter than its magic and first entry's size"))?;
    let size = usize::try_from(size).map_err(|_| bad("entry size out of range"))?;
    let rest = bytes.get(12..).unwrap_or_default();
    if rest.len() < size {
        return Err(bad("its entry runs past the end"));
    }
    Ok(rest.split_at(size))
}

/// A protobuf field's value in wire form.
#[derive(Debug, PartialEq)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).ok_or("a varint runs past the end")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint longer than 10 bytes".to_owned())
}

/// A message's fields, in order: numbers and values.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Value<'_>)>, String> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < buf.len() {
        let key = varint(buf, &mut at)?;
        let width = match key & 7 {
            0 => {
                out.push((key >> 3, Value::Varint(varint(buf, &mut at)?)));
                continue;
            }
            2 => usize::try_from(varint(buf, &mut at)?).map_err(|_| "a length out of range")?,
            1 => 8,
            5 => 4,
            w => return Err(format!("wire type {w}")),
        };
        let end = at
            .checked_add(width)
            .filter(|end| *end <= buf.len())
            .ok_or("a field runs past the end")?;
        let value = &buf[at..end];
        out.push((
            key >> 3,
            if key & 7 == 2 {
                Value::Bytes(value)
            } else {
                Value::Fixed
            },
        ));
        at = end;
    }
    Ok(out)
}

/// A field that may appear at most once, of the wire type CRIU's schema gives it: twice
/// (which a protobuf reader merges or overrides) or another type is an error.
fn single<'a>(fields: &'a [(u64, Value<'a>)], n: u64) -> Result<Option<&'a Value<'a>>, String> {
    let mut found = fields.iter().filter(|(m, _)| *m == n).map(|(_, v)| v);
    let first = found.next();
    if found.next().is_some() {
        return Err(format!("field {n} appears more than once"));
    }
    Ok(first)
}

fn single_varint(fields: &[(u64, Value<'_>)], n: u64) -> Result<Option<u64>, String> {
    match single(fields, n)? {
        None => Ok(None),
        Some(Value::Varint(v)) if *v <= u64::from(u32::MAX) => Ok(Some(*v)),
        Some(_) => Err(format!("field {n} is not a 32-bit varint")),
    }
}

fn single_bytes<'a>(fields: &'a [(u64, Value<'a>)], n: u64) -> Result<Option<&'a [u8]>, String> {
    match single(fields, n)? {
        None => Ok(None),
        Some(Value::Bytes(b)) => Ok(Some(b)),
        Some(_) => Err(format!("field {n} is not length-delimited")),
    }
}

fn repeated_bytes<'a>(fields: &'a [(u64, Value<'a>)], n: u64) -> Result<Vec<&'a [u8]>, String> {
    fields
        .iter()
        .filter(|(m, _)| *m == n)
        .map(|(_, v)| match v {
            Value::Bytes(b) => Ok(*b),
            _ => Err(format!("field {n} is not length-delimited")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(out: &mut Vec<u8>, n: u64, wire: u64) {
        put(out, (n << 3) | wire);
    }

    fn put(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).unwrap() | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).unwrap());
    }

    fn bytes(out: &mut Vec<u8>, n: u64, b: &[u8]) {
        key(out, n, 2);
        put(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    fn varint(out: &mut Vec<u8>, n: u64, v: u64) {
        key(out, n, 0);
        put(out, v);
    }

    fn image(dir: &Path, name: &str, body: &[u8]) {
        let mut out = vec![0u8; 8];
        out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        out.extend_from_slice(body);
        std::fs::write(dir.join(name), out).unwrap();
    }

    /// seccomp.img with `filters` (program, prev).
    fn seccomp(dir: &Path, filters: &[(&[u8], Option<u64>)]) {
        let mut entry = Vec::new();
        for (program, prev) in filters {
            let mut f = Vec::new();
            bytes(&mut f, 1, program);
            if let Some(prev) = prev {
                varint(&mut f, 2, *prev);
            }
            bytes(&mut entry, 1, &f);
        }
        image(dir, SECCOMP_IMG, &entry);
    }

    fn core(dir: &Path, tid: u32, mode: u64, last: u64) {
        let mut tc = Vec::new();
        varint(&mut tc, 1, 0);
        varint(&mut tc, 11, mode);
        varint(&mut tc, 12, last);
        let mut core = Vec::new();
        varint(&mut core, 1, 1);
        bytes(&mut core, 5, &tc);
        image(dir, &format!("core-{tid}.img"), &core);
    }

    const OWN: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8];
    const CONFIG: &[u8] = &[9, 9, 9, 9, 9, 9, 9, 9];

    fn allow_all() -> Vec<u8> {
        program_bytes([(0x06, 0, 0, 0x7fff_0000)])
    }

    fn expected() -> Vec<Slot> {
        vec![
            Slot {
                what: "the sandbox's own filter",
                programs: vec![OWN.to_vec()],
            },
            Slot {
                what: "the config's linux.seccomp filter",
                programs: vec![CONFIG.to_vec()],
            },
        ]
    }

    fn refusal(dir: &Path) -> String {
        let e = check_seccomp(dir, &expected()).unwrap_err();
        e.to_string()
    }

    #[test]
    fn the_sandboxs_filters_in_order_pass() {
        let dir = tempfile::tempdir().unwrap();
        // As CRIU writes them: newest first, the thread's index the first installed.
        seccomp(dir.path(), &[(CONFIG, None), (OWN, Some(0))]);
        core(dir.path(), 1, 2, 1);
        core(dir.path(), 7, 2, 1);
        check_seccomp(dir.path(), &expected()).unwrap();
    }

    #[test]
    fn a_permissive_filter_of_the_same_count_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let allow = allow_all();
        seccomp(dir.path(), &[(CONFIG, None), (&allow, Some(0))]);
        core(dir.path(), 1, 2, 1);
        assert_eq!(
            refusal(dir.path()),
            "thread 1 of the image: seccomp filter 1 of 2 (seccomp.img filter 1) is not the \
             sandbox's own filter"
        );
    }

    #[test]
    fn another_order_another_count_or_no_filter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        seccomp(dir.path(), &[(OWN, None), (CONFIG, Some(0))]);
        core(dir.path(), 1, 2, 1);
        assert!(refusal(dir.path()).contains("filter 1 of 2 (seccomp.img filter 1) is not"));
        core(dir.path(), 1, 2, 0);
        assert!(refusal(dir.path()).contains("1 seccomp filters, the sandbox installs 2"));
        core(dir.path(), 1, 0, 0);
        assert!(refusal(dir.path()).contains("0 seccomp filters"));
        core(dir.path(), 1, 1, 0);
        assert!(refusal(dir.path()).contains("seccomp mode 1"));
    }

    #[test]
    fn one_thread_of_many_is_enough_to_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let allow = allow_all();
        seccomp(
            dir.path(),
            &[
                (CONFIG, None),
                (OWN, Some(0)),
                (CONFIG, None),
                (&allow, Some(2)),
            ],
        );
        core(dir.path(), 1, 2, 1);
        core(dir.path(), 2, 2, 3);
        assert!(refusal(dir.path()).starts_with("thread 2 of the image"));
    }

    #[test]
    fn loops_bad_indexes_flags_and_garbage_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        seccomp(dir.path(), &[(OWN, Some(1)), (CONFIG, Some(0))]);
        core(dir.path(), 1, 2, 1);
        assert!(refusal(dir.path()).contains("comes back in its own chain"));
        seccomp(dir.path(), &[(CONFIG, None), (OWN, Some(5))]);
        assert!(refusal(dir.path()).contains("index 5 is not in seccomp.img"));
        core(dir.path(), 1, 2, u64::from(u32::MAX) + 1);
        assert!(refusal(dir.path()).contains("not a 32-bit varint"));
        // A flag the sandbox never sets.
        let mut f0 = Vec::new();
        bytes(&mut f0, 1, CONFIG);
        varint(&mut f0, 3, 1);
        let mut f1 = Vec::new();
        bytes(&mut f1, 1, OWN);
        varint(&mut f1, 2, 0);
        varint(&mut f1, 3, 4 | 1);
        let mut entry = Vec::new();
        bytes(&mut entry, 1, &f0);
        bytes(&mut entry, 1, &f1);
        image(dir.path(), SECCOMP_IMG, &entry);
        core(dir.path(), 1, 2, 1);
        assert!(refusal(dir.path()).contains("has flags 0x5"));
        // A second thread_core, which protobuf-c would merge.
        let mut core2 = Vec::new();
        let mut tc = Vec::new();
        varint(&mut tc, 11, 2);
        bytes(&mut core2, 5, &tc);
        bytes(&mut core2, 5, &tc);
        image(dir.path(), "core-1.img", &core2);
        assert!(refusal(dir.path()).contains("field 5 appears more than once"));
        // Every truncation of a good image is an error, never a panic.
        seccomp(dir.path(), &[(CONFIG, None), (OWN, Some(0))]);
        core(dir.path(), 1, 2, 1);
        check_seccomp(dir.path(), &expected()).unwrap();
        let good = std::fs::read(dir.path().join(SECCOMP_IMG)).unwrap();
        for len in 0..good.len() {
            std::fs::write(dir.path().join(SECCOMP_IMG), &good[..len]).unwrap();
            assert!(check_seccomp(dir.path(), &expected()).is_err(), "{len}");
        }
        // Garbage past the declared size of the entry is an error too.
        let mut huge = good.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(dir.path().join(SECCOMP_IMG), &huge).unwrap();
        assert!(refusal(dir.path()).contains("runs past the end"));
    }

    #[test]
    fn no_thread_or_a_linked_core_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        seccomp(dir.path(), &[(CONFIG, None), (OWN, Some(0))]);
        assert!(refusal(dir.path()).contains("no thread core"));
        core(dir.path(), 9, 2, 1);
        std::os::unix::fs::symlink(dir.path().join("core-9.img"), dir.path().join("core-1.img"))
            .unwrap();
        assert!(refusal(dir.path()).contains("core-1.img"));
    }

    /// A zombie's core: `tc` with `task_state` `state`, no `thread_core`.
    fn zombie_core(dir: &Path, tid: u32, state: u64) {
        let mut task = Vec::new();
        varint(&mut task, 1, state);
        varint(&mut task, 2, 0);
        let mut core = Vec::new();
        varint(&mut core, 1, 1);
        bytes(&mut core, 3, &task);
        image(dir, &format!("core-{tid}.img"), &core);
    }

    #[test]
    fn a_zombies_core_has_no_filters_to_check_but_a_live_task_without_them_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        seccomp(dir.path(), &[(CONFIG, None), (OWN, Some(0))]);
        core(dir.path(), 1, 2, 1);
        zombie_core(dir.path(), 7, TASK_DEAD);
        check_seccomp(dir.path(), &expected()).unwrap();
        // The same core marked alive (CRIU's TASK_ALIVE is 1) would run with no filter.
        zombie_core(dir.path(), 7, 1);
        let e = refusal(dir.path());
        assert!(
            e.contains("core-7.img") && e.contains("not a zombie's core"),
            "{e}"
        );
        // A zombie's state on a core that has a thread_core does not skip its check.
        let mut task = Vec::new();
        varint(&mut task, 1, TASK_DEAD);
        let mut tc = Vec::new();
        varint(&mut tc, 11, 2);
        varint(&mut tc, 12, 0);
        let mut c = Vec::new();
        varint(&mut c, 1, 1);
        bytes(&mut c, 3, &task);
        bytes(&mut c, 5, &tc);
        image(dir.path(), "core-7.img", &c);
        assert!(refusal(dir.path()).contains("thread 7 of the image"));
    }

    /// CRIU 4.2.1's `userns-14.img` of a sandbox in block 1065536+65536 (measured).
    const USERNS_14: &str =
        "1943565406494755180000000a0a080010c0844118808004120a080010c0844118808004";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    use crate::host::idmap::{NEW_BLOCK as NEW, OLD_BLOCK as OLD};

    #[test]
    fn userns_maps_move_to_the_new_block_and_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("userns-14.img");
        std::fs::write(&path, hex(USERNS_14)).unwrap();
        rebase_userns(dir.path(), OLD, NEW).unwrap();
        let moved = std::fs::read(&path).unwrap();
        assert_ne!(moved, hex(USERNS_14));
        let (body, rest) = split_entry(&path, &moved).unwrap();
        assert!(rest.is_empty());
        userns_maps(body, NEW).unwrap();
        // Moved back, it is CRIU's own encoding again.
        rebase_userns(dir.path(), NEW, OLD).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), hex(USERNS_14));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn userns_maps_other_than_the_images_block_are_refused_and_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("userns-14.img");
        assert!(
            rebase_userns(dir.path(), OLD, NEW)
                .unwrap_err()
                .to_string()
                .contains("no userns-N.img")
        );
        // Root mapped to host root (the e2e edit), a second extent, a trailing entry, a
        // second namespace.
        let root_body = userns_body(IdRange {
            host_start: 0,
            size: 65_536,
        });
        let mut to_root = hex(USERNS_14)[..8].to_vec();
        to_root.extend_from_slice(&u32::try_from(root_body.len()).unwrap().to_le_bytes());
        to_root.extend_from_slice(&root_body);
        let mut two = hex(USERNS_14);
        let extra = [0x0a, 0x04, 0x08, 0x01, 0x18, 0x01];
        two.extend_from_slice(&extra);
        let len = u32::try_from(two.len() - 12).unwrap();
        two[8..12].copy_from_slice(&len.to_le_bytes());
        let mut trailing = hex(USERNS_14);
        trailing.extend_from_slice(&[4, 0, 0, 0, 0x0a, 0x02, 0x08, 0x00]);
        for (bytes, why) in [
            (to_root, "uid_map is 0 0 65536, not 0 1065536 65536"),
            (two, "field 1 appears more than once"),
            (trailing, "more than one entry"),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            let e = rebase_userns(dir.path(), OLD, NEW).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
        }
        std::fs::write(&path, hex(USERNS_14)).unwrap();
        std::fs::write(dir.path().join("userns-15.img"), hex(USERNS_14)).unwrap();
        assert!(
            rebase_userns(dir.path(), OLD, NEW)
                .unwrap_err()
                .to_string()
                .contains("more than one user namespace")
        );
    }

    #[test]
    fn a_private_copy_takes_regular_files_only_and_names_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image");
        std::fs::create_dir(&image).unwrap();
        std::fs::write(image.join("core-1.img"), b"core").unwrap();
        std::fs::write(image.join("agent-sandbox.json"), b"{}").unwrap();
        let copy = dir.path().join("copy");
        private_copy(&image, &copy).unwrap();
        assert_eq!(std::fs::read(copy.join("core-1.img")).unwrap(), b"core");
        assert_eq!(
            std::fs::read(copy.join("agent-sandbox.json")).unwrap(),
            b"{}"
        );
        // The copy is the copy: an edit of the image after it changes nothing read later.
        std::fs::write(image.join("core-1.img"), b"edited").unwrap();
        assert_eq!(std::fs::read(copy.join("core-1.img")).unwrap(), b"core");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"host file").unwrap();
        std::os::unix::fs::symlink(&secret, image.join("pages-1.img")).unwrap();
        let e = private_copy(&image, &dir.path().join("c2")).unwrap_err();
        assert!(e.to_string().contains("pages-1.img"), "{e}");
        std::fs::remove_file(image.join("pages-1.img")).unwrap();
        std::fs::create_dir(image.join("sub")).unwrap();
        let e = private_copy(&image, &dir.path().join("c3")).unwrap_err();
        assert!(e.to_string().contains("sub"), "{e}");
        std::fs::remove_dir(image.join("sub")).unwrap();
        std::fs::write(image.join("a b.img"), b"").unwrap();
        let e = private_copy(&image, &dir.path().join("c4")).unwrap_err();
        assert!(format!("{e:?}").contains("not a name CRIU gives"), "{e:?}");
        for bad in [".hidden", "a/b", "..", "core-1.img\n"] {
            assert!(!image_file_name(bad), "{bad}");
        }
        // An existing target is never written through.
        let e = private_copy(&image, &copy).unwrap_err();
        assert!(e.to_string().contains("cannot copy the image into"), "{e}");
    }

    #[test]
    fn program_bytes_are_sock_filters() {
        assert_eq!(allow_all().len(), 8);
        assert_eq!(&allow_all()[4..8], &0x7fff_0000u32.to_ne_bytes());
    }
}

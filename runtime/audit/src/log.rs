//! The append-only, hash-chained audit log: writer, reader and verifier.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead as _, Read as _, Write as _};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use chrono::{SecondsFormat, Utc};
use rustix::fs::FlockOperation;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::record::{Event, FORMAT_VERSION, Record};

/// Largest line (including its newline) the writer emits and the tail reader accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// Prefix hashed with the sandbox id to make the first record's `prev`.
const GENESIS_PREFIX: &[u8] = b"agent-sandbox-audit/v1/genesis\0";

/// The member the writer appends as the last one of every line.
const HASH_MEMBER: &[u8] = b",\"hash\":\"";

/// Errors of the audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The sandbox id is not usable in a log.
    #[error("invalid sandbox id {id:?}: {reason}")]
    InvalidSandboxId {
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The event carries something the log must not hold.
    #[error("invalid {kind} event: {reason}")]
    InvalidEvent {
        /// Event kind.
        kind: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The log file could not be opened or created.
    #[error("cannot open audit log {path}")]
    Open {
        /// Log path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The advisory lock could not be taken or released.
    #[error("cannot lock audit log {path}")]
    Lock {
        /// Log path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Reading the log failed.
    #[error("cannot read audit log {path}")]
    Read {
        /// Log path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Writing a record failed (e.g. ENOSPC); the log was rolled back to its previous length.
    #[error("cannot append {kind} record to audit log {path}")]
    Write {
        /// Log path.
        path: PathBuf,
        /// Kind of the record that was not written.
        kind: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A failed write could not be rolled back: the log now ends with a torn line.
    #[error("cannot roll back failed append to audit log {path}; it ends with a torn line")]
    Rollback {
        /// Log path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The record was written but fsync failed, so its durability is unknown.
    #[error("cannot sync audit log {path} after appending seq {seq}")]
    Sync {
        /// Log path.
        path: PathBuf,
        /// Sequence number of the written record.
        seq: u64,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The log ends with an incomplete line; the writer refuses to chain onto it.
    #[error(
        "audit log {path} ends with an incomplete line {line} ({bytes} bytes at offset {offset}); run repair to cut it"
    )]
    TornTail {
        /// Log path.
        path: PathBuf,
        /// Line number of the incomplete line.
        line: u64,
        /// Byte offset where it starts.
        offset: u64,
        /// Its length.
        bytes: u64,
    },
    /// The last complete line is not a record of this format.
    #[error("last line of audit log {path} is not a valid record: {reason}")]
    CorruptTail {
        /// Log path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The log belongs to another sandbox.
    #[error("audit log {path} belongs to sandbox {found:?}, not {expected:?}")]
    SandboxMismatch {
        /// Log path.
        path: PathBuf,
        /// Sandbox id the caller gave.
        expected: String,
        /// Sandbox id in the log.
        found: String,
    },
    /// The record would exceed [`MAX_LINE`].
    #[error("{kind} record is {len} bytes, more than the {limit} byte limit")]
    TooLarge {
        /// Kind of the record.
        kind: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The record could not be serialised.
    #[error("cannot serialise {kind} record")]
    Serialize {
        /// Kind of the record.
        kind: &'static str,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// Verification found a break in the chain.
    #[error("audit log {path} line {line}: {problem} (the {verified} records before it verify)")]
    Broken {
        /// Log path.
        path: PathBuf,
        /// First line that does not verify (1-based).
        line: u64,
        /// Number of records before it that verify.
        verified: u64,
        /// What broke.
        problem: Broken,
    },
}

/// What [`verify`] found wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// The line's bytes do not hash to its `hash`: it was edited.
    #[error("record edited: hash {computed} does not match stored {stored}")]
    HashMismatch {
        /// Stored hash.
        stored: String,
        /// Hash of the line as found.
        computed: String,
    },
    /// `seq` is not the line number: a record was dropped, inserted or moved.
    #[error("record dropped, inserted or reordered: expected seq {expected}, found {found}")]
    SeqMismatch {
        /// Line number.
        expected: u64,
        /// Seq in the record.
        found: u64,
    },
    /// `prev` does not hash the line before (or the genesis value).
    #[error("chain broken: prev {found} is not the hash of the line before ({expected})")]
    PrevMismatch {
        /// Hash of the previous line (or genesis).
        expected: String,
        /// Prev in the record.
        found: String,
    },
    /// The record names another sandbox than the first record.
    #[error("sandbox changed from {expected:?} to {found:?}")]
    SandboxMismatch {
        /// Sandbox of the first record.
        expected: String,
        /// Sandbox of this record.
        found: String,
    },
    /// The line is not a record of this format.
    #[error("malformed record: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The file ends with a line that has no newline (a write was cut short).
    #[error("incomplete last line ({bytes} bytes, no newline)")]
    TornLine {
        /// Length of the fragment.
        bytes: u64,
    },
    /// The anchored line no longer hashes to the anchored head: the chain was rewritten.
    #[error("chain rewritten: line hashes to {found}, anchor says {expected}")]
    AnchorMismatch {
        /// Anchored head.
        expected: String,
        /// Hash of the line now.
        found: String,
    },
    /// The log ends before the anchored line: records were cut off the end.
    #[error("records cut off: anchor is at line {anchored}, the log has {found}")]
    Truncated {
        /// Anchored line.
        anchored: u64,
        /// Lines present.
        found: u64,
    },
}

/// The result of a successful [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Number of records (all verified).
    pub records: u64,
    /// sha256 (hex) of the last line, i.e. the `prev` the next record will carry; the
    /// genesis value for an empty log. Store it elsewhere to detect a later truncation.
    pub head: String,
    /// The seq of the first `truncated` record, when the log reached its size cap: the
    /// chain is intact, but records after it were only counted (`summary` records), so the
    /// log is not complete.
    pub truncated: Option<u64>,
}

/// A torn tail cut by [`repair_torn_tail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Line number of the cut fragment.
    pub line: u64,
    /// Offset the file was truncated to.
    pub offset: u64,
    /// The bytes that were cut.
    pub fragment: Vec<u8>,
}

/// The default place of a sandbox's log: `<root>/<sandbox_id>.jsonl`, where `root` is a
/// directory kept apart from the per-container state (so the log outlives `delete` until
/// pruned), e.g. `<runtime state dir>/audit`. The id must be one path component.
pub fn log_path(root: &Path, sandbox_id: &str) -> Result<PathBuf, AuditError> {
    check_sandbox_id(sandbox_id)?;
    if sandbox_id.contains('/') || sandbox_id == "." || sandbox_id == ".." {
        return Err(AuditError::InvalidSandboxId {
            id: sandbox_id.to_owned(),
            reason: "not a single path component",
        });
    }
    Ok(root.join(format!("{sandbox_id}.jsonl")))
}

/// The `prev` of a log's first record: sha256 hex of `"agent-sandbox-audit/v1/genesis\0" + id`.
pub fn genesis(sandbox_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(GENESIS_PREFIX);
    h.update(sandbox_id.as_bytes());
    hex::encode(h.finalize())
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn check_sandbox_id(id: &str) -> Result<(), AuditError> {
    let bad = |reason| {
        Err(AuditError::InvalidSandboxId {
            id: id.to_owned(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > 1024 {
        return bad("longer than 1024 bytes");
    }
    if id.chars().any(char::is_control) {
        return bad("contains control characters");
    }
    Ok(())
}

fn check_event(event: &Event) -> Result<(), AuditError> {
    if let Event::Exec { env_keys, .. } = event
        && let Some(k) = env_keys.iter().find(|k| k.contains('='))
    {
        let key = k.split_once('=').map_or(k.as_str(), |(key, _)| key);
        return Err(AuditError::InvalidEvent {
            kind: "exec",
            reason: format!("env key {key:?} carries a value; only names are logged"),
        });
    }
    Ok(())
}

/// The line content that is hashed: everything but the `hash` member.
#[derive(Serialize)]
struct Body<'a> {
    v: u32,
    seq: u64,
    time: &'a str,
    sandbox: &'a str,
    #[serde(flatten)]
    event: &'a Event,
    prev: &'a str,
}

/// Splits a line (without newline) into the hashed body (with `}` restored) and the stored
/// hash, or says why the line does not end with the hash member.
fn split_hash(line: &[u8]) -> Result<(Vec<u8>, &str), String> {
    // Suffix: ,"hash":"<64 lowercase hex>"}
    let suffix_len = HASH_MEMBER.len() + 64 + 2;
    if line.len() < suffix_len + 2 {
        return Err("line too short to carry a hash".to_owned());
    }
    let cut = line.len() - suffix_len;
    let (body, suffix) = line.split_at(cut);
    let hex_part = suffix
        .get(HASH_MEMBER.len()..HASH_MEMBER.len() + 64)
        .unwrap_or_default();
    if !suffix.starts_with(HASH_MEMBER)
        || !suffix.ends_with(b"\"}")
        || !hex_part
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    {
        return Err("line does not end with the hash member".to_owned());
    }
    let stored = std::str::from_utf8(hex_part).map_err(|e| e.to_string())?;
    let mut hashed = body.to_vec();
    hashed.push(b'}');
    Ok((hashed, stored))
}

/// What [`AuditLog::append`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The record as written.
    pub record: Record,
    /// The chain's new end; keep it outside the log to detect later truncation.
    pub anchor: Anchor,
}

/// What [`AuditLog::append_capped`] did.
#[derive(Debug)]
pub enum Capped {
    /// The record was written.
    Written(Appended),
    /// The cap was reached: the `truncated` record was written instead.
    Truncated(Appended),
    /// The log had already been truncated: nothing was written.
    Dropped,
}

/// Which records an append lets through.
enum Admit<'a> {
    /// Every one.
    All,
    /// Up to a size cap, then one `truncated` record, then none.
    Cap(u64),
    /// Those the function agrees to, given the log's size and the record's length.
    If(&'a mut dyn FnMut(u64, u64) -> bool),
}

/// A writer for one sandbox's log. Several processes may hold one for the same file: each
/// append takes an exclusive `flock` for read-last-line + write + fsync.
#[derive(Debug)]
pub struct AuditLog {
    file: File,
    path: PathBuf,
    sandbox: String,
}

/// Releases the flock when dropped (also on error paths).
struct LockGuard<'a>(&'a File);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = rustix::fs::flock(self.0, FlockOperation::Unlock) {
            tracing::warn!(error = %e, "cannot release audit log lock");
        }
    }
}

impl AuditLog {
    /// Opens (creating with mode 0600 if missing) the log at `path` for `sandbox_id`. The
    /// parent directory must exist. A symlink at `path` is refused (O_NOFOLLOW).
    pub fn open(path: impl Into<PathBuf>, sandbox_id: &str) -> Result<Self, AuditError> {
        let path = path.into();
        check_sandbox_id(sandbox_id)?;
        let open_err = |source| AuditError::Open {
            path: path.clone(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.read(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW);
        let (file, created) = match opts.clone().create_new(true).open(&path) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                (opts.open(&path).map_err(open_err)?, false)
            }
            Err(e) => return Err(open_err(e)),
        };
        if created {
            // Make the new directory entry durable too.
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(open_err)?;
        }
        let meta = file.metadata().map_err(open_err)?;
        if !meta.is_file() {
            return Err(open_err(io::Error::other("not a regular file")));
        }
        Ok(AuditLog {
            file,
            path,
            sandbox: sandbox_id.to_owned(),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record and fsyncs it; returns the record and the new [`Anchor`].
    ///
    /// Under an exclusive flock: reads the last line (refusing a torn or invalid one), builds
    /// the record with `seq = last + 1` and `prev = sha256(last line)`, writes it with
    /// `write(2)` on the O_APPEND descriptor, then `fdatasync`. A failed write is rolled back
    /// (`ftruncate` to the old length) and returned as [`AuditError::Write`].
    pub fn append(&self, event: &Event) -> Result<Appended, AuditError> {
        let mut all = self.append_all(std::slice::from_ref(event))?;
        all.pop().ok_or_else(|| AuditError::InvalidEvent {
            kind: event.kind(),
            reason: "nothing was appended".to_owned(),
        })
    }

    /// Appends several records as one batch: one lock, one `write(2)` of all lines, one
    /// `fdatasync` (for busy writers such as the proxy, which can queue `net` records and
    /// flush them together). All or nothing: a failed write rolls the whole batch back.
    pub fn append_all(&self, events: &[Event]) -> Result<Vec<Appended>, AuditError> {
        self.append_batch(events, None)
    }

    /// Appends one record unless the log has reached `limit_bytes`: the record that would
    /// cross the cap is replaced by one `truncated` record (part of the hash chain, so
    /// `verify` passes), and every capped append after it writes nothing. Used for the
    /// records that can flood (`net`); lifecycle records use [`AuditLog::append`].
    pub fn append_capped(&self, event: &Event, limit_bytes: u64) -> Result<Capped, AuditError> {
        let mut out = self.append_batch(std::slice::from_ref(event), Some(limit_bytes))?;
        Ok(match out.pop() {
            None => Capped::Dropped,
            Some(a) if matches!(a.record.event, Event::Truncated { .. }) => Capped::Truncated(a),
            Some(a) => Capped::Written(a),
        })
    }

    /// Appends one record if `admit(size, len)` agrees, where `size` is the log's length
    /// before the append and `len` the length of the record's line, both taken under the
    /// log's lock: writers in several processes (the proxy, the seccomp supervisor, the
    /// runtime) share one view of the log's size. Returns `None` when `admit` refused.
    pub fn append_if(
        &self,
        event: &Event,
        admit: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<Option<Appended>, AuditError> {
        let mut out = self.append_batch_admit(std::slice::from_ref(event), Admit::If(admit))?;
        Ok(out.pop())
    }

    fn append_batch(
        &self,
        events: &[Event],
        limit_bytes: Option<u64>,
    ) -> Result<Vec<Appended>, AuditError> {
        match limit_bytes {
            Some(limit) => self.append_batch_admit(events, Admit::Cap(limit)),
            None => self.append_batch_admit(events, Admit::All),
        }
    }

    fn append_batch_admit(
        &self,
        events: &[Event],
        mut admit: Admit<'_>,
    ) -> Result<Vec<Appended>, AuditError> {
        for event in events {
            check_event(event)?;
        }
        let Some(first) = events.first() else {
            return Ok(Vec::new());
        };
        rustix::fs::flock(&self.file, FlockOperation::LockExclusive).map_err(|e| {
            AuditError::Lock {
                path: self.path.clone(),
                source: e.into(),
            }
        })?;
        let _guard = LockGuard(&self.file);

        let len = self
            .file
            .metadata()
            .map_err(|source| AuditError::Read {
                path: self.path.clone(),
                source,
            })?
            .len();
        let (seq, prev, last_truncated) = match self.last_line(len)? {
            None => (1, genesis(&self.sandbox), false),
            Some(line) => {
                let last: Record =
                    serde_json::from_slice(&line).map_err(|e| AuditError::CorruptTail {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    })?;
                if last.sandbox != self.sandbox {
                    return Err(AuditError::SandboxMismatch {
                        path: self.path.clone(),
                        expected: self.sandbox.clone(),
                        found: last.sandbox,
                    });
                }
                let truncated = matches!(last.event, Event::Truncated { .. });
                (last.seq.saturating_add(1), sha256_hex(&line), truncated)
            }
        };

        let (mut batch, mut out) = self.lines(events, seq, prev.clone())?;
        let mut first_kind = first.kind();
        match &mut admit {
            Admit::All => {}
            Admit::If(f) => {
                if !f(len, batch.len() as u64) {
                    return Ok(Vec::new());
                }
            }
            Admit::Cap(limit) => {
                let limit = *limit;
                if len.saturating_add(batch.len() as u64) > limit {
                    if last_truncated {
                        return Ok(Vec::new());
                    }
                    let marker = Event::Truncated {
                        limit_bytes: limit,
                        size_bytes: len,
                        dropped_kind: first.kind().to_owned(),
                    };
                    (batch, out) = self.lines(std::slice::from_ref(&marker), seq, prev)?;
                    first_kind = marker.kind();
                }
            }
        }

        self.write_line(&batch, len, first_kind)?;
        let last_seq = out.last().map_or(seq, |a| a.record.seq);
        self.file.sync_data().map_err(|source| AuditError::Sync {
            path: self.path.clone(),
            seq: last_seq,
            source,
        })?;
        tracing::debug!(path = %self.path.display(), seq = last_seq, records = out.len(), "audit records appended");
        Ok(out)
    }

    /// The lines of `events` chained from `seq` and `prev`, and the records they hold.
    fn lines(
        &self,
        events: &[Event],
        mut seq: u64,
        mut prev: String,
    ) -> Result<(Vec<u8>, Vec<Appended>), AuditError> {
        let mut batch = Vec::new();
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            let kind = event.kind();
            let time = Utc::now().to_rfc3339_opts(SecondsFormat::Nanos, true);
            let body = Body {
                v: FORMAT_VERSION,
                seq,
                time: &time,
                sandbox: &self.sandbox,
                event,
                prev: &prev,
            };
            let mut line = serde_json::to_vec(&body)
                .map_err(|source| AuditError::Serialize { kind, source })?;
            let hash = sha256_hex(&line);
            line.pop(); // the closing brace; serde_json always ends an object with it
            line.extend_from_slice(HASH_MEMBER);
            line.extend_from_slice(hash.as_bytes());
            line.extend_from_slice(b"\"}");
            if line.len() + 1 > MAX_LINE {
                return Err(AuditError::TooLarge {
                    kind,
                    len: line.len() + 1,
                    limit: MAX_LINE,
                });
            }
            let head = sha256_hex(&line);
            batch.extend_from_slice(&line);
            batch.push(b'\n');
            out.push(Appended {
                anchor: Anchor {
                    seq,
                    head: head.clone(),
                },
                record: Record {
                    v: FORMAT_VERSION,
                    seq,
                    time,
                    sandbox: self.sandbox.clone(),
                    event: event.clone(),
                    prev: std::mem::replace(&mut prev, head),
                    hash,
                },
            });
            seq = seq.saturating_add(1);
        }
        Ok((batch, out))
    }

    /// Writes the line with `write(2)` on the O_APPEND descriptor: one call, unless the kernel
    /// writes short, when the rest follows under the same lock (so the real errno, e.g.
    /// ENOSPC, is what the caller sees). Any failure is rolled back to `old_len`.
    fn write_line(&self, line: &[u8], old_len: u64, kind: &'static str) -> Result<(), AuditError> {
        if let Err(source) = (&self.file).write_all(line) {
            if let Err(e) = self.file.set_len(old_len) {
                return Err(AuditError::Rollback {
                    path: self.path.clone(),
                    source: e,
                });
            }
            return Err(AuditError::Write {
                path: self.path.clone(),
                kind,
                source,
            });
        }
        Ok(())
    }

    /// The last complete line (without newline), `None` for an empty file; a torn tail is an
    /// error.
    fn last_line(&self, len: u64) -> Result<Option<Vec<u8>>, AuditError> {
        if len == 0 {
            return Ok(None);
        }
        let read_err = |source| AuditError::Read {
            path: self.path.clone(),
            source,
        };
        let window = len.min(MAX_LINE as u64 + 1);
        let start = len - window;
        let mut buf =
            vec![0u8; usize::try_from(window).map_err(|e| read_err(io::Error::other(e)))?];
        self.file.read_exact_at(&mut buf, start).map_err(read_err)?;
        if buf.last() != Some(&b'\n') {
            return Err(self.torn_tail_error()?);
        }
        buf.pop();
        match buf.iter().rposition(|&b| b == b'\n') {
            Some(i) => Ok(Some(buf.split_off(i + 1))),
            None if start == 0 => Ok(Some(buf)),
            None => Err(AuditError::CorruptTail {
                path: self.path.clone(),
                reason: format!("last line longer than {MAX_LINE} bytes"),
            }),
        }
    }

    fn torn_tail_error(&self) -> Result<AuditError, AuditError> {
        let data = read_all(&self.path)?;
        let (line, offset, bytes) = torn_fragment(&data);
        Ok(AuditError::TornTail {
            path: self.path.clone(),
            line,
            offset,
            bytes,
        })
    }
}

/// (line number, offset, length) of the fragment after the last newline.
fn torn_fragment(data: &[u8]) -> (u64, u64, u64) {
    let offset = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let newlines = data.iter().filter(|&&b| b == b'\n').count();
    (
        newlines as u64 + 1,
        offset as u64,
        (data.len() - offset) as u64,
    )
}

fn read_all(path: &Path) -> Result<Vec<u8>, AuditError> {
    let read_err = |source| AuditError::Read {
        path: path.to_owned(),
        source,
    };
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(read_err)?;
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(read_err)?;
    Ok(data)
}

/// One line as the streaming reader sees it.
enum Line {
    /// A newline-terminated line (newline removed).
    Complete(Vec<u8>),
    /// The file ends with this many bytes and no newline.
    Torn(u64),
    /// A line longer than [`MAX_LINE`].
    TooLong,
}

/// Reads the log line by line without holding more than one line (at most [`MAX_LINE`]).
struct Lines {
    reader: io::BufReader<io::Take<File>>,
    path: PathBuf,
}

impl Lines {
    fn open(path: &Path) -> Result<Self, AuditError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|source| AuditError::Read {
                path: path.to_owned(),
                source,
            })?;
        // The length under a shared lock is a consistent snapshot: every byte before it
        // belongs to a finished append (writers roll back only what they added after it).
        rustix::fs::flock(&file, FlockOperation::LockShared).map_err(|e| AuditError::Lock {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let len = {
            let _guard = LockGuard(&file);
            file.metadata()
                .map_err(|source| AuditError::Read {
                    path: path.to_owned(),
                    source,
                })?
                .len()
        };
        Ok(Lines {
            reader: io::BufReader::new(file.take(len)),
            path: path.to_owned(),
        })
    }

    fn next_line(&mut self) -> Result<Option<Line>, AuditError> {
        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Read {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            return Ok(Some(Line::Complete(buf)));
        }
        if buf.len() > MAX_LINE {
            return Ok(Some(Line::TooLong));
        }
        Ok(Some(Line::Torn(buf.len() as u64)))
    }
}

/// A point of the chain kept outside the log (e.g. in the sandbox state): line `seq` of the
/// log must still hash to `head`. It catches cutting records off the end and rewriting the
/// chain from an earlier line, which a keyless chain alone cannot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Anchor {
    /// Line number (= seq) of the anchored record; 0 anchors the empty log.
    pub seq: u64,
    /// sha256 (hex) of that line's bytes without the newline.
    pub head: String,
}

impl VerifyReport {
    /// The anchor for the log's current end.
    pub fn anchor(&self) -> Anchor {
        Anchor {
            seq: self.records,
            head: self.head.clone(),
        }
    }
}

/// Checks every line of the log at `path`: its own hash, `seq` equal to the line number,
/// `prev` equal to the hash of the line before (genesis for line 1), one sandbox id, and a
/// final newline. Returns the first break as [`AuditError::Broken`]. The file is streamed.
///
/// A keyless chain proves the log is internally consistent. Cutting records off the end, or
/// rewriting the tail with recomputed hashes, is only detectable against an [`Anchor`] kept
/// elsewhere: see [`verify_with_anchor`].
pub fn verify(path: &Path) -> Result<VerifyReport, AuditError> {
    verify_inner(path, None)
}

/// [`verify`], and also require that line `anchor.seq` still hashes to `anchor.head`
/// ([`Broken::AnchorMismatch`] or [`Broken::Truncated`] otherwise).
pub fn verify_with_anchor(path: &Path, anchor: &Anchor) -> Result<VerifyReport, AuditError> {
    verify_inner(path, Some(anchor))
}

fn verify_inner(path: &Path, anchor: Option<&Anchor>) -> Result<VerifyReport, AuditError> {
    let broken = |line: u64, problem| AuditError::Broken {
        path: path.to_owned(),
        line,
        verified: line - 1,
        problem,
    };
    let mut lines = Lines::open(path)?;
    let mut chain = Chain::default();
    let mut n: u64 = 0;
    let mut truncated = None;
    while let Some(line) = lines.next_line()? {
        let line_no = n + 1;
        let line = line.complete().map_err(|p| broken(line_no, p))?;
        let rec = chain
            .check(&line, line_no, anchor)
            .map_err(|p| broken(line_no, p))?;
        if truncated.is_none() && matches!(rec.event, Event::Truncated { .. }) {
            truncated = Some(line_no);
        }
        n = line_no;
    }
    if let Some(a) = anchor
        && a.seq > n
    {
        return Err(broken(
            n + 1,
            Broken::Truncated {
                anchored: a.seq,
                found: n,
            },
        ));
    }
    let head = match (chain.prev, &chain.sandbox) {
        (Some(h), _) => h,
        (None, Some(s)) => genesis(s),
        (None, None) => String::new(),
    };
    Ok(VerifyReport {
        records: n,
        head,
        truncated,
    })
}

impl Line {
    /// The line, if it is a complete one of at most [`MAX_LINE`] bytes.
    fn complete(self) -> Result<Vec<u8>, Broken> {
        match self {
            Line::Complete(l) => Ok(l),
            Line::Torn(bytes) => Err(Broken::TornLine { bytes }),
            Line::TooLong => Err(Broken::Malformed {
                reason: format!("line longer than {MAX_LINE} bytes"),
            }),
        }
    }
}

/// The chain as far as [`verify`] has checked it: the hash the next line's `prev` must
/// name, and the one sandbox id of the log.
#[derive(Default)]
struct Chain {
    prev: Option<String>,
    sandbox: Option<String>,
}

impl Chain {
    /// Checks line `line_no`: its own hash, its format version, its sandbox id, its `seq`,
    /// its `prev`, and the anchor when it names this line; then moves the chain on to it.
    fn check(
        &mut self,
        line: &[u8],
        line_no: u64,
        anchor: Option<&Anchor>,
    ) -> Result<Record, Broken> {
        let (hashed, stored) = split_hash(line).map_err(|reason| Broken::Malformed { reason })?;
        let computed = sha256_hex(&hashed);
        if computed != stored {
            return Err(Broken::HashMismatch {
                stored: stored.to_owned(),
                computed,
            });
        }
        let rec: Record = serde_json::from_slice(line).map_err(|e| Broken::Malformed {
            reason: e.to_string(),
        })?;
        if rec.v != FORMAT_VERSION {
            return Err(Broken::Malformed {
                reason: format!("unsupported format version {}", rec.v),
            });
        }
        let first_sandbox = self.sandbox.get_or_insert_with(|| rec.sandbox.clone());
        if *first_sandbox != rec.sandbox {
            return Err(Broken::SandboxMismatch {
                expected: first_sandbox.clone(),
                found: rec.sandbox,
            });
        }
        if rec.seq != line_no {
            return Err(Broken::SeqMismatch {
                expected: line_no,
                found: rec.seq,
            });
        }
        let want_prev = self.prev.take().unwrap_or_else(|| genesis(&rec.sandbox));
        if rec.prev != want_prev {
            return Err(Broken::PrevMismatch {
                expected: want_prev,
                found: rec.prev,
            });
        }
        let line_hash = sha256_hex(line);
        if let Some(a) = anchor
            && a.seq == line_no
            && a.head != line_hash
        {
            return Err(Broken::AnchorMismatch {
                expected: a.head.clone(),
                found: line_hash,
            });
        }
        self.prev = Some(line_hash);
        Ok(rec)
    }
}

/// Parses every complete line of the log (no chain checks: use [`verify`] for that). A torn
/// last line is ignored; a malformed complete line is an error.
pub fn read_records(path: &Path) -> Result<Vec<Record>, AuditError> {
    let mut lines = Lines::open(path)?;
    let mut out = Vec::new();
    let mut line_no = 0u64;
    while let Some(line) = lines.next_line()? {
        line_no += 1;
        let malformed = |reason: String| AuditError::Broken {
            path: path.to_owned(),
            line: line_no,
            verified: 0,
            problem: Broken::Malformed { reason },
        };
        match line {
            Line::Complete(l) => {
                out.push(serde_json::from_slice(&l).map_err(|e| malformed(e.to_string()))?);
            }
            Line::Torn(_) => break,
            Line::TooLong => return Err(malformed(format!("line longer than {MAX_LINE} bytes"))),
        }
    }
    Ok(out)
}

/// The documented repair rule for a torn tail: under the log lock, cut the bytes after the
/// last newline and return them (so the caller can keep them as evidence). Complete lines are
/// never touched. Returns `None` when the log ends cleanly.
pub fn repair_torn_tail(path: &Path) -> Result<Option<TornTail>, AuditError> {
    let open_err = |source| AuditError::Open {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(open_err)?;
    rustix::fs::flock(&file, FlockOperation::LockExclusive).map_err(|e| AuditError::Lock {
        path: path.to_owned(),
        source: e.into(),
    })?;
    let _guard = LockGuard(&file);
    let data = read_all(path)?;
    if data.is_empty() || data.last() == Some(&b'\n') {
        return Ok(None);
    }
    let (line, offset, _) = torn_fragment(&data);
    let fragment = data
        .get(usize::try_from(offset).unwrap_or(data.len())..)
        .unwrap_or_default()
        .to_vec();
    let write_err = |source| AuditError::Write {
        path: path.to_owned(),
        kind: "repair",
        source,
    };
    file.set_len(offset).map_err(write_err)?;
    file.sync_all().map_err(write_err)?;
    tracing::warn!(path = %path.display(), line, offset, bytes = fragment.len(), "cut torn audit log tail");
    Ok(Some(TornTail {
        line,
        offset,
        fragment,
    }))
}

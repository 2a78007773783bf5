//! The one error for a file the runtime could not read, parse, encode or write.
//!
//! Every module that reads or writes a file of its own (state files, the containerd and Docker
//! configurations, a sidecar's pid file, the change store's records) reports a failure as a
//! [`FileError`]: it names the file and what was being done to it (`cannot read PATH`,
//! `cannot parse PATH`, `cannot encode PATH`, `cannot write PATH`), and keeps the cause as its
//! [`source`](std::error::Error::source), so the binary's chain prints it after a colon. A
//! module whose file needs more words than that (`change record PATH is corrupt`, `PATH is not
//! valid TOML`) keeps its own variant for it.
//!
//! [`read`], [`read_json`] and [`write`] are the plain sequences the modules repeated
//! (`std::fs` plus the error naming the file).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// What was being done to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    /// Reading its bytes (or opening it to read).
    Read,
    /// Decoding what was read (JSON).
    Parse,
    /// Encoding a value to write (JSON).
    Encode,
    /// Creating or replacing it, or writing into it.
    Write,
}

impl FileOp {
    fn verb(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Parse => "parse",
            Self::Encode => "encode",
            Self::Write => "write",
        }
    }
}

/// The cause, kept whole for the error chain.
#[derive(Debug)]
enum Cause {
    Io(std::io::Error),
    Json(serde_json::Error),
}

/// A file could not be read, parsed, encoded or written: `cannot OP PATH`, caused by an I/O or
/// a JSON error.
#[derive(Debug)]
pub struct FileError {
    op: FileOp,
    path: PathBuf,
    cause: Cause,
}

impl FileError {
    /// `path` could not be read (or opened to read).
    pub fn read(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Self::new(FileOp::Read, path, Cause::Io(source))
    }

    /// What was read from `path` is not the JSON expected.
    pub fn parse(path: impl AsRef<Path>, source: serde_json::Error) -> Self {
        Self::new(FileOp::Parse, path, Cause::Json(source))
    }

    /// The value meant for `path` could not be encoded.
    pub fn encode(path: impl AsRef<Path>, source: serde_json::Error) -> Self {
        Self::new(FileOp::Encode, path, Cause::Json(source))
    }

    /// `path` could not be created, replaced or written.
    pub fn write(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Self::new(FileOp::Write, path, Cause::Io(source))
    }

    fn new(op: FileOp, path: impl AsRef<Path>, cause: Cause) -> Self {
        Self {
            op,
            path: path.as_ref().to_owned(),
            cause,
        }
    }

    /// The file named by the error.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was being done to it.
    pub fn op(&self) -> FileOp {
        self.op
    }

    /// The I/O error behind a failed read or write (`None` for a parse or encode error).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match &self.cause {
            Cause::Io(e) => Some(e),
            Cause::Json(_) => None,
        }
    }

    /// A failed read's path and I/O error (for a module that gives a failed read its own
    /// meaning); any other error comes back as it was.
    pub fn into_read(self) -> Result<(PathBuf, std::io::Error), Self> {
        match self.cause {
            Cause::Io(source) if self.op == FileOp::Read => Ok((self.path, source)),
            cause => Err(Self { cause, ..self }),
        }
    }

    /// Whether a read failed because there is no such file.
    pub fn is_not_found(&self) -> bool {
        self.op == FileOp::Read
            && self
                .io_error()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot {} {}", self.op.verb(), self.path.display())
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Io(e) => Some(e),
            Cause::Json(e) => Some(e),
        }
    }
}

/// The bytes of `path`.
pub fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    std::fs::read(path).map_err(|e| FileError::read(path, e))
}

/// The text of `path`.
pub fn read_to_string(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|e| FileError::read(path, e))
}

/// The text of `path`, `None` when there is no such file.
pub fn read_to_string_if_present(path: &Path) -> Result<Option<String>, FileError> {
    match read_to_string(path) {
        Err(e) if e.is_not_found() => Ok(None),
        other => other.map(Some),
    }
}

/// The JSON value in `path`.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, FileError> {
    parse_json(path, &read(path)?)
}

/// `bytes`, read from `path`, as a JSON value.
pub fn parse_json<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, FileError> {
    serde_json::from_slice(bytes).map_err(|e| FileError::parse(path, e))
}

/// Creates `dir` and its missing parents with mode 0700; an existing directory is left as
/// it is.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to `path` as `std::fs::write` does (not atomically: for a file other
/// processes read while it changes, use `state::write_atomic`).
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), FileError> {
    std::fs::write(path, bytes).map_err(|e| FileError::write(path, e))
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// The error and its causes as the binary prints them (`anyhow`'s `{:#}`).
    fn chain(err: &FileError) -> String {
        agent_sandbox_proxy::error_text::chain(err)
    }

    #[test]
    fn each_operation_names_the_file_and_keeps_its_cause() {
        let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let json = || serde_json::from_str::<u32>("x").unwrap_err();
        let path = Path::new("/r/sandbox/a/sandbox.json");
        for (err, text) in [
            (FileError::read(path, io()), "cannot read"),
            (FileError::parse(path, json()), "cannot parse"),
            (FileError::encode(path, json()), "cannot encode"),
            (FileError::write(path, io()), "cannot write"),
        ] {
            assert_eq!(err.to_string(), format!("{text} /r/sandbox/a/sandbox.json"));
            assert_eq!(err.path(), path);
            let cause = err.source().expect("the cause is kept").to_string();
            assert!(!cause.is_empty());
            assert_eq!(chain(&err), format!("{err}: {cause}"));
        }
    }

    #[test]
    fn the_cause_is_the_original_error() {
        let err = FileError::read("x", std::io::Error::other("disk on fire"));
        let source = err.source().unwrap();
        let io = source.downcast_ref::<std::io::Error>().unwrap();
        assert_eq!(io.to_string(), "disk on fire");
        assert_eq!(err.io_error().unwrap().to_string(), "disk on fire");

        let err = FileError::parse("x", serde_json::from_str::<u32>("[]").unwrap_err());
        assert!(err.source().unwrap().is::<serde_json::Error>());
        assert!(err.io_error().is_none());
        assert_eq!(err.op(), FileOp::Parse);
    }

    #[test]
    fn read_json_names_the_file_in_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let err = read_json::<u32>(&missing).unwrap_err();
        assert_eq!(err.op(), FileOp::Read);
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            format!("cannot read {}", missing.display())
        );
        assert!(
            chain(&err).ends_with("No such file or directory (os error 2)"),
            "{}",
            chain(&err)
        );

        let bad = dir.path().join("bad.json");
        write(&bad, "{").unwrap();
        let err = read_json::<u32>(&bad).unwrap_err();
        assert_eq!(err.op(), FileOp::Parse);
        assert!(!err.is_not_found());
        assert_eq!(err.to_string(), format!("cannot parse {}", bad.display()));
        assert!(chain(&err).contains("expected u32"), "{}", chain(&err));

        let good = dir.path().join("good.json");
        write(&good, "7").unwrap();
        assert_eq!(read_json::<u32>(&good).unwrap(), 7);
        assert_eq!(read_to_string(&good).unwrap(), "7");
        assert_eq!(
            read_to_string_if_present(&good).unwrap().as_deref(),
            Some("7")
        );
        assert_eq!(read_to_string_if_present(&missing).unwrap(), None);
        // Anything but a missing file is still an error, naming the file.
        let err = read_to_string_if_present(dir.path()).unwrap_err();
        assert_eq!(err.path(), dir.path());
        assert_eq!(err.op(), FileOp::Read);
    }

    #[test]
    fn into_read_gives_back_a_failed_read_only() {
        let (path, io) = FileError::read("/a", std::io::Error::other("gone"))
            .into_read()
            .unwrap();
        assert_eq!(
            (path.as_path(), io.to_string().as_str()),
            (Path::new("/a"), "gone")
        );
        let write = FileError::write("/a", std::io::Error::other("full"));
        let back = write.into_read().unwrap_err();
        assert_eq!(back.to_string(), "cannot write /a");
        assert_eq!(back.io_error().unwrap().to_string(), "full");
    }

    #[test]
    fn only_a_missing_file_is_not_found() {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(FileError::read("x", gone()).is_not_found());
        // A write into a missing directory is a failure, not an absent file.
        assert!(!FileError::write("x", gone()).is_not_found());
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!FileError::read("x", denied).is_not_found());
    }

    #[test]
    fn write_into_a_missing_directory_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/file");
        let err = write(&path, "x").unwrap_err();
        assert_eq!(err.op(), FileOp::Write);
        assert_eq!(err.path(), path);
        assert_eq!(err.to_string(), format!("cannot write {}", path.display()));
    }
}

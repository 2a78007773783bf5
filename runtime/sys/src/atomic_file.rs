//! Replacing a file atomically: write a temporary file beside it, sync it, rename it over
//! ([`write_atomic`]), or without the sync where losing the new bytes in a crash is harmless
//! ([`replace_mode`]).
//! The runtime's state files and the shim's bundle files (`address`, `shim.pid`, its saved
//! options) are read by other processes while they are rewritten; both crates use this one
//! function, which lives here because it is the crate they share.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replaces `path` with `bytes` atomically: the bytes go to a temporary file in the same
/// directory (`.NAME.XXXX.tmp`), are synced, and the file is renamed over `path`. A
/// concurrent reader opens either the old file or the new one, never a part; a crash leaves
/// one of the two (and perhaps the temporary). The file gets mode 0600.
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    write_atomic_mode(path, bytes, 0o600)
}

/// [`write_atomic`] with the file created with `mode` (less the umask, as `open(2)` does).
pub fn write_atomic_mode(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> std::io::Result<()> {
    replace(path, bytes.as_ref(), mode, true)
}

/// [`write_atomic_mode`] without the sync: a concurrent reader still sees the old file or the
/// new one, never a part, but a crash may leave the old one (or an empty new one, on file
/// systems that do not order the rename after the data). For files that are rewritten on
/// every create and delete and that the runtime can do without, where a sync would cost
/// milliseconds on a busy disk each time.
pub fn replace_mode(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> std::io::Result<()> {
    replace(path, bytes.as_ref(), mode, false)
}

fn replace(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    if sync {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("record.json");
        write_atomic(&file, b"{\"a\":1}").unwrap();
        write_atomic(&file, "{}").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn the_file_gets_the_mode_asked_for_less_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let private = dir.path().join("private");
        write_atomic(&private, "x").unwrap();
        assert_eq!(mode(&private), 0o600);
        let shared = dir.path().join("shared");
        write_atomic_mode(&shared, "x", 0o640).unwrap();
        // The umask can only take bits away.
        assert_eq!(mode(&shared) & !0o640, 0);
        assert_eq!(mode(&shared) & 0o600, 0o600);
    }

    #[test]
    fn an_unsynced_replace_also_replaces_with_the_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.json");
        replace_mode(&file, "[1]", 0o600).unwrap();
        replace_mode(&file, "[2]", 0o600).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"[2]");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_missing_directory_is_an_error_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_atomic(&dir.path().join("no/such/file"), "x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

//! The small files the shim leaves in a task's bundle for containerd and for its own later
//! runs (`address`, `shim.pid`, the persisted options, the rootfs record).

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` atomically (a synced temporary file in the same directory,
/// renamed over it): containerd, or a later shim run, reads either the old file or the new
/// one, never a part, even if this process dies mid-write.
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
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
        .tempfile_in(dir)?;
    tmp.write_all(bytes.as_ref())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("address");
        write_atomic(&file, "unix:///run/a").unwrap();
        write_atomic(&file, "unix:///run/b").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "unix:///run/b");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

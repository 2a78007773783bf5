//! Helpers the shim's unit tests share.

use std::path::Path;

/// Puts `text` at `path` as an executable script. The file the shim will exec is written by
/// a child process and renamed into place: a file this multi-threaded test process opened
/// for writing stays open in any child another test forks until that child execs, and
/// exec'ing it then fails with ETXTBSY.
pub fn write_script(path: &Path, text: &str) {
    let draft = path.with_extension("draft");
    std::fs::write(&draft, text).unwrap();
    let new = path.with_extension("new");
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&draft)
        .arg(&new)
        .status()
        .unwrap();
    assert!(status.success(), "install {} failed", new.display());
    std::fs::rename(&new, path).unwrap();
}

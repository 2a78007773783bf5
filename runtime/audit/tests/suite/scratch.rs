//! Scratch review on real overlay mounts: diff and export.

use std::fs;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use agent_sandbox_audit::{
    Change, ChangeKind, ExportTarget, FileKind, ScratchError, SizeLimit, diff, export,
    files_changed,
};
use anyhow::{Context as _, Result};

use super::mounts::Mounted;

struct Overlay {
    _dir: tempfile::TempDir,
    lower: PathBuf,
    upper: PathBuf,
    merged: PathBuf,
    root: PathBuf,
}

/// A lower layer, an overlay over it, and the agent's edits made through the mount.
fn edited_overlay(extra_opts: &str) -> Result<Overlay> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    let (lower, upper, work, merged) = (
        root.join("lower"),
        root.join("upper"),
        root.join("work"),
        root.join("merged"),
    );
    for d in [&lower, &upper, &work, &merged] {
        fs::create_dir(d)?;
    }
    fs::write(lower.join("a.txt"), "lower a\n")?;
    fs::write(lower.join("keep.txt"), "untouched\n")?;
    fs::write(lower.join("del.txt"), "to delete\n")?;
    fs::create_dir_all(lower.join("d"))?;
    fs::write(lower.join("d/x"), "x\n")?;
    fs::write(lower.join("d/y"), "y\n")?;
    fs::create_dir_all(lower.join("e"))?;
    fs::write(lower.join("e/z"), "z\n")?;
    fs::create_dir_all(lower.join("sub/dir"))?;
    fs::write(lower.join("sub/dir/f"), "f\n")?;

    let mut m = Mounted::overlay(&lower, &upper, &work, &merged, extra_opts)?;
    fs::write(merged.join("new.txt"), "brand new\n")?;
    fs::write(merged.join("a.txt"), "changed by the agent\n")?;
    fs::remove_file(merged.join("del.txt"))?;
    fs::remove_dir_all(merged.join("d"))?;
    fs::create_dir(merged.join("d"))?;
    fs::write(merged.join("d/new"), "in opaque dir\n")?;
    symlink("/etc/passwd", merged.join("evil"))?;
    fs::create_dir(merged.join("newdir"))?;
    fs::write(merged.join("newdir/f"), "nested\n")?;
    fs::write(merged.join("sub/dir/g"), "deep\n")?;
    fs::remove_file(merged.join("e/z"))?;
    m.unmount()?;
    Ok(Overlay {
        _dir: dir,
        lower,
        upper,
        merged,
        root,
    })
}

fn summary(changes: &[Change]) -> Vec<(String, ChangeKind, FileKind, u64, Option<String>)> {
    changes
        .iter()
        .map(|c| {
            (
                c.path.to_string_lossy().into_owned(),
                c.kind,
                c.file_type,
                c.size,
                c.link_target
                    .as_ref()
                    .map(|t| t.to_string_lossy().into_owned()),
            )
        })
        .collect()
}

fn expected() -> Vec<(String, ChangeKind, FileKind, u64, Option<String>)> {
    use ChangeKind::*;
    use FileKind::*;
    let s = |p: &str| p.to_owned();
    vec![
        (s("a.txt"), Modified, File, 21, None),
        (s("d"), OpaqueDir, Dir, 0, None),
        (s("d/new"), Added, File, 14, None),
        (s("del.txt"), Deleted, File, 10, None),
        (s("e/z"), Deleted, File, 2, None),
        (s("evil"), Added, Symlink, 11, Some(s("/etc/passwd"))),
        (s("new.txt"), Added, File, 10, None),
        (s("newdir"), Added, Dir, 0, None),
        (s("newdir/f"), Added, File, 7, None),
        (s("sub/dir/g"), Added, File, 5, None),
    ]
}

#[test]
fn diff_of_a_real_overlay_lists_adds_changes_deletes_opaque_and_symlinks() -> Result<()> {
    let o = edited_overlay("")?;
    // The kernel really produced the markers we interpret.
    let wh = fs::symlink_metadata(o.upper.join("del.txt"))?;
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &wh.file_type()
    ));
    assert!(xattr_present(&o.upper.join("d"), "trusted.overlay.opaque")?);
    assert_eq!(
        summary(&diff(&o.upper, Some(&o.lower))?),
        expected(),
        "upper: {}",
        o.upper.display()
    );
    Ok(())
}

#[test]
fn diff_understands_userxattr_overlays() -> Result<()> {
    let o = edited_overlay("userxattr")?;
    assert!(xattr_present(&o.upper.join("d"), "user.overlay.opaque")?);
    assert!(!xattr_present(
        &o.upper.join("d"),
        "trusted.overlay.opaque"
    )?);
    assert_eq!(summary(&diff(&o.upper, Some(&o.lower))?), expected());
    Ok(())
}

fn xattr_present(path: &Path, name: &str) -> Result<bool> {
    let mut buf = [0u8; 16];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::NODATA) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("lgetxattr {name} on {}", path.display())),
    }
}

#[test]
fn diff_without_lower_reports_everything_added_and_deletions_untyped() -> Result<()> {
    let o = edited_overlay("")?;
    let changes = diff(&o.upper, None)?;
    let del: Vec<_> = changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Deleted)
        .collect();
    assert_eq!(del.len(), 2);
    assert!(del.iter().all(|c| c.file_type == FileKind::Unknown));
    let a = changes
        .iter()
        .find(|c| c.path == Path::new("a.txt"))
        .context("a.txt")?;
    assert_eq!(a.kind, ChangeKind::Added);
    // Without lower the unchanged-but-copied-up parents show up as added directories.
    assert!(
        changes
            .iter()
            .any(|c| c.path == Path::new("sub") && c.kind == ChangeKind::Added)
    );
    Ok(())
}

#[test]
fn files_changed_record_counts_every_change() -> Result<()> {
    let o = edited_overlay("")?;
    let ev = files_changed(&diff(&o.upper, Some(&o.lower))?);
    let agent_sandbox_audit::Event::FilesChanged {
        added,
        modified,
        deleted,
        opaque_dirs,
        paths,
        truncated,
    } = ev
    else {
        anyhow::bail!("not a files_changed event: {ev:?}");
    };
    assert_eq!(
        (added, modified, deleted, opaque_dirs, truncated),
        (6, 1, 2, 1, false)
    );
    assert_eq!(paths[0], "M /a.txt");
    assert!(paths.contains(&"D /del.txt".to_owned()));
    Ok(())
}

#[test]
fn export_to_dir_round_trips_and_keeps_symlinks_as_symlinks() -> Result<()> {
    let o = edited_overlay("")?;
    // Without care, reading the upper dir's "evil" entry reads the host's /etc/passwd: this is
    // what the export must not do.
    assert_eq!(fs::read(o.upper.join("evil"))?, fs::read("/etc/passwd")?);

    let dest = o.root.join("export");
    let s = export(
        &o.upper,
        Some(&o.lower),
        &ExportTarget::Dir(dest.clone()),
        &SizeLimit::none(),
    )?;
    assert_eq!((s.files, s.dirs, s.symlinks), (5, 2, 1));
    for (rel, content) in [
        ("a.txt", "changed by the agent\n"),
        ("new.txt", "brand new\n"),
        ("d/new", "in opaque dir\n"),
        ("newdir/f", "nested\n"),
        ("sub/dir/g", "deep\n"),
    ] {
        assert_eq!(fs::read_to_string(dest.join(rel))?, content, "{rel}");
    }
    let evil = fs::symlink_metadata(dest.join("evil"))?;
    assert!(evil.file_type().is_symlink());
    assert_eq!(fs::read_link(dest.join("evil"))?, Path::new("/etc/passwd"));
    assert_eq!(
        fs::read(dest.join(".agent-sandbox-deleted"))?,
        b"del.txt\0e/z\0"
    );
    assert_eq!(fs::read(dest.join(".agent-sandbox-opaque"))?, b"d\0");
    assert_eq!(fs::read(dest.join(".agent-sandbox-skipped"))?, b"");
    // Nothing unchanged was exported.
    assert!(!dest.join("keep.txt").exists() && !dest.join("sub/dir/f").exists());
    // An existing non-empty target is refused and left alone.
    assert!(matches!(
        export(
            &o.upper,
            Some(&o.lower),
            &ExportTarget::Dir(dest.clone()),
            &SizeLimit::none()
        ),
        Err(ScratchError::TargetExists { .. })
    ));
    Ok(())
}

#[test]
fn export_to_tar_round_trips_and_keeps_symlinks_as_symlinks() -> Result<()> {
    let o = edited_overlay("")?;
    let tar_path = o.root.join("changes.tar");
    export(
        &o.upper,
        Some(&o.lower),
        &ExportTarget::Tar(tar_path.clone()),
        &SizeLimit::none(),
    )?;
    let mut ar = tar::Archive::new(fs::File::open(&tar_path)?);
    let mut seen = Vec::new();
    for entry in ar.entries()? {
        let mut e = entry?;
        let path = e.path()?.to_string_lossy().into_owned();
        let ty = e.header().entry_type();
        let link = e.link_name()?.map(|l| l.to_string_lossy().into_owned());
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut content)?;
        seen.push((
            path,
            format!("{ty:?}"),
            link,
            String::from_utf8_lossy(&content).into_owned(),
        ));
    }
    let s = |x: &str| x.to_owned();
    assert_eq!(
        seen,
        vec![
            (s("a.txt"), s("Regular"), None, s("changed by the agent\n")),
            (s("d"), s("Directory"), None, s("")),
            (s("d/new"), s("Regular"), None, s("in opaque dir\n")),
            (s("evil"), s("Symlink"), Some(s("/etc/passwd")), s("")),
            (s("new.txt"), s("Regular"), None, s("brand new\n")),
            (s("newdir"), s("Directory"), None, s("")),
            (s("newdir/f"), s("Regular"), None, s("nested\n")),
            (s("sub/dir/g"), s("Regular"), None, s("deep\n")),
            (
                s(".agent-sandbox-deleted"),
                s("Regular"),
                None,
                s("del.txt\0e/z\0")
            ),
            (s(".agent-sandbox-opaque"), s("Regular"), None, s("d\0")),
            (s(".agent-sandbox-skipped"), s("Regular"), None, s("")),
        ]
    );
    // Unpacking it elsewhere reproduces the agent's view of the changed files.
    let out = o.root.join("unpacked");
    tar::Archive::new(fs::File::open(&tar_path)?).unpack(&out)?;
    assert_eq!(
        fs::read_to_string(out.join("a.txt"))?,
        fs::read_to_string(o.upper.join("a.txt"))?
    );
    assert!(
        fs::symlink_metadata(out.join("evil"))?
            .file_type()
            .is_symlink()
    );
    // An existing tar target is refused.
    assert!(matches!(
        export(
            &o.upper,
            Some(&o.lower),
            &ExportTarget::Tar(tar_path),
            &SizeLimit::none()
        ),
        Err(ScratchError::TargetExists { .. })
    ));
    let _ = &o.merged;
    Ok(())
}

#[test]
fn symlinked_directories_in_upper_are_not_walked_or_exported_through() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let upper = dir.path().join("upper");
    fs::create_dir(&upper)?;
    symlink("/etc", upper.join("etc-link"))?;
    fs::write(upper.join("ok"), "ok")?;
    fs::set_permissions(upper.join("ok"), fs::Permissions::from_mode(0o4755))?;
    let changes = diff(&upper, None)?;
    assert_eq!(changes.len(), 2, "{changes:?}");
    let dest = dir.path().join("out");
    export(
        &upper,
        None,
        &ExportTarget::Dir(dest.clone()),
        &SizeLimit::none(),
    )?;
    assert_eq!(fs::read_link(dest.join("etc-link"))?, Path::new("/etc"));
    // Set-id bits are dropped on export.
    assert_eq!(
        fs::metadata(dest.join("ok"))?.permissions().mode() & 0o7777,
        0o755
    );
    // The upper dir itself being a symlink is refused.
    let link = dir.path().join("upper-link");
    symlink(&upper, &link)?;
    assert!(matches!(diff(&link, None), Err(ScratchError::Io { .. })));
    Ok(())
}

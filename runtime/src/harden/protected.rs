//! Paths a sandbox must not write through: the protected names found in the host workspace
//! (bound read-only over the overlay), and writable mounts that would land on a symlink in the
//! rootfs (refused).

use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden;
use libcontainer::oci_spec::runtime::Spec;

use super::SandboxError;

/// How much of the workspace `protected_in_workspace` reads, and how many protected paths
/// it binds, at most: it runs at every create.
const PROTECTED_WALK_ENTRIES: usize = 50_000;
const PROTECTED_WALK_DEPTH: usize = 32;
const PROTECTED_MAX_MOUNTS: usize = 256;

/// The protected paths that exist in the host workspace, at its top and in its
/// subdirectories (`pkg/.envrc`, a vendored repository's `.git/hooks`), bound read-only over
/// the overlay. Symlinks are neither bound nor followed: binding one would follow the link on
/// the host and show the file it points to inside the sandbox (an information leak); left in
/// the overlay it resolves inside the sandbox's own view, and writes through it never reach
/// the host. The walk does not enter `.git` directories (their protected parts are named
/// from the parent) and stops after [`PROTECTED_WALK_ENTRIES`] entries; a protected name that
/// does not exist yet, or lies past the limits, is for review and promotion to refuse
/// (docs/workspace.md). A credential store (`.ssh/`, `.netrc`: a secret name) is reported
/// only in the form the tools read (a directory for `.ssh/`, anything else for `.netrc`) and
/// is then masked; secrets are kept first when the mount cap cuts the list
/// (docs/workspace.md#secret-names).
pub(super) fn protected_in_workspace(
    spec: &Spec,
    policy: &SandboxPolicy,
) -> Vec<harden::ProtectedMount> {
    let Some(source) = harden::workspace_source(spec, policy) else {
        return Vec::new();
    };
    let names = policy.filesystem.protected_names();
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| !m.file_type().is_symlink());
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([(PathBuf::new(), 0usize)]);
    let mut seen = 0usize;
    while let Some((rel, depth)) = queue.pop_front() {
        let dir = source.join(&rel);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let entries: Vec<std::fs::DirEntry> = entries.filter_map(|e| e.ok()).collect();
        let here: std::collections::HashSet<std::ffi::OsString> =
            entries.iter().map(|e| e.file_name()).collect();
        for name in &names {
            let parts: Vec<&str> = name.as_str().split('/').collect();
            // Only names whose first part is in this directory cost an lstat.
            if !parts
                .first()
                .is_some_and(|p| here.contains(std::ffi::OsStr::new(p)))
            {
                continue;
            }
            // Every component but the last must be a real directory, not a link.
            let mut ok = true;
            let mut cur = dir.clone();
            for (i, part) in parts.iter().enumerate() {
                cur.push(part);
                let meta = std::fs::symlink_metadata(&cur);
                let last = i + 1 == parts.len();
                if !meta.as_ref().is_ok_and(|m| last || m.is_dir()) {
                    ok = false;
                    break;
                }
            }
            if ok
                && exists(&cur)
                && let Some(m) = harden::protected_path_at(spec, policy, &rel, name)
            {
                // A `.ssh` that is a file, or a `.netrc` directory, is not what the tools
                // read: the placeholder of the other kind could not be bound over it.
                let is_dir = std::fs::symlink_metadata(&cur).is_ok_and(|m| m.is_dir());
                if m.secret && is_dir != m.dir {
                    tracing::debug!(path = %cur.display(), "a secret name of the other kind is not masked");
                    continue;
                }
                found.push(m);
            }
        }
        if depth >= PROTECTED_WALK_DEPTH {
            continue;
        }
        for e in entries {
            seen += 1;
            if seen > PROTECTED_WALK_ENTRIES {
                tracing::warn!(workspace = %source.display(), limit = PROTECTED_WALK_ENTRIES, "protected paths searched only part of the workspace");
                queue.clear();
                break;
            }
            let child = e.file_name();
            if child == ".git" || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            // A protected directory is bound whole: nothing under it needs a bind of its own.
            if names
                .iter()
                .any(|n| n.is_dir() && n.as_str() == child.to_string_lossy())
            {
                continue;
            }
            queue.push_back((rel.join(&child), depth + 1));
        }
    }
    if found.len() > PROTECTED_MAX_MOUNTS {
        // Secrets first (a stable sort keeps the walk's shallow-first order within each).
        found.sort_by_key(|m| !m.secret);
        tracing::warn!(
            found = found.len(),
            limit = PROTECTED_MAX_MOUNTS,
            "too many protected paths in the workspace: only secrets and the shallowest are bound"
        );
        found.truncate(PROTECTED_MAX_MOUNTS);
    }
    found
}

/// Refuses a spec whose writable mounts (or a parent) are symlinks in the rootfs. A part
/// beneath another tmpfs of the spec is on that fresh tmpfs, not in the image: only the
/// path up to it is checked.
pub fn check_writable_destinations(spec: &Spec, rootfs: &Path) -> Result<(), SandboxError> {
    let tmpfs: Vec<&Path> = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| m.typ().as_deref() == Some("tmpfs"))
        .map(|m| m.destination().as_path())
        .collect();
    for dest in harden::writable_destinations(spec) {
        let in_image = tmpfs
            .iter()
            .filter(|t| dest.as_path() != **t && dest.starts_with(t))
            .min_by_key(|t| t.components().count())
            .map_or(dest.components().count(), |t| t.components().count());
        let mut cur = rootfs.to_path_buf();
        for comp in dest.components().skip(1).take(in_image.saturating_sub(1)) {
            cur.push(comp);
            if let Ok(meta) = std::fs::symlink_metadata(&cur)
                && meta.file_type().is_symlink()
            {
                return Err(SandboxError::SymlinkedWritable {
                    path: dest.clone(),
                    component: cur,
                });
            }
        }
    }
    Ok(())
}

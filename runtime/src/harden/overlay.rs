//! The workspace overlay's upper and work dirs, made before hardening and owned by the
//! sandbox's process user.

use std::path::Path;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::{self, OverlayDirs};
use libcontainer::oci_spec::runtime::Spec;

use super::SandboxError;
use super::ids::{id_mapping, process_host_ids};
use crate::enforce::mounts;
use crate::host::idmap::IdRange;

/// The workspace overlay's upper and work dirs under `base` (reachable, per container) when
/// `spec` has a workspace under `policy` (the effective one), owned by the sandbox's process
/// user: the top of the merged workspace is upper's, and git refuses a checkout whose top
/// belongs to another user ("dubious ownership").
pub fn overlay_dirs(
    spec: &Spec,
    policy: &SandboxPolicy,
    ids: &IdRange,
    base: &Path,
) -> Result<Option<OverlayDirs>, SandboxError> {
    if harden::workspace_source(spec, policy).is_none() {
        return Ok(None);
    }
    let upper = base.join("upper");
    let work = base.join("work");
    for d in [base, upper.as_path(), work.as_path()] {
        std::fs::create_dir_all(d).map_err(|source| SandboxError::Overlay {
            path: d.to_owned(),
            source,
        })?;
    }
    mounts::mkdir_traversable(base)?;
    let (uid, gid) = process_host_ids(spec, &id_mapping(ids));
    for d in [&upper, &work] {
        std::os::unix::fs::chown(d, Some(uid), Some(gid)).map_err(|source| {
            SandboxError::Overlay {
                path: d.clone(),
                source,
            }
        })?;
    }
    Ok(Some(OverlayDirs { upper, work }))
}

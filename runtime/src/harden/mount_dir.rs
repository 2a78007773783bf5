//! Where a sandbox's reachable mounts live on the host.

use std::path::PathBuf;

use super::SandboxError;
use crate::enforce::mounts;
use crate::state::ContainerId;
use crate::state::paths::{self, StateDirs};

/// Where the reachable mounts of a sandbox live: a directory every ancestor of
/// which the sandbox's unprivileged root can traverse. The state root cannot be
/// used for that: a caller's `--root` may sit under a 0700 directory (the shim's
/// `/run/containerd/agent-sandbox/<ns>`), and rootless `$XDG_RUNTIME_DIR` is 0700.
/// As real root: `/run/agent-sandbox/mnt/<tag>/<id>`; rootless:
/// `/tmp/agent-sandbox-<host uid>/<tag>/<id>`, where `<tag>` is a short hash of
/// the state root, so equal ids under different roots never collide. The path
/// is recorded in `sandbox.json`, and cleanup uses the recorded one.
pub fn mount_dir(dirs: &StateDirs, id: &ContainerId) -> Result<PathBuf, SandboxError> {
    use sha2::Digest;
    let tag = hex::encode(&sha2::Sha256::digest(dirs.root.as_os_str().as_encoded_bytes())[..6]);
    let base = if paths::rootless()? {
        let host_uid = host_uid_of_self().unwrap_or_else(|| nix::unistd::geteuid().as_raw());
        let top = PathBuf::from(format!("/tmp/agent-sandbox-{host_uid}"));
        mounts::mkdir_traversable(&top)?;
        top
    } else {
        let top = PathBuf::from("/run/agent-sandbox");
        mounts::mkdir_traversable(&top)?;
        let mnt = top.join("mnt");
        mounts::mkdir_traversable(&mnt)?;
        mnt
    };
    let tagged = base.join(tag);
    mounts::mkdir_traversable(&tagged)?;
    Ok(tagged.join(id.as_str()))
}

/// The host uid that our uid maps to, read from `/proc/self/uid_map`.
fn host_uid_of_self() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let me = nix::unistd::geteuid().as_raw();
    map.lines().find_map(|l| {
        let f: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        (f.len() == 3 && me >= f[0] && me - f[0] < f[2]).then(|| f[1] + (me - f[0]))
    })
}

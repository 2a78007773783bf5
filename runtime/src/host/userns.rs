//! The sandbox's user namespace, made by the runtime and owned by the sandbox's own host
//! root id (docs/limits.md, "Per-user kernel counts").
//!
//! The kernel charges each per-user count of a process in a user namespace to the
//! namespace's owner too, level by level up to the host (`kernel/ucount.c`); a namespace
//! that libcontainer makes as host root (as runc's) charges the sandbox's inotify instances,
//! namespaces, message-queue bytes and pending signals to host root, so one sandbox holding
//! 128 inotify instances left host root (containerd, podman, every other sandbox) none. Here a
//! forked creator with the sandbox's host root id makes the namespace
//! (`agent_sandbox_sys::owned_userns`), writes the policy's `[ucounts]` caps into it, and the
//! runtime writes its id maps and pins it under the sandbox's mount dir; libcontainer then
//! joins the pin instead of making a namespace. A rootless runtime does the same inside
//! podman's namespace (the owner is then the invoking user, who is charged anyway): only so
//! can the sandbox's root be that namespace's 0, whose map takes two lines ([`map_text`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_sandbox_policy::ucounts::Ucounts;
use agent_sandbox_sys::owned_userns::{self, NsLimit, OwnedUsernsError};
use serde::{Deserialize, Serialize};

use crate::enforce::mounts::{self, MountError};
use crate::host::idmap::{IdKind, IdRange, own_map};

/// Why the sandbox's own user namespace could not be made. Nothing is left behind (the
/// creator is killed and reaped; a pin made before the failure goes with the mount dir).
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("user namespace owned by host id {owner}")]
    Create {
        owner: u32,
        #[source]
        source: OwnedUsernsError,
    },
    #[error("cannot write the sandbox's id map {path}")]
    Map {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot pin the sandbox's user namespace at {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: MountError,
    },
}

/// The sandbox's own user namespace as made: where it is pinned, whom it is charged to and
/// the caps in it (saved in `layers.json` for `agent-sandbox layers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedUserns {
    /// The bind mount of the namespace that the spec names (`linux.namespaces[user].path`).
    pub pin: PathBuf,
    /// The host id that owns the namespace: every per-user count of the sandbox is charged to
    /// it at the host's level, against the host's own per-user limits.
    pub owner: u32,
    /// The caps written in the namespace (`/proc/sys/user/max_KEY`), per user inside it.
    pub caps: BTreeMap<String, u32>,
    /// Caps of the policy whose file this kernel lacks (it has no such count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Vec<String>,
}

/// Where the sandbox's user namespace is pinned: beside the pod pins, under its mount dir
/// (the runtime's clean-up detaches everything there).
pub fn pin_path(mount_dir: &Path) -> PathBuf {
    mount_dir.join("userns")
}

/// The one line of `uid_map` and `gid_map`: container ids from 0 to the host block.
pub fn map_line(ids: &IdRange) -> String {
    format!("0 {} {}\n", ids.host_start, ids.size)
}

/// The sandbox's `uid_map` or `gid_map` text for `ids`, split along the extents of the
/// runtime's own map (`own_map`): the kernel takes each line only if it lies within one
/// extent of the parent's map. As real root (the identity map) that is [`map_line`]; in
/// rootless podman's namespace (`0 1500 1`, `1 100000 65536`) the block `0 0 65536` becomes
/// `0 0 1` and `1 1 65535`, which libcontainer cannot write (it needs newuidmap for two lines,
/// and newuidmap judges ids of the initial namespace). `None` if some id is not mapped.
pub fn map_text(ids: &IdRange, own_map: &str) -> Option<String> {
    let (start, end) = (
        u64::from(ids.host_start),
        u64::from(ids.host_start) + u64::from(ids.size),
    );
    let mut pieces: Vec<(u64, u64)> = crate::host::idmap::extents(own_map)?
        .into_iter()
        .filter_map(|(inside, _, len)| {
            let (lo, hi) = (inside.max(start), (inside + len).min(end));
            (lo < hi).then_some((lo, hi))
        })
        .collect();
    pieces.sort_unstable();
    let covered: u64 = pieces.iter().map(|(lo, hi)| hi - lo).sum();
    if covered != u64::from(ids.size) || pieces.len() > 340 {
        return None;
    }
    Some(
        pieces
            .iter()
            .map(|(lo, hi)| format!("{} {lo} {}\n", lo - start, hi - lo))
            .collect(),
    )
}

/// Makes the sandbox's user namespace owned by its host root id (`ids.host_start`), with
/// `caps` in it, its id maps written and pinned at `pin`.
pub fn create(ids: &IdRange, caps: &Ucounts, pin: &Path) -> Result<OwnedUserns, UsernsError> {
    let owner = ids.host_start;
    let create_err = |source| UsernsError::Create { owner, source };
    let list = caps.caps();
    let limits = list
        .iter()
        .map(|(key, value)| NsLimit::new(&format!("/proc/sys/user/max_{key}"), u64::from(*value)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(create_err)?;
    let creator = owned_userns::spawn(owner, owner, &limits).map_err(create_err)?;
    let pid = creator.pid();
    for (file, kind) in [("uid_map", IdKind::Uid), ("gid_map", IdKind::Gid)] {
        let path = PathBuf::from(format!("/proc/{pid}/{file}"));
        let text = own_map(kind)
            .ok()
            .and_then(|own| map_text(ids, &own))
            .ok_or_else(|| UsernsError::Map {
                path: path.clone(),
                source: std::io::Error::other(format!(
                    "the runtime's own {file} does not map host ids {}..{}",
                    ids.host_start,
                    u64::from(ids.host_start) + u64::from(ids.size)
                )),
            })?;
        std::fs::write(&path, &text).map_err(|source| UsernsError::Map {
            path: path.clone(),
            source,
        })?;
    }
    let ns = PathBuf::from(format!("/proc/{pid}/ns/user"));
    mounts::bind(&ns, pin, false).map_err(|source| UsernsError::Pin {
        path: pin.to_owned(),
        source,
    })?;
    let mut made = OwnedUserns {
        pin: pin.to_owned(),
        owner,
        caps: BTreeMap::new(),
        absent: Vec::new(),
    };
    for (i, (key, value)) in list.iter().enumerate() {
        if creator.written(i) {
            made.caps.insert((*key).to_owned(), *value);
        } else {
            made.absent.push((*key).to_owned());
        }
    }
    creator.finish();
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_map_line_from_container_root_to_the_block() {
        let ids = IdRange {
            host_start: 1_065_536,
            size: 65536,
        };
        assert_eq!(map_line(&ids), "0 1065536 65536\n");
        assert_eq!(
            pin_path(Path::new("/run/x/mounts/c1")),
            PathBuf::from("/run/x/mounts/c1/userns")
        );
    }

    /// The sandbox's block split along the runtime's own extents: whole as real root, in
    /// two lines inside rootless podman's namespace; a block the runtime cannot map is none.
    #[test]
    fn map_text_follows_the_runtimes_own_extents() {
        let block = IdRange {
            host_start: 1_000_000,
            size: 65536,
        };
        let identity = "         0          0 4294967295\n";
        assert_eq!(map_text(&block, identity).unwrap(), map_line(&block));
        let podman = "         0       1500          1\n         1     100000      65536\n";
        let nested = IdRange {
            host_start: 0,
            size: 65536,
        };
        assert_eq!(map_text(&nested, podman).unwrap(), "0 0 1\n1 1 65535\n");
        assert_eq!(map_text(&block, podman), None);
        let bigger = IdRange {
            host_start: 0,
            size: 65538,
        };
        assert_eq!(map_text(&bigger, podman), None);
    }

    /// Needs real root, as the runtime is: the namespace is owned by the block's first id,
    /// maps exactly the block, carries the caps, and outlives its creator through the pin.
    #[test]
    fn the_pinned_namespace_is_the_sandboxs_own() {
        let dir = tempfile::tempdir().unwrap();
        let pin = dir.path().join("userns");
        let ids = IdRange {
            host_start: 3_800_000,
            size: 65536,
        };
        let caps = Ucounts {
            inotify_instances: 5,
            ..Ucounts::default()
        };
        let made = create(&ids, &caps, &pin).unwrap();
        assert_eq!(made.owner, 3_800_000);
        assert_eq!(made.caps.get("inotify_instances"), Some(&5));
        let run = |args: &[&str]| {
            let out = std::process::Command::new("nsenter")
                .arg(format!("--user={}", pin.display()))
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        assert_eq!(run(&["cat", "/proc/sys/user/max_inotify_instances"]), "5");
        assert_eq!(
            run(&["cat", "/proc/self/uid_map"])
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["0", "3800000", "65536"]
        );
        assert_eq!(
            agent_sandbox_sys::owned_userns::owner_uid(&pin).unwrap(),
            3_800_000
        );
        mounts::detach(&pin).unwrap();
    }
}

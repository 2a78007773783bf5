//! `[ucounts]`: caps on the per-user kernel counts of a sandbox (docs/limits.md, "Per-user
//! kernel counts").
//!
//! The kernel counts some objects per user: inotify instances and watches, fanotify groups
//! and marks, and namespaces of each kind. A count is charged to the (user namespace, user)
//! that made the object and then, level by level, to each ancestor namespace's *owner*, each
//! level checked against that namespace's own limits (`/proc/sys/user/max_*` as seen from
//! inside it). The runtime makes the sandbox's user namespace owned by the sandbox's own
//! host root id, so what the sandbox holds is charged to that id and never to host root;
//! these caps, written into the sandbox's namespace before anything runs in it, keep each
//! user inside the sandbox well below the host's per-user budget.

use serde::{Deserialize, Serialize};

/// The largest value the kernel takes (`/proc/sys/user/max_*` are `0..=INT_MAX`).
pub const MAX_CAP: u32 = i32::MAX.unsigned_abs();

/// The `[ucounts]` table: the most of each kind that one user inside the sandbox may hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ucounts {
    pub inotify_instances: u32,
    pub inotify_watches: u32,
    pub fanotify_groups: u32,
    pub fanotify_marks: u32,
    pub user_namespaces: u32,
    pub mnt_namespaces: u32,
    pub pid_namespaces: u32,
    pub net_namespaces: u32,
    pub ipc_namespaces: u32,
    pub uts_namespaces: u32,
    pub cgroup_namespaces: u32,
    pub time_namespaces: u32,
}

impl Default for Ucounts {
    /// A quarter of the kernel's default per-user inotify instances (128), a sixth of its
    /// watches on a small host; namespaces enough for a pod of 60 containers (each makes its
    /// own mount, PID and cgroup namespace in the pod's user namespace).
    fn default() -> Self {
        Ucounts {
            inotify_instances: 32,
            inotify_watches: 32_768,
            fanotify_groups: 8,
            fanotify_marks: 8_192,
            user_namespaces: 64,
            mnt_namespaces: 64,
            pid_namespaces: 64,
            net_namespaces: 64,
            ipc_namespaces: 64,
            uts_namespaces: 64,
            cgroup_namespaces: 64,
            time_namespaces: 64,
        }
    }
}

/// Why a `[ucounts]` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UcountsViolation {
    #[error("at most {MAX_CAP} (the kernel's largest)")]
    TooLarge,
    #[error(
        "the sandbox makes one of these itself (a pod's containers one each): at least 1, or no sandbox could start"
    )]
    NeededBySandbox,
}

impl Ucounts {
    /// Each cap as `(key, value)`; the key is also the file under `/proc/sys/user/` without
    /// its `max_` prefix.
    pub fn caps(&self) -> [(&'static str, u32); 12] {
        [
            ("inotify_instances", self.inotify_instances),
            ("inotify_watches", self.inotify_watches),
            ("fanotify_groups", self.fanotify_groups),
            ("fanotify_marks", self.fanotify_marks),
            ("user_namespaces", self.user_namespaces),
            ("mnt_namespaces", self.mnt_namespaces),
            ("pid_namespaces", self.pid_namespaces),
            ("net_namespaces", self.net_namespaces),
            ("ipc_namespaces", self.ipc_namespaces),
            ("uts_namespaces", self.uts_namespaces),
            ("cgroup_namespaces", self.cgroup_namespaces),
            ("time_namespaces", self.time_namespaces),
        ]
    }

    /// The first key whose value is refused.
    pub fn validate(&self) -> Result<(), (&'static str, UcountsViolation)> {
        for (key, value) in self.caps() {
            if value > MAX_CAP {
                return Err((key, UcountsViolation::TooLarge));
            }
            // libcontainer makes the sandbox's own mount, PID, network, IPC, UTS and cgroup
            // namespaces inside its user namespace: each is charged against these caps.
            let needed = matches!(
                key,
                "mnt_namespaces"
                    | "pid_namespaces"
                    | "net_namespaces"
                    | "ipc_namespaces"
                    | "uts_namespaces"
                    | "cgroup_namespaces"
            );
            if needed && value == 0 {
                return Err((key, UcountsViolation::NeededBySandbox));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_name_every_kernel_file() {
        let u = Ucounts::default();
        u.validate().unwrap();
        let keys: Vec<&str> = u.caps().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), 12);
        assert!(keys.contains(&"inotify_instances"));
    }

    #[test]
    fn refuses_too_large_and_zero_for_the_sandbox_own_namespaces() {
        let u = Ucounts {
            inotify_watches: MAX_CAP + 1,
            ..Ucounts::default()
        };
        assert_eq!(
            u.validate(),
            Err(("inotify_watches", UcountsViolation::TooLarge))
        );
        let u = Ucounts {
            mnt_namespaces: 0,
            ..Ucounts::default()
        };
        assert_eq!(
            u.validate(),
            Err(("mnt_namespaces", UcountsViolation::NeededBySandbox))
        );
        // Zero is fine where the sandbox itself needs none: no inotify at all.
        let u = Ucounts {
            inotify_instances: 0,
            user_namespaces: 0,
            ..Ucounts::default()
        };
        u.validate().unwrap();
    }

    #[test]
    fn a_bad_value_in_a_policy_file_is_an_error_naming_its_key() {
        let err = crate::SandboxPolicy::parse("[ucounts]\npid_namespaces = 0\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("ucounts.pid_namespaces"), "{err}");
        let err = crate::SandboxPolicy::parse("[ucounts]\ninotify = 3\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("inotify"), "{err}");
        let ok =
            crate::SandboxPolicy::parse("[ucounts]\ninotify_instances = 4\n", "p.toml").unwrap();
        assert_eq!(ok.ucounts.inotify_instances, 4);
        assert_eq!(
            ok.ucounts.inotify_watches,
            Ucounts::default().inotify_watches
        );
    }
}

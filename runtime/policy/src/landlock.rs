//! The policy's Landlock ruleset as data. The runtime applies it with the `landlock`
//! crate (0.4); every type here maps 1:1 onto that crate's (`FsAccess` <->
//! `landlock::AccessFs`, `NetAccess` <-> `landlock::AccessNet`) and this module never
//! calls `restrict_self`.
//!
//! Landlock rules only add rights, so the ruleset says: read and execute everywhere,
//! write only in the scratch areas, the workspace and /dev/shm, device access in /dev, and (if the
//! kernel supports network rules) TCP connect only to the proxy port. Protected paths
//! inside writable areas are read-only bind mounts (see `harden`), which Landlock cannot
//! express as an exception under a writable parent.
//!
//! Applying it (in the runtime, inside the container before exec):
//! ```no_run
//! use landlock::{
//!     NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
//! };
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = agent_sandbox_policy::SandboxPolicy::builtin("agent")?;
//! let rs = agent_sandbox_policy::landlock::ruleset(&policy);
//! let mut created = Ruleset::default()
//!     .handle_access(rs.handled_fs_flags())?
//!     .handle_access(rs.handled_net_flags())?
//!     .create()?;
//! for rule in &rs.paths {
//!     let fd = PathFd::new(&rule.path)?;
//!     created = created.add_rule(PathBeneath::new(fd, rule.flags()))?;
//! }
//! for rule in &rs.net {
//!     created = created.add_rule(NetPort::new(rule.port, rule.flags()))?;
//! }
//! created.restrict_self()?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeSet;

use ::landlock::{AccessFs, AccessNet, BitFlags};
use serde::Serialize;

use crate::policy::{NetworkMode, SandboxPolicy};

/// One filesystem access right (`landlock::AccessFs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsAccess {
    Execute,
    WriteFile,
    ReadFile,
    ReadDir,
    RemoveDir,
    RemoveFile,
    MakeChar,
    MakeDir,
    MakeReg,
    MakeSock,
    MakeFifo,
    MakeBlock,
    MakeSym,
    Refer,
    Truncate,
    IoctlDev,
}

impl FsAccess {
    /// Every right up to Landlock ABI 5 (the rights this policy handles).
    pub const ALL: [FsAccess; 16] = [
        FsAccess::Execute,
        FsAccess::WriteFile,
        FsAccess::ReadFile,
        FsAccess::ReadDir,
        FsAccess::RemoveDir,
        FsAccess::RemoveFile,
        FsAccess::MakeChar,
        FsAccess::MakeDir,
        FsAccess::MakeReg,
        FsAccess::MakeSock,
        FsAccess::MakeFifo,
        FsAccess::MakeBlock,
        FsAccess::MakeSym,
        FsAccess::Refer,
        FsAccess::Truncate,
        FsAccess::IoctlDev,
    ];

    /// The `landlock` crate's flag.
    pub fn to_landlock(self) -> AccessFs {
        match self {
            FsAccess::Execute => AccessFs::Execute,
            FsAccess::WriteFile => AccessFs::WriteFile,
            FsAccess::ReadFile => AccessFs::ReadFile,
            FsAccess::ReadDir => AccessFs::ReadDir,
            FsAccess::RemoveDir => AccessFs::RemoveDir,
            FsAccess::RemoveFile => AccessFs::RemoveFile,
            FsAccess::MakeChar => AccessFs::MakeChar,
            FsAccess::MakeDir => AccessFs::MakeDir,
            FsAccess::MakeReg => AccessFs::MakeReg,
            FsAccess::MakeSock => AccessFs::MakeSock,
            FsAccess::MakeFifo => AccessFs::MakeFifo,
            FsAccess::MakeBlock => AccessFs::MakeBlock,
            FsAccess::MakeSym => AccessFs::MakeSym,
            FsAccess::Refer => AccessFs::Refer,
            FsAccess::Truncate => AccessFs::Truncate,
            FsAccess::IoctlDev => AccessFs::IoctlDev,
        }
    }
}

/// One network access right (`landlock::AccessNet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetAccess {
    BindTcp,
    ConnectTcp,
}

impl NetAccess {
    /// The `landlock` crate's flag.
    pub fn to_landlock(self) -> AccessNet {
        match self {
            NetAccess::BindTcp => AccessNet::BindTcp,
            NetAccess::ConnectTcp => AccessNet::ConnectTcp,
        }
    }
}

fn flags_fs(set: &BTreeSet<FsAccess>) -> BitFlags<AccessFs> {
    set.iter()
        .fold(BitFlags::empty(), |acc, a| acc | a.to_landlock())
}

fn flags_net(set: &BTreeSet<NetAccess>) -> BitFlags<AccessNet> {
    set.iter()
        .fold(BitFlags::empty(), |acc, a| acc | a.to_landlock())
}

/// Rights granted beneath one path (`landlock::PathBeneath`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathRule {
    pub path: String,
    pub access: BTreeSet<FsAccess>,
}

impl PathRule {
    /// The rights as `landlock` flags.
    pub fn flags(&self) -> BitFlags<AccessFs> {
        flags_fs(&self.access)
    }
}

/// Rights granted for one TCP port (`landlock::NetPort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetRule {
    pub port: u16,
    pub access: BTreeSet<NetAccess>,
}

impl NetRule {
    /// The rights as `landlock` flags.
    pub fn flags(&self) -> BitFlags<AccessNet> {
        flags_net(&self.access)
    }
}

/// A complete ruleset: what is handled (denied unless a rule grants it) and the grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockRuleset {
    /// The lowest Landlock ABI that knows every handled right (5: `IoctlDev`).
    pub min_abi: u8,
    pub handled_fs: BTreeSet<FsAccess>,
    /// Network rights need ABI 4; handled in every mode, so with mode `none` no TCP
    /// connect succeeds and with mode `proxy` only the proxy port is reachable.
    pub handled_net: BTreeSet<NetAccess>,
    pub paths: Vec<PathRule>,
    pub net: Vec<NetRule>,
}

impl LandlockRuleset {
    /// Handled filesystem rights as `landlock` flags.
    pub fn handled_fs_flags(&self) -> BitFlags<AccessFs> {
        flags_fs(&self.handled_fs)
    }

    /// Handled network rights as `landlock` flags.
    pub fn handled_net_flags(&self) -> BitFlags<AccessNet> {
        flags_net(&self.handled_net)
    }

    /// The ruleset as pretty JSON (the golden-file form).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

const READ_EXEC: &[FsAccess] = &[FsAccess::Execute, FsAccess::ReadFile, FsAccess::ReadDir];

const WRITE: &[FsAccess] = &[
    FsAccess::WriteFile,
    FsAccess::RemoveDir,
    FsAccess::RemoveFile,
    FsAccess::MakeDir,
    FsAccess::MakeReg,
    FsAccess::MakeSock,
    FsAccess::MakeFifo,
    FsAccess::MakeSym,
    FsAccess::Refer,
    FsAccess::Truncate,
];

/// Compile the policy's Landlock ruleset.
pub fn ruleset(policy: &SandboxPolicy) -> LandlockRuleset {
    let set = |parts: &[&[FsAccess]]| -> BTreeSet<FsAccess> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    };
    let mut paths = vec![
        PathRule {
            path: "/".to_owned(),
            access: set(&[READ_EXEC]),
        },
        // Terminals and /dev/null need write and ioctl; device nodes cannot be created
        // (no MakeChar/MakeBlock anywhere).
        PathRule {
            path: "/dev".to_owned(),
            access: set(&[
                READ_EXEC,
                &[FsAccess::WriteFile, FsAccess::IoctlDev, FsAccess::Truncate],
            ]),
        },
        // POSIX shared memory and semaphores (shm_open, sem_open: Python
        // multiprocessing) create files here; the engine mounts a private tmpfs.
        PathRule {
            path: "/dev/shm".to_owned(),
            access: set(&[READ_EXEC, WRITE]),
        },
        // /proc/self/* writes (oom_score_adj, comm; shells open them with O_TRUNC);
        // /proc/sys is a read-only mount.
        PathRule {
            path: "/proc".to_owned(),
            access: set(&[READ_EXEC, &[FsAccess::WriteFile, FsAccess::Truncate]]),
        },
    ];
    for path in policy.filesystem.writable_paths() {
        paths.push(PathRule {
            path: path.to_string(),
            access: set(&[READ_EXEC, WRITE]),
        });
    }
    let proxy = match policy.network.mode {
        NetworkMode::Proxy => Some(policy.network.proxy_port),
        NetworkMode::None => None,
    };
    let mut ports: Vec<u16> = proxy
        .into_iter()
        .chain(policy.network.local_ports.iter().copied())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let net = ports
        .into_iter()
        .map(|port| NetRule {
            port,
            access: [NetAccess::ConnectTcp].into_iter().collect(),
        })
        .collect();
    LandlockRuleset {
        min_abi: 5,
        handled_fs: FsAccess::ALL.into_iter().collect(),
        handled_net: [NetAccess::ConnectTcp].into_iter().collect(),
        paths,
        net,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::landlock::Access;

    #[test]
    fn writes_only_in_writable_paths() {
        let policy = SandboxPolicy::builtin("agent").unwrap();
        let rs = ruleset(&policy);
        for rule in &rs.paths {
            let writable = rule.access.contains(&FsAccess::MakeReg);
            let expected = rule.path == "/dev/shm"
                || policy
                    .filesystem
                    .writable_paths()
                    .iter()
                    .any(|p| p.as_str() == rule.path);
            assert_eq!(writable, expected, "{}", rule.path);
            assert!(rs.handled_fs.is_superset(&rule.access));
        }
        assert_eq!(rs.net[0].port, 3128);
        assert!(rs.handled_fs_flags().contains(AccessFs::IoctlDev));
        assert_eq!(
            rs.handled_fs_flags(),
            AccessFs::from_all(::landlock::ABI::V5)
        );
    }

    #[test]
    fn none_mode_allows_no_tcp_connect() {
        let rs = ruleset(&SandboxPolicy::builtin("strict").unwrap());
        assert!(rs.net.is_empty());
        assert!(rs.handled_net_flags().contains(AccessNet::ConnectTcp));
    }

    #[test]
    fn local_ports_join_the_proxy_port_once_each() {
        let mut policy = SandboxPolicy::builtin("agent").unwrap();
        policy.network.local_ports = vec![8080, 3128, 5432];
        let ports: Vec<u16> = ruleset(&policy).net.iter().map(|r| r.port).collect();
        assert_eq!(ports, [3128, 5432, 8080]);
        let mut strict = SandboxPolicy::builtin("strict").unwrap();
        strict.network.local_ports = vec![9000];
        let ports: Vec<u16> = ruleset(&strict).net.iter().map(|r| r.port).collect();
        assert_eq!(ports, [9000]);
    }
}

//! The policy's Landlock ruleset as data. The runtime applies it with the raw system calls
//! (`agent_sandbox_sys::landlock_ruleset`), as the kernel's bits ([`FsAccess::bits`],
//! [`NetAccess::bits`]); the filesystem rights and the TCP rights also map 1:1 onto the
//! `landlock` crate's (`FsAccess` <-> `landlock::AccessFs`, `NetAccess` <->
//! `landlock::AccessNet`), which knows ABIs up to 9 only. This module never calls
//! `restrict_self`.
//!
//! Landlock rules only add rights, so the ruleset says: read and execute everywhere,
//! write only in the scratch areas, the workspace and /dev/shm, device access in /dev, connecting
//! to a pathname UNIX socket only there (ABI 9), and (if the kernel supports network rules) TCP
//! connect only to the proxy port and no UDP datagram to any port (ABI 10). Protected paths
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
//! let full = agent_sandbox_policy::landlock::ruleset(&policy);
//! // The rights the crate knows (the runtime measures the kernel's ABI instead).
//! let rs = agent_sandbox_policy::landlock::at_abi(&full, 7, &Default::default()).ruleset;
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
use serde::{Deserialize, Serialize};

use crate::policy::{NetworkMode, SandboxPolicy};

/// One filesystem access right (`landlock::AccessFs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
    ResolveUnix,
}

impl FsAccess {
    /// Every filesystem right up to Landlock ABI 9 (the rights this policy handles).
    pub const ALL: [FsAccess; 17] = [
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
        FsAccess::ResolveUnix,
    ];

    /// The kernel's `LANDLOCK_ACCESS_FS_*` bit (`<linux/landlock.h>`): the declaration order.
    pub fn bits(self) -> u64 {
        1 << (self as u32)
    }

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
            FsAccess::ResolveUnix => AccessFs::ResolveUnix,
        }
    }
}

/// One network access right (`LANDLOCK_ACCESS_NET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetAccess {
    BindTcp,
    ConnectTcp,
    /// `LANDLOCK_ACCESS_NET_BIND_UDP` (ABI 10).
    BindUdp,
    /// `LANDLOCK_ACCESS_NET_CONNECT_SEND_UDP` (ABI 10): setting a UDP socket's remote port,
    /// or sending a datagram to a port.
    ConnectSendUdp,
}

impl NetAccess {
    /// The `landlock` crate's flag: TCP rights only (the crate 0.4 has no UDP rights).
    pub fn to_landlock(self) -> Option<AccessNet> {
        match self {
            NetAccess::BindTcp => Some(AccessNet::BindTcp),
            NetAccess::ConnectTcp => Some(AccessNet::ConnectTcp),
            NetAccess::BindUdp | NetAccess::ConnectSendUdp => None,
        }
    }

    /// The kernel's `LANDLOCK_ACCESS_NET_*` bit (`<linux/landlock.h>`): the declaration order.
    pub fn bits(self) -> u64 {
        1 << (self as u32)
    }
}

fn flags_fs(set: &BTreeSet<FsAccess>) -> BitFlags<AccessFs> {
    set.iter()
        .fold(BitFlags::empty(), |acc, a| acc | a.to_landlock())
}

/// The TCP rights of `set` as `landlock` flags (the crate has no UDP rights).
fn flags_net(set: &BTreeSet<NetAccess>) -> BitFlags<AccessNet> {
    set.iter()
        .filter_map(|a| a.to_landlock())
        .fold(BitFlags::empty(), |acc, a| acc | a)
}

fn bits_fs(set: &BTreeSet<FsAccess>) -> u64 {
    set.iter().fold(0, |acc, a| acc | a.bits())
}

fn bits_net(set: &BTreeSet<NetAccess>) -> u64 {
    set.iter().fold(0, |acc, a| acc | a.bits())
}

/// Rights granted beneath one path (`landlock::PathBeneath`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRule {
    pub path: String,
    pub access: BTreeSet<FsAccess>,
}

impl PathRule {
    /// The rights as `landlock` flags.
    pub fn flags(&self) -> BitFlags<AccessFs> {
        flags_fs(&self.access)
    }

    /// The rights as the kernel's bits.
    pub fn bits(&self) -> u64 {
        bits_fs(&self.access)
    }
}

/// Rights granted for one TCP port (`landlock::NetPort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetRule {
    pub port: u16,
    pub access: BTreeSet<NetAccess>,
}

impl NetRule {
    /// The TCP rights as `landlock` flags.
    pub fn flags(&self) -> BitFlags<AccessNet> {
        flags_net(&self.access)
    }

    /// The rights as the kernel's bits.
    pub fn bits(&self) -> u64 {
        bits_net(&self.access)
    }
}

/// A complete ruleset: what is handled (denied unless a rule grants it) and the grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockRuleset {
    /// The lowest Landlock ABI that knows every handled right (5: `IoctlDev`).
    pub min_abi: u8,
    pub handled_fs: BTreeSet<FsAccess>,
    /// Network rights need ABI 4 (TCP) and 10 (UDP); handled in every mode but transparent
    /// egress, so with mode `none` no TCP connect succeeds and with mode `proxy` only the
    /// proxy port (and `local_ports`) is reachable; no UDP datagram is sent in either.
    pub handled_net: BTreeSet<NetAccess>,
    pub paths: Vec<PathRule>,
    pub net: Vec<NetRule>,
}

impl LandlockRuleset {
    /// Handled filesystem rights as `landlock` flags.
    pub fn handled_fs_flags(&self) -> BitFlags<AccessFs> {
        flags_fs(&self.handled_fs)
    }

    /// Handled TCP rights as `landlock` flags.
    pub fn handled_net_flags(&self) -> BitFlags<AccessNet> {
        flags_net(&self.handled_net)
    }

    /// Handled filesystem rights as the kernel's bits.
    pub fn handled_fs_bits(&self) -> u64 {
        bits_fs(&self.handled_fs)
    }

    /// Handled network rights as the kernel's bits.
    pub fn handled_net_bits(&self) -> u64 {
        bits_net(&self.handled_net)
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

/// Connecting to a pathname UNIX socket (ABI 9): granted where the sandbox may make sockets
/// (the writable paths and /dev/shm), so its processes reach each other's servers there even
/// from separate Landlock domains (every exec'd process restricts itself anew). A socket the
/// host made elsewhere (a bind-mounted `docker.sock`, `/run/systemd/journal/dev-log`) is
/// refused: `EACCES`.
const SOCKETS: &[FsAccess] = &[FsAccess::ResolveUnix];

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
            access: set(&[READ_EXEC, WRITE, SOCKETS]),
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
            access: set(&[READ_EXEC, WRITE, SOCKETS]),
        });
    }
    let proxy = match policy.network.mode {
        NetworkMode::Proxy => Some(policy.network.proxy_port),
        NetworkMode::None => None,
    };
    // Transparent egress: a tool connects to any port of an allowed name's stand-in address
    // and the netns redirects it to the proxy, so Landlock (which sees the port before the
    // redirect) cannot name the ports; the netns's own filter keeps loopback to the proxy and
    // `local_ports` instead (docs/egress.md).
    let transparent = policy.network.mode == NetworkMode::Proxy && policy.network.transparent;
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
    if transparent {
        return LandlockRuleset {
            min_abi: 9,
            handled_fs: FsAccess::ALL.into_iter().collect(),
            handled_net: BTreeSet::new(),
            paths,
            net: Vec::new(),
        };
    }
    // UDP: no port is granted. The namespace has only `lo` (no datagram leaves it anyway) and
    // the DNS stub is transparent egress's only; here a lookup fails at once with EACCES.
    // Binding is left alone, as for TCP.
    LandlockRuleset {
        min_abi: 10,
        handled_fs: FsAccess::ALL.into_iter().collect(),
        handled_net: [NetAccess::ConnectTcp, NetAccess::ConnectSendUdp]
            .into_iter()
            .collect(),
        paths,
        net,
    }
}

/// The newest Landlock ABI this crate knows (Linux 7.2: UDP rights). A newer kernel is used
/// at this ABI. What each ABI brought, and what the sandbox does with it:
/// 1-5 the rights of [`FsAccess`] and the TCP rights; 6 scopes ([`Gap::Scope`], unused);
/// 7 audit flags (`LOG_NEW_EXEC_ON`, for `fs_denied` records); 8 `RESTRICT_SELF_TSYNC`
/// (all threads of a process at once: unused, the runtime restricts a single-threaded
/// process before exec); 9 [`FsAccess::ResolveUnix`]; 10 the UDP rights of [`NetAccess`]
/// (and "quiet" rule flags, unused).
pub const NEWEST_ABI: u8 = 10;

impl FsAccess {
    /// The first Landlock ABI whose kernels know this right.
    pub fn since_abi(self) -> u8 {
        match self {
            FsAccess::Refer => 2,
            FsAccess::Truncate => 3,
            FsAccess::IoctlDev => 5,
            FsAccess::ResolveUnix => 9,
            _ => 1,
        }
    }
}

impl NetAccess {
    /// The first Landlock ABI whose kernels know this right (TCP rights came in 6.7, UDP
    /// rights in 7.2).
    pub fn since_abi(self) -> u8 {
        match self {
            NetAccess::BindTcp | NetAccess::ConnectTcp => 4,
            NetAccess::BindUdp | NetAccess::ConnectSendUdp => 10,
        }
    }
}

/// A Landlock protection the sandbox does not get from Landlock on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gap {
    /// `LANDLOCK_ACCESS_FS_REFER` (ABI 2): linking or renaming a file into another directory.
    Refer,
    /// `LANDLOCK_ACCESS_FS_TRUNCATE` (ABI 3): `truncate(2)` on a path, which Landlock's
    /// older write rights do not cover (an `open` with `O_TRUNC` needs `WRITE_FILE`).
    Truncate,
    /// `LANDLOCK_ACCESS_NET_CONNECT_TCP` (ABI 4): which TCP ports may be connected to.
    TcpConnect,
    /// `LANDLOCK_ACCESS_FS_IOCTL_DEV` (ABI 5): ioctl on device files.
    IoctlDev,
    /// `LANDLOCK_SCOPE_SIGNAL` and `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6). Not used
    /// even where the kernel has them: every exec'd process restricts itself in a Landlock
    /// domain of its own, a sibling of the init's, so scoping would cut the signals and
    /// abstract sockets between the sandbox's own processes (an exec'd `kill` of a server
    /// the init started).
    Scope,
    /// `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` (ABI 9): connecting to a pathname UNIX socket the
    /// sandbox did not make.
    ResolveUnix,
    /// `LANDLOCK_ACCESS_NET_CONNECT_SEND_UDP` (ABI 10): which UDP ports datagrams may go to.
    UdpSend,
}

impl Gap {
    /// Every gap, oldest ABI first.
    pub const ALL: [Gap; 7] = [
        Gap::Refer,
        Gap::Truncate,
        Gap::TcpConnect,
        Gap::IoctlDev,
        Gap::Scope,
        Gap::ResolveUnix,
        Gap::UdpSend,
    ];

    /// The first ABI that has the right.
    pub fn since_abi(self) -> u8 {
        match self {
            Gap::Refer => FsAccess::Refer.since_abi(),
            Gap::Truncate => FsAccess::Truncate.since_abi(),
            Gap::TcpConnect => NetAccess::ConnectTcp.since_abi(),
            Gap::IoctlDev => FsAccess::IoctlDev.since_abi(),
            Gap::Scope => 6,
            Gap::ResolveUnix => FsAccess::ResolveUnix.since_abi(),
            Gap::UdpSend => NetAccess::ConnectSendUdp.since_abi(),
        }
    }

    /// The gap's name as `layers` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Gap::Refer => "refer",
            Gap::Truncate => "truncate",
            Gap::TcpConnect => "tcp_connect",
            Gap::IoctlDev => "ioctl_dev",
            Gap::Scope => "scope",
            Gap::ResolveUnix => "resolve_unix",
            Gap::UdpSend => "udp_send",
        }
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Another layer that gives a protection Landlock does not give on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cover {
    /// ABI 1 does not handle `REFER` and then refuses every link or rename into another
    /// directory: narrower than the rule, not wider (a cross-directory `mv` fails with EXDEV).
    KernelRefusesReparenting,
    /// The root filesystem, the protected paths and /proc/sys are read-only mounts, and the
    /// image's files belong to ids outside the sandbox's mapping: a write or truncate outside
    /// the writable paths fails (EACCES from the ownership check, which newer kernels make
    /// first, or EROFS) whatever Landlock handles.
    ReadOnlyMounts,
    /// The sandbox's own network namespace has only `lo`: nothing beyond it is reachable,
    /// though every port on that `lo` is (not only the proxy's and `local_ports`).
    NetworkNamespace,
    /// Only the standard safe devices (null, zero, full, random, urandom, tty, ptmx and the
    /// pty slaves) are in the sandbox's /dev and allowed by the device cgroup.
    SafeDevices,
    /// The pid namespace keeps signals inside the sandbox; the network namespace keeps
    /// abstract unix sockets inside it.
    Namespaces,
    /// The AppArmor profile's file rules (writes only in the writable paths).
    AppArmor,
    /// The sandbox's own mount namespace: a host socket is reachable only where one of the
    /// spec's mounts brings it in.
    MountNamespace,
}

impl Cover {
    /// One line for `layers`.
    pub fn describe(self) -> &'static str {
        match self {
            Cover::KernelRefusesReparenting => {
                "the kernel refuses every link or rename into another directory (narrower)"
            }
            Cover::ReadOnlyMounts => {
                "read-only mounts (root filesystem, protected paths, /proc/sys) and image files owned outside the sandbox's ids: EROFS or EACCES outside the writable paths"
            }
            Cover::NetworkNamespace => {
                "the sandbox's network namespace (only lo; any port on lo is reachable)"
            }
            Cover::SafeDevices => "only the standard safe devices exist in /dev (device cgroup)",
            Cover::Namespaces => {
                "the pid namespace (signals) and the network namespace (abstract unix sockets)"
            }
            Cover::AppArmor => "the AppArmor profile's file rules",
            Cover::MountNamespace => {
                "the sandbox's mount namespace (a host socket is reachable only through a mount of the spec)"
            }
        }
    }
}

/// What the hardened spec (and the other layers) give that can stand in for a Landlock
/// right. The runtime measures it from the spec it hands to libcontainer
/// ([`crate::harden::cover_facts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoverFacts {
    /// `root.readonly`, with the protected paths and /proc/sys read-only too.
    pub readonly_mounts: bool,
    /// A network namespace of the sandbox's own or its pod's (never the host's).
    pub network_namespace: bool,
    /// Every device in the spec is one of the safe ones.
    pub safe_devices: bool,
    /// A pid namespace and a network namespace, never the host's.
    pub namespaces: bool,
    /// The AppArmor layer is applied too.
    pub apparmor: bool,
    /// A mount namespace of the sandbox's own.
    pub mount_namespace: bool,
}

#[cfg(test)]
impl CoverFacts {
    /// What every hardened spec gives (`harden::cover_facts` of one), AppArmor not applied:
    /// the facts the policy crate's tests plan with.
    pub(crate) fn of_hardened_spec() -> Self {
        Self {
            readonly_mounts: true,
            network_namespace: true,
            safe_devices: true,
            namespaces: true,
            apparmor: false,
            mount_namespace: true,
        }
    }
}

/// One right the kernel's Landlock lacks (or the sandbox does not use), and what covers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockGap {
    pub right: Gap,
    pub since_abi: u8,
    /// The kernel has the right but the sandbox does not use it ([`Gap::Scope`]).
    pub unused: bool,
    /// Empty: nothing covers it.
    pub covered_by: Vec<Cover>,
}

/// The policy's Landlock ruleset as this kernel can enforce it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockAtAbi {
    /// The kernel's ABI as it reported it.
    pub kernel_abi: u32,
    /// The ABI the ruleset is built for: the kernel's, at most [`NEWEST_ABI`].
    pub abi: u8,
    /// The ruleset with only the rights this ABI knows.
    pub ruleset: LandlockRuleset,
    /// What the ruleset lacks compared with the newest ABI, and what covers each.
    pub gaps: Vec<LandlockGap>,
}

impl LandlockAtAbi {
    /// The gaps nothing covers.
    pub fn uncovered(&self) -> impl Iterator<Item = &LandlockGap> {
        self.gaps.iter().filter(|g| g.covered_by.is_empty())
    }
}

/// The ruleset for a kernel with Landlock ABI `kernel_abi` (at least 1), and for every
/// right it lacks, what other layer of the sandbox covers it. Pure: the runtime decides
/// with it and `layers` reports it.
pub fn at_abi(full: &LandlockRuleset, kernel_abi: u32, facts: &CoverFacts) -> LandlockAtAbi {
    let abi = u8::try_from(kernel_abi)
        .unwrap_or(NEWEST_ABI)
        .clamp(1, NEWEST_ABI);
    let fs_known = |a: &FsAccess| a.since_abi() <= abi;
    let net_known = |a: &NetAccess| a.since_abi() <= abi;
    let ruleset = LandlockRuleset {
        min_abi: full
            .handled_fs
            .iter()
            .filter(|a| fs_known(a))
            .map(|a| a.since_abi())
            .chain(
                full.handled_net
                    .iter()
                    .filter(|a| net_known(a))
                    .map(|a| a.since_abi()),
            )
            .max()
            .unwrap_or(1),
        handled_fs: full.handled_fs.iter().copied().filter(fs_known).collect(),
        handled_net: full.handled_net.iter().copied().filter(net_known).collect(),
        paths: full
            .paths
            .iter()
            .map(|r| PathRule {
                path: r.path.clone(),
                access: r.access.iter().copied().filter(fs_known).collect(),
            })
            .collect(),
        net: full
            .net
            .iter()
            .map(|r| NetRule {
                port: r.port,
                access: r.access.iter().copied().filter(net_known).collect(),
            })
            .filter(|r| !r.access.is_empty())
            .collect(),
    };
    let handles = |gap: Gap| match gap {
        Gap::Refer => full.handled_fs.contains(&FsAccess::Refer),
        Gap::Truncate => full.handled_fs.contains(&FsAccess::Truncate),
        Gap::TcpConnect => full.handled_net.contains(&NetAccess::ConnectTcp),
        Gap::IoctlDev => full.handled_fs.contains(&FsAccess::IoctlDev),
        Gap::Scope => true,
        Gap::ResolveUnix => full.handled_fs.contains(&FsAccess::ResolveUnix),
        Gap::UdpSend => full.handled_net.contains(&NetAccess::ConnectSendUdp),
    };
    let gaps = Gap::ALL
        .into_iter()
        .filter(|g| handles(*g) && (g.since_abi() > abi || *g == Gap::Scope))
        .map(|right| LandlockGap {
            right,
            since_abi: right.since_abi(),
            unused: right.since_abi() <= abi,
            covered_by: covers(right, facts),
        })
        .collect();
    LandlockAtAbi {
        kernel_abi,
        abi,
        ruleset,
        gaps,
    }
}

/// The layers that stand in for `gap`, given what the sandbox has.
fn covers(gap: Gap, facts: &CoverFacts) -> Vec<Cover> {
    let candidates: &[(Cover, bool)] = match gap {
        Gap::Refer => &[(Cover::KernelRefusesReparenting, true)],
        Gap::Truncate => &[
            (Cover::ReadOnlyMounts, facts.readonly_mounts),
            (Cover::AppArmor, facts.apparmor),
        ],
        Gap::TcpConnect => &[(Cover::NetworkNamespace, facts.network_namespace)],
        Gap::IoctlDev => &[(Cover::SafeDevices, facts.safe_devices)],
        Gap::Scope => &[(Cover::Namespaces, facts.namespaces)],
        Gap::ResolveUnix => &[(Cover::MountNamespace, facts.mount_namespace)],
        Gap::UdpSend => &[(Cover::NetworkNamespace, facts.network_namespace)],
    };
    candidates
        .iter()
        .filter(|(_, present)| *present)
        .map(|(cover, _)| *cover)
        .collect()
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
            AccessFs::from_all(::landlock::ABI::V9)
        );
        // The kernel's bits are the crate's where the crate knows the right.
        for a in FsAccess::ALL {
            assert_eq!(a.bits(), a.to_landlock() as u64, "{a:?}");
        }
        for a in [NetAccess::BindTcp, NetAccess::ConnectTcp] {
            assert_eq!(Some(a.bits()), a.to_landlock().map(|f| f as u64), "{a:?}");
        }
        // <linux/landlock.h> of Linux 7.2: BIND_UDP (1 << 2), CONNECT_SEND_UDP (1 << 3).
        assert_eq!(NetAccess::BindUdp.bits(), 4);
        assert_eq!(NetAccess::ConnectSendUdp.bits(), 8);
        assert_eq!(FsAccess::ResolveUnix.bits(), 1 << 16);
        // Sockets: reachable in the writable paths and /dev/shm, nowhere else.
        for rule in &rs.paths {
            assert_eq!(
                rule.access.contains(&FsAccess::ResolveUnix),
                rule.access.contains(&FsAccess::MakeSock),
                "{}",
                rule.path
            );
        }
        // No UDP port is granted.
        assert!(rs.handled_net.contains(&NetAccess::ConnectSendUdp));
        assert!(
            rs.net
                .iter()
                .all(|r| r.access == [NetAccess::ConnectTcp].into_iter().collect())
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

    fn every_cover() -> CoverFacts {
        CoverFacts::of_hardened_spec()
    }

    /// The kernels users have: Ubuntu 22.04 (5.15, ABI 1), Debian 12 (6.1, ABI 2), 6.2 (ABI 3),
    /// Ubuntu 24.04 (6.8, ABI 4), 6.10 (ABI 5), 6.12 (ABI 6), 6.15 (ABI 7), 7.0 (ABI 8),
    /// 7.1 (ABI 9), 7.2 (ABI 10).
    #[test]
    fn each_abi_gets_the_rights_it_knows_and_names_what_covers_the_rest() {
        let full = ruleset(&SandboxPolicy::builtin("agent").unwrap());
        const LATER: [Gap; 2] = [Gap::ResolveUnix, Gap::UdpSend];
        let expected_gaps: [(u32, Vec<Gap>); 10] = [
            (
                1,
                [
                    Gap::Refer,
                    Gap::Truncate,
                    Gap::TcpConnect,
                    Gap::IoctlDev,
                    Gap::Scope,
                ]
                .into_iter()
                .chain(LATER)
                .collect(),
            ),
            (
                2,
                [Gap::Truncate, Gap::TcpConnect, Gap::IoctlDev, Gap::Scope]
                    .into_iter()
                    .chain(LATER)
                    .collect(),
            ),
            (
                3,
                [Gap::TcpConnect, Gap::IoctlDev, Gap::Scope]
                    .into_iter()
                    .chain(LATER)
                    .collect(),
            ),
            (
                4,
                [Gap::IoctlDev, Gap::Scope]
                    .into_iter()
                    .chain(LATER)
                    .collect(),
            ),
            (5, [Gap::Scope].into_iter().chain(LATER).collect()),
            (6, [Gap::Scope].into_iter().chain(LATER).collect()),
            (7, [Gap::Scope].into_iter().chain(LATER).collect()),
            (8, [Gap::Scope].into_iter().chain(LATER).collect()),
            (9, vec![Gap::Scope, Gap::UdpSend]),
            (10, vec![Gap::Scope]),
        ];
        for (abi, gaps) in expected_gaps {
            let at = at_abi(&full, abi, &every_cover());
            assert_eq!(u32::from(at.abi), abi);
            let names: Vec<Gap> = at.gaps.iter().map(|g| g.right).collect();
            assert_eq!(names, gaps, "abi {abi}");
            assert_eq!(at.uncovered().count(), 0, "abi {abi}: {:?}", at.gaps);
            // Only rights this ABI knows are asked of the kernel (the landlock crate's
            // flags for the ABI are exactly what the kernel accepts, up to ABI 9; ABI 10
            // adds the UDP bits 4 and 8).
            let kernel_abi = ::landlock::ABI::from(i32::try_from(abi.min(9)).unwrap());
            assert_eq!(
                AccessFs::from_all(kernel_abi).bits() & at.ruleset.handled_fs_bits(),
                at.ruleset.handled_fs_bits(),
                "abi {abi}"
            );
            let udp = if abi >= 10 { 4 | 8 } else { 0 };
            assert_eq!(
                (AccessNet::from_all(kernel_abi).bits() | udp) & at.ruleset.handled_net_bits(),
                at.ruleset.handled_net_bits(),
                "abi {abi}"
            );
            for rule in &at.ruleset.net {
                assert_eq!(rule.bits() & !at.ruleset.handled_net_bits(), 0);
            }
            for rule in &at.ruleset.paths {
                assert!(at.ruleset.handled_fs.is_superset(&rule.access));
            }
            assert!(at.ruleset.min_abi <= at.abi);
            // What the kernel lacks is reported as missing, what it has and we skip as unused.
            for g in &at.gaps {
                assert_eq!(g.unused, u32::from(g.since_abi) <= abi, "{g:?}");
            }
            // Write rights stay confined to the writable paths at every ABI.
            assert!(at.ruleset.handled_fs.contains(&FsAccess::WriteFile));
            assert!(at.ruleset.handled_fs.contains(&FsAccess::MakeReg));
        }
        // TCP rules exist only from ABI 4 on: no port rule without the handled right.
        assert!(at_abi(&full, 3, &every_cover()).ruleset.net.is_empty());
        assert_eq!(at_abi(&full, 4, &every_cover()).ruleset.net, full.net);
        // ABI 10 gets the whole ruleset; 9 all but the UDP right, 5 to 8 the rights of ABI 5.
        assert_eq!(at_abi(&full, 10, &every_cover()).ruleset, full);
        let at9 = at_abi(&full, 9, &every_cover()).ruleset;
        assert_eq!(at9.handled_fs, full.handled_fs);
        assert_eq!(
            at9.handled_net,
            [NetAccess::ConnectTcp].into_iter().collect()
        );
        assert_eq!(at9.net, full.net);
        let at7 = at_abi(&full, 7, &every_cover()).ruleset;
        assert!(!at7.handled_fs.contains(&FsAccess::ResolveUnix));
        assert!(
            at7.paths
                .iter()
                .all(|r| !r.access.contains(&FsAccess::ResolveUnix))
        );
    }

    #[test]
    fn newer_kernels_are_used_at_the_newest_known_abi() {
        let full = ruleset(&SandboxPolicy::builtin("agent").unwrap());
        let at = at_abi(&full, 12, &every_cover());
        assert_eq!((at.kernel_abi, at.abi), (12, NEWEST_ABI));
        assert_eq!(at.ruleset, full);
    }

    #[test]
    fn a_gap_without_its_substitute_is_uncovered() {
        let full = ruleset(&SandboxPolicy::builtin("agent").unwrap());
        let facts = CoverFacts {
            readonly_mounts: false,
            ..every_cover()
        };
        let at = at_abi(&full, 2, &facts);
        let uncovered: Vec<Gap> = at.uncovered().map(|g| g.right).collect();
        assert_eq!(uncovered, [Gap::Truncate]);
        // AppArmor's file rules stand in for the read-only mounts.
        let with_apparmor = CoverFacts {
            apparmor: true,
            ..facts
        };
        assert_eq!(at_abi(&full, 2, &with_apparmor).uncovered().count(), 0);
        // From ABI 3 the kernel has the right itself.
        assert_eq!(at_abi(&full, 3, &facts).uncovered().count(), 0);
        let no_netns = CoverFacts {
            network_namespace: false,
            ..every_cover()
        };
        let uncovered: Vec<Gap> = at_abi(&full, 3, &no_netns)
            .uncovered()
            .map(|g| g.right)
            .collect();
        assert_eq!(uncovered, [Gap::TcpConnect, Gap::UdpSend]);
        assert_eq!(at_abi(&full, 4, &no_netns).uncovered().count(), 1);
        assert_eq!(at_abi(&full, 10, &no_netns).uncovered().count(), 0);
        // Without a mount namespace of its own, a host socket is within reach below ABI 9.
        let no_mntns = CoverFacts {
            mount_namespace: false,
            ..every_cover()
        };
        let uncovered: Vec<Gap> = at_abi(&full, 8, &no_mntns)
            .uncovered()
            .map(|g| g.right)
            .collect();
        assert_eq!(uncovered, [Gap::ResolveUnix]);
        assert_eq!(at_abi(&full, 9, &no_mntns).uncovered().count(), 0);
    }
}

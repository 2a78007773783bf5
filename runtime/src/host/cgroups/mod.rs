//! Cgroups: the one place that knows how the host mounts them (v1, hybrid, unified v2), which
//! manager places a container (cgroupfs or systemd), where a process's cgroups are, and whether
//! the limits took.
//!
//! libcontainer and libcgroups do the writing (their v1, v2 and systemd managers; the systemd
//! one talks to systemd over their own D-Bus client). This module decides what to ask them:
//!
//! - **Driver**, as runc chooses it: systemd when the caller passes `--systemd-cgroup` (podman's
//!   default `cgroup_manager`) or gives a `slice:prefix:name` cgroupsPath (containerd's CRI with
//!   kubelet's systemd driver passes one without the flag), else cgroupfs.
//! - **Placement** on cgroup v2. libcontainer 0.7 asks libcgroups for its systemd manager
//!   whenever the container has a user namespace (every sandbox has one), but libcgroups only
//!   honours that request for a relative path: an absolute cgroupsPath always gets the plain v2
//!   (cgroupfs) manager (`libcgroups::common::create_cgroup_manager_with_root`). So the
//!   cgroupfs driver hands libcontainer an absolute path: the caller's, or a relative one (or
//!   none: the container's id) placed below the parent of the runtime's own cgroup, as runc's
//!   cgroupfs driver does. libcontainer's state records the driver flag given to its builder,
//!   which then matches what create used, so kill/delete/exec pick the same manager.
//! - On v1 and hybrid hosts libcgroups always uses its v1 manager and nothing here changes what
//!   the runtime did before; a rootless runtime puts the sandbox below its own delegated
//!   memory cgroup and writes the limits itself ([`limits::apply_v1_limits`]).
//!
//! The host is read through [`Host`], so placement and verification are unit-tested against a
//! temporary directory standing for `/sys/fs/cgroup`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxResources, Spec};

use crate::state::{ContainerId, SandboxDir};

mod limits;
pub mod oom;
pub mod warm;
pub use limits::{Limit, apply_v1_limits, check_update_within, update_resources, verify};

/// Where the cgroup filesystem is mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// Errors of the cgroups module; each names the file, path or limit.
#[derive(Debug, thiserror::Error)]
pub enum CgroupsError {
    #[error("cannot tell how the cgroup filesystem at {root} is mounted")]
    Detect {
        root: PathBuf,
        #[source]
        source: Box<libcgroups::common::GetCgroupSetupError>,
    },
    #[error("cannot write {value} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("{path} names no {controller} cgroup")]
    NoController {
        path: PathBuf,
        controller: &'static str,
    },
    #[error("{path} names no cgroup v2 (unified) cgroup")]
    NoUnified { path: PathBuf },
    #[error("cgroupsPath {path:?} is not of the systemd form slice:prefix:name")]
    SystemdPath { path: String },
    #[error(
        "the systemd cgroup driver was chosen ({reason}), but systemd is not running on this host (see docs/hosts.md, \"cgroup drivers\")"
    )]
    NoSystemd { reason: &'static str },
    #[error(
        "the systemd cgroup driver needs the user's session bus (DBUS_SESSION_BUS_ADDRESS or XDG_RUNTIME_DIR/bus) for a rootless sandbox; none was found (see docs/hosts.md, \"Rootless\")"
    )]
    NoSessionBus,
    #[error(
        "cgroup {dir} is not delegated to this user: limits cannot be enforced (see docs/hosts.md, \"Rootless\")"
    )]
    NotDelegated { dir: PathBuf },
    #[error("{file} in {dir} is {got}, wanted {want}: the {limit} limit did not take")]
    NotApplied {
        limit: Limit,
        dir: PathBuf,
        file: &'static str,
        got: String,
        want: String,
    },
    #[error("cannot open the cgroup manager of {path}")]
    Manager {
        path: PathBuf,
        #[source]
        source: Box<libcgroups::common::CreateCgroupSetupError>,
    },
    #[error("cannot {op} through the cgroup manager of {path}")]
    Operation {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("update would set {what} to {got}, above the policy's {max}")]
    AboveCeiling {
        what: &'static str,
        got: String,
        max: String,
    },
    #[error("update may not allow devices")]
    DeviceAllow,
}

/// How the host mounts cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1 only.
    Legacy,
    /// v1 controllers, plus a controller-less v2 tree at `unified/` (this project's CI host).
    Hybrid,
    /// The unified cgroup v2 hierarchy (every current distribution).
    Unified,
}

impl Hierarchy {
    /// The name `features` reports.
    pub fn name(self) -> &'static str {
        match self {
            Hierarchy::Legacy => "v1",
            Hierarchy::Hybrid => "hybrid",
            Hierarchy::Unified => "v2",
        }
    }
}

/// The cgroup manager that places a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// What the runtime reads of the host. [`RealHost`] is the machine; tests use a temporary
/// directory as the cgroup root.
pub trait Host {
    /// The cgroup filesystem's mount point (`/sys/fs/cgroup`).
    fn root(&self) -> &Path;
    fn hierarchy(&self) -> Result<Hierarchy, CgroupsError>;
    /// Whether systemd is PID 1 (`/run/systemd/system` exists), as libcgroups checks it.
    fn systemd_booted(&self) -> bool;
    /// Whether a D-Bus session bus is there to reach the user's systemd (rootless).
    fn session_bus(&self) -> bool;
    /// `/proc/PID/cgroup` of `pid`, parsed.
    fn proc_cgroups(&self, pid: i32) -> Result<ProcCgroups, CgroupsError>;
    /// This process's pid.
    fn own_pid(&self) -> i32;
    /// The effective uid that owns a delegated cgroup.
    fn euid(&self) -> u32;
}

/// The machine the runtime runs on.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl Host for RealHost {
    fn root(&self) -> &Path {
        Path::new(ROOT)
    }

    fn hierarchy(&self) -> Result<Hierarchy, CgroupsError> {
        use libcgroups::common::CgroupSetup;
        match libcgroups::common::get_cgroup_setup_with_root(self.root()) {
            Ok(CgroupSetup::Legacy) => Ok(Hierarchy::Legacy),
            Ok(CgroupSetup::Hybrid) => Ok(Hierarchy::Hybrid),
            Ok(CgroupSetup::Unified) => Ok(Hierarchy::Unified),
            Err(source) => Err(CgroupsError::Detect {
                root: self.root().to_owned(),
                source: Box::new(source),
            }),
        }
    }

    fn systemd_booted(&self) -> bool {
        libcgroups::systemd::booted()
    }

    fn session_bus(&self) -> bool {
        // Where libcgroups' D-Bus client looks for it.
        std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|a| !a.is_empty())
            || std::env::var_os("XDG_RUNTIME_DIR")
                .is_some_and(|d| !d.is_empty() && Path::new(&d).join("bus").exists())
    }

    fn proc_cgroups(&self, pid: i32) -> Result<ProcCgroups, CgroupsError> {
        let path = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = crate::files::read_to_string(&path)?;
        Ok(ProcCgroups::parse(path, &text))
    }

    fn own_pid(&self) -> i32 {
        nix::unistd::getpid().as_raw()
    }

    fn euid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }
}

/// One line of `/proc/PID/cgroup`: `ID:CONTROLLERS:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    /// Empty for the v2 line (`0::/path`); `name=systemd` style names are kept.
    controllers: Vec<String>,
    path: String,
}

/// A process's cgroups as `/proc/PID/cgroup` lists them (paths relative to the reader's
/// cgroup namespace; a path outside it starts with `/..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroups {
    /// The file the text came from, for errors.
    source: PathBuf,
    lines: Vec<Line>,
}

impl ProcCgroups {
    /// Parses the text of `/proc/PID/cgroup` (read from `source`). Malformed lines (fewer
    /// than three `:`-separated fields) are skipped; a path keeps any `:` it contains (only
    /// the first two separate fields). The kernel marks a removed v2 cgroup with a
    /// ` (deleted)` suffix on the `0::` line; that suffix is not part of the path.
    /// This is the runtime's one parser of the file (the shim, a separate crate, has its own).
    pub fn parse(source: PathBuf, text: &str) -> Self {
        let lines = text
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
                let controllers: Vec<String> = ctrls
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect();
                let path = if controllers.is_empty() {
                    path.strip_suffix(" (deleted)").unwrap_or(path)
                } else {
                    path
                };
                Some(Line {
                    controllers,
                    path: path.to_owned(),
                })
            })
            .collect();
        Self { source, lines }
    }

    /// The file these cgroups were read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The path of the v1 hierarchy that `controller` is attached to.
    pub fn v1(&self, controller: &str) -> Option<&str> {
        self.lines
            .iter()
            .find(|l| l.controllers.iter().any(|c| c == controller))
            .map(|l| l.path.as_str())
    }

    /// The path in the v2 hierarchy (the `0::` line).
    pub fn unified(&self) -> Option<&str> {
        self.lines
            .iter()
            .find(|l| l.controllers.is_empty())
            .map(|l| l.path.as_str())
    }

    /// The directories of these cgroups below `root`, by controller; the v2 directory is
    /// `unified`. On a hybrid host the v2 tree is `root/unified`; a legacy host has none.
    /// Co-mounted v1 controllers (`cpu,cpuacct`) resolve to their joint mount when it exists.
    /// A cgroup outside the reader's cgroup namespace (its path climbs with `..`) is not below
    /// `root`, so it has no directory here.
    pub fn dirs(&self, root: &Path, hierarchy: Hierarchy) -> BTreeMap<String, PathBuf> {
        let mut out = BTreeMap::new();
        for line in &self.lines {
            let rel = line.path.trim_start_matches('/');
            if rel.split('/').any(|part| part == "..") {
                continue;
            }
            if line.controllers.is_empty() {
                let base = match hierarchy {
                    Hierarchy::Unified => root.to_owned(),
                    Hierarchy::Hybrid => root.join("unified"),
                    Hierarchy::Legacy => continue,
                };
                out.entry("unified".to_owned())
                    .or_insert_with(|| base.join(rel));
                continue;
            }
            if hierarchy == Hierarchy::Unified {
                continue;
            }
            let joint = root.join(line.controllers.join(","));
            for c in line.controllers.iter().filter(|c| !c.starts_with("name=")) {
                let mount = if joint.exists() {
                    joint.clone()
                } else {
                    root.join(c)
                };
                out.insert(c.clone(), mount.join(rel));
            }
        }
        out
    }

    /// The memory cgroup directory: v1 `memory` on legacy and hybrid hosts, the v2
    /// directory on unified ones.
    pub fn memory_dir(&self, root: &Path, hierarchy: Hierarchy) -> Option<PathBuf> {
        let key = match hierarchy {
            Hierarchy::Unified => "unified",
            Hierarchy::Legacy | Hierarchy::Hybrid => "memory",
        };
        self.dirs(root, hierarchy).remove(key)
    }
}

/// The cgroup directories of `pid` by controller (empty if they cannot be read).
pub fn dirs_of(host: &dyn Host, pid: i32) -> BTreeMap<String, PathBuf> {
    let (Ok(hierarchy), Ok(procs)) = (host.hierarchy(), host.proc_cgroups(pid)) else {
        return BTreeMap::new();
    };
    procs.dirs(host.root(), hierarchy)
}

/// The memory cgroup directory of `pid`, if it has one that exists.
pub fn memory_dir_of(host: &dyn Host, pid: i32) -> Option<PathBuf> {
    let hierarchy = host.hierarchy().ok()?;
    host.proc_cgroups(pid)
        .ok()?
        .memory_dir(host.root(), hierarchy)
        .filter(|d| d.is_dir())
}

/// The OOM kill counter of a memory cgroup: `oom_kill` in v1 `memory.oom_control` or v2
/// `memory.events`.
pub fn oom_kills(memory_dir: &Path) -> Option<u64> {
    ["memory.oom_control", "memory.events"]
        .iter()
        .find_map(|f| std::fs::read_to_string(memory_dir.join(f)).ok())
        .and_then(|text| oom::flat_key(&text, "oom_kill"))
}

/// Whether the host has cgroups the runtime can limit a sandbox with.
pub fn available(host: &dyn Host) -> bool {
    match host.hierarchy() {
        Ok(Hierarchy::Legacy | Hierarchy::Hybrid) => host.root().join("memory").is_dir(),
        Ok(Hierarchy::Unified) => host.root().join("cgroup.controllers").exists(),
        Err(_) => false,
    }
}

/// The `linux.cgroup` section of `features`: v1 and v2 are compiled in; the systemd driver
/// (libcgroups' own, v2 only) is usable where systemd runs the unified hierarchy.
pub fn features(host: &dyn Host) -> serde_json::Value {
    let hierarchy = host.hierarchy().ok();
    let systemd = hierarchy == Some(Hierarchy::Unified) && host.systemd_booted();
    serde_json::json!({
        "v1": true,
        "v2": true,
        "systemd": systemd,
        "systemdUser": systemd,
    })
}

/// A systemd cgroupsPath, `slice:prefix:name` (runc's and podman's form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemdPath {
    /// The parent slice (`machine.slice`); empty means systemd's default for the bus.
    pub parent: String,
    pub prefix: String,
    pub name: String,
}

impl SystemdPath {
    /// Parses `slice:prefix:name`. The parent, if given, is a slice name (`*.slice`, no `/`).
    pub fn parse(path: &str) -> Result<Self, CgroupsError> {
        let bad = || CgroupsError::SystemdPath {
            path: path.to_owned(),
        };
        let mut parts = path.split(':');
        let (Some(parent), Some(prefix), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let slice_ok =
            parent.is_empty() || (parent.len() > ".slice".len() && parent.ends_with(".slice"));
        if !slice_ok || name.is_empty() || [parent, prefix, name].iter().any(|p| p.contains('/')) {
            return Err(bad());
        }
        Ok(Self {
            parent: parent.to_owned(),
            prefix: prefix.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The unit systemd creates: `prefix-name.scope`, or `name` when it is a slice.
    pub fn unit(&self) -> String {
        if self.name.ends_with(".slice") {
            self.name.clone()
        } else {
            format!("{}-{}.scope", self.prefix, self.name)
        }
    }
}

/// Whether a cgroupsPath is in the systemd form with a named parent slice
/// (`kubepods-burstable-pod1.slice:cri-containerd:ID`), which selects the systemd driver
/// even without `--systemd-cgroup`.
fn is_systemd_form(path: &Path) -> bool {
    path.to_str()
        .and_then(|p| SystemdPath::parse(p).ok())
        .is_some_and(|p| !p.parent.is_empty())
}

/// The driver for a container: systemd when asked by flag or by the path's form.
pub fn choose_driver(systemd_flag: bool, cgroups_path: Option<&Path>) -> Driver {
    if systemd_flag || cgroups_path.is_some_and(is_systemd_form) {
        Driver::Systemd
    } else {
        Driver::Cgroupfs
    }
}

/// Where a container's cgroups go, decided before libcontainer's create.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub hierarchy: Hierarchy,
    pub driver: Driver,
    /// Resources taken out of the spec for the runtime to write itself after create
    /// (rootless on v1: libcontainer would also write device rules it may not).
    pub deferred: Option<LinuxResources>,
}

impl Placement {
    /// The flag for libcontainer's builder (and so its state).
    pub fn systemd(&self) -> bool {
        self.driver == Driver::Systemd
    }
}

/// Decides the driver and sets the spec's cgroupsPath so libcontainer places the container
/// there (see the module docs). `systemd_flag` is `--systemd-cgroup`.
pub fn place(
    host: &dyn Host,
    spec: &mut Spec,
    id: &ContainerId,
    systemd_flag: bool,
    rootless: bool,
) -> Result<Placement, CgroupsError> {
    let hierarchy = host.hierarchy()?;
    let Some(linux) = spec.linux_mut().as_mut() else {
        return Ok(Placement {
            hierarchy,
            driver: Driver::Cgroupfs,
            deferred: None,
        });
    };
    let asked = linux.cgroups_path().clone();
    let driver = choose_driver(systemd_flag, asked.as_deref());
    match (hierarchy, driver) {
        (Hierarchy::Legacy | Hierarchy::Hybrid, _) => {
            if driver == Driver::Systemd {
                tracing::warn!(
                    layer = "cgroups",
                    hierarchy = hierarchy.name(),
                    "systemd cgroup driver not used: it needs cgroup v2; cgroupfs (v1) places the sandbox"
                );
            }
            let deferred = if rootless {
                rootless_v1(host, linux, id)?
            } else {
                None
            };
            Ok(Placement {
                hierarchy,
                driver: Driver::Cgroupfs,
                deferred,
            })
        }
        (Hierarchy::Unified, Driver::Systemd) => {
            if !host.systemd_booted() {
                return Err(CgroupsError::NoSystemd {
                    reason: if systemd_flag {
                        "--systemd-cgroup"
                    } else {
                        "a slice:prefix:name cgroupsPath"
                    },
                });
            }
            if rootless && !host.session_bus() {
                return Err(CgroupsError::NoSessionBus);
            }
            let path = match &asked {
                Some(p) => {
                    SystemdPath::parse(&p.to_string_lossy())?;
                    p.clone()
                }
                None => PathBuf::from(format!(":agent-sandbox:{id}")),
            };
            linux.set_cgroups_path(Some(path));
            Ok(Placement {
                hierarchy,
                driver,
                deferred: None,
            })
        }
        (Hierarchy::Unified, Driver::Cgroupfs) => {
            let path = cgroupfs_v2_path(host, asked.as_deref(), id)?;
            if rootless {
                check_delegated(host, &path)?;
            }
            linux.set_cgroups_path(Some(path));
            Ok(Placement {
                hierarchy,
                driver,
                deferred: None,
            })
        }
    }
}

/// The absolute v2 path of a cgroupfs-driven container: the caller's absolute path, or a
/// relative one (none: the id) below the parent of the runtime's own cgroup, whose own
/// cgroup most likely holds processes and so cannot have children with controllers.
fn cgroupfs_v2_path(
    host: &dyn Host,
    asked: Option<&Path>,
    id: &ContainerId,
) -> Result<PathBuf, CgroupsError> {
    if let Some(p) = asked
        && p.is_absolute()
    {
        return Ok(p.to_owned());
    }
    let own = host.proc_cgroups(host.own_pid())?;
    let current = own.unified().ok_or_else(|| CgroupsError::NoUnified {
        path: own.source().to_owned(),
    })?;
    let parent = Path::new(current).parent().unwrap_or(Path::new("/"));
    let parent = if parent.is_absolute() {
        parent.to_owned()
    } else {
        Path::new("/").join(parent)
    };
    Ok(match asked {
        Some(rel) => parent.join(rel),
        None => parent.join(id.as_str()),
    })
}

/// A rootless runtime can only create cgroups below one delegated to it: the deepest existing
/// directory on the way to `path` must be its own.
fn check_delegated(host: &dyn Host, path: &Path) -> Result<(), CgroupsError> {
    let mut dir = host.root().to_owned();
    for c in path.components() {
        match c {
            Component::Normal(part) if dir.join(part).is_dir() => dir.push(part),
            Component::RootDir | Component::CurDir => {}
            _ => break,
        }
    }
    let owned = std::fs::metadata(&dir).is_ok_and(|m| m.uid() == host.euid());
    if owned {
        Ok(())
    } else {
        Err(CgroupsError::NotDelegated { dir })
    }
}

/// Rootless on cgroup v1: only a delegated cgroup is writable, so the sandbox goes below the
/// runtime's own memory cgroup. v1 device rules need CAP_SYS_ADMIN in the host namespace,
/// which a rootless runtime never has, and libcontainer writes them whenever it applies
/// resources; so the resources are taken out here and the runtime writes the limits itself
/// after create ([`apply_v1_limits`]), before the workload starts. Device access stays
/// bounded: the sandbox's /dev holds only the policy's bind-mounted nodes and a user
/// namespace cannot mknod.
fn rootless_v1(
    host: &dyn Host,
    linux: &mut libcontainer::oci_spec::runtime::Linux,
    id: &ContainerId,
) -> Result<Option<LinuxResources>, CgroupsError> {
    let own = host.proc_cgroups(host.own_pid())?;
    let current = own.v1("memory").ok_or_else(|| CgroupsError::NoController {
        path: own.source().to_owned(),
        controller: "memory",
    })?;
    let dir = host
        .root()
        .join("memory")
        .join(current.trim_start_matches('/'));
    let owned = std::fs::metadata(&dir).is_ok_and(|m| m.uid() == host.euid());
    if !owned {
        return Err(CgroupsError::NotDelegated { dir });
    }
    linux.set_cgroups_path(Some(
        PathBuf::from(current).join(format!("agent-sandbox-{id}")),
    ));
    let taken = linux.resources_mut().take();
    if taken.as_ref().is_some_and(|r| r.devices().is_some()) {
        tracing::warn!(
            layer = "cgroups",
            "device cgroup rules not applied: rootless on cgroup v1"
        );
    }
    Ok(taken)
}

fn remove_recorded(record: &Record, id: &ContainerId) {
    use libcgroups::common::CgroupManager;
    let Ok(mgr) = manager(&record.path, record.systemd, id) else {
        return;
    };
    for pid in mgr.get_all_pids().unwrap_or_default() {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    for _ in 0..50 {
        if mgr.remove().is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tracing::warn!(path = %record.path.display(), "cannot remove the orphaned cgroup");
}

/// libcgroups' manager of an existing container, with the driver its state recorded.
fn manager(
    cgroup_path: &Path,
    systemd: bool,
    id: &ContainerId,
) -> Result<libcgroups::common::AnyCgroupManager, CgroupsError> {
    libcgroups::common::create_cgroup_manager(libcgroups::common::CgroupConfig {
        cgroup_path: cgroup_path.to_owned(),
        systemd_cgroup: systemd,
        container_name: id.as_str().to_owned(),
    })
    .map_err(|source| CgroupsError::Manager {
        path: cgroup_path.to_owned(),
        source: Box::new(source),
    })
}

/// The pids in a container's cgroup (`ps`).
pub fn pids(cgroup_path: &Path, systemd: bool, id: &ContainerId) -> Result<Vec<i32>, CgroupsError> {
    use libcgroups::common::CgroupManager;
    let pids = manager(cgroup_path, systemd, id)?
        .get_all_pids()
        .map_err(|source| CgroupsError::Operation {
            path: cgroup_path.to_owned(),
            op: "list the processes",
            source: Box::new(source),
        })?;
    Ok(pids.into_iter().map(|p| p.as_raw()).collect())
}

/// Whether a container's own cgroup is known to be gone: its manager, listing the processes,
/// finds no directory where the cgroup's leaf (`prefix-name.scope`, or the last component of
/// a cgroupfs path) should be. Only v2 (cgroupfs or systemd) is looked at.
///
/// systemd removes a transient scope once its last process exits, before the runtime's
/// `delete`: a stopped container under the systemd driver usually has no cgroup left. Without
/// a cgroup no process of the container can be left either (a populated cgroup cannot be
/// removed). Anything else, a cgroup still there or an error that does not prove it gone
/// (a child cgroup vanishing during the walk), answers false: the caller then goes on
/// as if the cgroup were there.
pub fn is_gone(cgroup_path: &Path, systemd: bool, id: &ContainerId) -> bool {
    use libcgroups::common::CgroupManager;
    let leaf = if systemd {
        match SystemdPath::parse(&cgroup_path.to_string_lossy()) {
            Ok(p) => p.unit(),
            Err(_) => return false,
        }
    } else {
        match cgroup_path.file_name() {
            Some(name) => name.to_string_lossy().into_owned(),
            None => return false,
        }
    };
    let Ok(mgr) = manager(cgroup_path, systemd, id) else {
        return false;
    };
    match mgr.get_all_pids() {
        Ok(_) => false,
        Err(e) => proves_gone(&e, &leaf),
    }
}

/// Whether a v2 manager's error says the directory named `leaf` is not there (and it still
/// is not).
fn proves_gone(err: &libcgroups::common::AnyManagerError, leaf: &str) -> bool {
    use libcgroups::common::{AnyManagerError, WrappedIoError};
    let io = match err {
        AnyManagerError::Systemd(libcgroups::systemd::manager::SystemdManagerError::WrappedIo(
            io,
        ))
        | AnyManagerError::V2(libcgroups::v2::manager::V2ManagerError::WrappedIo(io)) => io,
        _ => return false,
    };
    let WrappedIoError::Read { err, path } = io else {
        return false;
    };
    err.kind() == std::io::ErrorKind::NotFound
        && path
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == leaf)
        && !path.exists()
}

/// Applies new resources to a container's cgroup (`update`).
pub fn apply(
    cgroup_path: &Path,
    systemd: bool,
    id: &ContainerId,
    resources: &LinuxResources,
) -> Result<(), CgroupsError> {
    use libcgroups::common::CgroupManager;
    manager(cgroup_path, systemd, id)?
        .apply(&libcgroups::common::ControllerOpt {
            resources,
            freezer_state: None,
            oom_score_adj: None,
            disable_oom_killer: false,
        })
        .map_err(|source| CgroupsError::Operation {
            path: cgroup_path.to_owned(),
            op: "apply resources",
            source: Box::new(source),
        })
}

/// Where `place` put a sandbox on cgroup v2, saved in its sandbox directory before
/// libcontainer's create, so that a forced delete finds the cgroup even when libcontainer's
/// state was never written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The cgroupsPath given to libcontainer (absolute, or `slice:prefix:name`).
    pub path: PathBuf,
    pub systemd: bool,
}

impl Record {
    /// Saves where the spec's cgroupsPath placed the sandbox (v2 only; v1 keeps
    /// libcontainer's own names, see [`remove_orphans`]).
    pub fn save(placement: &Placement, spec: &Spec, dir: &SandboxDir) -> Result<(), CgroupsError> {
        let Some(path) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) else {
            return Ok(());
        };
        if placement.hierarchy != Hierarchy::Unified {
            return Ok(());
        }
        let record = Record {
            path,
            systemd: placement.systemd(),
        };
        Ok(dir.cgroup().write(&record)?)
    }

    pub fn load(dir: &SandboxDir) -> Option<Self> {
        dir.cgroup().read().ok()
    }
}

/// A create killed after libcontainer forked the init but before it wrote the state leaves
/// that init in a cgroup that no state names: kill what is in it and remove it. On v1 those
/// are libcontainer's default cgroups (`:youki:ID`, one per controller); on v2 the one
/// `recorded` at create (a systemd scope is stopped, which kills its processes).
pub fn remove_orphans(host: &dyn Host, id: &ContainerId, recorded: Option<&Record>) {
    if host.hierarchy().ok() == Some(Hierarchy::Unified) {
        if let Some(r) = recorded {
            remove_recorded(r, id);
        }
        return;
    }
    let Ok(controllers) = std::fs::read_dir(host.root()) else {
        return;
    };
    let name = format!(":youki:{id}");
    let dirs: Vec<PathBuf> = controllers
        .flatten()
        .map(|c| c.path().join(&name))
        .filter(|d| d.is_dir())
        .collect();
    for dir in &dirs {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    for dir in &dirs {
        for _ in 0..50 {
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::collections::HashMap;

    /// A host whose cgroup root is a temporary directory.
    pub struct FakeHost {
        pub dir: tempfile::TempDir,
        pub hierarchy: Hierarchy,
        pub systemd: bool,
        pub procs: HashMap<i32, String>,
        pub euid: u32,
        pub session_bus: bool,
    }

    pub const OWN_PID: i32 = 4242;

    impl FakeHost {
        pub fn new(hierarchy: Hierarchy) -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
                hierarchy,
                systemd: false,
                procs: HashMap::new(),
                euid: nix::unistd::geteuid().as_raw(),
                session_bus: false,
            }
        }

        pub fn with_proc(mut self, pid: i32, text: &str) -> Self {
            self.procs.insert(pid, text.to_owned());
            self
        }

        /// Creates `rel` below the root and writes `files` into it.
        pub fn cgroup(&self, rel: &str, files: &[(&str, &str)]) -> PathBuf {
            let d = self.dir.path().join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), v).unwrap();
            }
            d
        }
    }

    impl Host for FakeHost {
        fn root(&self) -> &Path {
            self.dir.path()
        }
        fn hierarchy(&self) -> Result<Hierarchy, CgroupsError> {
            Ok(self.hierarchy)
        }
        fn systemd_booted(&self) -> bool {
            self.systemd
        }
        fn session_bus(&self) -> bool {
            self.session_bus
        }
        fn proc_cgroups(&self, pid: i32) -> Result<ProcCgroups, CgroupsError> {
            let path = PathBuf::from(format!("/proc/{pid}/cgroup"));
            match self.procs.get(&pid) {
                Some(t) => Ok(ProcCgroups::parse(path, t)),
                None => Err(crate::files::FileError::read(
                    path,
                    std::io::ErrorKind::NotFound.into(),
                )
                .into()),
            }
        }
        fn own_pid(&self) -> i32 {
            OWN_PID
        }
        fn euid(&self) -> u32 {
            self.euid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{FakeHost, OWN_PID};
    use super::*;
    use libcontainer::oci_spec::runtime::{LinuxBuilder, SpecBuilder};

    const V1: &str = "12:pids:/user.slice/a\n11:memory:/user.slice/a\n4:cpu,cpuacct:/user.slice/a\n1:name=systemd:/user.slice/a\n";
    const HYBRID: &str = "12:pids:/c\n11:memory:/c\n4:cpu,cpuacct:/c\n1:name=systemd:/c\n0::/c\n";
    const V2: &str = "0::/system.slice/containerd.service\n";

    fn id() -> ContainerId {
        ContainerId::try_from("c1").unwrap()
    }

    fn spec_with(path: Option<&str>) -> Spec {
        let mut linux = LinuxBuilder::default().build().unwrap();
        linux.set_cgroups_path(path.map(PathBuf::from));
        SpecBuilder::default().linux(linux).build().unwrap()
    }

    fn path_of(spec: &Spec) -> Option<PathBuf> {
        spec.linux().as_ref().unwrap().cgroups_path().clone()
    }

    #[test]
    fn v1_lines_map_to_controller_dirs_and_joint_mounts() {
        let host = FakeHost::new(Hierarchy::Legacy);
        std::fs::create_dir(host.root().join("cpu,cpuacct")).unwrap();
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), V1);
        assert_eq!(p.v1("memory"), Some("/user.slice/a"));
        assert_eq!(p.v1("cpuacct"), Some("/user.slice/a"));
        assert_eq!(p.unified(), None);
        let d = p.dirs(host.root(), Hierarchy::Legacy);
        assert_eq!(d["memory"], host.root().join("memory/user.slice/a"));
        assert_eq!(d["cpu"], host.root().join("cpu,cpuacct/user.slice/a"));
        assert_eq!(d["cpuacct"], host.root().join("cpu,cpuacct/user.slice/a"));
        assert!(!d.contains_key("name=systemd") && !d.contains_key("unified"));
    }

    #[test]
    fn hostile_lines_are_skipped_or_kept_whole() {
        let long = format!("/{}", "a".repeat(64 * 1024));
        let text = format!(
            "garbage\n\n7:\n9:memory:/with:colons:in/it\n3:pids:{long}\n0::/gone (deleted)\n"
        );
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), &text);
        // Lines with fewer than three fields are skipped; `:` after the second stays in the path.
        assert_eq!(p.lines.len(), 3);
        assert_eq!(p.v1("memory"), Some("/with:colons:in/it"));
        assert_eq!(p.v1("pids"), Some(long.as_str()));
        // The kernel's marker of a removed v2 cgroup is not part of its path.
        assert_eq!(p.unified(), Some("/gone"));
        // Only the v2 line carries the marker; a v1 name that ends in it is a real name.
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), "4:memory:/x (deleted)\n");
        assert_eq!(p.v1("memory"), Some("/x (deleted)"));
        // Paths outside the reader's cgroup namespace stay as the kernel printed them.
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), "0::/../../x\n");
        assert_eq!(p.unified(), Some("/../../x"));
        // ... and have no directory below the reader's cgroup mount.
        assert_eq!(
            p.dirs(Path::new("/sys/fs/cgroup"), Hierarchy::Unified),
            BTreeMap::new()
        );
        let v1 = ProcCgroups::parse("/proc/1/cgroup".into(), "4:memory:/a/../../b\n6:pids:/c\n");
        assert_eq!(
            v1.dirs(Path::new("/sys/fs/cgroup"), Hierarchy::Legacy),
            BTreeMap::from([("pids".to_owned(), PathBuf::from("/sys/fs/cgroup/pids/c"))])
        );
        assert_eq!(
            ProcCgroups::parse("/proc/1/cgroup".into(), "").lines.len(),
            0
        );
        assert_eq!(p.source(), Path::new("/proc/1/cgroup"));
    }

    #[test]
    fn v2_and_hybrid_lines_parse() {
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), V2);
        assert_eq!(p.unified(), Some("/system.slice/containerd.service"));
        assert_eq!(p.v1("memory"), None);
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), HYBRID);
        assert_eq!(p.unified(), Some("/c"));
        assert_eq!(p.v1("cpu"), Some("/c"));
        assert_eq!(p.v1("name=systemd"), Some("/c"));
    }

    #[test]
    fn hybrid_puts_the_v2_line_below_unified() {
        let root = Path::new("/sys/fs/cgroup");
        let p = ProcCgroups::parse("/proc/1/cgroup".into(), HYBRID);
        let d = p.dirs(root, Hierarchy::Hybrid);
        assert_eq!(d["unified"], Path::new("/sys/fs/cgroup/unified/c"));
        assert_eq!(d["memory"], Path::new("/sys/fs/cgroup/memory/c"));
        assert_eq!(
            p.memory_dir(root, Hierarchy::Hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/memory/c"))
        );
    }

    #[test]
    fn unified_has_one_dir_and_memory_is_there() {
        let root = Path::new("/sys/fs/cgroup");
        let p = ProcCgroups::parse(
            "/proc/1/cgroup".into(),
            "0::/machine.slice/libpod-abc.scope\n",
        );
        let d = p.dirs(root, Hierarchy::Unified);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d["unified"],
            Path::new("/sys/fs/cgroup/machine.slice/libpod-abc.scope")
        );
        assert_eq!(
            p.memory_dir(root, Hierarchy::Unified),
            Some(d["unified"].clone())
        );
        assert_eq!(p.v1("memory"), None);
    }

    #[test]
    fn systemd_paths_parse_and_name_their_unit() {
        let p = SystemdPath::parse("machine.slice:libpod:abc").unwrap();
        assert_eq!(
            (p.parent.as_str(), p.prefix.as_str(), p.name.as_str()),
            ("machine.slice", "libpod", "abc")
        );
        assert_eq!(p.unit(), "libpod-abc.scope");
        let k = SystemdPath::parse("kubepods-burstable-pod1.slice:cri-containerd:x").unwrap();
        assert_eq!(k.unit(), "cri-containerd-x.scope");
        assert_eq!(SystemdPath::parse(":agent-sandbox:c1").unwrap().parent, "");
        assert_eq!(
            SystemdPath::parse("user.slice:libpod:a.slice")
                .unwrap()
                .unit(),
            "a.slice"
        );
        for bad in [
            "/kubepods/pod1/c",
            "machine.slice:libpod",
            "a:b:c:d",
            "machine:libpod:abc",
            ".slice:x:y",
            "machine.slice:libpod:",
            "machine.slice:a/b:c",
        ] {
            let e = SystemdPath::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn driver_follows_the_flag_or_the_path_form() {
        use Driver::*;
        assert_eq!(choose_driver(false, None), Cgroupfs);
        assert_eq!(choose_driver(true, None), Systemd);
        assert_eq!(
            choose_driver(false, Some(Path::new("/default/c1"))),
            Cgroupfs
        );
        assert_eq!(
            choose_driver(
                false,
                Some(Path::new(
                    "kubepods-besteffort-pod9.slice:cri-containerd:c1"
                ))
            ),
            Systemd
        );
        assert_eq!(
            choose_driver(false, Some(Path::new("machine.slice:libpod:c1"))),
            Systemd
        );
        // libcontainer's own default has no parent slice: not a request for systemd.
        assert_eq!(choose_driver(false, Some(Path::new(":youki:c1"))), Cgroupfs);
        assert_eq!(choose_driver(false, Some(Path::new("pods/c1"))), Cgroupfs);
    }

    #[test]
    fn v1_and_hybrid_keep_the_callers_path_even_with_the_systemd_flag() {
        for h in [Hierarchy::Legacy, Hierarchy::Hybrid] {
            let host = FakeHost::new(h);
            for asked in [
                None,
                Some("/libpod_parent/libpod-c1"),
                Some("machine.slice:libpod:c1"),
            ] {
                let mut spec = spec_with(asked);
                let p = place(&host, &mut spec, &id(), true, false).unwrap();
                assert_eq!(p.driver, Driver::Cgroupfs);
                assert!(!p.systemd());
                assert_eq!(path_of(&spec), asked.map(PathBuf::from));
            }
        }
    }

    #[test]
    fn rootless_v1_goes_below_the_delegated_memory_cgroup() {
        let host = FakeHost::new(Hierarchy::Hybrid).with_proc(OWN_PID, V1);
        let mut spec = spec_with(None);
        let e = place(&host, &mut spec, &id(), false, true).unwrap_err();
        assert!(e.to_string().contains("docs/hosts.md"), "{e}");
        host.cgroup("memory/user.slice/a", &[]);
        let p = place(&host, &mut spec, &id(), false, true).unwrap();
        assert_eq!(
            path_of(&spec),
            Some(PathBuf::from("/user.slice/a/agent-sandbox-c1"))
        );
        assert_eq!(p.driver, Driver::Cgroupfs);
    }

    #[test]
    fn v2_cgroupfs_makes_every_path_absolute() {
        let host = FakeHost::new(Hierarchy::Unified).with_proc(OWN_PID, V2);
        let mut spec = spec_with(Some("/default/c1"));
        let p = place(&host, &mut spec, &id(), false, false).unwrap();
        assert_eq!(p.driver, Driver::Cgroupfs);
        assert_eq!(path_of(&spec), Some(PathBuf::from("/default/c1")));
        let mut spec = spec_with(None);
        place(&host, &mut spec, &id(), false, false).unwrap();
        assert_eq!(path_of(&spec), Some(PathBuf::from("/system.slice/c1")));
        let mut spec = spec_with(Some("pods/c1"));
        place(&host, &mut spec, &id(), false, false).unwrap();
        assert_eq!(path_of(&spec), Some(PathBuf::from("/system.slice/pods/c1")));
        // libcontainer then takes its plain v2 manager despite the user namespace.
        assert!(path_of(&spec).unwrap().is_absolute());
    }

    #[test]
    fn v2_systemd_needs_systemd_and_a_well_formed_path() {
        let mut host = FakeHost::new(Hierarchy::Unified).with_proc(OWN_PID, V2);
        let mut spec = spec_with(Some("kubepods-burstable-pod1.slice:cri-containerd:c1"));
        let e = place(&host, &mut spec, &id(), false, false).unwrap_err();
        assert!(
            matches!(e, CgroupsError::NoSystemd { reason } if reason.contains("slice:prefix:name")),
            "{e}"
        );
        host.systemd = true;
        let p = place(&host, &mut spec, &id(), false, false).unwrap();
        assert!(p.systemd());
        assert_eq!(
            path_of(&spec),
            Some(PathBuf::from(
                "kubepods-burstable-pod1.slice:cri-containerd:c1"
            ))
        );
        let mut spec = spec_with(None);
        place(&host, &mut spec, &id(), true, false).unwrap();
        assert_eq!(path_of(&spec), Some(PathBuf::from(":agent-sandbox:c1")));
        let mut spec = spec_with(Some("/abs/path"));
        let e = place(&host, &mut spec, &id(), true, false).unwrap_err();
        assert!(matches!(e, CgroupsError::SystemdPath { .. }), "{e}");
    }

    #[test]
    fn rootless_v2_systemd_needs_the_session_bus() {
        let mut host = FakeHost::new(Hierarchy::Unified).with_proc(OWN_PID, V2);
        host.systemd = true;
        let mut spec = spec_with(Some("user.slice:libpod:c1"));
        let e = place(&host, &mut spec, &id(), true, true).unwrap_err();
        assert!(matches!(e, CgroupsError::NoSessionBus), "{e}");
        assert!(e.to_string().contains("docs/hosts.md"), "{e}");
        host.session_bus = true;
        assert!(
            place(&host, &mut spec, &id(), true, true)
                .unwrap()
                .systemd()
        );
        assert_eq!(path_of(&spec), Some(PathBuf::from("user.slice:libpod:c1")));
    }

    #[test]
    fn rootless_v2_cgroupfs_needs_a_delegated_parent() {
        let mut host = FakeHost::new(Hierarchy::Unified).with_proc(
            OWN_PID,
            "0::/user.slice/user-1500.slice/user@1500.service/app.slice/podman.scope\n",
        );
        host.cgroup(
            "user.slice/user-1500.slice/user@1500.service/app.slice",
            &[],
        );
        let mut spec = spec_with(None);
        place(&host, &mut spec, &id(), false, true).unwrap();
        assert_eq!(
            path_of(&spec),
            Some(PathBuf::from(
                "/user.slice/user-1500.slice/user@1500.service/app.slice/c1"
            ))
        );
        host.euid = host.euid.wrapping_add(1);
        let mut spec = spec_with(None);
        let e = place(&host, &mut spec, &id(), false, true).unwrap_err();
        assert!(matches!(e, CgroupsError::NotDelegated { .. }), "{e}");
        assert!(e.to_string().contains("docs/hosts.md"), "{e}");
    }

    #[test]
    fn oom_kills_read_v1_and_v2_files() {
        let host = FakeHost::new(Hierarchy::Unified);
        let v1 = host.cgroup(
            "memory/a",
            &[(
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
            )],
        );
        assert_eq!(oom_kills(&v1), Some(3));
        let v2 = host.cgroup("b", &[("memory.events", "low 0\noom 2\noom_kill 2\n")]);
        assert_eq!(oom_kills(&v2), Some(2));
        assert_eq!(oom_kills(&host.cgroup("c", &[])), None);
    }

    #[test]
    fn memory_dir_of_needs_an_existing_dir() {
        let host = FakeHost::new(Hierarchy::Unified).with_proc(7, "0::/x\n");
        assert_eq!(memory_dir_of(&host, 7), None);
        let d = host.cgroup("x", &[]);
        assert_eq!(memory_dir_of(&host, 7), Some(d));
        assert_eq!(memory_dir_of(&host, 8), None);
    }

    #[test]
    fn v2_placements_are_recorded_and_v1_ones_are_not() {
        let root = tempfile::tempdir().unwrap();
        let dir = crate::state::StateDirs::new(root.path().to_owned()).sandbox(&id());
        std::fs::create_dir_all(dir.path()).unwrap();
        let host = FakeHost::new(Hierarchy::Unified).with_proc(OWN_PID, V2);
        let mut spec = spec_with(Some("/default/c1"));
        let p = place(&host, &mut spec, &id(), false, false).unwrap();
        Record::save(&p, &spec, &dir).unwrap();
        assert_eq!(
            Record::load(&dir),
            Some(Record {
                path: "/default/c1".into(),
                systemd: false
            })
        );
        let v1_root = tempfile::tempdir().unwrap();
        let v1 = crate::state::StateDirs::new(v1_root.path().to_owned()).sandbox(&id());
        std::fs::create_dir_all(v1.path()).unwrap();
        let host = FakeHost::new(Hierarchy::Hybrid);
        let p = place(&host, &mut spec, &id(), false, false).unwrap();
        Record::save(&p, &spec, &v1).unwrap();
        assert_eq!(Record::load(&v1), None);
    }

    #[test]
    fn features_report_systemd_only_where_it_is_usable() {
        let mut host = FakeHost::new(Hierarchy::Hybrid);
        host.systemd = true;
        assert_eq!(features(&host)["systemd"], false);
        let mut host = FakeHost::new(Hierarchy::Unified);
        assert_eq!(features(&host)["systemd"], false);
        host.systemd = true;
        assert_eq!(features(&host)["systemd"], true);
        assert_eq!(features(&host)["v1"], true);
    }

    fn read_error(path: &Path, kind: std::io::ErrorKind) -> libcgroups::common::AnyManagerError {
        libcgroups::systemd::manager::SystemdManagerError::WrappedIo(
            libcgroups::common::WrappedIoError::Read {
                err: std::io::Error::from(kind),
                path: path.to_owned(),
            },
        )
        .into()
    }

    #[test]
    fn a_missing_scope_proves_the_cgroup_gone() {
        let dir = tempfile::tempdir().unwrap();
        let scope = dir.path().join("pod1.slice/cri-containerd-c1.scope");
        let err = read_error(&scope, std::io::ErrorKind::NotFound);
        assert!(proves_gone(&err, "cri-containerd-c1.scope"));
    }

    #[test]
    fn a_missing_child_or_an_existing_dir_does_not() {
        let dir = tempfile::tempdir().unwrap();
        // A child cgroup that vanished during the walk is not the container's own.
        let child = dir.path().join("cri-containerd-c1.scope/sub");
        let err = read_error(&child, std::io::ErrorKind::NotFound);
        assert!(!proves_gone(&err, "cri-containerd-c1.scope"));
        // The directory is there (it came back, or the error was not about it).
        let scope = dir.path().join("cri-containerd-c1.scope");
        std::fs::create_dir(&scope).unwrap();
        let err = read_error(&scope, std::io::ErrorKind::NotFound);
        assert!(!proves_gone(&err, "cri-containerd-c1.scope"));
        // Another error than "not found".
        let err = read_error(
            &dir.path().join("gone.scope"),
            std::io::ErrorKind::PermissionDenied,
        );
        assert!(!proves_gone(&err, "gone.scope"));
    }
}

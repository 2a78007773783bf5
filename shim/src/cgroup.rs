//! Reading a container's cgroups: metrics for `ctr task metrics` and CRI stats, and the OOM
//! notification behind TaskOOM, from the v1 controllers (legacy and hybrid hosts) or the
//! unified v2 directory (every current distribution). The shim only observes; placement and
//! limits are the runtime's business (`agent_sandbox::host::cgroups`).
//!
//! containerd-shim's `collect_metrics` panics on values it does not expect, so the few files
//! needed are read here: v1 metrics go out as `io.containerd.cgroups.v1.Metrics`, v2 ones as
//! `io.containerd.cgroups.v2.Metrics`, the two types containerd decodes.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryOomControl, MemoryStat, Metrics, PidsStat, Throttle,
};
use containerd_shim::protos::cgroups_v2::metrics as v2;
use containerd_shim::protos::protobuf::MessageDyn;
use rustix::event::{EventfdFlags, eventfd};
use rustix::fs::inotify;
use tokio::io::unix::AsyncFd;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Errors while reading cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read the cgroups of pid {pid}")]
    ProcCgroup {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("process has no cgroup v1 {controller} controller")]
    NoController { controller: &'static str },
    #[error("process has neither a cgroup v1 memory controller nor a cgroup v2 directory")]
    NoCgroup,
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot register an OOM notification on {path}")]
    OomRegister {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The cgroups of one process: its v1 directories by controller name, and its v2 directory
/// where the unified hierarchy has the resource controllers.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    dirs: HashMap<String, PathBuf>,
    unified: Option<PathBuf>,
}

impl Cgroups {
    /// Resolves `/proc/PID/cgroup` to directories under `/sys/fs/cgroup`.
    pub fn of_pid(pid: u32) -> Result<Self, CgroupError> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map_err(|source| CgroupError::ProcCgroup { pid, source })?;
        Ok(Self::parse(&text, Path::new(CGROUP_ROOT)))
    }

    fn parse(text: &str, root: &Path) -> Self {
        let mut dirs = HashMap::new();
        let mut unified = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.is_empty() {
                // On a unified host the v2 tree is the root (it has cgroup.controllers); on a
                // hybrid one it is `unified/`, without resource controllers.
                if root.join("cgroup.controllers").exists() {
                    unified = Some(root.join(rel));
                }
                continue;
            }
            if controllers.starts_with("name=") {
                continue;
            }
            // Co-mounted controllers (cpu,cpuacct) share one mount named after the list.
            let joint = root.join(controllers);
            for controller in controllers.split(',') {
                let mount = if joint.exists() || !root.join(controller).exists() {
                    joint.clone()
                } else {
                    root.join(controller)
                };
                dirs.insert(controller.to_owned(), mount.join(rel));
            }
        }
        Self { dirs, unified }
    }

    /// The v2 directory, when the process has no v1 memory controller (a unified host).
    fn v2_dir(&self) -> Option<&Path> {
        if self.dirs.contains_key("memory") {
            return None;
        }
        self.unified.as_deref()
    }

    /// Metrics in containerd's shape for the hierarchy in use: cgroups v1 `Metrics` or v2
    /// `Metrics`.
    pub fn metrics(&self) -> Result<Box<dyn MessageDyn>, CgroupError> {
        match self.v2_dir() {
            Some(dir) => Ok(Box::new(metrics_v2(dir)?)),
            None if self.dirs.contains_key("memory") => Ok(Box::new(self.metrics_v1()?)),
            None => Err(CgroupError::NoCgroup),
        }
    }

    fn dir(&self, controller: &'static str) -> Result<&Path, CgroupError> {
        self.dirs
            .get(controller)
            .map(PathBuf::as_path)
            .ok_or(CgroupError::NoController { controller })
    }

    /// Metrics in containerd's cgroups v1 shape. Memory is required; cpu and pids are filled
    /// when their controllers are present.
    fn metrics_v1(&self) -> Result<Metrics, CgroupError> {
        let mut m = Metrics::new();
        let mem = self.dir("memory")?;
        m.memory = Some(memory_v1(mem)?).into();
        m.memory_oom_control = Some(oom_control_v1(mem)?).into();
        if let Ok(acct) = self.dir("cpuacct") {
            m.cpu = Some(CPUStat {
                usage: Some(cpu_usage_v1(acct)?).into(),
                throttling: Some(self.throttling_v1()).into(),
                ..Default::default()
            })
            .into();
        }
        if let Ok(pids) = self.dir("pids") {
            let limit = read(&pids.join("pids.max"))?;
            m.pids = Some(PidsStat {
                current: read_u64(&pids.join("pids.current"))?,
                // "max" means unlimited, reported as 0 like containerd does.
                limit: limit.trim().parse().unwrap_or(0),
                ..Default::default()
            })
            .into();
        }
        Ok(m)
    }

    /// The cpu controller's throttling counters (zero where it or its file is missing).
    fn throttling_v1(&self) -> Throttle {
        let mut throttle = Throttle::new();
        if let Ok(cpu) = self.dir("cpu")
            && let Ok(text) = read(&cpu.join("cpu.stat"))
        {
            for (key, value) in key_values(&text) {
                match key {
                    "nr_periods" => throttle.periods = value,
                    "nr_throttled" => throttle.throttled_periods = value,
                    "throttled_time" => throttle.throttled_time = value,
                    _ => {}
                }
            }
        }
        throttle
    }

    /// The memory cgroup's `oom_kill` counter: v1 `memory.oom_control` (kernels from 4.13
    /// report it) or v2 `memory.events`.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.v2_dir() {
            Some(dir) => dir.join("memory.events"),
            None => self.dir("memory").ok()?.join("memory.oom_control"),
        };
        oom_kill_in(&fs::read_to_string(file).ok()?)
    }

    /// Registers for memory OOM notifications: v1 `cgroup.event_control`, v2 an inotify watch
    /// of `memory.events` (the kernel signals a modification when a counter moves).
    pub fn oom_watch(&self) -> Result<OomWatch, CgroupError> {
        if let Some(dir) = self.v2_dir() {
            let events = dir.join("memory.events");
            let reg_err = |source| CgroupError::OomRegister {
                path: events.clone(),
                source,
            };
            let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
                .map_err(|e| reg_err(e.into()))?;
            inotify::add_watch(&fd, &events, inotify::WatchFlags::MODIFY)
                .map_err(|e| reg_err(e.into()))?;
            let seen = self.oom_kills().unwrap_or(0);
            return Ok(OomWatch::V2 {
                fd: crate::stdio::async_fd(fd).map_err(reg_err)?,
                events,
                seen,
            });
        }
        let mem = self.dir("memory")?.to_owned();
        let control = mem.join("memory.oom_control");
        let reg_err = |source| CgroupError::OomRegister {
            path: mem.clone(),
            source,
        };
        let oom_file = fs::File::open(&control).map_err(reg_err)?;
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| reg_err(e.into()))?;
        let line = format!("{} {}", efd.as_raw_fd(), oom_file.as_raw_fd());
        fs::write(mem.join("cgroup.event_control"), line).map_err(reg_err)?;
        Ok(OomWatch::V1 {
            efd: crate::stdio::async_fd(efd).map_err(reg_err)?,
            control,
            _oom_file: oom_file,
        })
    }
}

/// An armed OOM notification for one memory cgroup.
pub enum OomWatch {
    V1 {
        efd: AsyncFd<OwnedFd>,
        control: PathBuf,
        _oom_file: fs::File,
    },
    V2 {
        fd: AsyncFd<OwnedFd>,
        events: PathBuf,
        /// The `oom_kill` count already reported.
        seen: u64,
    },
}

impl OomWatch {
    /// Resolves when the cgroup hits an OOM; `None` once the cgroup is gone.
    ///
    /// v1: the kernel signals the eventfd when the OOM starts (before the victim is killed, so
    /// the `oom_kill` counter may not have moved yet) and again when the cgroup is removed; a
    /// notification counts as an OOM while the cgroup still exists. v2: every change of
    /// `memory.events` wakes the watch; an OOM is a rise of its `oom_kill` count.
    pub async fn next(&mut self) -> Option<()> {
        match self {
            OomWatch::V1 { efd, control, .. } => {
                read_ready(efd).await?;
                fs::metadata(&*control).ok().map(drop)
            }
            OomWatch::V2 { fd, events, seen } => loop {
                read_ready(fd).await?;
                let kills = oom_kill_in(&fs::read_to_string(&*events).ok()?)?;
                if kills > *seen {
                    *seen = kills;
                    return Some(());
                }
            },
        }
    }
}

/// Waits until `fd` has something to read and drains it; `None` when it fails.
async fn read_ready(fd: &AsyncFd<OwnedFd>) -> Option<()> {
    loop {
        let mut guard = fd.readable().await.ok()?;
        // Large enough for a batch of inotify events; an eventfd read takes 8 bytes.
        let mut buf = [0u8; 1024];
        match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(io::Error::from)) {
            Ok(Ok(_)) => return Some(()),
            Ok(Err(_)) => return None,
            Err(_would_block) => continue,
        }
    }
}

fn oom_kill_in(text: &str) -> Option<u64> {
    key_values(text)
        .find(|(k, _)| *k == "oom_kill")
        .map(|(_, v)| v)
}

/// Metrics of a v2 cgroup directory in containerd's cgroups v2 shape. Memory is required;
/// cpu, pids and memory events are filled when their files exist.
fn metrics_v2(dir: &Path) -> Result<v2::Metrics, CgroupError> {
    let mut m = v2::Metrics::new();
    m.memory = Some(memory_v2(dir)?).into();
    if let Ok(text) = read(&dir.join("memory.events")) {
        m.memory_events = Some(memory_events_v2(&text)).into();
    }
    if let Ok(text) = read(&dir.join("cpu.stat")) {
        m.cpu = Some(cpu_v2(&text)).into();
    }
    if let Ok(current) = read_u64(&dir.join("pids.current")) {
        m.pids = Some(v2::PidsStat {
            current,
            limit: read_limit(&dir.join("pids.max"))?,
            ..Default::default()
        })
        .into();
    }
    Ok(m)
}

/// The v2 memory files: usage, limits, peak and `memory.stat`.
fn memory_v2(dir: &Path) -> Result<v2::MemoryStat, CgroupError> {
    let mut ms = v2::MemoryStat {
        usage: read_u64(&dir.join("memory.current"))?,
        usage_limit: read_limit(&dir.join("memory.max"))?,
        ..Default::default()
    };
    if let Ok(v) = read_u64(&dir.join("memory.swap.current")) {
        ms.swap_usage = v;
    }
    if let Ok(v) = read_limit(&dir.join("memory.swap.max")) {
        ms.swap_limit = v;
    }
    if let Ok(v) = read_u64(&dir.join("memory.peak")) {
        ms.max_usage = v;
    }
    for (key, value) in key_values(&read(&dir.join("memory.stat"))?) {
        let field = match key {
            "anon" => &mut ms.anon,
            "file" => &mut ms.file,
            "kernel_stack" => &mut ms.kernel_stack,
            "slab" => &mut ms.slab,
            "sock" => &mut ms.sock,
            "shmem" => &mut ms.shmem,
            "file_mapped" => &mut ms.file_mapped,
            "file_dirty" => &mut ms.file_dirty,
            "file_writeback" => &mut ms.file_writeback,
            "anon_thp" => &mut ms.anon_thp,
            "inactive_anon" => &mut ms.inactive_anon,
            "active_anon" => &mut ms.active_anon,
            "inactive_file" => &mut ms.inactive_file,
            "active_file" => &mut ms.active_file,
            "unevictable" => &mut ms.unevictable,
            "slab_reclaimable" => &mut ms.slab_reclaimable,
            "slab_unreclaimable" => &mut ms.slab_unreclaimable,
            "pgfault" => &mut ms.pgfault,
            "pgmajfault" => &mut ms.pgmajfault,
            "workingset_refault" => &mut ms.workingset_refault,
            "workingset_activate" => &mut ms.workingset_activate,
            "workingset_nodereclaim" => &mut ms.workingset_nodereclaim,
            "pgrefill" => &mut ms.pgrefill,
            "pgscan" => &mut ms.pgscan,
            "pgsteal" => &mut ms.pgsteal,
            "pgactivate" => &mut ms.pgactivate,
            "pgdeactivate" => &mut ms.pgdeactivate,
            "pglazyfree" => &mut ms.pglazyfree,
            "pglazyfreed" => &mut ms.pglazyfreed,
            "thp_fault_alloc" => &mut ms.thp_fault_alloc,
            "thp_collapse_alloc" => &mut ms.thp_collapse_alloc,
            _ => continue,
        };
        *field = value;
    }
    Ok(ms)
}

/// `memory.events`.
fn memory_events_v2(text: &str) -> v2::MemoryEvents {
    let mut ev = v2::MemoryEvents::new();
    for (key, value) in key_values(text) {
        match key {
            "low" => ev.low = value,
            "high" => ev.high = value,
            "max" => ev.max = value,
            "oom" => ev.oom = value,
            "oom_kill" => ev.oom_kill = value,
            "oom_group_kill" => ev.oom_group_kill = value,
            _ => {}
        }
    }
    ev
}

/// `cpu.stat`.
fn cpu_v2(text: &str) -> v2::CPUStat {
    let mut cpu = v2::CPUStat::new();
    for (key, value) in key_values(text) {
        match key {
            "usage_usec" => cpu.usage_usec = value,
            "user_usec" => cpu.user_usec = value,
            "system_usec" => cpu.system_usec = value,
            "nr_periods" => cpu.nr_periods = value,
            "nr_throttled" => cpu.nr_throttled = value,
            "throttled_usec" => cpu.throttled_usec = value,
            "nr_bursts" => cpu.nr_bursts = value,
            "burst_usec" => cpu.burst_usec = value,
            _ => {}
        }
    }
    cpu
}

/// A v2 limit file: a number, or "max" (unlimited, reported as 0 like containerd does).
fn read_limit(path: &Path) -> Result<u64, CgroupError> {
    Ok(read(path)?.trim().parse().unwrap_or(0))
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    Ok(read(path)?.trim().parse().unwrap_or(0))
}

fn key_values(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|l| {
        let (k, v) = l.split_once(' ')?;
        Some((k, v.trim().parse().ok()?))
    })
}

/// The v1 memory controller's usage entries and `memory.stat`.
fn memory_v1(mem: &Path) -> Result<MemoryStat, CgroupError> {
    let entry = |prefix: &str| -> Result<MemoryEntry, CgroupError> {
        Ok(MemoryEntry {
            usage: read_u64(&mem.join(format!("{prefix}usage_in_bytes")))?,
            limit: read_u64(&mem.join(format!("{prefix}limit_in_bytes")))?,
            max: read_u64(&mem.join(format!("{prefix}max_usage_in_bytes")))?,
            failcnt: read_u64(&mem.join(format!("{prefix}failcnt")))?,
            ..Default::default()
        })
    };
    let mut ms = MemoryStat {
        usage: Some(entry("memory.")?).into(),
        kernel: entry("memory.kmem.").ok().into(),
        kernel_tcp: entry("memory.kmem.tcp.").ok().into(),
        swap: entry("memory.memsw.").ok().into(),
        ..Default::default()
    };
    let stat = read(&mem.join("memory.stat"))?;
    for (key, value) in key_values(&stat) {
        let field = match key {
            "cache" => &mut ms.cache,
            "rss" => &mut ms.rss,
            "rss_huge" => &mut ms.rss_huge,
            "mapped_file" => &mut ms.mapped_file,
            "dirty" => &mut ms.dirty,
            "writeback" => &mut ms.writeback,
            "pgpgin" => &mut ms.pg_pg_in,
            "pgpgout" => &mut ms.pg_pg_out,
            "pgfault" => &mut ms.pg_fault,
            "pgmajfault" => &mut ms.pg_maj_fault,
            "inactive_anon" => &mut ms.inactive_anon,
            "active_anon" => &mut ms.active_anon,
            "inactive_file" => &mut ms.inactive_file,
            "active_file" => &mut ms.active_file,
            "unevictable" => &mut ms.unevictable,
            "hierarchical_memory_limit" => &mut ms.hierarchical_memory_limit,
            "hierarchical_memsw_limit" => &mut ms.hierarchical_swap_limit,
            "total_cache" => &mut ms.total_cache,
            "total_rss" => &mut ms.total_rss,
            "total_rss_huge" => &mut ms.total_rss_huge,
            "total_mapped_file" => &mut ms.total_mapped_file,
            "total_dirty" => &mut ms.total_dirty,
            "total_writeback" => &mut ms.total_writeback,
            "total_pgpgin" => &mut ms.total_pg_pg_in,
            "total_pgpgout" => &mut ms.total_pg_pg_out,
            "total_pgfault" => &mut ms.total_pg_fault,
            "total_pgmajfault" => &mut ms.total_pg_maj_fault,
            "total_inactive_anon" => &mut ms.total_inactive_anon,
            "total_active_anon" => &mut ms.total_active_anon,
            "total_inactive_file" => &mut ms.total_inactive_file,
            "total_active_file" => &mut ms.total_active_file,
            "total_unevictable" => &mut ms.total_unevictable,
            _ => continue,
        };
        *field = value;
    }
    Ok(ms)
}

/// The v1 memory controller's `memory.oom_control`.
fn oom_control_v1(mem: &Path) -> Result<MemoryOomControl, CgroupError> {
    let oom = read(&mem.join("memory.oom_control"))?;
    let mut oc = MemoryOomControl::new();
    for (key, value) in key_values(&oom) {
        match key {
            "oom_kill_disable" => oc.oom_kill_disable = value,
            "under_oom" => oc.under_oom = value,
            "oom_kill" => oc.oom_kill = value,
            _ => {}
        }
    }
    Ok(oc)
}

/// The v1 cpuacct controller's usage, total, per cpu, user and kernel.
fn cpu_usage_v1(acct: &Path) -> Result<CPUUsage, CgroupError> {
    let mut usage = CPUUsage {
        total: read_u64(&acct.join("cpuacct.usage"))?,
        per_cpu: read(&acct.join("cpuacct.usage_percpu"))?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect(),
        ..Default::default()
    };
    // cpuacct.stat counts USER_HZ ticks (100 per second on Linux); metrics want ns.
    for (key, ticks) in key_values(&read(&acct.join("cpuacct.stat"))?) {
        let ns = ticks.saturating_mul(10_000_000);
        match key {
            "user" => usage.user = ns,
            "system" => usage.kernel = ns,
            _ => {}
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_separate_and_joint_mounts() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("memory")).unwrap();
        fs::create_dir_all(root.path().join("cpu,cpuacct")).unwrap();
        let text = "9:name=systemd:/\n4:memory:/default/c1\n2:cpu,cpuacct:/default/c1\n0::/\n";
        let cg = Cgroups::parse(text, root.path());
        assert_eq!(
            cg.dir("memory").unwrap(),
            root.path().join("memory/default/c1")
        );
        assert_eq!(
            cg.dir("cpuacct").unwrap(),
            root.path().join("cpu,cpuacct/default/c1")
        );
        assert!(cg.dir("pids").is_err());
    }

    #[test]
    fn metrics_read_memory_files() {
        let root = tempfile::tempdir().unwrap();
        let mem = root.path().join("memory/c");
        fs::create_dir_all(&mem).unwrap();
        for (f, v) in [
            ("memory.usage_in_bytes", "4096\n"),
            ("memory.limit_in_bytes", "8192\n"),
            ("memory.max_usage_in_bytes", "5000\n"),
            ("memory.failcnt", "3\n"),
            ("memory.stat", "cache 10\nrss 20\ntotal_rss 20\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            ),
        ] {
            fs::write(mem.join(f), v).unwrap();
        }
        let cg = Cgroups::parse("4:memory:/c\n", root.path());
        let m = cg.metrics_v1().unwrap();
        let usage = m.memory.usage.as_ref().unwrap();
        assert_eq!(
            (usage.usage, usage.limit, usage.max, usage.failcnt),
            (4096, 8192, 5000, 3)
        );
        assert_eq!((m.memory.cache, m.memory.rss), (10, 20));
        assert_eq!(m.memory_oom_control.oom_kill, 2);
        assert!(m.cpu.is_none());
    }

    fn v2_host() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let dir = root.path().join("machine.slice/libpod-c.scope");
        fs::create_dir_all(&dir).unwrap();
        for (f, v) in [
            ("memory.current", "4096\n"),
            ("memory.max", "8192\n"),
            ("memory.stat", "anon 10\nfile 20\npgfault 3\n"),
            ("memory.events", "low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n"),
            ("pids.current", "2\n"),
            ("pids.max", "max\n"),
            (
                "cpu.stat",
                "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_throttled 5\n",
            ),
        ] {
            fs::write(dir.join(f), v).unwrap();
        }
        (root, dir)
    }

    #[test]
    fn unified_hosts_use_the_v2_dir_and_hybrid_ones_v1() {
        let (root, dir) = v2_host();
        let cg = Cgroups::parse("0::/machine.slice/libpod-c.scope\n", root.path());
        assert_eq!(cg.v2_dir(), Some(dir.as_path()));
        assert_eq!(cg.oom_kills(), Some(1));
        // Hybrid: no cgroup.controllers at the root, the v1 memory controller rules.
        let hybrid = tempfile::tempdir().unwrap();
        let cg = Cgroups::parse("4:memory:/c\n0::/c\n", hybrid.path());
        assert_eq!(cg.v2_dir(), None);
        assert!(
            Cgroups::parse("1:name=systemd:/c\n", hybrid.path())
                .metrics()
                .is_err()
        );
    }

    #[test]
    fn v2_metrics_read_memory_cpu_pids_and_events() {
        let (root, dir) = v2_host();
        let m = metrics_v2(&dir).unwrap();
        assert_eq!((m.memory.usage, m.memory.usage_limit), (4096, 8192));
        assert_eq!(
            (m.memory.anon, m.memory.file, m.memory.pgfault),
            (10, 20, 3)
        );
        assert_eq!(m.memory_events.oom_kill, 1);
        assert_eq!((m.pids.current, m.pids.limit), (2, 0));
        assert_eq!((m.cpu.usage_usec, m.cpu.nr_throttled), (100, 5));
        let cg = Cgroups::parse("0::/machine.slice/libpod-c.scope\n", root.path());
        let any = containerd_shim::util::convert_to_any(cg.metrics().unwrap()).unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    }

    #[tokio::test]
    async fn v2_oom_watch_fires_when_oom_kill_rises() {
        let (root, dir) = v2_host();
        let cg = Cgroups::parse("0::/machine.slice/libpod-c.scope\n", root.path());
        let mut watch = cg.oom_watch().unwrap();
        // A change that is not an OOM kill does not fire.
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 1\nmax 1\noom 1\noom_kill 1\n",
        )
        .unwrap();
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), watch.next()).await;
        assert!(quiet.is_err(), "fired without a new kill");
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 1\nmax 2\noom 2\noom_kill 2\n",
        )
        .unwrap();
        let fired = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next()).await;
        assert_eq!(fired.unwrap(), Some(()));
    }
}

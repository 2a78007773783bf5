//! Reading a container's cgroup v1 controllers: metrics for `ctr task metrics` and the OOM
//! notification behind TaskOOM. The shim only observes; limits are the runtime's business.
//!
//! containerd-shim's `collect_metrics` targets cgroup v2 layouts (and panics on values it does
//! not expect); this machine is hybrid with every resource controller on v1, so the few files
//! needed are read here.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryOomControl, MemoryStat, Metrics, PidsStat, Throttle,
};
use rustix::event::{EventfdFlags, eventfd};
use tokio::io::unix::AsyncFd;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Errors while reading cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("Cannot read the cgroups of pid {pid}")]
    ProcCgroup {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("Process has no cgroup v1 {controller} controller")]
    NoController { controller: &'static str },
    #[error("Cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Cannot register an OOM notification on {path}")]
    OomRegister {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The v1 directories of one process, by controller name.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    dirs: HashMap<String, PathBuf>,
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
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if controllers.is_empty() || controllers.starts_with("name=") {
                continue;
            }
            let rel = path.trim_start_matches('/');
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
        Self { dirs }
    }

    fn dir(&self, controller: &'static str) -> Result<&Path, CgroupError> {
        self.dirs
            .get(controller)
            .map(PathBuf::as_path)
            .ok_or(CgroupError::NoController { controller })
    }

    /// Metrics in containerd's cgroups v1 shape. Memory is required; cpu and pids are filled
    /// when their controllers are present.
    pub fn metrics(&self) -> Result<Metrics, CgroupError> {
        let mut m = Metrics::new();
        let mem = self.dir("memory")?;
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
        m.memory = Some(ms).into();
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
        m.memory_oom_control = Some(oc).into();

        if let Ok(acct) = self.dir("cpuacct") {
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
            m.cpu = Some(CPUStat {
                usage: Some(usage).into(),
                throttling: Some(throttle).into(),
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

    /// The memory cgroup's `oom_kill` counter (kernels from 4.13 report it).
    pub fn oom_kills(&self) -> Option<u64> {
        let text = fs::read_to_string(self.dir("memory").ok()?.join("memory.oom_control")).ok()?;
        key_values(&text)
            .find(|(k, _)| *k == "oom_kill")
            .map(|(_, v)| v)
    }

    /// Registers for memory OOM notifications (cgroup v1 `cgroup.event_control`).
    pub fn oom_watch(&self) -> Result<OomWatch, CgroupError> {
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
        Ok(OomWatch {
            efd: crate::stdio::async_fd(efd).map_err(reg_err)?,
            control,
            _oom_file: oom_file,
        })
    }
}

/// An armed OOM notification for one memory cgroup.
pub struct OomWatch {
    efd: AsyncFd<OwnedFd>,
    control: PathBuf,
    _oom_file: fs::File,
}

impl OomWatch {
    /// Resolves when the cgroup hits an OOM; `None` once the cgroup is gone. The kernel
    /// signals the eventfd when the OOM starts (before the victim is killed, so the `oom_kill`
    /// counter may not have moved yet) and again when the cgroup is removed; a notification
    /// counts as an OOM while the cgroup still exists.
    pub async fn next(&mut self) -> Option<()> {
        loop {
            let mut guard = self.efd.readable().await.ok()?;
            let mut buf = [0u8; 8];
            match guard
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(io::Error::from))
            {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return None,
                Err(_would_block) => continue,
            }
            return fs::metadata(&self.control).ok().map(drop);
        }
    }
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
        let m = cg.metrics().unwrap();
        let usage = m.memory.usage.as_ref().unwrap();
        assert_eq!(
            (usage.usage, usage.limit, usage.max, usage.failcnt),
            (4096, 8192, 5000, 3)
        );
        assert_eq!((m.memory.cache, m.memory.rss), (10, 20));
        assert_eq!(m.memory_oom_control.oom_kill, 2);
        assert!(m.cpu.is_none());
    }
}

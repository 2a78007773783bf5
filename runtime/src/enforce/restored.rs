//! The fail-closed check of a restored sandbox (docs/checkpoint.md#refused). A checkpoint
//! image is a file a user may have edited: CRIU restores whatever credentials, seccomp
//! filters, id maps and namespaces it describes. So after CRIU made the tasks, and before
//! any of them runs on, every thread of every restored process is checked against what the
//! sandbox's plan gives, as the kernel reports it in `/proc`:
//!
//! - no capability in any set (`CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb` all 0),
//! - `NoNewPrivs: 1`,
//! - `Seccomp: 2` (filter mode) with exactly the sandbox's number of filters,
//! - `uid_map` and `gid_map` exactly the sandbox's id block,
//! - each namespace the sandbox has of its own is not the host's, and is the same for every
//!   task (the restored init's).
//!
//! Any difference is an error naming the task and what differs; the caller kills the
//! restored tasks. What `/proc` does not show (a Landlock domain) is decided before the
//! restore from the plan instead (`lifecycle/checkpoint.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::host::idmap::IdRange;

/// The namespaces a sandbox always has of its own (`time` stays the host's: CRIU may make
/// one to keep monotonic clocks, which narrows nothing).
pub const OWN_NAMESPACES: [&str; 7] = ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// Errors of the check.
#[derive(Debug, thiserror::Error)]
pub enum RestoredError {
    #[error(
        "restored task {pid} does not match the sandbox's plan: {what}; the restored \
         sandbox was killed (docs/checkpoint.md#refused)"
    )]
    Differs { pid: i32, what: String },
    #[error("cannot read {path} of a restored task")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What every restored task must show.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Expected {
    /// The sandbox's host id block (its `uid_map` and `gid_map`: `0 START SIZE`).
    pub ids: IdRange,
    /// How many seccomp filters the sandbox's executor installs.
    pub seccomp_filters: u32,
    /// The host's namespaces (the runtime's own), by type (`net` -> `net:[4026531840]`).
    pub host_ns: BTreeMap<String, String>,
}

impl Expected {
    /// The host's namespaces as `proc` (`/proc`, or a fake tree) shows them for `pid`.
    pub fn host_namespaces(
        proc: &Path,
        pid: &str,
    ) -> Result<BTreeMap<String, String>, RestoredError> {
        OWN_NAMESPACES
            .iter()
            .map(|t| Ok(((*t).to_owned(), ns_link(&proc.join(pid), t)?)))
            .collect()
    }
}

fn read(path: PathBuf) -> Result<String, RestoredError> {
    std::fs::read_to_string(&path).map_err(|source| RestoredError::Read { path, source })
}

fn ns_link(dir: &Path, kind: &str) -> Result<String, RestoredError> {
    let path = dir.join("ns").join(kind);
    std::fs::read_link(&path)
        .map(|l| l.to_string_lossy().into_owned())
        .map_err(|source| RestoredError::Read { path, source })
}

/// The restored processes: `root` and its descendants, from each thread's `children`.
pub fn tree(proc: &Path, root: i32) -> Result<Vec<i32>, RestoredError> {
    let mut out = vec![root];
    let mut i = 0;
    while let Some(&pid) = out.get(i) {
        i += 1;
        for tid in threads(proc, pid)? {
            let children = read(
                proc.join(pid.to_string())
                    .join("task")
                    .join(tid.to_string())
                    .join("children"),
            )?;
            out.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    Ok(out)
}

fn threads(proc: &Path, pid: i32) -> Result<Vec<i32>, RestoredError> {
    let path = proc.join(pid.to_string()).join("task");
    let entries = std::fs::read_dir(&path).map_err(|source| RestoredError::Read {
        path: path.clone(),
        source,
    })?;
    let mut tids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Checks every thread of every process in `root`'s tree; returns the processes checked.
pub fn check(proc: &Path, root: i32, expected: &Expected) -> Result<Vec<i32>, RestoredError> {
    let pids = tree(proc, root)?;
    let root_dir = proc.join(root.to_string());
    let sandbox_ns: BTreeMap<&str, String> = OWN_NAMESPACES
        .iter()
        .map(|t| Ok((*t, ns_link(&root_dir, t)?)))
        .collect::<Result<_, RestoredError>>()?;
    for &pid in &pids {
        let differs = |what: String| RestoredError::Differs { pid, what };
        let dir = proc.join(pid.to_string());
        // The process's status is its leader thread's (`task/PID/status`), read once.
        let leader = read(dir.join("status"))?;
        if is_zombie(&leader) {
            continue;
        }
        for tid in threads(proc, pid)? {
            let status = if tid == pid {
                std::borrow::Cow::Borrowed(leader.as_str())
            } else {
                std::borrow::Cow::Owned(read(
                    dir.join("task").join(tid.to_string()).join("status"),
                )?)
            };
            status_matches(&status, expected).map_err(|w| differs(format!("thread {tid}: {w}")))?;
        }
        let want = format!("0 {} {}", expected.ids.host_start, expected.ids.size);
        for map in ["uid_map", "gid_map"] {
            let got = read(dir.join(map))?;
            let got = got.split_whitespace().collect::<Vec<_>>().join(" ");
            if got != want {
                return Err(differs(format!("{map} is {got:?}, not {want:?}")));
            }
        }
        for (kind, sandbox) in &sandbox_ns {
            let got = ns_link(&dir, kind)?;
            if expected.host_ns.get(*kind) == Some(&got) {
                return Err(differs(format!(
                    "its {kind} namespace is the host's ({got})"
                )));
            }
            if &got != sandbox {
                return Err(differs(format!(
                    "its {kind} namespace {got} is not the restored init's {sandbox}"
                )));
            }
        }
    }
    Ok(pids)
}

/// True for a process that has exited and waits to be reaped (`State: Z`, or `X` while it
/// goes): CRIU restores an image's zombies as tasks that exit at once, before the tasks
/// resume, and one runs nothing again. Its credentials, filters and namespaces are those of
/// CRIU's restore until it exited (the kernel keeps an exited task's credentials), so they
/// are not the sandbox's and are not checked.
fn is_zombie(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|v| matches!(v.trim_start().chars().next(), Some('Z' | 'X')))
}

/// What in one thread's `status` differs from `expected`, if anything.
fn status_matches(status: &str, expected: &Expected) -> Result<(), String> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .ok_or_else(|| format!("no {name} line"))
    };
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = field(set)?;
        if u64::from_str_radix(v, 16) != Ok(0) {
            return Err(format!("{set} is {v}, not 0"));
        }
    }
    let want = |name: &str, want: String| {
        let v = field(name)?;
        if v == want {
            Ok(())
        } else {
            Err(format!("{name} is {v}, not {want}"))
        }
    };
    want("NoNewPrivs", "1".to_owned())?;
    want("Seccomp", "2".to_owned())?;
    want("Seccomp_filters", expected.seccomp_filters.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "Name:\tsh\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n\
NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t4\n";

    /// A fake `/proc`: pid 1 (the host's), the restored init 100 with threads 100 and 101,
    /// and its child 200.
    struct FakeProc(tempfile::TempDir);

    impl FakeProc {
        fn new() -> Self {
            let f = FakeProc(tempfile::tempdir().unwrap());
            f.process(1, &[1], "0 0 4294967295", "4026531", &[]);
            f.process(100, &[100, 101], "0 1000000 65536", "4026532", &[200]);
            f.process(200, &[200], "0 1000000 65536", "4026532", &[]);
            f
        }

        fn path(&self) -> &Path {
            self.0.path()
        }

        fn process(&self, pid: i32, tids: &[i32], map: &str, ns: &str, children: &[i32]) {
            let dir = self.path().join(pid.to_string());
            for (i, tid) in tids.iter().enumerate() {
                let t = dir.join("task").join(tid.to_string());
                std::fs::create_dir_all(&t).unwrap();
                std::fs::write(t.join("status"), format!("State:\tS (sleeping)\n{GOOD}")).unwrap();
                let kids: Vec<String> = if i == 0 {
                    children.iter().map(ToString::to_string).collect()
                } else {
                    Vec::new()
                };
                std::fs::write(t.join("children"), kids.join(" ")).unwrap();
            }
            std::fs::write(dir.join("status"), format!("State:\tS (sleeping)\n{GOOD}")).unwrap();
            std::fs::write(dir.join("uid_map"), format!("         {map}\n")).unwrap();
            std::fs::write(dir.join("gid_map"), format!("         {map}\n")).unwrap();
            std::fs::create_dir_all(dir.join("ns")).unwrap();
            for (i, kind) in OWN_NAMESPACES.iter().enumerate() {
                self.ns(pid, kind, &format!("{kind}:[{ns}{i:03}]"));
            }
        }

        fn ns(&self, pid: i32, kind: &str, target: &str) {
            let link = self.path().join(pid.to_string()).join("ns").join(kind);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, link).unwrap();
        }

        /// Edits thread `tid`'s status; the leader's is the process's own.
        fn status(&self, pid: i32, tid: i32, from: &str, to: &str) {
            let dir = self.path().join(pid.to_string());
            let thread = dir.join("task").join(tid.to_string()).join("status");
            let leader = (tid == pid).then(|| dir.join("status"));
            for p in [Some(thread), leader].into_iter().flatten() {
                let text = std::fs::read_to_string(&p).unwrap();
                assert!(text.contains(from), "{from}");
                std::fs::write(p, text.replace(from, to)).unwrap();
            }
        }

        fn expected(&self) -> Expected {
            Expected {
                ids: IdRange {
                    host_start: 1_000_000,
                    size: 65536,
                },
                seccomp_filters: 4,
                host_ns: Expected::host_namespaces(self.path(), "1").unwrap(),
            }
        }
    }

    fn refused(f: &FakeProc) -> String {
        match check(f.path(), 100, &f.expected()) {
            Err(e @ RestoredError::Differs { .. }) => e.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_sandbox_restored_as_planned_passes_with_every_process() {
        let f = FakeProc::new();
        assert_eq!(check(f.path(), 100, &f.expected()).unwrap(), vec![100, 200]);
    }

    #[test]
    fn a_capability_in_any_set_of_any_thread_is_refused() {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let f = FakeProc::new();
            f.status(
                100,
                101,
                &format!("{set}:\t0000000000000000"),
                &format!("{set}:\t0000000000200000"),
            );
            let e = refused(&f);
            assert!(e.contains("task 100") && e.contains("thread 101"), "{e}");
            assert!(
                e.contains(&format!("{set} is 0000000000200000, not 0")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_dropped_or_changed_seccomp_filter_is_refused() {
        let f = FakeProc::new();
        f.status(200, 200, "Seccomp:\t2", "Seccomp:\t0");
        let e = refused(&f);
        assert!(
            e.contains("task 200 ") && e.contains("thread 200: Seccomp is 0, not 2"),
            "{e}"
        );
        let f = FakeProc::new();
        f.status(200, 200, "Seccomp_filters:\t4", "Seccomp_filters:\t3");
        assert!(refused(&f).contains("Seccomp_filters is 3, not 4"));
        let f = FakeProc::new();
        f.status(100, 100, "NoNewPrivs:\t1", "NoNewPrivs:\t0");
        assert!(refused(&f).contains("NoNewPrivs is 0, not 1"));
    }

    #[test]
    fn an_id_map_other_than_the_sandbox_block_is_refused() {
        let f = FakeProc::new();
        std::fs::write(f.path().join("200/uid_map"), "0 0 65536\n").unwrap();
        assert!(refused(&f).contains("uid_map is \"0 0 65536\", not \"0 1000000 65536\""));
        let f = FakeProc::new();
        std::fs::write(f.path().join("100/gid_map"), "0 1000000 65536\n65536 0 1\n").unwrap();
        assert!(refused(&f).contains("gid_map"));
    }

    #[test]
    fn a_host_namespace_or_one_apart_from_the_init_is_refused() {
        let f = FakeProc::new();
        f.ns(200, "net", "net:[4026531003]");
        assert!(refused(&f).contains("its net namespace is the host's"));
        let f = FakeProc::new();
        f.ns(200, "pid", "pid:[999]");
        assert!(refused(&f).contains("not the restored init's"));
        // The init itself in the host's cgroup namespace (CRIU without cgroupns support).
        let f = FakeProc::new();
        f.ns(100, "cgroup", "cgroup:[4026531006]");
        let e = refused(&f);
        assert!(
            e.contains("task 100 ") && e.contains("its cgroup namespace is the host's"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_line_or_file_is_an_error_not_a_pass() {
        let f = FakeProc::new();
        f.status(100, 100, "Seccomp_filters:\t4\n", "");
        assert!(refused(&f).contains("no Seccomp_filters line"));
        let f = FakeProc::new();
        std::fs::remove_file(f.path().join("200/uid_map")).unwrap();
        assert!(matches!(
            check(f.path(), 100, &f.expected()),
            Err(RestoredError::Read { .. })
        ));
    }

    #[test]
    fn a_zombie_is_passed_over_but_a_live_task_with_its_creds_is_refused() {
        // CRIU's restore made task 200 and it exited as the image's zombie: the kernel shows
        // CRIU's credentials on it, and no namespaces.
        let f = FakeProc::new();
        f.status(
            200,
            200,
            "CapEff:	0000000000000000",
            "CapEff:	000001ffffffffff",
        );
        f.status(200, 200, "Seccomp:	2", "Seccomp:	0");
        assert!(refused(&f).contains("task 200 "));
        f.status(200, 200, "State:	S (sleeping)", "State:	Z (zombie)");
        std::fs::remove_dir_all(f.path().join("200/ns")).unwrap();
        assert_eq!(check(f.path(), 100, &f.expected()).unwrap(), [100, 200]);
        // A live process's other threads are checked from their own status.
        let f = FakeProc::new();
        f.status(100, 101, "NoNewPrivs:	1", "NoNewPrivs:	0");
        assert!(refused(&f).contains("thread 101: NoNewPrivs is 0"));
    }
}

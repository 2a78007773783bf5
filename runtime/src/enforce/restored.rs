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
//!   task (the restored init's),
//! - the restored mount tree keeps the plan's read-only mounts and masks: `/` and every
//!   mount the spec makes read-only are mounted and read-only, every masked and read-only
//!   path of the spec that the kernel has under a restored `proc` or `sysfs` is covered by a
//!   mount of its own (read-only paths read-only), and no filesystem that reaches the
//!   host's kernel state (`debugfs`, `securityfs`, `bpf`, ...) is mounted.
//!
//! Any difference is an error naming the task and what differs; the caller kills the
//! restored tasks. What `/proc` does not show (a Landlock domain) is decided before the
//! restore from the plan instead (`lifecycle/checkpoint.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::host::criu::unescape;
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
    /// What the restored mount tree must keep.
    #[serde(default)]
    pub mounts: ExpectedMounts,
}

/// The mounts of the plan a restored tree must keep (the image's `mountpoints-N.img` says
/// what CRIU mounts, and a user may have edited it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpectedMounts {
    /// Mount points that must be mounted, the mount on top read-only and with the spec's
    /// other flags among `nosuid`, `nodev` and `noexec`: `/` and the spec's mounts with `ro`.
    pub readonly: Vec<(String, Vec<String>)>,
    /// The spec's masked paths, and its read-only paths (`readonly: true`), that the host's
    /// kernel has: each must be a mount point wherever the mount holding it is a `proc` or
    /// a `sysfs` (the same kernel shows the same entries there).
    pub covered: Vec<(String, bool)>,
}

impl ExpectedMounts {
    /// What the spec's root, mounts, masked and read-only paths ask of the restored tree;
    /// `exists` says whether the host's kernel has a `/proc` or `/sys` path.
    pub fn of_spec(
        spec: &libcontainer::oci_spec::runtime::Spec,
        exists: impl Fn(&str) -> bool,
    ) -> Self {
        let mut readonly = Vec::new();
        if spec
            .root()
            .as_ref()
            .is_some_and(|r| r.readonly() == Some(true))
        {
            readonly.push(("/".to_owned(), Vec::new()));
        }
        for m in spec.mounts().iter().flatten() {
            // libcontainer does not make a cgroup v1 tree's tmpfs read-only, whatever the
            // spec says: the sandbox's own tree is whatever libcontainer made at create.
            let cgroup = m.typ().as_deref().is_some_and(|t| t.starts_with("cgroup"));
            let options = m.options().clone().unwrap_or_default();
            if !cgroup && options.iter().any(|o| o == "ro") {
                let flags = options
                    .into_iter()
                    .filter(|o| SEALED_FLAGS.contains(&o.as_str()))
                    .collect();
                readonly.push((m.destination().to_string_lossy().into_owned(), flags));
            }
        }
        let kernel_path =
            |p: &String| (p.starts_with("/proc/") || p.starts_with("/sys/")) && exists(p);
        let linux = spec.linux().as_ref();
        let masked = linux
            .and_then(|l| l.masked_paths().clone())
            .unwrap_or_default();
        let read_only = linux
            .and_then(|l| l.readonly_paths().clone())
            .unwrap_or_default();
        let covered = masked
            .iter()
            .filter(|p| kernel_path(p))
            .map(|p| (p.clone(), false))
            .chain(
                read_only
                    .iter()
                    .filter(|p| kernel_path(p))
                    .map(|p| (p.clone(), true)),
            )
            .collect();
        ExpectedMounts { readonly, covered }
    }
}

/// The per-mount flags of a read-only mount of the spec that a restored tree must keep.
const SEALED_FLAGS: [&str; 3] = ["nosuid", "nodev", "noexec"];

/// Filesystems no sandbox mounts: each reaches kernel state the host's, not the sandbox's
/// (a user namespace may not mount them, CRIU as the host's root may).
const HOST_FILESYSTEMS: [&str; 10] = [
    "debugfs",
    "tracefs",
    "securityfs",
    "bpf",
    "configfs",
    "pstore",
    "efivarfs",
    "binfmt_misc",
    "fusectl",
    "nsfs",
];

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
    // Every task is in the init's mount namespace (checked above): its tree is theirs.
    let mountinfo = read(root_dir.join("mountinfo"))?;
    mounts_match(&parse_mountinfo(&mountinfo), &expected.mounts)
        .map_err(|what| RestoredError::Differs { pid: root, what })?;
    Ok(pids)
}

/// One line of `/proc/PID/mountinfo`, the fields the check reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    id: u64,
    parent: u64,
    /// The root of the mount within its filesystem (`/` for a whole one).
    root: String,
    /// As seen from the task's root, octal escapes decoded.
    point: String,
    /// The per-mount options (`ro`, `nosuid`, ...).
    options: Vec<String>,
    fstype: String,
}

/// The lines of a mountinfo file; a line that does not parse is kept as a mount of an
/// unknown filesystem at an unknown point, which fails the check rather than passing it.
fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (head, tail) = line.split_once(" - ").unwrap_or((line, ""));
            let f: Vec<&str> = head.split(' ').collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
            MountLine {
                id: num(0),
                parent: num(1),
                root: f.get(3).map_or_else(String::new, |v| unescape(v)),
                point: f.get(4).map_or_else(|| "?".to_owned(), |v| unescape(v)),
                options: f
                    .get(5)
                    .map_or_else(Vec::new, |v| v.split(',').map(str::to_owned).collect()),
                fstype: tail
                    .split(' ')
                    .next()
                    .filter(|t| !t.is_empty())
                    .unwrap_or("?")
                    .to_owned(),
            }
        })
        .collect()
}

/// The mounts at `point` that nothing else at `point` is mounted on: what a path lookup
/// there reaches.
fn tops<'a>(tree: &'a [MountLine], point: &str) -> Vec<&'a MountLine> {
    let here: Vec<&MountLine> = tree.iter().filter(|m| m.point == point).collect();
    here.iter()
        .filter(|m| !here.iter().any(|o| o.parent == m.id))
        .copied()
        .collect()
}

/// The mount holding `path` (the longest mount point above it, on top there).
fn holder<'a>(tree: &'a [MountLine], path: &str) -> Option<&'a MountLine> {
    let mut best: Option<&MountLine> = None;
    for m in tree {
        let above = m.point == "/"
            || path
                .strip_prefix(m.point.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if above && best.is_none_or(|b| m.point.len() >= b.point.len()) {
            best = Some(m);
        }
    }
    let point = best?.point.clone();
    tops(tree, &point).into_iter().last()
}

/// The mounts the plan makes read-only that the restored tree shows writable, each with
/// its other per-mount flags: CRIU 4 binds an external directory again without the flags
/// the image records (HOME's guards came back writable), so the runtime sets them again
/// before the check ([`reseal`]).
fn unsealed(tree: &[MountLine], expected: &ExpectedMounts) -> Vec<(String, MsFlags)> {
    let mut out = Vec::new();
    for (point, want) in &expected.readonly {
        for m in tops(tree, point) {
            let has = |flag: &str| m.options.iter().any(|o| o == flag);
            if has("ro") && want.iter().all(|f| has(f)) {
                continue;
            }
            let flags = m.options.iter().chain(want).fold(MsFlags::empty(), |f, o| {
                f | match o.as_str() {
                    "nosuid" => MsFlags::MS_NOSUID,
                    "nodev" => MsFlags::MS_NODEV,
                    "noexec" => MsFlags::MS_NOEXEC,
                    "noatime" => MsFlags::MS_NOATIME,
                    "nodiratime" => MsFlags::MS_NODIRATIME,
                    "relatime" => MsFlags::MS_RELATIME,
                    "strictatime" => MsFlags::MS_STRICTATIME,
                    _ => MsFlags::empty(),
                }
            });
            out.push((m.point.clone(), flags));
        }
    }
    out
}

/// Makes read-only again, in the restored init's mount namespace, every mount the plan
/// makes read-only and the restored tree shows writable (see [`unsealed`]); returns the
/// mount points it sealed. A child process joins the namespace and remounts, so nothing
/// of the runtime's own resolves paths in the sandbox's tree; a mount that cannot be
/// sealed stays writable, and [`check`] refuses the restore.
pub fn reseal(
    proc: &Path,
    root: i32,
    expected: &ExpectedMounts,
) -> Result<Vec<String>, RestoredError> {
    let mountinfo = read(proc.join(root.to_string()).join("mountinfo"))?;
    let todo = unsealed(&parse_mountinfo(&mountinfo), expected);
    if todo.is_empty() {
        return Ok(Vec::new());
    }
    let ns_path = proc.join(root.to_string()).join("ns/mnt");
    let ns = std::fs::File::open(&ns_path).map_err(|source| RestoredError::Read {
        path: ns_path.clone(),
        source,
    })?;
    let points: Vec<(std::ffi::CString, MsFlags)> = todo
        .iter()
        .filter_map(|(p, f)| Some((std::ffi::CString::new(p.as_bytes()).ok()?, *f)))
        .collect();
    // What stays writable is refused by the check that follows.
    agent_sandbox_sys::reseal::remount_readonly_in(&ns, &points).map_err(|source| {
        RestoredError::Read {
            path: ns_path,
            source,
        }
    })?;
    Ok(todo.into_iter().map(|(p, _)| p).collect())
}

/// What in the restored mount tree differs from `expected`, if anything.
fn mounts_match(tree: &[MountLine], expected: &ExpectedMounts) -> Result<(), String> {
    // The host's device nodes reach a sandbox one by one (`/dev/null` bound from the host
    // shows `devtmpfs` with root `/null`); the whole of the host's `/dev` never does.
    let host_wide = |m: &&MountLine| {
        HOST_FILESYSTEMS.contains(&m.fstype.as_str())
            || m.fstype == "?"
            || (m.fstype == "devtmpfs" && m.root == "/")
    };
    if let Some(m) = tree.iter().find(host_wide) {
        return Err(format!(
            "its mount tree has a {} mount at {:?}, which no sandbox has",
            m.fstype, m.point
        ));
    }
    let read_only = |m: &MountLine| m.options.iter().any(|o| o == "ro");
    for (point, want) in &expected.readonly {
        let on_top = tops(tree, point);
        if on_top.is_empty() {
            return Err(format!(
                "nothing is mounted at {point:?}, which the plan mounts read-only"
            ));
        }
        if let Some(m) = on_top.iter().find(|m| !read_only(m)) {
            return Err(format!(
                "the {} mount at {point:?} is writable, not read-only",
                m.fstype
            ));
        }
        for m in &on_top {
            if let Some(flag) = want.iter().find(|f| !m.options.contains(f)) {
                return Err(format!(
                    "the {} mount at {point:?} is not {flag}, as the plan mounts it",
                    m.fstype
                ));
            }
        }
    }
    for (path, ro) in &expected.covered {
        let Some(holder) = holder(tree, path) else {
            continue;
        };
        if holder.point == *path {
            if *ro && !read_only(holder) {
                return Err(format!("the read-only path {path:?} is mounted writable"));
            }
            // A mask hides what is there: never the kernel's own entry bound over itself.
            if !*ro && matches!(holder.fstype.as_str(), "proc" | "sysfs") {
                return Err(format!(
                    "the masked path {path:?} is a {} mount, which shows it",
                    holder.fstype
                ));
            }
            continue;
        }
        if matches!(holder.fstype.as_str(), "proc" | "sysfs") {
            let what = if *ro { "read-only" } else { "masked" };
            return Err(format!(
                "the {what} path {path:?} is not covered: the {} at {:?} shows it",
                holder.fstype, holder.point
            ));
        }
    }
    Ok(())
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

    /// A restored sandbox's mount tree as the kernel shows it (the escape is a space).
    const TREE: &str = "\
600 500 0:50 / / ro,relatime - overlay overlay rw,lowerdir=/l
601 600 0:51 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
602 601 0:5 /null /proc/kcore rw,nosuid - devtmpfs udev rw,mode=755
603 601 0:51 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw
604 600 0:53 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
605 604 0:54 / /sys/firmware ro,relatime - tmpfs tmpfs ro
606 600 0:55 / /workspace rw,relatime - overlay overlay rw
607 606 0:55 /.git/hooks /workspace/.git/hooks ro,relatime - overlay overlay rw
608 600 0:56 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
609 600 0:57 / /my\\040dir ro,nosuid - tmpfs tmpfs rw
";

    fn tree_expected() -> ExpectedMounts {
        ExpectedMounts {
            readonly: vec![
                ("/".to_owned(), Vec::new()),
                ("/workspace/.git/hooks".to_owned(), Vec::new()),
                ("/my dir".to_owned(), vec!["nosuid".to_owned()]),
            ],
            covered: vec![
                ("/proc/kcore".to_owned(), false),
                ("/sys/firmware".to_owned(), false),
                ("/proc/sys".to_owned(), true),
            ],
        }
    }

    /// The tree with line `n` (its mount id) dropped and `extra` lines added.
    fn tree_with(drop: &[u64], extra: &str, replace: (&str, &str)) -> Result<(), String> {
        let text: String = TREE
            .lines()
            .filter(|l| !drop.iter().any(|n| l.starts_with(&format!("{n} "))))
            .map(|l| format!("{}\n", l.replace(replace.0, replace.1)))
            .collect();
        mounts_match(
            &parse_mountinfo(&format!("{text}{extra}")),
            &tree_expected(),
        )
    }

    #[test]
    fn a_restored_tree_that_keeps_the_plans_mounts_passes() {
        assert_eq!(tree_with(&[], "", ("", "")), Ok(()));
        // Without a sysfs, /sys/firmware is not there to mask.
        assert_eq!(tree_with(&[604, 605], "", ("", "")), Ok(()));
    }

    #[test]
    fn a_writable_root_or_read_only_mount_is_refused() {
        let e = tree_with(&[], "", ("/ / ro,relatime", "/ / rw,relatime")).unwrap_err();
        assert_eq!(e, "the overlay mount at \"/\" is writable, not read-only");
        let e = tree_with(&[607], "", ("", "")).unwrap_err();
        assert!(
            e.starts_with("nothing is mounted at \"/workspace/.git/hooks\""),
            "{e}"
        );
        // A writable mount on top of the read-only one.
        let over = "610 607 0:58 / /workspace/.git/hooks rw - tmpfs tmpfs rw\n";
        let e = tree_with(&[], over, ("", "")).unwrap_err();
        assert!(
            e.contains("tmpfs mount at \"/workspace/.git/hooks\" is writable"),
            "{e}"
        );
        let e = tree_with(&[609], "", ("", "")).unwrap_err();
        assert!(e.contains("\"/my dir\""), "{e}");
    }

    #[test]
    fn a_read_only_mount_restored_writable_is_sealed_with_its_other_flags() {
        let tree = parse_mountinfo(&TREE.replace(
            "/.git/hooks /workspace/.git/hooks ro,relatime",
            "/.git/hooks /workspace/.git/hooks rw,nosuid,nodev,noexec,relatime",
        ));
        assert_eq!(
            unsealed(&tree, &tree_expected()),
            [(
                "/workspace/.git/hooks".to_owned(),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME
            )]
        );
        assert!(unsealed(&parse_mountinfo(TREE), &tree_expected()).is_empty());
        // Read-only but without a flag the plan gives it.
        let tree = parse_mountinfo(&TREE.replace("/my\\040dir ro,nosuid", "/my\\040dir ro"));
        assert_eq!(
            unsealed(&tree, &tree_expected()),
            [("/my dir".to_owned(), MsFlags::MS_NOSUID)]
        );
        assert_eq!(
            mounts_match(&tree, &tree_expected()),
            Err("the tmpfs mount at \"/my dir\" is not nosuid, as the plan mounts it".to_owned())
        );
    }

    #[test]
    fn a_dropped_or_unmasking_mask_is_refused() {
        let e = tree_with(&[602], "", ("", "")).unwrap_err();
        assert_eq!(
            e,
            "the masked path \"/proc/kcore\" is not covered: the proc at \"/proc\" shows it"
        );
        let e = tree_with(&[605], "", ("", "")).unwrap_err();
        assert!(
            e.contains("\"/sys/firmware\" is not covered: the sysfs"),
            "{e}"
        );
        let e = tree_with(
            &[],
            "",
            (
                "0:5 /null /proc/kcore rw,nosuid - devtmpfs udev",
                "0:51 /kcore /proc/kcore rw - proc proc",
            ),
        )
        .unwrap_err();
        assert!(e.contains("is a proc mount, which shows it"), "{e}");
        let e = tree_with(&[603], "", ("", "")).unwrap_err();
        assert!(
            e.contains("read-only path \"/proc/sys\" is not covered"),
            "{e}"
        );
        let e = tree_with(&[], "", ("/sys /proc/sys ro,", "/sys /proc/sys rw,")).unwrap_err();
        assert!(
            e.contains("read-only path \"/proc/sys\" is mounted writable"),
            "{e}"
        );
    }

    #[test]
    fn a_filesystem_of_the_hosts_kernel_or_an_unreadable_line_is_refused() {
        for extra in [
            "611 604 0:60 / /sys/kernel/debug rw - debugfs debugfs rw\n",
            "611 600 0:61 / /x rw - bpf bpf rw\n",
            "611 600 0:5 / /hostdev rw - devtmpfs udev rw\n",
            "611 600 garbage\n",
        ] {
            let e = tree_with(&[], extra, ("", "")).expect_err(extra);
            assert!(e.contains("which no sandbox has"), "{extra}: {e}");
        }
    }

    #[test]
    fn the_spec_names_what_the_tree_must_keep() {
        let spec: libcontainer::oci_spec::runtime::Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
                {"destination": "/etc/hosts", "type": "bind", "source": "/h", "options": ["rbind", "nosuid", "ro", "noexec", "relatime"]},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["ro"]}
            ],
            "linux": {
                "maskedPaths": ["/proc/kcore", "/proc/nothere", "/etc/secret"],
                "readonlyPaths": ["/proc/sys"]
            }
        }))
        .unwrap();
        let got = ExpectedMounts::of_spec(&spec, |p| p != "/proc/nothere");
        assert_eq!(
            got.readonly,
            [
                ("/".to_owned(), Vec::new()),
                (
                    "/etc/hosts".to_owned(),
                    vec!["nosuid".to_owned(), "noexec".to_owned()]
                )
            ]
        );
        assert_eq!(
            got.covered,
            [
                ("/proc/kcore".to_owned(), false),
                ("/proc/sys".to_owned(), true)
            ]
        );
    }

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
            std::fs::write(dir.join("mountinfo"), TREE).unwrap();
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
                mounts: tree_expected(),
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
    fn the_inits_mount_tree_is_checked() {
        let f = FakeProc::new();
        std::fs::write(
            f.path().join("100/mountinfo"),
            TREE.replace("/ / ro,relatime", "/ / rw,relatime"),
        )
        .unwrap();
        assert!(refused(&f).contains(
            "task 100 does not match the sandbox's plan: the overlay mount at \"/\" is writable"
        ));
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

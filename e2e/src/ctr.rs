//! ctr helpers: containers run through real containerd (set up by `hack/containerd.sh`) with
//! either our shim (`io.agent.sandbox`, which drives `/usr/local/bin/agent-sandbox`) or
//! containerd's own `io.containerd.runc.v2`, event capture, shim processes and leftovers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Output};

/// containerd's socket as `hack/containerd.sh` starts it.
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// Names another containerd's socket for `ctr` (one started beside the shared one, as for
/// the CRI suite's `AGENT_SANDBOX_CRI_SOCKET`).
pub const SOCKET_ENV: &str = "AGENT_SANDBOX_CTR_SOCKET";

/// The socket `ctr` talks to: [`SOCKET_ENV`] if set, else [`SOCKET`].
pub fn socket() -> String {
    std::env::var(SOCKET_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| SOCKET.to_owned())
}
/// The containerd namespace the tests use (the images are imported there).
pub const NAMESPACE: &str = "default";
/// Our runtime's state directories (the shim's default `--root`).
pub const RUNTIME_ROOT: &str = "/run/containerd/agent-sandbox";

/// Which shim runs a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shim {
    /// `io.agent.sandbox`: our shim and runtime.
    AgentSandbox,
    /// `io.containerd.runc.v2`: containerd's shim with runc, the baseline.
    RuncV2,
}

impl Shim {
    /// The value of `ctr run --runtime`: the runtime name containerd resolves on its PATH, or
    /// the shim's absolute path when `AGENT_SANDBOX_BIN_DIR` points elsewhere.
    pub fn runtime_name(self) -> String {
        match self {
            Shim::AgentSandbox if harness::default_bin_dir() => "io.agent.sandbox".to_owned(),
            Shim::AgentSandbox => harness::shim_bin().display().to_string(),
            Shim::RuncV2 => "io.containerd.runc.v2".to_owned(),
        }
    }

    /// The shim binary's name as it appears in the process list.
    pub fn binary_name(self) -> &'static str {
        match self {
            Shim::AgentSandbox => "containerd-shim-agent-sandbox",
            Shim::RuncV2 => "containerd-shim-runc-v2",
        }
    }
}

/// `ctr --address SOCKET -n NAMESPACE`.
pub fn ctr() -> Command {
    let mut cmd = Command::new("ctr");
    cmd.args(["--address", &socket(), "-n", NAMESPACE]);
    cmd
}

/// The `ctr ...` command line as one shell word list (for `script -c`).
pub fn ctr_shell(args: &[&str]) -> String {
    let mut words = vec![
        "ctr".to_owned(),
        "--address".into(),
        socket(),
        "-n".into(),
        NAMESPACE.into(),
    ];
    words.extend(args.iter().map(|a| shell_quote(a)));
    words.join(" ")
}

fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Fails (naming the fix) unless containerd answers, our shim and runtime are installed and
/// the test image is imported.
pub fn require_containerd() -> anyhow::Result<()> {
    harness::require_tool("ctr")?;
    harness::require_file(harness::shim_bin())?;
    harness::require_file(harness::runtime_bin())?;
    let version = harness::run(ctr().arg("version"), Duration::from_secs(20))?;
    if !version.success() {
        bail!(
            "containerd does not answer on {}; run hack/containerd.sh\n{version}",
            socket()
        );
    }
    let images = harness::run_ok(ctr().args(["images", "ls", "-q"]), DEFAULT_TIMEOUT)?;
    if !images.stdout.lines().any(|l| l == BUSYBOX_IMAGE) {
        bail!(
            "image {BUSYBOX_IMAGE} is not in containerd namespace {NAMESPACE}; run hack/containerd.sh\n{images}"
        );
    }
    Ok(())
}

/// A container id unique to this test process.
pub fn unique_id(stem: &str) -> String {
    harness::unique("e2e", stem)
}

/// `ctr run --rm --runtime R ARGS... IMAGE ID CMD...`, captured.
pub fn run_rm(
    shim: Shim,
    args: &[&str],
    image: &str,
    id: &str,
    cmd: &[&str],
) -> anyhow::Result<Output> {
    let _cleanup = Container::guard(id);
    let mut c = ctr();
    c.args(["run", "--rm", "--runtime", &shim.runtime_name()])
        .args(args)
        .arg(image)
        .arg(id)
        .args(cmd);
    harness::run(&mut c, DEFAULT_TIMEOUT)
}

/// Runs `shell_command` under a pseudo-terminal (`script`), as `ctr -t` needs one.
pub fn run_in_pty(shell_command: &str) -> anyhow::Result<Output> {
    harness::require_tool("script")?;
    harness::run(
        Command::new("script").args(["-qec", shell_command, "/dev/null"]),
        DEFAULT_TIMEOUT,
    )
}

/// A container created by a test; killed and removed on drop, whatever happened.
pub struct Container {
    pub id: String,
}

impl Container {
    /// Only the cleanup, for a container some other call creates.
    pub fn guard(id: &str) -> Self {
        Self { id: id.to_owned() }
    }

    /// `ctr run -d --runtime R ARGS... IMAGE ID CMD...`.
    pub fn start_detached(
        shim: Shim,
        args: &[&str],
        image: &str,
        id: &str,
        cmd: &[&str],
    ) -> anyhow::Result<Self> {
        let container = Self::guard(id);
        let mut c = ctr();
        c.args(["run", "-d", "--runtime", &shim.runtime_name()])
            .args(args)
            .arg(image)
            .arg(id)
            .args(cmd);
        harness::run_ok(&mut c, DEFAULT_TIMEOUT)?;
        Ok(container)
    }

    /// `ctr run -d ... BUSYBOX_IMAGE ID sleep 300`, once its task runs; with the task's pid.
    pub fn sleeping(shim: Shim, args: &[&str], id: &str) -> anyhow::Result<(Self, u32)> {
        let c = Self::start_detached(shim, args, BUSYBOX_IMAGE, id, &["sleep", "300"])?;
        let pid = c.wait_status("RUNNING", Duration::from_secs(30))?;
        Ok((c, pid))
    }

    /// The task's pid and status from `ctr task ls`.
    pub fn task(&self) -> anyhow::Result<Option<(u32, String)>> {
        let out = harness::run_ok(ctr().args(["task", "ls"]), DEFAULT_TIMEOUT)?;
        for line in out.stdout.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.first() == Some(&self.id.as_str()) && cols.len() >= 3 {
                let pid = cols[1]
                    .parse()
                    .with_context(|| format!("bad pid in {line:?}"))?;
                return Ok(Some((pid, cols[2].to_owned())));
            }
        }
        Ok(None)
    }

    /// Polls until the task reports `status`.
    pub fn wait_status(&self, status: &str, timeout: Duration) -> anyhow::Result<u32> {
        let start = Instant::now();
        loop {
            let task = self.task()?;
            if let Some((pid, s)) = &task
                && s == status
            {
                return Ok(*pid);
            }
            if start.elapsed() > timeout {
                bail!("task {} did not become {status}: {task:?}", self.id);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr task ARGS... ID REST...`
    pub fn task_cmd(&self, args: &[&str], rest: &[&str]) -> anyhow::Result<Output> {
        let mut c = ctr();
        c.arg("task").args(args).arg(&self.id).args(rest);
        harness::run(&mut c, DEFAULT_TIMEOUT)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let mut c = ctr();
            c.args(args).arg(&self.id);
            let _ = harness::run(&mut c, Duration::from_secs(30));
        };
        quiet(&["task", "kill", "-a", "-s", "SIGKILL"]);
        quiet(&["task", "delete", "-f"]);
        quiet(&["containers", "rm"]);
    }
}

/// The mount options of task `id`'s rootfs (containerd's `bundle/rootfs`, namespace
/// `default`) as `/proc/self/mountinfo` shows them (mount options, then the superblock's),
/// and the overlay's `workdir=`, while it is mounted.
pub fn rootfs_mount(id: &str) -> Option<(String, Option<PathBuf>)> {
    let target = format!("/run/containerd/io.containerd.runtime.v2.task/default/{id}/rootfs");
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(target.as_str()))?;
    let (head, tail) = line.split_once(" - ")?;
    let options = format!(
        "{} {}",
        head.split_whitespace().nth(5).unwrap_or(""),
        tail.split_whitespace().nth(2).unwrap_or("")
    );
    let workdir = tail
        .split_whitespace()
        .nth(2)?
        .split(',')
        .find_map(|o| o.strip_prefix("workdir="))
        .map(PathBuf::from);
    Some((options, workdir))
}

/// `ctr events`, captured to a file from now on.
pub struct Events {
    child: Child,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Events {
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let file = dir.path().join("events");
        let out = fs::File::create(&file).context("cannot create the events file")?;
        let child = ctr()
            .arg("events")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start ctr events")?;
        // ctr subscribes asynchronously; give it a moment before the test acts.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Self {
            child,
            file,
            _dir: dir,
        })
    }

    /// The `/tasks/...` topics seen for container `id`, in order, with their JSON bodies.
    pub fn task_events(&self, id: &str) -> Vec<(String, String)> {
        let text = fs::read_to_string(&self.file).unwrap_or_default();
        let needle = format!("\"container_id\":\"{id}\"");
        text.lines()
            .filter(|l| l.contains(&needle))
            .filter_map(|l| {
                let start = l.find(" /tasks/")? + 1;
                let rest = &l[start..];
                let (topic, body) = rest.split_once(' ')?;
                Some((topic.to_owned(), body.to_owned()))
            })
            .collect()
    }

    /// Waits until `topic` was seen for `id`; returns every event for `id` so far.
    pub fn wait_for(
        &self,
        id: &str,
        topic: &str,
        timeout: Duration,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let start = Instant::now();
        loop {
            let events = self.task_events(id);
            if events.iter().any(|(t, _)| t == topic) {
                return Ok(events);
            }
            if start.elapsed() > timeout {
                bail!("no {topic} event for {id} within {timeout:?}; saw {events:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of shim processes of `shim` serving container `id` (`-id ID` on their command line).
pub fn shim_pids(shim: Shim, id: &str) -> Vec<u32> {
    harness::pids_with_args(|_, args| {
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with(shim.binary_name().as_bytes()));
        is_shim
            && args
                .windows(2)
                .any(|w| w[0] == b"-id" && w[1] == id.as_bytes())
    })
}

/// Resident set size of `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no VmRSS for pid {pid}"))
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(after != 'Z' && after != 'X')
        })
        .unwrap_or(false)
}

/// Everything a container `id` could leave behind on the host; empty means clean.
pub fn leftovers(id: &str, pids: &[u32]) -> Vec<String> {
    let mut found = Vec::new();
    for pid in pids {
        if alive(*pid) {
            found.push(format!("process {pid} still running"));
        }
    }
    if let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") {
        for line in mounts.lines().filter(|l| l.contains(id)) {
            found.push(format!("mount: {line}"));
        }
    }
    for ctrl in [
        "memory", "pids", "cpu", "cpuacct", "freezer", "devices", "blkio",
    ] {
        found.extend(find_named(&Path::new("/sys/fs/cgroup").join(ctrl), id, 4));
    }
    // The sandbox's audit log outlives it on purpose (kept until pruned): not a leftover.
    found.extend(
        find_named(Path::new(RUNTIME_ROOT), id, 3)
            .into_iter()
            .filter(|p| !p.contains("/audit/")),
    );
    found.extend(find_named(
        Path::new("/run/containerd/io.containerd.runtime.v2.task"),
        id,
        2,
    ));
    found.extend(find_named(Path::new("/run/netns"), id, 1));
    found
}

fn find_named(dir: &Path, name: &str, depth: u32) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().contains(name) {
            found.push(format!("path {}", path.display()));
        } else if depth > 1 && e.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(find_named(&path, name, depth - 1));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_shell_words() {
        assert_eq!(shell_quote("io.agent.sandbox"), "io.agent.sandbox");
        assert_eq!(shell_quote("echo hi"), "'echo hi'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert!(ctr_shell(&["run", "a b"]).ends_with("run 'a b'"));
    }

    #[test]
    fn ids_are_unique() {
        assert_ne!(unique_id("x"), unique_id("x"));
    }

    #[test]
    fn finds_named_paths() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/e2e-x-1")).unwrap();
        assert_eq!(find_named(dir.path(), "e2e-x-1", 2).len(), 1);
        assert!(find_named(dir.path(), "e2e-x-1", 1).is_empty());
        assert!(alive(std::process::id()));
    }
}

//! Shared helpers for the e2e suites: running commands with a timeout, running
//! them as the rootless test user, reading probe reports, and assertions that
//! print everything needed to debug a failure.
//!
//! Nothing here skips: a missing tool, image or binary is an error that names
//! what is missing and the command that provides it (`hack/setup.sh`).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;

/// The rootless podman test user (ARCHITECTURE.md conventions).
pub const TEST_USER: &str = "agentci";
/// Its uid; its runtime directory is `/run/user/1500`.
pub const TEST_UID: u32 = 1500;
/// Test images, built by `hack/images.sh`.
pub const BUSYBOX_IMAGE: &str = "localhost/agent-sandbox/busybox:latest";
pub const TOOLS_IMAGE: &str = "localhost/agent-sandbox/tools:latest";
/// OCI archives of the test images.
pub const IMAGE_ARCHIVE_DIR: &str = "/var/cache/agent-sandbox/images";
/// Where `hack/setup.sh` installs our binaries.
pub const DEFAULT_BIN_DIR: &str = "/usr/local/bin";
/// Overrides [`DEFAULT_BIN_DIR`], so that several work trees on one machine can each test their
/// own build (`hack/install-bins.sh DIR` fills such a directory).
pub const BIN_DIR_ENV: &str = "AGENT_SANDBOX_BIN_DIR";

/// The directory holding the runtime and shim under test.
pub fn bin_dir() -> PathBuf {
    std::env::var_os(BIN_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_BIN_DIR), PathBuf::from)
}

/// True when the binaries under test are the ones containerd finds on its own PATH.
pub fn default_bin_dir() -> bool {
    bin_dir() == Path::new(DEFAULT_BIN_DIR)
}

/// The runtime under test.
pub fn runtime_bin() -> PathBuf {
    bin_dir().join("agent-sandbox")
}

/// The shim under test.
pub fn shim_bin() -> PathBuf {
    bin_dir().join("containerd-shim-agent-sandbox")
}
/// The probe's path inside every test image.
pub const PROBE: &str = "/usr/local/bin/probe";
/// A timeout long enough for a cold `podman run` on a busy two-core machine.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Who runs a command: host root, or the rootless test user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    Root,
    Rootless,
}

impl User {
    /// A command for `program` run as this user. The rootless user gets the
    /// environment a login would give it (no logind here).
    pub fn command(self, program: &str) -> Command {
        match self {
            User::Root => Command::new(program),
            User::Rootless => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", TEST_USER, "--", "env"])
                    .arg(format!("XDG_RUNTIME_DIR=/run/user/{TEST_UID}"))
                    .arg(format!("HOME=/home/{TEST_USER}"))
                    .arg(format!("USER={TEST_USER}"))
                    .arg(program);
                // The test user may not be able to enter the caller's directory
                // (a checkout under /root).
                cmd.current_dir("/");
                cmd
            }
        }
    }

    /// `podman` as this user.
    pub fn podman(self) -> Command {
        self.command("podman")
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            User::Root => write!(f, "root"),
            User::Rootless => write!(f, "rootless ({TEST_USER})"),
        }
    }
}

/// What a finished command produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// The command line, for messages.
    pub command: String,
    /// Exit code; `None` if a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.command)?;
        match (self.code, self.signal) {
            (Some(code), _) => writeln!(f, "exit code: {code}")?,
            (None, Some(sig)) => writeln!(f, "killed by signal {sig}")?,
            (None, None) => writeln!(f, "no exit status")?,
        }
        writeln!(f, "elapsed: {:.2?}", self.elapsed)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout.trim_end())?;
        write!(f, "--- stderr ---\n{}", self.stderr.trim_end())
    }
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error ends the capture; what was read so far is kept.
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Runs `cmd` to completion, capturing stdout and stderr. It runs in its own
/// process group; on timeout the whole group is killed and this is an error that
/// includes what the command printed so far.
pub fn run(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Output> {
    let command = describe(cmd);
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {command}"))?;
    let stdout = drain(child.stdout.take().context("stdout pipe missing")?);
    let stderr = drain(child.stderr.take().context("stderr pipe missing")?);
    // std has no wait-with-timeout; polling every 10 ms costs nothing next to a
    // container start and keeps this free of extra threads per command.
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("cannot wait for {command}"))?
        {
            break Some(status);
        }
        if start.elapsed() > timeout {
            let pgid = i32::try_from(child.id()).context("pid out of range")?;
            // The group may already be gone; the wait below reaps the leader.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let output = Output {
        command,
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        elapsed: start.elapsed(),
    };
    if status.is_none() {
        bail!("timed out after {timeout:?}\n{output}");
    }
    Ok(output)
}

/// Runs `cmd` and fails with the full output unless it exits 0.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Output> {
    let output = run(cmd, timeout)?;
    if !output.success() {
        bail!("command failed\n{output}");
    }
    Ok(output)
}

/// The path of `tool` on PATH, or an error saying how to install it.
pub fn require_tool(tool: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
        .with_context(|| format!("required tool {tool} is not on PATH; run hack/setup.sh"))
}

/// An error unless `path` exists.
pub fn require_file(path: impl AsRef<Path>) -> anyhow::Result<()> {
    let path = path.as_ref();
    if path.exists() {
        Ok(())
    } else {
        bail!(
            "required file {} is missing; run hack/setup.sh",
            path.display()
        )
    }
}

/// An error unless `user`'s podman store has `image`.
pub fn require_podman_image(user: User, image: &str) -> anyhow::Result<()> {
    require_tool("podman")?;
    let out = run(
        user.podman().args(["image", "exists", image]),
        DEFAULT_TIMEOUT,
    )?;
    if out.success() {
        Ok(())
    } else {
        bail!(
            "podman image {image} is missing for {user}; run hack/setup.sh (hack/images.sh)\n{out}"
        )
    }
}

/// What one probe check observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Outcome {
    #[serde(rename = "blocked")]
    Blocked,
    #[serde(rename = "allowed")]
    Allowed,
    #[serde(rename = "n/a")]
    NotApplicable,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Blocked => "blocked",
            Outcome::Allowed => "allowed",
            Outcome::NotApplicable => "n/a",
        })
    }
}

/// One line of probe output.
#[derive(Debug, Clone, Deserialize)]
pub struct CheckResult {
    pub check: String,
    pub outcome: Outcome,
    pub detail: String,
}

/// The parsed output of one probe run, with the run it came from.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    pub checks: BTreeMap<String, CheckResult>,
    pub output: Output,
}

impl ProbeReport {
    /// Parses every line of `output.stdout` that is a probe JSON object. Lines
    /// that are not JSON objects (a runtime's warnings) are ignored; a JSON object
    /// that is not a probe result, a repeated check, or no result at all is an error.
    pub fn parse(output: Output) -> anyhow::Result<Self> {
        let mut checks = BTreeMap::new();
        for line in output
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('{'))
        {
            let result: CheckResult = serde_json::from_str(line)
                .with_context(|| format!("bad probe line {line:?}\n{output}"))?;
            if checks.insert(result.check.clone(), result).is_some() {
                bail!("probe reported a check twice in line {line:?}\n{output}");
            }
        }
        if checks.is_empty() {
            bail!("no probe results in the output\n{output}");
        }
        Ok(Self { checks, output })
    }

    /// The outcome of `check`, or an error if the probe did not report it.
    pub fn outcome(&self, check: &str) -> anyhow::Result<Outcome> {
        self.checks
            .get(check)
            .map(|c| c.outcome)
            .with_context(|| format!("probe did not report {check}\n{self}"))
    }

    /// Fails, printing the whole report, unless every listed check has the
    /// expected outcome. All mismatches are listed at once.
    pub fn expect(&self, expected: &[(&str, Outcome)]) -> anyhow::Result<()> {
        let mut wrong = Vec::new();
        for &(check, want) in expected {
            match self.checks.get(check) {
                Some(got) if got.outcome == want => {}
                Some(got) => wrong.push(format!(
                    "{check}: expected {want}, got {} ({})",
                    got.outcome, got.detail
                )),
                None => wrong.push(format!("{check}: expected {want}, not reported")),
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            bail!(
                "{} probe check(s) differ from what was expected:\n  {}\n{self}",
                wrong.len(),
                wrong.join("\n  ")
            )
        }
    }

    /// Every listed check must be allowed.
    pub fn expect_allowed(&self, checks: &[&str]) -> anyhow::Result<()> {
        self.expect(
            &checks
                .iter()
                .map(|c| (*c, Outcome::Allowed))
                .collect::<Vec<_>>(),
        )
    }

    /// Every listed check must be blocked.
    pub fn expect_blocked(&self, checks: &[&str]) -> anyhow::Result<()> {
        self.expect(
            &checks
                .iter()
                .map(|c| (*c, Outcome::Blocked))
                .collect::<Vec<_>>(),
        )
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "=== probe report ===")?;
        for c in self.checks.values() {
            writeln!(
                f,
                "  {:<20} {:<8} {}",
                c.check,
                c.outcome.to_string(),
                c.detail
            )?;
        }
        write!(f, "=== from ===\n{}", self.output)
    }
}

/// Runs `cmd` (which must end in a probe invocation), requires exit 0 and
/// parses its report.
pub fn probe(cmd: &mut Command) -> anyhow::Result<ProbeReport> {
    ProbeReport::parse(run_ok(cmd, DEFAULT_TIMEOUT)?)
}

/// A temporary directory the rootless test user can use too (world-traversable
/// parent, owned by the given user). Removed on drop.
pub fn temp_dir_for(user: User) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("agent-sandbox-e2e-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    if user == User::Rootless {
        let uid = nix::unistd::Uid::from_raw(TEST_UID);
        nix::unistd::chown(dir.path(), Some(uid), None)
            .with_context(|| format!("cannot chown {} to {TEST_USER}", dir.path().display()))?;
    }
    Ok(dir)
}

/// A name or id unique to this test process: `PREFIX-STEM-PID-N`. The prefix tells whose
/// it is (a suite, or the tool it names) when one is left behind.
pub fn unique(prefix: &str, stem: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{stem}-{}-{n}", std::process::id())
}

/// `agent-sandbox ARGS...` on the host as root, with no `--root` unless `args` give one;
/// any exit code.
pub fn runtime(args: &[&str]) -> anyhow::Result<Output> {
    require_file(runtime_bin())?;
    run(Command::new(runtime_bin()).args(args), DEFAULT_TIMEOUT)
}

/// [`runtime`], requiring exit 0.
pub fn runtime_ok(args: &[&str]) -> anyhow::Result<Output> {
    let out = runtime(args)?;
    if !out.success() {
        bail!("agent-sandbox {args:?} failed\n{out}");
    }
    Ok(out)
}

/// The directory of `pid`'s cgroup in the v1 `pids` controller.
pub fn pids_cgroup(pid: u32) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("cannot read /proc/{pid}/cgroup"))?;
    let rel = text
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == "pids")
                .then(|| path.to_owned())
        })
        .with_context(|| format!("no pids cgroup for {pid}: {text}"))?;
    Ok(Path::new("/sys/fs/cgroup/pids").join(rel.trim_start_matches('/')))
}

/// Pids of the host's processes whose arguments (`/proc/PID/cmdline` split at NUL) satisfy
/// `matches`. A process that ends while it is read is left out.
pub fn pids_with_args(matches: impl Fn(u32, &[&[u8]]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            matches(*pid, &args)
        })
        .collect()
}

/// Writes `bundle/config.json` from `runc spec`, running `args` without a terminal, with
/// `edit` applied; returns its path. The bundle's rootfs is the caller's.
pub fn runc_spec(
    bundle: &Path,
    args: &[&str],
    edit: impl FnOnce(&mut serde_json::Value),
) -> anyhow::Result<PathBuf> {
    require_tool("runc")?;
    run_ok(
        Command::new("runc").arg("spec").current_dir(bundle),
        DEFAULT_TIMEOUT,
    )?;
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut config: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("runc spec wrote a bad {}", path.display()))?;
    config["process"]["terminal"] = false.into();
    config["process"]["args"] = serde_json::json!(args);
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Every entry below `root` (not following links): file content, link target, `dir` or
/// `special`, with mode and owner; compare two to see what changed on the host.
pub fn tree_snapshot(root: &Path) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))? {
            let p = e?.path();
            let m = std::fs::symlink_metadata(&p)?;
            let what = if m.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p)?.display())
            } else if m.is_dir() {
                stack.push(p.clone());
                "dir".to_owned()
            } else if m.is_file() {
                format!("{:?}", std::fs::read(&p)?)
            } else {
                "special".to_owned()
            };
            let rel = p.strip_prefix(root)?.to_path_buf();
            out.insert(
                rel,
                format!("{what} {:o} {}:{}", m.mode(), m.uid(), m.gid()),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(stdout: &str) -> Output {
        Output {
            command: "probe".into(),
            code: Some(0),
            signal: None,
            stdout: stdout.into(),
            stderr: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn parses_probe_lines_and_ignores_noise() {
        let report = ProbeReport::parse(output(
            "warning: something\n{\"check\":\"cap_eff\",\"outcome\":\"allowed\",\"detail\":\"CapEff 1\"}\n\
             {\"check\":\"net_connect\",\"outcome\":\"n/a\",\"detail\":\"unset\"}\n",
        ))
        .unwrap();
        assert_eq!(report.outcome("cap_eff").unwrap(), Outcome::Allowed);
        assert_eq!(
            report.outcome("net_connect").unwrap(),
            Outcome::NotApplicable
        );
        assert!(report.outcome("mount").is_err());
    }

    #[test]
    fn rejects_empty_and_duplicate_reports() {
        assert!(ProbeReport::parse(output("nothing here\n")).is_err());
        let line = "{\"check\":\"x\",\"outcome\":\"blocked\",\"detail\":\"\"}\n";
        assert!(ProbeReport::parse(output(&format!("{line}{line}"))).is_err());
    }

    #[test]
    fn expect_lists_every_mismatch() {
        let report = ProbeReport::parse(output(
            "{\"check\":\"a\",\"outcome\":\"allowed\",\"detail\":\"\"}\n{\"check\":\"b\",\"outcome\":\"blocked\",\"detail\":\"\"}\n",
        ))
        .unwrap();
        report.expect_allowed(&["a"]).unwrap();
        let err = report
            .expect_blocked(&["a", "b", "c"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("a: expected blocked, got allowed"), "{err}");
        assert!(err.contains("c: expected blocked, not reported"), "{err}");
        assert!(!err.contains("b: expected"), "{err}");
    }

    #[test]
    fn run_times_out_and_kills_the_group() {
        let err = run(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
    }

    #[test]
    fn run_captures_output_and_exit_code() {
        let out = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            DEFAULT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert!(run_ok(&mut Command::new("false"), DEFAULT_TIMEOUT).is_err());
    }
}

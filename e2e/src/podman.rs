//! podman helpers: run the same command under agent-sandbox or runc, as root or
//! as the rootless test user, and read the probe's report.
//!
//! Rootless on this machine's cgroup v1 hierarchy: agent-sandbox enforces its
//! cgroup limits and fails closed when it cannot, so the rootless user needs a
//! delegated v1 cgroup. [`Podman::command`] creates `/sys/fs/cgroup/<ctrl>/agentci`
//! (owned by the test user), moves a root shell into it and then drops to the
//! test user to run podman; conmon and the runtime inherit that cgroup. runc runs
//! the same way, so the two runtimes see the same environment.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::harness::{
    self, DEFAULT_TIMEOUT, Output, PROBE, ProbeReport, TEST_UID, TEST_USER, User,
};

/// The OCI runtime podman is told to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `/usr/local/bin/agent-sandbox`
    AgentSandbox,
    /// Debian's runc, the baseline.
    Runc,
}

impl Runtime {
    /// The value of podman's `--runtime`.
    pub fn path(self) -> String {
        match self {
            Runtime::AgentSandbox => harness::runtime_bin().display().to_string(),
            Runtime::Runc => "runc".to_owned(),
        }
    }
}

/// A podman invocation for one user and runtime.
#[derive(Debug, Clone, Copy)]
pub struct Podman {
    pub user: User,
    pub runtime: Runtime,
}

/// v1 controllers mounted under /sys/fs/cgroup (not the `unified` or `name=` trees).
fn v1_controllers() -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/fs/cgroup").context("cannot list /sys/fs/cgroup")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "unified" || name == "systemd" {
            continue;
        }
        if entry.path().join("cgroup.procs").exists() {
            out.push(name);
        }
    }
    Ok(out)
}

/// Creates the test user's delegated cgroup in every v1 controller.
pub fn delegate_cgroups() -> anyhow::Result<Vec<String>> {
    let ctrls = v1_controllers()?;
    for c in &ctrls {
        let base = Path::new("/sys/fs/cgroup").join(c);
        let dir = base.join(TEST_USER);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        if base.join("cpuset.cpus").exists() {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = std::fs::read_to_string(base.join(f))?;
                std::fs::write(dir.join(f), v.trim())
                    .with_context(|| format!("cannot write {}/{f}", dir.display()))?;
            }
        }
        let uid = nix::unistd::Uid::from_raw(TEST_UID);
        let gid = nix::unistd::Gid::from_raw(TEST_UID);
        for entry in std::fs::read_dir(&dir)? {
            nix::unistd::chown(&entry?.path(), Some(uid), Some(gid))?;
        }
        nix::unistd::chown(&dir, Some(uid), Some(gid))?;
    }
    Ok(ctrls)
}

impl Podman {
    pub fn new(user: User, runtime: Runtime) -> Self {
        Self { user, runtime }
    }

    /// `podman --runtime R ARGS...` as the user (rootless: inside the delegated cgroup).
    pub fn command(&self, args: &[&str]) -> anyhow::Result<Command> {
        let mut podman_args: Vec<String> = vec!["--runtime".into(), self.runtime.path()];
        podman_args.extend(args.iter().map(|s| (*s).to_owned()));
        match self.user {
            User::Root => {
                let mut cmd = Command::new("podman");
                cmd.args(&podman_args);
                Ok(cmd)
            }
            User::Rootless => {
                let ctrls = delegate_cgroups()?;
                let moves: Vec<String> = ctrls
                    .iter()
                    .map(|c| format!("echo $$ > /sys/fs/cgroup/{c}/{TEST_USER}/cgroup.procs"))
                    .collect();
                let script = format!("{} && exec \"$@\"", moves.join(" && "));
                let inner = User::Rootless.podman();
                let mut cmd = Command::new("sh");
                cmd.arg("-c").arg(script).arg("sh");
                cmd.arg(inner.get_program());
                cmd.args(inner.get_args());
                cmd.args(&podman_args);
                cmd.current_dir("/");
                Ok(cmd)
            }
        }
    }

    /// Runs podman with `args` and returns what it printed (any exit code).
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        harness::run(&mut self.command(args)?, DEFAULT_TIMEOUT)
    }

    /// Runs podman with `args`, requiring exit 0.
    pub fn run_ok(&self, args: &[&str]) -> anyhow::Result<Output> {
        harness::run_ok(&mut self.command(args)?, DEFAULT_TIMEOUT)
    }

    /// `podman run --rm ARGS... IMAGE probe CHECKS...`.
    pub fn probe(
        &self,
        args: &[&str],
        image: &str,
        checks: &[&str],
    ) -> anyhow::Result<ProbeReport> {
        harness::require_podman_image(self.user, image)?;
        if self.runtime == Runtime::AgentSandbox {
            harness::require_file(harness::runtime_bin())?;
        }
        let mut all: Vec<&str> = vec!["run", "--rm"];
        all.extend_from_slice(args);
        all.push(image);
        all.push(PROBE);
        all.extend_from_slice(checks);
        harness::probe(&mut self.command(&all)?)
            .with_context(|| format!("probe under {:?} as {}", self.runtime, self.user))
    }
}

/// A container name unique to this test process.
pub fn unique_name(stem: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("as-{stem}-{}-{n}", std::process::id())
}

/// Removes a named container on drop (best effort), so a failed test leaves nothing.
pub struct ContainerGuard {
    pub podman: Podman,
    pub name: String,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = self.podman.run(&["rm", "-f", "-t", "0", &self.name]);
    }
}

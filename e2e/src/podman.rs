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

use anyhow::{Context, ensure};

use crate::harness::{
    self, DEFAULT_TIMEOUT, Output, PROBE, ProbeReport, TEST_UID, TEST_USER, TOOLS_IMAGE, User,
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

    /// `podman run --rm --network host ARGS... tools sh -c SCRIPT` (any exit code): a
    /// container on the host's network, the network suites' baseline.
    pub fn host_net_sh(&self, args: &[&str], script: &str) -> anyhow::Result<Output> {
        let mut all = vec!["run", "--rm", "--network", "host"];
        all.extend_from_slice(args);
        all.extend([TOOLS_IMAGE, "sh", "-c", script]);
        self.run(&all)
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
    harness::unique("as", stem)
}

/// The value of `--runtime-flag` that gives agent-sandbox the policy file `policy`.
pub fn policy_flag(policy: &Path) -> String {
    format!("policy={}", policy.display())
}

/// The full container id `podman run -d` printed (its last line, 64 characters).
pub fn container_id(out: &Output) -> anyhow::Result<String> {
    let id = out
        .stdout
        .lines()
        .last()
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    ensure!(id.len() == 64, "no container id from podman run -d\n{out}");
    Ok(id)
}

impl Podman {
    /// `podman FLAGS... run -d --name NAME ARGS...`, NAME made from `stem` by
    /// [`unique_name`]; returns the guard that removes the container (taken before the run,
    /// so a half-made container goes too) and its full id.
    pub fn run_detached(
        &self,
        flags: &[&str],
        stem: &str,
        args: &[&str],
    ) -> anyhow::Result<(ContainerGuard, String)> {
        let guard = ContainerGuard::new(*self, &unique_name(stem));
        let mut all = flags.to_vec();
        all.extend(["run", "-d", "--name", &guard.name]);
        all.extend_from_slice(args);
        let id = container_id(&self.run_ok(&all)?)?;
        Ok((guard, id))
    }
}

/// Removes a named container on drop (best effort), so a failed test leaves nothing.
pub struct ContainerGuard {
    pub podman: Podman,
    pub name: String,
}

impl ContainerGuard {
    /// Guards the container `name` of `podman`'s user.
    pub fn new(podman: Podman, name: &str) -> Self {
        Self {
            podman,
            name: name.to_owned(),
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = self.podman.run(&["rm", "-f", "-t", "0", &self.name]);
    }
}

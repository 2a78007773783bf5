//! Docker helpers: run the same command through the dockerd of `hack/docker.sh` under
//! agent-sandbox (`docker run --runtime agent-sandbox`) or runc, and find a container's
//! sandbox state (audit log) the way a user would.
//!
//! `hack/docker.sh [BIN_DIR [NAME]]` registers the runtime NAME (and NAME-e2e, the same binary
//! with the tests' ceiling policy) in its dockerd's daemon.json; dockerd reads runtimes only at
//! start and on SIGHUP, so a test cannot point it at another binary per run. The suite takes
//! the name from [`RUNTIME_ENV`] (default `agent-sandbox`) and checks that dockerd's entry runs
//! the binary under test ([`harness::runtime_bin`]), so a second work tree's run cannot
//! silently test the installed build.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

use crate::harness::{self, DEFAULT_TIMEOUT, Output, PROBE, ProbeReport};

/// The dockerd `hack/docker.sh` starts.
pub const DEFAULT_HOST: &str = "unix:///run/agent-sandbox-docker.sock";
/// Overrides [`DEFAULT_HOST`].
pub const HOST_ENV: &str = "AGENT_SANDBOX_DOCKER_HOST";
/// The runtime name `hack/docker.sh` registers by default.
pub const DEFAULT_RUNTIME: &str = "agent-sandbox";
/// Overrides [`DEFAULT_RUNTIME`] (a second work tree's `hack/docker.sh DIR NAME`).
pub const RUNTIME_ENV: &str = "AGENT_SANDBOX_DOCKER_RUNTIME";
/// dockerd's `--exec-root` and containerd namespace in `hack/docker.sh`: custom runtimes get
/// `--root EXEC_ROOT/runtime-runc/NAMESPACE`.
pub const EXEC_ROOT: &str = "/run/agent-sandbox-docker";
pub const NAMESPACE: &str = "agent-sandbox-docker";

/// The runtime dockerd is told to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// The runtime under test with its default (agent profile) ceiling.
    AgentSandbox,
    /// The same binary with the tests' ceiling (`/etc/agent-sandbox/docker-e2e.toml`: the
    /// agent profile allowing only the tests' local registry).
    AgentSandboxE2e,
    /// Debian's runc, the baseline.
    Runc,
}

impl Runtime {
    /// The value of `docker run --runtime`.
    pub fn name(self) -> String {
        let base = std::env::var(RUNTIME_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| DEFAULT_RUNTIME.to_owned());
        match self {
            Runtime::AgentSandbox => base,
            Runtime::AgentSandboxE2e => format!("{base}-e2e"),
            Runtime::Runc => "runc".to_owned(),
        }
    }
}

/// The dockerd address the suite talks to.
pub fn host() -> String {
    std::env::var(HOST_ENV)
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_owned())
}

/// The state root dockerd gives its custom runtimes (`--root`): where a Docker container's
/// sandbox state and audit log are.
pub fn sandbox_root() -> PathBuf {
    PathBuf::from(EXEC_ROOT)
        .join("runtime-runc")
        .join(NAMESPACE)
}

/// `docker -H HOST ARGS...`, for any subcommand.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new("docker");
    cmd.arg("-H").arg(host()).args(args);
    cmd
}

/// Runs `docker ARGS...` and returns what it printed (any exit code).
pub fn docker(args: &[&str]) -> anyhow::Result<Output> {
    harness::run(&mut command(args), DEFAULT_TIMEOUT)
}

/// Runs `docker ARGS...`, requiring exit 0.
pub fn docker_ok(args: &[&str]) -> anyhow::Result<Output> {
    harness::run_ok(&mut command(args), DEFAULT_TIMEOUT)
}

/// An error unless the dockerd answers, has `image`, and runs the binary under test as the
/// agent-sandbox runtimes.
pub fn require_ready(image: &str) -> anyhow::Result<()> {
    harness::require_tool("docker")?;
    let info = docker(&["info", "--format", "{{json .Runtimes}}"])?;
    if !info.success() {
        bail!(
            "dockerd at {} does not answer; run hack/setup.sh (hack/docker.sh)\n{info}",
            host()
        );
    }
    let runtimes: serde_json::Value = serde_json::from_str(info.stdout.trim())
        .with_context(|| format!("cannot parse dockerd's runtimes\n{info}"))?;
    let want = harness::runtime_bin();
    for rt in [Runtime::AgentSandbox, Runtime::AgentSandboxE2e] {
        let name = rt.name();
        let path = runtimes[&name]["path"].as_str().map(PathBuf::from);
        if path.as_deref() != Some(want.as_path()) {
            let runs = path.map_or_else(
                || "is not registered".to_owned(),
                |p| format!("runs {}", p.display()),
            );
            bail!(
                "dockerd's runtime {name} {runs}, not the binary under test {}; run \
                 `hack/docker.sh {} NAME` and set {RUNTIME_ENV}=NAME\n{info}",
                want.display(),
                harness::bin_dir().display()
            );
        }
    }
    let out = docker(&["image", "inspect", "--format", "{{.Id}}", image])?;
    if !out.success() {
        bail!("docker image {image} is missing; run hack/setup.sh (hack/docker.sh)\n{out}");
    }
    Ok(())
}

/// `docker run` (or `create`) under one runtime.
#[derive(Debug, Clone, Copy)]
pub struct Docker {
    pub runtime: Runtime,
}

impl Docker {
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }

    /// `docker SUB --runtime NAME ARGS...` for SUB `run` or `create`.
    fn with_runtime(&self, sub: &str, args: &[&str]) -> Command {
        let name = self.runtime.name();
        let mut all = vec![sub, "--runtime", name.as_str()];
        all.extend_from_slice(args);
        command(&all)
    }

    /// `docker run --runtime NAME ARGS...` (any exit code).
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        harness::run(&mut self.with_runtime("run", args), DEFAULT_TIMEOUT)
    }

    /// `docker run --runtime NAME ARGS...`, requiring exit 0.
    pub fn run_ok(&self, args: &[&str]) -> anyhow::Result<Output> {
        harness::run_ok(&mut self.with_runtime("run", args), DEFAULT_TIMEOUT)
    }

    /// `docker run --rm --runtime NAME ARGS... IMAGE probe CHECKS...`.
    pub fn probe(
        &self,
        args: &[&str],
        image: &str,
        checks: &[&str],
    ) -> anyhow::Result<ProbeReport> {
        require_ready(image)?;
        let mut all: Vec<&str> = vec!["--rm"];
        all.extend_from_slice(args);
        all.push(image);
        all.push(PROBE);
        all.extend_from_slice(checks);
        harness::probe(&mut self.with_runtime("run", &all))
            .with_context(|| format!("probe under docker --runtime {}", self.runtime.name()))
    }
}

/// A container name unique to this test process.
pub fn unique_name(stem: &str) -> String {
    crate::harness::unique("dk", stem)
}

/// The full id of a container (the id dockerd gives the runtime).
pub fn full_id(name: &str) -> anyhow::Result<String> {
    Ok(docker_ok(&["inspect", "--format", "{{.Id}}", name])?
        .stdout
        .trim()
        .to_owned())
}

/// Removes a named container on drop (best effort), so a failed test leaves nothing.
pub struct ContainerGuard {
    pub name: String,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
    }
}

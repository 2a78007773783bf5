//! The runc contracts the shim path must keep where the hardening forbids nothing (issue 21,
//! items 8-11), each shown through the real client — ctr, the CRI API, or the runtime CLI —
//! with containerd's runc shim (or runc itself) as the reference in the same test, so that
//! the test fails if ours behaves otherwise:
//! - exec keeps the container's supplementary groups;
//! - a StopContainer right after StartContainer is not lost;
//! - a kill of a process that just exited is NotFound, as containerd expects;
//! - a runtime failure is never NotFound (only a missing container or exec is);
//! - `state.json` is never read half-written.
//!
//! Set-up: hack/setup.sh. The CRI tests use the handlers of the installed build (see
//! `agent_sandbox_e2e::cri`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::cri::{
    self, Cri, PAUSE_IMAGE, Pod, RUNC_HANDLER, container_config, pod_config,
};
use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, TOOLS_IMAGE};
use anyhow::{Context, bail, ensure};
use k8s_cri::v1::{ContainerState, LinuxContainerSecurityContext};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A container id for these tests: `sc-WHAT-PID-N`.
fn sc_id(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "sc-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

const SHIMS: [Shim; 2] = [Shim::RuncV2, Shim::AgentSandbox];

fn cri() -> anyhow::Result<Cri> {
    let cri = Cri::connect()?;
    cri.require_image(PAUSE_IMAGE)?;
    cri.require_image(TOOLS_IMAGE)?;
    Ok(cri)
}

/// `[("runc", "runc"), ("agent-sandbox", <our handler>)]`: the reference first.
fn handlers() -> anyhow::Result<[(&'static str, String); 2]> {
    Ok([
        ("runc", RUNC_HANDLER.to_owned()),
        ("agent-sandbox", cri::sandbox_handler()?),
    ])
}

/// A root filesystem of busybox-static applets in `dir/rootfs`, every directory 0755.
fn busybox_rootfs(dir: &Path) -> anyhow::Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox")).context("busybox-static is needed")?;
    for applet in ["sh", "sleep", "id", "grep", "cat", "true"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    for d in ["proc", "dev", "sys", "tmp", "etc", "run"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    for p in [dir, &rootfs, &rootfs.join("bin")] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    Ok(rootfs)
}

/// The supplementary groups on the `Groups:` line of a `/proc/PID/status` text, sorted.
fn groups_of(status: &str) -> Vec<u32> {
    let mut groups: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    groups.sort_unstable();
    groups
}

/// The exec's script for the groups check, given the init's host pid: the init's groups (as
/// the container sees them: ids inside its user namespace), the exec's own, its `id -G`.
fn groups_script(init_host_pid: u32) -> anyhow::Result<String> {
    let status = fs::read_to_string(format!("/proc/{init_host_pid}/status"))
        .with_context(|| format!("cannot read /proc/{init_host_pid}/status"))?;
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|p| p.split_whitespace().next_back())
        .with_context(|| format!("no NSpid for {init_host_pid}"))?;
    Ok(format!(
        "grep '^Groups:' /proc/{ns_pid}/status; grep '^Groups:' /proc/self/status; id -G"
    ))
}

/// Checks what [`groups_script`] printed: the init holds `want` (None: at least 1234 and
/// 5678), and the exec the same list.
fn check_groups(label: &str, out: &str, want: Option<&[u32]>) -> anyhow::Result<()> {
    let lines: Vec<&str> = out.lines().collect();
    ensure!(lines.len() == 3, "{label}: unexpected output {out:?}");
    let (init, exec) = (groups_of(lines[0]), groups_of(lines[1]));
    match want {
        Some(want) => ensure!(
            init == want,
            "{label}: the init's groups are {init:?}, want {want:?}"
        ),
        None => ensure!(
            [1234, 5678].iter().all(|g| init.contains(g)),
            "{label}: the init lacks the supplemental groups: {init:?}"
        ),
    }
    ensure!(
        exec == init,
        "{label}: the exec's groups are {exec:?} (id -G: {}), the init's {init:?}",
        lines[2]
    );
    Ok(())
}

/// Item 8 through ctr: a spec with `additionalGids` (given whole with `ctr run --config`),
/// then `ctr task exec`: the exec holds the init's groups under runc-v2 and under ours.
#[test]
fn ctr_exec_keeps_the_inits_supplementary_groups_like_runc() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let dir = tempfile::tempdir()?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    let rootfs = busybox_rootfs(dir.path())?;
    let spec_out = harness::run_ok(ctr::ctr().args(["oci", "spec"]), DEFAULT_TIMEOUT)?;
    let mut spec: serde_json::Value =
        serde_json::from_str(&spec_out.stdout).context("ctr oci spec printed no JSON")?;
    spec["root"] = serde_json::json!({"path": rootfs, "readonly": true});
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["sleep", "300"]);
    spec["process"]["env"] = serde_json::json!(["PATH=/bin"]);
    spec["process"]["user"]["additionalGids"] = serde_json::json!([1234, 5678]);
    for shim in SHIMS {
        let id = sc_id("groups");
        // A cgroup of its own, as `ctr run IMAGE ID` gives (the template names only /default).
        spec["linux"]["cgroupsPath"] = format!("/default/{id}").into();
        let spec_file = dir.path().join(format!("{id}.json"));
        fs::write(&spec_file, serde_json::to_vec_pretty(&spec)?)?;
        let container = Container::guard(&id);
        harness::run_ok(
            ctr::ctr()
                .args(["run", "-d", "--runtime", &shim.runtime_name(), "--config"])
                .arg(&spec_file)
                .arg(&id),
            DEFAULT_TIMEOUT,
        )?;
        let pid = container.wait_status("RUNNING", Duration::from_secs(30))?;
        let script = groups_script(pid)?;
        // containerd 1.6 can lose a fast exec's output (FIELD-NOTES): one more try.
        let mut out = None;
        for attempt in 0..2 {
            let exec = container.task_cmd(
                &["exec", "--exec-id", &format!("groups{attempt}")],
                &["sh", "-c", &script],
            )?;
            ensure!(exec.success(), "{shim:?}: exec failed\n{exec}");
            if !exec.stdout.trim().is_empty() {
                out = Some(exec.stdout);
                break;
            }
        }
        let out = out.with_context(|| format!("{shim:?}: the exec printed nothing twice"))?;
        check_groups(&format!("{shim:?}"), &out, Some(&[1234, 5678]))?;
    }
    Ok(())
}

/// Item 8 through the CRI: `supplementalGroups` in the container's security context, then
/// ExecSync, under the runc handler and ours.
#[test]
fn cri_exec_sync_keeps_the_inits_supplementary_groups_like_runc() -> anyhow::Result<()> {
    let cri = cri()?;
    for (name, handler) in handlers()? {
        let pod = Pod::run(&cri, pod_config("sc-groups", &[]), &handler)?;
        let mut config = container_config("app", TOOLS_IMAGE, &["sleep", "3600"], &[]);
        if let Some(linux) = config.linux.as_mut() {
            linux.security_context = Some(LinuxContainerSecurityContext {
                supplemental_groups: vec![1234, 5678],
                ..Default::default()
            });
        }
        let id = pod.start(&config)?;
        let script = groups_script(cri.container_pid(&id)?)?;
        let exec = cri.exec_sync(&id, &["sh", "-c", &script], 30)?;
        ensure!(exec.exit_code == 0, "{name}: exec failed\n{exec}");
        // The CRI adds the user's primary group (and those the image's /etc/group gives it):
        // the init's list must hold the requested ones, and the exec's must equal it.
        check_groups(name, &exec.stdout, None)?;
        pod.remove()?;
    }
    Ok(())
}

/// Item 9: StopContainer (SIGTERM, 5 s grace) at once after StartContainer, 20 times per
/// handler, on a program that exits 0 on SIGTERM. A lost TERM shows as exit 137 after the
/// grace period (the SIGKILL); exit 143 is a TERM that came before the trap, delivered. Under
/// ours none may be lost; runc's count is reported. (Before
/// `start` waited for the program, 1 in 12 here and 4 in 12 in the issue were lost; runc 0.)
#[test]
fn cri_stop_right_after_start_delivers_sigterm_like_runc() -> anyhow::Result<()> {
    const TRIES: usize = 20;
    const GRACE_S: i64 = 5;
    let cri = cri()?;
    let mut report = Vec::new();
    let mut ours_lost = 0;
    for (name, handler) in handlers()? {
        let pod = Pod::run(&cri, pod_config("sc-stop", &[]), &handler)?;
        let mut lost = Vec::new();
        for i in 0..TRIES {
            let config = container_config(
                &format!("term{i}"),
                TOOLS_IMAGE,
                &[
                    "sh",
                    "-c",
                    "trap 'exit 0' TERM; while :; do sleep 0.1; done",
                ],
                &[],
            );
            let id = pod.create(&config)?;
            cri.start_container(&id)?;
            let started = Instant::now();
            cri.stop_container(&id, GRACE_S)?;
            let took = started.elapsed();
            let status = cri.container_status(&id)?;
            ensure!(
                status.state == ContainerState::ContainerExited as i32,
                "{name}: container {id} not exited after StopContainer: {status:?}"
            );
            // 143: the TERM came before the shell set its trap (delivered, by the default
            // action), as it does under runc on a loaded machine; only the SIGKILL after the
            // grace period (137) or any other code shows a TERM that never arrived.
            if status.exit_code != 0 && status.exit_code != 143 {
                lost.push(format!(
                    "try {i}: exit {} after {took:.2?}",
                    status.exit_code
                ));
            }
            cri.remove_container(&id)?;
        }
        report.push(format!(
            "{name}: {} of {TRIES} TERMs lost {lost:?}",
            lost.len()
        ));
        if name != "runc" {
            ours_lost = lost.len();
        }
        pod.remove()?;
    }
    ensure!(ours_lost == 0, "SIGTERM lost:\n  {}", report.join("\n  "));
    eprintln!("{}", report.join("\n"));
    Ok(())
}

/// Polls until `pid` is gone (or a zombie).
fn wait_dead(pid: u32, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while ctr::alive(pid) {
        if start.elapsed() > timeout {
            bail!("process {pid} still alive after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Item 10 through ctr: a task whose init has just exited while its last output waits for a
/// reader (`ctr run -d` leaves none): `ctr task kill` must be NotFound ("process already
/// finished"), as under runc-v2, not an unknown error.
#[test]
fn ctr_kill_of_a_just_exited_task_is_not_found_like_runc() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    for shim in SHIMS {
        let id = sc_id("killexited");
        let container = Container::start_detached(
            shim,
            &[],
            BUSYBOX_IMAGE,
            &id,
            &["sh", "-c", "sleep 1; echo unread; exit 0"],
        )?;
        let (pid, _) = container
            .task()?
            .with_context(|| format!("{shim:?}: no task {id}"))?;
        wait_dead(pid, Duration::from_secs(20))?;
        let killed = container.task_cmd(&["kill", "--signal", "SIGTERM"], &[])?;
        ensure!(
            !killed.success(),
            "{shim:?}: a kill of an exited task succeeded\n{killed}"
        );
        ensure!(
            killed.stderr.contains("not found") && !killed.stderr.contains("unknown"),
            "{shim:?}: a kill of an exited task must be NotFound (containerd ignores only \
             that)\n{killed}"
        );
    }
    Ok(())
}

/// Item 10 through the CRI: the init is SIGKILLed while its output fifo is full (`yes`), and
/// StopContainer follows at once, before containerd heard of the exit: it must succeed, as
/// under the runc handler, 5 times each.
#[test]
fn cri_stop_of_a_just_exited_container_succeeds_like_runc() -> anyhow::Result<()> {
    const TRIES: usize = 5;
    let cri = cri()?;
    for (name, handler) in handlers()? {
        let pod = Pod::run(&cri, pod_config("sc-stopexited", &[]), &handler)?;
        for i in 0..TRIES {
            let id = pod.start(&container_config(
                &format!("yes{i}"),
                TOOLS_IMAGE,
                &["yes"],
                &[],
            ))?;
            let pid = cri.container_pid(&id)?;
            thread::sleep(Duration::from_millis(300));
            kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGKILL)?;
            let stopped = cri.stop_container(&id, 5);
            ensure!(
                stopped.is_ok(),
                "{name}, try {i}: StopContainer of a container that just exited failed: {:#}",
                stopped.err().map(|e| format!("{e:#}")).unwrap_or_default()
            );
            cri.remove_container(&id)?;
        }
        pod.remove()?;
    }
    Ok(())
}

/// Issue 33, item 10, through ctr: an exec of a program the image lacks fails with the
/// runtime's reason as an unknown error, as under runc-v2 ("...not found in $PATH: unknown"),
/// not NotFound, which callers read as "no such container or exec" (the shim once answered
/// NotFound to any runtime error whose text said "not found").
#[test]
fn ctr_exec_of_a_missing_program_is_unknown_like_runc() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    for shim in SHIMS {
        let (container, _) = Container::sleeping(shim, &[], &sc_id("nobin"))?;
        let out = container.task_cmd(&["exec", "--exec-id", "e"], &[MISSING_PROGRAM])?;
        let last = out.stderr.trim_end().lines().last().unwrap_or_default();
        ensure!(
            !out.success() && last.contains(MISSING_PROGRAM) && last.ends_with(": unknown"),
            "{shim:?}: an exec of a missing program must fail as unknown, naming it\n{out}"
        );
    }
    Ok(())
}

/// Issue 33, item 10, through the CRI: ExecSync of a program the image lacks answers as
/// under the runc handler (the same gRPC code, never NotFound), and the container is still
/// there to exec into.
#[test]
fn cri_exec_sync_of_a_missing_program_answers_like_runc() -> anyhow::Result<()> {
    let cri = cri()?;
    let mut answers = Vec::new();
    for (name, handler) in handlers()? {
        let pod = Pod::run(&cri, pod_config("sc-nobin", &[]), &handler)?;
        let id = pod.start(&container_config(
            "app",
            TOOLS_IMAGE,
            &["sleep", "3600"],
            &[],
        ))?;
        let answer = match cri.exec_sync(&id, &[MISSING_PROGRAM], 30) {
            Ok(exec) => (format!("exit {}", exec.exit_code), exec.to_string()),
            Err(e) => (
                format!("{:?}", cri::status_of(&e).map(tonic::Status::code)),
                format!("{e:#}"),
            ),
        };
        let after = cri.exec_sync(&id, &["true"], 30)?;
        ensure!(
            after.exit_code == 0,
            "{name}: the container is gone after a failed exec\n{after}"
        );
        pod.remove()?;
        answers.push((name, answer));
    }
    let [(_, (runc, runc_detail)), (_, (ours, ours_detail))] = &answers[..] else {
        bail!("expected two handlers, got {}", answers.len());
    };
    eprintln!("ExecSync {MISSING_PROGRAM}: runc {runc}, agent-sandbox {ours}");
    ensure!(
        ours == runc && !ours.contains("NotFound"),
        "ExecSync of a missing program: agent-sandbox answered {ours}, runc {runc}\n\
         agent-sandbox: {ours_detail}\nrunc: {runc_detail}"
    );
    Ok(())
}

/// A program no test image has.
const MISSING_PROGRAM: &str = "nonexistent-binary";

/// A runc-style bundle (busybox applets) running `sleep 300`.
fn sleeping_bundle(dir: &Path) -> anyhow::Result<PathBuf> {
    let bundle = dir.join("bundle");
    fs::create_dir_all(&bundle)?;
    busybox_rootfs(&bundle)?;
    harness::runc_spec(&bundle, &["sleep", "300"], |_| {})?;
    for p in [dir, &bundle] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    }
    Ok(bundle)
}

/// Item 11 at the runtime CLI: while four writers send `kill ID CONT` (each kill saves the
/// state) two readers run `state ID`, 30 times each: no command may fail. runc is the
/// reference; libcontainer rewrites `state.json` in place, so without the state lock and
/// the reader's retry these fail with "load state failed ... EOF while parsing".
#[test]
fn runtime_state_is_never_read_half_written_under_concurrent_kills() -> anyhow::Result<()> {
    const ROUNDS: usize = 30;
    harness::require_file(harness::runtime_bin())?;
    let dir = tempfile::tempdir()?;
    let bundle = sleeping_bundle(dir.path())?;
    let runc = harness::require_tool("runc")?;
    for binary in [runc, harness::runtime_bin()] {
        let root = dir.path().join(format!(
            "root-{}",
            binary.file_name().unwrap_or_default().to_string_lossy()
        ));
        let id = sc_id("state");
        let cli = |args: &[&str]| {
            let mut cmd = Command::new(&binary);
            cmd.arg("--root").arg(&root).args(args);
            cmd
        };
        let pid_file = dir.path().join(format!("{id}.pid"));
        let create_err = dir.path().join(format!("{id}.create-stderr"));
        // The container keeps create's stdio: not pipes that a capture would wait on.
        let create = cli(&["create", "--bundle"])
            .arg(&bundle)
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&create_err)?)
            .status()?;
        let result = (|| {
            ensure!(
                create.success(),
                "{}: create failed ({create}): {}",
                binary.display(),
                fs::read_to_string(&create_err).unwrap_or_default()
            );
            harness::run_ok(&mut cli(&["start", &id]), DEFAULT_TIMEOUT)?;
            let kill = ["kill", id.as_str(), "CONT"];
            let state = ["state", id.as_str()];
            let failures: Vec<String> = thread::scope(|s| {
                let workers: Vec<_> = [
                    kill.as_slice(),
                    kill.as_slice(),
                    kill.as_slice(),
                    kill.as_slice(),
                    state.as_slice(),
                    state.as_slice(),
                ]
                .into_iter()
                .map(|args| {
                    let cli = &cli;
                    s.spawn(move || {
                        let mut failed = Vec::new();
                        for _ in 0..ROUNDS {
                            match harness::run(&mut cli(args), DEFAULT_TIMEOUT) {
                                Ok(out) if out.success() => {}
                                Ok(out) => failed.push(format!("{args:?}: {}", out.stderr.trim())),
                                Err(e) => failed.push(format!("{args:?}: {e:#}")),
                            }
                        }
                        failed
                    })
                })
                .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().unwrap_or_else(|_| vec!["worker panicked".into()]))
                    .collect()
            });
            ensure!(
                failures.is_empty(),
                "{}: {} of {} commands failed while others wrote the state:\n  {}",
                binary.display(),
                failures.len(),
                6 * ROUNDS,
                failures.join("\n  ")
            );
            Ok(())
        })();
        let _ = harness::run(&mut cli(&["kill", &id, "KILL"]), DEFAULT_TIMEOUT);
        let _ = harness::run(&mut cli(&["delete", "--force", &id]), DEFAULT_TIMEOUT);
        result?;
    }
    Ok(())
}

/// The lines of containerd's log after byte `offset`.
fn containerd_log_since(offset: u64) -> anyhow::Result<String> {
    let text = fs::read(CONTAINERD_LOG).with_context(|| format!("cannot read {CONTAINERD_LOG}"))?;
    let start = usize::try_from(offset)?.min(text.len());
    Ok(String::from_utf8_lossy(&text[start..]).into_owned())
}

/// Where hack/containerd.sh sends containerd's log.
const CONTAINERD_LOG: &str = "/var/log/containerd.log";

/// Item 11 through the CRI: pods of two containers torn down (StopPodSandbox, which kills
/// and deletes every task while containerd's exit handlers do the same) five times per
/// handler: containerd's log must show no failed state read for any of them.
#[test]
fn cri_teardown_logs_no_torn_state_read() -> anyhow::Result<()> {
    const PODS: usize = 5;
    let cri = cri()?;
    for (name, handler) in handlers()? {
        let offset = fs::metadata(CONTAINERD_LOG)
            .with_context(|| format!("cannot read {CONTAINERD_LOG}"))?
            .len();
        let mut ids = Vec::new();
        for i in 0..PODS {
            let pod = Pod::run(&cri, pod_config(&format!("sc-teardown{i}"), &[]), &handler)?;
            ids.push(pod.id.clone());
            for c in ["a", "b"] {
                ids.push(pod.start(&container_config(c, TOOLS_IMAGE, &["sleep", "3600"], &[]))?);
            }
            pod.remove()?;
        }
        let log = containerd_log_since(offset)?;
        let torn: Vec<&str> = log
            .lines()
            .filter(|l| {
                (l.contains("load state failed") || l.contains("EOF while parsing"))
                    && ids.iter().any(|id| l.contains(id.as_str()))
            })
            .collect();
        ensure!(
            torn.is_empty(),
            "{name}: containerd logged failed state reads during teardown:\n  {}",
            torn.join("\n  ")
        );
    }
    Ok(())
}

//! Init suite: what the sandbox's PID 1 and its callers' exit reports look like
//! (docs/limits.md, docs/audit.md).
//!
//! - The reaping init: a `sleep` PID 1 never waits, so the orphans an agent's commands leave
//!   become its zombies; with agent-sandbox's reaper (the default) they are reaped and new
//!   forks keep working after more orphans than the pids limit, while the same workload with
//!   `resources.init = "never"` and under runc runs out of pids.
//! - Signals reach the program through the reaper: `podman stop` and `ctr task kill` of a
//!   tool that traps SIGTERM give the tool's own exit code, as under runc.
//! - podman's `OOMKilled`: after an OOM kill, a plain `podman run` from any working directory
//!   leaves it true under agent-sandbox (the runtime creates `BUNDLE/oom`, where podman 4
//!   looks), rootful and rootless, while under runc it stays false (conmon 2.1.6 writes the
//!   file into its working directory: podman issue 13102, docs/limits.md); a SIGKILL or a
//!   wall-clock kill (exit 137 too) leaves it false.
//! - podman exec exit codes and signals are in the audit log, once per exec, under the
//!   exec session's id; ctr's execs still have exactly one record each.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Output, User};
use agent_sandbox_e2e::net;
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime};
use anyhow::{Context, ensure};
use serde_json::Value;

/// Rootful podman's runtime state root.
const PODMAN_ROOT: &str = "/run/agent-sandbox";

/// The pids limit the zombie tests run under.
const PIDS: &str = "16";

/// One round of an agent's commands that leave orphans behind: each `( ... & )` subshell
/// starts a `sleep` and exits at once, so the sleep is handed to PID 1 and, 0.2 s later,
/// becomes PID 1's zombie unless PID 1 waits for it.
const ORPHANS: &str = "for i in 1 2 3 4 5 6; do (sleep 0.2 &); done; echo round-done";

/// A fork check: six processes at once (with the init, the program and this shell, 9 of
/// the 16 pids), then a line.
const FORKS: &str = "for i in 1 2 3 4 5 6; do sleep 0.3 & done; wait; echo forks-ok";

/// A tool that handles SIGTERM itself, exiting 42.
const TERM_TOOL: &str =
    "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.1; done";

/// A name for this test process's containers (prefix `hinit`).
fn name(stem: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "hinit-{stem}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn forks_ok(out: &Output) -> bool {
    out.success() && out.stdout.contains("forks-ok") && !out.stderr.contains("can't fork")
}

/// Runs `rounds` rounds of [`ORPHANS`] through `exec` (half a second apart), then the
/// [`FORKS`] check; returns the check's output.
fn orphan_rounds(exec: &dyn Fn(&str) -> anyhow::Result<Output>) -> anyhow::Result<Output> {
    for _ in 0..5 {
        let _ = exec(ORPHANS)?;
        std::thread::sleep(Duration::from_millis(500));
    }
    exec(FORKS)
}

/// A policy file: the built-in `agent` profile with `resources.init` set to `mode`.
fn policy_with_init(dir: &Path, mode: &str) -> anyhow::Result<String> {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/agent.toml");
    let text = std::fs::read_to_string(&agent)
        .with_context(|| format!("cannot read {}", agent.display()))?;
    ensure!(
        text.contains("\n[resources]\n"),
        "no [resources] table in {}",
        agent.display()
    );
    let text = text.replace(
        "\n[resources]\n",
        &format!("\n[resources]\ninit = \"{mode}\"\n"),
    );
    let path = dir.join(format!("init-{mode}.toml"));
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

/// `podman run -d ARGS... BUSYBOX sleep 300` as `name`; returns its guard.
fn podman_sleeper(p: Podman, name: &str, args: &[&str]) -> anyhow::Result<ContainerGuard> {
    let guard = ContainerGuard {
        podman: p,
        name: name.to_owned(),
    };
    let mut all = vec!["run", "-d", "--name", name];
    all.extend_from_slice(args);
    all.extend([BUSYBOX_IMAGE, "sleep", "300"]);
    p.run_ok(&all)?;
    Ok(guard)
}

fn podman_exec(p: Podman, name: &str, script: &str) -> anyhow::Result<Output> {
    p.run(&["exec", name, "sh", "-c", script])
}

#[test]
fn podman_zombies_of_a_sleeping_pid_1_never_eat_the_pids_limit_but_do_without_the_reaper()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    let limit = format!("io.agent.sandbox.pids={PIDS}");
    let ours = Podman::new(User::Root, Runtime::AgentSandbox);

    let n = name("zombies");
    let _g = podman_sleeper(ours, &n, &["--annotation", &limit])?;
    let check = orphan_rounds(&|s| podman_exec(ours, &n, s))?;
    ensure!(
        forks_ok(&check),
        "with the reaper, forks should still work after 30 orphans under a pids limit of {PIDS}\n{check}"
    );
    let zombies = podman_exec(
        ours,
        &n,
        "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
    )?;
    ensure!(
        zombies.success() && zombies.stdout.trim() == "0",
        "zombies left in the sandbox with the reaper\n{zombies}"
    );
    let layers = harness::run_ok(
        Command::new(harness::runtime_bin()).args(["layers", &n]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(
        layers.stdout.contains("\"init\": \"agent-sandbox reaper\""),
        "`layers` does not show the reaper\n{layers}"
    );

    // The same workload with the policy key off: the program is PID 1 and keeps zombies.
    let dir = tempfile::tempdir()?;
    let never = policy_with_init(dir.path(), "never")?;
    let n_off = name("zombies-off");
    let flag = format!("policy={never}");
    let off = Podman::new(User::Root, Runtime::AgentSandbox);
    let guard_off = ContainerGuard {
        podman: off,
        name: n_off.clone(),
    };
    off.run_ok(&[
        "--runtime-flag",
        &flag,
        "run",
        "-d",
        "--name",
        &n_off,
        "--annotation",
        &limit,
        BUSYBOX_IMAGE,
        "sleep",
        "300",
    ])?;
    let exec_off = |s: &str| off.run(&["--runtime-flag", &flag, "exec", &n_off, "sh", "-c", s]);
    let check = orphan_rounds(&exec_off)?;
    ensure!(
        !forks_ok(&check),
        "with resources.init = \"never\" the zombies should have used up the pids limit\n{check}"
    );
    drop(guard_off);

    // And under runc, with podman's own pids limit.
    let runc = Podman::new(User::Root, Runtime::Runc);
    let n_runc = name("zombies-runc");
    let _gr = podman_sleeper(runc, &n_runc, &["--pids-limit", PIDS])?;
    let check = orphan_rounds(&|s| podman_exec(runc, &n_runc, s))?;
    ensure!(
        !forks_ok(&check),
        "runc baseline: a sleeping PID 1 should keep the zombies until forks fail\n{check}"
    );
    Ok(())
}

#[test]
fn ctr_zombies_of_a_sleeping_pid_1_never_eat_the_pids_limit() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let id = name("ctr-zombies");
    let limit = format!("io.agent.sandbox.pids={PIDS}");
    let c = Container::start_detached(
        Shim::AgentSandbox,
        &["--annotation", &limit],
        BUSYBOX_IMAGE,
        &id,
        &["sleep", "300"],
    )?;
    c.wait_status("RUNNING", Duration::from_secs(30))?;
    let next = std::sync::atomic::AtomicU32::new(0);
    let exec = |s: &str| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.task_cmd(&["exec", "--exec-id", &format!("z{n}")], &["sh", "-c", s])
    };
    let check = orphan_rounds(&exec)?;
    ensure!(
        forks_ok(&check),
        "with the reaper, forks should still work after 30 orphans under a pids limit of {PIDS}\n{check}"
    );

    let base_id = name("ctr-zombies-runc");
    let base = Container::start_detached(
        Shim::RuncV2,
        &[],
        BUSYBOX_IMAGE,
        &base_id,
        &["sleep", "300"],
    )?;
    base.wait_status("RUNNING", Duration::from_secs(30))?;
    // runc under ctr has no pids limit here: count the zombies instead.
    for round in 0..3 {
        base.task_cmd(
            &["exec", "--exec-id", &format!("o{round}")],
            &["sh", "-c", ORPHANS],
        )?;
    }
    std::thread::sleep(Duration::from_millis(500));
    let zombies = base.task_cmd(
        &["exec", "--exec-id", "zc"],
        &[
            "sh",
            "-c",
            "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
        ],
    )?;
    let count: u32 = zombies.stdout.trim().parse().unwrap_or(0);
    ensure!(
        count >= 12,
        "runc baseline: a sleeping PID 1 should keep the orphans' zombies (found {count})\n{zombies}"
    );
    Ok(())
}

/// `podman run -d` of [`TERM_TOOL`], then `podman stop`: the tool's own 42.
fn podman_stop_gets_42(p: Podman) -> anyhow::Result<()> {
    let n = name("term");
    let _g = ContainerGuard {
        podman: p,
        name: n.clone(),
    };
    p.run_ok(&[
        "run",
        "-d",
        "--name",
        &n,
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        TERM_TOOL,
    ])?;
    let start = std::time::Instant::now();
    while !p.run_ok(&["logs", &n])?.stdout.contains("ready") {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the tool never got ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stop = p.run_ok(&["stop", "-t", "20", &n])?;
    let code = p
        .run_ok(&["inspect", "--format", "{{.State.ExitCode}}", &n])?
        .stdout
        .trim()
        .to_owned();
    let logs = p.run_ok(&["logs", &n])?;
    ensure!(
        code == "42" && logs.stdout.contains("got-term") && stop.elapsed < Duration::from_secs(15),
        "{:?}: `podman stop` should reach the tool's TERM handler (exit 42), got {code}\n{stop}\n{logs}",
        p.runtime
    );
    Ok(())
}

#[test]
fn podman_stop_reaches_the_tools_term_handler_through_the_reaper_as_under_runc()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    podman_stop_gets_42(Podman::new(User::Root, Runtime::AgentSandbox))?;
    podman_stop_gets_42(Podman::new(User::Root, Runtime::Runc))?;

    // A signal the program has no handler for ends it: it is not PID 1 (under runc, PID 1
    // `sleep` ignores SIGUSR1 and keeps running).
    let ours = Podman::new(User::Root, Runtime::AgentSandbox);
    let n = name("usr1");
    let _g = podman_sleeper(ours, &n, &[])?;
    ours.run_ok(&["kill", "-s", "USR1", &n])?;
    let code = ours.run_ok(&["wait", &n])?;
    ensure!(
        code.stdout.trim() == "138",
        "SIGUSR1 should end the program (128 + 10)\n{code}"
    );
    let runc = Podman::new(User::Root, Runtime::Runc);
    let n = name("usr1-runc");
    let _gr = podman_sleeper(runc, &n, &[])?;
    runc.run_ok(&["kill", "-s", "USR1", &n])?;
    std::thread::sleep(Duration::from_millis(500));
    let state = runc.run_ok(&["inspect", "--format", "{{.State.Status}}", &n])?;
    ensure!(
        state.stdout.trim() == "running",
        "runc baseline: PID 1 `sleep` ignores SIGUSR1\n{state}"
    );
    Ok(())
}

#[test]
fn ctr_task_kill_gets_the_tools_own_exit_code_through_the_reaper() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    for shim in [Shim::AgentSandbox, Shim::RuncV2] {
        let id = name("ctr-term");
        let mut run = ctr::ctr();
        run.args(["run", "--rm", "--runtime", &shim.runtime_name()])
            .arg(BUSYBOX_IMAGE)
            .arg(&id)
            .args(["sh", "-c", TERM_TOOL]);
        let waiter = std::thread::spawn(move || harness::run(&mut run, DEFAULT_TIMEOUT));
        let c = Container::guard(&id);
        let started = std::time::Instant::now();
        while c.task()?.is_none_or(|(_, s)| s != "RUNNING") {
            ensure!(
                started.elapsed() < Duration::from_secs(30),
                "{shim:?}: never ran"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Past the program's start-up (its trap is the first thing it runs).
        std::thread::sleep(Duration::from_millis(700));
        c.task_cmd(&["kill"], &[])?;
        let out = waiter
            .join()
            .map_err(|_| anyhow::anyhow!("the ctr thread panicked"))??;
        ensure!(
            out.code == Some(42) && out.stdout.contains("got-term"),
            "{shim:?}: `ctr task kill` should reach the tool's TERM handler (exit 42)\n{out}"
        );
    }
    Ok(())
}

/// A memory hog that the OOM killer ends under a 64 MiB limit.
const HOG: [&str; 3] = [harness::PROBE, "hog", "256"];

/// The memory limit of `runtime`'s OOM runs: agent-sandbox's policy annotation (its policy
/// decides the sandbox's limits), podman's `--memory` for runc.
fn memory_limit(runtime: Runtime) -> [&'static str; 2] {
    match runtime {
        Runtime::AgentSandbox => ["--annotation", "io.agent.sandbox.memory=64M"],
        Runtime::Runc => ["--memory", "64m"],
    }
}

/// A fresh working directory the user `p` runs podman in (conmon 2.1.6 writes its `oom`
/// file there), and whether that file appeared is read from it.
fn scratch_cwd(p: Podman) -> anyhow::Result<tempfile::TempDir> {
    let cwd = tempfile::Builder::new().prefix("oomh-cwd-").tempdir()?;
    if p.user == User::Rootless {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(cwd.path(), std::fs::Permissions::from_mode(0o777))?;
    }
    Ok(cwd)
}

/// `podman inspect`'s `OOMKilled` and exit code of `name`, as "true 137".
fn oom_killed_and_code(p: Podman, name: &str) -> anyhow::Result<String> {
    Ok(p.run_ok(&[
        "inspect",
        "--format",
        "{{.State.OOMKilled}} {{.State.ExitCode}}",
        name,
    ])?
    .stdout
    .trim()
    .to_owned())
}

/// `podman run --name NAME ARGS... IMAGE CMD...` from a fresh working directory; returns
/// podman's output, `OOMKilled` and the exit code, and whether conmon's `oom` file landed in
/// that directory.
fn run_from_scratch_cwd(
    p: Podman,
    stem: &str,
    args: &[&str],
    cmd: &[&str],
) -> anyhow::Result<(Output, String, bool)> {
    let cwd = scratch_cwd(p)?;
    let n = oomh_name(stem);
    let _g = ContainerGuard {
        podman: p,
        name: n.clone(),
    };
    let mut all = vec!["run", "--name", &n];
    all.extend(args);
    all.push(BUSYBOX_IMAGE);
    all.extend(cmd);
    let run = harness::run(p.command(&all)?.current_dir(cwd.path()), DEFAULT_TIMEOUT)?;
    let state = oom_killed_and_code(p, &n)?;
    Ok((run, state, cwd.path().join("oom").exists()))
}

/// Container names of the OOM tests.
fn oomh_name(stem: &str) -> String {
    format!("oomh-{}", name(stem))
}

/// podman's `OOMKilled` after an OOM kill (docs/limits.md): true under agent-sandbox through
/// a plain `podman run`; under runc false, with conmon's `oom` file in podman's working
/// directory instead of the bundle, which shows the check can fail.
fn podman_sees_the_oom_kill(user: User, runtime: Runtime) -> anyhow::Result<()> {
    let p = Podman::new(user, runtime);
    let (run, state, in_cwd) = run_from_scratch_cwd(p, "oom", &memory_limit(runtime), &HOG)?;
    ensure!(
        run.code == Some(137),
        "{runtime:?} as {user}: the hog should be OOM-killed (137)\n{run}"
    );
    match runtime {
        Runtime::AgentSandbox => ensure!(
            state == "true 137",
            "agent-sandbox as {user}: OOMKilled should be true after the OOM kill, got \
             {state:?}\n{run}"
        ),
        Runtime::Runc => ensure!(
            state == "false 137" && in_cwd,
            "runc as {user}: podman 4.3 with conmon 2.1.6 should say OOMKilled=false, with \
             conmon's `oom` file in the working directory (got {state:?}, file there: \
             {in_cwd}); if this podman says true, the baseline no longer shows the bug\n{run}"
        ),
    }
    Ok(())
}

/// Exit 137 without an OOM kill leaves `OOMKilled` false under agent-sandbox, with the same
/// memory limit: the init SIGKILLed by `podman kill`, and the wall clock's kill.
fn no_oom_kill_no_flag(user: User) -> anyhow::Result<()> {
    let p = Podman::new(user, Runtime::AgentSandbox);
    let limit = memory_limit(Runtime::AgentSandbox);

    let n = oomh_name("kill9");
    let _g = ContainerGuard {
        podman: p,
        name: n.clone(),
    };
    let mut args = vec!["run", "-d", "--name", &n];
    args.extend(limit);
    args.extend([BUSYBOX_IMAGE, "sleep", "60"]);
    p.run_ok(&args)?;
    p.run_ok(&["kill", "-s", "KILL", &n])?;
    p.run(&["wait", &n])?;
    let state = oom_killed_and_code(p, &n)?;
    ensure!(
        state == "false 137",
        "as {user}: a SIGKILLed init is no OOM kill, got {state:?}"
    );

    let mut args = limit.to_vec();
    args.extend(["--annotation", "io.agent.sandbox.wall-clock=2s"]);
    let (run, state, _) = run_from_scratch_cwd(p, "wall", &args, &["sh", "-c", "sleep 30"])?;
    ensure!(
        state == "false 137",
        "as {user}: a wall-clock kill is no OOM kill, got {state:?}\n{run}"
    );
    Ok(())
}

#[test]
fn podman_oom_killed_is_true_under_agent_sandbox_and_false_under_runc() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    podman_sees_the_oom_kill(User::Root, Runtime::AgentSandbox)?;
    podman_sees_the_oom_kill(User::Root, Runtime::Runc)?;
    no_oom_kill_no_flag(User::Root)
}

#[test]
fn rootless_podman_oom_killed_is_true_under_agent_sandbox() -> anyhow::Result<()> {
    harness::require_podman_image(User::Rootless, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    podman_sees_the_oom_kill(User::Rootless, Runtime::AgentSandbox)?;
    no_oom_kill_no_flag(User::Rootless)
}

/// The `exit` records of `log` whose `process` is not the init.
fn exec_exits(log: &Path) -> anyhow::Result<Vec<Value>> {
    Ok(net::read_audit(log)?
        .into_iter()
        .filter(|r| r["kind"] == "exit" && r["data"]["process"] != "init")
        .collect())
}

/// Waits (up to 10 s) until `log` holds `n` exec `exit` records.
fn wait_exec_exits(log: &Path, n: usize) -> anyhow::Result<Vec<Value>> {
    let start = std::time::Instant::now();
    loop {
        let exits = exec_exits(log).unwrap_or_default();
        if exits.len() >= n || start.elapsed() > Duration::from_secs(10) {
            // A little longer, so a duplicate would show.
            std::thread::sleep(Duration::from_millis(300));
            return exec_exits(log);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn podman_exec_exit_codes_and_signals_are_recorded_once_under_the_exec_session_id()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let n = name("exec-exit");
    let _g = podman_sleeper(p, &n, &[])?;
    let three = p.run(&["exec", &n, "sh", "-c", "exit 3"])?;
    ensure!(three.code == Some(3), "exec exit 3\n{three}");
    let term = p.run(&["exec", &n, "sh", "-c", "kill -TERM $$"])?;
    ensure!(term.code == Some(143), "exec killed by SIGTERM\n{term}");
    let id = p
        .run_ok(&["inspect", "--format", "{{.Id}}", &n])?
        .stdout
        .trim()
        .to_owned();
    let log = Path::new(PODMAN_ROOT)
        .join("audit")
        .join(format!("{id}.jsonl"));
    let exits = wait_exec_exits(&log, 2)?;
    ensure!(
        exits.len() == 2,
        "two execs should leave exactly two exit records: {exits:#?}"
    );
    let by_status = |s: Value| exits.iter().filter(move |r| r["data"]["status"] == s);
    let code3: Vec<_> = by_status(serde_json::json!({"code": 3})).collect();
    let sig15: Vec<_> = by_status(serde_json::json!({"signal": 15})).collect();
    ensure!(
        code3.len() == 1 && sig15.len() == 1,
        "one record with code 3 and one with signal 15 expected: {exits:#?}"
    );
    for r in [code3[0], sig15[0]] {
        let process = r["data"]["process"].as_str().unwrap_or_default();
        ensure!(
            process.len() == 64 && process.bytes().all(|b| b.is_ascii_hexdigit()),
            "the record should name podman's exec session id: {r}"
        );
    }
    ensure!(
        code3[0]["data"]["process"] != sig15[0]["data"]["process"],
        "two execs, two session ids: {exits:#?}"
    );
    harness::run_ok(
        Command::new(harness::runtime_bin()).args(["audit", "verify", &id]),
        DEFAULT_TIMEOUT,
    )?;
    Ok(())
}

/// A running `sleep 300` task under our shim (named after `stem`), and its audit log.
fn ctr_sleeper(stem: &str) -> anyhow::Result<(String, Container, std::path::PathBuf)> {
    ctr::require_containerd()?;
    let id = name(stem);
    let c = Container::start_detached(
        Shim::AgentSandbox,
        &[],
        BUSYBOX_IMAGE,
        &id,
        &["sleep", "300"],
    )?;
    c.wait_status("RUNNING", Duration::from_secs(30))?;
    let log = Path::new(ctr::RUNTIME_ROOT)
        .join(ctr::NAMESPACE)
        .join("audit")
        .join(format!("{id}.jsonl"));
    Ok((id, c, log))
}

/// Through our shim, an exec's `exit` record is in the log before containerd hears of the
/// exit: read as soon as `ctr task exec` returns, without waiting, each exec's record is
/// there with its code. One exit recorder of the container (`agent-sandbox exit-recorder`)
/// writes them all, instead of an `audit-exit` run per exec on the path of every exit, and
/// the log's chain still verifies.
#[test]
fn ctr_exec_exit_records_are_in_the_log_when_the_exec_returns_by_one_recorder() -> anyhow::Result<()>
{
    let (id, c, log) = ctr_sleeper("ctr-exit-recorder")?;
    let mut recorders = std::collections::BTreeSet::new();
    for code in 0..5 {
        let exec_id = format!("rec{code}");
        let out = c.task_cmd(
            &["exec", "--exec-id", &exec_id],
            &["sh", "-c", &format!("echo out-{code}; exit {code}")],
        )?;
        ensure!(
            out.code == Some(code) && out.stdout.contains(&format!("out-{code}")),
            "exec {exec_id}\n{out}"
        );
        let exits = exec_exits(&log)?;
        let mine: Vec<_> = exits
            .iter()
            .filter(|r| r["data"]["process"] == exec_id.as_str())
            .collect();
        ensure!(
            mine.len() == 1 && mine[0]["data"]["status"] == serde_json::json!({ "code": code }),
            "exec {exec_id} returned, but the log has not its one exit record: {exits:#?}"
        );
        recorders.extend(harness::pids_with_args(|_, args| {
            args.contains(&b"exit-recorder".as_slice())
                && args.iter().rev().find(|a| !a.is_empty()) == Some(&id.as_bytes())
        }));
    }
    ensure!(
        recorders.len() == 1,
        "one exit recorder for the container's 5 execs expected, saw pids {recorders:?}"
    );
    harness::runtime_ok(&["audit", "verify", &id])?;
    Ok(())
}

#[test]
fn ctr_exec_exits_are_recorded_once_each() -> anyhow::Result<()> {
    let (_id, c, log) = ctr_sleeper("ctr-exec-exit")?;
    let out = c.task_cmd(&["exec", "--exec-id", "three"], &["sh", "-c", "exit 3"])?;
    ensure!(out.code == Some(3), "exec exit 3\n{out}");
    let exits = wait_exec_exits(&log, 1)?;
    ensure!(
        exits.len() == 1
            && exits[0]["data"]["process"] == "three"
            && exits[0]["data"]["status"] == serde_json::json!({"code": 3}),
        "one exit record for exec `three` with code 3 expected: {exits:#?}"
    );
    Ok(())
}

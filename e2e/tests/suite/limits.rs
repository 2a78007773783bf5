//! Limits suite: a limit that ends or refuses something says so where the caller looks.
//! A wall-clock kill, through podman (rootful and rootless) and ctr, prints a line on the
//! container's stderr and leaves an `exit` record whose cause is `wall_clock` (the same
//! command runs to the end under runc); a fork bomb under a small pids limit, through podman
//! and ctr, leaves exactly one `limit_hit` record naming `pids` with the kernel's count (the
//! same bomb forks freely under runc).

use std::path::Path;
use std::process::Command;

use agent_sandbox_e2e::ctr::{self, Shim, run_rm, unique_id};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, User};
use agent_sandbox_e2e::net;
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, unique_name};
use anyhow::{Context, ensure};
use serde_json::Value;

/// Rootful podman's runtime state root (the runtime's default as root).
const PODMAN_ROOT: &str = "/run/agent-sandbox";

/// The line the watchdog writes on the init's stderr.
const WALL_CLOCK_LINE: &str = "agent-sandbox: wall-clock limit of 2s reached";

/// Sleeps past a 2 s wall clock, saying whether it got to the end.
const SLEEPER: [&str; 3] = ["sh", "-c", "echo started; sleep 5; echo finished"];

fn log_of(root: &str, id: &str) -> std::path::PathBuf {
    Path::new(root).join("audit").join(format!("{id}.jsonl"))
}

/// `agent-sandbox --root ROOT audit ID` (the human timeline).
fn timeline(root: &str, id: &str) -> anyhow::Result<String> {
    let out = harness::run_ok(
        Command::new(harness::runtime_bin()).args(["--root", root, "audit", id]),
        DEFAULT_TIMEOUT,
    )?;
    Ok(out.stdout)
}

fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

/// The init's `exit` record says the wall clock ended it, and the timeline says so too.
fn expect_wall_clock_exit(root: &str, id: &str) -> anyhow::Result<()> {
    let records = net::read_audit(&log_of(root, id))?;
    let exits = of_kind(&records, "exit");
    let init = exits
        .iter()
        .find(|r| r["data"]["process"] == "init")
        .with_context(|| format!("no init exit record in {records:#?}"))?;
    ensure!(
        init["data"]["cause"] == "wall_clock",
        "the init's exit record does not name the wall clock: {init}"
    );
    let text = timeline(root, id)?;
    ensure!(
        text.contains("(wall-clock limit)"),
        "`audit {id}` does not name the wall clock:\n{text}"
    );
    Ok(())
}

#[test]
fn podman_wall_clock_kill_says_so_on_stderr_and_in_the_audit_while_runc_runs_to_the_end()
-> anyhow::Result<()> {
    let (p, name, _g) = podman_wall_clock_kill(User::Root, "lm-wall")?;
    let logs = p.run_ok(&["logs", &name])?;
    ensure!(
        format!("{}{}", logs.stdout, logs.stderr).contains(WALL_CLOCK_LINE),
        "`podman logs` does not have the wall-clock line\n{logs}"
    );
    let id = remove_for_id(p, &name)?;
    expect_wall_clock_exit(PODMAN_ROOT, &id)?;

    let runc = Podman::new(User::Root, Runtime::Runc);
    let mut base_args = vec!["run", "--rm", BUSYBOX_IMAGE];
    base_args.extend(SLEEPER);
    let base = runc.run(&base_args)?;
    ensure!(
        base.success() && base.stdout.contains("finished"),
        "runc baseline: the sleeper should run to the end\n{base}"
    );
    Ok(())
}

#[test]
fn ctr_wall_clock_kill_says_so_on_stderr_and_in_the_audit_while_runc_runs_to_the_end()
-> anyhow::Result<()> {
    ctr::require_containerd()?;
    let id = unique_id("lm-wall");
    let ours = run_rm(
        Shim::AgentSandbox,
        &["--annotation", "io.agent.sandbox.wall-clock=2s"],
        BUSYBOX_IMAGE,
        &id,
        &SLEEPER,
    )?;
    ensure!(
        ours.code == Some(137) && !ours.stdout.contains("finished"),
        "the wall clock should kill the sandbox (137)\n{ours}"
    );
    ensure!(
        ours.stderr.contains(WALL_CLOCK_LINE),
        "ctr's stderr does not say the wall clock killed the sandbox\n{ours}"
    );
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    expect_wall_clock_exit(&root, &id)?;

    let base_id = unique_id("lm-wall-runc");
    let base = run_rm(Shim::RuncV2, &[], BUSYBOX_IMAGE, &base_id, &SLEEPER)?;
    ensure!(
        base.success() && base.stdout.contains("finished"),
        "runc baseline: the sleeper should run to the end\n{base}"
    );
    Ok(())
}

/// Starts 60 sleepers in the background and prints how many it started.
const FORK_BOMB: [&str; 3] = [
    "sh",
    "-c",
    "i=0; while [ $i -lt 60 ]; do sleep 30 & i=$((i+1)); done; echo spawned $i",
];

/// The log of `id` holds exactly one `limit_hit` record: pids, a count > 0, the limit 16.
fn expect_one_pids_hit(root: &str, id: &str) -> anyhow::Result<()> {
    let records = net::read_audit(&log_of(root, id))?;
    let hits = of_kind(&records, "limit_hit");
    ensure!(
        hits.len() == 1,
        "expected exactly one limit_hit record: {records:#?}"
    );
    let data = &hits[0]["data"];
    ensure!(
        data["limit"] == "pids"
            && data["count"].as_u64().is_some_and(|c| c > 0)
            && data["max"] == 16,
        "the limit_hit record should name pids, a count > 0 and the limit 16: {data}"
    );
    let text = timeline(root, id)?;
    ensure!(
        text.contains("pids: the kernel refused"),
        "`audit {id}` does not show the pids refusals:\n{text}"
    );
    Ok(())
}

#[test]
fn podman_fork_bomb_under_a_small_pids_limit_leaves_one_limit_hit_record_with_a_count()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let name = unique_name("lm-pids");
    let _g = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    let mut args = vec![
        "run",
        "--name",
        &name,
        "--annotation",
        "io.agent.sandbox.pids=16",
        BUSYBOX_IMAGE,
    ];
    args.extend(FORK_BOMB);
    let ours = p.run(&args)?;
    ensure!(
        !ours.stdout.contains("spawned 60"),
        "all 60 forks succeeded under a pids limit of 16\n{ours}"
    );
    let id = p
        .run_ok(&["inspect", "--format", "{{.Id}}", &name])?
        .stdout
        .trim()
        .to_owned();
    p.run_ok(&["rm", "-f", "-t", "0", &name])?;
    expect_one_pids_hit(PODMAN_ROOT, &id)?;

    let runc = Podman::new(User::Root, Runtime::Runc);
    let mut base_args = vec!["run", "--rm", BUSYBOX_IMAGE];
    base_args.extend(FORK_BOMB);
    let base = runc.run(&base_args)?;
    ensure!(
        base.stdout.contains("spawned 60"),
        "runc baseline: the 60 forks should all succeed without the sandbox's limit\n{base}"
    );
    Ok(())
}

#[test]
fn rootless_podman_wall_clock_kill_says_so_on_stderr_and_in_the_audit() -> anyhow::Result<()> {
    let (p, name, _g) = podman_wall_clock_kill(User::Rootless, "lm-wall-rl")?;
    let id = remove_for_id(p, &name)?;
    // `audit` from inside the rootless user namespace, where the runtime keeps its state.
    let runtime = harness::runtime_bin().display().to_string();
    let out = harness::run_ok(
        User::Rootless
            .podman()
            .args(["unshare", &runtime, "audit", "--json", &id]),
        DEFAULT_TIMEOUT,
    )?;
    let init = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["kind"] == "exit" && r["data"]["process"] == "init")
        .with_context(|| format!("no init exit record\n{out}"))?;
    ensure!(
        init["data"]["cause"] == "wall_clock",
        "the init's exit record does not name the wall clock: {init}"
    );
    Ok(())
}

#[test]
fn ctr_fork_bomb_under_a_small_pids_limit_leaves_one_limit_hit_record_with_a_count()
-> anyhow::Result<()> {
    ctr::require_containerd()?;
    let id = unique_id("lm-pids");
    let ours = run_rm(
        Shim::AgentSandbox,
        &["--annotation", "io.agent.sandbox.pids=16"],
        BUSYBOX_IMAGE,
        &id,
        &FORK_BOMB,
    )?;
    ensure!(
        !ours.stdout.contains("spawned 60"),
        "all 60 forks succeeded under a pids limit of 16\n{ours}"
    );
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    expect_one_pids_hit(&root, &id)?;

    let base_id = unique_id("lm-pids-runc");
    let base = run_rm(Shim::RuncV2, &[], BUSYBOX_IMAGE, &base_id, &FORK_BOMB)?;
    ensure!(
        base.stdout.contains("spawned 60"),
        "runc baseline: the 60 forks should all succeed without the sandbox's limit\n{base}"
    );
    Ok(())
}

/// Runs [`SLEEPER`] through podman as `user` under a 2 s wall clock and checks that the kill
/// came (exit 137, never "finished") and said so on the container's output. The container
/// stays for the caller's checks; the guard removes it.
fn podman_wall_clock_kill(
    user: User,
    stem: &str,
) -> anyhow::Result<(Podman, String, ContainerGuard)> {
    harness::require_podman_image(user, BUSYBOX_IMAGE)?;
    harness::require_file(harness::runtime_bin())?;
    let p = Podman::new(user, Runtime::AgentSandbox);
    let name = unique_name(stem);
    let guard = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    let mut args = vec![
        "run",
        "--name",
        &name,
        "--annotation",
        "io.agent.sandbox.wall-clock=2s",
        BUSYBOX_IMAGE,
    ];
    args.extend(SLEEPER);
    let ours = p.run(&args)?;
    ensure!(
        ours.code == Some(137) && !ours.stdout.contains("finished"),
        "the wall clock should kill the sandbox (137)\n{ours}"
    );
    ensure!(
        ours.stderr.contains(WALL_CLOCK_LINE) || ours.stdout.contains(WALL_CLOCK_LINE),
        "the container's output does not say the wall clock killed it\n{ours}"
    );
    Ok((p, name, guard))
}

/// The container's full id, then `podman rm` of it.
fn remove_for_id(p: Podman, name: &str) -> anyhow::Result<String> {
    let id = p
        .run_ok(&["inspect", "--format", "{{.Id}}", name])?
        .stdout
        .trim()
        .to_owned();
    p.run_ok(&["rm", name])?;
    Ok(id)
}

/// A frozen sandbox's wall clock stands still. A 3 s wall clock, frozen (`ctr task pause`)
/// right after start for 5 s: the sandbox is still running a second after `resume`, then the
/// wall clock ends it with its cause recorded, and the log has the `paused` and `resumed`
/// records with the freeze's length. A watchdog that only sleeps kills it while frozen, and
/// it is gone at `resume`. The same pause and resume under runc leave the task running.
#[test]
fn ctr_paused_sandbox_keeps_its_wall_clock_until_resumed() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let id = unique_id("lm-pause");
    let (c, _) = ctr::Container::sleeping(
        Shim::AgentSandbox,
        &["--annotation", "io.agent.sandbox.wall-clock=3s"],
        &id,
    )?;
    let paused = c.task_cmd(&["pause"], &[])?;
    ensure!(paused.success(), "{paused}");
    c.wait_status("PAUSED", std::time::Duration::from_secs(10))?;
    std::thread::sleep(std::time::Duration::from_secs(5));
    let resumed = c.task_cmd(&["resume"], &[])?;
    ensure!(resumed.success(), "{resumed}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let task = c.task()?;
    ensure!(
        task.as_ref().is_some_and(|(_, s)| s == "RUNNING"),
        "the sandbox did not outlive its freeze: {task:?}"
    );
    c.wait_status("STOPPED", std::time::Duration::from_secs(15))?;
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    // The shim records the init's exit as it publishes it: poll for the record.
    let start = std::time::Instant::now();
    while !of_kind(&net::read_audit(&log_of(&root, &id))?, "exit")
        .iter()
        .any(|r| r["data"]["process"] == "init")
        && start.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    expect_wall_clock_exit(&root, &id)?;
    let records = net::read_audit(&log_of(&root, &id))?;
    let kinds: Vec<&str> = records
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .filter(|k| matches!(*k, "paused" | "resumed" | "exit"))
        .collect();
    ensure!(
        kinds.starts_with(&["paused", "resumed"]),
        "expected paused, resumed, then the exit: {kinds:?}"
    );
    let frozen_ms = of_kind(&records, "resumed")[0]["data"]["frozen_ms"]
        .as_u64()
        .unwrap_or_default();
    ensure!(
        (4_500..20_000).contains(&frozen_ms),
        "the resumed record should count about 5 s frozen, got {frozen_ms} ms"
    );
    let text = timeline(&root, &id)?;
    ensure!(text.contains("thawed after"), "{text}");
    drop(c);

    let base_id = unique_id("lm-pause-runc");
    let (b, _) = ctr::Container::sleeping(Shim::RuncV2, &[], &base_id)?;
    ensure!(b.task_cmd(&["pause"], &[])?.success());
    b.wait_status("PAUSED", std::time::Duration::from_secs(10))?;
    ensure!(b.task_cmd(&["resume"], &[])?.success());
    b.wait_status("RUNNING", std::time::Duration::from_secs(10))?;
    Ok(())
}

//! Agent task suite (issue #33): the same 50-call agent task (`agent_sandbox_e2e::agent_task`)
//! through podman (rootful), ctr, CRI (kubelet-shaped `ExecSync`) and Docker, each paired
//! with the same task under plain runc as the reference.
//!
//! Per entry point: every step exits as expected, and as under runc except the one security
//! step (a post to a host no policy allows, which runc delivers and the proxy refuses and
//! records); the host checkout is unchanged until `promote` (under runc it changes at once:
//! that is the baseline showing what the sandbox is for), and has the agent's edits and its
//! commits (as `refs/agent-sandbox/...`, docs/promote.md#history) after it; review (`diff`,
//! `audit`) finds the sandbox by the names the engine shows; every tool call's `exec` record
//! carries its tool-call id.
//!
//! Checks that need another branch of issue #33 run last in each test, so on a branch without
//! it the test fails only there, naming what it waits for:
//! - h/names: ctr's `--exec-id` and CRI's argv prefix `env AGENT_SANDBOX_TOOL_CALL_ID=ID` as
//!   the exec record's tool-call id; review by CRI's `POD/CONTAINER`; a pod's network records
//!   reachable from its container's audit.
//!
//! Docker is reviewed by its full and short id: dockerd 20.10 passes a runtime no container
//! name, so no runtime can know it.

use std::time::Duration;

use agent_sandbox_e2e::agent_task::{self, COMMITS, Checkout, EntryPoint, Flavor, Run, World};
use agent_sandbox_e2e::harness::{self, Output};
use agent_sandbox_e2e::net::COLLECTOR_HOST;
use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// What a check that waits for another branch found.
struct Pending {
    branch: &'static str,
    result: anyhow::Result<()>,
}

/// The paths the task changes, as `diff` lists them.
const DIFF_LINES: &[&str] = &[
    "M /calc/ops.py (file)",
    "A /calc/stats.py (file)",
    "A /tests/test_stats.py (file)",
    "D /docs/legacy.md (file)",
    "A /docs/guide.md (file)",
];

/// The runc reference: the same steps exit the same way (the security step succeeds), and the
/// host checkout has the agent's work the moment each step ends.
fn reference(entry: EntryPoint, w: &World) -> anyhow::Result<Run> {
    let co = Checkout::create()?;
    let before = co.snapshot()?;
    let received = w.collector.received().len();
    let fetches = w.wheel_fetches();
    let run = agent_task::run_task(entry, Flavor::Runc, &w.setup(&co), &w.steps, |run| {
        let wrong = run.mismatches(&w.steps);
        ensure!(
            wrong.is_empty(),
            "{} runc reference: {} step(s) differ:\n{}",
            entry.name(),
            wrong.len(),
            wrong.join("\n")
        );
        let changed = agent_task::changed_paths(&before, &co.snapshot()?);
        for path in [
            "calc/ops.py",
            "calc/stats.py",
            "docs/legacy.md",
            ".git/refs/heads/main",
        ] {
            ensure!(
                changed.iter().any(|p| p.starts_with(path)),
                "runc: the host checkout does not show {path} changed: {changed:?}"
            );
        }
        ensure!(
            !co.repo.join("docs/legacy.md").exists(),
            "runc: the delete did not reach the host"
        );
        Ok(())
    })?;
    let log = co.git(&["log", "--format=%s", "main"])?;
    ensure!(
        log == format!("{}\n{}\ninitial\n", COMMITS[1], COMMITS[0]),
        "runc: the commits are not on the host's main at once: {log:?}"
    );
    ensure!(
        w.collector.received().len() > received,
        "runc: the upload did not reach the collector"
    );
    ensure!(
        w.wheel_fetches() > fetches,
        "runc: pip did not fetch the wheel: {:?}",
        w.index.requests()
    );
    Ok(run)
}

/// `agent-sandbox diff KEY` lists the task's changes.
fn review_finds(key: &str) -> anyhow::Result<()> {
    let diff = harness::runtime(&["diff", key])?;
    ensure!(diff.success(), "diff {key} failed\n{diff}");
    for line in DIFF_LINES {
        ensure!(
            diff.stdout.lines().any(|l| l == *line),
            "diff {key} lacks {line:?}\n{diff}"
        );
    }
    Ok(())
}

/// The records of `agent-sandbox audit KEY --json`.
fn audit_records(run: &Run) -> anyhow::Result<(Vec<Value>, Output)> {
    let out = run.audit(&[], &["--json"])?;
    ensure!(out.success(), "audit failed\n{out}");
    let records = out
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad audit line {l:?}")))
        .collect::<anyhow::Result<Vec<Value>>>()?;
    Ok((records, out))
}

/// Every tool call has an `exec` record carrying its id, whose argv is the step's command.
fn every_exec_tagged(run: &Run, records: &[Value]) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for call in &run.calls {
        let tagged = records.iter().any(|r| {
            r["kind"] == "exec"
                && r["data"]["tool_call_id"] == call.id.as_str()
                && r["data"]["argv"][0] == "sh"
        });
        if !tagged {
            missing.push(call.id.clone());
        }
    }
    let seen: Vec<String> = records
        .iter()
        .filter(|r| r["kind"] == "exec")
        .map(|r| format!("{} {}", r["data"]["tool_call_id"], r["data"]["argv"][0]))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} of {} tool calls have no exec record with their id (and argv sh -c ...): \
         {:?}...; the exec records' ids and programs: {:?}...",
        missing.len(),
        run.calls.len(),
        &missing[..missing.len().min(3)],
        &seen[..seen.len().min(5)]
    );
    Ok(())
}

/// A `net` record refusing the collector.
fn denial_recorded(records: &[Value]) -> anyhow::Result<()> {
    ensure!(
        records.iter().any(|r| r["kind"] == "net"
            && r["data"]["verdict"] == "deny"
            && r["data"]["host"] == COLLECTOR_HOST),
        "no net record refusing {COLLECTOR_HOST}"
    );
    Ok(())
}

/// Prints each step's time under both runtimes and the totals, with ratios.
fn print_times(entry: EntryPoint, sandbox: &Run, runc: &Run) {
    println!(
        "{}: step kind      agent-sandbox      runc    ratio",
        entry.name()
    );
    for (a, b) in sandbox.calls.iter().zip(&runc.calls) {
        println!(
            "{:>4} {:<8} {:>12.1?} {:>10.1?} {:>7.2}",
            a.step,
            a.kind.name(),
            a.elapsed,
            b.elapsed,
            ratio(a.elapsed, b.elapsed)
        );
    }
    let (a, b) = (sandbox.calls_total(), runc.calls_total());
    println!(
        "calls total {a:.2?} vs {b:.2?} ({:.2}); start + calls {:.2?} vs {:.2?} ({:.2})",
        ratio(a, b),
        sandbox.start,
        runc.start,
        ratio(sandbox.start, runc.start)
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

/// The whole task through `entry`: the runc reference, then agent-sandbox with review and
/// promote; the checks that wait for another branch last.
fn agent_task(entry: EntryPoint, pending_tool_calls: Option<&'static str>) -> anyhow::Result<()> {
    entry.require()?;
    harness::require_file(harness::runtime_bin())?;
    let w = World::start()?;
    let runc = reference(entry, &w)?;

    let co = Checkout::create()?;
    let before = co.snapshot()?;
    let main_before = co.git(&["rev-parse", "main"])?;
    let received = w.collector.received().len();
    let fetches = w.wheel_fetches();
    let mut pending: Vec<Pending> = Vec::new();
    let run = agent_task::run_task(entry, Flavor::Sandbox, &w.setup(&co), &w.steps, |run| {
        let mut wrong = run.mismatches(&w.steps);
        for ((a, b), step) in run.calls.iter().zip(&runc.calls).zip(&w.steps) {
            if !step.is_security() && a.code != b.code {
                wrong.push(format!(
                    "step {} exited {:?} under agent-sandbox, {:?} under runc",
                    a.step, a.code, b.code
                ));
            }
        }
        ensure!(
            wrong.is_empty(),
            "{}: {} step(s) differ:\n{}",
            entry.name(),
            wrong.len(),
            wrong.join("\n")
        );
        let changed = agent_task::changed_paths(&before, &co.snapshot()?);
        ensure!(
            changed.is_empty(),
            "the host checkout changed before promote: {changed:?}"
        );
        ensure!(
            w.collector.received().len() == received,
            "the collector received the sandbox's upload: {:?}",
            w.collector.received()
        );
        ensure!(
            w.wheel_fetches() > fetches,
            "pip did not fetch the wheel through the proxy: {:?}",
            w.index.requests()
        );
        for name in &run.names {
            let found = review_finds(&name.key).with_context(|| format!("by {}", name.what));
            match name.pending {
                None => found?,
                Some(branch) => pending.push(Pending {
                    branch,
                    result: found,
                }),
            }
        }
        let (records, raw) = audit_records(run)?;
        let tagged = every_exec_tagged(run, &records);
        match pending_tool_calls {
            None => tagged?,
            Some(branch) => pending.push(Pending {
                branch,
                result: tagged,
            }),
        }
        let denial = denial_recorded(&records).with_context(|| {
            let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
            for kind in records.iter().filter_map(|r| r["kind"].as_str()) {
                *kinds.entry(kind).or_default() += 1;
            }
            format!("the log of {} has records {kinds:?}", raw.command)
        });
        if entry == EntryPoint::Cri {
            pending.push(Pending {
                branch: "h/names: a pod's net records reachable from its container",
                result: denial,
            });
        } else {
            denial?;
        }
        let verify = run.audit(&["verify"], &[])?;
        ensure!(verify.success(), "audit verify failed\n{verify}");
        Ok(())
    })?;
    print_times(entry, &run, &runc);

    // Removed, and still nothing on the host until promote.
    let changed = agent_task::changed_paths(&before, &co.snapshot()?);
    ensure!(
        changed.is_empty(),
        "the host checkout changed at teardown: {changed:?}"
    );
    let repo = co.repo.display().to_string();
    let promoted = harness::runtime(&["promote", &run.key, "--to", &repo])?;
    ensure!(
        promoted.success() && promoted.stdout.contains("wrote refs/agent-sandbox/"),
        "promote failed\n{promoted}"
    );
    let ops = std::fs::read_to_string(co.repo.join("calc/ops.py"))?;
    ensure!(ops.contains("return a - b"), "calc/ops.py: {ops:?}");
    ensure!(
        co.repo.join("calc/stats.py").exists()
            && co.repo.join("docs/guide.md").exists()
            && !co.repo.join("docs/legacy.md").exists()
            && !co.repo.join("docs/usage.md").exists(),
        "promote did not apply the creates, the rename and the delete\n{promoted}"
    );
    let refs = co.git(&["for-each-ref", "--format=%(refname)", "refs/agent-sandbox/"])?;
    let agent_ref = refs
        .lines()
        .find(|r| r.ends_with("/heads/main"))
        .with_context(|| format!("no refs/agent-sandbox/*/heads/main: {refs:?}\n{promoted}"))?;
    let log = co.git(&["log", "--format=%s", agent_ref])?;
    ensure!(
        log == format!("{}\n{}\ninitial\n", COMMITS[1], COMMITS[0]),
        "the agent's commits under {agent_ref}: {log:?}"
    );
    ensure!(
        co.git(&["rev-parse", "main"])? == main_before,
        "promote moved main without --advance"
    );
    co.git(&["fsck", "--strict", "--no-progress"])?;

    let failed: Vec<String> = pending
        .into_iter()
        .filter_map(|p| p.result.err().map(|e| format!("[{}] {e:#}", p.branch)))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{}: every other check passed; {} check(s) wait for another branch:\n{}",
            entry.name(),
            failed.len(),
            failed.join("\n\n")
        );
    }
    Ok(())
}

#[test]
fn podman_agent_task_matches_runc_and_changes_the_host_only_at_promote() -> anyhow::Result<()> {
    agent_task(EntryPoint::Podman, None)
}

/// Waits for h/names: the exec id as the tool-call id.
#[test]
fn ctr_agent_task_matches_runc_and_changes_the_host_only_at_promote() -> anyhow::Result<()> {
    agent_task(
        EntryPoint::Ctr,
        Some("h/names: ctr's --exec-id as the exec record's tool-call id"),
    )
}

/// Waits for h/names: the argv prefix as the tool-call id, the `POD/CONTAINER` name, the pod's
/// net records. Slow until h/exec (ExecSync waits up to 2 s for the output of a call that
/// prints).
#[test]
fn cri_agent_task_matches_runc_and_changes_the_host_only_at_promote() -> anyhow::Result<()> {
    agent_task(
        EntryPoint::Cri,
        Some(
            "h/names: CRI's argv prefix `env AGENT_SANDBOX_TOOL_CALL_ID=ID` recognised and stripped",
        ),
    )
}

#[test]
fn docker_agent_task_matches_runc_and_changes_the_host_only_at_promote() -> anyhow::Result<()> {
    agent_task(EntryPoint::Docker, None)
}

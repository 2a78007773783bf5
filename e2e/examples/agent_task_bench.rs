//! Agent task benchmark (issue #33): the 50-call task of `agent_sandbox_e2e::agent_task`
//! through each entry point under agent-sandbox and under runc, interleaved round by round
//! (the order alternates) so the machine's drift hits both alike. Prints, per entry point, the
//! median and p90 time of one tool call (all calls, and per kind of call) and of one whole task
//! (container start + 50 calls) under each runtime, with the ratio agent-sandbox / runc, and
//! for CRI issue 33's target (a task at most 1.0x runc); or one JSON document (`--json`, read
//! by `hack/bench-runtime.sh --sections task`).
//!
//! ```sh
//! cargo run --release -p agent-sandbox-e2e --example agent_task_bench -- --rounds 3
//! cargo run --release -p agent-sandbox-e2e --example agent_task_bench -- --entry cri,ctr --json
//! ```
//! Set-up: hack/setup.sh (podman, containerd with the CRI handlers, dockerd, the test images).
//! Every run is checked step by step as the e2e suite checks it (exit codes and outputs); a
//! run that went wrong stops the benchmark, since its times would mean nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use agent_sandbox_e2e::agent_task::{self, Checkout, EntryPoint, Flavor, Run, World};
use agent_sandbox_e2e::harness;
use anyhow::{bail, ensure};
use clap::Parser;
use serde::Serialize;

/// The agent task under agent-sandbox and runc, per entry point.
#[derive(Debug, Parser)]
struct Args {
    /// Entry points, comma-separated: podman, ctr, cri, docker
    #[arg(long, default_value = "podman,ctr,cri,docker", value_delimiter = ',')]
    entry: Vec<String>,
    /// Measured rounds per entry point (each: one task per runtime)
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print one JSON document instead of the tables
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Figures {
    n: usize,
    median_ms: f64,
    p90_ms: f64,
}

impl Figures {
    fn of(xs: &[Duration]) -> Self {
        let mut ms: Vec<f64> = xs.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        // Nearest rank: the smallest sample with at least pct% of the samples at or below it.
        let pick = |pct: usize| {
            let rank = (pct * ms.len()).div_ceil(100).max(1);
            ms.get(rank - 1).copied().unwrap_or(f64::NAN)
        };
        Self {
            n: ms.len(),
            median_ms: pick(50),
            p90_ms: pick(90),
        }
    }
}

/// One measure under both runtimes.
#[derive(Debug, Serialize)]
struct Pair {
    agent_sandbox: Figures,
    runc: Figures,
    /// Median over median.
    ratio: f64,
}

impl Pair {
    fn of(sandbox: &[Duration], runc: &[Duration]) -> Self {
        let (a, b) = (Figures::of(sandbox), Figures::of(runc));
        let ratio = a.median_ms / b.median_ms;
        Self {
            agent_sandbox: a,
            runc: b,
            ratio,
        }
    }
}

#[derive(Debug, Serialize)]
struct EntryReport {
    rounds: usize,
    /// Every tool call.
    per_call: Pair,
    /// Tool calls by kind (read, edit, test, install, ...).
    per_kind: BTreeMap<&'static str, Pair>,
    /// The 50 calls of one task, summed.
    calls_per_task: Pair,
    /// Container start and the 50 calls.
    per_task: Pair,
    /// Issue 33's target, where it sets one (CRI: a task no slower than under runc).
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<Target>,
}

#[derive(Debug, Serialize)]
struct Target {
    text: &'static str,
    limit: f64,
    /// `met` or `missed`.
    verdict: &'static str,
}

impl Target {
    fn for_entry(entry: EntryPoint, per_task: &Pair) -> Option<Self> {
        (entry == EntryPoint::Cri).then_some(Target {
            text: "per task at most 1.0x runc (issue 33)",
            limit: 1.0,
            verdict: if per_task.ratio <= 1.0 {
                "met"
            } else {
                "missed"
            },
        })
    }
}

#[derive(Debug, Default)]
struct Samples {
    calls: Vec<Duration>,
    kinds: BTreeMap<&'static str, Vec<Duration>>,
    calls_per_task: Vec<Duration>,
    tasks: Vec<Duration>,
}

impl Samples {
    fn add(&mut self, run: &Run) {
        for c in &run.calls {
            self.calls.push(c.elapsed);
            self.kinds.entry(c.kind.name()).or_default().push(c.elapsed);
        }
        self.calls_per_task.push(run.calls_total());
        self.tasks.push(run.start);
    }
}

fn entry_point(name: &str) -> anyhow::Result<EntryPoint> {
    EntryPoint::ALL
        .into_iter()
        .find(|e| e.name() == name)
        .ok_or_else(|| anyhow::anyhow!("unknown entry point {name:?} (podman, ctr, cri, docker)"))
}

/// One task under `flavor` in a fresh checkout; its kept change set is discarded.
fn one_task(entry: EntryPoint, flavor: Flavor, world: &World) -> anyhow::Result<Run> {
    let co = Checkout::create()?;
    let steps = &world.steps;
    let run = agent_task::run_task(entry, flavor, &world.setup(&co), steps, |run| {
        let wrong = run.mismatches(steps);
        ensure!(
            wrong.is_empty(),
            "{} under {}: {} step(s) went wrong:\n{}",
            entry.name(),
            flavor.name(),
            wrong.len(),
            wrong.join("\n")
        );
        Ok(())
    })?;
    if flavor == Flavor::Sandbox {
        harness::runtime_ok(&["changes", "discard", &run.key])?;
    }
    Ok(run)
}

fn bench(entry: EntryPoint, rounds: usize, quiet: bool) -> anyhow::Result<EntryReport> {
    entry.require()?;
    let world = World::start()?;
    let (mut ours, mut base) = (Samples::default(), Samples::default());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [Flavor::Sandbox, Flavor::Runc]
        } else {
            [Flavor::Runc, Flavor::Sandbox]
        };
        for flavor in order {
            let run = one_task(entry, flavor, &world)?;
            if !quiet {
                eprintln!(
                    "{} round {}/{rounds} {}: start + 50 calls {:.2?}",
                    entry.name(),
                    round + 1,
                    flavor.name(),
                    run.start
                );
            }
            match flavor {
                Flavor::Sandbox => ours.add(&run),
                Flavor::Runc => base.add(&run),
            }
        }
    }
    let per_kind = ours
        .kinds
        .iter()
        .map(|(k, v)| {
            (
                *k,
                Pair::of(v, base.kinds.get(k).map_or(&[][..], Vec::as_slice)),
            )
        })
        .collect();
    let per_task = Pair::of(&ours.tasks, &base.tasks);
    Ok(EntryReport {
        rounds,
        per_call: Pair::of(&ours.calls, &base.calls),
        per_kind,
        calls_per_task: Pair::of(&ours.calls_per_task, &base.calls_per_task),
        target: Target::for_entry(entry, &per_task),
        per_task,
    })
}

fn print_pair(label: &str, p: &Pair) {
    println!(
        "  {label:<16} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2}",
        p.agent_sandbox.median_ms, p.agent_sandbox.p90_ms, p.runc.median_ms, p.runc.p90_ms, p.ratio
    );
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let entries = args
        .entry
        .iter()
        .map(|e| entry_point(e.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut report = BTreeMap::new();
    for entry in entries {
        let r = bench(entry, args.rounds, args.json)?;
        if !args.json {
            println!(
                "{} ({} rounds; ms; ratio = agent-sandbox median / runc median)",
                entry.name(),
                r.rounds
            );
            println!(
                "  {:<16} {:>9} {:>9} {:>9} {:>9} {:>7}",
                "", "ours p50", "ours p90", "runc p50", "runc p90", "ratio"
            );
            print_pair("per call", &r.per_call);
            for (kind, p) in &r.per_kind {
                print_pair(&format!("  {kind}"), p);
            }
            print_pair("50 calls", &r.calls_per_task);
            print_pair("task", &r.per_task);
            if let Some(t) = &r.target {
                println!(
                    "  target: {}: {} ({:.2})",
                    t.text, t.verdict, r.per_task.ratio
                );
            }
        }
        report.insert(entry.name(), r);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

//! CRI benchmark: pod start (RunPodSandbox + CreateContainer + StartContainer), ExecSync and
//! pod removal (StopPodSandbox + RemovePodSandbox) through containerd's CRI, our handler against
//! the runc handler, interleaved round by round (the order alternates) so that the machine's
//! drift hits both alike. Prints medians, p90s, p95s and ratios (ours / baseline; target <= 1.0), or
//! one JSON document with every sample (`--json`).
//!
//! ExecSync is timed for three commands, as an agent's tool calls print: `true` (nothing),
//! `echo hi` (a few bytes, the process gone before its Start returns) and 1 MiB of output;
//! each call's output is checked whole.
//!
//! ```sh
//! cargo run --release -p agent-sandbox-e2e --example cri_bench -- --rounds 20
//! cargo run --release -p agent-sandbox-e2e --example cri_bench -- --json > cri.json
//! ```
//! Set-up: hack/setup.sh (containerd with the CRI handlers, the pause and test images).
//! Another build: a second containerd with its own `root`, `state`, socket and config, whose
//! handlers name that build's shim by absolute path (`runtime_type = "DIR/containerd-shim-
//! agent-sandbox"`) beside a `runc` one, the images imported into its `k8s.io` namespace;
//! then `AGENT_SANDBOX_CRI_SOCKET=SOCKET cri_bench --handler NAME` (docs/kubernetes.md).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::cri::{self, Cri, Pod, RUNC_HANDLER, container_config, pod_config};
use agent_sandbox_e2e::harness::{BUSYBOX_IMAGE, TOOLS_IMAGE};
use anyhow::{Context, ensure};
use clap::Parser;
use serde::Serialize;

/// Interleaved CRI benchmark of an agent-sandbox handler against the runc handler.
#[derive(Debug, Parser)]
struct Args {
    /// Measured rounds (each: one pod per handler)
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Unmeasured rounds first (caches, lazily started shims)
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// ExecSync calls per pod of each command (`true`, `echo hi`, 1 MiB)
    #[arg(long, default_value_t = 3)]
    execs: usize,
    /// Our handler (default: the one running the build under test, see e2e/src/cri.rs)
    #[arg(long)]
    handler: Option<String>,
    /// The baseline handler
    #[arg(long, default_value = RUNC_HANDLER)]
    baseline: String,
    /// The app container's image (`busybox` or `tools` test image, or any in k8s.io)
    #[arg(long, default_value = BUSYBOX_IMAGE)]
    image: String,
    /// Print one JSON document instead of the table
    #[arg(long)]
    json: bool,
}

/// The measured phases, in the order they run; `pod_start` is the sum of the three calls
/// after it.
const PHASES: [&str; 8] = [
    "pod_start",
    "run_pod_sandbox",
    "create_container",
    "start_container",
    "exec_sync_true",
    "exec_sync_echo",
    "exec_sync_1mib",
    "pod_remove",
];

/// One MiB of output: `head -c 1048576 /dev/zero`, one process (a `yes | head` pipeline
/// would also time how `yes` meets its reader's end).
const MIB: usize = 1 << 20;

/// The ExecSync phases: (phase, command, the whole stdout it must return).
fn exec_cases() -> [(&'static str, Vec<String>, String); 3] {
    let owned = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect();
    [
        ("exec_sync_true", owned(&["true"]), String::new()),
        ("exec_sync_echo", owned(&["echo", "hi"]), "hi\n".to_owned()),
        (
            "exec_sync_1mib",
            owned(&["head", "-c", &MIB.to_string(), "/dev/zero"]),
            "\0".repeat(MIB),
        ),
    ]
}

#[derive(Debug, Default, Serialize)]
struct Summary {
    n: usize,
    median_ms: f64,
    p90_ms: f64,
    p95_ms: f64,
    min_ms: f64,
    samples_ms: Vec<f64>,
}

impl Summary {
    fn of(samples: &[Duration]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        // Nearest rank: the smallest sample with at least pct% of the samples at or below it.
        let at = |pct: usize| -> f64 {
            let rank = (pct * ms.len()).div_ceil(100).max(1);
            ms.get(rank - 1).copied().unwrap_or(f64::NAN)
        };
        Self {
            n: ms.len(),
            median_ms: at(50),
            p90_ms: at(90),
            p95_ms: at(95),
            min_ms: ms.first().copied().unwrap_or(f64::NAN),
            samples_ms: ms,
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    rounds: usize,
    warmup: usize,
    execs_per_pod: usize,
    image: String,
    handler: String,
    baseline: String,
    /// handler -> phase -> summary
    results: BTreeMap<String, BTreeMap<String, Summary>>,
    /// phase -> median(handler) / median(baseline)
    ratios: BTreeMap<String, f64>,
}

type Samples = BTreeMap<&'static str, Vec<Duration>>;

/// One pod of `handler`: start it, exec in it, remove it; appends the timings.
fn round(cri: &Cri, handler: &str, args: &Args, samples: &mut Samples) -> anyhow::Result<()> {
    let config = pod_config("bench", &[]);
    let app = container_config("app", &args.image, &["sleep", "3600"], &[]);
    // pod_start and its three calls (RunPodSandbox, CreateContainer, StartContainer).
    let start = Instant::now();
    let pod = Pod::run(cri, config, handler)?;
    let ran = Instant::now();
    let id = pod.create(&app)?;
    let created = Instant::now();
    cri.start_container(&id)?;
    let started = Instant::now();
    for (phase, took) in [
        ("pod_start", started - start),
        ("run_pod_sandbox", ran - start),
        ("create_container", created - ran),
        ("start_container", started - created),
    ] {
        samples.entry(phase).or_default().push(took);
    }
    for _ in 0..args.execs {
        for (phase, cmd, want) in exec_cases() {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let start = Instant::now();
            let exec = cri.exec_sync(&id, &cmd, 30)?;
            let took = start.elapsed();
            ensure!(
                exec.exit_code == 0 && exec.stdout == want,
                "ExecSync {phase} under {handler}: exit {}, {} of {} bytes of output (stderr {:?})",
                exec.exit_code,
                exec.stdout.len(),
                want.len(),
                exec.stderr
            );
            samples.entry(phase).or_default().push(took);
        }
    }
    let start = Instant::now();
    pod.remove()?;
    samples
        .entry("pod_remove")
        .or_default()
        .push(start.elapsed());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    let cri = Cri::connect()?;
    cri.require_image(cri::PAUSE_IMAGE)?;
    cri.require_image(&args.image)?;
    if args.image != TOOLS_IMAGE && args.image != BUSYBOX_IMAGE {
        eprintln!("cri_bench: image {} is not a test image", args.image);
    }
    let handler = match &args.handler {
        Some(h) => h.clone(),
        None => cri::sandbox_handler()?,
    };
    let handlers = [handler.clone(), args.baseline.clone()];
    let samples = measure(&cri, &args, &handlers)?;
    let (results, ratios) = summarise(&samples, &handler, &args.baseline);
    let report = Report {
        rounds: args.rounds,
        warmup: args.warmup,
        execs_per_pod: args.execs,
        image: args.image.clone(),
        handler: handler.clone(),
        baseline: args.baseline.clone(),
        results,
        ratios,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_report(&report, &handlers);
    Ok(())
}

/// The rounds (warm-up ones not kept), each handler's pod in turn: the samples of each
/// handler's phases.
fn measure(
    cri: &Cri,
    args: &Args,
    handlers: &[String; 2],
) -> anyhow::Result<BTreeMap<String, Samples>> {
    let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
    for i in 0..args.warmup + args.rounds {
        let measured = i >= args.warmup;
        // Alternate which handler goes first, so neither always runs on a warmer machine.
        let order = if i % 2 == 0 {
            [&handlers[0], &handlers[1]]
        } else {
            [&handlers[1], &handlers[0]]
        };
        for h in order {
            let mut scratch = Samples::new();
            round(cri, h, args, &mut scratch)
                .with_context(|| format!("round {i} with handler {h}"))?;
            if measured {
                let into = samples.entry(h.clone()).or_default();
                for (phase, v) in scratch {
                    into.entry(phase).or_default().extend(v);
                }
            }
        }
        if !args.json {
            eprint!("\rcri_bench: round {}/{}", i + 1, args.warmup + args.rounds);
        }
    }
    if !args.json {
        eprintln!();
    }

    Ok(samples)
}

type Results = BTreeMap<String, BTreeMap<String, Summary>>;

/// Each handler's summary per phase, and each phase's ratio of `handler`'s median to the
/// `baseline`'s.
fn summarise(
    samples: &BTreeMap<String, Samples>,
    handler: &str,
    baseline: &str,
) -> (Results, BTreeMap<String, f64>) {
    let mut results = BTreeMap::new();
    for (h, phases) in samples {
        let per: BTreeMap<String, Summary> = phases
            .iter()
            .map(|(p, v)| ((*p).to_owned(), Summary::of(v)))
            .collect();
        results.insert(h.clone(), per);
    }
    let mut ratios = BTreeMap::new();
    for phase in PHASES {
        let median = |h: &str| {
            results
                .get(h)
                .and_then(|r| r.get(phase))
                .map(|s| s.median_ms)
        };
        if let (Some(ours), Some(base)) = (median(handler), median(baseline)) {
            ratios.insert(phase.to_owned(), ours / base);
        }
    }
    (results, ratios)
}

/// The table and the ratios, for a person.
fn print_report(report: &Report, handlers: &[String; 2]) {
    println!(
        "CRI benchmark: {} rounds (+{} warm-up), interleaved, image {}, {} ExecSync per pod and command",
        report.rounds, report.warmup, report.image, report.execs_per_pod
    );
    println!(
        "{:<16} {:<24} {:>10} {:>10} {:>10} {:>10} {:>5}",
        "phase", "handler", "median ms", "p90 ms", "p95 ms", "min ms", "n"
    );
    for phase in PHASES {
        for h in handlers {
            if let Some(s) = report.results.get(h).and_then(|r| r.get(phase)) {
                println!(
                    "{phase:<16} {h:<24} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>5}",
                    s.median_ms, s.p90_ms, s.p95_ms, s.min_ms, s.n
                );
            }
        }
    }
    for (phase, ratio) in &report.ratios {
        println!(
            "ratio {phase:<16} {} / {}: {ratio:.2}",
            report.handler, report.baseline
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let d: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let s = Summary::of(&d);
        assert_eq!(s.n, 10);
        assert!((s.median_ms - 5.0).abs() < 1e-9);
        assert!((s.p90_ms - 9.0).abs() < 1e-9);
        assert!((s.p95_ms - 10.0).abs() < 1e-9);
        assert!((s.min_ms - 1.0).abs() < 1e-9);
        assert!(Summary::of(&[]).median_ms.is_nan());
    }
}

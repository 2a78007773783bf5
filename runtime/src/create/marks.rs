//! The wall and CPU time of each phase of `create` (docs/benchmarks.md, "Where the time
//! goes"): debug-level events, and with `AGENT_SANDBOX_PHASE_TRACE=FILE` in the runtime's
//! environment one JSON line per `create` appended to FILE, which `hack/bench-runtime.sh`
//! aggregates. A trace that cannot be written never fails the create.

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The environment variable naming the trace file.
pub const TRACE_ENV: &str = "AGENT_SANDBOX_PHASE_TRACE";

/// One phase: the time from the previous mark (or the start of `create`) to its own.
#[derive(Debug, Clone, serde::Serialize)]
struct Phase {
    phase: &'static str,
    /// `None` for `startup`, whose start this process cannot tell precisely.
    wall_ms: Option<f64>,
    cpu_ms: f64,
}

/// The clock of one `create`; each [`Marks::mark`] ends a phase.
pub(super) struct Marks {
    start: Instant,
    last: RefCell<(Instant, Duration)>,
    phases: RefCell<Vec<Phase>>,
}

/// User + system CPU time of this process so far, all threads, across the sealed copy's
/// `execve` (resource usage survives it).
fn cpu_now() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Marks {
    /// Starts the clock; the CPU spent before (the binary's start, its sealed copy and
    /// argument parsing) is the `startup` phase.
    pub(super) fn start() -> Self {
        let now = Instant::now();
        let cpu = cpu_now();
        Self {
            start: now,
            last: RefCell::new((now, cpu)),
            phases: RefCell::new(vec![Phase {
                phase: "startup",
                wall_ms: None,
                cpu_ms: ms(cpu),
            }]),
        }
    }

    /// Ends the phase named `phase`.
    pub(super) fn mark(&self, phase: &'static str) {
        let (now, cpu) = (Instant::now(), cpu_now());
        let (then, cpu_then) = self.last.replace((now, cpu));
        let wall = ms(now - then);
        let used = ms(cpu.saturating_sub(cpu_then));
        tracing::debug!(
            phase,
            ms = ms(now - self.start),
            wall_ms = wall,
            cpu_ms = used,
            "create phase"
        );
        self.phases.borrow_mut().push(Phase {
            phase,
            wall_ms: Some(wall),
            cpu_ms: used,
        });
    }

    /// Appends the trace line of this create of `id` to the file `AGENT_SANDBOX_PHASE_TRACE`
    /// names, if it is set.
    pub(super) fn finish(&self, id: &str, ok: bool) {
        let Some(path) = std::env::var_os(TRACE_ENV) else {
            return;
        };
        let line = serde_json::json!({
            "op": "create",
            "id": id,
            "ok": ok,
            "phases": *self.phases.borrow(),
        });
        let write = || -> std::io::Result<()> {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            // One write: lines of concurrent creates do not interleave (O_APPEND).
            f.write_all(format!("{line}\n").as_bytes())
        };
        if let Err(e) = write() {
            tracing::debug!(error = %e, path = %std::path::Path::new(&path).display(), "cannot write the phase trace");
        }
    }

    #[cfg(test)]
    fn names(&self) -> Vec<&'static str> {
        self.phases.borrow().iter().map(|p| p.phase).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mark_ends_a_phase_with_its_own_wall_and_cpu_time() {
        let marks = Marks::start();
        let busy = Instant::now();
        let mut x = 0u64;
        while busy.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        marks.mark("busy");
        std::thread::sleep(Duration::from_millis(20));
        marks.mark("idle");
        assert_eq!(marks.names(), ["startup", "busy", "idle"]);
        let p = marks.phases.borrow();
        assert!(p[0].wall_ms.is_none());
        let (busy, idle) = (&p[1], &p[2]);
        assert!(busy.wall_ms.is_some_and(|w| w >= 20.0), "{busy:?}");
        assert!(idle.wall_ms.is_some_and(|w| w >= 20.0), "{idle:?}");
        // Spinning uses CPU, sleeping does not (the clock ticks per 1-4 ms at worst).
        assert!(busy.cpu_ms > idle.cpu_ms, "{busy:?} vs {idle:?}");
    }
}

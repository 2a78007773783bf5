"""The benchmark sections that are not interleaved rounds of one command: the proxy's own
benchmark (runtime/proxy/examples/bench.rs), the CRI benchmark (e2e/examples/cri_bench.rs,
when it exists), sandbox density, the criterion micro-benchmarks, and the PNG chart.

Each `run_*` returns a dict stored under `sections.<key>` of the JSON result; a part that
cannot run says why in `status` and never gets a number.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cargo() -> str | None:
    return shutil.which("cargo") or (str(Path.home() / ".cargo/bin/cargo") if (Path.home() / ".cargo/bin/cargo").exists() else None)


# A benchmark run never reaches the network: cargo builds from what is already fetched
# (`--frozen` is `--locked --offline`) and rustup does not install a missing toolchain.
OFFLINE_ENV = {"CARGO_NET_OFFLINE": "true", "RUSTUP_AUTO_INSTALL": "0"}


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    if Path(argv[0]).name == "cargo":
        argv = [argv[0], argv[1], "--frozen", *argv[2:]]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **OFFLINE_ENV})


# --- proxy ----------------------------------------------------------------------------------


def run_proxy(args) -> dict:
    """`cargo run --release -p agent-sandbox-proxy --example bench -- MB REQUESTS ROUNDS`: the
    proxy helper's own interleaved comparison with direct loopback. Its lines are kept as
    printed, and the `ratio`/`added` figures parsed out of them."""
    cargo = _cargo()
    if not cargo:
        return {"status": "missing", "error": "cargo is not installed"}
    example = REPO / "runtime/proxy/examples/bench.rs"
    if not example.exists():
        return {"status": "missing", "error": f"{example} does not exist"}
    argv = [cargo, "run", "--release", "--quiet", "-p", "agent-sandbox-proxy", "--example", "bench", "--",
            str(args.proxy_mb), str(args.proxy_requests), str(args.proxy_rounds)]
    out = _run(argv, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    result: dict = {"command": argv[1:], "status": "ok" if out.returncode == 0 else "failed", "output": lines}
    if out.returncode != 0:
        result["error"] = out.stderr.strip()[-2000:]
    figures = {}
    # "bulk throughput ratio (proxied/direct, 100 MB): 0.414 (target ...)",
    # "added per small request (1000 requests): 0.455 ms (target ...)"
    for line in lines:
        low = line.lower()
        for key, pattern in (("throughput_ratio", r"throughput ratio[^:]*:\s*([0-9.]+)"), ("added_ms_per_request", r"added per small request[^:]*:\s*(-?[0-9.]+)\s*ms")):
            m = re.search(pattern, low)
            if m and key not in figures:
                figures[key] = float(m.group(1))
    result["figures"] = figures
    return result


# --- CRI ------------------------------------------------------------------------------------


def run_cri(args) -> dict:
    """e2e/examples/cri_bench.rs --json (written by the CRI work), if it exists."""
    return _run_example("cri_bench", [], timeout=3600)


def _run_example(name: str, argv_tail: list[str], timeout: float) -> dict:
    """`cargo run --release -p agent-sandbox-e2e --example NAME -- --json ARGS...`, whose
    output is one pretty-printed JSON document."""
    example = REPO / f"e2e/examples/{name}.rs"
    if not example.exists():
        return {"status": "not yet", "error": f"{example.relative_to(REPO)} does not exist yet"}
    cargo = _cargo()
    if not cargo:
        return {"status": "missing", "error": "cargo is not installed"}
    argv = [cargo, "run", "--release", "--quiet", "-p", "agent-sandbox-e2e", "--example", name, "--", "--json", *argv_tail]
    out = _run(argv, timeout=timeout)
    if out.returncode != 0:
        return {"status": "failed", "command": argv[1:], "error": (out.stderr or out.stdout).strip()[-2000:]}
    try:
        # Parse from the first brace: cargo may print a line before it.
        data = json.loads(out.stdout[out.stdout.index("{"):])
    except (json.JSONDecodeError, ValueError) as e:
        return {"status": "failed", "command": argv[1:], "error": f"output is not JSON ({e}): {out.stdout[-1000:]}"}
    return {"status": "ok", "command": argv[1:], "result": data}


# --- the agent task -------------------------------------------------------------------------


def run_task(args) -> dict:
    """e2e/examples/agent_task_bench.rs --json: the 50-call agent task of issue #33 through each
    entry point under agent-sandbox and runc. BENCH_TASK_ROUNDS (default 3) and
    BENCH_TASK_ENTRIES (default podman,ctr,cri,docker) choose what runs; the binaries are the
    e2e harness's (AGENT_SANDBOX_BIN_DIR, default /usr/local/bin)."""
    rounds = os.environ.get("BENCH_TASK_ROUNDS", "3")
    entries = os.environ.get("BENCH_TASK_ENTRIES", "podman,ctr,cri,docker")
    return _run_example("agent_task_bench", ["--rounds", rounds, "--entry", entries], timeout=7200)


# --- density --------------------------------------------------------------------------------


def _meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run_density(args, ctr_cmd, runtimes: list[tuple[str, str, str]]) -> dict:
    """For each runtime in turn: start detached sleeping sandboxes up to each level (50,
    200, 500 by default, capped at --density-max), and at each level time --density-probe
    further starts (`ctr run -d`, the container is then removed). Records the memory the
    running sandboxes take (MemAvailable before and at the level) and every failure. All
    containers are removed at the end, also on error."""
    levels = sorted({int(x) for x in args.density_levels.split(",") if x.strip()})
    capped = [lv for lv in levels if lv <= args.density_max]
    result: dict = {
        "levels_asked": levels,
        "levels_run": capped,
        "cap": args.density_max,
        "probe_starts_per_level": args.density_probe,
        "rows": [],
    }
    if capped != levels:
        result["note"] = (f"levels above {args.density_max} skipped (--density-max): this 2-CPU machine is shared; "
                          "raise --density-max to run them")
    for name, runtime, _shim in runtimes:
        row: dict = {"name": name, "runtime": runtime, "levels": [], "status": "ok"}
        ids: list[str] = []
        prefix = f"dens-{os.getpid()}-{name}"
        avail0 = _meminfo_kib("MemAvailable")
        try:
            for level in capped:
                while len(ids) < level:
                    cid = f"{prefix}-{len(ids)}"
                    out = subprocess.run(ctr_cmd("run", "-d", "--runtime", runtime, args.image, cid, "sleep", "3600"),
                                         capture_output=True, text=True, timeout=120, check=False)
                    ids.append(cid)
                    if out.returncode != 0:
                        raise RuntimeError(f"start {len(ids)} failed: {out.stderr.strip()[-500:]}")
                time.sleep(2)
                avail = _meminfo_kib("MemAvailable")
                times = []
                for k in range(args.density_probe):
                    cid = f"{prefix}-probe-{level}-{k}"
                    t0 = time.perf_counter_ns()
                    out = subprocess.run(ctr_cmd("run", "-d", "--runtime", runtime, args.image, cid, "sleep", "3600"),
                                         capture_output=True, text=True, timeout=120, check=False)
                    t1 = time.perf_counter_ns()
                    _remove(ctr_cmd, cid)
                    if out.returncode != 0:
                        raise RuntimeError(f"probe start at {level} failed: {out.stderr.strip()[-500:]}")
                    times.append((t1 - t0) / 1e6)
                row["levels"].append({
                    "running": level,
                    "start_ms": {"median": statistics.median(times), "min": min(times), "max": max(times), "samples": times},
                    "mem_available_drop_kib": avail0 - avail,
                    "kib_per_sandbox": round((avail0 - avail) / level, 1) if level else None,
                })
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            row["status"] = "failed"
            row["error"] = str(e)
            row["running_when_failed"] = len(ids)
        finally:
            for cid in ids:
                _remove(ctr_cmd, cid)
        if row["levels"]:
            per = row["levels"][-1]["kib_per_sandbox"]
            if per and per > 0:
                row["estimated_fit"] = int(avail0 / per)
        result["rows"].append(row)
    return result


def _remove(ctr_cmd, cid: str) -> None:
    for argv in (("task", "kill", "--signal", "SIGKILL", cid), ("task", "delete", "--force", cid), ("containers", "delete", cid)):
        subprocess.run(ctr_cmd(*argv), capture_output=True, timeout=60, check=False)


# --- criterion ------------------------------------------------------------------------------


def run_criterion(args) -> dict:
    """`cargo bench -p agent-sandbox-policy --bench policy`: policy compilation and allowlist
    matching. Keeps criterion's point estimate (the middle of its interval) per benchmark."""
    cargo = _cargo()
    if not cargo:
        return {"status": "missing", "error": "cargo is not installed"}
    argv = [cargo, "bench", "-p", "agent-sandbox-policy", "--bench", "policy", "--",
            "--warm-up-time", "1", "--measurement-time", str(args.criterion_seconds)]
    out = _run(argv, timeout=1800)
    if out.returncode != 0:
        return {"status": "failed", "command": argv[1:], "error": out.stderr.strip()[-2000:]}
    text = out.stdout
    figures = {}
    unit = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
    for m in re.finditer(r"^(\S[^\n]*?)\s+time:\s+\[([0-9.]+) (\S+) ([0-9.]+) (\S+) ([0-9.]+) (\S+)\]", text, re.M):
        figures[m.group(1).strip()] = round(float(m.group(4)) * unit.get(m.group(5), 1.0), 4)
    # criterion prints a long name on its own line, then the figures on the next.
    for m in re.finditer(r"^(\S[^\n]*)\n\s+time:\s+\[([0-9.]+) (\S+) ([0-9.]+) (\S+) ([0-9.]+) (\S+)\]", text, re.M):
        figures[m.group(1).strip()] = round(float(m.group(4)) * unit.get(m.group(5), 1.0), 4)
    return {"status": "ok", "command": argv[1:], "unit": "µs", "estimates": figures}


# --- chart ----------------------------------------------------------------------------------


def render_chart(result: dict, path: Path) -> str:
    """A PNG with one panel per timed section (median bars, p90 whiskers), shim memory,
    density and the criterion estimates. Needs python3-matplotlib (Debian)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "python3-matplotlib is not installed: no chart"
    panels = []
    for key, sec in result["sections"].items():
        rows = [r for r in sec.get("rows", []) if r.get("status") == "ok" and "stats_ms" in r]
        if rows:
            panels.append(("timed", key, sec.get("title", key), rows))
        mem = sec.get("shim_memory")
        if mem and any(r.get("status") == "ok" for r in mem.get("rows", [])):
            panels.append(("shim", key, "shim memory per running container (KiB)", mem["rows"]))
    dens = result["sections"].get("density")
    if dens and any(r.get("levels") for r in dens.get("rows", [])):
        panels.append(("density", "density", "ctr run -d latency with N sandboxes running (ms)", dens["rows"]))
    crit = result["sections"].get("criterion")
    if crit and crit.get("estimates"):
        panels.append(("criterion", "criterion", "policy micro-benchmarks (µs, log)", crit["estimates"]))
    if not panels:
        return "nothing to chart"
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (kind, key, title, data) in zip(axes[:, 0], panels):
        if kind == "timed":
            names = [r["name"] + (f" ({r['view']} view)" if r.get("view") not in (None, "host") and "view" not in r["name"] else "") for r in data]
            med = [r["stats_ms"]["median"] for r in data]
            p90 = [r["stats_ms"]["p90"] - r["stats_ms"]["median"] for r in data]
            ax.barh(names, med, xerr=[[0] * len(med), p90], color="#4c72b0")
            ax.set_xlabel("ms (median, whisker to p90)")
        elif kind == "shim":
            ok = [r for r in data if r.get("status") == "ok"]
            names = [r["name"] for r in ok]
            ax.barh([n + " RSS" for n in names], [r["rss_kib"]["median"] for r in ok], color="#dd8452")
            ax.barh([n + " PSS" for n in names], [r["pss_kib"]["median"] for r in ok], color="#55a868")
            ax.set_xlabel("KiB (median)")
        elif kind == "density":
            for r in data:
                xs = [lv["running"] for lv in r["levels"]]
                ys = [lv["start_ms"]["median"] for lv in r["levels"]]
                ax.plot(xs, ys, marker="o", label=r["name"])
            ax.set_xlabel("sandboxes running")
            ax.legend()
        else:
            names = list(data)
            ax.barh(names, [data[n] for n in names], color="#8172b2")
            ax.set_xscale("log")
        ax.set_title(f"{key}: {title}", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
    fig.suptitle(f"agent-sandbox benchmarks, {result.get('started', '')}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return f"chart: {path}"

#!/usr/bin/env python3
"""Interleaved start-latency benchmark: agent-sandbox against crun and runc.

Run through hack/bench-runtime.sh, which installs the packages this needs. Only the
Python standard library is used, so the system python3 runs it.

Method. A *section* is a set of *cases* measured against each other (for example
"runtime lifecycle": agent-sandbox, crun, runc). Each round runs every case of the
section once, in an order rotated by one every round; so every case sees the same
machine drift, and no case always runs first or last. Each sample is the wall time
of one whole operation on a monotonic clock; the runtime cases also record the time
of each phase (create, start, wait, delete), which is where profiling starts when a
figure misses its target. Warm-up iterations run first and are not recorded; a
case that fails there (or later) is reported as failed with the runtime's own error
text, and never gets a number.

The cgroup view. This machine's cgroups are hybrid: v1 controllers under
/sys/fs/cgroup/<ctrl> and a cgroup2 tree at /sys/fs/cgroup/unified holding only
hugetlb. crun 1.8 refuses that layout ("cgroups in hybrid mode not supported"),
even with --cgroup-manager=disabled. So crun runs in a private mount namespace in
which the cgroup2 mount is detached (the "v1" view: the same v1 controllers, no
unified tree; the host is not changed). The harness enters that namespace with
setns(2) before it starts the timer, so crun pays no extra process. runc runs in
both views, interleaved, as a control that shows what the view itself costs.

Adding a section for issue 8 (ctr, CRI, proxy, density): write a Case subclass
whose run_once() returns a Sample, and a function that builds the Section; list it
in SECTIONS.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import platform
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extra as bench_extra  # noqa: E402  (hack/bench/extra.py: proxy, CRI, density, criterion, chart)
import sandbox_pss  # noqa: E402  (hack/bench/sandbox_pss.py: PSS of a sandbox's processes)

# --- Linux primitives (ctypes; Python 3.11 has no os.setns) -------------------------

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def set_child_subreaper(on: bool) -> None:
    """Makes orphaned descendants (container inits) our children, so we reap them.

    PID 1 on this machine is not a reaping init, and a container init whose runtime
    has exited would otherwise stay a zombie.
    """
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Views:
    """The mount namespaces the cases run in: "host" and, on hybrid cgroups, "v1"."""

    def __init__(self, hybrid: bool) -> None:
        self.fds = {"host": os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)}
        self.current = "host"
        if hybrid:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
            _check(_libc.umount2(b"/sys/fs/cgroup/unified", MNT_DETACH), "umount /sys/fs/cgroup/unified")
            self.fds["v1"] = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            self.enter("host")

    def enter(self, view: str) -> None:
        if view != self.current:
            _check(_libc.setns(self.fds[view], CLONE_NEWNS), f"setns({view})")
            os.chdir("/")
            self.current = view


# --- machine description -------------------------------------------------------------


def read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cgroup_layout() -> dict:
    mounts = [line.split() for line in read("/proc/self/mounts").splitlines()]
    v1 = sorted(
        opt
        for m in mounts
        if m[2] == "cgroup"
        for opt in m[3].split(",")
        if opt not in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec")
    )
    v2 = [m[1] for m in mounts if m[2] == "cgroup2"]
    unified_controllers = read(f"{v2[0]}/cgroup.controllers").split() if v2 else []
    if v1 and v2:
        layout = "hybrid"
    elif v2:
        layout = "unified (v2)"
    else:
        layout = "legacy (v1)"
    return {"layout": layout, "v1_controllers": v1, "cgroup2_mounts": v2, "cgroup2_controllers": unified_controllers}


def first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else f"unavailable (exit {out.returncode})"


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines() if line.startswith("model name")), "")
    mem_kib = next((int(line.split()[1]) for line in read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), 0)
    os_name = next((line.split("=", 1)[1].strip('"') for line in read("/etc/os-release").splitlines() if line.startswith("PRETTY_NAME=")), "")
    return {
        "os": os_name,
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_mib": mem_kib // 1024,
        "cgroups": cgroup_layout(),
        "systemd": Path("/run/systemd/system").is_dir(),
        "loadavg": read("/proc/loadavg").split()[:3],
    }


# --- samples and statistics ----------------------------------------------------------


@dataclass
class Sample:
    total_ns: int
    phases_ns: dict[str, int] = field(default_factory=dict)
    # CPU time (user + system) of every process the operation ran, where all of them
    # are reaped by the harness; None where some escape (podman's conmon daemonizes).
    cpu_ns: int | None = None
    # The runtime's own per-phase trace of its create (AGENT_SANDBOX_PHASE_TRACE):
    # phase -> (wall ms or None, cpu ms), with "outside phases" = the create command's
    # wall time not inside any phase (process start, exit) and "create command" = its CPU.
    create_trace: dict[str, tuple[float | None, float]] = field(default_factory=dict)


def children_cpu_ns() -> int:
    """User + system time of all reaped descendants so far (the kernel's precise runtime)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round((ru.ru_utime + ru.ru_stime) * 1e9)


class CaseFailed(Exception):
    pass


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values_ms: list[float]) -> dict:
    s = sorted(values_ms)
    return {
        "n": len(s),
        "median": round(statistics.median(s), 3),
        "p90": round(percentile(s, 0.9), 3),
        "min": round(s[0], 3),
        "max": round(s[-1], 3),
        "mean": round(statistics.fmean(s), 3),
    }


# --- cases -----------------------------------------------------------------------------


class Case:
    """One thing measured. Subclasses set name/view and implement run_once()."""

    name = ""
    view = "host"
    reference = False  # shown for context, not a competitor (e.g. the harness floor)

    def __init__(self) -> None:
        self.status = "ok"
        self.error = ""
        self.samples: list[Sample | None] = []  # index = round; None = did not run

    def unavailable(self) -> str:
        """A reason this case cannot run at all here, or ""."""
        return ""

    def run_once(self, tag: str) -> Sample:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


def wait_exact(proc: subprocess.Popen, timeout: float) -> int:
    """Waits for `proc` to exit, waking the moment it does; its exit code.

    Not `subprocess.run(..., timeout=)` nor `Popen.wait(timeout=)`: with a timeout (and no
    pipes to read), CPython polls `waitpid(WNOHANG)` with sleeps doubling from 0.5 ms up to
    50 ms, so a command is seen to end only at 15.5, 31.5, 63.5, 113.5, 163.5 ... ms after
    its start. That quantised every figure of this harness before (ctr samples of both
    runtimes at 113.9 ms exactly). A pidfd becomes readable when the process exits.
    """
    pidfd = os.pidfd_open(proc.pid)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(pidfd)
    return proc.wait()


class CommandRunner:
    """Runs commands with stdin/stdout on /dev/null and stderr in a file.

    stderr goes to a file, not a pipe: the container init inherits the runtime's
    stdio, and a pipe would stay open until the container exits.
    """

    def __init__(self, workdir: Path, name: str, timeout: float) -> None:
        self.err = open(workdir / f"{name}.stderr", "w+b")  # noqa: SIM115 (closed at exit)
        self.timeout = timeout

    def __call__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.err.seek(0)
        self.err.truncate()
        try:
            rc = wait_exact(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err, env=env), self.timeout)
        except subprocess.TimeoutExpired as e:
            raise CaseFailed(f"`{' '.join(argv)}` did not finish within {self.timeout:.0f} s") from e
        except OSError as e:
            raise CaseFailed(f"`{argv[0]}`: {e}") from e
        if rc != 0:
            self.err.seek(0)
            text = self.err.read().decode(errors="replace").strip()
            raise CaseFailed(f"`{' '.join(argv)}` exited {rc}: {text[-600:] or '(no stderr)'}")


class LifecycleCase(Case):
    """create --pid-file, start, wait for the init to exit (pidfd), delete."""

    def __init__(self, name: str, binary: str | None, view: str, bundle: Path, workdir: Path, global_args: list[str] | None = None,
                 phase_trace: bool = False) -> None:
        super().__init__()
        self.name = name
        self.binary = binary
        self.view = view
        self.bundle = bundle
        slug = name.replace(" ", "-").replace("(", "").replace(")", "")
        self.root = workdir / f"root-{slug}"
        self.pidfile = workdir / f"{slug}.pid"
        self.global_args = [*(global_args or []), "--root", str(self.root)]
        self.run = CommandRunner(workdir, slug, timeout=30)
        self.last_id = ""
        # agent-sandbox appends each create's phases to this file (runtime/src/create/marks.rs).
        self.trace = workdir / f"{slug}.phases.jsonl" if phase_trace else None

    def unavailable(self) -> str:
        if not self.binary:
            return "binary not found"
        if not os.access(self.binary, os.X_OK):
            return f"{self.binary} is not installed"
        return ""

    def cmd(self, *args: str) -> list[str]:
        return [self.binary, *self.global_args, *args]

    def run_once(self, tag: str) -> Sample:
        cid = f"bench-{os.getpid()}-{tag}"
        self.last_id = cid
        self.pidfile.unlink(missing_ok=True)
        reap_children()
        c0 = children_cpu_ns()
        env = None
        if self.trace:
            self.trace.unlink(missing_ok=True)
            env = {**os.environ, "AGENT_SANDBOX_PHASE_TRACE": str(self.trace)}
        t0 = time.perf_counter_ns()
        self.run(self.cmd("create", "--bundle", str(self.bundle), "--pid-file", str(self.pidfile), cid), env)
        t1 = time.perf_counter_ns()
        create_trace = self.read_trace(cid, t1 - t0, children_cpu_ns() - c0) if self.trace else {}
        try:
            pid = int(self.pidfile.read_text().strip())
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError) as e:
            raise CaseFailed(f"create succeeded but the pid file {self.pidfile} is unusable: {e}") from e
        try:
            self.run(self.cmd("start", cid))
            t2 = time.perf_counter_ns()
            if not select.select([pidfd], [], [], 30)[0]:
                raise CaseFailed(f"the container's /bin/true (pid {pid}) did not exit within 30 s of start")
            t3 = time.perf_counter_ns()
        finally:
            os.close(pidfd)
        self.run(self.cmd("delete", cid))
        t4 = time.perf_counter_ns()
        reap_children()
        self.last_id = ""
        phases = {"create": t1 - t0, "start": t2 - t1, "wait": t3 - t2, "delete": t4 - t3}
        return Sample(t4 - t0, phases, children_cpu_ns() - c0, create_trace)

    def read_trace(self, cid: str, wall_ns: int, cpu_ns: int) -> dict[str, tuple[float | None, float]]:
        """The phases of create `cid` from the runtime's trace line; none from a build older
        than the trace (no file)."""
        if not self.trace.exists():
            return {}
        try:
            lines = [json.loads(x) for x in self.trace.read_text().splitlines() if x.strip()]
            line = next(x for x in reversed(lines) if x.get("op") == "create" and x.get("id") == cid)
            got = {p["phase"]: (p["wall_ms"], p["cpu_ms"]) for p in line["phases"]}
        except (OSError, ValueError, KeyError, StopIteration) as e:
            raise CaseFailed(f"no phase trace of create {cid} in {self.trace}: {e}") from e
        inside = sum(w for w, _ in got.values() if w is not None)
        got["outside phases"] = (round(ms(wall_ns) - inside, 3), 0.0)
        got["create command"] = (round(ms(wall_ns), 3), round(ms(cpu_ns), 3))
        return got

    def cleanup(self) -> None:
        if self.last_id and self.binary:
            subprocess.run(self.cmd("delete", "--force", self.last_id), capture_output=True, timeout=30, check=False)
            self.last_id = ""
        reap_children()


class FloorCase(Case):
    """What the harness itself costs: three fork+exec of /bin/true (as for create, start, delete)."""

    reference = True

    def __init__(self, workdir: Path) -> None:
        super().__init__()
        self.name = "harness floor"
        self.run = CommandRunner(workdir, "floor", timeout=10)

    def run_once(self, tag: str) -> Sample:
        c0 = children_cpu_ns()
        t0 = time.perf_counter_ns()
        for _ in range(3):
            self.run(["/bin/true"])
        return Sample(time.perf_counter_ns() - t0, cpu_ns=children_cpu_ns() - c0)


class PodmanCase(Case):
    """podman run --rm --network none IMAGE true, with --runtime PATH."""

    def __init__(self, name: str, runtime: str | None, view: str, image: str, workdir: Path) -> None:
        super().__init__()
        self.name = name
        self.runtime = runtime
        self.view = view
        self.image = image
        slug = "podman-" + name.replace(" ", "-").replace("(", "").replace(")", "")
        self.run = CommandRunner(workdir, slug, timeout=120)
        self.last_name = ""

    def unavailable(self) -> str:
        if not shutil.which("podman"):
            return "podman is not installed"
        if not self.runtime:
            return "runtime binary not found"
        if not os.access(self.runtime, os.X_OK):
            return f"{self.runtime} is not installed"
        if subprocess.run(["podman", "image", "exists", self.image], capture_output=True, timeout=60, check=False).returncode != 0:
            return f"image {self.image} is not in podman's store (hack/setup.sh builds and loads it)"
        return ""

    def run_once(self, tag: str) -> Sample:
        cname = f"bench-{os.getpid()}-{tag}"
        self.last_name = cname
        t0 = time.perf_counter_ns()
        self.run(["podman", "run", "--rm", "--pull", "never", "--network", "none", "--runtime", self.runtime, "--name", cname, self.image, "true"])
        t1 = time.perf_counter_ns()
        self.last_name = ""
        reap_children()
        return Sample(t1 - t0)

    def cleanup(self) -> None:
        if self.last_name:
            subprocess.run(["podman", "rm", "--force", "--ignore", self.last_name], capture_output=True, timeout=60, check=False)
            self.last_name = ""
        reap_children()


# --- sections --------------------------------------------------------------------------


class CtrRunCase(Case):
    """ctr run --rm --runtime RUNTIME IMAGE ID true, through the running containerd."""

    def __init__(self, name: str, runtime: str, shim: str, ctr: CtrClient, workdir: Path) -> None:
        super().__init__()
        self.name = name
        self.runtime = runtime
        self.shim = shim
        self.ctr = ctr
        self.slug = "ctr-" + name.replace(" ", "-")
        self.run = CommandRunner(workdir, self.slug, timeout=120)
        self.last_id = ""

    def unavailable(self) -> str:
        return self.ctr.unavailable() or ("" if which(self.shim) else f"{self.shim} is not installed (hack/containerd.sh installs ours)")

    def run_once(self, tag: str) -> Sample:
        cid = f"bench-{os.getpid()}-{tag}-{self.slug}"
        self.last_id = cid
        t0 = time.perf_counter_ns()
        self.run(self.ctr.cmd("run", "--rm", "--runtime", self.runtime, self.ctr.image, cid, "true"))
        t1 = time.perf_counter_ns()
        self.last_id = ""
        return Sample(t1 - t0)

    def cleanup(self) -> None:
        if self.last_id:
            self.ctr.remove(self.last_id)
            self.last_id = ""


class SleepingTask:
    """A detached `sleep` task of one runtime for exec cases to run in: started on first use,
    removed by the first cleanup (every case of the runtime calls it)."""

    def __init__(self, ctr: CtrClient, runtime: str, slug: str, workdir: Path) -> None:
        self.ctr = ctr
        self.runtime = runtime
        self.cid = f"bench-{os.getpid()}-{slug}"
        self.run = CommandRunner(workdir, slug, timeout=120)
        self.started = False

    def id(self) -> str:
        if not self.started:
            self.started = True
            self.run(self.ctr.cmd("run", "--detach", "--runtime", self.runtime, self.ctr.image, self.cid, "sleep", "3600"))
        return self.cid

    def remove(self) -> None:
        if self.started:
            self.ctr.remove(self.cid)
            self.started = False


# `ctr task exec` commands: (label, argv, the whole stdout it must print). A tool call prints:
# `true` prints nothing, `echo` a few bytes (the process is gone before its Start returns), the
# last 1 MiB of output (the fifo is refilled 16 times while the reader drains it; one process,
# no `yes | head` pipeline, whose time would include how `yes` meets its reader's end).
EXEC_MIB = 1 << 20
EXEC_COMMANDS = [
    ("true", ["true"], b""),
    ("echo", ["echo", "hi"], b"hi\n"),
    ("1 MiB", ["head", "-c", str(EXEC_MIB), "/dev/zero"], bytes(EXEC_MIB)),
]


class CtrExecCase(Case):
    """ctr task exec --exec-id X ID CMD... in a running task of one runtime; stdout goes to a
    file and is checked whole after the timer stops."""

    def __init__(self, name: str, task: SleepingTask, shim: str, argv: list[str], want: bytes, workdir: Path) -> None:
        super().__init__()
        self.name = name
        self.task = task
        self.shim = shim
        self.argv = argv
        self.want = want
        slug = "exec-" + name.replace(" ", "-")
        self.out = open(workdir / f"{slug}.stdout", "w+b")  # noqa: SIM115 (closed at exit)
        self.err = open(workdir / f"{slug}.stderr", "w+b")  # noqa: SIM115 (closed at exit)
        self.n = 0
        self.lost = 0

    def unavailable(self) -> str:
        return self.task.ctr.unavailable() or ("" if which(self.shim) else f"{self.shim} is not installed (hack/containerd.sh installs ours)")

    def run_once(self, tag: str) -> Sample:
        cid = self.task.id()
        self.n += 1
        argv = self.task.ctr.cmd("task", "exec", "--exec-id", f"bench-{os.getpid()}-{self.n}", cid, *self.argv)
        for f in (self.out, self.err):
            f.seek(0)
            f.truncate()
        t0 = time.perf_counter_ns()
        try:
            rc = wait_exact(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err), 120)
        except subprocess.TimeoutExpired as e:
            raise CaseFailed(f"`{' '.join(argv)}` did not finish within 120 s") from e
        t1 = time.perf_counter_ns()
        self.out.seek(0)
        got = self.out.read()
        if rc != 0:
            self.err.seek(0)
            raise CaseFailed(f"`{' '.join(argv)}` exited {rc}: {self.err.read().decode(errors='replace').strip()[-600:]}")
        if got != self.want:
            if not got:
                # containerd 1.6's ctr now and then loses a fast exec's output, under runc-v2
                # too (docs/benchmarks.md): the time still counts, the loss is reported.
                self.lost += 1
                log(f"exec/{self.name}: ctr printed nothing ({self.lost} so far)")
            else:
                raise CaseFailed(f"`{' '.join(argv)}` printed {len(got)} bytes, not the {len(self.want)} expected")
        return Sample(t1 - t0)

    def cleanup(self) -> None:
        self.task.remove()


class CtrClient:
    """ctr against the running containerd, in one namespace."""

    def __init__(self, namespace: str, image: str) -> None:
        self.binary = which("ctr")
        self.namespace = namespace
        self.image = image
        self._unavailable: str | None = None

    def cmd(self, *args: str) -> list[str]:
        return [self.binary or "ctr", "--namespace", self.namespace, *args]

    def unavailable(self) -> str:
        if self._unavailable is None:
            if not self.binary:
                self._unavailable = "ctr is not installed (hack/containerd.sh)"
            elif not Path(CONTAINERD_SOCKET).is_socket():
                self._unavailable = f"containerd is not running ({CONTAINERD_SOCKET} missing; hack/containerd.sh starts it)"
            else:
                out = subprocess.run(self.cmd("images", "ls", "-q"), capture_output=True, text=True, timeout=60, check=False)
                if out.returncode != 0:
                    self._unavailable = f"`ctr images ls` exited {out.returncode}: {out.stderr.strip()[-300:]}"
                elif self.image not in out.stdout.split():
                    self._unavailable = f"image {self.image} is not in containerd's namespace {self.namespace} (hack/containerd.sh imports it)"
                else:
                    self._unavailable = ""
        return self._unavailable

    def remove(self, cid: str) -> None:
        """Kills and deletes task and container `cid`, whatever state they are in."""
        for argv in (("task", "kill", "--signal", "SIGKILL", cid), ("task", "delete", "--force", cid), ("containers", "delete", cid)):
            subprocess.run(self.cmd(*argv), capture_output=True, timeout=60, check=False)

    def task_pids(self) -> dict[str, int]:
        out = subprocess.run(self.cmd("tasks", "ls"), capture_output=True, text=True, timeout=60, check=False)
        pids = {}
        for line in out.stdout.splitlines()[1:]:
            f = line.split()
            if len(f) >= 3 and f[2] == "RUNNING" and f[1].isdigit():
                pids[f[0]] = int(f[1])
        return pids


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


def ppid_of(pid: int) -> int:
    # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def smaps_rollup_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            fields[parts[0].rstrip(":")] = int(parts[1])
    return {"rss_kib": fields["Rss"], "pss_kib": fields["Pss"]}


def measure_shim_memory(ctr: CtrClient, runtimes: list[tuple[str, str, str]], per_runtime: int, settle_s: float) -> dict:
    """Starts `per_runtime` detached `sleep 300` containers per runtime (interleaved),
    finds each task's shim (the task's parent, checked by binary name and -id), reads
    RSS and PSS from /proc/PID/smaps_rollup, then kills and deletes every container,
    also on error or interrupt."""
    result: dict = {"containers_per_runtime": per_runtime, "settle_seconds": settle_s, "unit": "KiB", "rows": [], "ratios": []}
    started: list[str] = []
    reasons = {}
    reason = ctr.unavailable()
    for name, _, shim in runtimes:
        if reason:
            reasons[name] = reason
        elif not which(shim):
            reasons[name] = f"{shim} is not installed"
    usable = [x for x in runtimes if x[0] not in reasons]
    errors: dict[str, str] = {}
    shims: dict[str, list[dict]] = {name: [] for name, _, _ in runtimes}
    ids: dict[str, list[str]] = {name: [] for name, _, _ in runtimes}
    try:
        for i in range(per_runtime):
            for name, rt, _ in usable:
                if name in errors:
                    continue
                cid = f"bench-{os.getpid()}-mem-{name.replace(' ', '-')}-{i}"
                started.append(cid)
                out = subprocess.run(
                    ctr.cmd("run", "--detach", "--runtime", rt, ctr.image, cid, "sleep", "300"),
                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
                )
                if out.returncode != 0:
                    errors[name] = f"`ctr run --detach --runtime {rt}` exited {out.returncode}: {out.stderr.strip()[-400:]}"
                    log(f"ctr/shim memory/{name}: {errors[name]}")
                else:
                    ids[name].append(cid)
        time.sleep(settle_s)  # let each shim finish its start-up allocations
        pids = ctr.task_pids()
        for name, _, shim in usable:
            if name in errors:
                continue
            for cid in ids[name]:
                try:
                    task = pids[cid]
                    spid = ppid_of(task)
                    exe = os.path.basename(os.readlink(f"/proc/{spid}/exe"))
                    argv = Path(f"/proc/{spid}/cmdline").read_bytes().split(b"\0")
                    if exe != os.path.basename(shim):
                        raise CaseFailed(f"the parent of task {cid} (pid {task}) is pid {spid} running {exe}, not {shim}")
                    shim_id = argv[argv.index(b"-id") + 1].decode() if b"-id" in argv else ""
                    shims[name].append({"container": cid, "task_pid": task, "shim_pid": spid, "shim_id": shim_id, **smaps_rollup_kib(spid)})
                except KeyError:
                    errors[name] = f"task {cid} is not RUNNING in `ctr tasks ls`"
                except (OSError, ValueError, IndexError, CaseFailed) as e:
                    errors[name] = f"cannot read the shim of {cid}: {e}"
                if name in errors:
                    log(f"ctr/shim memory/{name}: {errors[name]}")
                    break
    finally:
        for cid in started:
            ctr.remove(cid)
    by_name = {}
    for name, rt, shim in runtimes:
        row: dict = {"name": name, "runtime": rt, "shim": shim}
        if name in reasons:
            row.update(status="missing", error=reasons[name])
        elif name in errors:
            row.update(status="failed", error=errors[name])
        elif not shims[name]:
            row.update(status="failed", error="no shim found")
        else:
            got = shims[name]
            distinct = {s["shim_pid"] for s in got}
            one_per_container = len(distinct) == len(got)
            per_shim = {s["shim_pid"]: s for s in got}.values()
            row.update(
                status="ok",
                shims=len(distinct),
                one_shim_per_container=one_per_container,
                rss_kib=summarize([s["rss_kib"] for s in per_shim]),
                pss_kib=summarize([s["pss_kib"] for s in per_shim]),
                pss_total_kib=sum(s["pss_kib"] for s in per_shim),
                samples=got,
            )
        result["rows"].append(row)
        by_name[name] = row
    if len(runtimes) >= 2:
        a, b = by_name[runtimes[0][0]], by_name[runtimes[1][0]]
        entry = {"numerator": a["name"], "denominator": b["name"]}
        if a["status"] == b["status"] == "ok":
            entry["status"] = "ok"
            for key in ("rss_kib", "pss_kib"):
                entry[f"{key.split('_')[0]}_ratio_of_medians"] = round(a[key]["median"] / b[key]["median"], 3)
        else:
            entry["status"] = "pending: no figure for " + ", ".join(r["name"] for r in (a, b) if r["status"] != "ok")
        result["ratios"].append(entry)
        value = entry.get("rss_ratio_of_medians")
        result["target"] = {
            "text": "issue 4: shim RSS under 0.3x containerd-shim-runc-v2's, per running container",
            "limit_ratio": 0.3,
            "ratio": value,
            "verdict": "pending" if value is None else ("met" if value <= 0.3 else "missed"),
        }
    return result


def print_shim_memory(mem: dict) -> None:
    print(f"\nshim memory: {mem['containers_per_runtime']} detached `sleep 300` containers per runtime, read {mem['settle_seconds']:.0f} s after start (/proc/PID/smaps_rollup)")
    print(f"  {'case':<17} {'shims':>5} {'RSS median':>11} {'RSS p90':>9} {'PSS median':>11} {'PSS p90':>9} {'PSS total':>10}")
    for row in mem["rows"]:
        if row["status"] != "ok":
            label = "NOT MEASURED" if row["status"] == "missing" else "FAILED"
            print(f"  {row['name']:<17} {label}: {row.get('error', '')}")
            continue
        r, p = row["rss_kib"], row["pss_kib"]
        print(
            f"  {row['name']:<17} {row['shims']:>5} {r['median'] / 1024:>7.2f} MiB {r['p90'] / 1024:>5.2f} MiB {p['median'] / 1024:>7.2f} MiB "
            f"{p['p90'] / 1024:>5.2f} MiB {row['pss_total_kib'] / 1024:>6.2f} MiB"
            + ("" if row["one_shim_per_container"] else "   (shims shared between containers)")
        )
    for e in mem["ratios"]:
        label = f"{e['numerator']} / {e['denominator']}"
        if e["status"] != "ok":
            print(f"  ratio {label:<26} {e['status']}")
        else:
            print(f"  ratio {label:<26} RSS {e['rss_ratio_of_medians']:.2f}   PSS {e['pss_ratio_of_medians']:.2f}")
    if "target" in mem:
        t = mem["target"]
        value = f" (ratio {t['ratio']:.2f})" if t["ratio"] is not None else ""
        print(f"  target: {t['text']}: {t['verdict'].upper()}{value}")


@dataclass
class Section:
    key: str
    title: str
    cases: list[Case]
    rounds: int
    warmup: int
    subreaper: bool
    # (numerator, denominator) case names whose ratio is reported
    ratios: list[tuple[str, str]]
    # (case, reference, max ratio, text): a target from the issues
    target: tuple[str, str, float, str] | None = None
    notes: list[str] = field(default_factory=list)
    # A measurement that is not a timed round (e.g. shim memory): run after the
    # rounds, its result stored under `extra_key` in the section's JSON.
    extra: Callable[[], dict] | None = None
    extra_key: str = ""


def make_bundle(workdir: Path, busybox: str, runc: str | None) -> Path:
    """A busybox rootfs and the config.json of `runc spec`, adjusted: no terminal, /bin/true."""
    bundle = workdir / "bundle"
    (bundle / "rootfs" / "bin").mkdir(parents=True)
    shutil.copy2(busybox, bundle / "rootfs" / "bin" / "busybox")
    for applet in ("true", "sh"):
        (bundle / "rootfs" / "bin" / applet).symlink_to("busybox")
    # The mount points of the spec exist, as in any image: runc and crun would make
    # them on first use (changing the shared bundle), a runtime that maps root to an
    # unprivileged id cannot.
    for d in ("proc", "dev", "sys", "tmp", "etc"):
        (bundle / "rootfs" / d).mkdir(mode=0o755)
    (bundle / "rootfs" / "tmp").chmod(0o1777)
    if not runc:
        raise SystemExit("bench: runc is needed to generate config.json (`runc spec`)")
    subprocess.run([runc, "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    # A runtime that maps the container's root to an unprivileged host id must be
    # able to traverse the bundle; tempfile makes the work dir 0700.
    for p in (workdir, bundle, bundle / "rootfs", bundle / "rootfs" / "bin", *(bundle / "rootfs" / d for d in ("proc", "dev", "sys", "etc"))):
        p.chmod(0o755)
    return bundle


def which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin")


def fresh_copy(binary: str | None, workdir: Path, slug: str) -> str | None:
    """`binary` copied to a new file of its own directory in the work dir, or `binary` itself
    if it is not there. What an exec costs depends on how the file sits in the page cache,
    not only on its bytes: two copies of one build differ by 5-10 % in CPU per exec when one
    was written just now (large folios) and the other has aged there (reclaim and read-back
    leave most of it in single pages). Copying every build under test the same way compares
    builds, not file histories (docs/benchmarks.md#page-cache).
    """
    if not binary or not os.access(binary, os.X_OK):
        return binary
    # Its own directory: create re-executes itself from a read-only overlay of it.
    target = workdir / f"bin-{slug}"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    copy = target / Path(binary).name
    shutil.copyfile(binary, copy)
    copy.chmod(0o755)
    return str(copy)


def section_runtime(args, workdir: Path, hybrid: bool) -> Section:
    bundle = make_bundle(workdir, args.busybox, which("runc"))
    crun_view = "v1" if hybrid else "host"
    cases: list[Case] = [
        LifecycleCase("agent-sandbox", fresh_copy(args.agent_sandbox, workdir, "agent-sandbox"), "host", bundle, workdir, phase_trace=True),
        LifecycleCase("crun", which("crun"), crun_view, bundle, workdir),
        LifecycleCase("runc", which("runc"), "host", bundle, workdir),
    ]
    notes = []
    ratios = [("agent-sandbox", "crun"), ("agent-sandbox", "runc"), ("crun", "runc")]
    if args.baseline:
        # Another build of the runtime in the same rounds: whether a change made it slower,
        # free of the drift between two runs.
        cases.insert(1, LifecycleCase("baseline", fresh_copy(args.baseline, workdir, "baseline"), "host", bundle, workdir, phase_trace=True))
        ratios.insert(0, ("agent-sandbox", "baseline"))
        notes.append(f"baseline = {args.baseline}")
    notes.append("agent-sandbox (and baseline) run from fresh copies in the work dir: one page-cache state for every build")
    if hybrid:
        cases.append(LifecycleCase("runc (v1 view)", which("runc"), "v1", bundle, workdir))
        notes.append("crun runs in the v1 view (cgroup2 mount detached in a private mount namespace): crun 1.8 refuses hybrid cgroups")
    cases.append(FloorCase(workdir))
    return Section(
        key="runtime",
        title="runtime lifecycle: create + start + wait + delete of /bin/true (busybox bundle, runc spec config)",
        cases=cases,
        rounds=args.rounds,
        warmup=args.warmup,
        subreaper=True,
        ratios=ratios,
        target=("agent-sandbox", "crun", 1.0, "issue 3: agent-sandbox not slower than crun"),
        notes=notes,
    )


def section_podman(args, workdir: Path, hybrid: bool) -> Section:
    crun_view = "v1" if hybrid else "host"
    cases: list[Case] = [
        PodmanCase("agent-sandbox", args.agent_sandbox, "host", args.image, workdir),
        PodmanCase("crun", which("crun"), crun_view, args.image, workdir),
        PodmanCase("runc", which("runc"), "host", args.image, workdir),
    ]
    notes = []
    if hybrid:
        cases.append(PodmanCase("runc (v1 view)", which("runc"), "v1", args.image, workdir))
        notes.append("podman --runtime crun runs in the v1 view: crun 1.8 refuses hybrid cgroups")
    return Section(
        key="podman",
        title=f"podman run --rm --network none {args.image} true",
        cases=cases,
        rounds=args.podman_rounds,
        warmup=args.warmup,
        subreaper=False,  # conmon daemonizes; let it go to init as podman expects
        ratios=[("agent-sandbox", "crun"), ("agent-sandbox", "runc"), ("crun", "runc")],
        notes=notes,
    )


CTR_RUNTIMES = [
    ("agent-sandbox", "io.agent.sandbox", "containerd-shim-agent-sandbox"),
    ("runc", "io.containerd.runc.v2", "containerd-shim-runc-v2"),
]


def ctr_runtimes(args) -> list[tuple[str, str, str]]:
    """CTR_RUNTIMES, with our shim given by its absolute path when --shim names one: ctr
    then runs that binary (containerd accepts a path as the runtime), and the shim drives
    the agent-sandbox beside it, whatever containerd's config registers."""
    if not args.shim:
        return CTR_RUNTIMES
    return [("agent-sandbox", args.shim, args.shim), *CTR_RUNTIMES[1:]]


def section_ctr(args, workdir: Path, hybrid: bool) -> Section:
    ctr = CtrClient(args.ctr_namespace, args.image)
    runtimes = ctr_runtimes(args)
    cases: list[Case] = [CtrRunCase(name, rt, shim, ctr, workdir) for name, rt, shim in runtimes]
    return Section(
        key="ctr",
        title=f"ctr run --rm --runtime R {args.image} ID true (containerd, namespace {args.ctr_namespace})",
        cases=cases,
        rounds=args.ctr_rounds,
        warmup=args.warmup,
        subreaper=False,  # the shims daemonize; containerd expects them to go to init
        ratios=[("agent-sandbox", "runc")],
        target=("agent-sandbox", "runc", 0.9, "issue 4: ctr run --rm latency at most 0.9x io.containerd.runc.v2"),
        notes=[f"runc = io.containerd.runc.v2 (containerd-shim-runc-v2 driving runc); agent-sandbox = {runtimes[0][1]}"],
        extra=(lambda: measure_shim_memory(ctr, runtimes, args.shims, args.shim_settle)) if args.shims > 0 else None,
        extra_key="shim_memory",
    )


def section_exec(args, workdir: Path, hybrid: bool) -> Section:
    ctr = CtrClient(args.ctr_namespace, args.image)
    runtimes = ctr_runtimes(args)
    tasks = {name: SleepingTask(ctr, rt, f"exec-task-{name}", workdir) for name, rt, _shim in runtimes}
    cases: list[Case] = [
        CtrExecCase(f"{name} {label}", tasks[name], shim, argv, want, workdir) for label, argv, want in EXEC_COMMANDS for name, _rt, shim in runtimes
    ]
    return Section(
        key="exec",
        title=f"ctr task exec into a running {args.image} task: true, echo hi, 1 MiB of output (stdout checked whole)",
        cases=cases,
        rounds=args.ctr_rounds,
        warmup=args.warmup,
        subreaper=False,
        ratios=[(f"agent-sandbox {label}", f"runc {label}") for label, _argv, _want in EXEC_COMMANDS],
        target=("agent-sandbox echo", "runc echo", 1.0, "issue 33: an exec that prints at most 1.0x io.containerd.runc.v2"),
        notes=[f"runc = io.containerd.runc.v2; agent-sandbox = {runtimes[0][1]}; one sleeping task per runtime for all its execs"],
    )


# A python3 holding 50 MiB it has written (so the pages are resident and CRIU saves them),
# marking /tmp/ready once it holds them.
HOLDER = "b = bytearray(b'\\x01') * (50 << 20); open('/tmp/ready', 'w').close()\nimport time\nwhile True: time.sleep(1)"
CHECKPOINT_PHASES = ("checkpoint", "restore", "export", "import")


class CheckpointCase(Case):
    """podman checkpoint and restore of one running python3 holding 50 MiB, per round:
    `container checkpoint` and `container restore` in place, then `checkpoint --export` and
    `restore --import --name NEW` (each a phase); the exported original is removed untimed
    and the imported container is the next round's. With `workspace_kib`, the container has a
    workspace (a host directory on /workspace) into which it writes that much before its
    first checkpoint, so agent-sandbox's checkpoint snapshots a layer of that size."""

    def __init__(
        self, name: str, runtime: str | None, image: str, workdir: Path, runtime_flags: list[str], run_flags: list[str], workspace_kib: int = 0
    ) -> None:
        super().__init__()
        self.workspace_kib = workspace_kib
        self.name = name
        self.runtime = runtime
        self.image = image
        self.workdir = workdir
        self.flags = runtime_flags
        self.run_flags = run_flags
        slug = "ckpt-" + name.replace(" ", "-")
        self.slug = slug
        self.run = CommandRunner(workdir, slug, timeout=180)
        self.current = ""
        self.names: list[str] = []
        self.n = 0

    def unavailable(self) -> str:
        if not shutil.which("podman"):
            return "podman is not installed"
        if not self.runtime or not os.access(self.runtime, os.X_OK) and not shutil.which(self.runtime):
            return f"{self.runtime} is not installed"
        if not any(os.access(c, os.X_OK) for c in ("/usr/local/sbin/criu", "/usr/sbin/criu")):
            return "criu is not installed (hack/criu.sh)"
        if subprocess.run(["podman", "image", "exists", self.image], capture_output=True, timeout=60, check=False).returncode != 0:
            return f"image {self.image} is not in podman's store (hack/setup.sh builds and loads it)"
        return ""

    def podman(self, *args: str) -> list[str]:
        return ["podman", "--runtime", self.runtime, *self.flags, *args]

    def fresh_name(self) -> str:
        self.n += 1
        name = f"bench-{self.slug}-{os.getpid()}-{self.n}"
        self.names.append(name)
        return name

    def ready(self, name: str) -> None:
        deadline = time.monotonic() + 60
        while subprocess.run(self.podman("exec", name, "test", "-e", "/tmp/ready"), capture_output=True, timeout=60, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise CaseFailed(f"{name} never held its 50 MiB")
            time.sleep(0.2)

    def run_once(self, tag: str) -> Sample:
        if not self.current:
            self.current = self.fresh_name()
            volume = []
            if self.workspace_kib:
                ws = self.workdir / f"{self.slug}-ws"
                ws.mkdir(exist_ok=True)
                volume = ["-v", f"{ws}:/workspace"]
            self.run(self.podman("run", "-d", "--name", self.current, *volume, *self.run_flags, self.image, "python3", "-c", HOLDER))
            self.ready(self.current)
            if self.workspace_kib:
                write = f"head -c {self.workspace_kib * 1024} /dev/urandom > /workspace/edit.bin"
                self.run(self.podman("exec", self.current, "sh", "-c", write))
        archive = self.workdir / f"{self.slug}.tar"
        new = self.fresh_name()
        steps = (
            ("checkpoint", self.podman("container", "checkpoint", self.current)),
            ("restore", self.podman("container", "restore", self.current)),
            ("export", self.podman("container", "checkpoint", "--export", str(archive), self.current)),
            ("import", self.podman("container", "restore", "--import", str(archive), "--name", new)),
        )
        phases = {}
        for phase, argv in steps:
            t0 = time.perf_counter_ns()
            self.run(argv)
            phases[phase] = time.perf_counter_ns() - t0
        subprocess.run(["podman", "rm", "--force", "--ignore", self.current], capture_output=True, timeout=120, check=False)
        self.current = new
        archive.unlink(missing_ok=True)
        reap_children()
        return Sample(sum(phases.values()), phases_ns=phases)

    def cleanup(self) -> None:
        for name in self.names:
            subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, timeout=120, check=False)
        self.names, self.current = [], ""
        reap_children()


def checkpoint_policy(workdir: Path) -> Path:
    """The built-in agent policy with its Landlock layer optional: CRIU cannot carry a
    Landlock domain (docs/checkpoint.md#layers)."""
    text = (Path(__file__).resolve().parents[2] / "profiles/agent.toml").read_text()
    if '\nlandlock = "required"\n' not in text:
        raise SystemExit('profiles/agent.toml no longer says landlock = "required"')
    path = workdir / "checkpoint-policy.toml"
    path.write_text(text.replace('\nlandlock = "required"\n', '\nlandlock = "optional"\n'))
    return path


def section_checkpoint(args, workdir: Path, hybrid: bool) -> Section:
    policy = checkpoint_policy(workdir)
    kib = args.checkpoint_workspace_kib
    ours = (["--runtime-flag", f"policy={policy}"], ["--init"], kib)
    cases: list[Case] = [
        CheckpointCase("agent-sandbox", args.agent_sandbox, args.checkpoint_image, workdir, *ours),
        CheckpointCase("runc", which("runc"), args.checkpoint_image, workdir, [], [], kib),
    ]
    ratios = [("agent-sandbox", "runc")]
    notes = []
    if args.baseline:
        cases.insert(1, CheckpointCase("baseline", args.baseline, args.checkpoint_image, workdir, *ours))
        ratios.insert(0, ("agent-sandbox", "baseline"))
        notes.append(f"baseline = {args.baseline}")
    if kib:
        notes.append(f"each container writes {kib} KiB into a workspace (/workspace, a host directory) before its first checkpoint")
    return Section(
        key="checkpoint",
        title=f"podman checkpoint / restore / checkpoint --export / restore --import of python3 holding 50 MiB ({args.checkpoint_image})",
        cases=cases,
        rounds=args.checkpoint_rounds,
        warmup=1,
        subreaper=False,  # conmon daemonizes, as in the podman section
        ratios=ratios,
        target=("agent-sandbox", "runc", 1.0, "issue 36: checkpoint and restore no slower than runc + CRIU"),
        notes=[
            "agent-sandbox runs with podman's --init and the agent policy with Landlock optional (docs/checkpoint.md#init, #layers);"
            " runc without --init (runc + CRIU cannot restore podman's init bind here)",
            "each round: checkpoint, restore in place, checkpoint --export, restore --import --name NEW (phases); the total is their sum",
            *notes,
        ],
    )


FORK_PHASES = ("first", "last")
# The --root podman gives a runtime named by path (its helpers carry it).
PODMAN_RUNTIME_ROOT = "/run/agent-sandbox"


class ForkCase(CheckpointCase):
    """Forks of one golden sandbox: a python3 holding 50 MiB is checkpointed once with
    `--export` (untimed, before the first round); each round then imports that archive
    `--fork-batch` times under new names, one after another, with every fork left running.
    The sample is the last fork's import (the Nth fork, with N-1 siblings running); the
    phases are the first and the last. After a batch the host's MemAvailable, against its
    value before the batch, gives the memory each idle fork costs; the forks are then
    removed untimed."""

    def __init__(self, name: str, runtime: str | None, image: str, workdir: Path, runtime_flags: list[str], run_flags: list[str], batch: int) -> None:
        super().__init__(name, runtime, image, workdir, runtime_flags, run_flags)
        self.batch = batch
        self.archive = workdir / f"{self.slug}-golden.tar"
        self.golden = ""
        self.kib_per_fork: list[float] = []
        self.pss_kib_per_fork: list[float] = []

    def pss_kib(self, name: str) -> int:
        """PSS of a fork's host processes: conmon and everything under it, and agent-sandbox's
        helpers (`... --root PODMAN_RUNTIME_ROOT ... ID`), as hack/bench/sandbox_pss.py counts
        a sandbox."""
        out = subprocess.run(
            ["podman", "inspect", "--format", "{{.Id}} {{.State.ConmonPid}}", name], capture_output=True, text=True, timeout=60, check=False
        ).stdout.split()
        if len(out) != 2:
            raise CaseFailed(f"podman inspect {name}: no id and conmon pid")
        cid, conmon = out[0], int(out[1])
        pids = sandbox_pss.sandbox_processes(conmon, PODMAN_RUNTIME_ROOT, cid, sandbox_pss.children_of())
        total = 0
        for pid in pids:
            try:
                total += sandbox_pss.pss_kib(pid)
            except OSError:
                pass
        return total

    def make_golden(self) -> None:
        self.golden = self.fresh_name()
        self.run(self.podman("run", "-d", "--name", self.golden, *self.run_flags, self.image, "python3", "-c", HOLDER))
        self.ready(self.golden)
        self.run(self.podman("container", "checkpoint", "--export", str(self.archive), self.golden))

    def run_once(self, tag: str) -> Sample:
        if not self.golden:
            self.make_golden()
        forks = []
        times = []
        before = bench_extra._meminfo_kib("MemAvailable")
        try:
            for _ in range(self.batch):
                name = self.fresh_name()
                t0 = time.perf_counter_ns()
                self.run(self.podman("container", "restore", "--import", str(self.archive), "--name", name))
                times.append(time.perf_counter_ns() - t0)
                forks.append(name)
            time.sleep(1)
            after = bench_extra._meminfo_kib("MemAvailable")
            self.kib_per_fork.append((before - after) / self.batch)
            self.pss_kib_per_fork.append(sum(self.pss_kib(name) for name in forks) / self.batch)
        finally:
            for name in forks:
                subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, timeout=120, check=False)
                self.names.remove(name)
            reap_children()
        return Sample(times[-1], phases_ns={"first": times[0], "last": times[-1]})

    def cleanup(self) -> None:
        super().cleanup()
        self.golden = ""
        self.archive.unlink(missing_ok=True)


def section_fork(args, workdir: Path, hybrid: bool) -> Section:
    policy = checkpoint_policy(workdir)
    batch = args.fork_batch
    cases: list[ForkCase] = [
        ForkCase("agent-sandbox", args.agent_sandbox, args.checkpoint_image, workdir, ["--runtime-flag", f"policy={policy}"], ["--init"], batch),
        ForkCase("runc", which("runc"), args.checkpoint_image, workdir, [], [], batch),
    ]

    def memory() -> dict:
        return {
            c.name: {
                "batches": len(c.kib_per_fork),
                "mib_per_fork": [round(k / 1024, 2) for k in c.kib_per_fork],
                "pss_mib_per_fork": [round(k / 1024, 2) for k in c.pss_kib_per_fork],
            }
            for c in cases
            if c.kib_per_fork
        }

    return Section(
        key="fork",
        title=f"podman restore --import of one golden checkpoint (python3 holding 50 MiB, {args.checkpoint_image}) {batch} times, forks left running",
        cases=list(cases),
        rounds=args.fork_rounds,
        warmup=0,
        subreaper=False,
        ratios=[("agent-sandbox", "runc")],
        target=("agent-sandbox", "runc", 1.0, "issue 37: the Nth fork no slower than runc + CRIU restoring the same image (and <= 50 ms p95)"),
        notes=[
            f"each round imports the golden archive {batch} times (--fork-batch); the sample is the last import, with {batch - 1} forks running",
            "agent-sandbox runs with podman's --init and the agent policy with Landlock optional, as in the checkpoint section",
            "memory per idle fork: MemAvailable before a batch minus after it (1 s settle), over the batch; and the PSS of each"
            " fork's conmon, everything under it and every process naming the container, averaged over the batch",
        ],
        extra=memory,
        extra_key="fork_memory",
    )


SECTIONS = {"runtime": section_runtime, "podman": section_podman, "ctr": section_ctr, "exec": section_exec, "checkpoint": section_checkpoint, "fork": section_fork}
# Sections that are not interleaved rounds of one command (hack/bench/extra.py).
EXTERNAL = ("proxy", "cri", "density", "criterion", "task")


# --- running -----------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def run_section(section: Section, views: Views, deadline: float) -> None:
    set_child_subreaper(section.subreaper)
    for case in section.cases:
        case.samples = [None] * section.rounds
    try:
        active = warm_up(section, views)
        run_rounds(section, active, views, deadline)
    finally:
        # Also on Ctrl-C: leave no container behind, each removed from its own view.
        for case in section.cases:
            if case.view in views.fds:
                views.enter(case.view)
                case.cleanup()
        views.enter("host")
        set_child_subreaper(False)


def warm_up(section: Section, views: Views) -> list[Case]:
    """Runs each case `warmup` times unrecorded; returns the cases that work."""
    active = []
    for case in section.cases:
        if case.view not in views.fds:
            case.status, case.error = "missing", f"view {case.view} is not available"
            continue
        reason = case.unavailable()
        if reason:
            case.status, case.error = "missing", reason
            log(f"{section.key}/{case.name}: not measured: {reason}")
            continue
        views.enter(case.view)
        try:
            for i in range(section.warmup):
                case.run_once(f"{section.key}-w{i}")
            active.append(case)
        except CaseFailed as e:
            case.status, case.error = "failed", f"warm-up failed: {e}"
            log(f"{section.key}/{case.name}: {case.error}")
            case.cleanup()
        finally:
            views.enter("host")
    return active


def run_rounds(section: Section, active: list[Case], views: Views, deadline: float) -> None:
    for r in range(section.rounds):
        if time.monotonic() > deadline:
            log(f"{section.key}: time budget spent after {r} rounds")
            break
        running = [c for c in active if c.status == "ok"]
        if not running:
            break
        shift = r % len(running)
        for case in running[shift:] + running[:shift]:
            views.enter(case.view)
            try:
                case.samples[r] = case.run_once(f"{section.key}-{r}")
            except CaseFailed as e:
                case.status, case.error = "failed", f"round {r + 1}: {e}"
                log(f"{section.key}/{case.name}: {case.error}")
                case.cleanup()
            finally:
                views.enter("host")
        if (r + 1) % 10 == 0:
            log(f"{section.key}: {r + 1}/{section.rounds} rounds")


def ms(ns: int) -> float:
    return ns / 1e6


def section_result(section: Section) -> dict:
    rows = []
    by_name = {}
    for case in section.cases:
        got = [s for s in case.samples if s is not None]
        row = {"name": case.name, "view": case.view, "status": case.status, "reference": case.reference}
        if case.error:
            row["error"] = case.error
        if case.status == "ok" and got:
            row["stats_ms"] = summarize([ms(s.total_ns) for s in got])
            if all(s.cpu_ns is not None for s in got):
                row["cpu_stats_ms"] = summarize([ms(s.cpu_ns) for s in got])
            phases = sorted({p for s in got for p in s.phases_ns})
            if phases:
                row["phase_median_ms"] = {p: round(statistics.median(ms(s.phases_ns[p]) for s in got), 3) for p in phases}
                row["phase_p95_ms"] = {p: round(percentile(sorted(ms(s.phases_ns[p]) for s in got), 0.95), 3) for p in phases}
            row["samples_ms"] = [None if s is None else round(ms(s.total_ns), 3) for s in case.samples]
            traced = [s.create_trace for s in got if s.create_trace]
            if traced:
                row["create_phase_median_ms"] = {
                    p: {
                        "wall": None if any(t[p][0] is None for t in traced if p in t)
                        else round(statistics.median(t[p][0] for t in traced if p in t), 3),
                        "cpu": round(statistics.median(t[p][1] for t in traced if p in t), 3),
                    }
                    for p in dict.fromkeys(p for t in traced for p in t)
                }
        elif case.status == "ok":
            row["status"] = "failed"
            row["error"] = "no samples"
        rows.append(row)
        by_name[case.name] = (row, case)
    ratios = []
    for num, den in section.ratios:
        a, b = by_name.get(num), by_name.get(den)
        entry = {"numerator": num, "denominator": den}
        if not (a and b and "stats_ms" in a[0] and "stats_ms" in b[0]):
            missing = [n for n, x in ((num, a), (den, b)) if not (x and "stats_ms" in x[0])]
            entry["status"] = f"pending: no figure for {', '.join(missing)}"
        else:
            entry["status"] = "ok"
            entry["ratio_of_medians"] = round(a[0]["stats_ms"]["median"] / b[0]["stats_ms"]["median"], 3)
            paired = [
                x.total_ns / y.total_ns for x, y in zip(a[1].samples, b[1].samples, strict=True) if x is not None and y is not None
            ]
            entry["paired_rounds"] = len(paired)
            if paired:
                entry["median_of_round_ratios"] = round(statistics.median(paired), 3)
            pa, pb = a[0].get("phase_median_ms", {}), b[0].get("phase_median_ms", {})
            if any(p in CHECKPOINT_PHASES for p in pa):
                entry["phase_ratio_of_medians"] = {p: round(pa[p] / pb[p], 3) for p in pa if pb.get(p)}
            if "cpu_stats_ms" in a[0] and "cpu_stats_ms" in b[0] and b[0]["cpu_stats_ms"]["median"] > 0:
                entry["cpu_ratio_of_medians"] = round(a[0]["cpu_stats_ms"]["median"] / b[0]["cpu_stats_ms"]["median"], 3)
        ratios.append(entry)
    out = {"title": section.title, "rounds": section.rounds, "warmup": section.warmup, "unit": "ms", "rows": rows, "ratios": ratios, "notes": section.notes}
    if section.target:
        num, den, limit, text = section.target
        r = next((x for x in ratios if x["numerator"] == num and x["denominator"] == den), None)
        if r and r["status"] == "ok":
            value = r.get("median_of_round_ratios", r["ratio_of_medians"])
            verdict = "met" if value <= limit else "missed"
        else:
            value, verdict = None, "pending"
        out["target"] = {"text": text, "limit_ratio": limit, "ratio": value, "verdict": verdict}
    return out


def print_section(res: dict) -> None:
    print(f"\n{res['title']}")
    print(f"  {res['rounds']} rounds, interleaved (order rotated each round), {res['warmup']} warm-up runs per case not counted")
    order = ["create", "start", "wait", "delete", *CHECKPOINT_PHASES, *FORK_PHASES]
    phases = sorted({p for row in res["rows"] for p in row.get("phase_median_ms", {})}, key=order.index)
    cpu = any("cpu_stats_ms" in row for row in res["rows"])
    head = f"  {'case':<17} {'view':<5} {'median':>9} {'p90':>9} {'min':>9} {'n':>4}"
    if cpu:
        head += f" {'cpu med':>9}"
    if phases:
        head += "  | phase medians: " + " ".join(f"{p:>6}" for p in phases)
    print(head)
    for row in res["rows"]:
        name = row["name"] + (" *" if row["reference"] else "")
        if "stats_ms" not in row:
            label = "NOT MEASURED" if row["status"] == "missing" else "FAILED"
            print(f"  {name:<17} {row['view']:<5} {label}: {row.get('error', '')}")
            continue
        s = row["stats_ms"]
        line = f"  {name:<17} {row['view']:<5} {s['median']:>6.2f} ms {s['p90']:>6.2f} ms {s['min']:>6.2f} ms {s['n']:>4}"
        if cpu:
            line += f" {row['cpu_stats_ms']['median']:>6.2f} ms" if "cpu_stats_ms" in row else f" {'':>9}"
        if phases and "phase_median_ms" in row:
            pm = row["phase_median_ms"]
            line += "  |                " + " ".join(f"{pm[p]:>6.2f}" if p in pm else f"{'':>6}" for p in phases)
        print(line)
    for r in res["ratios"]:
        label = f"{r['numerator']} / {r['denominator']}"
        if r["status"] != "ok":
            print(f"  ratio {label:<26} {r['status']}")
            continue
        text = f"  ratio {label:<26} {r['ratio_of_medians']:.2f}"
        if "median_of_round_ratios" in r:
            text += f"   per-round median {r['median_of_round_ratios']:.2f} ({r['paired_rounds']} rounds)"
        if "cpu_ratio_of_medians" in r:
            text += f"   cpu {r['cpu_ratio_of_medians']:.2f}"
        print(text)
    if "target" in res:
        t = res["target"]
        value = f" (ratio {t['ratio']:.2f})" if t["ratio"] is not None else ""
        print(f"  target: {t['text']}: {t['verdict'].upper()}{value}")
    for note in res["notes"]:
        print(f"  note: {note}")
    for row in res["rows"]:
        if "create_phase_median_ms" in row:
            print_create_phases(row)
        if "phase_p95_ms" in row and any(p in CHECKPOINT_PHASES for p in row["phase_p95_ms"]):
            p95 = row["phase_p95_ms"]
            print(f"  {row['name']} p50 / p95 per phase: " + ", ".join(f"{p} {row['phase_median_ms'][p]:.0f} / {p95[p]:.0f} ms" for p in CHECKPOINT_PHASES if p in p95))
    for r in res["ratios"]:
        if "phase_ratio_of_medians" in r:
            print(f"  ratio {r['numerator']} / {r['denominator']} per phase (medians): "
                  + ", ".join(f"{p} {r['phase_ratio_of_medians'][p]:.2f}" for p in CHECKPOINT_PHASES if p in r["phase_ratio_of_medians"]))
    if cpu:
        print("  cpu: user + system time of all the processes of one run (less sensitive to load than wall time)")
    if any(row["reference"] for row in res["rows"]):
        print("  * reference row: the harness's own cost of spawning three processes, included in every row above")


def print_create_phases(row: dict) -> None:
    """The runtime's own trace of its create, phase by phase (medians over the rounds)."""
    print(f"  {row['name']} create by phase (its AGENT_SANDBOX_PHASE_TRACE; medians, ms):")
    print(f"    {'phase':<18} {'wall':>8} {'cpu':>8}")
    for phase, m in row["create_phase_median_ms"].items():
        wall = f"{m['wall']:>8.2f}" if m["wall"] is not None else f"{'-':>8}"
        cpu = f"{m['cpu']:>8.2f}" if phase != "outside phases" else f"{'-':>8}"
        print(f"    {phase:<18} {wall} {cpu}")
    print("    startup: CPU before create's clock starts (binary start, re-exec, arguments);"
          " create command: the whole process (cpu of it alone, reaped by the harness)")


def shim_version(binary: str | None) -> str:
    """The `Version:` line of a shim's `-v` (its first line is only the name)."""
    if not binary:
        return "not installed"
    try:
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Version:")), out.strip() or "unavailable")


def versions(args) -> dict:
    def ver(binary: str | None) -> str:
        return first_line([binary, "--version"]) if binary and os.access(binary, os.X_OK) else "not installed"

    def identity(binary: str) -> dict:
        try:
            data = Path(binary).read_bytes()
            mtime = datetime.datetime.fromtimestamp(Path(binary).stat().st_mtime, datetime.timezone.utc)
        except OSError:
            return {}
        return {
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_bytes": len(data),
            "modified": mtime.isoformat(timespec="seconds"),
            "file": first_line(["file", "-b", binary]),
        }

    repo = Path(__file__).resolve().parents[2]
    commit = first_line(["git", "-C", str(repo), "rev-parse", "HEAD"])
    return {
        "agent-sandbox": ver(args.agent_sandbox),
        "agent-sandbox_path": args.agent_sandbox,
        "agent-sandbox_binary": identity(args.agent_sandbox),
        "crun": ver(which("crun")),
        "runc": ver(which("runc")),
        "podman": ver(which("podman")),
        "containerd": ver(which("containerd")),
        "containerd-shim-agent-sandbox": shim_version(args.shim or which("containerd-shim-agent-sandbox")),
        "containerd-shim-agent-sandbox_binary": identity(args.shim or which("containerd-shim-agent-sandbox") or ""),
        "containerd-shim-runc-v2": shim_version(which("containerd-shim-runc-v2")),
        "conmon": ver(which("conmon")),
        "busybox": first_line([args.busybox]) if os.access(args.busybox, os.X_OK) else "not installed",
        "git_commit": commit,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default="runtime,podman,ctr,exec", help="comma-separated: " + ", ".join([*SECTIONS, *EXTERNAL]))
    p.add_argument("--proxy-mb", type=int, default=100, help="proxy section: MB through a CONNECT tunnel")
    p.add_argument("--proxy-requests", type=int, default=1000, help="proxy section: small requests")
    p.add_argument("--proxy-rounds", type=int, default=5, help="proxy section: interleaved rounds")
    p.add_argument("--density-levels", default="50,200,500", help="density section: running sandboxes at which start latency is measured")
    p.add_argument("--density-max", type=int, default=int(os.environ.get("BENCH_DENSITY_MAX", 50)), help="density section: skip levels above this (env BENCH_DENSITY_MAX)")
    p.add_argument("--density-probe", type=int, default=5, help="density section: timed starts per level")
    p.add_argument("--criterion-seconds", type=int, default=3, help="criterion section: measurement time per benchmark")
    p.add_argument("--chart", default=None, help="PNG chart path (default: the JSON path with .png)")
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 30)), help="rounds of the runtime section (env BENCH_ROUNDS)")
    p.add_argument(
        "--podman-rounds", type=int, default=int(os.environ.get("BENCH_PODMAN_ROUNDS", 0)) or None, help="rounds of the podman section (default: --rounds)"
    )
    p.add_argument(
        "--ctr-rounds", type=int, default=int(os.environ.get("BENCH_CTR_ROUNDS", 0)) or None, help="rounds of the ctr and exec sections (env BENCH_CTR_ROUNDS; default: --rounds)"
    )
    p.add_argument("--shims", type=int, default=int(os.environ.get("BENCH_SHIMS", 3)), help="detached containers per runtime for the shim memory (0: skip)")
    p.add_argument("--shim-settle", type=float, default=2.0, help="seconds between starting the containers and reading shim memory")
    p.add_argument("--ctr-namespace", default="default", help="containerd namespace holding the image")
    p.add_argument("--warmup", type=int, default=2, help="unrecorded runs per case before measuring")
    p.add_argument("--max-seconds", type=float, default=float(os.environ.get("BENCH_MAX_SECONDS", 300)), help="stop starting new rounds after this long")
    p.add_argument("--agent-sandbox", default=os.environ.get("AGENT_SANDBOX_BIN", "/usr/local/bin/agent-sandbox"), help="runtime under test (env AGENT_SANDBOX_BIN)")
    p.add_argument(
        "--baseline",
        default=os.environ.get("BENCH_BASELINE") or None,
        help="runtime section: another agent-sandbox build (say, main's) run as one more case in the same rounds, with its ratio (env BENCH_BASELINE)",
    )
    p.add_argument(
        "--shim",
        default=os.environ.get("BENCH_SHIM") or None,
        help="ctr and shim memory: run this containerd-shim-agent-sandbox by absolute path (it drives the agent-sandbox beside it) instead of io.agent.sandbox from containerd's config (env BENCH_SHIM)",
    )
    p.add_argument("--image", default="localhost/agent-sandbox/busybox:latest")
    p.add_argument(
        "--checkpoint-workspace-kib",
        type=int,
        default=int(os.environ.get("BENCH_CHECKPOINT_WORKSPACE_KIB", 0)),
        help="checkpoint section: KiB each container writes into a workspace before its first checkpoint (0: no workspace; env BENCH_CHECKPOINT_WORKSPACE_KIB)",
    )
    p.add_argument("--checkpoint-image", default="localhost/agent-sandbox/tools:latest", help="checkpoint section: an image with python3")
    p.add_argument(
        "--checkpoint-rounds", type=int, default=int(os.environ.get("BENCH_CHECKPOINT_ROUNDS", 10)), help="rounds of the checkpoint section (env BENCH_CHECKPOINT_ROUNDS)"
    )
    p.add_argument("--fork-batch", type=int, default=int(os.environ.get("BENCH_FORK_BATCH", 10)), help="fork section: forks imported per round (env BENCH_FORK_BATCH)")
    p.add_argument("--fork-rounds", type=int, default=int(os.environ.get("BENCH_FORK_ROUNDS", 5)), help="rounds (batches) of the fork section (env BENCH_FORK_ROUNDS)")
    p.add_argument("--busybox", default="/bin/busybox", help="static busybox for the bundle's rootfs")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "target" / "bench" / "runtime.json"))
    args = p.parse_args()
    if args.podman_rounds is None:
        args.podman_rounds = args.rounds
    if args.ctr_rounds is None:
        args.ctr_rounds = args.rounds
    if args.rounds < 1 or args.podman_rounds < 1 or args.ctr_rounds < 1:
        p.error("--rounds, --podman-rounds and --ctr-rounds must be at least 1")
    if args.fork_batch < 1 or args.fork_rounds < 1:
        p.error("--fork-batch and --fork-rounds must be at least 1")
    if args.shims < 0:
        p.error("--shims must be 0 or more")
    if args.shim and not (os.path.isabs(args.shim) and os.access(args.shim, os.X_OK)):
        p.error(f"--shim {args.shim}: not an executable absolute path")
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    if wanted == ["all"]:
        wanted = [*SECTIONS, *EXTERNAL]
    unknown = [s for s in wanted if s not in SECTIONS and s not in EXTERNAL]
    if unknown:
        p.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join([*SECTIONS, *EXTERNAL])}")
    if os.geteuid() != 0:
        p.error("run as root (runtimes and mount namespaces need it)")

    started = datetime.datetime.now(datetime.timezone.utc)
    mach = machine()
    cg = mach["cgroups"]
    hybrid = cg["layout"] == "hybrid" and bool(cg["cgroup2_controllers"]) and "/sys/fs/cgroup/unified" in cg["cgroup2_mounts"]
    views = Views(hybrid)
    deadline = time.monotonic() + args.max_seconds
    result = {
        "schema": "agent-sandbox-bench/1",
        "started": started.isoformat(timespec="seconds"),
        "command": sys.argv,
        "machine": mach,
        "versions": versions(args),
        "views": {"host": "the host's mount namespace", **({"v1": "private mount namespace with /sys/fs/cgroup/unified detached"} if hybrid else {})},
        "sections": {},
    }
    print(
        f"machine: {mach['os']}, kernel {mach['kernel']}, {mach['nproc']} CPUs ({mach['cpu']}), {mach['memory_mib']} MiB, "
        f"load {' '.join(mach['loadavg'])}, cgroups {cg['layout']} (v1: {' '.join(cg['v1_controllers'])}; cgroup2 controllers: {' '.join(cg['cgroup2_controllers']) or 'none'})"
    )
    for k in ("agent-sandbox", "crun", "runc", "podman", "containerd"):
        print(f"{k}: {result['versions'][k]}")
    for k in ("containerd-shim-agent-sandbox", "containerd-shim-runc-v2"):
        ident = result["versions"].get(f"{k}_binary")
        extra = f", {ident['size_bytes'] / 1e6:.1f} MB, modified {ident['modified']}, sha256 {ident['sha256'][:12]}" if ident else ""
        print(f"{k}: {result['versions'][k]}{extra}")
    ident = result["versions"]["agent-sandbox_binary"]
    if ident:
        print(f"agent-sandbox binary: {args.agent_sandbox}, {ident['size_bytes'] / 1e6:.1f} MB, modified {ident['modified']}, sha256 {ident['sha256'][:12]}")
        if "debug_info" in ident["file"]:
            print("  warning: this binary carries debug info (a debug build?): its figures are not release figures")
    with tempfile.TemporaryDirectory(prefix="agent-sandbox-bench.") as tmp:
        workdir = Path(tmp)
        for key in wanted:
            if key in EXTERNAL:
                log(f"{key}")
                res = run_external(key, args)
                result["sections"][key] = res
                print_external(key, res)
                continue
            section = SECTIONS[key](args, workdir, hybrid)
            log(f"{key}: {section.rounds} rounds of {len(section.cases)} cases")
            run_section(section, views, deadline)
            res = section_result(section)
            if section.extra:
                log(f"{key}: {section.extra_key.replace('_', ' ')}")
                res[section.extra_key] = section.extra()
            result["sections"][key] = res
            print_section(res)
            if "shim_memory" in res:
                print_shim_memory(res["shim_memory"])
            if "fork_memory" in res:
                for name, mem in res["fork_memory"].items():
                    print(
                        f"  {name}: host memory per idle fork, MiB per batch: MemAvailable {', '.join(map(str, mem['mib_per_fork']))};"
                        f" PSS {', '.join(map(str, mem['pss_mib_per_fork']))}"
                    )
    result["loadavg_at_end"] = read("/proc/loadavg").split()[:3]
    result["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nload average at end: {' '.join(result['loadavg_at_end'])}")
    print(f"result: {out}")
    print(bench_extra.render_chart(result, Path(args.chart) if args.chart else out.with_suffix(".png")))
    return 0


def run_external(key: str, args) -> dict:
    if key == "proxy":
        return bench_extra.run_proxy(args)
    if key == "cri":
        return bench_extra.run_cri(args)
    if key == "criterion":
        return bench_extra.run_criterion(args)
    if key == "task":
        return bench_extra.run_task(args)
    ctr = CtrClient(args.ctr_namespace, args.image)
    reason = ctr.unavailable()
    if reason:
        return {"status": "missing", "error": reason}
    return bench_extra.run_density(args, ctr.cmd, CTR_RUNTIMES)


def print_external(key: str, res: dict) -> None:
    print(f"\n== {key}")
    if res.get("status") not in (None, "ok"):
        print(f"  {res['status'].upper()}: {res.get('error', '')}")
        return
    if key == "proxy":
        for line in res.get("output", []):
            print(f"  {line}")
    elif key == "cri":
        print_cri(res["result"])
    elif key == "task":
        for entry, r in res["result"].items():
            for label in ("per_call", "per_task"):
                p = r[label]
                print(f"  {entry:<7} {label:<9} agent-sandbox {p['agent_sandbox']['median_ms']:>9.1f} ms, "
                      f"runc {p['runc']['median_ms']:>9.1f} ms, ratio {p['ratio']:.2f}")
    elif key == "criterion":
        for name, us in res["estimates"].items():
            print(f"  {name:<40} {us:>10.3f} µs")
    else:
        if res.get("note"):
            print(f"  note: {res['note']}")
        for row in res["rows"]:
            print(f"  {row['name']}: {row['status']}{' (' + row['error'] + ')' if row.get('error') else ''}"
                  + (f", estimated fit {row['estimated_fit']} sandboxes" if row.get("estimated_fit") else ""))
            for lv in row["levels"]:
                print(f"    {lv['running']:>4} running: start median {lv['start_ms']['median']:.1f} ms, "
                      f"{lv['kib_per_sandbox']} KiB per sandbox (MemAvailable)")


def print_cri(report: dict) -> None:
    """cri_bench's report: each phase's median and p90 per handler, then the ratios."""
    handler, baseline = report["handler"], report["baseline"]
    print(f"  {report['rounds']} rounds (+{report['warmup']} warm-up), {report['execs_per_pod']} ExecSync per pod and command, image {report['image']}")
    print(f"  {'phase':<18} {handler + ' ms':>22} {baseline + ' ms':>22} {'ratio':>7}")
    for phase, ratio in report["ratios"].items():
        cells = []
        for h in (handler, baseline):
            s = report["results"].get(h, {}).get(phase)
            cells.append(f"{s['median_ms']:.1f} (p90 {s['p90_ms']:.1f})" if s else "-")
        print(f"  {phase:<18} {cells[0]:>22} {cells[1]:>22} {ratio:>7.2f}")


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    # SIGTERM and SIGINT (even when started in the background, where SIGINT is ignored)
    # unwind through the cleanup: no container, mount or state directory left behind.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); containers removed, no result written")
        sys.exit(130)

#!/usr/bin/env python3
"""CPU of one runtime lifecycle, process by process: where `hack/bench-runtime.sh
--sections runtime` gives the CPU of the whole create + start + wait + delete, this says
which host process spent it.

Each round runs, for every runtime in turn (order alternating round by round): `create`
of a busybox `/bin/true` bundle (the one `bench.py` makes), `start`, a wait on a pidfd of
the init, `delete`. The script is a child subreaper and reaps every process itself with
wait4(2), so each reaped process's user + system time is its own plus that of the
children it reaped: `create` counts the short-lived children it waits for (a user
namespace fork, the cgroup warm-up, libcontainer's intermediate process); the init
counts the program it forked and reaped; a helper that outlives `create` (agent-sandbox's
seccomp supervisor, egress proxy, watchdog) is reparented here and counted on its own,
named by its hidden subcommand. crun runs in the v1 view on hybrid cgroups (as in
bench.py).

Usage: hack/bench/lifecycle_cpu.py [--rounds N] NAME=PATH [NAME=PATH ...]   (as root)
Prints, per runtime, the median CPU ms of each process role and of the whole lifecycle.
"""

import argparse
import collections
import os
import select
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (the bundle, the cgroup views, the subreaper)

# Options of the runtime's own command line that take a value, before the subcommand.
VALUE_OPTS = {"--root", "--log", "--log-format", "--policy"}


def role_of(argv: list[str]) -> str:
    """The subcommand of a runtime process: its first word that is no global option."""
    words = iter(argv[1:])
    for word in words:
        if word in VALUE_OPTS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "?"


def spawn(argv: list[str]) -> int:
    null = os.open(os.devnull, os.O_RDWR)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1)]
        return os.posix_spawn(argv[0], argv, os.environ, file_actions=actions)
    finally:
        os.close(null)


def cpu_ms(usage) -> float:
    return (usage.ru_utime + usage.ru_stime) * 1e3


def run_step(argv: list[str], what: str) -> float:
    pid = spawn(argv)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"lifecycle_cpu: {what} failed (wait status {status}): {' '.join(argv)}")
    return cpu_ms(usage)


def helpers_now(known: dict[int, str]) -> None:
    """Names the processes reparented to us so far: a runtime's by its subcommand, any
    other by its command name."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in known:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != me:
                continue
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            role = role_of([a for a in argv if a])
            if role == "?":
                role = "comm " + Path(f"/proc/{entry}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        known[int(entry)] = role


def lifecycle(binary: str, root: str, bundle: Path, work: Path, cid: str) -> dict[str, float]:
    pid_file = work / f"{cid}.pid"
    per: dict[str, float] = collections.defaultdict(float)
    per["create"] = run_step([binary, "--root", root, "create", "--bundle", str(bundle),
                              "--pid-file", str(pid_file), cid], "create")
    init = int(pid_file.read_text())
    names = {init: "init (+ program)"}
    helpers_now(names)
    pidfd = os.pidfd_open(init)
    per["start"] = run_step([binary, "--root", root, "start", cid], "start")
    select.select([pidfd], [], [], 30)
    os.close(pidfd)
    per["delete"] = run_step([binary, "--root", root, "delete", cid], "delete")
    # Helpers end with their sandbox (a few seconds at most: the supervisor serves 2 s
    # after the init's exit for late kernel audit records).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
            continue
        per[names.get(pid, "other")] += cpu_ms(usage)
    per["total"] = sum(per.values())
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--busybox", default="/bin/busybox")
    ap.add_argument("runtimes", nargs="+", metavar="NAME=PATH")
    args = ap.parse_args()
    runtimes = []
    for spec in args.runtimes:
        name, sep, path = spec.partition("=")
        if not sep or not os.access(path, os.X_OK):
            raise SystemExit(f"lifecycle_cpu: {spec!r} is not NAME=PATH of an executable")
        runtimes.append((name, path))
    bench.set_child_subreaper(True)
    hybrid = bench.cgroup_layout()["layout"].startswith("hybrid")
    views = bench.Views(hybrid)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in runtimes}
    with tempfile.TemporaryDirectory(prefix="lifecycle-cpu-") as tmp:
        work = Path(tmp)
        bundle = bench.make_bundle(work, args.busybox, bench.which("runc"))
        for r in range(args.rounds):
            order = runtimes if r % 2 == 0 else runtimes[::-1]
            for name, path in order:
                views.enter("v1" if hybrid and Path(path).name == "crun" else "host")
                cid = f"lcpu-{os.getpid()}-{r}-{name}"
                samples[name].append(lifecycle(path, str(work / f"root-{name}"), bundle, work, cid))
                views.enter("host")
    first = None
    for name, rows in samples.items():
        roles = sorted({k for row in rows for k in row}, key=lambda k: (k == "total", k))
        print(f"{name}: median CPU ms of {len(rows)} lifecycles")
        for role in roles:
            print(f"  {role:<22} {statistics.median(row.get(role, 0.0) for row in rows):7.2f}")
        total = statistics.median(row["total"] for row in rows)
        first = first or total
        print(f"  {'ratio to ' + runtimes[0][0]:<22} {total / first:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

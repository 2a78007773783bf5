#!/usr/bin/env python3
"""Host memory of sleeping sandboxes, runtime by runtime: starts N `sleep 300` sandboxes
from one busybox bundle with the runtime's CLI (create + start, own --root), then sums the
PSS (/proc/PID/smaps_rollup) of every host process each sandbox has: its init and the
init's descendants, and every process of the runtime's that names the sandbox
(`... --root ROOT ... ID`: agent-sandbox's helper, proxy, watchdog). Runtimes run one after
the other, so no two share pages; the N sandboxes of one runtime share theirs, as on a host.
Prints, per runtime, the processes per sandbox and the PSS per sandbox (mean), and the
ratios to the first runtime. Deletes every sandbox at the end, also on error.

Usage: hack/bench/sandbox_pss.py [--count N] [--settle S] NAME=PATH [NAME=PATH ...]
(run as root; the first runtime is the denominator of the ratios).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["Pss:"]:
            return int(parts[1])
    return 0


def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def sandbox_processes(init: int, root: str, cid: str, tree: dict[int, list[int]]) -> set[int]:
    found = set()
    todo = [init]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(tree.get(pid, []))
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            args = cmdline(int(entry))
            if args and args[-1] == cid and root in args:
                found.add(int(entry))
    return found


HELPERS = ("seccomp-supervise", "proxy", "watchdog", "oom-watch")


def role(pid: int, init: int) -> str:
    """What a process of a sandbox is: the init, one of agent-sandbox's helpers (by its
    subcommand), or the program under the init."""
    if pid == init:
        return "init"
    args = cmdline(pid)
    return next((a for a in args if a in HELPERS), "program")


def make_bundle(work: Path) -> Path:
    bundle = work / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in ("proc", "dev", "sys", "tmp", "etc"):
        (rootfs / d).mkdir()
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["sleep", "300"]
    (bundle / "config.json").write_text(json.dumps(spec))
    for p in (work, bundle, rootfs, rootfs / "bin"):
        p.chmod(0o755)
    (rootfs / "tmp").chmod(0o1777)
    return bundle


def measure(name: str, binary: str, bundle: Path, work: Path, count: int, settle: float) -> dict:
    root = str(work / f"root-{name}")
    ids = [f"pss-{os.getpid()}-{name}-{i}" for i in range(count)]
    inits = {}
    try:
        for cid in ids:
            pid_file = work / f"{cid}.pid"
            subprocess.run([binary, "--root", root, "create", "--bundle", str(bundle), "--pid-file", str(pid_file), cid],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60)
            subprocess.run([binary, "--root", root, "start", cid], check=True, timeout=60,
                           stdout=subprocess.DEVNULL)
            inits[cid] = int(pid_file.read_text().strip())
        time.sleep(settle)
        tree = children_of()
        per = []
        by_role: dict[str, list[int]] = {}
        for cid in ids:
            procs = sandbox_processes(inits[cid], root, cid, tree)
            sizes = {p: pss_kib(p) for p in procs}
            per.append({"processes": len(procs), "pss_kib": sum(sizes.values())})
            for p, kib in sizes.items():
                by_role.setdefault(role(p, inits[cid]), []).append(kib)
        return {
            "pss_kib_by_process": {r: round(sum(v) / len(ids), 1) for r, v in sorted(by_role.items())},
            "name": name,
            "binary": binary,
            "sandboxes": count,
            "processes_per_sandbox": per[0]["processes"],
            "pss_kib_per_sandbox": round(sum(p["pss_kib"] for p in per) / len(per), 1),
            "samples": per,
        }
    finally:
        for cid in ids:
            subprocess.run([binary, "--root", root, "delete", "--force", cid],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("runtimes", nargs="+", metavar="NAME=PATH")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("sandbox_pss.py: run as root", file=sys.stderr)
        return 1
    runtimes = [r.split("=", 1) for r in args.runtimes]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = make_bundle(work)
        rows = [measure(name, path, bundle, work, args.count, args.settle) for name, path in runtimes]
    base = rows[0]["pss_kib_per_sandbox"]
    print(f"{'runtime':<24} {'processes':>9} {'PSS per sandbox':>16} {'ratio':>6}")
    for r in rows:
        ratio = r["pss_kib_per_sandbox"] / base if base else float("nan")
        print(f"{r['name']:<24} {r['processes_per_sandbox']:>9} {r['pss_kib_per_sandbox'] / 1024:>12.2f} MiB {ratio:>6.2f}")
        parts = ", ".join(f"{k} {v / 1024:.2f}" for k, v in r["pss_kib_by_process"].items())
        print(f"  MiB per process: {parts}")
    print(json.dumps({"load": os.getloadavg(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

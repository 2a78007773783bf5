#!/usr/bin/env bash
# Start-latency benchmark of agent-sandbox against crun and runc, interleaved in one
# run so that machine drift cancels (see docs/benchmarks.md):
#   1. the runtime alone: create + start + wait + delete of /bin/true from a busybox
#      bundle, each runtime with its own --root; agent-sandbox's create is also broken
#      down by phase, wall and CPU, from its AGENT_SANDBOX_PHASE_TRACE;
#   2. podman run --rm --network none localhost/agent-sandbox/busybox:latest true,
#      with --runtime agent-sandbox, crun and runc;
#   3. ctr run --rm --runtime io.agent.sandbox vs io.containerd.runc.v2 of the same
#      image, then the RSS/PSS of each shim for a few detached sleeping containers;
#   3b. exec: ctr task exec of `true`, `echo hi` and 1 MiB of output into a running task,
#      io.agent.sandbox vs io.containerd.runc.v2, output checked whole;
#   and, with --sections all (or naming them; hack/bench/extra.py):
#   4. proxy: runtime/proxy/examples/bench.rs (throughput and per-request latency vs direct);
#   5. cri: e2e/examples/cri_bench.rs --json (pod start, ExecSync of `true`, `echo hi` and
#      1 MiB, pod removal; our handler vs runc's);
#   6. density: start latency with 50/200/500 sleeping sandboxes running (--density-max caps);
#   7. criterion: the policy crate's micro-benchmarks;
#   8. task: e2e/examples/agent_task_bench.rs --json, the 50-call agent task of issue #33 per
#      entry point under agent-sandbox and runc (BENCH_TASK_ROUNDS, BENCH_TASK_ENTRIES);
#   9. checkpoint: podman checkpoint, restore in place, checkpoint --export and restore
#      --import of one python3 holding 50 MiB, agent-sandbox vs runc + CRIU interleaved,
#      p50/p95 per phase and ratios (BENCH_CHECKPOINT_ROUNDS; needs CRIU, hack/criu.sh);
#  10. fork: one golden checkpoint (the same python3) imported --fork-batch times per round
#      under new names with every fork left running; the last (Nth) import is the sample,
#      and the host memory each idle fork costs is reported (BENCH_FORK_BATCH, 10;
#      BENCH_FORK_ROUNDS, 5), agent-sandbox vs runc + CRIU.
# Prints medians, p90 and ratios, writes JSON (default target/bench/runtime.json) and a PNG
# chart beside it.
#
# Usage: hack/bench-runtime.sh [--sections all | runtime,podman,ctr,exec,proxy,cri,density,criterion,task,checkpoint,fork]
#                              [--rounds N] [--podman-rounds N] [--ctr-rounds N] [--shims N]
#                              [--agent-sandbox PATH] [--baseline PATH] [--shim PATH] [--out FILE]
#                              [--max-seconds S]
#                              [--density-max N] [--proxy-mb MB] [--chart PNG]
#                              [--checkpoint-rounds N] [--checkpoint-image IMAGE]
#                              [--fork-batch N] [--fork-rounds N]
# Environment: BENCH_ROUNDS (default 30), BENCH_PODMAN_ROUNDS, BENCH_CTR_ROUNDS,
# BENCH_SHIMS (3), BENCH_MAX_SECONDS (300), AGENT_SANDBOX_BIN (default
# /usr/local/bin/agent-sandbox).
#
# Installs from Debian only what the timing needs and is missing (not matplotlib, whose
# chart is optional); the run itself never reaches the network
# (podman runs with --pull never, cargo with --frozen; `unshare --net` around the
# script shows it). The agent-sandbox rows need the
# runtime installed (hack/setup.sh); without it they say so and the others run.
# The timing loop is hack/bench/bench.py (stdlib Python) rather than hyperfine:
# hyperfine runs one command to the end before the next, and cannot alternate
# runtimes round by round or time the phases of one lifecycle.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
    echo "bench-runtime.sh: run as root (the runtimes need it)" >&2
    exit 1
fi

# package -> a file it installs
declare -A packages=(
    [runc]=/usr/sbin/runc
    [crun]=/usr/bin/crun
    [busybox-static]=/bin/busybox
    [podman]=/usr/bin/podman
    [python3]=/usr/bin/python3
)
missing=()
for pkg in "${!packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    # -e, not -x: some of these files (matplotlib's __init__.py) are not executables.
    if [[ $status != "install ok installed" || ! -e ${packages[$pkg]} ]]; then
        missing+=("$pkg")
    fi
done
# The chart is optional (hack/bench/extra.py skips it without matplotlib): installing it
# would pull some thirty packages from the network before a run.
if [[ ! -e /usr/lib/python3/dist-packages/matplotlib/__init__.py ]]; then
    echo "bench-runtime.sh: no chart without python3-matplotlib (apt-get install python3-matplotlib)" >&2
fi
if ((${#missing[@]})); then
    echo "bench-runtime.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The podman rows use the locally built image; load it from the archive that
# hack/images.sh leaves behind if podman's store lacks it.
image=localhost/agent-sandbox/busybox:latest
archive=/var/cache/agent-sandbox/images/busybox.tar
if ! podman image exists "$image" && [[ -f $archive ]]; then
    echo "bench-runtime.sh: loading $archive into podman" >&2
    podman load --quiet -i "$archive" >/dev/null
fi
if ! grep -qs '^default_ulimits' /etc/containers/containers.conf; then
    echo "bench-runtime.sh: warning: /etc/containers/containers.conf has no default_ulimits;" \
        "podman runs fail on this machine until hack/podman.sh has run" >&2
fi

# The ctr section (in the default set) needs containerd running with our shim and
# the images imported: hack/containerd.sh does all three, idempotently.
sections=runtime,podman,ctr,exec
for ((i = 1; i <= $#; i++)); do
    case ${!i} in
        --sections) j=$((i + 1)); sections=${!j:-} ;;
        --sections=*) sections=${!i#--sections=} ;;
    esac
done
if [[ ,$sections, == *,ctr,* || ,$sections, == *,exec,* || ,$sections, == *,density,* || $sections == all ]]; then
    if [[ ! -S /run/containerd/containerd.sock ]] || ! command -v containerd-shim-agent-sandbox >/dev/null ||
        ! ctr --namespace default images ls -q 2>/dev/null | grep -qx "$image"; then
        echo "bench-runtime.sh: setting up containerd (hack/containerd.sh)" >&2
        hack/containerd.sh
    fi
fi

exec /usr/bin/python3 hack/bench/bench.py "$@"

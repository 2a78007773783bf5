#!/usr/bin/env bash
# Prepares containerd for `ctr run --runtime io.agent.sandbox` and the CRI path. Idempotent.
#   1. installs containerd from Debian if missing
#   2. writes /etc/containerd/config.toml registering the runtime `agent-sandbox`
#      (runtime_type io.agent.sandbox) for CRI, with this machine's CRI settings
#   3. builds containerd-shim-agent-sandbox (static, size-optimised) into /usr/local/bin
#   4. starts containerd in the background (no systemd here), log /var/log/containerd.log,
#      and restarts it when the config changed
#   5. imports /var/cache/agent-sandbox/images/*.tar into the namespaces default and k8s.io
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
    echo "containerd.sh: run as root" >&2
    exit 1
fi

config=/etc/containerd/config.toml
socket=/run/containerd/containerd.sock
log=/var/log/containerd.log
images=/var/cache/agent-sandbox/images
shim=containerd-shim-agent-sandbox

# 1. containerd
if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null; then
    apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends containerd runc
fi

# 2. configuration. The CRI settings matter only for the CRI path: root lacks
# CAP_SYS_RESOURCE here (restrict_oom_score_adj), there is no systemd (cgroupfs), nothing
# can be pulled (sandbox_image is the locally built bundles/pause), and pods get the
# host-neutral network of hack/cri.sh from CNI directories of their own (not /etc/cni/net.d,
# where podman's bridge network lives).
# Runtime options: containerd 1.6's CRI hands a non-runc shim only the `ConfigPath` of the
# options table (as runtimeoptions.v1.Options; 1.7+ also sends the table itself), so
# `BinaryName`, `Root` and `Policy` go in the TOML file that ConfigPath names.
# Handlers: agent-sandbox (no options: the runtime beside the shim, the built-in agent profile
# as ceiling), agent-sandbox-e2e (the tests' ceiling; hack/cri.sh writes both files it names),
# runc (the baseline the tests compare against).
desired=$(cat <<'EOF'
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    sandbox_image = "localhost/agent-sandbox/pause:latest"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/agent-sandbox/cni"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox]
        runtime_type = "io.agent.sandbox"
        pod_annotations = ["io.agent.sandbox.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox-e2e]
        runtime_type = "io.agent.sandbox"
        pod_annotations = ["io.agent.sandbox.*"]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox-e2e.options]
          ConfigPath = "/etc/agent-sandbox/cri-e2e-runtime.toml"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
EOF
)
config_changed=0
if [[ ! -f $config ]] || [[ "$(cat "$config")" != "$desired" ]]; then
    mkdir -p "$(dirname "$config")"
    printf '%s\n' "$desired" >"$config.new"
    mv -f "$config.new" "$config"
    config_changed=1
fi

# 3. the shim, where containerd looks for it ($PATH), and the runtime it drives
if [[ ! -x /usr/local/bin/$shim || ! -x /usr/local/bin/agent-sandbox ]]; then
    hack/install-bins.sh /usr/local/bin
fi

# 4. containerd in the background
running() { ctr --address "$socket" version >/dev/null 2>&1; }
if running && ((config_changed)); then
    pid=$(pgrep -x containerd | head -n1 || true)
    if [[ -n $pid ]]; then
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
fi
if ! running; then
    # setsid: containerd must outlive this script's session.
    setsid containerd --config "$config" >>"$log" 2>&1 </dev/null &
    for _ in $(seq 150); do running && break; sleep 0.2; done
    running || { echo "containerd.sh: containerd did not come up; see $log" >&2; exit 1; }
fi

# 5. images
shopt -s nullglob
for archive in "$images"/*.tar; do
    for ns in default k8s.io; do
        ctr --address "$socket" -n "$ns" images import --all-platforms "$archive" >/dev/null
    done
done
echo "containerd.sh: containerd ready at $socket with runtime io.agent.sandbox"

#!/usr/bin/env bash
# Prepares containerd's CRI (the Kubernetes entry point) on this machine, after
# hack/containerd.sh has written its configuration and started it. Idempotent.
#   1. the pod network: the CNI plugin hack/cni/agent-sandbox-veth in /opt/cni/bin (with the
#      loopback plugin CRI also runs) and its conflist in /etc/agent-sandbox/cni, the CNI
#      directories hack/containerd.sh configures. Pods get an eth0 with a link-local /32 whose
#      veth peer stays in the pod: nothing changes in the host's network.
#   2. the ceiling policy of the test handler `agent-sandbox-e2e`: profiles/agent.toml allowing
#      only the tests' local registry (hack/test-hosts.sh), /etc/agent-sandbox/cri-e2e.toml,
#      and the runtime options file naming it (the handler's ConfigPath),
#      /etc/agent-sandbox/cri-e2e-runtime.toml
#   3. the pause image (bundles/pause, built by hack/images.sh) in containerd's k8s.io
#      namespace, and a check that the CRI plugin is up
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
    echo "cri.sh: run as root" >&2
    exit 1
fi

socket=/run/containerd/containerd.sock
cni_bin=/opt/cni/bin
cni_conf=/etc/agent-sandbox/cni
e2e_policy=/etc/agent-sandbox/cri-e2e.toml
e2e_options=/etc/agent-sandbox/cri-e2e-runtime.toml
pause=localhost/agent-sandbox/pause:latest

# Replaces $2 with $1's content only when it differs (atomic rename: CRI watches the CNI dir).
put() {
    local content=$1 path=$2 mode=$3
    if [[ -f $path && "$(cat "$path")" == "$content" ]]; then return 0; fi
    install -d -m 0755 "$(dirname "$path")"
    printf '%s\n' "$content" >"$path.new"
    chmod "$mode" "$path.new"
    mv -f "$path.new" "$path"
    echo "cri.sh: wrote $path"
}

# 1. CNI
put "$(cat hack/cni/agent-sandbox-veth)" "$cni_bin/agent-sandbox-veth" 0755
[[ -x /usr/lib/cni/loopback ]] || {
    echo "cri.sh: /usr/lib/cni/loopback is missing (Debian containernetworking-plugins; hack/install-deps.sh)" >&2
    exit 1
}
ln -sfn /usr/lib/cni/loopback "$cni_bin/loopback"
put '{
  "cniVersion": "1.0.0",
  "name": "agent-sandbox-pod",
  "plugins": [
    { "type": "agent-sandbox-veth" }
  ]
}' "$cni_conf/10-agent-sandbox.conflist" 0644

# 2. the test handler's ceiling: the agent profile with its allow list replaced and local
#    port 8080 allowed (the pod-local connection test).
rules='allow = ["registry.agent-sandbox.test", "127.0.0.2"]'
policy=$(awk -v rules="$rules" '
    skip && /^\]/ { skip = 0; next }
    skip { next }
    /^allow = \[/ { print rules; skip = ($0 !~ /\]/); next }
    /^deny = / { print "deny = []"; next }
    /^local_ports = / { print "local_ports = [8080]"; next }
    { print }
' profiles/agent.toml)
grep -q '^allow = \["registry.agent-sandbox.test"' <<<"$policy" || {
    echo "cri.sh: could not replace the allow list of profiles/agent.toml" >&2
    exit 1
}
grep -q '^local_ports = \[8080\]' <<<"$policy" || {
    echo "cri.sh: could not add local_ports to profiles/agent.toml" >&2
    exit 1
}
put "# Written by hack/cri.sh: ceiling of the CRI test handler agent-sandbox-e2e.
$policy" "$e2e_policy" 0644
# The handler's runtime options (its ConfigPath): the shim forwards Policy to the runtime.
put "# Written by hack/cri.sh: runtime options of the CRI handler agent-sandbox-e2e.
Policy = \"$e2e_policy\"" "$e2e_options" 0644

# 3. the pause image and the CRI plugin
if ! ctr --address "$socket" -n k8s.io images ls -q "name==$pause" | grep -q .; then
    archive=/var/cache/agent-sandbox/images/pause.tar
    [[ -f $archive ]] || {
        echo "cri.sh: $archive is missing; run hack/images.sh PROBE pause" >&2
        exit 1
    }
    ctr --address "$socket" -n k8s.io images import --all-platforms "$archive" >/dev/null
fi
status=$(ctr --address "$socket" plugins ls | awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" {print $NF}')
[[ $status == ok ]] || {
    echo "cri.sh: containerd's CRI plugin is not ok (${status:-missing}); see /var/log/containerd.log" >&2
    exit 1
}
echo "cri.sh: CRI ready (handlers agent-sandbox, agent-sandbox-e2e, runc; pod network agent-sandbox-pod)"

#!/usr/bin/env bash
# Prepares this machine for the tests and the demo. Idempotent: a rerun on a
# prepared machine only rebuilds what changed.
#   1. Debian packages (hack/install-deps.sh)
#   2. podman configuration and the rootless test user (hack/podman.sh)
#   3. release binaries, installed to /usr/local/bin
#   4. the statically linked in-sandbox probe
#   5. the test images (hack/images.sh), loaded into podman
#   6. containerd, when hack/containerd.sh exists
#   7. dockerd with the agent-sandbox runtimes and the test images (hack/docker.sh)
#   8. CRIU 4 for checkpoint/restore (hack/criu.sh; skipped when installed)
set -euo pipefail
cd "$(dirname "$0")/.."
# Root's tools (useradd, runuser, iptables) live in the sbin directories, which a
# minimal CI environment may leave off PATH.
for d in /usr/local/sbin /usr/sbin /sbin; do
    [[ :$PATH: == *":$d:"* ]] || PATH=$PATH:$d
done
export PATH

if [[ $(id -u) != 0 ]]; then
    echo "setup.sh: run as root (it installs packages and configures podman)" >&2
    exit 1
fi
if ! command -v cargo >/dev/null && [[ -f $HOME/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo is not installed" >&2; exit 1; }

step() { printf '\n== setup: %s (%ds)\n' "$1" "$SECONDS"; }

# A full run (builds, images, the VM guest) needs about 10 GiB on the disk that holds the
# repository. Say so first, so that a later "No space left on device" has its explanation.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if (( free_kib < 10 * 1024 * 1024 )); then
    echo "setup.sh: warning: only $((free_kib / 1024)) MiB free on the disk holding $PWD;" \
        "the build and the tests need about 10 GiB" >&2
fi

step "packages"
hack/install-deps.sh

step "podman"
hack/podman.sh

step "binaries"
# The runtime, the static shim and the static probe, into /usr/local/bin.
hack/install-bins.sh /usr/local/bin

step "images"
hack/images.sh /usr/local/bin/probe

if [[ -x hack/containerd.sh ]]; then
    step "containerd"
    hack/containerd.sh
    hack/cri.sh
fi

step "docker"
hack/docker.sh /usr/local/bin

step "criu"
# Checkpoint/restore (docs/checkpoint.md) needs CRIU 4 on kernels from 6.13 on; criu.sh
# returns at once when /usr/local/sbin/criu is already its version.
hack/criu.sh
step "done"

#!/usr/bin/env bash
# Builds the runtime, the shim and the probe and installs them into one directory:
#   hack/install-bins.sh [DIR]      (default: $AGENT_SANDBOX_BIN_DIR, else /usr/local/bin)
# /usr/local/bin is where containerd (on its PATH) and the README expect them. Another DIR lets
# a second work tree test its own build beside the installed one: run the e2e suite with
# AGENT_SANDBOX_BIN_DIR=DIR; podman then gets DIR/agent-sandbox and ctr gets the shim by its
# absolute path, and that shim drives the agent-sandbox beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null && [[ -f $HOME/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
dir=${1:-${AGENT_SANDBOX_BIN_DIR:-/usr/local/bin}}
mkdir -p "$dir"
target_dir=${CARGO_TARGET_DIR:-target}
triple=x86_64-unknown-linux-gnu

# Replace atomically: running containers and shims keep the old inode.
put() {
    local built=$1 name=$2
    if [[ ! -x $built ]]; then
        echo "install-bins.sh: cargo did not produce $built" >&2
        exit 1
    fi
    if ! cmp -s "$built" "$dir/$name"; then
        install -m 0755 "$built" "$dir/.$name.new"
        mv -f "$dir/.$name.new" "$dir/$name"
    fi
}

# The runtime is exec'd several times per container (create re-executes itself from a
# read-only copy, sidecars, exec), and each exec relocates it: packed relative relocations
# (DT_RELR) shrink about 25,000 .rela.dyn entries into a bitmap the loader applies in a
# tight loop, keeping the binary position-independent. Passed to the final link only
# (`cargo rustc`), so the dependencies' build cache is shared with plain `cargo build`.
cargo rustc --release --locked -p agent-sandbox --bin agent-sandbox -- \
    -C link-arg=-Wl,-z,pack-relative-relocs
put "$target_dir/release/agent-sandbox" agent-sandbox

# One shim runs per container (or pod), so it is built for a small resident set: statically
# linked (no shared libc, libm and loader pulled in whole by the kernel's fault-around) and
# optimised for size: 4.0 MiB RSS against 6.0 MiB for the default release build
# (containerd-shim-runc-v2: 12.9); with whole-program LTO in one codegen unit the binary
# shrinks 4.0 -> 3.4 MB and the RSS 4.02 -> 3.35 MiB (0.26x runc-v2's). Its own target
# directory keeps the workspace's cache intact.
CARGO_PROFILE_RELEASE_OPT_LEVEL=s CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    RUSTFLAGS='-C target-feature=+crt-static' \
    CARGO_TARGET_DIR=$target_dir/shim-static \
    cargo build --release --locked -p containerd-shim-agent-sandbox --target "$triple"
put "$target_dir/shim-static/$triple/release/containerd-shim-agent-sandbox" \
    containerd-shim-agent-sandbox

# The probe is static so that it runs in any test image; hack/images.sh bakes it in.
RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$target_dir/probe \
    cargo build --release --locked -p agent-sandbox-probe --target "$triple"
put "$target_dir/probe/$triple/release/probe" probe
echo "install-bins.sh: agent-sandbox, containerd-shim-agent-sandbox and probe are in $dir"

#!/usr/bin/env bash
# The README's test command: prepares this machine (packages, services, images,
# binaries) and runs every test: format, lints, unit tests, the e2e suites and the VM suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Root's tools (useradd, runuser, iptables) live in the sbin directories, which a
# minimal CI environment may leave off PATH.
for d in /usr/local/sbin /usr/sbin /sbin; do
    [[ :$PATH: == *":$d:"* ]] || PATH=$PATH:$d
done
export PATH
if ! command -v cargo >/dev/null && [[ -f $HOME/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
# One full build per run: incremental state would only double the debug target's size.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# The hosts users have (systemd, cgroup v2, AppArmor), which this machine is not: a Debian 12
# guest under qemu runs the same checks with runc and agent-sandbox (docs/vm-suite.md).
hack/vm/test.sh

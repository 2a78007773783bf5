#!/usr/bin/env bash
# The README's test command: prepares this machine (packages, services, images,
# binaries) and runs every test: format, lints, unit tests and the e2e suites.
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
hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

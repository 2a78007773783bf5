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
# The VM suite's guests (docs/vm-suite.md): Debian 12 and sid, the oldest and the newest stack
# users run. Their images (debootstrap and apt from the mirror, then dpkg; cached under
# /var/cache/agent-sandbox/vm) are built at the same time as each other and as the release
# and cargo builds, which need the cores more than they do; the VM suite below waits for them.
# install-deps first brings debootstrap, so they start before setup.sh's long release build.
vm_suites=${VM_SUITES:-bookworm sid}
vm_logs=/var/cache/agent-sandbox/vm-images
[[ $(id -u) == 0 ]] || { echo "test.sh: run as root (README.md)" >&2; exit 1; }
hack/install-deps.sh
install -d "$vm_logs"
vm_images=()
for suite in $vm_suites; do
    hack/vm/image.sh --suite "$suite" >"$vm_logs/$suite.log" 2>&1 &
    vm_images+=("$suite:$!")
done
hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# Commit messages since the rule was written (CONTRIBUTING.md#commits); a shallow clone that
# lacks the base checks the newest commit alone.
commit_rule_base=e6f57ee
if git rev-parse -q --verify "$commit_rule_base^{commit}" >/dev/null; then
    hack/commit-msg --range "$commit_rule_base..HEAD"
else
    hack/commit-msg --range "--max-count=1 HEAD"
fi
for job in "${vm_images[@]}"; do
    wait "${job#*:}" && continue
    echo "test.sh: building the ${job%%:*} VM guest failed; see $vm_logs/${job%%:*}.log" >&2
    tail -n 20 "$vm_logs/${job%%:*}.log" >&2
    exit 1
done
# The guests under qemu (TCG, 2 vCPUs) run the same checks with runc, crun and agent-sandbox
# (docs/vm-suite.md), one after the other: so both fit in CI's 60 minutes; running them at
# once was faster on the shared machine but is not yet measured on a machine of its own
# (docs/vm-suite.md#both-guests-in-cis-60-minutes).
vm_rc=0
for suite in $vm_suites; do
    hack/vm/test.sh --suite "$suite" || vm_rc=1
done
exit "$vm_rc"

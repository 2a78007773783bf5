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
# The VM suite's guests: Debian 12 by default; VM_SUITES="bookworm sid" adds the newest stack. Their images
# (debootstrap and apt, mostly waiting on the mirror and dpkg) are built beside the cargo
# steps; the VM suite below waits for them and then finds them cached.
vm_suites=${VM_SUITES:-bookworm}
vm_images=/var/cache/agent-sandbox/vm-images.log
install -d /var/cache/agent-sandbox && : >"$vm_images"
(for suite in $vm_suites; do hack/vm/image.sh --suite "$suite" || exit 1; done) >>"$vm_images" 2>&1 &
vm_images_pid=$!
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
# The hosts users have (systemd, cgroup v2, AppArmor), which this machine is not: guests under
# qemu run the same checks with runc, crun and agent-sandbox (docs/vm-suite.md). CI runs the
# Debian 12 guest (containerd 1.6, podman 4.3, kernel 6.1): about 13 minutes with a cached image
# on the 2-core machine. The sid guest (containerd 2.1, podman 5.8, kernel 7.2) takes as long
# again plus a 20-minute image build, which does not fit CI's 60 minutes on a fresh machine:
# `VM_SUITES="bookworm sid" hack/test.sh`, or `hack/vm/test.sh --suite sid` alone.
wait "$vm_images_pid" || { echo "test.sh: building the VM guests failed; see $vm_images" >&2; tail -n 20 "$vm_images" >&2; exit 1; }
vm_rc=0
for suite in $vm_suites; do
    hack/vm/test.sh --suite "$suite" || vm_rc=1
done
exit "$vm_rc"

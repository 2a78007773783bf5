#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for N minutes each (not part of CI):
#   hack/fuzz.sh [-m MINUTES] [-j JOBS] [TARGET...]   (default 10 minutes, every target)
# Needs the nightly toolchain and cargo-fuzz (installed from crates.io if missing).
# Corpora grow in fuzz/corpus/<target>/ (git-ignored), seeded from fuzz/regressions/<target>/.
# A crash input is copied to fuzz/regressions/<target>/crash-<sha1>: commit it, and the stable
# test `cargo test -p agent-sandbox-fuzz-targets` (run in CI) replays it from then on.
# Exit status 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${FUZZ_MINUTES:-10}
jobs=1
while (($#)); do
    case $1 in
        -m) minutes=$2; shift 2 ;;
        -j) jobs=$2; shift 2 ;;
        -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[[ $minutes =~ ^[0-9]+$ && $minutes -gt 0 ]] || { echo "fuzz.sh: -m needs whole minutes, got $minutes" >&2; exit 2; }

if ! command -v cargo >/dev/null && [[ -f $HOME/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi

# Builds go to $CARGO_TARGET_DIR/fuzz when set (one target directory per work tree).
target_dir=()
if [[ -n ${CARGO_TARGET_DIR:-} ]]; then target_dir=(--target-dir "$CARGO_TARGET_DIR/fuzz"); fi

targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi
crashed=()
for t in "${targets[@]}"; do
    corpus=fuzz/corpus/$t
    artifacts=fuzz/artifacts/$t
    mkdir -p "$corpus" "$artifacts" "fuzz/regressions/$t"
    echo "fuzz.sh: $t for $minutes minute(s)"
    status=0
    # -max_total_time bounds the run; -timeout makes a hang (an input taking over 10 s) a crash.
    cargo +nightly fuzz run --fuzz-dir fuzz "${target_dir[@]}" --jobs "$jobs" "$t" "$corpus" "fuzz/regressions/$t" -- \
        -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=4096 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?
    for f in "$artifacts"/*; do
        [[ -f $f ]] || continue
        dest=fuzz/regressions/$t/$(basename "$f")
        cp "$f" "$dest"
        echo "fuzz.sh: $t: kept $dest (cargo +nightly fuzz run --fuzz-dir fuzz $t $dest reproduces it)"
    done
    if ((status != 0)); then crashed+=("$t"); fi
done
if ((${#crashed[@]})); then
    echo "fuzz.sh: crashes in ${crashed[*]}: inputs are in fuzz/regressions/<target>/" >&2
    exit 1
fi
echo "fuzz.sh: no crash in ${targets[*]} ($minutes minute(s) each)"

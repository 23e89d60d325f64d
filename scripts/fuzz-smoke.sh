#!/usr/bin/env bash
# Fuzz smoke test: builds every cargo-fuzz target in fuzz/ and runs each for
# a few seconds against a temporary copy of its committed seed corpus
# (fuzz/corpus/<target>/), so the committed corpus never grows. Fails if any
# target crashes, panics, leaks or times out; crash inputs are kept under
# fuzz/artifacts/<target>/ (git-ignored).
#
# Usage: scripts/fuzz-smoke.sh [SECONDS_PER_TARGET]   (default 15)
#
# Needs a nightly toolchain (rustup's `nightly`); installs cargo-fuzz from
# crates.io when it is missing.
set -euo pipefail

secs="${1:-15}"
case "$secs" in
    '' | *[!0-9]*)
        echo "usage: $0 [SECONDS_PER_TARGET]" >&2
        exit 2
        ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"
# cargo fuzz builds into fuzz/target; a target dir set for the main
# workspace would mix sanitizer builds into it.
unset CARGO_TARGET_DIR

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz-smoke: a nightly toolchain is required (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

start=$(date +%s)
echo "fuzz-smoke: building all targets"
cargo +nightly fuzz build --debug-assertions

work="$(mktemp -d "${TMPDIR:-/tmp}/ringcc-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT

failed=()
targets=$(cargo +nightly fuzz list)
for t in $targets; do
    mkdir -p "$work/$t"
    if [ -d "corpus/$t" ]; then
        cp -R "corpus/$t/." "$work/$t/"
    fi
    echo "fuzz-smoke: $t for ${secs}s ($(find "$work/$t" -type f | wc -l) seeds)"
    if ! cargo +nightly fuzz run --debug-assertions "$t" "$work/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$work/$t.log" 2>&1; then
        failed+=("$t")
        tail -n 40 "$work/$t.log" >&2
    else
        grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/$t.log" | tail -n 1 || true
    fi
done

echo "fuzz-smoke: $(echo "$targets" | wc -w) targets in $(($(date +%s) - start))s"
if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz-smoke: FAILED: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: ok"

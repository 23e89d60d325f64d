#!/usr/bin/env bash
# GPU tests of ringcc-cuda: the #[ignore]d tests, run with --ignored where
# nvidia-smi finds a GPU. Without a GPU it says so and exits 0, so the
# master test script can always call it.
#
#   scripts/gpu-tests.sh [extra test-harness args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "GPU tests skipped: no GPU (nvidia-smi not found)"
    exit 0
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "GPU tests skipped: no GPU (nvidia-smi lists none)"
    exit 0
fi
nvidia-smi -L
exec cargo test -p ringcc-cuda --release --test gpu -- --ignored --test-threads=1 "$@"

#!/usr/bin/env bash
# torch.distributed benchmark (never a test): dist.all_reduce busbw of the
# "ringcc" backend vs gloo, 2 and 4 ranks, 4 KiB … 64 MiB float32, the
# ratio per size from one run; and the DDP step time of the tests' small
# model on both. Writes target/bench-torch.txt (the tables, markdown).
#
# Usage: scripts/bench-torch.sh [bench_torch.py arguments, e.g. --ranks 2]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=python-env.sh
source scripts/python-env.sh
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs"
# From the repository root: the installed package, not python/ringcc's sources.
"$PY" python/bench/bench_torch.py "$@" | tee target/bench-torch.txt

#!/usr/bin/env bash
# The Python package's tests: the venv (made once, reused: see
# scripts/python-env.sh), the wheel built from this tree and installed,
# then pytest on python/tests against the installed package (run from the
# repository root, so python/ringcc's sources do not shadow it).
#
# Usage: scripts/python-tests.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
# shellcheck source=python-env.sh
source scripts/python-env.sh
"$PY" -c "import ringcc, ringcc.distributed; assert ringcc.__file__.startswith('$VENV'), ringcc.__file__"
"$PY" -m pytest -q -p no:cacheprovider python/tests "$@"
echo "python tests: $(( $(date +%s) - T0 ))s in all"

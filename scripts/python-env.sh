# Sourced by scripts/python-tests.sh and scripts/bench-torch.sh: the
# Python environment of the ringcc package, made once and reused, and
# the package built from this tree and installed into it.
#
#   venv    ${RINGCC_PY_CACHE:-$HOME/.cache/ringcc}/py with torch (from
#           PyPI: ~5.4 GB with its CUDA libraries, a few minutes the first
#           time), numpy, pytest and maturin; each installed only if the
#           venv lacks it
#   wheel   maturin build --release (abi3) into target/wheels, then
#           pip install --force-reinstall --no-deps
#
# Sets PY (the venv's python). Needs python3 (with venv; python3-venv is
# installed when missing) and the Rust toolchain.

ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
RINGCC_PY_CACHE=${RINGCC_PY_CACHE:-$HOME/.cache/ringcc}
VENV=$RINGCC_PY_CACHE/py
PY=$VENV/bin/python

if [ ! -x "$PY" ]; then
    mkdir -p "$RINGCC_PY_CACHE"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        echo "installing python3-venv"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        rm -rf "$VENV"
        python3 -m venv "$VENV"
    fi
fi

py_need=()
for mod in torch numpy pytest maturin; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || py_need+=("$mod")
done
if [ ${#py_need[@]} -gt 0 ]; then
    echo "installing ${py_need[*]} into $VENV (torch is large: once)"
    t0=$(date +%s)
    "$PY" -m pip install -q --disable-pip-version-check "${py_need[@]}"
    echo "installed in $(( $(date +%s) - t0 ))s; the venv is $(du -sh "$VENV" | cut -f1)"
fi
echo "python: $("$PY" --version), torch $("$PY" -c 'import torch; print(torch.__version__)'), numpy $("$PY" -c 'import numpy; print(numpy.__version__)')"

t0=$(date +%s)
rm -f "$ROOT"/target/wheels/ringcc-*.whl
"$VENV/bin/maturin" build --release --quiet --interpreter "$PY" --manifest-path "$ROOT/python/Cargo.toml" -o "$ROOT/target/wheels"
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$ROOT"/target/wheels/ringcc-*.whl
echo "ringcc wheel built and installed in $(( $(date +%s) - t0 ))s: $(basename "$ROOT"/target/wheels/ringcc-*.whl)"

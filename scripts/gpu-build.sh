#!/usr/bin/env bash
# Builds, on a machine with Rust (no GPU needed), the binaries that
# scripts/gpu-check.sh runs on a GPU machine without a Rust toolchain:
# the GPU test binary and the bandwidth benchmark, stripped, into
# target/gpu-bin/ (an ignored path: carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/gpu-bin
mkdir -p "$dest"

exe_of() { # cargo args... -> path of the executable it built
    cargo "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable"): print(m["executable"])' | tail -n 1
}

tests=$(exe_of test -p ringcc-cuda --release --test gpu)
bench=$(exe_of bench -p ringcc-cuda --bench fused_bw)
[ -n "$tests" ] && [ -n "$bench" ] || { echo "build failed" >&2; exit 1; }
cp "$tests" "$dest/gpu-tests"
cp "$bench" "$dest/fused_bw"
strip "$dest/gpu-tests" "$dest/fused_bw" 2>/dev/null || true
ls -l "$dest"

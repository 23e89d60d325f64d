#!/usr/bin/env bash
# Runs every test of ringcc, in order, and stops at the first failure:
#
#   1. system packages (apt-get, idempotent) and tools
#   2. formatting            cargo fmt --check
#   3. lints                 cargo clippy -D warnings; the API docs build
#                            without warnings (broken links fail)
#   4. unit + property tests cargo test --release (workspace)
#      CLI benchmark         the README's main command: wall time, memory
#                            (a report, never a failure on a number)
#      network namespaces    ranks on two "hosts" (namespaces joined by a
#                            veth pair): shm inside, TCP between (root;
#                            SKIPPED, said clearly, where it cannot run)
#   5. loom models           the slot FIFO under every interleaving; two
#                            engines over it (bounded preemptions); LL and
#                            LL128 slots reused by one writer and one reader
#   6. no_std check          a freestanding binary links the core; defmt builds
#   7. fuzzing               every wire-format fuzz target, briefly
#      Python tests          the ringcc package and its torch backend
#                            (pytest; torch installed once into a cache)
#   8. Soft-RoCE VM tests    real RDMA verbs in a VM, multi-process
#   9. GPU tests             when a GPU is present (said clearly when not)
#
# Usage: scripts/test-all.sh
# Environment: FUZZ_SECONDS (per target, default 10), SKIP_VM=1 to skip
# stage 8 (for a quick local run; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
T0=$(date +%s)
TIMES=()

stage() {
    STAGE_NAME=$1
    STAGE_T0=$(date +%s)
    echo
    echo "=== [$(date +%T)] $STAGE_NAME"
}
done_stage() {
    local dt=$(( $(date +%s) - STAGE_T0 ))
    TIMES+=("$(printf '%-26s %5ss' "$STAGE_NAME" "$dt")")
    echo "=== $STAGE_NAME: ok (${dt}s)"
}

stage "1. packages and tools"
apt_need=()
command -v python3 >/dev/null || apt_need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || apt_need+=(python3-pip)
command -v c++ >/dev/null || apt_need+=(g++)
# sideway (the verbs backend) builds a small rdma-core shim with cmake and
# bindgen; the crate builds (and clippy checks it) even without RDMA.
command -v cmake >/dev/null || apt_need+=(cmake)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || apt_need+=(libclang-dev)
if [ ${#apt_need[@]} -gt 0 ]; then
    echo "installing ${apt_need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${apt_need[@]}" >/dev/null
fi
# NVRTC from PyPI: the CUDA backend compiles every generated kernel with
# it, no GPU or driver needed.
NVRTC_DIR=$ROOT/target/nvrtc-py
if ! ls "$NVRTC_DIR"/nvidia/cuda_nvrtc/lib/libnvrtc.so* >/dev/null 2>&1; then
    echo "installing NVRTC (pip: nvidia-cuda-nvrtc-cu12) into target/nvrtc-py"
    python3 -m pip install -q --disable-pip-version-check --target "$NVRTC_DIR" nvidia-cuda-nvrtc-cu12 \
        || python3 -m pip install -q --disable-pip-version-check --break-system-packages --target "$NVRTC_DIR" nvidia-cuda-nvrtc-cu12
fi
RINGCC_NVRTC_LIB=$(ls "$NVRTC_DIR"/nvidia/cuda_nvrtc/lib/libnvrtc.so.* | grep -v builtins | head -n 1)
export RINGCC_NVRTC_LIB
echo "NVRTC: $RINGCC_NVRTC_LIB"
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
done_stage

stage "2. fmt"
cargo fmt --all -- --check
cargo fmt --manifest-path nostd-check/Cargo.toml -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
done_stage

stage "3. clippy -D warnings"
cargo clippy --locked --workspace --all-targets -- -D warnings
# The CLI's optional backends (the default build has the simulator and CUDA).
cargo clippy --locked -p ringcc --all-targets --features verbs -- -D warnings
cargo clippy --locked --manifest-path nostd-check/Cargo.toml -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps -q
done_stage

stage "4. unit and property tests"
cargo test --locked --workspace --release
# The command's tests again with the verbs backend compiled in (its
# rendezvous and log output on a machine without an RDMA device; the same
# binary then runs in the Soft-RoCE VM of stage 8).
cargo test --locked -p ringcc --release --features verbs --test cli
done_stage

stage "4b. CLI benchmark (report only)"
scripts/bench-cli.sh
done_stage

stage "4c. network-namespace tests"
# The communicator's netns_ tests and `ringcc perf --backend host` with
# ranks in two network namespaces (shm inside each, TCP over the veth).
scripts/netns-tests.sh
done_stage

stage "5. loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$ROOT/target/loom \
    cargo test --locked -p ringcc-core --release --test loom_fifo
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$ROOT/target/loom \
    cargo test --locked -p ringcc-core --release --test loom_engine
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$ROOT/target/loom \
    cargo test --locked -p ringcc-core --release --test loom_line
done_stage

stage "6. no_std check"
cargo build --locked --release --manifest-path nostd-check/Cargo.toml
cargo check --locked -p ringcc-core --no-default-features --features defmt
cargo check --locked -p ringcc-core --no-default-features --features embedded-hal
done_stage

stage "7. fuzzing (${FUZZ_SECONDS:-10}s per target)"
scripts/fuzz-smoke.sh "${FUZZ_SECONDS:-10}"
done_stage

stage "Python tests"
# The Python package (python/): its venv with torch from PyPI is made once
# under ${RINGCC_PY_CACHE:-$HOME/.cache/ringcc}/py and reused; the wheel is
# built from this tree (maturin, release) and pytest runs python/tests
# (the plain package, and the "ringcc" torch.distributed backend against
# gloo, DDP included).
scripts/python-tests.sh
done_stage

stage "8. Soft-RoCE VM tests"
if [ "${SKIP_VM:-0}" = 1 ]; then
    echo "Soft-RoCE VM tests SKIPPED: SKIP_VM=1"
else
    # One benchmark round keeps CI short; run the script alone for the
    # three-round medians the README quotes.
    VERBS_BENCH_ROUNDS=${VERBS_BENCH_ROUNDS:-1} scripts/verbs-vm-tests.sh
fi
done_stage

stage "9. GPU tests"
scripts/gpu-tests.sh
done_stage

echo
echo "=== all tests passed in $(( $(date +%s) - T0 ))s"
printf '  %s\n' "${TIMES[@]}"

#!/bin/bash
# The Soft-RoCE stage of the test script: builds the verbs backend's
# multi-process tests and its rank binary here, boots ONE VM with an RDMA
# device (scripts/rxe-vm.sh) and runs in it
#   1. the multi-process tests (backend-verbs/tests/vm.rs, --ignored):
#      2, 3, 4 and 8 ranks, every collective, faults, two "nodes" with
#      shared memory inside and verbs between, and the `ringcc perf`
#      command itself (`--backend verbs` under a launcher and with --np,
#      `--backend host` on two RINGCC_NODEs: shm inside, verbs between);
#      then ringcc-cuda's device loop on two "nodes" through its network
#      proxy over verbs (backend-cuda/tests/loop_processes.rs);
#   2. the benchmark: ib_write_bw (unidirectional, and -b bidirectional) and
#      a 2-rank ringcc AllReduce (1 and 2 channels), 16 MiB, same device,
#      in interleaved rounds; `ringcc perf --backend verbs` on verbs' FIFO
#      and on the communicator's default one.
# Prints the ratios and writes them to target/verbs-bench.txt; the VM's
# console log and every run's output are kept in target/verbs-vm/.
#
#   scripts/verbs-vm-tests.sh [--no-tests] [--no-bench] [-- TEST-FILTER...]
#
# Environment: CARGO_TARGET_DIR (default target/), RXE_VM_TIMEOUT (s, 1200),
# VERBS_BENCH_BYTES (16777216), VERBS_BENCH_ITERS (ringcc, 5),
# IBW_ITERS (ib_write_bw, 10), VERBS_BENCH_ROUNDS (3), VERBS_BENCH_BASE (a
# `verbs_rank` built from another commit: each round also runs it, and the
# report gives this build's AllReduce as a ratio to it); RINGCC_SLOT_BYTES,
# RINGCC_SLOTS_PER_SLICE, RINGCC_CHUNK_BYTES, RINGCC_CHANNEL_BYTES and
# RUST_LOG pass through to the ranks.
# Needs root for apt-get when packages are missing (cmake and libclang-dev for the build;
# the VM's own list in scripts/rxe-vm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_TESTS=1; RUN_BENCH=1; FILTER=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) RUN_TESTS=0; shift;;
    --no-bench) RUN_BENCH=0; shift;;
    --) shift; FILTER=("$@"); break;;
    *) echo "usage: $0 [--no-tests] [--no-bench] [-- TEST-FILTER...]" >&2; exit 2;;
  esac
done
T_START=$(date +%s)

# Build dependencies of sideway's rdma-core shim (cmake, libclang).
need=()
command -v cmake >/dev/null || need+=(cmake)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "verbs-vm-tests: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The VM's packages (qemu, kernel, rdma-core, perftest) and its initramfs.
scripts/rxe-vm.sh --setup-only

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$TARGET"
echo "verbs-vm-tests: building (release)" >&2
# One build of the crate's tests and examples (the rank binary): after the
# workspace's `cargo test --release` this is (nearly) a no-op.
BUILD_LOG=$(mktemp)
if ! cargo test --release -p ringcc-verbs --no-run > "$BUILD_LOG" 2>&1; then
  cat "$BUILD_LOG" >&2; rm -f "$BUILD_LOG"; exit 1
fi
TEST_BIN=$(sed -n 's/.*Executable tests\/vm.rs (\(.*\))/\1/p' "$BUILD_LOG" | tail -1)
rm -f "$BUILD_LOG"
[ -n "$TEST_BIN" ] || { echo "verbs-vm-tests: cannot find the vm test binary" >&2; exit 1; }
case "$TEST_BIN" in /*) ;; *) TEST_BIN=$ROOT/$TEST_BIN;; esac
# The device loop's network proxy over verbs (ringcc-cuda's host-C++
# loop in processes on two "nodes"): one test of that crate's binary.
LOOP_LOG=$(mktemp)
if ! cargo test --release -p ringcc-cuda --test loop_processes --no-run > "$LOOP_LOG" 2>&1; then
  cat "$LOOP_LOG" >&2; rm -f "$LOOP_LOG"; exit 1
fi
LOOP_BIN=$(sed -n 's/.*Executable tests\/loop_processes.rs (\(.*\))/\1/p' "$LOOP_LOG" | tail -1)
rm -f "$LOOP_LOG"
[ -n "$LOOP_BIN" ] || { echo "verbs-vm-tests: cannot find the loop_processes test binary" >&2; exit 1; }
case "$LOOP_BIN" in /*) ;; *) LOOP_BIN=$ROOT/$LOOP_BIN;; esac
RANK_BIN=$TARGET/release/examples/verbs_rank
[ -x "$RANK_BIN" ] || { echo "verbs-vm-tests: no $RANK_BIN" >&2; exit 1; }
# The `ringcc perf --backend verbs` command: tested (tests/vm.rs runs it as
# users do) and measured next to the rest.
cargo build --locked --release -q -p ringcc --features verbs
PERF_BIN=$TARGET/release/ringcc
[ -x "$PERF_BIN" ] || { echo "verbs-vm-tests: no $PERF_BIN" >&2; exit 1; }
T_BUILT=$(date +%s)

# Scratch shared with the VM: a directory of this run's own (copied to
# $TARGET/verbs-vm/ at the end).
mkdir -p /var/tmp/rxe-vm
RXE_VM_OUT=$(mktemp -d /var/tmp/rxe-vm/verbs.XXXXXX)
export RXE_VM_OUT
BYTES=${VERBS_BENCH_BYTES:-16777216}
ITERS=${VERBS_BENCH_ITERS:-5}
IBW_ITERS=${IBW_ITERS:-10}
ROUNDS=${VERBS_BENCH_ROUNDS:-3}
BASE_BIN=${VERBS_BENCH_BASE:-}
if [ -n "$BASE_BIN" ]; then
  case "$BASE_BIN" in /*) ;; *) BASE_BIN=$ROOT/$BASE_BIN;; esac
  [ -x "$BASE_BIN" ] || { echo "verbs-vm-tests: VERBS_BENCH_BASE=$BASE_BIN is not an executable" >&2; exit 2; }
  # The VM sees this machine's /tmp as an empty tmpfs: run the copy in
  # the shared scratch directory, wherever the binary was built.
  cp "$BASE_BIN" "$RXE_VM_OUT/base-verbs_rank"
  BASE_BIN=$RXE_VM_OUT/base-verbs_rank
fi

# What runs inside the VM.
{
  echo 'set -u'
  printf 'OUT=%q; RANK_BIN=%q; TEST_BIN=%q; PERF_BIN=%q; LOOP_BIN=%q\n' "$RXE_VM_OUT" "$RANK_BIN" "$TEST_BIN" "$PERF_BIN" "$LOOP_BIN"
  printf 'BYTES=%q; ITERS=%q; IBW_ITERS=%q; ROUNDS=%q; RUN_TESTS=%q; RUN_BENCH=%q; BASE_BIN=%q\n' \
    "$BYTES" "$ITERS" "$IBW_ITERS" "$ROUNDS" "$RUN_TESTS" "$RUN_BENCH" "$BASE_BIN"
  printf 'FILTER=(%s)\n' "$(printf '%q ' "${FILTER[@]}")"
  # FIFO geometry overrides and the log filter (RUST_LOG) for experiments
  # reach the ranks in the VM.
  for v in RINGCC_SLOT_BYTES RINGCC_SLOTS_PER_SLICE RINGCC_CHUNK_BYTES RINGCC_CHANNEL_BYTES RUST_LOG; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  cat <<'VM'
export RINGCC_VERBS_RANK_BIN=$RANK_BIN RINGCC_CLI_BIN=$PERF_BIN
trc=0
if [ "$RUN_TESTS" = 1 ]; then
  t0=$(date +%s)
  "$TEST_BIN" --ignored --test-threads=1 --nocapture "${FILTER[@]}" 2>&1 | tee "$OUT/tests.txt"
  trc=${PIPESTATUS[0]}
  # ringcc-cuda's device loop across two nodes through its proxy, over verbs.
  loop_test=two_nodes_over_verbs_on_the_device_loop_through_the_proxy
  # (No filter given arrives as one empty word.)
  if [ -z "${FILTER[*]// /}" ] || printf '%s\n' "${FILTER[@]}" | grep -q -e device_loop -e proxy; then
    "$LOOP_BIN" --ignored --exact "$loop_test" --nocapture 2>&1 | tee -a "$OUT/tests.txt"
    lrc=${PIPESTATUS[0]}
    [ "$lrc" = 0 ] || trc=$lrc
  fi
  echo "vm: tests took $(( $(date +%s) - t0 ))s (exit $trc)"
fi
if [ "$RUN_BENCH" = 1 ]; then
  ibw() { # ibw NAME [-s BYTES] EXTRA-FLAGS...: one ib_write_bw run; MB/s appended to NAME.MBps.txt
    local name=$1 size=$BYTES iters=$IBW_ITERS v; shift
    if [ "${1:-}" = -s ]; then
      # Smaller messages, as many iterations as make the same bytes.
      size=$2; iters=$(( IBW_ITERS * BYTES / size )); shift 2
    fi
    timeout 300 ib_write_bw -d rxe0 -x 1 -F -s "$size" -n "$iters" "$@" > "$OUT/$name-server.txt" 2>&1 &
    local srv=$!
    # The server takes a while to listen under emulation: retry.
    for try in 1 2 3 4 5 6 7 8 9 10; do
      sleep 1
      timeout 300 ib_write_bw -d rxe0 -x 1 -F -s "$size" -n "$iters" "$@" 127.0.0.1 > "$OUT/$name.txt" 2>&1
      grep -q "Couldn't connect" "$OUT/$name.txt" || break
    done
    wait $srv
    v=$(awk -v s="$size" '$1==s {print $4}' "$OUT/$name.txt" | tail -1)
    echo "$name: ${v:-failed} MB/s"
    echo "${v:--}" >> "$OUT/$name.MBps.txt"
  }
  ringcc() { # ringcc NAME CHANNELS [BIN]: one 2-rank AllReduce run; busbw appended to NAME.MBps.txt
    # A port below the ephemeral range, so that no live connection holds it.
    local name=$1 port=$(( 20000 + RANDOM % 10000 )) bin=${3:-$RANK_BIN} v r
    rm -f "$OUT/$name.json"
    for r in 0 1; do
      RINGCC_RANK=$r RINGCC_WORLD_SIZE=2 RINGCC_ADDR=127.0.0.1:$port RINGCC_TOKEN=bench \
        RINGCC_NCHANNELS=$2 timeout 600 "$bin" bench --bytes "$BYTES" --iters "$ITERS" \
        --warmup 1 --out "$OUT/$name.json" > "$OUT/$name-$r.txt" 2>&1 &
    done
    wait
    v=$(sed -n 's/.*"busbw_MBps":\([0-9.]*\).*/\1/p' "$OUT/$name.json" 2>/dev/null)
    echo "$name: ${v:-failed} MB/s"
    [ -n "$v" ] || tail -n 3 "$OUT/$name-0.txt"
    echo "${v:--}" >> "$OUT/$name.MBps.txt"
  }
  perf() { # perf NAME CHANNELS [COLLECTIVE [VAR=VALUE...]]: 2-rank `ringcc perf COLLECTIVE --backend verbs`
    local name=$1 ch=$2 port=$(( 20000 + RANDOM % 10000 )) coll=${3:-allreduce} v r
    shift 2; [ $# -gt 0 ] && shift
    rm -f "$OUT/$name.json"
    for r in 0 1; do
      env "$@" \
        RINGCC_RANK=$r RINGCC_WORLD_SIZE=2 RINGCC_ADDR=127.0.0.1:$port RINGCC_TOKEN=bench \
        RINGCC_NCHANNELS=$ch timeout 600 "$PERF_BIN" perf "$coll" --backend verbs \
        -b "$BYTES" -e "$BYTES" -n "$ITERS" -w 1 -J "$OUT/$name.json" > "$OUT/$name-$r.txt" 2>&1 &
    done
    wait
    v=$(sed -n 's/.*"avg_busbw_gbps": *\([0-9.eE+-]*\).*/\1/p' "$OUT/$name.json" 2>/dev/null \
      | awk 'NR==1 {printf "%.3f", $1 * 1000}')
    echo "$name: ${v:-failed} MB/s"
    [ -n "$v" ] || tail -n 5 "$OUT/$name-0.txt"
    echo "${v:--}" >> "$OUT/$name.MBps.txt"
  }
  # Interleaved rounds: the emulated machine's speed drifts.
  for round in $(seq "$ROUNDS"); do
    ibw ibw-uni
    ibw ibw-bi -b
    # ib_write_bw with messages of ringcc's default slice (1 MiB): what
    # this device does with the message size ringcc actually posts.
    ibw ibw-uni-1m -s 1048576
    ringcc ringcc-c1 1
    ringcc ringcc-c2 2
    # The same runs with another commit's build, in the same round.
    if [ -n "$BASE_BIN" ]; then
      ringcc base-c1 1 "$BASE_BIN"
      ringcc base-c2 2 "$BASE_BIN"
    fi
    [ -n "$PERF_BIN" ] && perf perf-c2 2
    # One direction only (root 0 to rank 1): the transport's share of
    # ib_write_bw without the reduction or the reverse direction.
    [ -n "$PERF_BIN" ] && perf bcast-c2 2 broadcast
    # The same AllReduce on the communicator's default FIFO (128 KiB
    # slots, one per slice, 512 KiB chunks: sized for shared memory)
    # instead of verbs' (ringcc_verbs::GEOMETRY): eight times the
    # messages, completions and credits per byte. What verbs' FIFO gains
    # is this emulated device's per-message cost.
    [ -n "$PERF_BIN" ] && perf perf-c2-comm 2 allreduce RINGCC_SLOT_BYTES=131072 RINGCC_CHUNK_BYTES=524288
  done
fi
exit $trc
VM
} > "$RXE_VM_OUT/in-vm.sh"

set +e
scripts/rxe-vm.sh --timeout "${RXE_VM_TIMEOUT:-1200}" -- bash "$RXE_VM_OUT/in-vm.sh"
rc=$?
set -e
T_END=$(date +%s)

median() { # median of the numbers on stdin, one per line (none: nothing)
  grep -E '^[0-9]+([.][0-9]*)?$' | sort -g \
    | awk '{v[NR]=$1} END {if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
}
ratios() { # per-round A/(B/DIV) of two files of per-round numbers ("-": a failed run)
  paste -d' ' "$1" "$2" | awk -v d="${3:-1}" '$1+0 > 0 && $2+0 > 0 {printf "%.3f\n", $1/($2/d)}'
}
if [ "$RUN_BENCH" = 1 ]; then
  O=$RXE_VM_OUT
  for f in ibw-uni ibw-bi ibw-uni-1m ringcc-c1 ringcc-c2 perf-c2 bcast-c2 perf-c2-comm base-c1 base-c2; do touch "$O/$f.MBps.txt"; done
  uni=$(median < "$O/ibw-uni.MBps.txt")
  bi=$(median < "$O/ibw-bi.MBps.txt")
  c1=$(median < "$O/ringcc-c1.MBps.txt")
  c2=$(median < "$O/ringcc-c2.MBps.txt")
  p2=$(median < "$O/perf-c2.MBps.txt")
  rp=$(ratios "$O/perf-c2.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  bp=$(ratios "$O/perf-c2.MBps.txt" "$O/ibw-bi.MBps.txt" 2 | median)
  bc=$(median < "$O/bcast-c2.MBps.txt")
  rb=$(ratios "$O/bcast-c2.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  u1=$(median < "$O/ibw-uni-1m.MBps.txt")
  r1m=$(ratios "$O/ibw-uni-1m.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  rp1m=$(ratios "$O/perf-c2.MBps.txt" "$O/ibw-uni-1m.MBps.txt" | median)
  pg=$(median < "$O/perf-c2-comm.MBps.txt")
  rg=$(ratios "$O/perf-c2-comm.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  rv=$(ratios "$O/perf-c2.MBps.txt" "$O/perf-c2-comm.MBps.txt" | median)
  r1=$(ratios "$O/ringcc-c1.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  r2=$(ratios "$O/ringcc-c2.MBps.txt" "$O/ibw-uni.MBps.txt" | median)
  # An AllReduce rank sends and receives at once: its busbw (bytes sent
  # per rank) against -b's rate per direction (half its sum).
  b1=$(ratios "$O/ringcc-c1.MBps.txt" "$O/ibw-bi.MBps.txt" 2 | median)
  b2=$(ratios "$O/ringcc-c2.MBps.txt" "$O/ibw-bi.MBps.txt" 2 | median)
  a1=; a2=
  if [ -n "$BASE_BIN" ]; then
    # `|| true`: no base numbers (every base run failed) is reported as "?",
    # not a script failure.
    a1=$(ratios "$O/ringcc-c1.MBps.txt" "$O/base-c1.MBps.txt" | median || true)
    a2=$(ratios "$O/ringcc-c2.MBps.txt" "$O/base-c2.MBps.txt" | median || true)
  fi
  {
    echo "# ringcc-verbs benchmark: Soft-RoCE (rxe0) in a qemu TCG VM, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# $BYTES-byte messages, $ROUNDS interleaved rounds (MB/s; each ratio is the median"
    echo "# of per-round ratios, since the emulated machine's speed drifts):"
    echo "#   ib_write_bw -s $BYTES -n $IBW_ITERS: unidirectional; -b: both directions, summed"
    echo "#   ringcc AllReduce f32 sum, 2 ranks, busbw over $ITERS iterations, 1 and 2 channels"
    echo "#   (verbs_rank bench), and \`ringcc perf allreduce --backend verbs\` with 2 channels"
    echo "#   (its avg_busbw: out-of-place and in-place columns), and \`ringcc perf broadcast\`"
    echo "#   (one direction, no reduction: the transport alone), and the perf AllReduce"
    echo "#   on the communicator's default FIFO (128 KiB slots, 512 KiB chunks) instead of"
    echo "#   verbs' (512 KiB slots, 2 per slice, 2 MiB chunks)"
    echo "#   ib_write_bw with 1 MiB messages (ringcc's default slice), same bytes"
    for f in ibw-uni ibw-bi ibw-uni-1m ringcc-c1 ringcc-c2 perf-c2 bcast-c2 perf-c2-comm; do
      echo "# $f runs: $(tr '\n' ' ' < "$O/$f.MBps.txt")"
    done
    echo "ib_write_bw_MBps=${uni:-?}"
    echo "ib_write_bw_bidir_MBps=${bi:-?}"
    echo "ringcc_allreduce_busbw_1ch_MBps=${c1:-?}"
    echo "ringcc_allreduce_busbw_2ch_MBps=${c2:-?}"
    echo "ringcc_perf_allreduce_busbw_2ch_MBps=${p2:-?}"
    echo "ratio_1ch_vs_ib_write_bw=${r1:-?}"
    echo "ratio_2ch_vs_ib_write_bw=${r2:-?}"
    echo "ratio_1ch_vs_ib_write_bw_bidir_per_direction=${b1:-?}"
    echo "ratio_2ch_vs_ib_write_bw_bidir_per_direction=${b2:-?}"
    echo "ratio_perf_2ch_vs_ib_write_bw=${rp:-?}"
    echo "ratio_perf_2ch_vs_ib_write_bw_bidir_per_direction=${bp:-?}"
    echo "ringcc_perf_broadcast_busbw_2ch_MBps=${bc:-?}"
    echo "ratio_perf_broadcast_2ch_vs_ib_write_bw=${rb:-?}"
    echo "ib_write_bw_1MiB_messages_MBps=${u1:-?}"
    echo "ratio_ib_write_bw_1MiB_vs_16MiB_messages=${r1m:-?}"
    echo "ratio_perf_2ch_vs_ib_write_bw_1MiB_messages=${rp1m:-?}"
    echo "ringcc_perf_allreduce_busbw_2ch_comm_fifo_MBps=${pg:-?}"
    echo "ratio_perf_2ch_comm_fifo_vs_ib_write_bw=${rg:-?}"
    echo "ratio_perf_2ch_verbs_fifo_vs_comm_fifo=${rv:-?}"
    if [ -n "$BASE_BIN" ]; then
      echo "# base: $BASE_BIN; base-c1 runs: $(tr '\n' ' ' < "$O/base-c1.MBps.txt"); base-c2 runs: $(tr '\n' ' ' < "$O/base-c2.MBps.txt")"
      echo "ratio_1ch_vs_base=${a1:-?}"
      echo "ratio_2ch_vs_base=${a2:-?}"
    fi
  } > "$TARGET/verbs-bench.txt"
  cat "$TARGET/verbs-bench.txt"
  if [ -z "$r1" ] && [ -z "$r2" ]; then
    echo "verbs-vm-tests: the benchmark produced no numbers" >&2
    [ "$rc" = 0 ] && rc=1
  fi
  if [ -z "$rp" ]; then
    echo "verbs-vm-tests: \`ringcc perf --backend verbs\` produced no numbers" >&2
    [ "$rc" = 0 ] && rc=1
  fi
fi
rm -rf "$TARGET/verbs-vm"
mkdir -p "$TARGET/verbs-vm"
cp "$RXE_VM_OUT"/* "$TARGET/verbs-vm/" 2>/dev/null || true
rm -rf "$RXE_VM_OUT"
echo "verbs-vm-tests: build $((T_BUILT - T_START))s, VM $((T_END - T_BUILT))s, exit $rc" >&2
exit $rc

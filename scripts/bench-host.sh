#!/bin/bash
# ringcc's shared-memory AllReduce (ringcc-host's shm_bench: N processes on
# this host) against OpenMPI's MPI_Allreduce over the same processes count
# (--mca btl self,vader: its shared-memory path), float sum, out of place,
# measured in interleaved rounds of the same run; prints each size's busbw
# and the ratio (median of per-round ratios) and writes target/bench-host.txt.
# A benchmark, not a test. Installs openmpi-bin and libopenmpi-dev when
# missing (root, apt-get).
#
#   scripts/bench-host.sh [NP...]        (default: 2 4)
# Environment: BENCH_BYTES (comma list, default 65536,1048576,4194304,16777216,67108864),
# BENCH_ITERS (10), BENCH_ROUNDS (3), BENCH_CHANNELS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
NPS=("$@"); [ ${#NPS[@]} -gt 0 ] || NPS=(2 4)
BYTES=${BENCH_BYTES:-65536,1048576,4194304,16777216,67108864}
ITERS=${BENCH_ITERS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
CH=${BENCH_CHANNELS:-2}
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "bench-host: installing openmpi-bin libopenmpi-dev" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
fi
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --locked --release -q -p ringcc-host --example shm_bench
mkdir -p "$TARGET"
MPI_BIN=$TARGET/mpi_allreduce
mpicc -O2 -o "$MPI_BIN" scripts/bench/mpi_allreduce.c
OUT=$(mktemp -d)
for np in "${NPS[@]}"; do
  for round in $(seq "$ROUNDS"); do
    "$TARGET/release/examples/shm_bench" --np "$np" --bytes "$BYTES" --iters "$ITERS" --channels "$CH" \
      | awk '!/^#/ {print $1, $4}' > "$OUT/ringcc-$np-$round.txt"
    mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl self,vader \
      "$MPI_BIN" "$ITERS" ${BYTES//,/ } | awk '{print $1, $4}' > "$OUT/mpi-$np-$round.txt"
  done
done
median() { sort -g | awk '{v[NR]=$1} END {if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
{
  echo "# ringcc-host shm AllReduce vs OpenMPI MPI_Allreduce (btl self,vader), float sum, out of place,"
  echo "# $ROUNDS interleaved rounds, $ITERS iterations, $CH channel(s); busbw GB/s medians, ratio = median of per-round ratios"
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPU(s)"
  printf "%4s %12s %12s %12s %8s\n" np bytes ringcc openmpi ratio
  for np in "${NPS[@]}"; do
    for b in ${BYTES//,/ }; do
      r=$(cat "$OUT"/ringcc-"$np"-*.txt | awk -v b="$b" '$1==b {print $2}' | median)
      m=$(cat "$OUT"/mpi-"$np"-*.txt | awk -v b="$b" '$1==b {print $2}' | median)
      q=$(for k in $(seq "$ROUNDS"); do
            paste -d' ' <(awk -v b="$b" '$1==b {print $2}' "$OUT/ringcc-$np-$k.txt") \
                        <(awk -v b="$b" '$1==b {print $2}' "$OUT/mpi-$np-$k.txt")
          done | awk '$2 > 0 {printf "%.3f\n", $1/$2}' | median)
      printf "%4s %12s %12s %12s %8s\n" "$np" "$b" "${r:-?}" "${m:-?}" "${q:-?}"
    done
  done
} | tee "$TARGET/bench-host.txt"
rm -rf "$OUT"

#!/bin/bash
# ringcc's host backend (`ringcc perf allreduce --backend host`) against
# MPI_Allreduce (scripts/bench/mpi_allreduce.c), float sum, out of place,
# in interleaved rounds of one run (every size of every implementation
# once per round); prints each size's time and busbw (medians), the 8 B
# latency of each, and ratios = median of the per-round ratios (peer time
# / ringcc time: above 1, ringcc is faster). A benchmark, not a test.
#
#   scripts/bench-host.sh [NP...]     shared memory, N ranks on this host
#                                     (default: 2 4) — ringcc `--np N`;
#                                     OpenMPI `mpirun.openmpi --mca btl
#                                     self,vader` (its shared-memory path);
#                                     MPICH `mpirun.mpich` (its default
#                                     shared memory). Writes
#                                     target/bench-host.txt.
#   scripts/bench-host.sh --tcp       TCP between two "nodes": two network
#                                     namespaces joined by a veth pair
#                                     (10.77.0.1/24, 10.77.0.2/24), one rank
#                                     in each — ringcc with RINGCC_NODE=a|b
#                                     (launched here, as a launcher would),
#                                     OpenMPI with `--mca btl self,tcp` over
#                                     the same veth. Writes
#                                     target/bench-host-tcp.txt. Needs root.
#
# OpenMPI across namespaces: mpirun runs in the first namespace with a host
# file naming both veth addresses and an rsh "agent" that starts the
# second host's daemon under `ip netns exec` (both namespaces share the
# host name, so --mca btl self,tcp keeps OpenMPI off shared memory, and
# --bind-to none keeps both ranks from being bound to the same core 0 of
# their "node": bound, each call waited out a 4 ms scheduler tick). MPICH
# is compared on shared memory only.
#
# Fairness notes: both sides do BENCH_WARMUP (5, nccl-tests' -w default)
# untimed calls per size (one until 2026-12: over TCP the first calls of a
# fresh connection run while the kernel grows its 16 KiB send buffer, and
# ringcc's 1 MiB of FIFO in flight waited on that); ringcc's time
# is its slowest rank's, MPI's rank 0's after a barrier; ringcc's perf runs
# without its check (-c 0: correctness is the tests' job). The MPI program
# prints microseconds with one decimal, so MPI's 8 B latencies are coarse.
# Each size gets about BENCH_ITER_BYTES of traffic (5 to 200 calls). Four
# ranks oversubscribe a 2-CPU machine: OpenMPI yields (--oversubscribe),
# MPICH spins, and its small-size times there are scheduler ticks.
#
# Protocols: ringcc's host tuner chooses per call (Simple on shared
# memory and TCP: LL measured no faster on a CPU); the `ringccsimple`
# column is ringcc forced to Simple (RINGCC_PROTO=Simple) — the same
# choice today, so its ratio says how far two identical runs differ. BENCH_IMPLS (space-separated, ringcc
# first) picks the columns, e.g. BENCH_IMPLS="ringcc ringccsimple" for
# the protocol comparison alone (no MPI needed).
#
# Environment: BENCH_BYTES (comma list, default
# 8,65536,1048576,4194304,16777216,67108864,268435456), BENCH_ROUNDS (3),
# BENCH_WARMUP (5),
# BENCH_ITER_BYTES (268435456), BENCH_CHANNELS (ringcc --channels; default
# its own). Installs openmpi-bin libopenmpi-dev mpich libmpich-dev when
# missing (root, apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=shm
if [ "${1:-}" = --tcp ]; then MODE=tcp; shift; fi
NPS=("$@")
if [ "$MODE" = tcp ]; then NPS=(2); elif [ ${#NPS[@]} -eq 0 ]; then NPS=(2 4); fi
BYTES=${BENCH_BYTES:-8,65536,1048576,4194304,16777216,67108864,268435456}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-5}
ITER_BYTES=${BENCH_ITER_BYTES:-268435456}
CH=${BENCH_CHANNELS:-}

need=()
IMPL_OVERRIDE=${BENCH_IMPLS:-}
for t in mpicc.openmpi mpirun.openmpi; do command -v $t >/dev/null || need+=(openmpi-bin libopenmpi-dev); done
for t in mpicc.mpich mpirun.mpich; do command -v $t >/dev/null || need+=(mpich libmpich-dev); done
if [ -n "$IMPL_OVERRIDE" ] && [[ "$IMPL_OVERRIDE" != *mpi* ]]; then need=(); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "bench-host: installing openmpi-bin libopenmpi-dev mpich libmpich-dev" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev mpich libmpich-dev >/dev/null
fi
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --locked --release -q -p ringcc
RINGCC=$TARGET/release/ringcc
mkdir -p "$TARGET"
if command -v mpicc.openmpi >/dev/null; then
  mpicc.openmpi -O2 -o "$TARGET/mpi_allreduce.openmpi" scripts/bench/mpi_allreduce.c
fi
if command -v mpicc.mpich >/dev/null; then
  mpicc.mpich -O2 -o "$TARGET/mpi_allreduce.mpich" scripts/bench/mpi_allreduce.c
fi
OUT=$(mktemp -d)
NS_A=ringcc-bench-a-$$ NS_B=ringcc-bench-b-$$
cleanup() {
  if [ "$MODE" = tcp ]; then ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; fi
  rm -rf "$OUT"
}
trap cleanup EXIT

# Calls per size: about ITER_BYTES of traffic, 5 to 200.
iters() { local n=$(( ITER_BYTES / $1 )); (( n < 5 )) && n=5; (( n > 200 )) && n=200; echo $n; }
# Each IMPL_MODE NP BYTES prints "bytes time_us busbw_GBps" (ringcc: its out-of-place columns).
ringcc_shm() { local np=$1 b=$2; "$RINGCC" perf allreduce --backend host --np "$np" -b "$b" -e "$b" \
    -n "$(iters "$b")" -w "$WARMUP" -c 0 ${CH:+--channels "$CH"} | awk '!/^#/ && NF {print $1, $6, $8}'; }
ringccsimple_shm() { RINGCC_PROTO=Simple ringcc_shm "$@"; }
openmpi_shm() { mpirun.openmpi --allow-run-as-root --oversubscribe -np "$1" --mca btl self,vader \
    "$TARGET/mpi_allreduce.openmpi" "$(iters "$2")" "$WARMUP" "$2" | awk '{print $1, $2, $4}'; }
mpich_shm() { mpirun.mpich -np "$1" "$TARGET/mpi_allreduce.mpich" "$(iters "$2")" "$WARMUP" "$2" | awk '{print $1, $2, $4}'; }

PORT=$(( 20000 + $$ % 20000 ))
ringcc_tcp() { # two ranks, one per namespace, as a launcher starts them
  local b=$2 token=bench-$$-$RANDOM
  PORT=$(( PORT + 1 ))
  local common=(RINGCC_WORLD_SIZE=2 RINGCC_ADDR=10.77.0.1:$PORT RINGCC_TOKEN=$token)
  local args=(perf allreduce --backend host -b "$b" -e "$b" -n "$(iters "$b")" -w "$WARMUP" -c 0 ${CH:+--channels "$CH"})
  ip netns exec "$NS_B" env "${common[@]}" RINGCC_RANK=1 RINGCC_NODE=b timeout 600 "$RINGCC" "${args[@]}" >/dev/null &
  local pid=$!
  ip netns exec "$NS_A" env "${common[@]}" RINGCC_RANK=0 RINGCC_NODE=a timeout 600 "$RINGCC" "${args[@]}" \
    | awk '!/^#/ && NF {print $1, $6, $8}'
  wait "$pid"
}
openmpi_tcp() {
  ip netns exec "$NS_A" timeout 600 mpirun.openmpi --allow-run-as-root -np 2 --bind-to none \
    --hostfile "$OUT/hosts" --mca plm_rsh_agent "$OUT/nsexec" \
    --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    "$TARGET/mpi_allreduce.openmpi" "$(iters "$2")" "$WARMUP" "$2" | awk '{print $1, $2, $4}'
}

if [ "$MODE" = tcp ]; then
  IMPLS=(ringcc openmpi)
  ip netns add "$NS_A"; ip netns add "$NS_B"
  ip link add "rbva$$" type veth peer name "rbvb$$"
  ip link set "rbva$$" netns "$NS_A"; ip link set "rbvb$$" netns "$NS_B"
  ip -n "$NS_A" addr add 10.77.0.1/24 dev "rbva$$"; ip -n "$NS_B" addr add 10.77.0.2/24 dev "rbvb$$"
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set "rbva$$" up; ip -n "$NS_B" link set "rbvb$$" up
  printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$OUT/hosts"
  # OpenMPI's rsh agent: `nsexec HOST COMMAND...` runs COMMAND in HOST's namespace.
  cat > "$OUT/nsexec" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in 10.77.0.1) ns=$NS_A;; 10.77.0.2) ns=$NS_B;; *) echo "nsexec: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec \$ns sh -c "\$*"
EOF
  chmod +x "$OUT/nsexec"
  RESULT=$TARGET/bench-host-tcp.txt
  TITLE="ringcc-host TCP (2 ranks, RINGCC_NODE=a|b, one per network namespace, veth) vs OpenMPI (btl self,tcp, same veth)"
else
  IMPLS=(ringcc ringccsimple openmpi mpich)
  RESULT=$TARGET/bench-host.txt
  TITLE="ringcc-host shm (--np N) vs OpenMPI (btl self,vader) and MPICH, N ranks on this host"
fi

if [ -n "$IMPL_OVERRIDE" ]; then read -r -a IMPLS <<< "$IMPL_OVERRIDE"; fi

for round in $(seq "$ROUNDS"); do
  for np in "${NPS[@]}"; do
    for b in ${BYTES//,/ }; do
      for impl in "${IMPLS[@]}"; do
        "${impl}_$MODE" "$np" "$b" >> "$OUT/$impl-$np-$round.txt"
      done
    done
  done
  echo "bench-host: round $round of $ROUNDS done" >&2
done

median() { sort -g | awk '{v[NR]=$1} END {if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
col() { awk -v b="$2" -v c="$3" '$1==b {print $c}' "$1"; } # file bytes column
{
  echo "# $TITLE"
  echo "# allreduce, float sum, out of place; $ROUNDS interleaved round(s); time (us) and busbw (GB/s): medians;"
  echo "# xPEER = median over rounds of PEER time / ringcc time (above 1: ringcc faster)"
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPU(s), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  printf "%3s %10s" np bytes
  for impl in "${IMPLS[@]}"; do printf " %10s %8s" "${impl}_us" GB/s; done
  for impl in "${IMPLS[@]:1}"; do printf " %9s" "x$impl"; done
  echo
  for np in "${NPS[@]}"; do
    for b in ${BYTES//,/ }; do
      printf "%3s %10s" "$np" "$b"
      for impl in "${IMPLS[@]}"; do
        t=$(cat "$OUT/$impl-$np"-*.txt | awk -v b="$b" '$1==b {print $2}' | median)
        g=$(cat "$OUT/$impl-$np"-*.txt | awk -v b="$b" '$1==b {print $3}' | median)
        printf " %10s %8s" "${t:-?}" "${g:-?}"
      done
      for impl in "${IMPLS[@]:1}"; do
        q=$(for k in $(seq "$ROUNDS"); do
              paste -d' ' <(col "$OUT/ringcc-$np-$k.txt" "$b" 2) <(col "$OUT/$impl-$np-$k.txt" "$b" 2)
            done | awk '$1 > 0 {printf "%.3f\n", $2/$1}' | median)
        printf " %9s" "${q:-?}"
      done
      echo
    done
  done
  first=${BYTES%%,*}
  for np in "${NPS[@]}"; do
    printf "# %s B latency, %s ranks (us):" "$first" "$np"
    for impl in "${IMPLS[@]}"; do
      printf " %s %s" "$impl" "$(cat "$OUT/$impl-$np"-*.txt | awk -v b="$first" '$1==b {print $2}' | median)"
    done
    echo
  done
} | tee "$RESULT"

#!/usr/bin/env bash
# Ranks on two "hosts": two network namespaces joined by a veth pair
# (10.78.0.1/24 and 10.78.0.2/24), shared memory inside each, TCP over the
# veth between them.
#
#   1. ringcc-host's `netns_*` tests (backend-host/tests/comm_ranks.rs):
#      the test binary runs in the first namespace, serves the job's store
#      on 10.78.0.1 and starts half of the ranks in each namespace with
#      `ip netns exec`.
#   2. `ringcc perf --backend host` as a launcher would start it: ranks
#      with RINGCC_RANK / RINGCC_WORLD_SIZE / RINGCC_ADDR=10.78.0.1:PORT /
#      RINGCC_NODE=a|b / RINGCC_TOKEN under `ip netns exec`; every `#wrong`
#      must be 0 and rank 0's init banner (RINGCC_DEBUG=INFO) must show
#      both shm and tcp hops.
#
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); where `ip netns add` fails it
# says SKIPPED and exits 0. The namespaces are named with this script's
# PID and torn down on exit. Last line: `netns: N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
NS_A=ringcc-a-$$
NS_B=ringcc-b-$$
VETH_A=rnva$$
VETH_B=rnvb$$
IP_A=10.78.0.1
IP_B=10.78.0.2
LIMIT=${NETNS_LIMIT:-300}
PASSED=0
FAILED=0
WORK=$(mktemp -d)

cleanup() {
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! command -v ip >/dev/null || ! ip netns add "$NS_A" 2>"$WORK/err"; then
    echo "netns tests SKIPPED: cannot create a network namespace ($(cat "$WORK/err" 2>/dev/null || echo 'no ip command')): needs root and iproute2"
    exit 0
fi
ip netns add "$NS_B"
ip link add "$VETH_A" type veth peer name "$VETH_B"
ip link set "$VETH_A" netns "$NS_A"
ip link set "$VETH_B" netns "$NS_B"
ip -n "$NS_A" addr add "$IP_A/24" dev "$VETH_A"
ip -n "$NS_B" addr add "$IP_B/24" dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
echo "netns: $NS_A ($IP_A) <-> $NS_B ($IP_B) over $VETH_A/$VETH_B"

# 1. The communicator's tests across the namespaces.
BIN=$(cargo test --locked --release -p ringcc-host --test comm_ranks --no-run 2>&1 \
    | tee "$WORK/build" | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
if [ -z "$BIN" ]; then
    cat "$WORK/build"
    echo "netns: could not build the comm_ranks test binary"
    exit 1
fi
set +e
ip netns exec "$NS_A" env RINGCC_NETNS="$NS_A,$NS_B" RINGCC_NETNS_STORE_IP="$IP_A" \
    timeout "$LIMIT" "$BIN" --ignored netns_ 2>&1 | tee "$WORK/comm_ranks"
rc=${PIPESTATUS[0]}
set -e
result=$(grep '^test result:' "$WORK/comm_ranks" | tail -n 1)
p=$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<<"$result")
f=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$result")
PASSED=$((PASSED + ${p:-0}))
FAILED=$((FAILED + ${f:-0}))
if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
    echo "netns: the comm_ranks binary exited $rc without a test result"
    FAILED=$((FAILED + 1))
fi
if [ "${p:-0}" -eq 0 ] && [ "${f:-0}" -eq 0 ]; then
    echo "netns: no netns_ test ran"
    FAILED=$((FAILED + 1))
fi

# 2. The command, one rank per process, ranks 0..A-1 in the first
# namespace (node a), the rest in the second (node b).
cargo build --locked --release -q -p ringcc
RINGCC=$TARGET/release/ringcc
PORT=$((20000 + $$ % 20000))
# cli_job NAME RANKS_IN_A RANKS PERF_ARGS...
cli_job() {
    local name=$1 in_a=$2 n=$3
    shift 3
    PORT=$((PORT + 1))
    local token
    token=netns-$$-$name-$RANDOM
    local pids=()
    for r in $(seq 0 $((n - 1))); do
        local ns=$NS_B node=b
        if [ "$r" -lt "$in_a" ]; then ns=$NS_A node=a; fi
        ip netns exec "$ns" env RINGCC_RANK="$r" RINGCC_WORLD_SIZE="$n" \
            RINGCC_ADDR="$IP_A:$PORT" RINGCC_NODE="$node" RINGCC_TOKEN="$token" \
            RINGCC_DEBUG=INFO timeout "$LIMIT" "$RINGCC" perf "$@" --backend host \
            >"$WORK/$name.$r.out" 2>"$WORK/$name.$r.err" &
        pids+=($!)
    done
    local ok=1 r=0
    for pid in "${pids[@]}"; do
        if ! wait "$pid"; then
            echo "netns: $name: rank $r failed:"
            sed 's/^/    /' "$WORK/$name.$r.err"
            ok=0
        fi
        r=$((r + 1))
    done
    local out=$WORK/$name.0.out err=$WORK/$name.0.err
    local rows
    rows=$(awk '!/^#/ && NF' "$out" | wc -l)
    local bad
    bad=$(awk '!/^#/ && NF && ($9 != "0" || $13 != "0")' "$out")
    if [ "$ok" = 1 ] && [ "$rows" -gt 0 ] && [ -z "$bad" ] &&
        grep -q '# Out of bounds values : 0 OK' "$out" &&
        grep -q -- '-shm->' "$err" && grep -q -- '-tcp->' "$err"; then
        echo "netns: $name: ok ($rows rows, $(grep 'ringcc INFO: ring' "$err"))"
        PASSED=$((PASSED + 1))
    else
        echo "netns: $name: FAILED (rows $rows, wrong: ${bad:-none})"
        cat "$out" "$err" | sed 's/^/    /'
        FAILED=$((FAILED + 1))
    fi
}
cli_job allreduce-2x2 2 4 allreduce -b 8 -e 4M -f 64 -n 2 -w 1
cli_job reducescatter-2+1 2 3 reducescatter -b 96K -e 3M -f 32 -n 2 -w 1 -o all
cli_job allgather-1+2 1 3 allgather -b 96K -e 3M -f 32 -n 2 -w 1 -d all

echo "netns: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]

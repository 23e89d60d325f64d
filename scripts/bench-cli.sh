#!/usr/bin/env bash
# The first command a newcomer runs, measured: wall time and peak memory
# of the README's main command (`ringcc perf`, checked, on the simulator)
# and of a 16-node run, each beside the same command without the check
# (-c 0: the timing table alone) measured in the same run, so the line
# says what the check costs on this machine. A benchmark, not a test: it
# prints and never fails on a number.
#
# Targets (2-core machine): the main command <= 20 s and <= 5 GB;
# `--nodes 16 -b 1M -e 1M -n 1 -w 0` <= 5 s and <= 1 GB.
#
# Usage: scripts/bench-cli.sh            (writes target/bench-cli.txt too)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/time ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends time >/dev/null
fi
cargo build --release --locked -q -p ringcc
BIN=target/release/ringcc
OUT=target/bench-cli.txt
: >"$OUT"

# Runs one command; prints "<seconds> <peak KiB>".
measure() {
    /usr/bin/time -f "%e %M" -o target/bench-cli.time "$BIN" perf "$@" >/dev/null
    cat target/bench-cli.time
}

report() {
    local name=$1
    shift
    read -r t kb < <(measure "$@")
    read -r t0 kb0 < <(measure "$@" -c 0)
    local line
    line=$(awk -v n="$name" -v t="$t" -v kb="$kb" -v t0="$t0" -v kb0="$kb0" 'BEGIN {
        printf "%-28s checked %6.2f s, peak %7.1f MiB | -c 0 %5.2f s, %6.1f MiB | check costs %.1fx the timing table\n",
            n, t, kb / 1024, t0, kb0 / 1024, (t0 > 0 ? t / t0 : 0) }')
    echo "$line" | tee -a "$OUT"
    echo "  ringcc perf $*" | tee -a "$OUT"
}

report "main command (2 nodes x 8)" allreduce -b 8 -e 128M -f 2 --nodes 2
report "16 nodes x 8, 1 MiB" allreduce --nodes 16 -b 1M -e 1M -n 1 -w 0

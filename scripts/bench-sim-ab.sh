#!/usr/bin/env bash
# The simulator's speed against another commit, measured the only way this
# kind of machine allows: both bench binaries built once, then run in
# rounds with the order rotated each round, and each binary's times
# summarised by their minimum, the mean of their fastest quarter and their
# median. Interference only ever slows a run down, so the fast end is the
# steadier figure (single runs of the same binary spread by 10-25 % on a
# shared 2-core machine); report it next to the median.
#
#   scripts/bench-sim-ab.sh [--base REV] [--rounds N] [--case NAME] [BIN...]
#
#   --base REV   the commit to compare with (default 8934928, the commit
#                before the progress engine: issue 14's reference)
#   --rounds N   rounds (default 12); each runs every binary once
#   --case NAME  the bench case (default timing-1024; timing-512 is 4x
#                shorter and shows the same gap)
#   BIN...       more bench binaries to compare (experiments), after base
#                and this checkout's
#
# Base is built in a git worktree under target/ab/ with its own target
# directory (kept between runs: the second run builds nothing). Ratios are
# printed against base.
set -euo pipefail

base=8934928
rounds=12
case_name=timing-1024
extra=()
while (($#)); do
    case $1 in
        --base) base=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --case) case_name=$2; shift 2 ;;
        -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "bench-sim-ab: unknown option $1" >&2; exit 2 ;;
        *) extra+=("$1"); shift ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench-sim-ab: --rounds wants a positive number" >&2; exit 2; }

root=$(git rev-parse --show-toplevel)
cd "$root"
rev=$(git rev-parse --short "$base^{commit}")
tree=target/ab/tree-$rev
out=target/ab/bin
mkdir -p "$out"

# The bench binary that `cargo bench --no-run` built, from its JSON messages.
build() {
    local dir=$1 target=$2
    (cd "$dir" && CARGO_TARGET_DIR=$target cargo bench -q -p ringcc-mock --bench sim --no-run \
        --message-format=json 2>/dev/null) |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "sim" and m.get("executable"):
        print(m["executable"])' | tail -n 1
}

if [[ ! -d $tree ]]; then
    git worktree add --detach -f "$tree" "$rev" >/dev/null
fi
bin_base=$(build "$tree" "$root/target/ab/target-$rev")
bin_head=$(build "$root" "$root/target")
[[ -x $bin_base && -x $bin_head ]] || { echo "bench-sim-ab: a build failed" >&2; exit 1; }
cp "$bin_base" "$out/sim-$rev"
cp "$bin_head" "$out/sim-head"
bins=("$out/sim-$rev" "$out/sim-head" "${extra[@]}")
names=("base $rev" "this checkout" "${extra[@]}")
n=${#bins[@]}

times=$(mktemp -d)
trap 'rm -rf "$times"' EXIT
echo "# $case_name: $rounds rounds, order rotated each round; wall seconds of the simulation"
for ((i = 0; i < rounds; i++)); do
    line="round $((i + 1)):"
    for ((j = 0; j < n; j++)); do
        k=$(((i + j) % n))
        t=$("${bins[$k]}" "$case_name" | sed -n 's/.* in \([0-9.]*\) s (build.*/\1/p')
        [[ -n $t ]] || { echo "bench-sim-ab: ${bins[$k]} printed no time" >&2; exit 1; }
        echo "$t" >>"$times/$k"
    done
    for ((k = 0; k < n; k++)); do line+=" $(tail -n 1 "$times/$k")"; done
    echo "$line"
done
stats() { sort -n "$1" | awk '{a[NR] = $1} END {
    q = int(NR / 4); if (q < 1) q = 1; s = 0; for (i = 1; i <= q; i++) s += a[i]
    m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
    printf "%.4f %.4f %.4f", a[1], s / q, m }'; }
read -r bmin bq bmed <<<"$(stats "$times/0")"
for ((k = 0; k < n; k++)); do
    read -r mn q md <<<"$(stats "$times/$k")"
    printf '%-16s min %.3f s  fastest quarter %.3f s  median %.3f s' "${names[$k]}" "$mn" "$q" "$md"
    if ((k > 0)); then
        awk -v a="$bq" -v b="$q" -v c="$bmed" -v d="$md" \
            'BEGIN { printf "   vs base: %.3fx (fastest quarter), %.3fx (median)", b / a, d / c }'
    fi
    echo
done

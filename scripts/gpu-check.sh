#!/usr/bin/env bash
# The one prepared GPU check of ringcc-cuda (under 10 minutes):
#   1. build (cargo, if this machine has it and can build offline), or take
#      the binaries scripts/gpu-build.sh prepared in target/gpu-bin/;
#   2. the GPU tests: every collective x type x op on 2, 4 and 8 ranks
#      sharing GPU 0 (and across GPUs where there are several), with the
#      device loop and with one launch per slice, and both modes' outputs
#      compared byte for byte;
#   3. the fused kernels' bandwidth next to a device-to-device copy of the
#      same bytes (same run), and next to torch adding two tensors in place
#      (if torch is importable), as ratios; AllReduce busbw on 1 GPU;
#   4. AllReduce with the device loop (one launch per rank and call) next
#      to one launch per slice: time and busbw side by side, same run;
#   5. one rank per process (GpuRank: the device loop, CUDA IPC between the
#      processes), 2 and 4 processes sharing GPU 0: every collective x type
#      x op checked against the core's reference (the 4-process run is part
#      of step 2, the 2-process one runs here), and AllReduce f32 busbw of 2
#      processes at 64 MiB, 256 MiB and 1 GiB next to the device copy of
#      step 3. Without MPS the two processes' kernels time-slice the GPU;
#      the numbers say what that costs.
# Writes gpu-check-summary.txt (and the logs) to $OUT, or target/gpu-check/.
# Exit status: 0 when the tests pass (bandwidth is reported, not gated).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/target/gpu-check}
mkdir -p "$out"
summary=$out/gpu-check-summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
bytes=${RINGCC_BW_BYTES:-268435456}
export RINGCC_BW_BYTES=$bytes

say "== ringcc-cuda GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
if ! nvidia-smi -L >/dev/null 2>&1; then
    say "no GPU: nvidia-smi not found or lists none"
    exit 1
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$summary"
for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

# 1. Binaries.
tests_bin=""; bench_bin=""
if command -v cargo >/dev/null 2>&1 && cargo build -q --release -p ringcc-cuda --offline 2>/dev/null; then
    say "build: cargo $(cargo --version | cut -d' ' -f2) (offline)"
    tests_bin=$(cargo test --release -p ringcc-cuda --offline --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("executable"): print(m["executable"])' | tail -n 1)
    bench_bin=$(cargo bench -p ringcc-cuda --offline --bench fused_bw --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("executable"): print(m["executable"])' | tail -n 1)
fi
if [ -z "$tests_bin" ] || [ -z "$bench_bin" ]; then
    bin=${RINGCC_GPU_BIN:-$root/target/gpu-bin}
    tests_bin=$bin/gpu-tests; bench_bin=$bin/fused_bw
    say "build: prebuilt binaries from $bin (scripts/gpu-build.sh)"
fi
if [ ! -x "$tests_bin" ] || [ ! -x "$bench_bin" ]; then
    say "FAIL: no binaries (no offline cargo build, nothing in target/gpu-bin)"
    exit 1
fi

# 2. GPU tests.
start=$(date +%s)
ipc2=processes::two_processes_share_gpu0_over_ipc_with_busbw
timeout 300 "$tests_bin" --ignored --test-threads=1 --skip "$ipc2" 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
say "gpu tests: exit $tests_rc in $(( $(date +%s) - start )) s: $(grep -E '^test result' "$out/gpu-tests.log" | tail -n 1)"
grep -E '^test .* \.\.\. (ok|FAILED)' "$out/gpu-tests.log" >>"$summary"

# 3. Bandwidth.
RINGCC_BW_OUT=$out/fused_bw.jsonl timeout 180 "$bench_bin" 2>&1 | tee "$out/fused_bw.log"
bench_rc=${PIPESTATUS[0]}
timeout 90 python3 "$root/scripts/torch_add_bw.py" "$bytes" 2>&1 | tee "$out/torch.log"
say ""
say "bandwidth (bench exit $bench_rc), $bytes B per buffer; traffic = bytes read + written:"
cat "$out/fused_bw.log" "$out/torch.log" | awk -v big="$bytes" '
    /^RESULT/ { name=""; gbps=""; ratio="";
        for (i = 2; i <= NF; i++) { split($i, kv, "=");
            if (kv[1]=="name") name=kv[2]; if (kv[1]=="gbps") gbps=kv[2]; if (kv[1]=="ratio_to_copy") ratio=kv[2]; if (kv[1]=="busbw") bus=kv[2] }
        bw[name]=gbps; rc[name]=ratio; order[++n]=name; if (bus != "") busbw[name]=bus; bus="" }
    /^TORCH_UNAVAILABLE/ { torch_missing=$0 }
    END {
        copy = bw["memcpy_dtod_" big]
        printf "  %-44s %10s %10s %10s\n", "kernel", "GB/s", "x copy", "x torch"
        for (i = 1; i <= n; i++) { k = order[i]
            if (k ~ /^torch_/ || k ~ /^allreduce/ || k ~ /^launch_/) continue
            t = ""
            if (k ~ /^recvReduceSend_float_/ && k ~ big"$") t = bw["torch_add_float_" big]
            if (k ~ /^recvReduceSend_bfloat16_/ && k ~ big"$") t = bw["torch_add_bfloat16_" big]
            tr = (t != "" && t > 0) ? sprintf("%.3f", bw[k] / t) : "-"
            printf "  %-44s %10s %10s %10s\n", k, bw[k], rc[k], tr
            if (k !~ /^memcpy/ && k ~ "_" big "$") { total++; if (rc[k] + 0 >= 0.9) ok++ }
        }
        for (i = 1; i <= n; i++) { k = order[i]; if (k ~ /^torch_/) printf "  %-44s %10s %10s\n", k, bw[k], (copy > 0 ? sprintf("%.3f", bw[k] / copy) : "-") }
        for (i = 1; i <= n; i++) { k = order[i]; if (k ~ /^allreduce/) printf "  %-44s busbw %s GB/s\n", k, busbw[k] }
        if (torch_missing != "") print "  torch: " torch_missing
        printf "  target >= 0.9x copy at %s B: %d of %d fused kernels\n", big, ok, total
    }' | tee -a "$summary"

# 4. Launch modes side by side (from the bench's launch_* lines).
say ""
say "launch modes, AllReduce f32, ranks sharing GPU 0 (loop: one launch per rank and call; slice: a launch and events per slice):"
awk '
    /^RESULT name=launch_/ { name = ""; t = ""; bus = ""; m = ""
        for (i = 2; i <= NF; i++) { split($i, kv, "=")
            if (kv[1] == "name") name = kv[2]; if (kv[1] == "time_us") t = kv[2]
            if (kv[1] == "busbw") bus = kv[2]; if (kv[1] == "mode") m = kv[2] }
        key = name; sub(/^launch_/, "", key); sub(/_(persistent|slice)$/, "", key)
        asked = (name ~ /_persistent$/) ? "persistent" : "slice"
        if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        tm[key, asked] = t; bw[key, asked] = bus; ran[key, asked] = m }
    END {
        printf "  %-32s %10s %10s %10s %10s %8s\n", "case (ranks, channels, bytes)", "loop us", "busbw", "slice us", "busbw", "speedup"
        for (i = 1; i <= n; i++) { k = order[i]
            lt = tm[k, "persistent"]; st = tm[k, "slice"]
            sp = (lt + 0 > 0 && st != "") ? sprintf("%.2fx", st / lt) : "-"
            note = (ran[k, "persistent"] != "" && ran[k, "persistent"] != "persistent") ? "  (loop unavailable: ran " ran[k, "persistent"] ")" : ""
            printf "  %-32s %10s %10s %10s %10s %8s%s\n", k, lt, bw[k, "persistent"], st, bw[k, "slice"], sp, note }
        if (n == 0) print "  (no launch_ results: the bench stopped before them)"
    }' "$out/fused_bw.log" | tee -a "$summary"

# 5. Two processes sharing GPU 0 over CUDA IPC (the four-process run was
# part of step 2): the check, then AllReduce busbw against the device copy.
say ""
start=$(date +%s)
timeout 240 "$tests_bin" --ignored --exact "$ipc2" --nocapture 2>&1 | tee "$out/gpu-ipc.log"
ipc_rc=${PIPESTATUS[0]}
say "one rank per process, CUDA IPC, 2 processes on GPU 0: exit $ipc_rc in $(( $(date +%s) - start )) s: $(grep -E '^test result' "$out/gpu-ipc.log" | tail -n 1)"
grep -E '^test processes::.* \.\.\. (ok|FAILED)' "$out/gpu-ipc.log" >>"$summary"
cat "$out/fused_bw.log" "$out/gpu-ipc.log" | awk -v big="$bytes" '
    /^RESULT name=/ { name = ""; gbps = ""; bus = ""
        for (i = 2; i <= NF; i++) { split($i, kv, "=")
            if (kv[1] == "name") name = kv[2]; if (kv[1] == "gbps") gbps = kv[2]; if (kv[1] == "busbw") bus = kv[2] }
        if (name == "memcpy_dtod_" big) copy = gbps
        if (name ~ /^ipc_allreduce_/) { order[++n] = name; bw[name] = bus } }
    END {
        printf "  %-32s %12s %10s\n", "AllReduce f32, processes", "busbw GB/s", "x copy"
        for (i = 1; i <= n; i++) { k = order[i]
            printf "  %-32s %12s %10s\n", k, bw[k], (copy + 0 > 0 ? sprintf("%.3f", bw[k] / copy) : "-") }
        if (n == 0) print "  (no ipc_allreduce results: the two-process run failed before them)"
        if (copy != "") printf "  device copy (step 3, %s B): %s GB/s (bytes read + written)\n", big, copy
    }' | tee -a "$summary"
[ "$ipc_rc" -eq 0 ] || [ "$tests_rc" -ne 0 ] || tests_rc=$ipc_rc
say ""
say "summary: $summary"
exit "$tests_rc"

#!/usr/bin/env bash
# Session 31, second device call (the sanitizers last, on the time left): racecheck of the Hopper forward, synccheck of the Hopper
# backward; issue #13's 16 rows against FlashAttention-2 and cuDNN in turn
# (bench_hopper_bars.py); ncu of the Hopper forward and backward on the shapes (fp16,
# causal off and on: SM busy, the gmma pipe's active cycles, stall reasons), as session 13's.
# Expected (written before the run): 0 hazards, 0 errors; #13's bars hold (forward >= 1.0x
# FA2, backward >= 0.8x; cuDNN 0.71-0.96 forward, 0.79-0.83 backward as sessions 17/25).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
side new 220 t scripts/bench_hopper_bars.py
gmma=$(ncu --query-metrics --chip gh100 2>/dev/null | grep -o "sm__pipe_tensor_op_gmma_cycles_active" | head -1)
extra=""
if [ -n "$gmma" ]; then extra=",$gmma.avg.pct_of_peak_sustained_active"; fi
for part in forward backward; do
  name=wgmma_forward; args=""; limit=95
  [ $part = backward ] && { name=wgmma_bwd; args=backward; limit=105; }
  timeout $limit ncu --clock-control none --kernel-name regex:$name \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$extra" \
    python3 scripts/ncu_wgmma.py $args > "$out/n_ncu_$part.txt" 2>&1
  echo "ncu $part rc=$? at ${SECONDS}s" >> "$out/n_ncu_$part.txt"
done
python3 scripts/ncu_stalls.py "$out/n_ncu_forward.txt" > "$out/n_stalls_forward.md" 2>&1
python3 scripts/ncu_stalls.py "$out/n_ncu_backward.txt" backward > "$out/n_stalls_backward.md" 2>&1
grep -E "gmma_cycles_active" "$out"/n_ncu_*.txt | head -32 > "$out/n_gmma.txt"
# the sanitizers last, on what is left of the call's 600 s
sanitize racecheck wgmma $(( (585 - SECONDS) / 2 ))
sanitize synccheck wgmma_bwd $(( 585 - SECONDS ))
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$out/b_sanitize.txt" | tail -6
tail -n 20 "$out/t_new.txt"
cat "$out/n_stalls_forward.md" "$out/n_stalls_backward.md"
exit 0

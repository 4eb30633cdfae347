#!/usr/bin/env bash
# Prepared in session 30: issue #11's rows with every group timed in turn (bench_variants.py
# --queued, session 30's change), then racecheck and synccheck of the Hopper forward and backward.
# Expected: ratios as session 30's (softcap ~1.27, dropout ~1.31, window ~0.82, varlen forward
# ~0.91 / backward ~0.80); GQA causal's ratio near 1 now that MHA is timed in turn.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
side new 260 v scripts/bench_variants.py --queued
sanitize racecheck wgmma 100
sanitize synccheck wgmma_bwd 100
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
tail -n 16 "$out/v_new.txt"
[ -f "$out/failures.txt" ] && grep "^====" "$out/failures.txt" | head -20

#!/usr/bin/env bash
# Session 31, second device call: racecheck of the Hopper forward, synccheck of the Hopper
# backward, issue #13's 16 rows against FlashAttention-2 and cuDNN in turn
# (bench_hopper_bars.py), issue #11's rows with every group timed in turn (bench_variants.py
# --queued). Expected: 0 hazards, 0 errors; #13's bars hold (forward >= 1.0x FA2, backward
# >= 0.8x; session 25: cuDNN 0.71-0.96 forward, 0.79-0.83 backward); #11's ratios as session
# 30's (softcap ~1.27, dropout ~1.31, window ~0.82, varlen forward ~0.91 / backward ~0.80),
# GQA causal near 1 now that MHA is timed in turn.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
sanitize racecheck wgmma 80
sanitize synccheck wgmma_bwd 80
side new 200 t scripts/bench_hopper_bars.py
side new 200 v scripts/bench_variants.py --queued
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$out/b_sanitize.txt" | tail -6
tail -n 20 "$out/t_new.txt"
tail -n 20 "$out/v_new.txt"
exit 0

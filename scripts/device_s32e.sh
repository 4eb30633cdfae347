#!/usr/bin/env bash
# Session 32, call 6: which backward kernel the L2 sections' gains and losses come from
# (bench_sections_ab.py --split: off / keys, the dK/dV grids' sections only / on, the
# forward off / on again as a second sample of call 5's).
# Expected (written before the run): the backward's +7% at (4, 16, 4096, 128) and (4, 32, 4096,
# 64) causal from dK/dV (keys ~ on), its -5% at (16, 32, 1024, 64) from either; the forward
# again ~0.96x at the 128 MB working sets, ~1.3x at (4, 32, 4096, 128).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
. scripts/device_ab.sh
side new 230 t scripts/bench_sections_ab.py --split
tail -n 16 "$out/t_new.txt"
exit 0

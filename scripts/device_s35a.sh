#!/usr/bin/env bash
# Session 35, call 1: issue #11's acceptance rows on the H200 the issue names (sessions 33-34 ran
# on H100s only): bench_variants.py --queued (GQA, window, varlen, softcap / ALiBi / dropout),
# then the head-dim bar (bench_head_dims.py, d = 32, 96, 256 against SDPA flash, N = 4096).
# Expected (written before the run, from the H100's figures): GQA <= 1.05 holds; window
# ~0.68-0.76; varlen (NumPy offsets) fwd ~0.85-0.90, bwd ~0.75-0.85; softcap ~1.2; ALiBi
# ~1.08; dropout ~1.2-1.28; head dims >= 0.6x SDPA flash.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
. scripts/device_ab.sh
side new 330 v scripts/bench_variants.py --queued
side new $(( 560 - SECONDS )) h scripts/bench_head_dims.py --dims 32,96,256
tail -n 16 "$out/v_new.txt"
tail -n 14 "$out/h_new.txt"
exit 0

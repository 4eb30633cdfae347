#!/usr/bin/env bash
# Session 29, second device call: the timings of device_s28b.sh (the masks through a lane's frame,
# old = numba_flash of 4b92692 against the committed tree, separate processes: the window bar's
# windows and plain causal; issue #11's softcap / ALiBi / dropout rows on the new tree), the d = 64
# windows with two consumers instead of three (bench_ab.py --window), and device_s28a.sh's
# split-KV prefills (bench_prefill_split.py).
# Expected (written before any timing): the frame: window forward +2-5%, causal within noise (session
# 28). Two consumers at d = 64 with a window: faster for windows of 256-1024 keys (128-row tiles
# visit 9 key tiles a row tile at (1024, 0) where 192-row tiles visit 10-11, 11-22% more keys a row;
# three consumers were ~10% faster without a window), and with softcap + window (three consumers
# spill 276 bytes, two none) by more.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
side old 90 w scripts/bench_window_tiles.py
side new 90 w scripts/bench_window_tiles.py
variants new
side new 150 k scripts/bench_ab.py NUMBA_FLASH_WGMMA_CONSUMERS=,2 --window
side new 100 b scripts/bench_prefill_split.py
for f in "$out"/w_*.txt "$out"/c_new.txt "$out"/b_new.txt; do echo "== $f"; tail -n 7 "$f"; done
echo "== k"; tail -n 9 "$out/k_new.txt"

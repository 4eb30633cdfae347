#!/usr/bin/env bash
# Session 29, second device call: the timings of device_s28b.sh (the masks through a lane's frame,
# old = numba_flash of 4b92692 against the committed tree, separate processes: the window bar's
# windows and plain causal, issue #11's softcap / ALiBi / dropout rows) and of device_s28a.sh
# (split-KV prefills: bench_prefill_split.py, racecheck of a small split prefill).
# Expected (written in session 28 before any timing): window forward +2-5%, causal within noise,
# the d = 64 causal softcap forward (no longer spilling 224 bytes) faster by a few percent.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
side old 90 w scripts/bench_window_tiles.py
side new 90 w scripts/bench_window_tiles.py
variants old
variants new
side new 130 b scripts/bench_prefill_split.py
sanitize racecheck kvsplit 60
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
for f in "$out"/w_*.txt "$out"/c_*.txt "$out"/b_new.txt; do echo "== $f"; tail -n 7 "$f"; done

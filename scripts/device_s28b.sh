#!/usr/bin/env bash
# Prepared in session 28 (no device time was left to run it; run it with tmp_old/ = numba_flash of
# 4b92692, the session's start, and tmp_new/ = the committed tree, both carried):
# the masks through a lane's frame (mask.frame / visible_at, commit 3417cb1) against the 64-bit
# index compares, old and new in turn (separate processes): the window bar's (1, 16, 16384, 128) windows and plain causal
# (bench_window_tiles.py), issue #11's softcap / ALiBi / dropout rows (bench_variants.py), then
# the GPU tests of the masked paths and synccheck of the Hopper forward (the opt-in switches of the
# session: device_s28c.sh).
# Expected (written before the run): a masked tile of the Hopper forward's key loop is 142
# (causal) to 201 (window) instructions shorter of ~585 (d = 128), 2 of the 9 tiles of a window
# (1024, 0) row tile are masked: window forward +2-5%, causal within noise; the d = 64 causal
# softcap forward (no longer spilling 224 bytes) faster by a few percent.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
side old 90 w scripts/bench_window_tiles.py
side new 90 w scripts/bench_window_tiles.py
variants old
variants new
timeout 120 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  -k "window or causal or softcap or all" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize synccheck "wgmma" 40
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
for f in "$out"/w_*.txt "$out"/c_*.txt; do echo "== $f"; tail -n 6 "$f"; done

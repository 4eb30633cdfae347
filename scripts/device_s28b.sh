#!/usr/bin/env bash
# Prepared in session 28 (no device time was left to run it; run it with tmp_old/ = numba_flash of
# 4b92692, the session's start, and tmp_new/ = the committed tree, both carried):
# the masks through a lane's frame (mask.frame / visible_at, commit 3417cb1) against the 64-bit
# index compares, old and new in turn, twice (separate processes: the clocks' drift shows as the
# spread between the two rounds): the window bar's (1, 16, 16384, 128) windows and plain causal
# (bench_window_tiles.py), issue #11's softcap / ALiBi / dropout rows (bench_variants.py), then
# the GPU tests of the masked paths and synccheck of the Hopper forward; then the lazy rescaling's A/B
# (NUMBA_FLASH_LAZY_RESCALE=0,8, one process) and its GPU tests.
# Expected (written before the run): a masked tile of the Hopper forward's key loop is 142
# (causal) to 201 (window) instructions shorter of ~585 (d = 128), 2 of the 9 tiles of a window
# (1024, 0) row tile are masked: window forward +2-5%, causal within noise; the d = 64 causal
# softcap forward (no longer spilling 224 bytes) faster by a few percent.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
for round in 1 2; do
  side old 100 "w${round}" scripts/bench_window_tiles.py
  side new 100 "w${round}" scripts/bench_window_tiles.py
done
variants old
variants new
# FlashAttention-4's lazy rescaling (opt-in, commit after 2705f0a): expected (written first) the
# forward +2-5% at d = 128 (64 FMUL a thread a tile skipped, between a P·V's completion and the
# next P·V's issue; 699 -> ~648 instructions a tile executed), +1-2% at d = 64 (32 FMUL)
side new 150 l scripts/bench_ab.py NUMBA_FLASH_LAZY_RESCALE=0,8
# softcap's Q prescaled (opt-in): expected (written first) softcap's forward +4-8% at d = 128 (the key
# loop 911 -> 847 instructions causal, 826 -> 762 not), a little less at d = 64 (849 -> 787, one spilled word)
side new 150 p scripts/bench_ab.py NUMBA_FLASH_SOFTCAP_PRESCALE=0,1 --softcap
timeout 150 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  -k "window or causal or softcap or all" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 60 python3 -m pytest -v -rf -n 4 -p no:cacheprovider tests/test_wgmma_forward.py -k "lazy or prescaled" >> "$out/a_pytest.txt" 2>&1
echo "pytest lazy rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize synccheck "wgmma" 40
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
for f in "$out"/w*_*.txt "$out"/c_*.txt "$out"/l_new.txt "$out"/p_new.txt; do echo "== $f"; tail -n 6 "$f"; done

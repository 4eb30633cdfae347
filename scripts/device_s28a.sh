#!/usr/bin/env bash
# Prepared in session 27 for the next device call (not run yet): split-KV under prefill chunks.
# The GPU tests of prefills with splits (the fix of session 27: each split's key tiles counted in
# the split kernel's tiles; and the opt-in Hopper forward's splits, NUMBA_FLASH_WGMMA_SPLIT=1), the
# prefill matrix, racecheck / synccheck of a small split prefill on the Hopper forward, and
# bench_prefill_split.py (mma.sync splits / wgmma splits / one split, in turn in one process).
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 200 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_kvcache.py -k "prefill or matrix" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 200 b scripts/bench_prefill_split.py
sanitize racecheck kvsplit 60
sanitize synccheck kvsplit 40
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
tail -n 8 "$out/b_new.txt"

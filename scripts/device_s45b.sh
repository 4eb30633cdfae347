#!/usr/bin/env bash
# Session 45: one call, written when the device came late (nine starts refused): the Hopper forward's
# variants on hardware with every block running several tiles, the path session 44's handover changed
# (3046334), which the GPU suite's small shapes mostly skip (a block a tile below 132 tiles: the tile loop is
# compiled away); the varlen and window rows with their host times; then the variant files as they run.
# As run: session 46, an H100 (docs/benchmarks/2026-12-07-s46, call 1). Step 1 was cut at 230 s (129 passed:
# all of test_variants, 21 of 58 flex; the rest in that session's call 4), step 3 at 530 s (250 passed); none
# failed. Host time a call: varlen 0.131 ms against 0.273 ms on the GPU.
#   bash device_s45b.sh OUT SECONDS   (SECONDS at least 400: steps 1 and 2 take up to 340)
# 1. `NUMBA_FLASH_WGMMA_PERSISTENT=3` (three blocks, every call's tiles dealt among them by the dynamic
#    scheduler): test_variants.py and test_flex_kernels.py.
# 2. bench_order.py varlen window: the events' and the host's time a call.
# 3. test_variants.py, test_kvcache.py and test_flex_kernels.py plainly, to the call's end.
# Expected (written before the run): every test passes; varlen's host time a call well under its events' time.
# Keep $OUT to 8 files or fewer (the reply's limit).
set -u
. scripts/device_ab.sh  # out, total from the arguments; side, smi, tests
export NUMBA_FLASH_WGMMA_PERSISTENT=3
tests persist 230 -n 16 tests/test_variants.py tests/test_flex_kernels.py
unset NUMBA_FLASH_WGMMA_PERSISTENT
smi 1
side new 110 o1 scripts/bench_order.py varlen window
kill $smi_pid
tests variants $(( total - SECONDS - 10 )) -n 16 tests/test_variants.py tests/test_kvcache.py tests/test_flex_kernels.py
grep -hE "median|host a call|rc=" "$out/o1_new.txt"
grep -hE " (FAILED|ERROR) " "$out"/t_*.txt | head -20
grep -h "^tests " "$out"/t_*.txt
exit 0

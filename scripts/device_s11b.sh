#!/usr/bin/env bash
# Session 11, call 2: v2 of the wgmma forward (TMA ring, warp specialization) on the GPU:
# its tests (the swizzled-layout probe first: it isolates K-major from MN-major), the
# timing at issue #13's shapes, and, when the tests pass, memcheck and racecheck of a
# small wgmma forward (partial tiles, both consumers, variants).
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
. scripts/device_hopper.sh
hopper_pytest "$out" 200; rc=$?
if [ $rc -eq 0 ]; then
  timeout 220 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -18 "$out/b_wgmma.txt"
  wgmma_sanitizers "$out" c 150 memcheck racecheck
fi

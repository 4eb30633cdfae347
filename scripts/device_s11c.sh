#!/usr/bin/env bash
# Session 11, call 3: the wgmma forward with FlashAttention-3's intra-warpgroup overlap
# (S of tile i beside P.V of tile i-1), assembled whole by the driver's JIT
# (setmaxnreg honoured, wgmma not serialized) against numba's linker (nvJitLink: both
# lost), its GPU tests, and the sanitizers (memcheck, racecheck, synccheck).
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
. scripts/device_hopper.sh
hopper_pytest "$out" 200; rc=$?
timeout 150 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -20 "$out/b_wgmma.txt"
if [ "${2:-}" != whole-only ]; then  # call 4 (device_s11d.sh) leaves this out
  NUMBA_FLASH_WHOLE_PROGRAM=0 timeout 150 python3 scripts/bench_wgmma.py "$out/c_wgmma_linker.jsonl" \
    > "$out/c_wgmma_linker.txt" 2>&1; tail -20 "$out/c_wgmma_linker.txt"
fi
if [ $rc -eq 0 ]; then
  wgmma_sanitizers "$out" d 100 memcheck racecheck synccheck
fi

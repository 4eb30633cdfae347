#!/usr/bin/env bash
# Session 11, call 3: the wgmma forward with FlashAttention-3's intra-warpgroup overlap
# (S of tile i beside P.V of tile i-1), assembled whole by the driver's JIT
# (setmaxnreg honoured, wgmma not serialized) against numba's linker (nvJitLink: both
# lost), its GPU tests, and the sanitizers (memcheck, racecheck, synccheck).
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
timeout 200 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider tests/test_ptx_hopper.py tests/test_wgmma_forward.py \
  > "$out/a_pytest_hopper.txt" 2>&1; rc=$?; echo "pytest rc=$rc" >> "$out/a_pytest_hopper.txt"
grep -E "passed|failed|FAILED|Error" "$out/a_pytest_hopper.txt" | tail -12
timeout 150 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -20 "$out/b_wgmma.txt"
NUMBA_FLASH_WHOLE_PROGRAM=0 timeout 150 python3 scripts/bench_wgmma.py "$out/c_wgmma_linker.jsonl" \
  > "$out/c_wgmma_linker.txt" 2>&1; tail -20 "$out/c_wgmma_linker.txt"
if [ $rc -eq 0 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py wgmma \
      > "$out/d_$tool.txt" 2>&1; echo "$tool rc=$?" >> "$out/d_$tool.txt"; tail -2 "$out/d_$tool.txt"
  done
fi

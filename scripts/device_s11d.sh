#!/usr/bin/env bash
# Session 11, call 4: call 3 again with the driver's whole-program JIT actually taking the
# PTX (call 3 passed a str, which cuda.core reads as a file path): tests, timing, the
# kernel's registers and local memory as loaded, sanitizers.
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
timeout 200 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider tests/test_ptx_hopper.py tests/test_wgmma_forward.py \
  > "$out/a_pytest_hopper.txt" 2>&1; rc=$?; echo "pytest rc=$rc" >> "$out/a_pytest_hopper.txt"
grep -E "passed|failed|FAILED|Error|Warn" "$out/a_pytest_hopper.txt" | tail -8
timeout 150 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -19 "$out/b_wgmma.txt"
if [ $rc -eq 0 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py wgmma \
      > "$out/d_$tool.txt" 2>&1; echo "$tool rc=$?" >> "$out/d_$tool.txt"; tail -2 "$out/d_$tool.txt"
  done
fi

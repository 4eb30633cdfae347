#!/usr/bin/env bash
# Session 11, call 2: v2 of the wgmma forward (TMA ring, warp specialization) on the GPU:
# its tests (the swizzled-layout probe first: it isolates K-major from MN-major), the
# timing at issue #13's shapes, and, when the tests pass, memcheck and racecheck of a
# small wgmma forward (partial tiles, both consumers, variants).
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
timeout 200 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider tests/test_ptx_hopper.py tests/test_wgmma_forward.py \
  > "$out/a_pytest_hopper.txt" 2>&1; rc=$?; echo "pytest rc=$rc" >> "$out/a_pytest_hopper.txt"
grep -E "passed|failed|FAILED|Error" "$out/a_pytest_hopper.txt" | tail -12
if [ $rc -eq 0 ]; then
  timeout 220 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -18 "$out/b_wgmma.txt"
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py wgmma \
      > "$out/c_$tool.txt" 2>&1; echo "$tool rc=$?" >> "$out/c_$tool.txt"; tail -3 "$out/c_$tool.txt"
  done
fi

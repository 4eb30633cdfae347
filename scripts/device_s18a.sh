#!/usr/bin/env bash
# Session 18, call 1: the wgmma backward at d = 256 (dV and dK apart) and at the multiples of 8
# between 64 and 256 (on the next tiles, TMA zero-filling the columns past d), the wgmma
# forward at 72..120: the GPU tests, racecheck of the new shapes, then issue #11's head-dim
# row (bench_head_dims.py: against SDPA flash in the same process).
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 260 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  tests/test_wgmma_forward.py -k "not persistent" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 120 compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma_bwd wide > "$out/b_racecheck.txt" 2>&1
echo "racecheck rc=$? at ${SECONDS}s" >> "$out/b_racecheck.txt"
timeout 170 python3 scripts/bench_head_dims.py "$out/c_head_dims.jsonl" --dims 256,96,32 > "$out/c_head_dims.txt" 2>&1
echo "head dims rc=$? at ${SECONDS}s" >> "$out/c_head_dims.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -14
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|finite|rc=|Error" "$out/b_racecheck.txt" | tail -8
tail -9 "$out/c_head_dims.txt"

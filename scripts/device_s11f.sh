#!/usr/bin/env bash
# Session 11, call 6: the GPU tests added after call 5 (the wgmma forward's variants,
# checked to run on it; the swizzled-layout test under -m gpu), with the rest of both files.
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
timeout 300 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rA tests/test_ptx_hopper.py tests/test_wgmma_forward.py \
  > "$out/a_pytest_hopper.txt" 2>&1; echo "pytest rc=$?" >> "$out/a_pytest_hopper.txt"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest_hopper.txt" | tail -30

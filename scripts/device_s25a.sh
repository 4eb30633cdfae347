#!/usr/bin/env bash
# Session 25, call 1: the Hopper backward's step pipelined (NUMBA_FLASH_WGMMA_BWD_PIPE: the dQ,
# dk and dv kernels issue each step's gradient products behind the next step's S and dP) — the
# backward's GPU tests with it (three stages), racecheck / synccheck of small cases with it, and
# the issue #13 backward table fp16 with modes 0 / 1 / 3 timed in turn (bench_wgmma_bwd.py --pipe-ab).
set -u
out=$1
. scripts/device_ab.sh
NUMBA_FLASH_WGMMA_BWD_PIPE=3 timeout 200 python3 -m pytest -q -rf -n 8 -p no:cacheprovider -m gpu \
  tests/test_wgmma_backward.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 230 b scripts/bench_wgmma_bwd.py --quick --pipe-ab
export NUMBA_FLASH_WGMMA_BWD_PIPE=3
sanitize racecheck wgmma_bwd 70
sanitize synccheck wgmma_bwd 60
unset NUMBA_FLASH_WGMMA_BWD_PIPE
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -12
tail -n 24 "$out/b_new.txt"

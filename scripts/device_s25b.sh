#!/usr/bin/env bash
# Session 25, call 2: the Hopper backward's dK/dV step pipelined too, with smaller steps (its
# registers: 32-query steps at d = 128, 64 at d = 64; NUMBA_FLASH_WGMMA_BWD_RING) — GPU tests of
# d = 128 and 64 with them, racecheck of small cases, and the issue #13 backward table fp16 with
# the modes 0 / 3 / 3s / 0s timed in turn (bench_wgmma_bwd.py --pipe-ab, PIPE_AB).
set -u
out=$1
. scripts/device_ab.sh
export NUMBA_FLASH_WGMMA_BWD_PIPE=3
NUMBA_FLASH_WGMMA_BWD_RING=32,64 timeout 120 python3 -m pytest -q -rf -n 8 -p no:cacheprovider -m gpu \
  tests/test_wgmma_backward.py -k "128" > "$out/a_pytest.txt" 2>&1
echo "pytest d=128 rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
NUMBA_FLASH_WGMMA_BWD_RING=64,128 timeout 100 python3 -m pytest -q -rf -n 8 -p no:cacheprovider -m gpu \
  tests/test_wgmma_backward.py -k "64 and not 256" >> "$out/a_pytest.txt" 2>&1
echo "pytest d=64 rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
NUMBA_FLASH_WGMMA_BWD_RING=32,64 sanitize racecheck wgmma_bwd 70
unset NUMBA_FLASH_WGMMA_BWD_PIPE
PIPE_AB=0,3,3s,0s side new 280 b scripts/bench_wgmma_bwd.py --quick --pipe-ab
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -12
tail -n 12 "$out/b_new.txt"

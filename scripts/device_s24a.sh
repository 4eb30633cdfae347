#!/usr/bin/env bash
# Session 24, call 1: dQ summed in the Hopper dK/dV kernel (ordered_dq: dS staged in shared
# memory, dQ = dS·K by wgmma, a bulk reduction a step in each query tile's semaphore order,
# then a convert launch) — GPU tests of the backward (every head dim, variants, varlen, GQA
# determinism), memcheck / racecheck / synccheck of small cases, and the issue #13 backward
# table fp16 with the dQ kernel (NUMBA_FLASH_WGMMA_DQ=pass) and the ordered dQ timed in turn.
set -u
out=$1
. scripts/device_ab.sh
timeout 240 python3 -m pytest -q -rf -n 8 -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  tests/test_traffic.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 200 b scripts/bench_wgmma_bwd.py --quick --dq-ab
sanitize memcheck wgmma_bwd 60
sanitize racecheck wgmma_bwd 70
sanitize synccheck wgmma_bwd 60
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -12
tail -n 14 "$out/b_new.txt"

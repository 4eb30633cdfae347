#!/usr/bin/env bash
# Session 25, call 3: with the pipelined step on by default (PIPE_DEFAULT "3": the dQ kernel, three
# stages) — the backward's and the variants' GPU tests, the issue #13 backward table fp16 with the
# modes 3 / 3k (dK/dV's ring three stages too) / 0 in turn, racecheck / synccheck / memcheck.
set -u
out=$1
. scripts/device_ab.sh
timeout 250 python3 -m pytest -q -rf -n 8 -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  tests/test_variants.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
PIPE_AB=3,3k,0 side new 220 b scripts/bench_wgmma_bwd.py --quick --pipe-ab
sanitize racecheck wgmma_bwd 75
sanitize synccheck wgmma_bwd 60
sanitize memcheck wgmma_bwd 60
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -12
tail -n 12 "$out/b_new.txt"

#!/usr/bin/env bash
# Session 24, call 2: why call 1's full-size ordered-dQ backward never finished — the
# probe case by case with the writers' watchdog (a writer that spins 2M times prints what
# it waits for and goes on), then the GPU tests named (-v) and timed.
set -u
out=$1
. scripts/device_ab.sh
NUMBA_FLASH_DQ_WATCHDOG=2000000 timeout 150 python3 scripts/probe_dq_order.py "$out/p.jsonl" > "$out/p.txt" 2>&1
echo "probe rc=$? at ${SECONDS}s" >> "$out/p.txt"
timeout 200 python3 -m pytest -v -rf -n 8 -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  --durations=12 > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "PASSED|FAILED|ERROR|rc=" "$out/a_pytest.txt" | sed 's/.*:://' | tail -40
grep -c stuck "$out/p.txt"
grep stuck "$out/p.txt" | head -20
grep -v "^{" "$out/p.txt" | tail -14

#!/usr/bin/env bash
# Session 21, call 2: the dropout warps with 56 registers (consumers 224) and two items a
# trip (call 1's 24-register warps reloaded the key schedule and spilled: 0.50-0.61x):
# the dropout GPU tests, then the A/B in one process on the shapes with dropout.
# The drop_ahead kernel path ran at commit 5ad4374 and was reverted after call 2 (slower).
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -n 4 tests/test_wgmma_forward.py \
  -k "dropout or variants_on_the_gpu" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 200 ab scripts/bench_ab.py NUMBA_FLASH_DROP_AHEAD=0,1 --dropout
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
tail -14 "$out/ab_new.txt"

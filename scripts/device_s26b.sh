#!/usr/bin/env bash
# Session 26, call 2: the softmax's row max and sum in four chains (softmax.CHAINS) — the Hopper
# forward's GPU tests and the mma.sync forward's, the A/B of one chain against four in one
# process on issue #13's shapes (bench_ab.py NUMBA_FLASH_SOFTMAX_CHAINS=1,4).
set -u
out=$1
. scripts/device_ab.sh
timeout 170 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_wgmma_forward.py \
  "tests/test_kernels.py" -k "forward or wgmma" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 300 b scripts/bench_ab.py NUMBA_FLASH_SOFTMAX_CHAINS=1,4
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
tail -n 14 "$out/b_new.txt"

#!/usr/bin/env bash
# Session 23, call 4: paged caches take 4 splits where they merge in a cluster: GPU tests of
# the KV cache and the decode bench; the decode table (auto splits) twice, and once with the
# cluster merge off.
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  tests/test_bench_decode.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for run in 1a 0 1b; do
  NUMBA_FLASH_CLUSTER_MERGE=${run:0:1} side new 100 c$run scripts/bench_decode.py --decode-only \
    --lengths 4096,32768,131072
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -6
for run in 1a 0 1b; do grep -v -i warn "$out/c${run}_new.txt" | grep -E "^decode|rc=" | tail -7; done

#!/usr/bin/env bash
# Session 23, call 2: the cluster merge with its axis (y when heaviest first) and clusters of at most 4:
# GPU tests of the cluster intrinsics, the KV cache, the merge and the decode bench; the
# decode table at 4096 / 32768 / 131072 keys with the split sweep at 4096, the cluster
# merge on and off (NUMBA_FLASH_CLUSTER_MERGE=1 / 0) in turn; memcheck of the KV-cache calls.
set -u
out=$1
. scripts/device_ab.sh
timeout 170 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_ptx_cluster.py \
  tests/test_kvcache.py tests/test_merge.py tests/test_bench_decode.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for on in 1 0 1; do
  NUMBA_FLASH_CLUSTER_MERGE=$on side new 100 c$on scripts/bench_decode.py --decode-only --lengths 4096,32768,131072 \
    --sweep-at 4096
  cat "$out/c${on}_new.txt" >> "$out/c_all.txt"
done
sanitize memcheck kvcache16 90
sanitize racecheck kvcache16 90
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
grep -E "ERROR SUMMARY|rc=" "$out/b_sanitize.txt" | tail -3
grep -v -i warn "$out/c_all.txt" | grep -E "decode|rc=" | tail -40

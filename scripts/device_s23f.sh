#!/usr/bin/env bash
# Session 23, call 6: the cluster merge at every head dim of the decode tiles (d = 256:
# one launch a step, no merge kernel): GPU tests of the KV cache; `bench --decode` at
# d = 256 with the cluster merge on and off (GQA 16/8 heads, B = 8).
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for on in 1 0; do
  NUMBA_FLASH_CLUSTER_MERGE=$on timeout 80 numba-flash bench --decode --head-dim 256 --heads 16 --kv-heads 8 \
    --seqlen 4096,32768 --json "$out/d_decode256_$on.json" > "$out/d_decode256_$on.txt" 2>&1
  echo "bench --decode d=256 cluster=$on rc=$? at ${SECONDS}s" >> "$out/d_decode256_$on.txt"
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -6
for on in 1 0; do tail -10 "$out/d_decode256_$on.txt"; done

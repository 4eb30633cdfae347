#!/usr/bin/env bash
# Session 23, call 7: clusters back to d <= 128: the decode-merge GPU tests (d = 128 and
# 256) and `bench --decode` at d = 256 (the merge kernel again).
set -u
out=$1
. scripts/device_ab.sh
timeout 70 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  -k "decode_merges or deterministic" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 50 numba-flash bench --decode --head-dim 256 --heads 16 --kv-heads 8 --seqlen 4096 --page-size 0 \
  > "$out/d_decode256.txt" 2>&1
echo "bench --decode d=256 rc=$? at ${SECONDS}s" >> "$out/d_decode256.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -6
tail -6 "$out/d_decode256.txt"

#!/usr/bin/env bash
# Session 22, call 5: split_count with two slots an SM for the decode tiles (4 splits at
# B·H_kv = 64): GPU tests of the KV cache and the decode bench (the workspace model), the
# decode table at 4096 / 32768 / 131072 keys with the split sweep at 131072.
set -u
out=$1
. scripts/device_ab.sh
timeout 130 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  tests/test_bench_decode.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 120 c scripts/bench_decode.py --decode-only --lengths 4096,32768,131072 --sweep-at 131072
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
grep -v -i warn "$out/c_new.txt" | grep -E "decode|rc=" | tail -14

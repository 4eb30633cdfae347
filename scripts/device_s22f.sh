#!/usr/bin/env bash
# Session 22, call 6: the measured-workspace GPU test with its new lower bound, and the paged
# 131072-key decode with the split count of a sequence across pages (8 splits again).
set -u
out=$1
. scripts/device_ab.sh
timeout 60 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu tests/test_bench_decode.py \
  -k workspace > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 60 c scripts/bench_decode.py --decode-only --lengths 131072
tail -3 "$out/a_pytest.txt"
grep -v -i warn "$out/c_new.txt" | grep -E "decode|rc=" | tail -4

#!/usr/bin/env bash
# Session 38, call 2 (on the warm machine after call 1): a second sample of both benchmarks, then
# tests/test_variants.py on the GPU (session 37 cut it at 115 s, 47 passed) in what is left.
set -u
out=$1  # $2: the seconds this call may run (default 580)
total=${2:-580}
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
variants new2
side new2 150 f scripts/bench_fa2.py --queued
timeout $(( total - SECONDS - 10 )) python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider tests/test_variants.py \
  > "$out/q_variants.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_variants.txt"
tail -n 8 "$out"/c_new*.txt
tail -n 14 "$out"/f_new*.txt
tail -n 3 "$out/q_variants.txt"; grep -E "^FAILED|^ERROR" "$out/q_variants.txt" | head
exit 0

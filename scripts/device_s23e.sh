#!/usr/bin/env bash
# Session 23, call 5: no fp32 parts in HBM where the splits merge in a cluster: GPU tests of
# the KV cache and the decode bench (the measured workspace); `numba-flash bench --decode`
# and `memory --decode` as a user runs them; the prefill bar (Nq = 2048 on a paged 16384
# cache, pages of 16, 64 and 256).
set -u
out=$1
. scripts/device_ab.sh
timeout 130 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  tests/test_bench_decode.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 90 numba-flash bench --decode --json "$out/d_bench_decode.json" > "$out/d_bench_decode.txt" 2>&1
echo "bench --decode rc=$? at ${SECONDS}s" >> "$out/d_bench_decode.txt"
timeout 60 numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096 \
  --max-seqlen 131072 > "$out/e_memory_decode.txt" 2>&1
echo "memory --decode rc=$? at ${SECONDS}s" >> "$out/e_memory_decode.txt"
side new 100 f scripts/bench_decode.py --prefill-only --pages 16,64,256
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -6
tail -22 "$out/d_bench_decode.txt"; tail -14 "$out/e_memory_decode.txt"; grep -E "prefill|rc=" "$out/f_new.txt" | tail -4

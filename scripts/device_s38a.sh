#!/usr/bin/env bash
# Session 38, call 1 (prepared by session 37, whose device time ran out): reconcile issue #11's ALiBi
# row — bench_variants.py --queued --dropout-only (plain, softcap, ALiBi, dropout in turn: 1.05-1.11x in
# sessions 33-35) and bench_fa2.py --queued (FlashAttention-2's kernels between ours: 1.17-1.18x in
# session 37) in one call, twice each, alternating; then the GPU tests session 37 cut
# (tests/test_variants.py, 47 passed before its limit) in what is left.
# Expected (written before the run): the kernel is session 35's (ptx_diff), so bench_variants gives
# ~1.1x again and bench_fa2 ~1.17x: the context, not the kernel; test_variants passes.
set -u
out=$1  # $2: the seconds this call may run (default 580)
total=${2:-580}
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
variants new1
side new1 240 f scripts/bench_fa2.py --queued  # (cold cache: compiles; since s37 with the GQA row)
variants new2
side new2 100 f scripts/bench_fa2.py --queued
timeout $(( total - SECONDS - 10 )) python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider tests/test_variants.py \
  > "$out/q_variants.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_variants.txt"
tail -n 8 "$out"/c_new*.txt
tail -n 12 "$out"/f_new*.txt
tail -n 3 "$out/q_variants.txt"; grep -E "^FAILED|^ERROR" "$out/q_variants.txt" | head
exit 0

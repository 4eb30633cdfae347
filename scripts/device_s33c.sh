#!/usr/bin/env bash
# Session 33, call 1: where ALiBi's k-slice goes in the Hopper forward's S chain
# (bench_alibi_order.py, one process an order: after all 8 of Q·Kᵀ's k-slices at d = 128, the
# default; first, the order before session 31; after 4; after 7), then issue #11's rows
# (bench_variants.py --queued) with what is left.
# Expected (written before the run): ALiBi first ~1.10x plain (sessions 29/30's 1.098 / 1.117),
# last ~1.20x (session 32's 1.211); the LSE error first ~2-5e-5, last ~5e-6; after 7 between.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
. scripts/device_ab.sh
for a in -1 0 7 4; do
  NUMBA_FLASH_ALIBI_AFTER=$a timeout 120 python3 scripts/bench_alibi_order.py "$out/alibi_order.jsonl" \
    > "$out/alibi_order_$a.txt" 2>&1
  echo "after $a rc=$? at ${SECONDS}s" >> "$out/alibi_order_$a.txt"
  tail -n 2 "$out/alibi_order_$a.txt"
done
side new $(( 585 - SECONDS )) v scripts/bench_variants.py --queued
tail -n 16 "$out/v_new.txt"
exit 0

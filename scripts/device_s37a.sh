#!/usr/bin/env bash
# Session 37, call 1: what session 36 changed and did not run on a GPU — memcheck and racecheck of
# the Hopper varlen passes with the 16-byte zeroing (`hopper.zero_rows`, cd6ede6); issue #11's rows
# (bench_variants.py --queued) under the new L2 default (9ce07f8); then the same variants against
# FlashAttention-2 itself (bench_fa2.py: torch's aten._flash_attention_forward/_backward, which
# takes windows, varlen offsets and ALiBi slopes that SDPA does not pass on).
# Expected (written before the run): sanitizers clean; the rows as session 36's on an H100 (varlen
# fwd ~0.7 / bwd ~0.77, window 0.64-0.75, softcap ~1.24, dropout ~1.26, ALiBi ~1.1); our kernels
# 1.3-1.8x faster than FA2 (Ampere kernels on Hopper) on every variant; FA2's own variant costs of
# the same order as ours: window ~0.8 of its causal TF/s (finer 64-key tiles), varlen ~0.7-0.8,
# dropout 1.2-1.5x, ALiBi ~1.05-1.1x forward.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
sanitize memcheck wgmma_varlen 120
sanitize racecheck wgmma_varlen 120
side new $(( 430 - SECONDS )) v scripts/bench_variants.py --queued
side new $(( 580 - SECONDS )) f scripts/bench_fa2.py --queued
grep -hE "SUMMARY|rc=" "$out/b_sanitize.txt" 2>/dev/null
tail -n 18 "$out/v_new.txt"
tail -n 10 "$out/f_new.txt"
exit 0

#!/usr/bin/env bash
# Prepared in session 32: issue #13's 16 rows again with the L2 sections (bench_hopper_bars.py,
# ~250 s on a cold machine), then issue #11's rows (bench_variants.py --queued) with what is left.
# Expected (written before the run): the bars hold; causal backward rows at (4,16,4096,128) and
# (4,32,4096,64) 5-10% above session 31's (sections), the forward rows as session 31's (+-5%);
# #11's GQA causal row near 1.0 now that MHA's causal forward is no longer L2-bound.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
side new 330 h scripts/bench_hopper_bars.py
side new $(( 585 - SECONDS )) v scripts/bench_variants.py --queued
tail -n 20 "$out/h_new.txt"
tail -n 16 "$out/v_new.txt"
exit 0

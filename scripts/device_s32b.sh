#!/usr/bin/env bash
# Prepared in session 31: issue #11's rows with every group timed in turn (bench_variants.py
# --queued: GQA / MHA, window / causal, varlen / padded / uniform in rounds since session 30),
# and racecheck of the Hopper forward with ALiBi's column term moved (sanitize_small.py wgmma).
# Expected: softcap ~1.27, dropout ~1.31, window ~0.82, varlen forward ~0.91 / backward ~0.80 (as
# session 30's), GQA causal within 5% of MHA now that MHA is timed in turn; 0 hazards.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
side new 330 v scripts/bench_variants.py --queued
sanitize racecheck wgmma $(( 585 - SECONDS ))
grep -E "RACECHECK SUMMARY|rc=" "$out/b_sanitize.txt" | tail -3
tail -n 20 "$out/v_new.txt"
exit 0

#!/usr/bin/env bash
# Session 31, second device call (tmp_old/ = numba_flash of 29d77e4, before session 29's d = 64
# dK/dV per-element pass change; tmp_new/ the tree): the d = 64 backward's variants old / new,
# then issue #11's rows with every group timed in turn (bench_variants.py --queued).
# Expected: d = 64 softcap and dropout backward 5-20% faster on the new tree (no local array,
# wgmma no longer serialized), plain equal; #11's ratios as session 30's (softcap ~1.27, dropout
# ~1.31, window ~0.82, varlen forward ~0.91 / backward ~0.80), GQA causal near 1 (MHA in turn).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
side old 105 d scripts/bench_bwd_variants_ab.py --d64
side new 105 d scripts/bench_bwd_variants_ab.py --d64
side new 270 v scripts/bench_variants.py --queued
for f in "$out"/d_*.txt; do echo "== $f"; tail -n 8 "$f"; done
tail -n 20 "$out/v_new.txt"
exit 0

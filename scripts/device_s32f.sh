#!/usr/bin/env bash
# Session 32, call 7: spec.l2_sections' rule (the forward in sections only over 3 L2s of
# streamed K/V, the backward's grids over one): bench_sections_ab.py --rule, off / on.
# Expected (written before the run, from calls 5-6): (4, 16, 4096, 128) causal forward 1.00x
# (one section either way now), backward ~1.07x; (4, 32, 4096, 128) forward ~1.33x, backward ~1.06x.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
side new 150 r scripts/bench_sections_ab.py --rule
tail -n 6 "$out/r_new.txt"
exit 0

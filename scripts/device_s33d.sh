#!/usr/bin/env bash
# Session 33, call 3 (warm after call 2): issue #11's softcap / ALiBi / dropout rows twice more
# (bench_variants.py --queued --dropout-only, two processes), then the window and varlen rows
# (--short-walks) once more: repeat samples of call 1's ratios (ALiBi 1.087 there, 1.211 in
# session 32). Expected (written before the run): ALiBi 1.08-1.12, softcap ~1.2, dropout ~1.2-1.3,
# window ~0.68-0.75, varlen (NumPy offsets) backward ~0.77.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
side new 150 r1 scripts/bench_variants.py --queued --dropout-only
side new 150 r2 scripts/bench_variants.py --queued --dropout-only
side new $(( 440 - SECONDS )) w scripts/bench_variants.py --queued --short-walks
for f in r1 r2 w; do tail -n 12 "$out/${f}_new.txt"; done
exit 0

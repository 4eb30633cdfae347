#!/usr/bin/env bash
# Prepared in session 30 for the next device call (tmp_old/ = numba_flash of 29d77e4, before the
# d = 64 dK/dV per-element pass change; tmp_new/ the tree): session 30's unrun fourth call (the 16
# tests that failed with softcap's Q prescaled, now off; the 14 its limit cut), then the d = 64
# backward's variants old / new with room for a cold machine's compiles (session 30's 45 s cut both).
# Expected (written before the run): the 30 tests pass; d = 64 softcap and dropout backward 5-20%
# faster on the new tree (no local array, wgmma no longer serialized), plain equal.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
bash tmp_new/scripts/device_s30d.sh "$out"
. scripts/device_ab.sh
side old 110 d scripts/bench_bwd_variants_ab.py --d64
side new 110 d scripts/bench_bwd_variants_ab.py --d64
for f in "$out"/d_*.txt; do echo "== $f"; tail -n 3 "$f"; done
[ -f "$out/failures.txt" ] && grep "^====" "$out/failures.txt" | head -20

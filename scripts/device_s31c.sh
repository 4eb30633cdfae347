#!/usr/bin/env bash
# Session 31, first device call: session 30's unrun fourth call (the 16 softcap tests that failed
# with Q prescaled, now off, and the 14 its time limit cut; limits raised for a cold machine's
# compiles), then racecheck of the Hopper forward and synccheck of the Hopper backward.
# Expected (written before the run): all 30 pass; 0 hazards, 0 errors.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
sed -e 's/timeout 115 /timeout 200 /' -e 's/timeout 110 /timeout 190 /' tmp_new/scripts/device_s30d.sh > /tmp/s30d.sh
bash /tmp/s30d.sh "$out"
. scripts/device_ab.sh
sanitize racecheck wgmma 85
sanitize synccheck wgmma_bwd 85
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$out/b_sanitize.txt" | tail -6
[ -f "$out/failures.txt" ] && grep "^====" "$out/failures.txt" | head -20
exit 0

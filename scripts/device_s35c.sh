#!/usr/bin/env bash
# Session 35, call 3 (H200, with what device time is left): pytest -m gpu of the variants'
# matrix and the determinism tests (GQA backward over 50 runs), then racecheck and synccheck
# of the Hopper forward's small cases.
set -u
out=$1
limit=${2:-420}
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
timeout $(( limit - 120 )) python3 -m pytest -m gpu -q -n 16 -p no:cacheprovider tests/test_variants.py \
  tests/test_determinism.py > "$out/q_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_pytest.txt"
sanitize racecheck wgmma $(( (limit - SECONDS) / 2 ))
sanitize synccheck wgmma_bwd $(( limit - SECONDS ))
tail -n 3 "$out/q_pytest.txt"; grep -E "^FAILED|^ERROR" "$out/q_pytest.txt" | head
grep -hE "SUMMARY|rc=" "$out/b_sanitize.txt" 2>/dev/null
exit 0

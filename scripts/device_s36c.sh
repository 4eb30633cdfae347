#!/usr/bin/env bash
# Session 36, call 3: the producer's zeroing of rows past a varlen sequence as 16-byte stores
# (hopper.zero_rows: a warp four rows a store, was a row of 4-byte stores): pytest -m gpu of the
# Hopper varlen and paged cases (NaN in the next sequence), then bench_knobs.py `varlen` twice.
# Expected (written before the run): ragged bwd ratio from 0.72 (zeroing) toward 0.77 (none).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
export KNOB_UNTIL=${KNOB_UNTIL:-300} KNOB_TIMEOUT=150
knob varlen_v4 varlen
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider tests/test_wgmma_forward.py tests/test_wgmma_backward.py \
  tests/test_kvcache.py -k "varlen or paged" > "$out/q_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_pytest.txt"
knob varlen_v4b varlen
tail -n 3 "$out/q_pytest.txt"; grep -E "^FAILED|^ERROR" "$out/q_pytest.txt" | head
grep -h "^varlen " "$out"/k_varlen_*.txt
exit 0

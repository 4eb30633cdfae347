#!/usr/bin/env bash
# Session 33, call 6: the persistent dK/dV kernel by default at d <= 64 and <= 1024 query rows
# (plain or causal only): its A/B on d = 64 shapes the rule takes (1024, 512 and 256 rows, causal
# and not; auto against off), then the Hopper backward's GPU tests on that tree with what is left.
# Expected (written before the run): (16, 32, 1024, 64) causal ~1.05-1.08x, the others unmeasured
# (0.98-1.08x); the tests pass.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
timeout 130 python3 scripts/bench_bwd_persistent_ab.py "$out/ab.jsonl" --d64 > "$out/ab.txt" 2>&1
echo "ab rc=$? at ${SECONDS}s" >> "$out/ab.txt"
tail -n 10 "$out/ab.txt"
timeout $(( 265 - SECONDS )) python3 -m pytest -q -rf -n 16 -m gpu -p no:cacheprovider tests/test_wgmma_backward.py \
  > "$out/b_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/b_pytest.txt"
tail -n 3 "$out/b_pytest.txt"
exit 0

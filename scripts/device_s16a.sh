#!/usr/bin/env bash
# Session 16, call 1: where the API's host time goes (baseline before trimming it), the
# variant bars as they stand, and test_traffic again (session 15's CLI fixes; the d = 64
# forward's doubled writes) with ncu's write breakdown of that kernel.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 150 python3 scripts/profile_host.py --profile > "$out/a_host.txt" 2>&1
echo "host rc=$? at ${SECONDS}s" >> "$out/a_host.txt"
timeout 200 python3 scripts/bench_variants.py "$out/b_variants.jsonl" --queued > "$out/b_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/b_variants.txt"
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_traffic.py > "$out/c_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/c_traffic.txt"
head -12 "$out/a_host.txt"; tail -22 "$out/b_variants.txt"
grep -E "FAILED|ERROR|passed|failed|rc=|MB" "$out/c_traffic.txt" | grep -v PASSED | tail -20

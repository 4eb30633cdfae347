#!/usr/bin/env bash
# Session 14, call 2: where the variant cases' time goes (API vs replayed kernels vs host,
# persistent blocks or not: scripts/diag_variants.py), issue #11's bars again after the
# ALiBi fix, the traffic tests (the CLI importable), memcheck of the Hopper varlen.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 150 python3 scripts/diag_variants.py "$out/a_diag.jsonl" > "$out/a_diag.txt" 2>&1
echo "diag rc=$? at ${SECONDS}s" >> "$out/a_diag.txt"
timeout 170 python3 scripts/bench_variants.py "$out/b_variants.jsonl" --queued > "$out/b_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/b_variants.txt"
timeout 90 python3 -m pytest -q -rf -n 4 -p no:cacheprovider tests/test_traffic.py > "$out/c_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/c_traffic.txt"
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python3 scripts/sanitize_small.py wgmma_varlen \
  > "$out/d_memcheck.txt" 2>&1
echo "memcheck rc=$? at ${SECONDS}s" >> "$out/d_memcheck.txt"
tail -n 3 "$out/c_traffic.txt" "$out/d_memcheck.txt"
tail -n 16 "$out/b_variants.txt"
tail -n 26 "$out/a_diag.txt"

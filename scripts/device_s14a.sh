#!/usr/bin/env bash
# Session 14, call 1: varlen on the Hopper kernels (new) — issue #11's variant bars with
# the wgmma kernels as default (bench_variants --queued), the GPU tests of both Hopper
# passes (varlen with a NaN neighbour) and of varlen on every path, the traffic test
# (session 13's kernel rename, not re-run), memcheck / racecheck / synccheck of varlen.
set -u
out=$1
unset NUMBA_FLASH_WGMMA
timeout 170 python3 scripts/bench_variants.py "$out/a_variants.jsonl" --queued > "$out/a_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/a_variants.txt"
timeout 230 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_wgmma_forward.py tests/test_wgmma_backward.py \
  tests/test_traffic.py > "$out/b_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/b_pytest.txt"
timeout 100 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_variants.py -k varlen > "$out/c_pytest_varlen.txt" 2>&1
echo "pytest varlen rc=$? at ${SECONDS}s" >> "$out/c_pytest_varlen.txt"
for tool in memcheck racecheck synccheck; do
  timeout 45 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py wgmma_varlen \
    > "$out/d_$tool.txt" 2>&1
  echo "$tool rc=$? at ${SECONDS}s" >> "$out/d_$tool.txt"
done
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/b_pytest.txt" "$out/c_pytest_varlen.txt" | tail -20
for tool in memcheck racecheck synccheck; do tail -n 3 "$out/d_$tool.txt"; done
tail -n 16 "$out/a_variants.txt"

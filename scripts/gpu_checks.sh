#!/usr/bin/env bash
# The GPU checks of a change, in parallel, logs under $1 (default /tmp/gpu_checks):
#   pytest -m gpu, numba-flash check (default GPU grid), and compute-sanitizer's memcheck,
#   racecheck and synccheck on scripts/sanitize_small.py.  Prints a short summary last.
#     scripts/gpu_checks.sh $OUT
set -u
out=${1:-/tmp/gpu_checks}
mkdir -p "$out"
( timeout 330 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider > "$out/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?" >> "$out/pytest_gpu.txt" ) &
( timeout 330 numba-flash check --seed 20261201 --json "$out/check.json" > "$out/check.txt" 2>&1
  echo "check rc=$?" >> "$out/check.txt" ) &
( for tool in memcheck racecheck synccheck; do
    timeout 110 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py \
      > "/tmp/san_$tool.txt" 2>&1
    echo "$tool rc=$?" >> "/tmp/san_$tool.txt"
  done
  cat /tmp/san_memcheck.txt /tmp/san_racecheck.txt /tmp/san_synccheck.txt > "$out/sanitizers.txt" ) &
wait
echo "=== summary"
tail -2 "$out/pytest_gpu.txt"; grep -E "^FAILED|^ERROR" "$out/pytest_gpu.txt" | head -20
tail -2 "$out/check.txt"
grep -hE "SUMMARY|rc=" "$out/sanitizers.txt"

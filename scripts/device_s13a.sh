#!/usr/bin/env bash
# Session 13, call 1: the Hopper backward on the H200 — (a) its tests (GPU shapes and the
# simulator's, with the forward's and the intrinsics' GPU tests: hopper.py's shared
# chains are new to the forward too), (b) the benchmark against FlashAttention-2 and
# cuDNN with each kernel's time, (c) memcheck and racecheck of small cases.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 210 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_wgmma_backward.py \
  tests/test_wgmma_forward.py tests/test_ptx_hopper.py tests/test_cache.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 250 python3 scripts/bench_wgmma_bwd.py "$out/b_bench.jsonl" > "$out/b_bench.txt" 2>&1
echo "bench rc=$? at ${SECONDS}s" >> "$out/b_bench.txt"
for tool in memcheck racecheck; do
  timeout 50 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py wgmma_bwd \
    > "$out/c_$tool.txt" 2>&1
  echo "$tool rc=$? at ${SECONDS}s" >> "$out/c_$tool.txt"
done
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
for tool in memcheck racecheck; do tail -n 3 "$out/c_$tool.txt"; done
tail -n 22 "$out/b_bench.txt"

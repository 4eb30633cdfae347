#!/usr/bin/env bash
# Session 12, call 3: the persistent wgmma forward, on by default on sm_90a — (a) the
# Hopper files' GPU tests (with blocks that run several tiles), (b) memcheck, racecheck,
# synccheck (three blocks), (c) the benchmark: as planned, a block a tile, two consumers
# at d = 64; queued and single calls, (d) where a short call's host time goes, (e) the
# GPU suite with the default (every fp16/bf16 forward at d = 64, 128 runs the wgmma
# one) but for the fp32/TF32 and FlexAttention files (mods and fp32 never take it), -v.
set -u
out=$1
. scripts/device_cli.sh
. scripts/device_hopper.sh
unset NUMBA_FLASH_WGMMA
hopper_pytest "$out" 120 -rf
wgmma_sanitizers "$out" b 60 memcheck racecheck synccheck
timeout 200 python3 scripts/bench_wgmma.py "$out/c_wgmma.jsonl" > "$out/c_wgmma.txt" 2>&1
echo "bench rc=$?" >> "$out/c_wgmma.txt"
timeout 40 python3 scripts/profile_wgmma_host.py > "$out/d_host.txt" 2>&1
head -4 "$out/d_host.txt"
timeout $((560 - SECONDS)) python3 -m pytest -m gpu -v -rf -n 14 -p no:cacheprovider tests/ \
  --ignore=tests/test_tf32.py --ignore=tests/test_flex_kernels.py > "$out/e_pytest_gpu.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/e_pytest_gpu.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/e_pytest_gpu.txt" | tail -12
grep -c PASSED "$out/e_pytest_gpu.txt"
tail -24 "$out/c_wgmma.txt"

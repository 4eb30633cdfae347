#!/usr/bin/env bash
# Session 12, call 3: the persistent wgmma forward — (a) the Hopper files' GPU tests (with
# blocks that run several tiles), (b) memcheck, racecheck, synccheck (three blocks),
# (c) the benchmark: as planned, a block a tile, two consumers at d = 64; queued and
# single calls, (d) where a short call's host time goes, (e) the GPU tests of the files
# session 12's first call did not reach, with the wgmma forward on.
set -u
out=$1
. scripts/device_cli.sh
. scripts/device_hopper.sh
hopper_pytest "$out" 150 -rf
wgmma_sanitizers "$out" b 100 memcheck racecheck synccheck
timeout 240 python3 scripts/bench_wgmma.py "$out/c_wgmma.jsonl" > "$out/c_wgmma.txt" 2>&1
echo "bench rc=$?" >> "$out/c_wgmma.txt"
timeout 60 python3 scripts/profile_wgmma_host.py > "$out/d_host.txt" 2>&1
head -4 "$out/d_host.txt"
export NUMBA_FLASH_WGMMA=1
timeout 200 python3 -m pytest -m gpu -v -rf -n 8 -p no:cacheprovider tests/test_cli.py tests/test_bench_decode.py \
  tests/test_traffic.py tests/test_cache.py tests/test_merge.py tests/test_arrays.py tests/test_determinism.py \
  > "$out/e_pytest_rest.txt" 2>&1
echo "pytest rc=$?" >> "$out/e_pytest_rest.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/e_pytest_rest.txt" | tail -12
tail -24 "$out/c_wgmma.txt"

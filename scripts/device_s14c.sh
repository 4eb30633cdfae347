#!/usr/bin/env bash
# Session 14, call 3: the consumers' ping-pong (NUMBA_FLASH_WGMMA_PINGPONG=1) — its GPU
# tests (the forward's suite, the named barriers), on against off with FA2 / cuDNN beside
# (bench_pingpong.py), then issue #11's bars with it on (bench_variants --queued, the
# ALiBi fix and the async NumPy offsets in), the offsets' upload test.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
NUMBA_FLASH_WGMMA_PINGPONG=1 timeout 120 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_wgmma_forward.py \
  tests/test_ptx_hopper.py tests/test_variants.py -k "wgmma or named or turns or offsets" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 200 python3 scripts/bench_pingpong.py "$out/b_pingpong.jsonl" > "$out/b_pingpong.txt" 2>&1
echo "pingpong rc=$? at ${SECONDS}s" >> "$out/b_pingpong.txt"
NUMBA_FLASH_WGMMA_PINGPONG=1 timeout 170 python3 scripts/bench_variants.py "$out/c_variants.jsonl" --queued \
  > "$out/c_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/c_variants.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -8
tail -n 16 "$out/c_variants.txt"
tail -n 10 "$out/b_pingpong.txt"

#!/usr/bin/env bash
# A first call for session 11 (written in session 10, not yet run): the Hopper work that
# has not touched a GPU (the register-A wgmma test, the wgmma forward's tests), its
# timing beside the mma.sync forward and SDPA, `memory --decode` with its caches drawn on
# the device, then the sanitizers alone (session 10's timed out beside pytest).
set -u
out=$1
. scripts/device_cli.sh
timeout 240 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider tests/test_ptx_hopper.py tests/test_wgmma_forward.py \
  > "$out/a_pytest_hopper.txt" 2>&1; echo "pytest rc=$?" >> "$out/a_pytest_hopper.txt"
tail -4 "$out/a_pytest_hopper.txt"
timeout 200 python3 scripts/bench_wgmma.py "$out/b_wgmma.jsonl" > "$out/b_wgmma.txt" 2>&1; tail -18 "$out/b_wgmma.txt"
timeout 120 numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096 \
  --max-seqlen 131072 --no-progress > "$out/c_memory_decode.txt" 2>&1; echo "rc=$?" >> "$out/c_memory_decode.txt"
tail -14 "$out/c_memory_decode.txt"

#!/usr/bin/env bash
# Session 11, call 7: the wgmma forward on by default on sm_90 (NUMBA_FLASH_WGMMA unset):
# the whole GPU suite, so every fp16/bf16 forward test at d = 64 and 128 runs on it.
set -u
out=$1
unset NUMBA_FLASH_WGMMA
. scripts/device_cli.sh
timeout 520 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider tests/ > "$out/a_pytest_gpu.txt" 2>&1
echo "pytest rc=$?" >> "$out/a_pytest_gpu.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest_gpu.txt" | tail -30

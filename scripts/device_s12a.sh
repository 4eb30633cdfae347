#!/usr/bin/env bash
# Session 12, call 1: (a) the Hopper files' GPU tests (the tma maps now encoded on the
# host and copied once); (b) the whole GPU suite with the wgmma forward switched on
# (NUMBA_FLASH_WGMMA=1), -rf, so that session 11's unnamed failure is named.
set -u
out=$1
. scripts/device_cli.sh
. scripts/device_hopper.sh
hopper_pytest "$out" 150 -rf
export NUMBA_FLASH_WGMMA=1
timeout 400 python3 -m pytest -m gpu -q -rf -n 12 -p no:cacheprovider tests/ > "$out/b_pytest_gpu_wgmma.txt" 2>&1
echo "pytest rc=$?" >> "$out/b_pytest_gpu_wgmma.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/b_pytest_gpu_wgmma.txt" | tail -30

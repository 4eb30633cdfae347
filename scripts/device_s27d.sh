#!/usr/bin/env bash
# Session 27, call 2: the forward GPU tests of test_kernels.py that session 26's call 2 cut before
# naming its 3 failures (now on the reverted code), then session 26's prepared three-consumer A/B:
# three consumers on 64-key tiles at d = 128 (NUMBA_FLASH_WGMMA_KEYS=64, NUMBA_FLASH_WGMMA_CONSUMERS=3)
# against the default on issue #13's shapes, its GPU tests and synccheck / racecheck.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 130 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_kernels.py -k forward \
  > "$out/c_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/c_pytest.txt"
timeout 90 python3 -m pytest -v -rf -n 8 -m gpu -p no:cacheprovider tests/test_wgmma_forward.py -k "keys or wide" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 200 b scripts/bench_ab.py NUMBA_FLASH_WGMMA_KEYS=,64 NUMBA_FLASH_WGMMA_CONSUMERS=,3
sanitize synccheck "wgmma keys64" 40
sanitize racecheck "wgmma keys64" 60
grep -E "FAILED|passed|failed|rc=" "$out/c_pytest.txt" "$out/a_pytest.txt" | tail -20
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -8
tail -n 14 "$out/b_new.txt"

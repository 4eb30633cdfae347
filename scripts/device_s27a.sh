#!/usr/bin/env bash
# Planned in session 26 (never run as such: session 27 ran its parts as scripts/device_s27d.sh): three consumers on 64-key tiles at
# d = 128 (NUMBA_FLASH_WGMMA_KEYS=64 with NUMBA_FLASH_WGMMA_CONSUMERS=3: three warpgroups to hide
# each other's softmax, since ptxas puts each consumer's wait for its P·V before its exponentials)
# — its GPU tests, racecheck / synccheck, and the A/B against the default on issue #13's shapes;
# then the forward GPU suite that session 26's call 2 cut before naming its 3 failures.
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 -m pytest -v -rf -n 8 -p no:cacheprovider tests/test_wgmma_forward.py -k "keys or wide" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 240 b scripts/bench_ab.py NUMBA_FLASH_WGMMA_KEYS=,64 NUMBA_FLASH_WGMMA_CONSUMERS=,3
sanitize racecheck "wgmma keys64" 60
sanitize synccheck "wgmma keys64" 40
timeout 100 python3 -m pytest -v -rf -n 8 -p no:cacheprovider tests/test_kernels.py -k forward -m gpu \
  > "$out/c_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/c_pytest.txt"
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" "$out/c_pytest.txt" | tail -20
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -8
tail -n 14 "$out/b_new.txt"

#!/usr/bin/env bash
# Session 26, call 1: wider key tiles in the Hopper forward where nothing bounds the walk
# (NUMBA_FLASH_WGMMA_WIDE_KEYS=1: 160 keys at d = 128, 80 at d = 256) — their tests on the GPU,
# the A/B against 128 / 64 keys in one process (bench_ab.py --wide), racecheck / synccheck.
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_wgmma_forward.py -k wide \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 290 b scripts/bench_ab.py NUMBA_FLASH_WGMMA_WIDE_KEYS=0,1 --wide
sanitize racecheck "wgmma keys" 75
sanitize synccheck "wgmma keys" 45
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_pytest.txt" | tail -15
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -12
tail -n 14 "$out/b_new.txt"

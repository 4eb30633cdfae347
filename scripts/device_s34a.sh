#!/usr/bin/env bash
# Prepared in session 33 for the next device call: NUMBA_FLASH_DESC_ADDS (each k-slice's wgmma
# descriptors a 32-bit add from its tile's; the same bits; offline SASS 2.7-10% fewer instructions
# a key step: forward d = 128 820 -> 772, dK/dV 710 -> 691, persistent dK/dV d = 128 797 -> 716,
# dQ 496 -> 457) timed against off on issue #13's shapes and issue #11's window, one process a
# setting, in turn twice (the second pair: the noise), issue #11's softcap / ALiBi / dropout rows
# (session 34: added before its run), then the Hopper GPU tests with it on.
# Expected (written before the run): 0-5% faster where the consumers issue-bind (d = 64, short
# shapes, the persistent dK/dV kernel), within noise elsewhere; every test passes.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
KNOB_UNTIL=300  # (`knob`: scripts/device_ab.sh; until session 33's end each script held its own copy)
knob shapes_off shapes NUMBA_FLASH_DESC_ADDS=0
knob shapes_adds shapes NUMBA_FLASH_DESC_ADDS=1
# issue #11's softcap / ALiBi / dropout rows (bench_variants.py --queued --dropout-only) each way
variants off NUMBA_FLASH_DESC_ADDS=0
variants adds NUMBA_FLASH_DESC_ADDS=1
knob window_off window NUMBA_FLASH_DESC_ADDS=0
knob window_adds window NUMBA_FLASH_DESC_ADDS=1
knob shapes_off2 shapes NUMBA_FLASH_DESC_ADDS=0
knob shapes_adds2 shapes NUMBA_FLASH_DESC_ADDS=1
NUMBA_FLASH_DESC_ADDS=1 timeout $(( 590 - SECONDS )) python3 -m pytest -q -rf -n 16 -m gpu -p no:cacheprovider \
  tests/test_wgmma_forward.py tests/test_wgmma_backward.py > "$out/d_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/d_pytest.txt"
tail -n 3 "$out/d_pytest.txt"
exit 0

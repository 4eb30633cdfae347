#!/usr/bin/env bash
# Session 36, call 4: pytest -m gpu of the Hopper kernels' files with the 16-byte zeroing, and
# bench_knobs.py `walks` with NUMBA_FLASH_L2_SECTIONS=unshared (the rule about to become the default).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
export KNOB_UNTIL=330 KNOB_TIMEOUT=100
timeout 280 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider tests/test_wgmma_forward.py tests/test_wgmma_backward.py \
  tests/test_kvcache.py tests/test_l2_sections.py > "$out/q_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_pytest.txt"
knob walks_v4_unshared walks NUMBA_FLASH_L2_SECTIONS=unshared
tail -n 3 "$out/q_pytest.txt"; grep -E "^FAILED|^ERROR" "$out/q_pytest.txt" | head
exit 0

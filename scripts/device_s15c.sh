#!/usr/bin/env bash
# Session 15, call 3: which tests failed in call 2 (it ran out of time before pytest's
# summary): the same selection with -v (names as they finish), on the code after reverting
# the two changes of call 2 (exp2_fma, masks drawn early); then test_traffic with -v.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 260 python3 -m pytest -v -rf --tb=short -n 8 -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  tests/test_ptx.py tests/test_dropout_bits.py -k "dropout or softcap or alibi or all or combination or mul_wide or packed" \
  > "$out/a_pytest_variants.txt" 2>&1
echo "pytest variants rc=$? at ${SECONDS}s" >> "$out/a_pytest_variants.txt"
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_traffic.py > "$out/b_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/b_traffic.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest_variants.txt" "$out/b_traffic.txt" | grep -v PASSED | tail -30

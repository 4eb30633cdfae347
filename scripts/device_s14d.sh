#!/usr/bin/env bash
# Session 14, call 4: the GPU tests the ALiBi change (fragments' index pass in two
# copies, every tensor-core family) and the traffic model's test fix touch.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 110 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_variants.py -k "alibi or combin or all" \
  > "$out/a_variants_alibi.txt" 2>&1
echo "alibi rc=$? at ${SECONDS}s" >> "$out/a_variants_alibi.txt"
timeout 170 python3 -m pytest -v --tb=short -rf -n 4 -p no:cacheprovider tests/test_traffic.py > "$out/b_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/b_traffic.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/a_variants_alibi.txt" | tail -8
grep -E "PASSED|FAILED|ERROR|rc=|^E " "$out/b_traffic.txt" | tail -25

#!/usr/bin/env bash
# Session 24, call 6: the committed code's Hopper backward GPU tests (the dQ kernel by
# default; the ordered dQ's orders opt-in, against the reference and bitwise over five runs).
set -u
out=$1
. scripts/device_ab.sh
timeout 175 python3 -m pytest -v -rf -n 8 -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "PASSED|FAILED|ERROR|rc=" "$out/a_pytest.txt" | sed 's/.*:://' | tail -42

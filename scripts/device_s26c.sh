#!/usr/bin/env bash
# Session 26, call 3: which forward GPU tests failed in call 2 (cut before pytest named them), on the
# reverted softmax (the session's start's, plus the wider key tiles, off by default): -v names each.
set -u
out=$1
. scripts/device_ab.sh
timeout 400 python3 -m pytest -v -rf -n 8 -p no:cacheprovider tests/test_kernels.py tests/test_wgmma_forward.py \
  -k "forward or wgmma" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -25

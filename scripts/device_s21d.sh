#!/usr/bin/env bash
# Session 21, call 4: with a block mask the Hopper forward takes 128-row tiles (call 3: the
# 192-row tiles at d = 64 ran a 50% pattern slower than dense): the rest of the flex GPU
# tests for the 16-bit families (large, varlen, 16k), issue #12's bars (bench_flex.py
# --quick) with the new code, racecheck of sanitize_small.py flex16.
set -u
out=$1
. scripts/device_ab.sh
timeout 130 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_flex_kernels.py \
  tests/test_wgmma_forward.py -k "(large or varlen or 16k or dropout_mask) and (fp16 or bf16 or mask)" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 170 f scripts/bench_flex.py --quick
sanitize racecheck flex16 80
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -4
grep -v Warning "$out/f_new.txt" | grep -v "warn(" | tail -16

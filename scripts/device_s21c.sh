#!/usr/bin/env bash
# Session 21, call 3: FlexAttention's mods on the Hopper kernels (score_mod, mask_mod block
# masks, block-sparse walks; visit lists read from global memory by every role): the flex
# GPU matrix for the 16-bit families (now on wgmma forward and backward), racecheck of
# sanitize_small.py flex, and issue #12's bars (bench_flex.py --quick) for the session's
# start (mods on the mma.sync kernels) and the new code.
set -u
out=$1
. scripts/device_ab.sh
timeout 170 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_flex_kernels.py \
  -k "fp16 or bf16" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize racecheck flex 100
for run in old new; do side $run 110 f scripts/bench_flex.py --quick; done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -4
for run in old new; do echo "== $run"; tail -14 "$out/f_$run.txt"; done

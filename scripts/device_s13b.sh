#!/usr/bin/env bash
# Session 13, call 3: (a) ncu of the Hopper backward's dK/dV and dQ kernels on the
# issue's shapes (fp16, causal off and on): SM busy (the tensor pipe), the gmma pipe's
# active cycles where ncu has the metric, stall reasons; (b) their SASS mix (cubins
# assembled here by `scripts/sass_mix.py assemble_backward sass_bwd`); (c) with the
# remaining time, the GPU tests of every file where an fp16/bf16 backward at d = 64, 128
# now runs the wgmma kernels by default.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
gmma=$(ncu --query-metrics --chip gh100 2>/dev/null | grep -o "sm__pipe_tensor_op_gmma_cycles_active" | head -1)
extra=""
if [ -n "$gmma" ]; then extra=",$gmma.avg.pct_of_peak_sustained_active"; fi
echo "gmma metric: '$gmma'"
timeout 170 ncu --clock-control none --kernel-name regex:wgmma_bwd \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$extra" \
  python3 scripts/ncu_wgmma.py backward > "$out/a_ncu_bwd.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/a_ncu_bwd.txt"
python3 scripts/ncu_stalls.py "$out/a_ncu_bwd.txt" backward > "$out/a_stalls.md" 2>&1
grep -E "gmma_cycles_active" "$out/a_ncu_bwd.txt" | head -16 > "$out/a_gmma.txt"
python3 scripts/sass_mix.py count sass_bwd > "$out/b_sass.txt" 2>&1
timeout $((450 - SECONDS)) python3 -m pytest -m gpu -q -rf -n 14 -p no:cacheprovider tests/test_kernels.py \
  tests/test_variants.py tests/test_determinism.py tests/test_traffic.py tests/test_numerics.py \
  tests/test_dropout_bits.py tests/test_cache.py tests/test_check.py tests/test_distributed.py > "$out/c_pytest_gpu.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/c_pytest_gpu.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/c_pytest_gpu.txt" | tail -20
tail -n 2 "$out/a_ncu_bwd.txt"
cat "$out/a_gmma.txt" "$out/b_sass.txt" "$out/a_stalls.md"

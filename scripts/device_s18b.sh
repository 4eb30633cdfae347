#!/usr/bin/env bash
# Session 18, call 2: head dims below 64 on the wgmma kernels (d = 64's tiles, TMA's boxes
# wider than the rows): their GPU tests and bench_head_dims at d = 32 (64 beside it); issue
# #14's split count at 4096 keys (bench_decode --sweep-at 4096); issue #11's variant rows
# profiled (ncu stall reasons of the wgmma forward: plain, softcap, ALiBi, dropout).
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_backward.py \
  tests/test_wgmma_forward.py -k "32" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 100 python3 scripts/bench_head_dims.py "$out/b_head_dims.jsonl" --dims 32,64 > "$out/b_head_dims.txt" 2>&1
echo "head dims rc=$? at ${SECONDS}s" >> "$out/b_head_dims.txt"
timeout 100 python3 scripts/bench_decode.py "$out/c_decode.jsonl" --decode-only --lengths 4096 --sweep-at 4096 \
  > "$out/c_decode.txt" 2>&1
echo "decode rc=$? at ${SECONDS}s" >> "$out/c_decode.txt"
export NUMBA_FLASH_WGMMA=1
timeout 150 ncu --clock-control none --kernel-name regex:wgmma_forward \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 scripts/ncu_wgmma.py variants > "$out/d_ncu_var.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/d_ncu_var.txt"
python3 scripts/ncu_stalls.py "$out/d_ncu_var.txt" variants > "$out/d_stalls.md" 2>&1
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
tail -7 "$out/b_head_dims.txt"; tail -12 "$out/c_decode.txt"; tail -2 "$out/d_ncu_var.txt"; cat "$out/d_stalls.md"

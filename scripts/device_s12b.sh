#!/usr/bin/env bash
# Session 12, call 2: the wgmma forward with three consumer warpgroups at d = 64
# (BLOCK_M 192) — (a) the Hopper files' GPU tests, (b) memcheck, racecheck, synccheck,
# (c) the benchmark against FlashAttention-2 and cuDNN, (d) the SASS mix of the cubins
# assembled here by `scripts/sass_mix.py assemble sass_cubins`, (e) ncu with stall reasons.
set -u
out=$1
. scripts/device_cli.sh
. scripts/device_hopper.sh
hopper_pytest "$out" 150 -rf
wgmma_sanitizers "$out" b 100 memcheck racecheck synccheck
timeout 200 python3 scripts/bench_wgmma.py "$out/c_wgmma.jsonl" > "$out/c_wgmma.txt" 2>&1
echo "bench rc=$?" >> "$out/c_wgmma.txt"
python3 scripts/sass_mix.py count sass_cubins > "$out/d_sass.txt" 2>&1
export NUMBA_FLASH_WGMMA=1
timeout 200 ncu --clock-control none --kernel-name regex:wgmma_forward \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 scripts/ncu_wgmma.py > "$out/e_ncu.txt" 2>&1
echo "ncu rc=$?" >> "$out/e_ncu.txt"
tail -3 "$out/e_ncu.txt"
cat "$out/d_sass.txt"
tail -20 "$out/c_wgmma.txt"

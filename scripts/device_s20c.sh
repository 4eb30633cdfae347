#!/usr/bin/env bash
# Session 20, call 3: why the varlen forward runs at 0.64–0.76 of a uniform batch of the
# same tokens (scripts/ncu_varlen.py): timings of the ragged batch, of 16 equal sequences
# through the varlen API and of the (16, 1024) batch, persistent and a block a tile; then
# Nsight Compute of one call of each (duration, instructions, warp stall reasons).
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 scripts/ncu_varlen.py "$out/v_time.jsonl" > "$out/v_time.txt" 2>&1
echo "time rc=$? at ${SECONDS}s" >> "$out/v_time.txt"
timeout 200 ncu --clock-control none --kernel-name regex:wgmma_forward --section SpeedOfLight \
  --section WarpStateStats --section LaunchStats \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
  python3 scripts/ncu_varlen.py --ncu > "$out/v_ncu.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/v_ncu.txt"
tail -8 "$out/v_time.txt"
grep -E "ncu_varlen:|gpu__time_duration|inst_executed|Throughput|Stall|stall|Warp Cycles|Grid Size|rc=" "$out/v_ncu.txt" \
  | tail -70

#!/usr/bin/env bash
# Session 11, call 5: the wgmma forward's timing twice more (separate processes: the
# spread between runs), then Nsight Compute on two shapes (tensor-pipe use, stalls,
# the instruction mix: HGMMA present, LDL/STL absent).
set -u
out=$1
for r in 1 2; do
  timeout 150 python3 scripts/bench_wgmma.py "$out/b_wgmma_$r.jsonl" > "$out/b_wgmma_$r.txt" 2>&1; tail -18 "$out/b_wgmma_$r.txt" | head -17
done
timeout 200 ncu --clock-control none --kernel-name regex:wgmma_forward --launch-skip 1 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats \
  python3 scripts/ncu_wgmma.py > "$out/e_ncu.txt" 2>&1; echo "ncu rc=$?" >> "$out/e_ncu.txt"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers|Stall|HGMMA|LDL|STL|Issue Slots|rc=" "$out/e_ncu.txt" | head -40

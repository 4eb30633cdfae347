#!/usr/bin/env bash
# Session 24, call 4: where the ordered dQ's dK/dV kernel spends its time, under ncu:
# speed of light, warp states and the compute workload of dK/dV with the ordered dQ and
# with the dQ kernel (NUMBA_FLASH_WGMMA_DQ=pass), then the ordered kernel's stall samples
# per SASS instruction (SourceCounters, the source page as CSV).
set -u
out=$1
. scripts/device_ab.sh
case=1,16,4096,128,0
for how in pass ordered; do
  NUMBA_FLASH_WGMMA_DQ=$([ $how = pass ] && echo pass) timeout 100 ncu --kernel-name regex:wgmma_bwd_dkdv \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section LaunchStats --section Occupancy python3 scripts/ncu_dq.py $case > "$out/n_$how.txt" 2>&1
  echo "ncu $how rc=$? at ${SECONDS}s" >> "$out/n_$how.txt"
done
timeout 150 ncu --kernel-name regex:wgmma_bwd_dkdv --launch-count 1 --section SourceCounters --page source \
  --print-source sass --csv python3 scripts/ncu_dq.py $case > "$out/n_src.csv" 2>&1
echo "ncu src rc=$? at ${SECONDS}s" >> "$out/n_src.csv"
for how in pass ordered; do
  grep -E "Duration|SM Busy|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occ|stalled_(wait|barrier|long|short|math|mio|dispatch|no_inst|membar|sleep|lg|branch|tex|drain|imc|misc|selected|not_sel)[a-z_]*_per_issue_active|rc=" "$out/n_$how.txt" | head -40
done
tail -n 2 "$out/n_src.csv"
wc -c "$out/n_src.csv"

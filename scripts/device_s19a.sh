#!/usr/bin/env bash
# Session 19, call 1: the Hopper forward on a paged KV cache (issue #13's dispatch, #14's
# prefill bar): the GPU tests of the prefill on every page size, memcheck and racecheck of
# the KV-cache calls (prefills included), the prefill bar for the session's start (tmp_old,
# 939ffe1: the mma.sync forward on pages) and the new code (pages of 16, 64 and 256), and
# an Nsight Compute breakdown of the 4096-key decode step (split kernel against merge).
set -u
out=$1
. scripts/device_ab.sh
timeout 170 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_kvcache.py \
  tests/test_wgmma_forward.py -k "prefill or deterministic or varlen" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize memcheck kvcache 60
sanitize racecheck kvcache 80
for run in old new; do side $run 70 c scripts/bench_decode.py --prefill-only --pages 16,64,256; done
timeout 100 ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum python3 scripts/ncu_decode.py 4096 > "$out/d_ncu.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/d_ncu.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|finite: False|rc=|rror" "$out/b_sanitize.txt" | tail -8
for run in old new; do echo "== $run"; tail -5 "$out/c_$run.txt"; done
grep -E "ncu_decode:|gpu__time_duration.sum|dram__bytes_read.sum|  [a-z_]+\(|Grid Size|Achieved Occupancy|rc=" \
  "$out/d_ncu.txt" | tail -60

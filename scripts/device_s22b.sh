#!/usr/bin/env bash
# Session 22, call 2: split-KV merged in the decode tiles' kernel by the last split
# (kernels.merge.merge_if_last) and the GQA decode swap's q read in place: GPU tests of the
# KV cache, the merge and the PTX intrinsics; memcheck of the KV-cache calls;
# issue #14's decode table at 4096 and 32768 keys (split sweep at 4096) for the session's
# start (tmp_old) and the new code; the 4096-key step under Nsight Compute (new).
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  tests/test_merge.py tests/test_ptx.py tests/test_ptx_compile.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for run in old new; do side $run 105 c scripts/bench_decode.py --decode-only --lengths 4096,32768,131072 --sweep-at 4096; done
sanitize memcheck kvcache 60
timeout 80 ncu --clock-control none --section LaunchStats --section SpeedOfLight \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum python3 scripts/ncu_decode.py 4096 > "$out/d_ncu.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/d_ncu.txt"
grep -E "ncu_decode:|gpu__time_duration.sum|  [a-z_]+[_a-z0-9]*\(|rc=" "$out/d_ncu.txt" | grep -v "^==" | tail -30
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -6
for run in old new; do echo "== $run"; grep -v -i warn "$out/c_$run.txt" | tail -12; done

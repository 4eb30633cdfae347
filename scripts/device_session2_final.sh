#!/bin/bash
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/install.txt 2>&1 || { tail /tmp/install.txt; exit 1; }
numba-flash info > $OUT/info.txt 2>&1
( timeout 290 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest_gpu.txt ) &
( timeout 250 numba-flash check --dtype float32 > $OUT/check_fp32.txt 2>&1; echo "check rc=$?" >> $OUT/check_fp32.txt ) &
( for tool in memcheck racecheck synccheck; do
    timeout 95 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py > /tmp/san_$tool.txt 2>&1
    echo "$tool rc=$?" >> /tmp/san_$tool.txt
  done; cat /tmp/san_*.txt > $OUT/sanitizers.txt ) &
wait
timeout 60 python3 scripts/fp32_modes_error.py > $OUT/fp32_err.txt 2>&1
timeout 150 numba-flash bench --dtype float32 --seqlen 4096 --head-dim 64 --head-dim 128 --impl numba-flash --impl numba-flash-tf32 --impl torch-sdpa-efficient --warmup 3 --rep 10 --min-rep 3 --budget-ms 300 --no-progress --json $OUT/bench_fp32.json > $OUT/bench_fp32.txt 2>&1; echo "bench rc=$?" >> $OUT/bench_fp32.txt
echo "=== summary"; tail -3 $OUT/pytest_gpu.txt; grep FAILED $OUT/pytest_gpu.txt | head -20; tail -2 $OUT/check_fp32.txt; grep -h "SUMMARY\|rc=\|done" $OUT/sanitizers.txt; cat $OUT/fp32_err.txt; tail -40 $OUT/bench_fp32.txt

#!/bin/bash
# session 2, call A: GPU tests, full check, sanitizers (in parallel), then overhead + bench alone
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || { tail $OUT/install.txt; exit 1; }
numba-flash info > $OUT/info.txt 2>&1
( timeout 330 python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider -x --durations=5 > $OUT/pytest_gpu.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest_gpu.txt ) &
( timeout 330 numba-flash check --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check rc=$?" >> $OUT/check.txt ) &
( for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py > $OUT/san_$tool.txt 2>&1
    echo "$tool rc=$?" >> $OUT/san_$tool.txt
  done; cat $OUT/san_*.txt > $OUT/sanitizers.txt; rm $OUT/san_*.txt ) &
wait
python3 scripts/api_overhead.py 16 32 1024 64 1 > $OUT/overhead.txt 2>&1
timeout 200 numba-flash bench --seqlen 1024 --seqlen 4096 --seqlen 16384 --head-dim 64 --head-dim 128 --dtype float16 --dtype bfloat16 --impl numba-flash --impl torch-sdpa-flash --warmup 3 --rep 20 --min-rep 3 --budget-ms 150 --no-progress --json $OUT/bench_tc.json > $OUT/bench_tc.txt 2>&1
echo "bench rc=$?" >> $OUT/bench_tc.txt
echo "=== summary"; tail -3 $OUT/pytest_gpu.txt; tail -4 $OUT/check.txt; grep -h "ERROR SUMMARY\|rc=\|done\|Error" $OUT/sanitizers.txt | sort | uniq -c; cat $OUT/overhead.txt; tail -45 $OUT/bench_tc.txt

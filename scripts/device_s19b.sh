#!/usr/bin/env bash
# Session 19, call 2: the merge kernel a block a row (issue #14's 4096-key decode step),
# the Hopper forward's pages looked up a tile ahead (the prefill bar) and its epilogue under
# the next tile's first S: the GPU tests of the KV cache, the merge and the Hopper forward,
# memcheck and racecheck of the KV-cache calls, racecheck of the Hopper forward, the decode table at
# 4096 and 32768 keys with the split sweep at 4096 (old: the session's start, new), the
# prefill on pages of 16, 64 and 256, and the merge under Nsight Compute.
set -u
out=$1
. scripts/device_ab.sh
timeout 200 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_kvcache.py \
  tests/test_merge.py tests/test_wgmma_forward.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no python3 scripts/sanitize_small.py kvcache \
  > "$out/b_sanitize.txt" 2>&1
echo "memcheck rc=$? at ${SECONDS}s" >> "$out/b_sanitize.txt"
timeout 60 compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py kvcache >> "$out/b_sanitize.txt" 2>&1
echo "racecheck rc=$? at ${SECONDS}s" >> "$out/b_sanitize.txt"
timeout 60 compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma >> "$out/b_sanitize.txt" 2>&1
echo "racecheck wgmma rc=$? at ${SECONDS}s" >> "$out/b_sanitize.txt"
for run in old new; do
  pp=$PWD:$base
  [ "$run" = old ] && pp=$root/tmp_old:$base
  lengths=4096
  [ "$run" = new ] && lengths=4096,32768
  env PYTHONPATH="$pp" timeout 80 python3 scripts/bench_decode.py "$out/c_$run.jsonl" --decode-only \
    --lengths $lengths --sweep-at 4096 > "$out/c_$run.txt" 2>&1
  echo "decode $run rc=$? at ${SECONDS}s" >> "$out/c_$run.txt"
done
timeout 60 python3 scripts/bench_decode.py "$out/d_prefill.jsonl" --prefill-only --pages 16,64,256 \
  > "$out/d_prefill.txt" 2>&1
echo "prefill rc=$? at ${SECONDS}s" >> "$out/d_prefill.txt"
timeout 60 ncu --clock-control none --kernel-name regex:merge --metrics gpu__time_duration.sum \
  python3 scripts/ncu_decode.py 4096 > "$out/e_ncu.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/e_ncu.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|finite: False|rc=|rror" "$out/b_sanitize.txt" | tail -8
for run in old new; do echo "== $run"; tail -14 "$out/c_$run.txt"; done
tail -5 "$out/d_prefill.txt"
grep -E "ncu_decode|gpu__time_duration|rc=" "$out/e_ncu.txt" | tail -16

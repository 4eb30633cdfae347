#!/usr/bin/env bash
# Session 19, call 2: the merge kernel a block a row (issue #14's 4096-key decode step),
# the Hopper forward's pages looked up a tile ahead (the prefill bar) and its epilogue under
# the next tile's first S: the GPU tests of the KV cache, the merge and the Hopper forward;
# memcheck and racecheck of the KV-cache calls, racecheck of the Hopper forward; the decode
# table at 4096 and 32768 keys with the split sweep at 4096; the prefill on pages of 16, 64
# and 256; issue #11's window and varlen rows (bench_variants --short-walks) for the
# session's start (tmp_old, 939ffe1) and the new code.
set -u
out=$1
. scripts/device_ab.sh
timeout 200 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_kvcache.py \
  tests/test_merge.py tests/test_wgmma_forward.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize memcheck kvcache 90
sanitize racecheck kvcache 60
sanitize racecheck wgmma 60
timeout 80 python3 scripts/bench_decode.py "$out/c_decode.jsonl" --decode-only --lengths 4096,32768 --sweep-at 4096 \
  > "$out/c_decode.txt" 2>&1
echo "decode rc=$? at ${SECONDS}s" >> "$out/c_decode.txt"
timeout 60 python3 scripts/bench_decode.py "$out/d_prefill.jsonl" --prefill-only --pages 16,64,256 \
  > "$out/d_prefill.txt" 2>&1
echo "prefill rc=$? at ${SECONDS}s" >> "$out/d_prefill.txt"
# the window and varlen rows: the epilogue under the next tile's first S
for run in old new; do side $run 75 e scripts/bench_variants.py --queued --short-walks; done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|finite: False|rc=|rror" "$out/b_sanitize.txt" | tail -8
tail -14 "$out/c_decode.txt"
tail -5 "$out/d_prefill.txt"
for run in old new; do echo "== $run"; tail -10 "$out/e_$run.txt"; done

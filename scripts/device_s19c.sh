#!/usr/bin/env bash
# Session 19, call 3: the wgmma forward's epilogue under the next tile's first S, rebuilt so
# that ptxas does not serialize its wgmma (call 2's version ran 26% slower): the Hopper
# forward's GPU tests, the KV-cache prefills and the replays; racecheck of the Hopper
# forward (persistent blocks); issue #11's window and varlen rows (bench_variants
# --short-walks) for the session's start (tmp_old, 939ffe1) and the new code; the prefill
# bar on pages of 16 and 256; the softcap / ALiBi / dropout rows of the new code.
# (Written with device_ab.sh's helpers after the call; as run, racecheck's log was
# b_racecheck.txt, and the call's 440 s ran out before the last rows.)
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  tests/test_kvcache.py tests/test_replay.py -k "wgmma or prefill or replay" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize racecheck wgmma 70
for run in old new; do side $run 75 e scripts/bench_variants.py --queued --short-walks; done
timeout 45 python3 scripts/bench_decode.py "$out/d_prefill.jsonl" --prefill-only --pages 16,256 \
  > "$out/d_prefill.txt" 2>&1
echo "prefill rc=$? at ${SECONDS}s" >> "$out/d_prefill.txt"
variants new
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -4
tail -3 "$out/d_prefill.txt"
for run in old new; do echo "== $run"; tail -9 "$out/e_$run.txt"; done
echo "== variants"; tail -7 "$out/c_new.txt"

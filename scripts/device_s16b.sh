#!/usr/bin/env bash
# Session 16, call 2: the producer-drawn dropout keep bits and the staged O epilogue on
# the GPU (tests first), then issue #11's dropout / softcap / ALiBi rows for the new code
# (tmp_new) and the session's start (tmp_old) in one process each, and the host times.
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  tests/test_replay.py -k "dropout or variants or replay or persistent" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 90 python3 scripts/bench_variants.py "$out/b_new.jsonl" --queued --dropout-only > "$out/b_new.txt" 2>&1
echo "new rc=$? at ${SECONDS}s" >> "$out/b_new.txt"
PYTHONPATH=$root/tmp_old:$base timeout 90 python3 scripts/bench_variants.py "$out/c_old.jsonl" --queued \
  --dropout-only > "$out/c_old.txt" 2>&1
echo "old rc=$? at ${SECONDS}s" >> "$out/c_old.txt"
timeout 35 python3 scripts/profile_host.py > "$out/d_host.txt" 2>&1
echo "host rc=$? at ${SECONDS}s" >> "$out/d_host.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
tail -7 "$out/b_new.txt"; tail -7 "$out/c_old.txt"; cat "$out/d_host.txt"

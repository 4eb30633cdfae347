#!/usr/bin/env bash
# Session 16, call 1: the API's host time before (tmp_old: the session's start) and after
# the replay fast path (tmp_new: the committed code, kept apart from work in progress),
# issue #11's variant bars with the replay, and the GPU tests of the replay, the Hopper
# kernels it replays and test_traffic (session 15's CLI fixes; the d = 64 writes).
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
PYTHONPATH=$root/tmp_old:$base timeout 100 python3 scripts/profile_host.py > "$out/a_host_old.txt" 2>&1
echo "host old rc=$? at ${SECONDS}s" >> "$out/a_host_old.txt"
PYTHONPATH=$PWD:$base timeout 120 python3 scripts/profile_host.py --profile > "$out/a_host_new.txt" 2>&1
echo "host new rc=$? at ${SECONDS}s" >> "$out/a_host_new.txt"
PYTHONPATH=$PWD:$base timeout 170 python3 scripts/bench_variants.py "$out/b_variants.jsonl" --queued > "$out/b_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/b_variants.txt"
PYTHONPATH=$PWD:$base timeout 200 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_replay.py \
  tests/test_traffic.py tests/test_wgmma_backward.py > "$out/c_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/c_pytest.txt"
head -11 "$out/a_host_old.txt"; head -11 "$out/a_host_new.txt"; tail -22 "$out/b_variants.txt"
grep -E "FAILED|ERROR|passed|failed|rc=|MB" "$out/c_pytest.txt" | grep -v PASSED | tail -20

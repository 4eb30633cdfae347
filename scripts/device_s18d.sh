#!/usr/bin/env bash
# Session 18, call 4: dropout's keep words pinned before the wait for S (ptx.hold_u32x16; reverted after
# this call, with the intrinsic and its test):
# the tests, then issue #11's softcap / ALiBi / dropout rows for the session's start
# (tmp_old, 8fd2489) and the new code, each in its own process (as run, the logs were b_*; now c_*).
set -u
out=$1
. scripts/device_ab.sh
timeout 60 python3 -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_ptx.py -k "hold" > "$out/a_pytest.txt" 2>&1
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  -k "dropout or variants or alibi" >> "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
variants old
variants new
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
for run in old new; do echo "== $run"; tail -6 "$out/c_$run.txt"; done

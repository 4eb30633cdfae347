#!/usr/bin/env bash
# Session 18, call 4: dropout's keep words pinned before the wait for S (ptx.hold_u32x16):
# the tests, then issue #11's softcap / ALiBi / dropout rows for the session's start
# (tmp_old, 8fd2489) and the new code, each in its own process.
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base
timeout 60 python3 -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_ptx.py -k "hold" > "$out/a_pytest.txt" 2>&1
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  -k "dropout or variants or alibi" >> "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for run in old new; do
  pp=$PWD:$base
  [ $run = old ] && pp=$root/tmp_old:$base
  env PYTHONPATH=$pp timeout 100 python3 scripts/bench_variants.py "$out/b_$run.jsonl" --queued --dropout-only \
    > "$out/b_$run.txt" 2>&1
  echo "variants $run rc=$? at ${SECONDS}s" >> "$out/b_$run.txt"
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
for run in old new; do echo "== $run"; tail -6 "$out/b_$run.txt"; done

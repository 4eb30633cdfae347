#!/usr/bin/env bash
# Session 17, call 1: ALiBi's column frame (issue #11's ALiBi bar) and raw scores with the
# scale in the exponent (NUMBA_FLASH_RAW_SCORES=1, an experiment: one FMUL an element less)
# on the GPU.  Tests first (the wgmma forward, the ALiBi variants on every family, the
# replay of b4e2af5), then the variant rows and the forward table for the session's start
# (tmp_old), the new code (tmp_new) and the new code with raw scores, each in a process of its own.
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  tests/test_replay.py "tests/test_variants.py::test_variant_gpu_matrix" -k "alibi or all or replay or wgmma" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
NUMBA_FLASH_RAW_SCORES=1 timeout 45 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu \
  tests/test_wgmma_forward.py > "$out/a_pytest_raw.txt" 2>&1
echo "pytest raw rc=$? at ${SECONDS}s" >> "$out/a_pytest_raw.txt"
for run in old new raw; do
  pp=$PWD:$base; env=""
  [ $run = old ] && pp=$root/tmp_old:$base
  [ $run = raw ] && env="NUMBA_FLASH_RAW_SCORES=1"
  env PYTHONPATH=$pp $env timeout 80 python3 scripts/bench_variants.py "$out/b_$run.jsonl" --queued --dropout-only \
    > "$out/b_$run.txt" 2>&1
  echo "variants $run rc=$? at ${SECONDS}s" >> "$out/b_$run.txt"
  [ $run = old ] && continue  # the table: new against raw (the frame changes ALiBi only)
  peer=--no-peer; [ $run = raw ] && peer=""
  env PYTHONPATH=$pp $env timeout 75 python3 scripts/bench_table.py "$out/c_$run.jsonl" --forward-only --queued \
    --tc-only $peer > "$out/c_$run.txt" 2>&1
  echo "table $run rc=$? at ${SECONDS}s" >> "$out/c_$run.txt"
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" "$out/a_pytest_raw.txt" | grep -v PASSED | tail -12
for run in old new raw; do echo "== $run"; tail -6 "$out/b_$run.txt"; done
python3 scripts/bench_table.py --compare "$out/c_new.jsonl" "$out/c_raw.jsonl"

#!/usr/bin/env bash
# Session 18, call 3: the wgmma forward's dropout bits drawn while S runs, and causal ALiBi
# on the tensor cores (wgmma_forward.alibi_on_products): the GPU tests, racecheck, then
# issue #11's softcap / ALiBi / dropout rows (plain and the three timed in turn, five
# rounds) for the session's start (tmp_old, 8fd2489) and the new code, each in its own
# process, and the new code with the bias off the tensor cores (NUMBA_FLASH_ALIBI_PRODUCTS=0).
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base
timeout 170 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  "tests/test_variants.py::test_variant_gpu_matrix" -k "alibi or dropout or variants or (on_the_gpu and 128)" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 100 compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma > "$out/b_racecheck.txt" 2>&1
echo "racecheck rc=$? at ${SECONDS}s" >> "$out/b_racecheck.txt"
for run in old new frame; do
  pp=$PWD:$base; env="NUMBA_FLASH_ALIBI_PRODUCTS=1"
  [ $run = old ] && pp=$root/tmp_old:$base
  [ $run = frame ] && env="NUMBA_FLASH_ALIBI_PRODUCTS=0"
  env PYTHONPATH=$pp $env timeout 100 python3 scripts/bench_variants.py "$out/c_$run.jsonl" --queued --dropout-only \
    > "$out/c_$run.txt" 2>&1
  echo "variants $run rc=$? at ${SECONDS}s" >> "$out/c_$run.txt"
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
grep -E "RACECHECK SUMMARY|finite|rc=|rror" "$out/b_racecheck.txt" | tail -8
for run in old new frame; do echo "== $run"; tail -6 "$out/c_$run.txt"; done

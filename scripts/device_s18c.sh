#!/usr/bin/env bash
# Session 18, call 3: the wgmma forward's dropout bits drawn while S runs, and causal ALiBi
# on the tensor cores (wgmma_forward.alibi_on_products): the GPU tests, racecheck, then
# issue #11's softcap / ALiBi / dropout rows (plain and the three timed in turn, five
# rounds) for the session's start (tmp_old, 8fd2489) and the new code, each in its own
# process, and the new code with the bias off the tensor cores (NUMBA_FLASH_ALIBI_PRODUCTS=0).
set -u
out=$1
. scripts/device_ab.sh
timeout 170 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  "tests/test_variants.py::test_variant_gpu_matrix" -k "alibi or dropout or variants or (on_the_gpu and 128)" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 100 compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma > "$out/b_racecheck.txt" 2>&1
echo "racecheck rc=$? at ${SECONDS}s" >> "$out/b_racecheck.txt"
variants old
variants new NUMBA_FLASH_ALIBI_PRODUCTS=1
variants frame NUMBA_FLASH_ALIBI_PRODUCTS=0
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
grep -E "RACECHECK SUMMARY|finite|rc=|rror" "$out/b_racecheck.txt" | tail -8
for run in old new frame; do echo "== $run"; tail -6 "$out/c_$run.txt"; done

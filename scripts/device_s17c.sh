#!/usr/bin/env bash
# Session 17, call 3: raw scores on by default in the wgmma forward (softmax.raw_scores);
# the GPU tests, then an A/B of NUMBA_FLASH_RAW_SCORES=0,1 in one process
# (scripts/bench_ab.py), then issue #11's softcap / ALiBi / dropout rows with the default.
set -u
out=$1
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  tests/test_replay.py "tests/test_variants.py::test_variant_gpu_matrix" "tests/test_variants.py::test_variant_combined_large" \
  -k "wgmma or replay or fp16 or bf16" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 200 python3 scripts/bench_ab.py "$out/b_ab.jsonl" NUMBA_FLASH_RAW_SCORES=0,1 > "$out/b_ab.txt" 2>&1
echo "ab rc=$? at ${SECONDS}s" >> "$out/b_ab.txt"
timeout 100 python3 scripts/bench_variants.py "$out/c_variants.jsonl" --queued --dropout-only > "$out/c_variants.txt" 2>&1
echo "variants rc=$? at ${SECONDS}s" >> "$out/c_variants.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
tail -14 "$out/b_ab.txt"; tail -7 "$out/c_variants.txt"

#!/usr/bin/env bash
# Session 17, call 2: softcap with some exponentials on the FMA pipe (ptx.ex2_emulated,
# NUMBA_FLASH_EX2_EMULATE=k) and ALiBi's column frame with its distance hoisted before the
# wait for S, on the GPU.  Tests first, then issue #11's softcap / ALiBi / dropout rows
# (the four cases timed in turn over five rounds) for the session's start (tmp_old), the
# new code, and the new code with k = 2 and 4, each in a process of its own.
set -u
out=$1
root=$PWD
cd tmp_new
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_ptx.py tests/test_wgmma_forward.py \
  "tests/test_variants.py::test_variant_gpu_matrix" -k "ex2 or wgmma or alibi or all" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for run in old new emu2 emu4; do
  pp=$PWD:$base; env="NUMBA_FLASH_EX2_EMULATE=0"
  [ $run = old ] && pp=$root/tmp_old:$base
  [ $run = emu2 ] && env="NUMBA_FLASH_EX2_EMULATE=2"
  [ $run = emu4 ] && env="NUMBA_FLASH_EX2_EMULATE=4"
  env PYTHONPATH=$pp $env timeout 100 python3 scripts/bench_variants.py "$out/b_$run.jsonl" --queued --dropout-only \
    > "$out/b_$run.txt" 2>&1
  echo "variants $run rc=$? at ${SECONDS}s" >> "$out/b_$run.txt"
done
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -12
for run in old new emu2 emu4; do echo "== $run"; tail -6 "$out/b_$run.txt"; done

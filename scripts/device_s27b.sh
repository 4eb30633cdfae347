#!/usr/bin/env bash
# Session 27, call 1: the whole `pytest -m gpu` suite (not run in full since session 24), the
# Hopper files first so that a cut leaves them complete; names session 26's 3 unnamed failures.
# (Refused twice in session 27 before any machine started; not run. Calls 2–4 ran parts of it.)
set -u
out=$1
cd tmp_new || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
unset NUMBA_FLASH_WGMMA
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 550 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=25 \
  tests/test_wgmma_forward.py tests/test_wgmma_backward.py tests/test_kernels.py tests/test_variants.py \
  tests/test_kvcache.py tests/test_flex_kernels.py tests/test_numerics.py tests/test_tf32.py \
  tests/test_determinism.py tests/test_ptx_hopper.py tests/test_ptx.py tests/test_ptx_cluster.py \
  tests/test_arrays.py tests/test_cli.py tests/test_replay.py tests/test_merge.py tests/test_cache.py \
  tests/test_traffic.py tests/test_bench_decode.py > "$out/pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/pytest.txt"
grep -c " PASSED" "$out/pytest.txt"
grep -E "^FAILED|^ERROR| FAILED | ERROR " "$out/pytest.txt" | sort | uniq | head -40
tail -n 3 "$out/pytest.txt"

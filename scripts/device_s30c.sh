#!/usr/bin/env bash
# Session 30, third device call (after device_s30b.sh, same tree): the rest of `pytest -m gpu`
# (variants, KV cache, FlexAttention's kernels and the small files); then racecheck of the
# Hopper forward's softcap cases if time is left. $2: seconds for pytest.
set -u
out=$1
limit=${2:-450}
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name --format=csv > "$out/gpu.txt" 2>&1
timeout "$limit" python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=20 tests/test_variants.py \
  tests/test_kvcache.py tests/test_flex_kernels.py tests/test_determinism.py tests/test_replay.py \
  tests/test_ptx_cluster.py tests/test_ptx.py tests/test_cli.py tests/test_arrays.py tests/test_traffic.py \
  tests/test_merge.py tests/test_cache.py tests/test_bench_decode.py > "$out/a_pytest.txt" 2>&1
echo "pytest rest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -12

#!/usr/bin/env bash
# Session 30, second device call (right after device_s30a.sh, same machine, same tree): the
# mma.sync, TF32 and numerics GPU tests of `pytest -m gpu`.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name --format=csv > "$out/gpu.txt" 2>&1
timeout 550 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=20 tests/test_kernels.py \
  tests/test_tf32.py tests/test_numerics.py > "$out/a_pytest.txt" 2>&1
echo "pytest kernels/tf32/numerics rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | tail -12

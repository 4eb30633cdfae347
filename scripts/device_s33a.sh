#!/usr/bin/env bash
# Prepared in session 32 for the next device call: the Hopper GPU tests on the tree with L2
# sections (session 32's calls 5-7 ran 7 GPU tests of them): test_l2_sections.py, the Hopper
# forward and backward files, test_ptx_hopper.py, traffic (its DRAM model now walks the
# sections' order on the Hopper kernels).
# Expected (written before the run): all pass.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
. scripts/device_ab.sh
timeout 540 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=10 tests/test_l2_sections.py \
  tests/test_wgmma_forward.py tests/test_wgmma_backward.py tests/test_ptx_hopper.py tests/test_traffic.py \
  > "$out/h_pytest.txt" 2>&1
echo "pytest hopper rc=$? at ${SECONDS}s" >> "$out/h_pytest.txt"
grep -E "FAILED|passed|failed|rc=" "$out/h_pytest.txt" | tail -8
[ -f "$out/failures.txt" ] && grep "^====" "$out/failures.txt" | head -10
exit 0

#!/usr/bin/env bash
# Session 32, call 5: the heaviest-first grids' L2 sections (spec.l2_sections,
# block_info.l2_section).  bench_sections_ab.py times NUMBA_FLASH_L2_SECTIONS=off / on in
# turn (the same kernels: the sections are a run-time parameter) with cuDNN beside them;
# then the GPU tests of the sectioned grids (test_l2_sections.py: the order's bijection on
# the GPU, the Hopper forward and backward at size with a 1 MB L2) and the variant matrix's
# causal GQA / combined cases on every family (block_info is every kernel's).
# Expected (written before the run, from traffic.dram: causal DRAM reads 4.56 -> 0.54 GB at
# (4, 32, 4096, 128), 1.23 -> 0.27 GB at (4, 16, 4096, 128)): (4, 32, 4096, 128) MHA causal
# forward 1.2-1.45x (1.53 ms, bandwidth-bound, in session 32's call 2), the other causal rows
# 1.0-1.12x forward and 1.0-1.08x backward, the non-causal control 1.00 (one section either
# way), the window row within +-3%; every test passes.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
. scripts/device_ab.sh
side new 300 s scripts/bench_sections_ab.py
timeout $(( 505 - SECONDS )) python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=10 \
  tests/test_l2_sections.py tests/test_variants.py -k "l2 or sectioned or gqa-causal or all" > "$out/l_pytest.txt" 2>&1
echo "pytest sections rc=$? at ${SECONDS}s" >> "$out/l_pytest.txt"
grep -E "FAILED|passed|failed|rc=" "$out/l_pytest.txt" | tail -6
[ -f "$out/failures.txt" ] && grep "^====" "$out/failures.txt" | head -10
tail -n 14 "$out/s_new.txt"
exit 0

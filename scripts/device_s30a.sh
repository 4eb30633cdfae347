#!/usr/bin/env bash
# Session 30, first of three device calls, run back to back on one machine (the whole `pytest -m gpu`
# on one commit, split over the calls, with the compiled kernels kept on disk between them in
# /tmp/nbcache). With tmp_old/ = numba_flash of 29d77e4 (before the d = 64 dK/dV per-element pass
# change), tmp_new/ the tree (softcap's Q prescaled now on by default).
# This call: the Hopper kernels' GPU tests (forward, backward, PTX intrinsics), the d = 64 backward's
# variants old / new, issue #11's rows (bench_variants.py --queued, all of them), synccheck of softcap.
# Expected (written before the run): d = 64 softcap and dropout backward 5-20% faster (no local
# array, wgmma no longer serialized), plain equal; softcap forward at (4,16,4096,128) causal about
# as session 29's (prescale ~1.00x there), 1.08-1.14x faster at d = 64.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 220 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider --durations=15 tests/test_wgmma_backward.py \
  tests/test_wgmma_forward.py tests/test_ptx_hopper.py > "$out/a_pytest.txt" 2>&1
echo "pytest hopper rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side old 45 d scripts/bench_bwd_variants_ab.py --d64
side new 45 d scripts/bench_bwd_variants_ab.py --d64
side new 170 v scripts/bench_variants.py --queued
sanitize synccheck "wgmma softcap" 50
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -8
grep -E "ERROR SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -4
for f in "$out"/d_*.txt; do echo "== $f"; tail -n 3 "$f"; done
tail -n 22 "$out/v_new.txt"

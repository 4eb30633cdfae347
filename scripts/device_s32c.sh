#!/usr/bin/env bash
# Prepared in session 31: the persistent dK/dV kernel (opt-in, NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on):
# its GPU tests (the backward's GPU tests with it on), synccheck and racecheck of the Hopper
# backward with it on (sanitize_small.py wgmma_bwd), and its A/B against the one-block kernel
# (bench_bwd_persistent_ab.py).
# Expected (written before the run): tests pass, bitwise the same gradients, 0 errors / hazards;
# the varlen backward and (16, 32, 1024, 64) 3-10% faster (K and V's load and the ring's fill
# under the previous block's walk; no blocks past a sequence), the long shapes within +-3%
# (their step loop carries ~84 more SASS instructions, 797 against 713 at d = 128 causal:
# the fixed tiles' wgmma descriptors recomputed every step).
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on timeout 170 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider \
  tests/test_wgmma_backward.py > "$out/p_pytest.txt" 2>&1
echo "pytest persistent rc=$? at ${SECONDS}s" >> "$out/p_pytest.txt"
side new 240 p scripts/bench_bwd_persistent_ab.py
export NUMBA_FLASH_WGMMA_BWD_PERSISTENT=2  # two blocks: each runs several of the small shapes' blocks
sanitize synccheck wgmma_bwd $(( (585 - SECONDS) / 2 ))
sanitize racecheck wgmma_bwd $(( 585 - SECONDS ))
grep -E "FAILED|passed|failed|rc=" "$out/p_pytest.txt" | tail -6
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$out/b_sanitize.txt" | tail -4
tail -n 14 "$out/p_new.txt"
exit 0

#!/usr/bin/env bash
# Session 34, call 1 (ran at b1d9b95; the Q buffers' switch was removed after it) (machines scarce, the budget cut by failed starts: s34a and s34b in one call of 500 s): the descriptor adds
# (NUMBA_FLASH_DESC_ADDS; on the walks group's causal 16384, window, varlen and padded rows, forward and
# backward, instead of s34a's issue #13 shapes; with them the persistent dK/dV kernel on, session 33's
# 0.93x on the varlen backward at d = 128, 797 -> 716 instructions a step with the adds) and the two Q buffers with and without the
# overlapped epilogue (s34b's A/B on issue #11's short walks), one process a setting, in turn, each
# A/B twice; then the GPU tests of the two Q buffers (the forward's persistent, varlen and variant
# tests with them on).
# Expected (written before the run): adds 0-5% faster where the consumers issue-bind (d = 64, short
# shapes), noise elsewhere; Q buffers alone within noise; Q buffers + overlap: window forward ratio
# 0.68 -> 0.72-0.76, varlen 0.85 -> 0.88-0.93; backward columns unchanged (noise); no test fails.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
KNOB_UNTIL=300
knob walks_default walks
knob walks_q2_overlap walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2 NUMBA_FLASH_WGMMA_OVERLAP=1
knob walks_q2 walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2
knob walks_default2 walks
knob walks_q2_overlap2 walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2 NUMBA_FLASH_WGMMA_OVERLAP=1
knob walks_adds walks NUMBA_FLASH_DESC_ADDS=1
knob walks_adds_pers walks NUMBA_FLASH_DESC_ADDS=1 NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on
knob walks_overlap walks NUMBA_FLASH_WGMMA_OVERLAP=1
[ $(( 480 - SECONDS )) -gt 60 ] && timeout $(( 480 - SECONDS )) python3 -m pytest -q -rf -n 8 -m gpu -p no:cacheprovider \
  tests/test_wgmma_forward.py -k "two_q_buffers or varlen_on or persistent_blocks" > "$out/c_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/c_pytest.txt"
tail -n 3 "$out/c_pytest.txt"
grep -h "^walks " "$out"/k_*.txt
exit 0

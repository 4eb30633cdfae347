#!/usr/bin/env bash
# Session 34, call 1 (ran at b1d9b95; NUMBA_FLASH_WGMMA_Q_BUFFERS was removed after it, so its rows
# now rerun the default): machines were scarce and failed starts took most of the device time, so
# this one call of 500 s holds two A/Bs drafted as separate scripts (removed unrun), one process a
# setting, in turn, on bench_knobs.py's walks group (window (1024, 0) against causal at
# (1, 16, 16384, 128); 16 varlen sequences against the padded batch; forward and backward):
# - two Q buffers in the persistent forward, alone and with the overlapped epilogue (twice);
# - the descriptor adds (NUMBA_FLASH_DESC_ADDS), and with them the persistent dK/dV kernel at d = 128
#   (session 33: 0.93x on the varlen backward; 797 -> 716 instructions a key step with the adds);
# then the GPU tests of the two Q buffers and the forward's varlen and persistent-block tests.
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

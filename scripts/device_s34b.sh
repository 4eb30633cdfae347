#!/usr/bin/env bash
# Session 34, call 2: two Q buffers in the persistent forward (NUMBA_FLASH_WGMMA_Q_BUFFERS=2: the
# producer loads a tile's Q when it reaches the tile, two key steps before the previous tile ends,
# instead of after that tile's last S), alone and with the overlapped epilogue (OVERLAP=1, now on the
# dynamic scheduler), on issue #11's short walks (bench_knobs.py walks: window (1024, 0) against
# causal, 16 varlen sequences against the padded batch), one process a setting, in turn; then the
# GPU tests of the two buffers and the Hopper forward's.
# Expected (written before the run): the Q buffers alone within noise (the consumers' epilogue
# already covered the Q's landing, session 19); with the overlap the window's forward ratio
# 0.68 -> 0.72-0.76 and varlen's 0.85 -> 0.88-0.93 (the tensor cores busy through a tile's last
# P·V and epilogue: ~1-1.5 of ~3-4.7 us a tile); backward unchanged (noise reference); no test fails.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
KNOB_UNTIL=360
knob walks_default walks
knob walks_q2 walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2
knob walks_q2_overlap walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2 NUMBA_FLASH_WGMMA_OVERLAP=1
knob walks_overlap walks NUMBA_FLASH_WGMMA_OVERLAP=1
knob walks_default2 walks
knob walks_q2_overlap2 walks NUMBA_FLASH_WGMMA_Q_BUFFERS=2 NUMBA_FLASH_WGMMA_OVERLAP=1
timeout $(( 590 - SECONDS )) python3 -m pytest -q -rf -n 8 -m gpu -p no:cacheprovider tests/test_wgmma_forward.py \
  -k "two_q_buffers or varlen or persistent or variants" > "$out/b_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/b_pytest.txt"
tail -n 3 "$out/b_pytest.txt"
grep -h "walks " "$out"/k_walks_*.txt
exit 0

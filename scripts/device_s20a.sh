#!/usr/bin/env bash
# Session 20, call 1: the wgmma forward past d = 128 (64-key tiles; at d = 256 O staged in
# Q's rows and Q loaded after the tile's first K and V): its GPU tests, racecheck of the
# forward past d = 128 (three persistent blocks), and the forward at d = 192 and 256
# against FlashAttention-2 and cuDNN for the session's start (tmp_old, 5c78a1b: the
# mma.sync forward there) and the new code; the new code with a block a tile too.
set -u
out=$1
. scripts/device_ab.sh
timeout 210 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  -k "past_d_128 or 256" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize racecheck "wgmma wide" 80
for run in old new; do side $run 100 h scripts/bench_head_dims.py --dims 192,256 --forward-only --cudnn; done
NUMBA_FLASH_WGMMA_PERSISTENT=0 side new 60 hb scripts/bench_head_dims.py --dims 256 --forward-only
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -4
for run in old new; do echo "== $run"; tail -6 "$out/h_$run.txt"; done
echo "== new, a block a tile"; tail -4 "$out/hb_new.txt"

#!/usr/bin/env bash
# Session 39: the Hopper backward's preprocess reading 16-byte chunks, several rows a warp at once
# (tc_backward._warp_deltas_fn), against session 38's (a row a warp, 16-bit loads), and the forwards' row
# max as four chains (softmax.row_max; one chain of 32 before); softcap's forward cost in three orders;
# then GPU tests and memcheck. As run: call 1 as below; row_max reverted after it; call 2's steps were run as
# single commands, the tests file by file (with test_ptx.py in the same pytest, the tests of the other files
# ran in the simulator: fixed in tests/test_ptx.py since), memcheck not reached (docs/benchmarks/2026-12-06-s39).
#   bash device_s39a.sh OUT SECONDS 1   bench_stats.py on tmp_old (session 38's tree) and tmp_new in turn,
#                                       twice, with a quick GPU check between (the preprocess against NumPy,
#                                       the new load and shuffle, the Hopper backward's variants)
#   bash device_s39a.sh OUT SECONDS 2   bench_order.py softcap (nvidia-smi's clock / power log beside it) and
#                                       gqa (MHA against GQA 32 / 8), three orders each; then pytest
#                                       tests/test_wgmma_backward.py, test_ptx.py, test_ptx_compile.py (every
#                                       case, GPU sizes too); NUMBA_FLASH_WGMMA=0 test_kernels.py -k
#                                       backward_half (the mma.sync backward's preprocess on aligned rows);
#                                       memcheck of the Hopper backward
# Expected (written before the run): the preprocess at (1, 16, 16384, 128) from ~67 us (H100 under ncu,
# session 35; 2.0 TB/s) to <= 40 us on the H200 (135 MB at >= 3.4 TB/s); the window (1024, 0) backward
# (~1.0 ms) 3-5% faster, the causal (4, 16, 4096, 128) backward (~2.0 ms) 1-2%; softcap / plain ~1.14 in
# "pairs" and ~1.23 in "with backwards" if the order of the cases explains session 38's two figures; GQA
# within 1.05 of MHA in every order. The forwards with row_max 0-3% faster (plain), up to 5% (softcap:
# the chain no longer follows the last tanh by 32 dependent maxima).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments
if [ "$call" = 1 ]; then
  side old 150 s1 scripts/bench_stats.py old  # (cold cache: compiles)
  side new 150 s1 scripts/bench_stats.py new
  timeout 110 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_ptx.py tests/test_wgmma_backward.py \
    -k "nc_load or shfl_idx or stats_rows or variants_on_the_gpu" > "$out/q_quick.txt" 2>&1
  echo "pytest quick rc=$? at ${SECONDS}s" >> "$out/q_quick.txt"
  side old 70 s2 scripts/bench_stats.py old
  side new 70 s2 scripts/bench_stats.py new
  tail -n 13 "$out"/s1_*.txt "$out"/s2_*.txt
  tail -n 2 "$out/q_quick.txt"; grep -hE "^FAILED|^ERROR" "$out/q_quick.txt" | head
else
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$out/smi.csv" 2>&1 &
  smi=$!
  side new 100 o scripts/bench_order.py softcap
  kill $smi
  side new 90 g scripts/bench_order.py gqa
  tail -n 5 "$out/o_new.txt" "$out/g_new.txt"
  timeout $(( total - SECONDS - 130 )) python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_wgmma_backward.py \
    tests/test_ptx.py tests/test_ptx_compile.py > "$out/q_hopper.txt" 2>&1
  echo "pytest hopper rc=$? at ${SECONDS}s" >> "$out/q_hopper.txt"
  NUMBA_FLASH_WGMMA=0 timeout 60 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_kernels.py \
    -k backward_half > "$out/q_mma.txt" 2>&1
  echo "pytest mma.sync rc=$? at ${SECONDS}s" >> "$out/q_mma.txt"
  sanitize memcheck wgmma_bwd $(( total - SECONDS - 10 ))
  tail -n 3 "$out/q_hopper.txt" "$out/q_mma.txt"; grep -hE "^FAILED|^ERROR" "$out"/q_*.txt | head
  tail -n 4 "$out/b_sanitize.txt"
fi
exit 0

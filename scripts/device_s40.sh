#!/usr/bin/env bash
# Session 40: what session 39 changed and ran only on an H100 without compute-sanitizer — the Hopper
# backward's preprocess reading 16-byte chunks (tc_backward._warp_deltas_fn) — under memcheck, and issue
# #11's rows on this GPU, each timed in three orders (bench_order.py: its median over orders is how the
# bars are read here; nvidia-smi's clock / power log beside it). As run: call 1 alone, on an H100 with 350
# seconds (13 refused starts took the rest): the memcheck runs of wgmma_bwd and wgmma_varlen stopped by their
# limits (compiling under the sanitizer), bench_order.py left 53 s (docs/benchmarks/2026-12-07-s40).
#   bash device_s40.sh OUT SECONDS 1   memcheck: the preprocess alone (test_stats_rows_match_numpy), the
#                                      Hopper backward (sanitize_small.py wgmma_bwd, wgmma_varlen), the
#                                      mma.sync backward's aligned preprocess (NUMBA_FLASH_WGMMA=0, small
#                                      test_backward_half cases); then bench_order.py window varlen softcap
#                                      dropout alibi gqa in one process (each mode's table printed as it ends)
#   bash device_s40.sh OUT SECONDS 2   bench_order.py on the modes call 1 did not reach (MODES=...)
#   bash device_s40.sh OUT SECONDS 3   bench_stats.py on tmp_old (aa20ba5, before the preprocess change) and
#                                      tmp_new in turn, twice (the H200's figure of session 39's change)
# Expected (written before the run): memcheck 0 errors; window 0.76-0.77 forward / 0.65-0.67 backward and
# varlen 0.75-0.77 / 0.79-0.82 (session 38's H200 figures; the preprocess's 17 us a backward may move the
# window backward by ~1-2%); GQA <= 1.05 in every order; softcap 1.14-1.25, ALiBi 1.10-1.14, dropout
# 1.21-1.26 forward; the preprocess at (1, 16, 16384, 128) from ~60 us to <= 45 us (135 MB; the H200's
# 4.8 TB/s DRAM).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments
if [ "$call" = 1 ]; then
  timeout 100 compute-sanitizer --tool memcheck --report-api-errors no python3 -m pytest -q -n 0 -p no:cacheprovider \
    tests/test_wgmma_backward.py -k stats_rows > "$out/b_stats.txt" 2>&1
  echo "memcheck stats_rows rc=$? at ${SECONDS}s" >> "$out/b_stats.txt"
  sanitize memcheck wgmma_bwd 120
  sanitize memcheck wgmma_varlen 80
  NUMBA_FLASH_WGMMA=0 timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python3 -m pytest -q \
    -n 0 -p no:cacheprovider tests/test_kernels.py -k "backward_half and (q17k40 or q40k17 or q127k127)" \
    > "$out/b_mma.txt" 2>&1
  echo "memcheck mma.sync backward_half rc=$? at ${SECONDS}s" >> "$out/b_mma.txt"
  smi 1
  side new $(( total - SECONDS - 5 )) o1 scripts/bench_order.py window varlen softcap dropout alibi gqa
  kill $smi_pid
  grep -hE "SUMMARY|rc=|passed|failed" "$out"/b_*.txt
  grep -hE "median|rc=" "$out/o1_new.txt"
elif [ "$call" = 2 ]; then
  smi 2
  side new $(( total - SECONDS - 5 )) o2 scripts/bench_order.py ${MODES:-gqa softcap alibi dropout}
  kill $smi_pid
  grep -hE "median|rc=" "$out/o2_new.txt"
else
  side old 150 s1 scripts/bench_stats.py old  # (cold cache: compiles)
  side new 150 s1 scripts/bench_stats.py new
  side old 90 s2 scripts/bench_stats.py old
  side new 90 s2 scripts/bench_stats.py new
  tail -n 13 "$out"/s1_*.txt "$out"/s2_*.txt
fi
exit 0

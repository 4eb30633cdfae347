#!/usr/bin/env bash
# Session 41: issue #11's rows, each timed in three orders (bench_order.py, never yet run on a GPU; its
# median over orders is how the bars are read here, nvidia-smi's clock / power log beside it), first — the
# step session 40's call never reached; then compute-sanitizer's memcheck of the Hopper backward and varlen
# kernels with the time a cold cache needs (session 40's 120 s / 80 s stopped them part way).
# As run: not in session 41 (fourteen refused starts, one machine taken back mid-call: docs/benchmarks/2026-12-07-s41);
# in session 42 on an H100, call 1 as `RESERVE=150 … 560 1` and call 2 as `… 400 2` without MODES, both whole
# (docs/benchmarks/2026-12-07-s42).
#   bash device_s41.sh OUT SECONDS 1   bench_order.py window varlen softcap dropout alibi gqa in one process
#                                      (each mode's table printed as it ends; at most SECONDS - RESERVE (150) s), then
#                                      memcheck sanitize_small.py wgmma_bwd, and wgmma_varlen, with what is left
#   bash device_s41.sh OUT SECONDS 2   bench_order.py on MODES (what call 1 did not reach), then bench_stats.py
#                                      on tmp_old (aa20ba5, before session 39's preprocess) and tmp_new in
#                                      turn, twice (the preprocess on this GPU)
# Expected (written before the run): window 0.76-0.77 forward / 0.65-0.67 backward, varlen 0.75-0.77 /
# 0.79-0.82 (session 38's H200 figures); GQA <= 1.05 in every order; softcap 1.14-1.25, ALiBi 1.10-1.14,
# dropout 1.21-1.26 forward; memcheck 0 errors; the preprocess at (1, 16, 16384, 128) ~60 us -> <= 45 us.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments
if [ "$call" = 1 ]; then
  smi 1
  side new $(( total - SECONDS - ${RESERVE:-150} )) o1 scripts/bench_order.py window varlen softcap dropout alibi gqa
  kill $smi_pid
  grep -hE "median|rc=" "$out/o1_new.txt"
  left=$(( total - SECONDS - 5 ))  # wgmma_bwd up to 220 s, wgmma_varlen the rest when 60 s or more
  [ "$left" -ge 60 ] && sanitize memcheck wgmma_bwd $(( left - 60 > 220 ? 220 : (left < 120 ? left : left - 60) ))
  [ $(( total - SECONDS - 5 )) -ge 60 ] && sanitize memcheck wgmma_varlen $(( total - SECONDS - 5 ))
  grep -hE "SUMMARY|rc=" "$out/b_sanitize.txt"
  grep -hE "median|rc=" "$out/o1_new.txt"
else
  if [ -n "${MODES:-}" ]; then  # the clock log only beside bench_order.py's timings
    smi 2
    side new 300 o2 scripts/bench_order.py $MODES
    kill $smi_pid
  fi
  side old 120 s1 scripts/bench_stats.py old  # (cold cache: compiles)
  side new 120 s1 scripts/bench_stats.py new
  side old 60 s2 scripts/bench_stats.py old
  side new 60 s2 scripts/bench_stats.py new
  tail -n 13 "$out"/s1_*.txt "$out"/s2_*.txt
  [ -n "${MODES:-}" ] && grep -hE "median|rc=" "$out/o2_new.txt"
fi
exit 0

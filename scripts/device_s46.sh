#!/usr/bin/env bash
# Session 47 (written in session 46): what session 46's four calls left after the whole GPU suite passed on
# the handover's tree (3046334; docs/benchmarks/2026-12-07-s46): issue #11's time rows (softcap, dropout,
# ALiBi, GQA) with a clock log, and memcheck / synccheck of the Hopper forward's persistent path and of
# varlen (session 44 ran racecheck only after the handover).
# As run: session 47, both calls on an H100 (docs/benchmarks/2026-12-07-s47, calls 1 and 2): every sanitizer run
# 0 errors; softcap 1.233, dropout 1.287, ALiBi 1.119, GQA 0.988 forward; window 0.688, varlen 0.697 (no H200 came).
#   bash device_s46.sh OUT SECONDS 1   bench_order.py softcap dropout alibi gqa (~150 s: session 46's two
#                                      rows took 70), then memcheck and synccheck of sanitize_small.py wgmma
#                                      to the call's end
#   bash device_s46.sh OUT SECONDS 2   memcheck and synccheck of sanitize_small.py wgmma_varlen, then
#                                      bench_order.py window varlen (on an H200: issue #11's acceptance
#                                      machine, last timed in session 38)
# Expected (written before the run): the rows as session 44's H100 medians (softcap ~1.22, dropout ~1.28,
# ALiBi ~1.12, GQA ~1.00 forward); every sanitizer run "0 errors"; on an H200 window ~0.76 and varlen ~0.76.
# Keep $OUT to 8 files or fewer (the reply's limit).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, sanitize
if [ "$call" = 1 ]; then
  smi 1
  side new 300 o1 scripts/bench_order.py softcap dropout alibi gqa
  kill $smi_pid
  sanitize memcheck wgmma $(( (total - SECONDS) / 2 ))
  sanitize synccheck wgmma $(( total - SECONDS - 5 ))
  grep -hE "median|host a call|rc=" "$out/o1_new.txt"
else
  sanitize memcheck wgmma_varlen 150
  sanitize synccheck wgmma_varlen 150
  smi 2
  side new $(( total - SECONDS - 10 )) o2 scripts/bench_order.py window varlen
  kill $smi_pid
  grep -hE "median|host a call|rc=" "$out/o2_new.txt"
fi
grep -hE "ERROR SUMMARY|rc=" "$out/b_sanitize.txt"
exit 0

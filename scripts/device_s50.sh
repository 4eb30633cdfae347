#!/usr/bin/env bash
# Session 50 (written in session 49): issue #11's six rows at the default, on an H200 if one comes (its acceptance
# machine, last timed in session 38), the hold switches' A/B on that card, and then the whole GPU suite on it.
#   bash device_s50.sh OUT SECONDS 1   bench_order.py's six rows at the default with a clock log (~170 s on an H100,
#                                      session 49); softcap and dropout rows with NUMBA_FLASH_WGMMA_HOLD=0 / 1 / 0 /
#                                      1 (BWD_HOLD alike), each in its own process (~10 s each); the GPU hold tests
#                                      (the forward's bf16 d = 64 case did not finish in session 49); then
#                                      test_variants.py to the call's end
#   bash device_s50.sh OUT SECONDS 2   test_kernels, test_wgmma_backward, test_tf32 and the fourteen small files
#   bash device_s50.sh OUT SECONDS 3   test_kvcache.py and test_flex_kernels.py (2 and 3: device_s47.sh's calls)
# Compare each hold pair with `python3 scripts/order_ms.py` (absolute times: a ratio to plain hides a switch that
# moves plain too). On an H100, calls 2 and 3 only repeat session 48's 630 / 630 (no kernel changed since: the
# default PTX is e3bf0f1's); run them on an H200.
# Written before the run: on an H100, the rows as session 49's (ALiBi ~1.07, softcap ~1.23, dropout ~1.25-1.29,
# GQA ~1.0, window ~0.67-0.72, varlen ~0.69-0.72) and plain's forward 2-4 % slower at hold 1. On an H200 (more
# memory bandwidth, the same 700 W) every figure is new; session 38's H200 rows: ALiBi 1.10-1.14, softcap 1.14-1.24,
# dropout 1.21-1.26 (docs/variants.md).
# As run: (filled in after the run)
# Keep $OUT to 8 files or fewer (the reply's limit): the A/B's lines go to the call's output and ab.txt.
set -u
# calls 2 and 3 are session 48's (device_s47.sh's calls 2 and 3: the same files)
[ "${3:-1}" != 1 ] && exec bash tmp_new/scripts/device_s47.sh "$@"
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, tests
if [ "$call" = 1 ]; then
  smi 1
  side new 300 rows scripts/bench_order.py alibi softcap dropout gqa window varlen
  kill $smi_pid
  grep -hE "median|host a call|rc=" "$out/rows_new.txt"
  for r in softcap dropout; do
    for h in 0 1 0 1; do
      NUMBA_FLASH_WGMMA_HOLD=$h NUMBA_FLASH_WGMMA_BWD_HOLD=$h side new 60 ab scripts/bench_order.py $r
      { echo "$r hold=$h"; python3 scripts/order_ms.py "$out/ab_new.jsonl" | tail -n +2; \
        grep -hE "median|rc=" "$out/ab_new.txt"; } | tee -a "$out/ab.txt"
      rm -f "$out/ab_new.jsonl" "$out/ab_new.txt"
    done
  done
  tests hold 150 -n 16 -k "hold" tests/test_wgmma_forward.py tests/test_wgmma_backward.py
  tests variants $(( total - SECONDS - 5 )) -n 16 tests/test_variants.py
fi
exit 0

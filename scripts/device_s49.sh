#!/usr/bin/env bash
# Session 49: session 48's two hold switches timed and tested, in two calls instead of device_s48.sh's three
# (this session began with a refused start: ~1 500 device seconds were left for a start and two calls).
#   bash device_s49.sh OUT SECONDS 1   issue #11's six rows (bench_order.py, one process) with the switches on
#                                      (NUMBA_FLASH_WGMMA_HOLD=3, NUMBA_FLASH_WGMMA_BWD_HOLD=1), then the same
#                                      with them off, a clock log beside both; issue #13's shapes off / on
#                                      (bench_knobs.py shapes) while the call has time
#   bash device_s49.sh OUT SECONDS 2   test_wgmma_forward, test_wgmma_backward and test_variants with both on,
#                                      then compute-sanitizer racecheck / memcheck on the Hopper kernels with them
# Written before the run (session 48's SASS counts, device_s48.sh's header): plain's forward a few % faster with
# the switches on; softcap and dropout more, their ratios toward ~1.15; the backward 1-3 % faster; ALiBi and GQA
# about where they were; window and varlen unchanged in ratio (both sides gain). Every test passes.
# As run (H100, one start after two refused requests): call 1 as written (405 s; the shapes A/B skipped for time).
# Call 2 was not run as written: after call 1 (setting 3 slower, setting 2's dropout 11 % slower) calls 2-4 were
# written on the command line: settings 1 and 2 (softcap, dropout), then 0 / 1 / 0 / 1 alternated in processes of
# their own, the Hopper and variant GPU tests at 1, racecheck at 1 (docs/benchmarks/2026-12-07-s49 has the
# commands). Found: at 1 plain's forward 2-4 % slower, softcap's and dropout's 0-3 % faster, the backward within
# the noise; tests and racecheck clean. Both switches stay off.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, tests, knob, sanitize
if [ "$call" = 1 ]; then
  smi 1
  NUMBA_FLASH_WGMMA_HOLD=3 NUMBA_FLASH_WGMMA_BWD_HOLD=1 \
    side new 240 h3 scripts/bench_order.py alibi softcap dropout gqa window varlen
  NUMBA_FLASH_WGMMA_HOLD=0 NUMBA_FLASH_WGMMA_BWD_HOLD=0 \
    side new 240 h0 scripts/bench_order.py alibi softcap dropout gqa window varlen
  kill $smi_pid
  KNOB_UNTIL=$(( total - 150 )) knob off shapes NUMBA_FLASH_WGMMA_HOLD=0 NUMBA_FLASH_WGMMA_BWD_HOLD=0
  KNOB_UNTIL=$(( total - 150 )) knob on shapes NUMBA_FLASH_WGMMA_HOLD=3 NUMBA_FLASH_WGMMA_BWD_HOLD=1
  cat "$out/gpu.txt" >> "$out/h3_new.txt" && rm -f "$out/gpu.txt"
  [ -f "$out/k_on.txt" ] && { cat "$out/k_on.txt" >> "$out/k_off.txt"; rm -f "$out/k_on.txt"; }
  for h in h3 h0; do grep -hE "median|host a call|rc=" "$out/${h}_new.txt" | sed "s/^/$h /"; done
else
  export NUMBA_FLASH_WGMMA_HOLD=3 NUMBA_FLASH_WGMMA_BWD_HOLD=1
  tests hold $(( total - SECONDS - 130 )) -n 16 tests/test_wgmma_forward.py tests/test_wgmma_backward.py \
    tests/test_variants.py
  left=$(( total - SECONDS - 5 ))
  [ "$left" -ge 60 ] && sanitize racecheck wgmma $(( left / 2 ))
  left=$(( total - SECONDS - 5 ))
  [ "$left" -ge 40 ] && sanitize memcheck wgmma_bwd "$left"
  tail -n 4 "$out/b_sanitize.txt" 2>/dev/null
  grep -E "FAILED|ERROR" "$out/t_hold.txt" | head -20
fi
exit 0

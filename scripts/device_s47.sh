#!/usr/bin/env bash
# Session 48 (written in session 47): issue #11's six rows with the primed timer beside the usual orders, and the
# whole GPU suite after session 47's ALiBi change (66443b4: (heads,) slopes read in place; docs/benchmarks/2026-12-07-s47).
# As run: session 48, calls 1–3 on one H100 (docs/benchmarks/2026-12-07-s48): 630 / 630 tests passed.
#   bash device_s47.sh OUT SECONDS 1   bench_order.py alibi softcap dropout gqa window varlen with a clock log
#                                      (~260 s: session 47 took 132 s for four rows and 65 s for two, without
#                                      the primed pairs), then test_variants.py to the call's end
#   bash device_s47.sh OUT SECONDS 2   test_kernels, test_wgmma_backward, test_tf32 and the fourteen small files
#                                      (session 46: ~300 s and ~190 s)
#   bash device_s47.sh OUT SECONDS 3   test_kvcache.py and test_flex_kernels.py (session 46: ~330 s together)
# Expected (written before the run): ALiBi 1.05–1.07 forward (session 47 after the change), softcap ~1.23,
# dropout ~1.29, GQA ~0.99, window ~0.69, varlen ~0.70 in the usual orders; the primed pairs lower each row's
# times by about a tenth of its host time a call (varlen ~14 µs of 0.27 ms: its ratio ~0.72); every test passes.
# On an H200 (issue #11's acceptance machine, last timed in session 38) every row is new.
# Keep $OUT to 8 files or fewer (the reply's limit).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, tests
if [ "$call" = 1 ]; then
  smi 1
  side new 330 o1 scripts/bench_order.py alibi softcap dropout gqa window varlen
  kill $smi_pid
  tests variants $(( total - SECONDS - 5 )) -n 16 tests/test_variants.py
  grep -hE "median|host a call|rc=" "$out/o1_new.txt"
elif [ "$call" = 2 ]; then
  tests kernels $(( total - SECONDS - 5 )) -n 16 tests/test_kernels.py tests/test_wgmma_backward.py tests/test_tf32.py \
    tests/test_wgmma_forward.py tests/test_numerics.py tests/test_ptx_hopper.py tests/test_determinism.py \
    tests/test_replay.py tests/test_ptx_cluster.py tests/test_ptx.py tests/test_cli.py tests/test_arrays.py \
    tests/test_l2_sections.py tests/test_traffic.py tests/test_merge.py tests/test_cache.py tests/test_bench_decode.py
else
  tests rest $(( total - SECONDS - 5 )) -n 16 tests/test_kvcache.py tests/test_flex_kernels.py
fi
exit 0

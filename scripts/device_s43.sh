#!/usr/bin/env bash
# Session 43: the GPU tests that session 42's `pytest -m gpu` (524 passed, 0 failed) did not reach before its
# time limit — the Hopper kernels' two files whole (not one of their tests had started: they are the default
# path on sm_90, and session 39 changed the backward's preprocess) and the flex, head-dim and varlen-offset tests
# that were running or waiting — then issue #11's window and varlen rows (bench_order.py) with what is left,
# so that an H200 gives them beside session 38's figures.
# As run (session 43, H100; docs/benchmarks/2026-12-07-s43): call 1 with RESERVE=150 560 — the Hopper files 70
# passed, 0 failed (208 s), the rest 89 passed, 0 failed before its limit, bench_order.py window only (0.659 / 0.670);
# call 2 with MODES="varlen softcap dropout alibi gqa" 550 (143 s): varlen 0.662 / 0.777, softcap 1.250, dropout
# 1.300, ALiBi 1.130, GQA 1.005.
#   bash device_s43.sh OUT SECONDS 1   pytest -m gpu -v on test_wgmma_forward.py and test_wgmma_backward.py (at
#                                      most SECONDS - RESERVE (150) s), then the rest (-k below) until 60 s
#                                      are left, then bench_order.py window varlen with those (if >= 45 s)
#   bash device_s43.sh OUT SECONDS 2   bench_order.py ${MODES:-window varlen softcap dropout alibi gqa}, clock log
# Expected (written before the run): every test passes (session 35 passed both Hopper files whole, 84 tests with
# test_arrays.py in 196 s, session 38 test_wgmma_backward.py, 33 in 125 s; since then only the backward's
# preprocess changed: 7 of its GPU tests passed in session 39, memcheck 6/6 + 6/6 in session 42); window
# ~0.76 / 0.66 and varlen ~0.76 / 0.80 on an H200 (session 38), ~0.67 / 0.65 and 0.69 / 0.78 on an H100 (session 42).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; tests, side, smi
if [ "$call" = 1 ]; then
  tests hopper $(( total - SECONDS - ${RESERVE:-150} )) tests/test_wgmma_forward.py tests/test_wgmma_backward.py
  left=$(( total - SECONDS - 60 ))
  [ "$left" -ge 30 ] && tests rest "$left" tests/test_flex_kernels.py tests/test_variants.py \
    -k "flex_16k or flex_gpu_matrix or flex_large or flex_varlen_gpu or tensor_core_head_dims or offsets"
  left=$(( total - SECONDS - 5 ))
  if [ "$left" -ge 45 ]; then
    smi 1
    side new "$left" o1 scripts/bench_order.py window varlen
    kill $smi_pid
    grep -hE "median|rc=" "$out/o1_new.txt"
  fi
  grep -hE " (FAILED|ERROR) " "$out"/t_*.txt | head -20
  grep -h "^tests " "$out"/t_*.txt
else
  smi 2
  side new $(( total - SECONDS - 5 )) o2 scripts/bench_order.py ${MODES:-window varlen softcap dropout alibi gqa}
  kill $smi_pid
  grep -hE "median|rc=" "$out/o2_new.txt"
fi
exit 0

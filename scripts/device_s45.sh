#!/usr/bin/env bash
# Session 45 (written in session 44): the whole GPU suite on the tree after session 44's handover of a tile's
# coordinates (3046334: only its forward's 58 tests ran on a GPU), in three calls, and issue #11's rows with
# each forward's host time a call (bench_order.py now prints it: were session 44's slow varlen processes
# host-bound?).
# As run: not run as written. Session 46 ran the same test files in calls 2-4 of its own (the commands in
# docs/benchmarks/2026-12-07-s46) after device_s45b.sh; its rows other than varlen and window did not run.
#   bash device_s45.sh OUT SECONDS 1   bench_order.py on every row (clock log), then test_kernels.py
#   bash device_s45.sh OUT SECONDS 2   test_variants.py, test_kvcache.py, test_flex_kernels.py
#   bash device_s45.sh OUT SECONDS 3   the other GPU test files
# Afterwards: compare the PASSED lines with `NUMBA_ENABLE_CUDASIM=0 pytest -m gpu --collect-only -q -n0 tests`
# (629 items in session 44) to list what a time limit cut. Keep $OUT to 8 files or fewer (the reply's limit).
# Expected (written before the run): every test passes; the rows as session 44's call 5 (window ~0.68,
# softcap ~1.22, dropout ~1.28, ALiBi ~1.12, GQA ~1.00); varlen's host time a call under its events' time in a
# process whose varlen is not slow, and near it in one that is.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, tests
case "$call" in
  1)
    smi 1
    side new $(( total / 2 )) o1 scripts/bench_order.py window varlen softcap dropout alibi gqa
    kill $smi_pid
    tests kernels $(( total - SECONDS - 10 )) -n 16 tests/test_kernels.py
    grep -hE "median|host a call|rc=" "$out/o1_new.txt" ;;
  2)
    tests variants $(( total - SECONDS - 10 )) -n 16 tests/test_variants.py tests/test_kvcache.py tests/test_flex_kernels.py ;;
  3)
    tests rest $(( total - SECONDS - 10 )) -n 16 tests/test_wgmma_forward.py tests/test_tf32.py tests/test_wgmma_backward.py \
      tests/test_numerics.py tests/test_ptx_hopper.py tests/test_determinism.py tests/test_replay.py \
      tests/test_ptx_cluster.py tests/test_ptx.py tests/test_cli.py tests/test_arrays.py tests/test_l2_sections.py \
      tests/test_traffic.py tests/test_merge.py tests/test_cache.py tests/test_bench_decode.py ;;
esac
grep -hE " (FAILED|ERROR) " "$out"/t_*.txt | head -20
grep -h "^tests " "$out"/t_*.txt
exit 0

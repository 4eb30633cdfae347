#!/usr/bin/env bash
# Session 44: the two GPU tests that sessions 42–43 did not reach (test_tensor_core_unaligned_rows[float16-64]
# and [bfloat16-96]: running when session 42's run was cut, outside session 43's selection), then issue #11's
# rows in three orders (bench_order.py) with nvidia-smi's clock log — on an H200 if one comes, beside session
# 38's H200 figures (the issue's bars are stated for an H200; sessions 42–43 ran on H100s at their power cap).
# As run (session 44, call 1, an H100, at 34e091b): both tests passed (35 s); the rows' medians window 0.652 / 0.658,
# varlen 0.689 / 0.794, softcap 1.244 / 1.064, dropout 1.277 / 1.172, ALiBi 1.122 / 1.013, GQA 0.998 / 0.996
# (docs/benchmarks/2026-12-07-s44).
#   bash device_s44.sh OUT SECONDS      the two tests (at most 200 s), then bench_order.py ${MODES:-every row}
# Expected (written before the run): both tests pass (their head dims pass in test_tensor_core_head_dims, and the
# mma.sync paths they take have not changed since session 38); on an H200 the rows near session 38's (window
# ~0.76 / 0.66, varlen ~0.76 / 0.80, softcap 1.14–1.24, dropout 1.21–1.26, ALiBi 1.10–1.14, GQA 0.99–1.08), on an
# H100 near sessions 42–43's (0.66 / 0.67, 0.66–0.69 / 0.78, 1.24–1.25, 1.29–1.30, 1.13–1.15, 1.005–1.027).
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; tests, side, smi
tests unaligned 200 tests/test_variants.py -k tensor_core_unaligned_rows
smi 1
side new $(( total - SECONDS - 5 )) o1 scripts/bench_order.py ${MODES:-window varlen softcap dropout alibi gqa}
kill $smi_pid
grep -hE "median|rc=" "$out/o1_new.txt"
grep -hE " (FAILED|ERROR) " "$out"/t_*.txt | head -20
grep -h "^tests " "$out"/t_*.txt
exit 0

#!/usr/bin/env bash
# Session 38: issue #11's rows through bench_fa2.py (--queued: FlashAttention-2's kernels between ours;
# ALiBi 1.17-1.18x in session 37) and bench_variants.py (--queued --dropout-only: plain, softcap, ALiBi,
# dropout in turn; ALiBi 1.05-1.11x in sessions 33-35) in one call, to reconcile the ALiBi row; then GPU
# tests in what is left of the call.
#   bash device_s38a.sh OUT SECONDS 1   call 1: then tests/test_wgmma_backward.py, on the tree without the
#                                       ordered dQ (session 38's removal; its PTX the same up to a dead
#                                       %dynamic_smem_size read, the order of special-register reads and
#                                       two never-read parameters: scripts/ptx_diff.py --anonymous)
#   bash device_s38a.sh OUT SECONDS 2   call 2 (warm machine): a second sample, then tests/test_variants.py
#                                       (session 37 cut it at 115 s, 47 passed)
# Expected (written before the run): bench_variants ~1.1x, bench_fa2 ~1.17x for ALiBi (the context, not
# the kernel: the same PTX); the tests pass.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments
tests=tests/test_wgmma_backward.py
[ "$call" = 2 ] && tests=tests/test_variants.py
side "new$call" $(( call == 1 ? 240 : 150 )) f scripts/bench_fa2.py --queued  # (call 1: cold cache, compiles)
variants "new$call"
timeout $(( total - SECONDS - 10 )) python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider "$tests" \
  > "$out/q_$call.txt" 2>&1
echo "pytest $tests rc=$? at ${SECONDS}s" >> "$out/q_$call.txt"
tail -n 8 "$out"/c_new*.txt
tail -n 14 "$out"/f_new*.txt
tail -n 3 "$out/q_$call.txt"; grep -E "^FAILED|^ERROR" "$out/q_$call.txt" | head
exit 0

#!/usr/bin/env bash
# Session 38, call 1: issue #11's rows through bench_variants.py (--queued --dropout-only: plain, softcap,
# ALiBi, dropout in turn; ALiBi 1.05-1.11x in sessions 33-35) and bench_fa2.py (--queued: FlashAttention-2's
# kernels between ours; ALiBi 1.17-1.18x in session 37) in one call, to reconcile the ALiBi row; then the
# Hopper backward's GPU tests on the tree without the ordered dQ (session 38's removal; its PTX the same up
# to a dead %dynamic_smem_size read and the order of special-register reads: scripts/ptx_diff.py --anonymous).
# Expected (written before the run): bench_variants ~1.1x, bench_fa2 ~1.17x for ALiBi (the context, not
# the kernel: the same PTX); test_wgmma_backward.py passes on the GPU.
set -u
out=$1  # $2: the seconds this call may run (default 580)
total=${2:-580}
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
variants new1
side new1 240 f scripts/bench_fa2.py --queued  # (cold cache: compiles; since s37 with the GQA row)
timeout $(( total - SECONDS - 10 )) python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider tests/test_wgmma_backward.py \
  > "$out/q_wgmma_backward.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/q_wgmma_backward.txt"
tail -n 8 "$out"/c_new*.txt
tail -n 14 "$out"/f_new*.txt
tail -n 3 "$out/q_wgmma_backward.txt"; grep -E "^FAILED|^ERROR" "$out/q_wgmma_backward.txt" | head
exit 0

#!/usr/bin/env bash
# Session 44, call 2: where a persistent Hopper forward's tile spends its time, from the kernel's own
# timestamps (scripts/trace_forward.py, NUMBA_FLASH_WGMMA_TRACE=32): causal and window (1024, 0) at
# (1, 16, 16384, 128), the varlen draw and its padded batch, with nvidia-smi's clock log.
# As run (session 44, call 2, an H100, at e12ec18, 36 s): the step 1.72-1.81 µs in every case, as expected; the fixed
# part 4.9-6.1 µs a tile (2.8-3.6 steps), of which the consumers' set-up 1.06-1.58 µs (not expected: ten integer
# divisions), the first S + softmax 1.4-2.0 and the last P·V + epilogue 1.8-2.0 µs; the wait for Q 0.2-0.9 µs
# (docs/benchmarks/2026-12-07-s44 §2).
#   bash device_s44b.sh OUT SECONDS
# Expected (written before the run): the walk's step the same in window and causal (~1.9 µs at the capped
# clock); a tile's fixed part (all but the walk) 2–4 steps, so that the window's 9-tile walks spend a
# quarter or more of their time outside the walk and causal's ~65-tile walks under 5%; of the fixed part,
# the first S + softmax and the last P·V + epilogue about a step each, the wait for Q under a step.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi
smi 1
side new $(( total - SECONDS - 5 )) tr scripts/trace_forward.py 32
kill $smi_pid
tail -n 25 "$out/tr_new.txt"
exit 0

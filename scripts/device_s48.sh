#!/usr/bin/env bash
# Session 49 (written in session 48): the key loop's softmax ahead of the wait for P·V
# (NUMBA_FLASH_WGMMA_HOLD, cumulative: 1 hopper.hold_before_wait; 2 dropout's keep words too; 3 acc rescaled
# before the P·V's issue) and the backward's pipelined P and dS ahead of their waits (NUMBA_FLASH_WGMMA_BWD_HOLD=1),
# off by default until this is timed, on one tree, each setting in its own process (the plan reads them once),
# and the changes' tests.
# As run: not yet run (session 48's device time ran out before a machine came).
#   bash device_s48.sh OUT SECONDS 1   softcap (hold 3, 0, 1) and dropout (3, 0, 2) rows (bench_order.py),
#                                      then test_wgmma_forward.py with hold 3, then softcap (0, 3) again
#   bash device_s48.sh OUT SECONDS 2   issue #13's shapes (bench_knobs.py shapes: forward and backward TF/s)
#                                      off, on (HOLD=3, BWD_HOLD=1), off, on; then test_wgmma_backward.py with
#                                      BWD_HOLD=1 to the call's end
#   bash device_s48.sh OUT SECONDS 3   ALiBi, window, GQA and varlen rows (hold 3, 0), then
#                                      test_variants.py with both on to the call's end
# Written before the run: ptxas puts all 66 MUFU.EX2 of a d = 128 step under its P·V from hold 1 on (none
# without), and a step's instructions with none of its wgmma in flight go, 0 -> 1 -> 2 -> 3, plain 441 -> 161
# -> 161 -> 96, softcap 439 -> 161 -> 161 -> 96, dropout 689 -> 411 -> 223 -> 159 (NUMBA_FLASH_WGMMA_HOLD=n
# sass_mix.py assemble_variants DIR, then waits DIR). Expected: plain's forward a few % faster; softcap and
# dropout more (their softmax is longer), so their ratios fall toward ~1.15; the backward unchanged (not
# touched); every test passes, outputs at 1 and 2 bitwise those without (test_wgmma_forward_hold_settings*).
# The backward's dQ kernel (d = 128): its pipelined step's MUFU.EX2 after the wait for the previous products go
# from 26 of 32 to 0 (24 under dP, 8 under the products); expected: the dQ kernel a few % faster, the whole
# backward ~1-3 % (dK/dV, not pipelined, is most of its time); gradients bit for bit.
# If it holds, turn it on by default (wgmma_forward.hold_exponentials) and run the whole GPU suite.
# Keep $OUT to 8 files or fewer (the reply's limit): the rows' lines go to the call's output and rows.txt.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, tests
row() {  # row NAME HOLD...: the bench_order row with each hold setting in turn, its lines printed and kept
  local name=$1 h
  shift
  for h in "$@"; do
    NUMBA_FLASH_WGMMA_HOLD=$h side new 75 "r" scripts/bench_order.py "$name"
    grep -hE "^pairs |^with backwards|median|rc=" "$out/r_new.txt" | sed "s/^/$name hold=$h /" | tee -a "$out/rows.txt"
    rm -f "$out/r_new.txt" "$out/r_new.jsonl"
  done
}
if [ "$call" = 1 ]; then
  row softcap 3 0 1
  row dropout 3 0 2
  NUMBA_FLASH_WGMMA_HOLD=3 tests wf 200 -n 16 tests/test_wgmma_forward.py
  [ $(( total - SECONDS )) -gt 90 ] && row softcap 0 3
elif [ "$call" = 2 ]; then
  for k in 0 1 0 1; do
    if [ $k = 1 ]; then knob on shapes NUMBA_FLASH_WGMMA_HOLD=3 NUMBA_FLASH_WGMMA_BWD_HOLD=1
    else knob off shapes NUMBA_FLASH_WGMMA_HOLD=0; fi
  done
  NUMBA_FLASH_WGMMA_BWD_HOLD=1 tests wb $(( total - SECONDS - 5 )) -n 16 tests/test_wgmma_backward.py
else
  for r in alibi window gqa varlen; do row $r 3 0; done
  NUMBA_FLASH_WGMMA_HOLD=3 NUMBA_FLASH_WGMMA_BWD_HOLD=1 \
    tests variants $(( total - SECONDS - 5 )) -n 16 tests/test_variants.py
fi
exit 0

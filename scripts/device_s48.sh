#!/usr/bin/env bash
# Session 49 (written in session 48): the key loop's softmax ahead of the wait for P·V
# (NUMBA_FLASH_WGMMA_HOLD=1: hopper.hold_before_wait, off by default until this is timed), on one tree,
# each setting in its own process (the plan reads it once), and the GPU tests of the change.
# As run: not yet run (session 48's device time ran out before a machine came).
#   bash device_s48.sh OUT SECONDS 1   softcap, dropout, ALiBi and window rows (bench_order.py): the hold on,
#                                      then off, then on again; then the wgmma forward's GPU tests with it on
#   bash device_s48.sh OUT SECONDS 2   test_variants.py with it on (the family × variant matrix)
# Written before the run: ptxas puts all 66 MUFU.EX2 of a d = 128 step before WARPGROUP.DEPBAR 0 with it
# (none without), and the code between that wait and the next wgmma issue shrinks from ~530 to ~250
# instructions (NUMBA_FLASH_WGMMA_HOLD=1 sass_mix.py assemble_variants DIR, then waits DIR). Expected: plain's
# forward a few % faster; softcap and dropout more (their softmax is longer), so their ratios fall toward
# ~1.15; the backward unchanged (not touched); every test passes, the hold's outputs bitwise the same.
# If it holds, turn it on by default (wgmma_forward.hold_exponentials) and run the whole GPU suite.
# Keep $OUT to 8 files or fewer (the reply's limit): each row's lines go to the call's output, its files to
# one log.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, tests
row() {  # row NAME: the bench_order row with the hold on, off, on; its lines printed and kept in rows.txt
  local h
  for h in 1 0 1; do
    NUMBA_FLASH_WGMMA_HOLD=$h side new 75 "r" scripts/bench_order.py "$1"
    grep -hE "^pairs |^with backwards|median|rc=" "$out/r_new.txt" | sed "s/^/$1 hold=$h /" | tee -a "$out/rows.txt"
    rm -f "$out/r_new.txt" "$out/r_new.jsonl"
  done
}
if [ "$call" = 1 ]; then
  row softcap
  row dropout
  NUMBA_FLASH_WGMMA_HOLD=1 tests wf 150 -n 16 tests/test_wgmma_forward.py
  for r in alibi window; do [ $(( total - SECONDS )) -gt 120 ] && row $r; done
else
  NUMBA_FLASH_WGMMA_HOLD=1 tests variants $(( total - SECONDS - 5 )) -n 16 tests/test_variants.py
fi
exit 0

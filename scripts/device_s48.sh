#!/usr/bin/env bash
# Session 48: the key loop's exponentials ahead of the wait for P·V (hopper.hold_before_wait), timed against
# the tree before it (tmp_old = e3bf0f1) in one call, and the wgmma forward's GPU tests.
# As run: not yet run.
#   bash device_s48.sh OUT SECONDS   softcap and dropout rows (bench_order.py) new then old, the wgmma forward's
#                                    GPU tests, then the window row on both trees while time is left
# Written before the run: ptxas now puts all 66 MUFU.EX2 of a d = 128 step before WARPGROUP.DEPBAR 0 (none
# before), and the code between the wait and the next wgmma issue shrinks from ~530 to ~250 instructions
# (sass_mix.py assemble_variants, then loops). Expected: plain's forward a few % faster; softcap and dropout
# more (their softmax is longer), their ratios toward ~1.15; backwards unchanged (not touched).
# Keep $OUT to 8 files or fewer (the reply's limit): the .jsonl files are removed at the end.
set -u
. scripts/device_ab.sh  # out, total from the arguments; side, tests
row() {  # row NAME: the bench_order row on the new tree then the old, its lines printed
  for t in new old; do
    side $t 75 "$1" scripts/bench_order.py "$1"
    grep -hE "^pairs |median|rc=" "$out/$1_$t.txt" | sed "s/^/$t /"
  done
}
row softcap
row dropout
tests wf $(( total - SECONDS - 80 > 60 ? total - SECONDS - 80 : 60 )) -n 16 tests/test_wgmma_forward.py
[ $(( total - SECONDS )) -gt 75 ] && row window
rm -f "$out"/*.jsonl
exit 0

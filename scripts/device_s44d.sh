#!/usr/bin/env bash
# Session 44, call 5: the varlen forward after the coordinates' handover (3046334) ran 0.28-0.42 ms in
# calls 3-4 against 0.285 before, while its tiles got shorter (the trace): the trace of the varlen and
# padded cases with each block's span on the global timer, on e12ec18 (the trace, no handover: tmp_old)
# and this tree, then bench_order.py varlen on each, in turn (old, new, old, new).
# As run (session 44, call 6, an H100, tmp_new c1eba6b / tmp_old e12ec18, 190 s): the kernel spans 486.0 -> 430.7 µs
# (padded) and 240.4 -> 219.0 µs (varlen), each block's span within 1-5 µs of its tiles' sum on both trees;
# bench_order varlen 0.687 / 0.673 (old), 0.698 / 0.640 (new), its varlen 0.262-0.297 ms on both: this call's
# processes were not slow (docs/benchmarks/2026-12-07-s44 §2).
#   bash device_s44d.sh OUT SECONDS
# Expected (written before the run): if the handover is not the cause, old and new alike in bench_order
# (the spread a process each) and the blocks' spans near their tiles' sums on both.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi
smi 1
side old 80 tr scripts/trace_forward.py 32 varlen padded
side new 80 tr scripts/trace_forward.py 32 varlen padded
side old 60 o1 scripts/bench_order.py varlen
side new 60 o1 scripts/bench_order.py varlen
side old 60 o2 scripts/bench_order.py varlen
side new 60 o2 scripts/bench_order.py varlen
kill $smi_pid
for f in tr_old tr_new; do echo "== $f"; tail -n 26 "$out/$f.txt"; done
grep -H "median" "$out"/o?_*.txt
exit 0

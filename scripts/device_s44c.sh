#!/usr/bin/env bash
# Session 44, call 3: the consumers read a tile's coordinates from the producer's slot instead of
# computing them (wgmma_forward.hand_over: the trace of call 2 put ~1.1-1.6 µs of set-up between a tile's
# Q and its first S, ten integer divisions): the trace again, then bench_knobs.py `walks` (window /
# causal, varlen / padded, forward and backward) and `shapes` on the session's start (tmp_old, 34e091b)
# and this tree (tmp_new), a process each, in turn; then the forward's GPU tests.
# As run (session 44, call 3, an H100, tmp_new 3046334 / tmp_old 34e091b, 483 s): set-up 0.25-0.30 µs, as expected;
# the window 3-4% and the padded batch 2-3% faster a pair, causal unchanged; varlen 0.280 / 0.349 (new) against
# 0.294 / 0.292 (old); the GPU tests did not fit (call 4 ran them: 58 passed); the trace's files did not come back
# (docs/benchmarks/2026-12-07-s44, call3/output_tail.txt).
#   bash device_s44c.sh OUT SECONDS
# Expected (written before the run): set-up 1.06-1.58 -> ~0.3 µs a tile; forwards of short walks faster by
# about that a tile (window ~4%, varlen ~5%, padded ~4%, causal 16384 under 1%); window / causal up ~3%,
# varlen / padded ~1%; backwards unchanged; the GPU tests pass.
set -u
. scripts/device_ab.sh  # out, total, call from the arguments; side, smi, tests
# `ab LABEL RUN GROUP`: bench_knobs.py GROUP LABEL on tmp_old (RUN=old) or tmp_new, a process of its own
ab() {
  local label=$1 run=$2 group=$3 pp=$PWD:$base
  [ "$run" = old ] && pp=$root/tmp_old:$base
  [ "$SECONDS" -gt "${KNOB_UNTIL:-420}" ] && { echo "$label skipped at ${SECONDS}s"; return; }
  env PYTHONPATH="$pp" timeout 150 python3 scripts/bench_knobs.py "$out/knobs.jsonl" "$group" "$label" \
    > "$out/k_$label.txt" 2>&1
  echo "$label rc=$? at ${SECONDS}s" >> "$out/k_$label.txt"
  tail -n 1 "$out/k_$label.txt"
}
smi 1
side new 100 tr scripts/trace_forward.py 32
ab walks_old old walks
ab walks_new new walks
ab walks_new2 new walks
ab walks_old2 old walks
ab shapes_old old shapes
ab shapes_new new shapes
kill $smi_pid
[ "$SECONDS" -lt $(( total - 120 )) ] && tests fwd $(( total - SECONDS - 10 )) -n 16 tests/test_wgmma_forward.py
tail -n 22 "$out/tr_new.txt"
python3 - "$out/knobs.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['group']:7s} {r['label']:12s} ratio {' / '.join(f'{x:.3f}' for x in r['ratio'])}  "
          + "  ".join(f"{n} {f:.3f}/{b:.3f}" for n, (f, b) in r["ms"].items()))
PY
grep -hE " (FAILED|ERROR) " "$out"/t_*.txt | head -20
grep -h "^tests " "$out"/t_*.txt
exit 0

#!/usr/bin/env bash
# Session 36, call 2: the varlen backward's gap (issue #11: 0.75-0.78x the padded batch's TF/s
# against a bar of 0.9) taken apart: bench_knobs.py `varlen` times the ragged batch against its
# padded one and 16 x 1024 rows as varlen against the (16, 16, 1024, 128) batch, in turn, with
# and without the producer's zeroing of rows past a sequence (KNOBS_NO_ZEROS=1, a diagnostic:
# exact only on finite rows; the digests of out and dq must match the default's).
# Expected (written before the run): uniform varlen/padded >= 0.95 both passes (the same tiles,
# varlen's costs only: cu_seqlens loads, boundary zeroing); ragged ~0.85 / ~0.77 as before; the
# zeroing, if it sits on the producer's path, worth up to ~10% of the ragged backward.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
export KNOB_UNTIL=${KNOB_UNTIL:-420} KNOB_TIMEOUT=180
knob varlen_on varlen
knob varlen_nozero varlen KNOBS_NO_ZEROS=1
knob varlen_nozero2 varlen KNOBS_NO_ZEROS=1
knob varlen_on2 varlen
grep -h "^varlen " "$out"/k_varlen_*.txt
exit 0

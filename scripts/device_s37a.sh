#!/usr/bin/env bash
# Session 37, call 1 (prepared by session 36, whose device time ran out): what session 36 changed
# and did not run on a GPU — memcheck and racecheck of the Hopper varlen passes with the 16-byte
# zeroing (`hopper.zero_rows`, cd6ede6); bench_knobs.py `varlen` under the new default L2 rule
# (9ce07f8: do equal-length varlen batches keep 0.97x their padded batch's forward now that the
# padded forward takes sections?); then issue #11's rows (bench_variants.py --queued).
# Expected (written before the run): sanitizers clean; uniform varlen/padded ~0.97 forward if the
# varlen grid takes the sections as the padded one does (call 1 of session 36 saw the ragged varlen
# forward gain 1.11x against the padded 1.38x), ragged backward ~0.77; the other rows as session 35's.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
sanitize memcheck wgmma_varlen 120
sanitize racecheck wgmma_varlen 120
export KNOB_UNTIL=300 KNOB_TIMEOUT=100
knob varlen_default varlen
knob varlen_shared varlen NUMBA_FLASH_L2_SECTIONS=shared
side new $(( 570 - SECONDS )) v scripts/bench_variants.py --queued
grep -hE "SUMMARY|rc=" "$out/b_sanitize.txt" 2>/dev/null
grep -h "^varlen " "$out"/k_varlen_*.txt
tail -n 16 "$out/v_new.txt"
exit 0

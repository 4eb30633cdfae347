#!/usr/bin/env bash
# Session 22, call 4 (the committed code: two-pass in-kernel merge): memcheck and racecheck of
# the fp16 KV-cache calls (sanitize_small.py kvcache16: the decode tiles' split-KV merged by the
# last split, the GQA swap's q read in place), and the decode table at 4096 and 32768 keys with
# the split sweep at 32768.
set -u
out=$1
. scripts/device_ab.sh
sanitize memcheck kvcache16 170
sanitize racecheck kvcache16 150
side new 90 c scripts/bench_decode.py --decode-only --lengths 4096,32768 --sweep-at 32768
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|finite|rc=|rror" "$out/b_sanitize.txt" | tail -16
grep -v -i warn "$out/c_new.txt" | grep -E "decode|rc=" | tail -12

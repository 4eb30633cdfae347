#!/usr/bin/env bash
# Session 23, call 3: the split count of a paged cache with the cluster merge: the decode
# table at 4096 / 32768 / 131072 keys with num_splits 0 / 3 / 4 / 8 on pages of 256 (4 and
# fewer: the cluster merge; 8: the last split's global merge) and the contiguous sweep.
set -u
out=$1
. scripts/device_ab.sh
side new 200 c scripts/bench_decode.py --decode-only --lengths 4096,32768,131072 --sweep-at 4096,32768,131072 \
  --sweep-paged
grep -v -i warn "$out/c_new.txt" | grep -E "decode|rc=" | tail -34

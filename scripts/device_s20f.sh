#!/usr/bin/env bash
# Session 20, call 6: with the dynamic scheduler, do two persistent consumers beat three
# (a block a tile) at d = 64?  The forward table (bench_table.py --forward-only
# --queued --tc-only --no-peer) with the default consumers and with
# NUMBA_FLASH_WGMMA_CONSUMERS=2, each in its own process.
set -u
out=$1
. scripts/device_ab.sh
side c3 70 t scripts/bench_table.py --forward-only --queued --tc-only --no-peer
NUMBA_FLASH_WGMMA_CONSUMERS=2 side c2 70 t scripts/bench_table.py --forward-only --queued --tc-only --no-peer
python3 scripts/bench_table.py --compare "$out/t_c3.jsonl" "$out/t_c2.jsonl" > "$out/t_compare.txt" 2>&1
cat "$out/t_compare.txt"; grep "rc=" "$out"/t_c*.txt

#!/usr/bin/env bash
# Session 24, call 3: two dQ writers (one a dQ tile); the ordered dQ's two orders under a
# right bound (the walk from the last query tile, or the key tiles lightest first:
# NUMBA_FLASH_WGMMA_DQ=light) against the dQ kernel (=pass), in turn, the shapes;
# the writers' watchdog on (a stuck writer prints).
set -u
out=$1
. scripts/device_ab.sh
NUMBA_FLASH_DQ_WATCHDOG=4000000 timeout 240 python3 scripts/probe_dq_order.py "$out/p.jsonl" > "$out/p.txt" 2>&1
echo "probe rc=$? at ${SECONDS}s" >> "$out/p.txt"
grep -c stuck "$out/p.txt"
grep stuck "$out/p.txt" | head -10
grep -v "^{" "$out/p.txt" | tail -14

#!/usr/bin/env bash
# Session 33, call 4: the Hopper forward's switches on issue #11's window and ALiBi rows
# (bench_knobs.py, one process a setting). Window (1024, 0) at (1, 16, 16384, 128): the default
# (persistent, dynamic scheduler), the static order, the static order with the epilogue under the
# next tile's first S (overlap; H200 session 19: 5% slower on this window), a block a tile.
# ALiBi: on the tensor cores (default) against the column frame's FFMA an element
# (NUMBA_FLASH_ALIBI_PRODUCTS=0).
# Expected (written before the run): window default ~0.68; static within 3%; overlap -5..+5%;
# a block a tile slower (~0.6). ALiBi products ~1.07-1.10, column frame ~1.08-1.12.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
run() {  # run LABEL GROUP [ENV=VALUE ...]
  local label=$1 group=$2
  shift 2
  [ "$SECONDS" -gt 450 ] && { echo "$label skipped at ${SECONDS}s"; return; }
  env "$@" timeout 150 python3 scripts/bench_knobs.py "$out/knobs.jsonl" "$group" "$label" > "$out/k_$label.txt" 2>&1
  echo "$label rc=$? at ${SECONDS}s" >> "$out/k_$label.txt"
  tail -n 2 "$out/k_$label.txt"
}
run alibi_products alibi
run alibi_column alibi NUMBA_FLASH_ALIBI_PRODUCTS=0
run window_default window
run window_static window NUMBA_FLASH_WGMMA_SCHEDULER=static
run window_overlap window NUMBA_FLASH_WGMMA_SCHEDULER=static NUMBA_FLASH_WGMMA_OVERLAP=1
run window_blocks window NUMBA_FLASH_WGMMA_PERSISTENT=0
run alibi_products2 alibi
run alibi_column2 alibi NUMBA_FLASH_ALIBI_PRODUCTS=0
exit 0

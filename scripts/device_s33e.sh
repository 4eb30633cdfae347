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
KNOB_UNTIL=450  # (`knob`: scripts/device_ab.sh; until session 33's end each script held its own copy)
knob alibi_products alibi
knob alibi_column alibi NUMBA_FLASH_ALIBI_PRODUCTS=0
knob window_default window
knob window_static window NUMBA_FLASH_WGMMA_SCHEDULER=static
knob window_overlap window NUMBA_FLASH_WGMMA_SCHEDULER=static NUMBA_FLASH_WGMMA_OVERLAP=1
knob window_blocks window NUMBA_FLASH_WGMMA_PERSISTENT=0
knob alibi_products2 alibi
knob alibi_column2 alibi NUMBA_FLASH_ALIBI_PRODUCTS=0
exit 0

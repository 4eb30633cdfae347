#!/usr/bin/env bash
# Session 33, call 5: the persistent dK/dV kernel (NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on, opt-in) on
# the short walks it might suit: the window (1024, 0) backward at (1, 16, 16384, 128) (each key
# tile sees ~1152 query rows) and four short shapes (512 / 1024 rows), one process a setting.
# Expected (written before the run): session 32 measured 1.05-1.07x at (16, 32, 1024, 64); the
# window's backward (0.655-0.662 of causal's TF/s) +3-7%; the 512-row shapes +5-10%.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
KNOB_UNTIL=420  # (`knob`: scripts/device_ab.sh; until session 33's end each script held its own copy)
knob window_off window
knob window_persistent window NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on
knob short_off short
knob short_persistent short NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on
knob window_off2 window
knob window_persistent2 window NUMBA_FLASH_WGMMA_BWD_PERSISTENT=on
exit 0

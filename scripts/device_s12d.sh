#!/usr/bin/env bash
# Session 12, call 4: (a) the Hopper files' GPU tests with consumers()/blocks() choosing
# by the call-3 measurements; (b) DRAM bytes (ncu) of the wgmma forward at (1, 16,
# 32768, 128) fp16, persistent (as planned) and a block a tile, against traffic.dram.
set -u
out=$1
. scripts/device_cli.sh
. scripts/device_hopper.sh
unset NUMBA_FLASH_WGMMA
hopper_pytest "$out" 100 -rf
for p in "" 0; do
  NUMBA_FLASH_WGMMA_PERSISTENT=$p timeout 110 python3 -c "
import os
from numba_flash import traffic as T
got = T.measure('forward', 'float16', 1, 16, 32768, 128)
want = T.dram('forward', 'float16', 1, 16, 32768, 32768, 128, arch=T.device_arch())
print('persistent=' + repr(os.environ.get('NUMBA_FLASH_WGMMA_PERSISTENT')), 'measured', got['flash'], 'model', [(b.name, b.read, b.write) for b in want], 'l2', got.get('flash_l2'))
" 2>&1 | tail -2 | tee -a "$out/b_traffic.txt"
done

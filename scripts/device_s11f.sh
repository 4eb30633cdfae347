#!/usr/bin/env bash
# Session 11, call 6: the GPU tests added after call 5 (the wgmma forward's variants,
# checked to run on it; the swizzled-layout test under -m gpu), with the rest of both files.
set -u
out=$1
export NUMBA_FLASH_WGMMA=0
. scripts/device_hopper.sh
hopper_pytest "$out" 300 -rA

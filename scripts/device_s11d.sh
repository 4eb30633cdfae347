#!/usr/bin/env bash
# Session 11, call 4: call 3 (device_s11c.sh) again, without its numba's-linker timing,
# now that the driver's whole-program JIT takes the PTX (call 3 passed a str, which
# cuda.core reads as a file path): tests, timing, sanitizers.
exec bash scripts/device_s11c.sh "$1" whole-only

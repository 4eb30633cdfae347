"""Where a short forward's host time goes (issue #13's (16, 32, 1024, 64) row reads
2× slower in single calls than in queued ones): the host time of ``flash_attention``
(no sync) per call, with the wgmma forward on and off, then cProfile's top entries.

    python3 scripts/profile_wgmma_host.py
"""

import cProfile
import os
import pstats
import time

import cupy as cp

import numba_flash

B, H, N, d = 16, 32, 1024, 64
gen = cp.random.default_rng(0)
q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
for wgmma in ("0", "1"):
    os.environ["NUMBA_FLASH_WGMMA"] = wgmma
    for _ in range(3):
        numba_flash.flash_attention(q, k, v, causal=True)
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        numba_flash.flash_attention(q, k, v, causal=True)
    host = (time.perf_counter() - t0) / 50 * 1e6
    cp.cuda.runtime.deviceSynchronize()
    print(f"NUMBA_FLASH_WGMMA={wgmma}: host {host:.1f} us a call")
prof = cProfile.Profile()
prof.enable()
for _ in range(50):
    numba_flash.flash_attention(q, k, v, causal=True)
prof.disable()
cp.cuda.runtime.deviceSynchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)

"""Issue #14's decode step at a short cache under Nsight Compute: where a 4096-key step's
time goes (the split kernel against the merge, their occupancy and DRAM throughput) for
``num_splits`` 4, 8, 16, 32 and auto (one call each, after a warm-up call that compiles):

    ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum python3 scripts/ncu_decode.py [L]

The shape is ``bench_decode.py``'s: Nq = 1, B = 8, 32 query / 8 KV heads, d = 128, fp16,
a contiguous cache of L (4096) keys.  Each call's launches follow its ``ncu_decode:`` line
(the warm-up's launches come first).
"""

import sys

import cupy as cp
import numpy as np

import numba_flash

L = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
B, H, HK, D = 8, 32, 8, 128
rng = np.random.default_rng(14)
kc, vc = (cp.asarray(rng.standard_normal((B, L, HK, D), dtype=np.float32)).astype(cp.float16) for _ in range(2))
q = cp.asarray(rng.standard_normal((B, 1, H, D), dtype=np.float32)).astype(cp.float16)
for s in (4, 8, 16, 32, 0):
    numba_flash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=L, num_splits=s)  # compile (warm-up)
    cp.cuda.runtime.deviceSynchronize()
    print(f"ncu_decode: num_splits={s} L={L}", flush=True)
    numba_flash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=L, num_splits=s)
    cp.cuda.runtime.deviceSynchronize()
print("ncu_decode: done")

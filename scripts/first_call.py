"""Seconds of the first forward and backward call in a fresh process (compilation, or
loading from numba-flash's on-disk kernel cache), fp16 d = 128, causal.

    NUMBA_CACHE_DIR=/tmp/c python3 scripts/first_call.py     # run twice: cold, then warm
"""

import json
import time

t0 = time.perf_counter()
import cupy as cp  # noqa: E402

import numba_flash  # noqa: E402

q, k, v, dout = (cp.random.standard_normal((1, 256, 4, 128), dtype=cp.float32).astype(cp.float16) for _ in range(4))
t1 = time.perf_counter()
out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
cp.cuda.runtime.deviceSynchronize()
t2 = time.perf_counter()
numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
cp.cuda.runtime.deviceSynchronize()
t3 = time.perf_counter()
print(json.dumps(dict(imports_s=round(t1 - t0, 2), forward_s=round(t2 - t1, 2), backward_s=round(t3 - t2, 2))))

"""A small forward + backward of every kernel family, for compute-sanitizer.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py

Shapes are small and not multiples of any tile; causal on and off, Nq != Nk, both layouts.
"""

import cupy as cp
import numpy as np

import numba_flash

rng = np.random.default_rng(0)
import ml_dtypes

for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
    for (Nq, Nk, d, causal, layout) in ((77, 77, 64, True, "bshd"), (50, 93, 128, False, "bhsd"), (93, 50, 32, True, "bshd")):
        B, H = 1, 2
        shape = lambda n: (B, n, H, d) if layout == "bshd" else (B, H, n, d)  # noqa: E731
        q, k, v = (cp.asarray(rng.standard_normal(shape(n)).astype(dtype)) for n in (Nq, Nk, Nk))
        out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
        dout = cp.asarray(rng.standard_normal(out.shape).astype(dtype))
        dq, dk, dv = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, layout=layout)
        cp.cuda.runtime.deviceSynchronize()
        print(np.dtype(dtype).name, Nq, Nk, d, causal, layout, "finite:",
              all(bool(cp.isfinite(x).all()) for x in (out, dq, dk, dv)))
print("sanitize_small: done")

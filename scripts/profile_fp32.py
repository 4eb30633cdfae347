"""One fp32 forward and backward per head dim at the issue's shapes, for ncu:

    ncu --clock-control none --kernel-name regex:blocked --section WarpStateStats ... \\
        python3 scripts/profile_fp32.py

(4, 16, 4096, 128) and (4, 32, 4096, 64), causal off.
"""

import cupy as cp

import numba_flash

for B, H, N, d in ((4, 16, 4096, 128), (4, 32, 4096, 64)):
    q, k, v, do = (cp.random.standard_normal((B, N, H, d), dtype=cp.float32) for _ in range(4))
    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True)
    numba_flash.flash_attention_backward(do, q, k, v, out, lse)
    cp.cuda.runtime.deviceSynchronize()
print("profile_fp32: done")

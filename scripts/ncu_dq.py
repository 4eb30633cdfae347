"""One fp16 backward of (B, H, N, d) for ``ncu`` (session 24: the ordered dQ's dK/dV kernel
against the dQ kernel's; ``NUMBA_FLASH_WGMMA_DQ`` picks).

    ncu --kernel-name regex:wgmma_bwd_dkdv python3 scripts/ncu_dq.py 1,16,4096,128,0
"""

import sys

import cupy as cp

import numba_flash

B, H, N, d, causal = (int(x) for x in sys.argv[1].split(","))
gen = cp.random.default_rng(1)
q, k, v, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
out, lse = numba_flash.flash_attention(q, k, v, causal=bool(causal), return_lse=True)
numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=bool(causal))
cp.cuda.runtime.deviceSynchronize()
print("ncu_dq: done")

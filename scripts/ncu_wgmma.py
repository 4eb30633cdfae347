"""Issue #13's profile of the wgmma forward: one launch for each of the issue's four
shapes, fp16, causal off and on (the first of each compiles it), for Nsight Compute
(``scripts/device_s12b.sh`` has the command):

    ncu --clock-control none --kernel-name regex:wgmma_forward \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \\
        python3 scripts/ncu_wgmma.py

The launches come in the order of ``SHAPES`` × (causal off, on); ``python3
scripts/ncu_wgmma.py variants`` runs (4, 16, 4096, 128) causal plain, softcap 30, ALiBi
and dropout 0.1 instead (``ncu_stalls.py e_ncu.txt variants``).  ``python3
scripts/ncu_wgmma.py backward`` runs a backward after each forward (profile its kernels
with ``--kernel-name regex:wgmma_bwd``: dK/dV, then dQ, per case).
"""

import os
import sys

os.environ["NUMBA_FLASH_WGMMA"] = "1"

import cupy as cp  # noqa: E402

import numba_flash  # noqa: E402

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]

BACKWARD = sys.argv[1:] == ["backward"]  # a backward of each (its kernels: --kernel-name regex:wgmma_bwd)
#: ``variants``: issue #11's rows instead, (4, 16, 4096, 128) causal, in this order
VARIANTS = {"plain": {}, "softcap": dict(softcap=30.0), "alibi": "slopes", "dropout": dict(dropout_p=0.1, seed=1)}

if sys.argv[1:] == ["variants"]:
    B, H, N, d = SHAPES[0]
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for name, kw in VARIANTS.items():
        if kw == "slopes":
            kw = dict(alibi_slopes=cp.asarray([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=cp.float32))
        numba_flash.flash_attention(q, k, v, causal=True, **kw)
        cp.cuda.runtime.deviceSynchronize()
        print(f"ncu_wgmma: {name}", flush=True)
    sys.exit(0)

for B, H, N, d in SHAPES:
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for causal in (False, True):
        out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
        if BACKWARD:
            numba_flash.flash_attention_backward(q, q, k, v, out, lse, causal=causal)  # dO: q's values will do
        cp.cuda.runtime.deviceSynchronize()
        print(f"ncu_wgmma: {(B, H, N, d)} causal={causal}", flush=True)
print("ncu_wgmma: done")

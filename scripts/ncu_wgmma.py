"""Issue #13's profile of the wgmma forward: one launch for each of the issue's four
shapes, fp16, causal off and on (the first of each compiles it), for Nsight Compute
(``scripts/device_s12b.sh`` has the command):

    ncu --clock-control none --kernel-name regex:wgmma_forward \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \\
        python3 scripts/ncu_wgmma.py

The launches come in the order of ``SHAPES`` × (causal off, on).
"""

import os

os.environ["NUMBA_FLASH_WGMMA"] = "1"

import cupy as cp  # noqa: E402

import numba_flash  # noqa: E402

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]

for B, H, N, d in SHAPES:
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for causal in (False, True):
        numba_flash.flash_attention(q, k, v, causal=causal)
        cp.cuda.runtime.deviceSynchronize()
        print(f"ncu_wgmma: {(B, H, N, d)} causal={causal}", flush=True)
print("ncu_wgmma: done")

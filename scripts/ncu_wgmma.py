"""Issue #13's profile of the wgmma forward, one launch a shape after a warm-up, for
Nsight Compute (``scripts/device_s11e.sh`` has the command):

    ncu --clock-control none --kernel-name regex:wgmma_forward --launch-skip 1 --launch-count 2 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section InstructionStats python3 scripts/ncu_wgmma.py

fp16, causal off: (4, 16, 4096, 128) and (4, 32, 4096, 64).
"""

import os

os.environ["NUMBA_FLASH_WGMMA"] = "1"

import cupy as cp  # noqa: E402

import numba_flash  # noqa: E402

for B, H, N, d in ((4, 16, 4096, 128), (4, 32, 4096, 64)):
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for _ in range(2 if d == 128 else 1):  # the first launch of all is the skipped warm-up
        numba_flash.flash_attention(q, k, v)
    cp.cuda.runtime.deviceSynchronize()
print("ncu_wgmma: done")

"""Issue #13: the experimental wgmma forward (``NUMBA_FLASH_WGMMA=1``) against the
mma.sync forward and torch SDPA's flash (FlashAttention-2) and cuDNN backends, same
process, fp16 and bf16, the issue's shapes, causal off and on.

    python3 scripts/bench_wgmma.py out.jsonl

Each row: max |wgmma − mma.sync| on the same inputs (both against FlashAttention-2's
tolerance in tests/test_wgmma_forward.py), then medians of CUDA-event timings of single
calls after warm-up (``bench_table.median_ms``); FLOPs 4·B·H·N²·d (×0.5 causal).
"""

import json
import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np
from bench_table import median_ms

import numba_flash

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]


def sdpa_ms(q, k, v, causal):
    """(flash ms, cudnn ms) of torch SDPA on bshd q, k, v (NaN where a backend refuses)."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return float("nan"), float("nan")
    tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))
    got = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(backend):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
                fn()
                got.append(median_ms(fn))
        except RuntimeError:
            got.append(float("nan"))
    return tuple(got)


def ours_ms(q, k, v, causal, wgmma):
    os.environ["NUMBA_FLASH_WGMMA"] = "1" if wgmma else "0"
    fn = lambda: numba_flash.flash_attention(q, k, v, causal=causal)  # noqa: E731
    out = fn()
    return median_ms(fn), out


def warm_up():
    """One untimed round of every timed function at the first shape: the GPU's clocks
    and every library's first-call costs, before the first row is timed."""
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((1, 2048, 16, 128), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for _ in range(3):
        ours_ms(q, k, v, False, False), ours_ms(q, k, v, False, True), sdpa_ms(q, k, v, False)


def main(path):
    warm_up()
    rows = []
    for dtype in ("float16", "bfloat16"):
        for B, H, N, d in SHAPES:
            dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
            gen = cp.random.default_rng(13)
            q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(dt) for _ in range(3))
            for causal in (False, True):
                fl = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
                mma_ms, o_mma = ours_ms(q, k, v, causal, False)
                wg_ms, o_wg = ours_ms(q, k, v, causal, True)
                diff = float(cp.abs(o_mma.astype(cp.float32) - o_wg.astype(cp.float32)).max())
                fa2, cudnn = sdpa_ms(q, k, v, causal)
                row = dict(dtype=dtype, B=B, H=H, N=N, d=d, causal=causal, wgmma_ms=wg_ms, mma_ms=mma_ms,
                           sdpa_flash_ms=fa2, sdpa_cudnn_ms=cudnn, max_abs_diff=diff,
                           wgmma_tflops=fl / wg_ms / 1e9, vs_mma=mma_ms / wg_ms, vs_fa2=fa2 / wg_ms,
                           vs_cudnn=cudnn / wg_ms)  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'dtype':9} {'B,H,N,d':16} {'causal':6} {'wgmma TF/s':>10} {'vs mma':>7} {'vs FA2':>7} "
          f"{'vs cuDNN':>8} {'max diff':>9}")
    for r in rows:
        print(f"{r['dtype']:9} {str((r['B'], r['H'], r['N'], r['d'])):16} {str(r['causal']):6} "
              f"{r['wgmma_tflops']:10.1f} {r['vs_mma']:7.3f} {r['vs_fa2']:7.3f} {r['vs_cudnn']:8.3f} "
              f"{r['max_abs_diff']:9.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
    from numba_flash._numba_cuda import ASSEMBLED

    for how in sorted(set(ASSEMBLED.values())):  # whole_program_dispatcher: what assembled the wgmma kernels
        print(f"{sum(v == how for v in ASSEMBLED.values())} wgmma kernels assembled by {how}")

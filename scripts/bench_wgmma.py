"""Issue #13: the experimental wgmma forward (``NUMBA_FLASH_WGMMA=1``) against the
mma.sync forward and torch SDPA's flash (FlashAttention-2) and cuDNN backends, same
process, fp16 and bf16, the issue's shapes, causal off and on.

    python3 scripts/bench_wgmma.py out.jsonl

Each row: max |wgmma − mma.sync| on the same inputs (both against FlashAttention-2's
tolerance in tests/test_wgmma_forward.py), then medians of CUDA-event timings after
warm-up (``bench_table.median_ms``), two ways: "queued", 10 back-to-back calls between
the events (each call's host time hides behind the GPU's, as torch.utils.benchmark
times FlashAttention-2: the kernels' ratio), and "single", one call (the host's time
counts too: a short call that takes the host longer than the GPU reads slow).  FLOPs
4·B·H·N²·d (×0.5 causal).  The wgmma forward runs three ways: as planned (persistent
blocks, ``wgmma_forward.blocks``), a block a tile (``NUMBA_FLASH_WGMMA_PERSISTENT=0``)
and, at d = 64, with two consumer warpgroups (``NUMBA_FLASH_WGMMA_CONSUMERS=2``).
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


def both_ms(fn):
    """(single-call ms, queued ms) of ``fn``."""
    return median_ms(fn), median_ms(fn, calls=10, rep=9)


def sdpa_ms(q, k, v, causal):
    """((flash single, queued), (cudnn single, queued)) ms of torch SDPA on bshd q, k, v
    (NaN where a backend refuses)."""
    nan = (float("nan"), float("nan"))
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return nan, nan
    tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))
    got = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(backend):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
                fn()
                got.append(both_ms(fn))
        except RuntimeError:
            got.append(nan)
    return tuple(got)


#: The wgmma forward's configurations: name -> environment (None: unset).
CONFIGS = {"wgmma": {}, "wgmma_np": {"NUMBA_FLASH_WGMMA_PERSISTENT": "0"},
           "wgmma_c2": {"NUMBA_FLASH_WGMMA_CONSUMERS": "2"}}  # fmt: skip


def ours_ms(q, k, v, causal, wgmma, env=None):
    os.environ["NUMBA_FLASH_WGMMA"] = "1" if wgmma else "0"
    for name in ("NUMBA_FLASH_WGMMA_PERSISTENT", "NUMBA_FLASH_WGMMA_CONSUMERS"):
        os.environ.pop(name, None)
    os.environ.update(env or {})
    fn = lambda: numba_flash.flash_attention(q, k, v, causal=causal)  # noqa: E731
    out = fn()
    return both_ms(fn), out


def warm_up():
    """One untimed round of every timed function at the first shape: the GPU's clocks
    and every library's first-call costs, before the first row is timed."""
    gen = cp.random.default_rng(0)
    q, k, v = (gen.standard_normal((1, 2048, 16, 128), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for _ in range(2):
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
                (mma_1, mma_q), o_mma = ours_ms(q, k, v, causal, False)
                row = dict(dtype=dtype, B=B, H=H, N=N, d=d, causal=causal, mma_ms=mma_q, mma_single_ms=mma_1)
                for name, env in CONFIGS.items():
                    if name == "wgmma_c2" and d != 64:
                        continue
                    (one, queued), o_wg = ours_ms(q, k, v, causal, True, env)
                    row[f"{name}_ms"], row[f"{name}_single_ms"] = queued, one
                    row[f"{name}_max_abs_diff"] = float(cp.abs(o_mma.astype(cp.float32) - o_wg.astype(cp.float32)).max())
                (fa2_1, fa2_q), (cudnn_1, cudnn_q) = sdpa_ms(q, k, v, causal)
                row.update(sdpa_flash_ms=fa2_q, sdpa_cudnn_ms=cudnn_q, sdpa_flash_single_ms=fa2_1,
                           sdpa_cudnn_single_ms=cudnn_1, wgmma_tflops=fl / row["wgmma_ms"] / 1e9,
                           vs_mma=mma_q / row["wgmma_ms"], vs_fa2=fa2_q / row["wgmma_ms"],
                           vs_cudnn=cudnn_q / row["wgmma_ms"], vs_fa2_single=fa2_1 / row["wgmma_single_ms"],
                           np_vs_fa2=fa2_q / row["wgmma_np_ms"],
                           c2_vs_fa2=fa2_q / row["wgmma_c2_ms"] if d == 64 else float("nan"))  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("\nqueued (10 calls between events) unless marked single; vs FA2 of the plan, of a block a tile (np), "
          "of two consumers (c2, d = 64)")
    print(f"{'dtype':9} {'B,H,N,d':18} {'causal':6} {'TF/s':>6} {'vs mma':>6} {'vs FA2':>6} {'vs cuDNN':>8} "
          f"{'single':>6} {'np':>6} {'c2':>6} {'diff':>8}")
    for r in rows:
        print(f"{r['dtype']:9} {str((r['B'], r['H'], r['N'], r['d'])):18} {str(r['causal']):6} "
              f"{r['wgmma_tflops']:6.1f} {r['vs_mma']:6.3f} {r['vs_fa2']:6.3f} {r['vs_cudnn']:8.3f} "
              f"{r['vs_fa2_single']:6.3f} {r['np_vs_fa2']:6.3f} {r['c2_vs_fa2']:6.3f} {r['wgmma_max_abs_diff']:8.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
    from numba_flash._numba_cuda import ASSEMBLED

    for how in sorted(set(ASSEMBLED.values())):  # whole_program_dispatcher: what assembled the wgmma kernels
        print(f"{sum(v == how for v in ASSEMBLED.values())} wgmma kernels assembled by {how}")

"""Issue #11's head-dim bar: fp16 at d = 32, 96 and 256 (64 and 128 beside them) against
torch SDPA's flash backend (FlashAttention-2) in the same process, N = 4096.

    python3 scripts/bench_head_dims.py out.jsonl [--dims 96,256] [--forward-only | --backward-only] [--full-only]
                                                 [--cudnn]

FlashAttention-2's benchmark shapes: B·N = 16384 tokens, H·d = 2048.  Times are medians
of CUDA-event timings of single calls after warm-up (``bench_table.median_ms``); FLOPs
4·B·H·N²·d (×0.5 causal, ×2.5 backward).  The bar: ≥ 0.6× SDPA flash.  ``--cudnn``: SDPA's
cuDNN backend's forward too (issue #13's goal), "missing" where it refuses the shape.
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash

rng = np.random.default_rng(20261201)
N, B = 4096, 4


def main(path, dims=(32, 64, 96, 128, 256), backward=True, forward=True, causals=(False, True), cudnn=False):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention
    rows = []
    for d in dims:
        H = 2048 // d
        q, k, v, dout = (cp.asarray(rng.standard_normal((B, N, H, d), dtype=np.float32)).astype(cp.float16)
                         for _ in range(4))  # fmt: skip
        tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda").transpose(1, 2).detach().requires_grad_() for x in
                           (q, k, v, dout))  # fmt: skip
        for causal in causals:
            out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
            ours = (median_ms(lambda: numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True))
                    if forward else float("nan"),
                    median_ms(lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal))
                    if backward else float("nan"))  # fmt: skip
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F(tq, tk, tv, is_causal=causal)
                peer = (median_ms(lambda: F(tq, tk, tv, is_causal=causal)) if forward else float("nan"),
                        median_ms(lambda: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True))
                        if backward else float("nan"))  # fmt: skip
            cudnn_ms = float("nan")
            if cudnn and forward:
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        cudnn_ms = median_ms(lambda: F(tq, tk, tv, is_causal=causal))
                except RuntimeError as exc:  # cuDNN does not take every head dim
                    print(f"cudnn d={d} causal={causal}: missing ({str(exc).splitlines()[0][:80]})", flush=True)
            fl = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
            row = dict(B=B, H=H, N=N, d=d, causal=causal, tiles=os.environ.get("NUMBA_FLASH_TILES", ""), fwd_ms=ours[0], bwd_ms=ours[1], sdpa_fwd_ms=peer[0],
                       sdpa_bwd_ms=peer[1], fwd_tflops=fl / ours[0] / 1e9, bwd_tflops=2.5 * fl / ours[1] / 1e9,
                       fwd_ratio=peer[0] / ours[0], bwd_ratio=peer[1] / ours[1], cudnn_fwd_ms=cudnn_ms,
                       fwd_cudnn_ratio=cudnn_ms / ours[0])  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del q, k, v, dout, tq, tk, tv, tdo
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'d':>4} {'H':>3} {'causal':6} {'fwd TF/s':>9} {'bwd TF/s':>9} {'fwd/FA2':>8} {'bwd/FA2':>8} "
          f"{'fwd/cuDNN':>9}  bar 0.6")
    for r in rows:
        print(f"{r['d']:4d} {r['H']:3d} {str(r['causal']):6} {r['fwd_tflops']:9.1f} {r['bwd_tflops']:9.1f} "
              f"{r['fwd_ratio']:8.3f} {r['bwd_ratio']:8.3f} {r['fwd_cudnn_ratio']:9.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    dims = [int(x) for x in args[args.index("--dims") + 1].split(",")] if "--dims" in args else (32, 64, 96, 128, 256)
    main(args[0], dims, "--forward-only" not in args, "--backward-only" not in args,
         (False,) if "--full-only" in args else (False, True), "--cudnn" in args)

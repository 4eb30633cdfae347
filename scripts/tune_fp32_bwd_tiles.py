"""Register-blocked fp32 backward: dK/dV and dQ tile shapes against SDPA's efficient
kernel (H200).

    python3 scripts/tune_fp32_bwd_tiles.py [out.jsonl]

For each head dim: the dK/dV tiles are varied with the dQ tiles fixed, then the dQ
tiles with the dK/dV tiles fixed.  Each pair is first checked against the float64
NumPy reference on a small case, then the backward alone (preprocess + dK/dV + dQ) is
timed at the issue's shapes, causal off and on (CUDA events, median of 10 after 3
warm-ups), next to torch SDPA's EFFICIENT_ATTENTION backward on the same fp32 inputs.
"""

import json
import os
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.variant import Variant
from numba_flash.bench import time_fn
from numba_flash import reference
from numba_flash.config import BlockedTiles
from numba_flash.kernels import simt_blocked_backward

DKDV = {
    64: [(64, 64, 4, 4), (128, 64, 8, 4), (64, 32, 4, 4), (128, 32, 8, 4)],
    128: [(64, 64, 4, 4), (64, 32, 4, 4), (32, 64, 4, 4), (32, 32, 4, 4)],
}
DQ = {
    64: [(64, 64, 4, 4), (128, 32, 8, 4), (64, 32, 4, 4), (128, 64, 8, 4)],
    128: [(64, 64, 4, 4), (64, 32, 4, 4), (32, 64, 4, 4), (128, 32, 8, 4)],
}
SHAPES = {64: (4, 32, 4096), 128: (4, 16, 4096)}


def median_ms(fn):
    """Median of 10 CUDA-event timings after warm-up (``numba_flash.bench.time_fn``)."""
    return time_fn(fn, warmup=3, rep=10, min_rep=10, budget_ms=None).ms


def grad_error(d, causal):
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, n, 2, d)).astype(np.float32) for n in (300, 257, 257))
    ro, rl = reference.attention(q, k, v, causal=causal, layout="bshd")
    o, lse = ro.astype(np.float32), rl.astype(np.float32)
    do = rng.standard_normal(o.shape).astype(np.float32)
    got = numba_flash.flash_attention_backward(*(cp.asarray(x) for x in (do, q, k, v, o, lse)), causal=causal)
    ref = reference.attention_backward(do, q, k, v, o, lse, causal=causal, layout="bshd")
    return max(reference.rel_error(cp.asnumpy(g), r) for g, r in zip(got, ref))


def sdpa_bwd_ms(B, H, N, d, causal):
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:
        return None
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float32, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    dout = torch.randn_like(out)
    return median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))


def regs(kern):
    r = kern.get_regs_per_thread()
    return max(r.values()) if isinstance(r, dict) else r


def main():
    out = open(sys.argv[1], "a") if len(sys.argv) > 1 else None
    for d in DKDV:
        B, H, N = SHAPES[d]
        q, k, v, do = (cp.random.standard_normal((B, N, H, d), dtype=cp.float32) for _ in range(4))
        peer = {c: sdpa_bwd_ms(B, H, N, d, c) for c in (False, True)}
        pairs = [(a, DQ[d][0]) for a in DKDV[d]] + [(DKDV[d][0], b) for b in DQ[d][1:]]
        for a, bq in pairs:
            os.environ["NUMBA_FLASH_TILES"] = json.dumps({"blocked_backward": {str(d): [list(a), list(bq)]}})
            row = {"d": d, "dkdv": a, "dq": bq}
            try:
                row["err"] = max(grad_error(d, c) for c in (False, True))
                for c in (False, True):
                    o, lse = numba_flash.flash_attention(q, k, v, causal=c, return_lse=True)
                    ms = median_ms(lambda: numba_flash.flash_attention_backward(do, q, k, v, o, lse, causal=c))
                    flops = 2.5 * 4 * B * H * N * N * d * (0.5 if c else 1.0)
                    name = "causal" if c else "full"
                    row[f"tflops_{name}"] = round(flops / ms / 1e9, 2)
                    if peer[c]:
                        row[f"sdpa_eff_{name}"] = round(flops / peer[c] / 1e9, 2)
                row["regs"] = [regs(simt_blocked_backward.simt_blocked_dkdv_kernel(BlockedTiles(d, *a), Variant(causal=False))),
                               regs(simt_blocked_backward.simt_blocked_dq_kernel(BlockedTiles(d, *bq), Variant(causal=False)))]
            except Exception as e:  # a tile shape the device refuses is a result too
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""Register-blocked fp32 forward: tile shapes against SDPA's efficient kernel (H200).

    python3 scripts/tune_fp32_tiles.py [out.jsonl ['{"128": [[bm, bn, tm, tn], ...]}']]

For each head dim and candidate ``BlockedTiles`` (rows, cols, tm, tn): first a
small correctness check against a float64 CuPy attention (so a tile shape that breaks
the kernel is reported, not timed), then the forward at the issue's shapes, causal off
and on, with CUDA events (median of 10 after 3 warm-ups), next to torch SDPA's
EFFICIENT_ATTENTION on the same fp32 inputs in the same process.
"""

import json
import os
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.variant import Variant
from numba_flash.bench import time_fn
from numba_flash.config import BlockedTiles
from numba_flash.kernels import simt_blocked_forward

CANDIDATES = {
    64: [(128, 64, 8, 4), (64, 64, 4, 4), (64, 32, 4, 4), (128, 32, 8, 4), (128, 64, 8, 8), (64, 64, 8, 4)],
    128: [(128, 64, 8, 4), (64, 64, 4, 4), (64, 32, 4, 4), (64, 128, 4, 8), (64, 64, 8, 4), (128, 32, 8, 4)],
}
SHAPES = {64: (4, 32, 4096), 128: (4, 16, 4096)}


def median_ms(fn):
    """Median of 10 CUDA-event timings after warm-up (``numba_flash.bench.time_fn``)."""
    return time_fn(fn, warmup=3, rep=10, min_rep=10, budget_ms=None).ms


def ref_error(d, causal):
    rng = np.random.default_rng()
    q, k, v = (cp.asarray(rng.standard_normal((1, n, 2, d)).astype(np.float32)) for n in (300, 257, 257))
    out = numba_flash.flash_attention(q, k, v, causal=causal)
    q64, k64, v64 = (x.astype(cp.float64).transpose(0, 2, 1, 3) for x in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(d)
    if causal:
        i, j = np.arange(300)[:, None], np.arange(257)[None, :]
        s = cp.where(cp.asarray(j <= i + 257 - 300), s, -cp.inf)
    p = cp.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = (p @ v64).transpose(0, 2, 1, 3)
    ref = cp.nan_to_num(ref)
    return float(cp.abs(out - ref).max() / cp.abs(ref).max())


def sdpa_ms(B, H, N, d, causal):
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:
        return None
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float32) for _ in range(3))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))


def main():
    out = open(sys.argv[1], "a") if len(sys.argv) > 1 else None
    candidates = CANDIDATES
    if len(sys.argv) > 2:
        candidates = {int(d): [tuple(c) for c in cs] for d, cs in json.loads(sys.argv[2]).items()}
    for d, cands in candidates.items():
        B, H, N = SHAPES[d]
        q, k, v = (cp.random.standard_normal((B, N, H, d), dtype=cp.float32) for _ in range(3))
        peer = {c: sdpa_ms(B, H, N, d, c) for c in (False, True)}
        for cand in cands:
            t = BlockedTiles(d, *cand)
            os.environ["NUMBA_FLASH_TILES"] = json.dumps({"blocked_forward": {str(d): list(cand)}})
            row = {"d": d, "tiles": cand, "threads": t.threads, "smem": simt_blocked_forward.smem_bytes(t)}
            try:
                row["err"] = max(ref_error(d, c) for c in (False, True))
                for c in (False, True):
                    ms = median_ms(lambda: numba_flash.flash_attention(q, k, v, causal=c))
                    flops = 4 * B * H * N * N * d * (0.5 if c else 1.0)
                    row[f"tflops_{'causal' if c else 'full'}"] = round(flops / ms / 1e9, 2)
                    if peer[c]:
                        row[f"sdpa_eff_{'causal' if c else 'full'}"] = round(flops / peer[c] / 1e9, 2)
                kern = simt_blocked_forward.simt_blocked_forward_kernel(t, Variant(causal=False))
                regs, local = kern.get_regs_per_thread(), kern.get_local_mem_per_thread()
                row["regs"] = max(regs.values()) if isinstance(regs, dict) else regs
                row["local_bytes"] = max(local.values()) if isinstance(local, dict) else local
            except Exception as e:  # a tile shape the device refuses is a result too
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""Error of the exact fp32 and the TF32 (``allow_tf32=True``) modes against float64, on
the GPU, at one (batch, head) slice of the issue's shapes.

    python3 scripts/fp32_modes_error.py

For d in (64, 128), N = 4096, causal off and on: relative error (max |x − ref| / max
|ref|) of O, and of dQ, dK, dV, against a float64 CuPy standard attention on the same
float32 inputs.
"""

import json

import cupy as cp
import numpy as np

import numba_flash


def reference(q, k, v, do, causal, scale):
    q, k, v, do = (x.astype(cp.float64)[0].transpose(1, 0, 2) for x in (q, k, v, do))  # (H, N, d)
    s = q @ k.transpose(0, 2, 1) * scale
    if causal:
        n = s.shape[-1]
        s = cp.where(cp.tril(cp.ones((n, n), bool)), s, -cp.inf)
    p = cp.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    dv = p.transpose(0, 2, 1) @ do
    dp = do @ v.transpose(0, 2, 1)
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    dq = ds @ k * scale
    dk = ds.transpose(0, 2, 1) @ q * scale
    return [x.transpose(1, 0, 2)[None] for x in (o, dq, dk, dv)]


def rel(x, ref):
    return float(cp.abs(x.astype(cp.float64) - ref).max() / cp.abs(ref).max())


for d in (64, 128):
    for causal in (False, True):
        q, k, v, do = (cp.random.standard_normal((1, 4096, 2, d), dtype=cp.float32) for _ in range(4))
        ref = reference(q, k, v, do, causal, 1 / np.sqrt(d))
        for tf32 in (False, True):
            out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, allow_tf32=tf32)
            grads = numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal, allow_tf32=tf32)
            errs = [rel(x, r) for x, r in zip((out, *grads), ref)]
            print(json.dumps({"d": d, "causal": causal, "mode": "tf32" if tf32 else "exact",
                              **{n: f"{e:.2e}" for n, e in zip(("O", "dQ", "dK", "dV"), errs)}}), flush=True)

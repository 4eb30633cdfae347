"""Where the variant cases' time goes on the GPU machine: per case, the API call
queued (10 back-to-back calls between CUDA events), the same call's kernels replayed
(their launches captured from one call and launched again, 10 times queued: the GPU's
time, the API's host work left out), and the host's time per call (no sync).

    python3 scripts/diag_variants.py out.jsonl

A case whose API time is well above its kernels' is host-bound: the kernels are
faster than the host can issue calls (queued calls then measure the host).
``NUMBA_FLASH_WGMMA_PERSISTENT`` etc. apply as usual (the script sets some per case).
"""

import json
import os
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash import api
from numba_flash.bench.cases import ragged_lengths, visible_pairs
from bench_table import host_ms, median_ms

rng = np.random.default_rng(20261201)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def captured(fn):
    """The launches one call of ``fn`` makes: (kernel, grid, threads, smem, args)."""
    got = []
    real = api.launch

    def rec(kernel, grid, threads, smem, *args):
        got.append((kernel, grid, threads, smem, args))
        real(kernel, grid, threads, smem, *args)

    api.launch = rec
    try:
        fn()
    finally:
        api.launch = real
    return got


def replay_ms(launches):
    def again():
        for kernel, grid, threads, smem, args in launches:
            api.launch(kernel, grid, threads, smem, *args)
    return median_ms(again, calls=10, rep=9)


def case(rows, name, fn, flops, env=None):
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        api_ms = median_ms(fn, calls=10, rep=9)
        kern_ms = replay_ms(captured(fn))
        h = host_ms(fn)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    r = dict(case=name, env=env or {}, api_ms=api_ms, kernels_ms=kern_ms, host_ms=h,
             api_tflops=flops / api_ms / 1e9, kernel_tflops=flops / kern_ms / 1e9)
    rows.append(r)
    print(json.dumps(r), flush=True)


def main(path):
    rows = []
    H, d = 16, 128
    # varlen (bench_variants' lengths) against the uniform and padded batches, causal, forward and backward
    lens = ragged_lengths(rng)
    total, mx = int(lens.sum()), int(lens.max())
    cu_h = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cu_d = cp.asarray(cu_h)
    q, k, v, do = (randn(total, H, d) for _ in range(4))
    pairs = H * sum(visible_pairs(n, n, True) for n in lens)
    o, l = numba_flash.flash_attention_varlen(q, k, v, cu_d, cu_d, mx, mx, causal=True, return_lse=True)
    for cu, tag in ((cu_d, "device"), (cu_h, "numpy")):
        for env in ({}, {"NUMBA_FLASH_WGMMA_PERSISTENT": "0"}):
            case(rows, f"varlen fwd {tag} cu", lambda: numba_flash.flash_attention_varlen(
                q, k, v, cu, cu, mx, mx, causal=True, return_lse=True), 4 * d * pairs, env)
        case(rows, f"varlen bwd {tag} cu", lambda: numba_flash.flash_attention_varlen_backward(
            do, q, k, v, o, l, cu, cu, mx, mx, causal=True), 10 * d * pairs)
    for B, N in ((16, 1024), (16, mx)):
        qb, kb, vb, dob = (randn(B, N, H, d) for _ in range(4))
        pb = B * H * visible_pairs(N, N, True)
        ob, lb = numba_flash.flash_attention(qb, kb, vb, causal=True, return_lse=True)
        for env in ({}, {"NUMBA_FLASH_WGMMA_PERSISTENT": "0"}):
            case(rows, f"batch {B}x{N} fwd", lambda: numba_flash.flash_attention(qb, kb, vb, causal=True), 4 * d * pb,
                 env)
        case(rows, f"batch {B}x{N} bwd", lambda: numba_flash.flash_attention_backward(dob, qb, kb, vb, ob, lb,
                                                                                      causal=True), 10 * d * pb)
    del q, k, v, do
    # window (1024, 0) against causal at 16384
    B, N = 1, 16384
    q, k, v = (randn(B, N, H, d) for _ in range(3))
    for w, tag in (((-1, -1), "causal"), ((1024, 0), "window (1024,0)")):
        pw = B * H * visible_pairs(N, N, True, w)
        for env in ({}, {"NUMBA_FLASH_WGMMA_PERSISTENT": "0"}):
            case(rows, f"{tag} 16384 fwd", lambda: numba_flash.flash_attention(q, k, v, causal=True, window_size=w),
                 4 * d * pw, env)
    # softcap, ALiBi, dropout against plain, forward (4, 16, 4096, 128) causal
    B, N = 4, 4096
    q, k, v = (randn(B, N, H, d) for _ in range(3))
    pp = B * H * visible_pairs(N, N, True)
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    for tag, kw in (("plain", {}), ("softcap", dict(softcap=30.0)), ("alibi", dict(alibi_slopes=slopes)),
                    ("dropout", dict(dropout_p=0.1, seed=1234))):
        case(rows, f"{tag} 4x16x4096 fwd", lambda: numba_flash.flash_attention(q, k, v, causal=True, **kw), 4 * d * pp)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'case':28} {'env':22} {'api ms':>8} {'kern ms':>8} {'host ms':>8} {'api TF/s':>9} {'kern TF/s':>9}")
    for r in rows:
        env = ",".join(f"{k[len('NUMBA_FLASH_'):]}={v}" for k, v in r["env"].items())
        print(f"{r['case']:28} {env:22} {r['api_ms']:8.3f} {r['kernels_ms']:8.3f} {r['host_ms']:8.3f} "
              f"{r['api_tflops']:9.1f} {r['kernel_tflops']:9.1f}")


if __name__ == "__main__":
    main(sys.argv[1])

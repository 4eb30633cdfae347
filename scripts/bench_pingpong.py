"""The wgmma forward with and without the consumers' ping-pong
(``NUMBA_FLASH_WGMMA_PINGPONG``), queued calls (10 between CUDA events, medians), fp16,
against torch SDPA flash (FlashAttention-2) and cuDNN in the same process.

    python3 scripts/bench_pingpong.py out.jsonl
"""

import json
import os
import sys

import cupy as cp
import numpy as np
import torch

import numba_flash
from numba_flash.bench.cases import ragged_lengths, visible_pairs
from bench_table import median_ms

rng = np.random.default_rng(7)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def sdpa(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv = (torch.as_tensor(x, device="cuda").transpose(1, 2) for x in (q, k, v))
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    try:
        with sdpa_kernel(be):
            return median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
                             calls=10, rep=9)
    except RuntimeError:
        return float("nan")


def ours(fn, pp):
    os.environ["NUMBA_FLASH_WGMMA_PINGPONG"] = pp
    return median_ms(fn, calls=10, rep=9)


def main(path):
    rows = []
    cases = [((4, 16, 4096, 128), False, (-1, -1)), ((4, 16, 4096, 128), True, (-1, -1)),
             ((1, 16, 16384, 128), False, (-1, -1)), ((1, 16, 16384, 128), True, (-1, -1)),
             ((1, 16, 16384, 128), True, (1024, 0)), ((16, 32, 1024, 64), True, (-1, -1))]
    for (B, H, N, d), causal, window in cases:
        q, k, v = (randn(B, N, H, d) for _ in range(3))
        fn = lambda: numba_flash.flash_attention(q, k, v, causal=causal, window_size=window)  # noqa: E731
        flops = 4 * d * B * H * visible_pairs(N, N, causal, window)
        r = dict(shape=[B, H, N, d], causal=causal, window=list(window), off_ms=ours(fn, "0"), on_ms=ours(fn, "1"))
        if window == (-1, -1):
            r.update(fa2_ms=sdpa(q, k, v, causal, "flash"), cudnn_ms=sdpa(q, k, v, causal, "cudnn"))
        r["tflops_off"], r["tflops_on"] = flops / r["off_ms"] / 1e9, flops / r["on_ms"] / 1e9
        rows.append(r)
        print(json.dumps(r), flush=True)
        del q, k, v
    # varlen (bench_variants' lengths, NumPy offsets)
    lens = ragged_lengths(rng)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v = (randn(int(cu[-1]), 16, 128) for _ in range(3))
    mx = int(lens.max())
    fn = lambda: numba_flash.flash_attention_varlen(q, k, v, cu, cu, mx, mx, causal=True)  # noqa: E731
    flops = 4 * 128 * 16 * sum(visible_pairs(int(n), int(n), True) for n in lens)
    r = dict(shape=["varlen 16 seqs", 16, 16384, 128], causal=True, window=[-1, -1], off_ms=ours(fn, "0"),
             on_ms=ours(fn, "1"))
    r["tflops_off"], r["tflops_on"] = flops / r["off_ms"] / 1e9, flops / r["on_ms"] / 1e9
    rows.append(r)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'shape':24} {'causal':6} {'window':12} {'off TF/s':>9} {'on TF/s':>9} {'on/off':>7} {'on/FA2':>7} {'on/cuDNN':>8}")
    for r in rows:
        fa2 = r.get("fa2_ms", float("nan")) / r["on_ms"]
        cud = r.get("cudnn_ms", float("nan")) / r["on_ms"]
        print(f"{str(tuple(r['shape'])):24} {str(r['causal']):6} {str(tuple(r['window'])):12} {r['tflops_off']:9.1f} "
              f"{r['tflops_on']:9.1f} {r['off_ms'] / r['on_ms']:7.3f} {fa2:7.3f} {cud:8.3f}")


if __name__ == "__main__":
    main(sys.argv[1])

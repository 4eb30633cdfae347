"""Session 39's A/B, fp16, on one GPU: the Hopper backward's preprocess
(``tc_backward.tc_bwd_stats_kernel``: lse·log2 e and delta = rowsum(dO∘O) into ``stats``)
alone, whole backwards around it, and forwards (where session 39 timed a row's max taken as
four chains, ``softmax.row_max``: no faster, reverted):

    python3 scripts/bench_stats.py out.jsonl LABEL

Run once a tree (``PYTHONPATH``) to compare two versions of the kernel: its launches take the
same arguments in both.  ``stats`` rows: microseconds a launch (20 launches queued between two
CUDA events, median of 7) and the bandwidth of the bytes it must move (O and dO read, lse
read, the stats pairs written).  ``backward`` rows: milliseconds of
``flash_attention_backward`` (10 queued calls, median of 7; its preprocess included), the
issue #11 rows it enters: causal (4, 16, 4096, 128), causal and window (1024, 0) at (1, 16,
16384, 128).  ``forward`` rows: ``flash_attention`` the same way, on those three and softcap 30
at (4, 16, 4096, 128).  Appends JSON lines; prints a short table.
"""

import json
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash import _launch
from numba_flash.kernels import tc_backward
from numba_flash.kernels import wgmma_backward as W
from bench_table import median_ms  # scripts/ is on sys.path

rng = np.random.default_rng(20261207)
STATS_SHAPES = [(1, 16, 16384, 128), (4, 16, 4096, 128), (16, 16, 1024, 64), (1, 16, 1024, 128), (2, 16, 4096, 256)]
CASES = [((4, 16, 4096, 128), {}), ((1, 16, 16384, 128), {}), ((1, 16, 16384, 128), {"window_size": (1024, 0)})]


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def stats_row(label, B, H, N, d):
    out, dout = randn(B, N, H, d), randn(B, N, H, d)
    lse = cp.asarray(rng.standard_normal((B, H, N), dtype=np.float32))
    stats = cp.empty(W.stats_shape(B, H, N), cp.float32)
    cu = cp.zeros(1, cp.int32)
    kernel = tc_backward.tc_bwd_stats_kernel(d, "float16", False)
    args = (out.view(cp.uint16), dout.view(cp.uint16), lse, stats, cu)
    grid = (-(-N // 128), H, B)
    # the library's launch (cuLaunchKernel from packed arguments: little host time a launch)
    us = 1e3 * median_ms(lambda: _launch.launch(kernel, grid, 128, 0, *args), warmup=2, rep=7, calls=20)
    want = (out.astype(cp.float32) * dout.astype(cp.float32)).sum(-1).transpose(0, 2, 1)  # (B, H, N)
    err = float(cp.abs(stats[:, :, 1, :N] - want).max() / cp.abs(want).max())
    nbytes = 2 * out.nbytes + lse.nbytes + stats.nbytes
    return dict(kind="stats", label=label, shape=[B, H, N, d], us=us, gbps=nbytes / us / 1e3, rel_err=err)


def pass_rows(label, shape, kw, backward=True):
    """The forward's row, and the backward's (``backward``), of a case."""
    B, H, N, d = shape
    q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
    fwd = lambda: numba_flash.flash_attention(q, k, v, causal=True, return_lse=True, **kw)  # noqa: E731
    out, lse = fwd()
    variant = str(kw.get("window_size", "softcap" if "softcap" in kw else "causal"))
    rows = [dict(kind="forward", label=label, shape=list(shape), variant=variant,
                 ms=median_ms(fwd, warmup=1, rep=7, calls=10))]  # fmt: skip
    if backward:
        ms = median_ms(lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **kw),
                       warmup=1, rep=7, calls=10)  # fmt: skip
        rows.append(dict(kind="backward", label=label, shape=list(shape), variant=variant, ms=ms))
    return rows


def main(path, label):
    rows = [stats_row(label, *s) for s in STATS_SHAPES]
    for shape, kw in CASES:
        rows += pass_rows(label, shape, kw)
    rows += pass_rows(label, (4, 16, 4096, 128), {"softcap": 30.0}, backward=False)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        if r["kind"] == "stats":
            print(f"{label:6} stats    {str(tuple(r['shape'])):22} {r['us']:8.1f} us {r['gbps']:7.0f} GB/s  "
                  f"err {r['rel_err']:.1e}")  # fmt: skip
        else:
            print(f"{label:6} {r['kind']:8} {str(tuple(r['shape'])):22} {r['variant']:10} {r['ms']:7.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Run one issue #11 benchmark case a few times, for ``ncu`` (hardware counters of its
kernels against the plain causal kernel's).

    ncu --clock-control none -k regex:tc_ --launch-skip 2 --launch-count 2 \\
        --metrics <list> python3 scripts/profile_variants.py window|causal|varlen|padded
"""

import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.bench.cases import ragged_lengths

rng = np.random.default_rng(1)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


case = sys.argv[1]
if case in ("window", "causal"):
    q, k, v = (randn(1, 16384, 16, 128) for _ in range(3))
    kw = dict(causal=True, window_size=(1024, 0) if case == "window" else (-1, -1))
    run = lambda: numba_flash.flash_attention(q, k, v, return_lse=True, **kw)  # noqa: E731
else:
    lens = ragged_lengths(rng)
    if case == "varlen":
        cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        q, k, v = (randn(int(lens.sum()), 16, 128) for _ in range(3))
        m = int(lens.max())
        run = lambda: numba_flash.flash_attention_varlen(q, k, v, cu, cu, m, m, causal=True, return_lse=True)  # noqa: E731
    else:
        q, k, v = (randn(16, int(lens.max()), 16, 128) for _ in range(3))
        run = lambda: numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)  # noqa: E731
out, lse = run()
for _ in range(4):
    out, lse = run()
    if len(sys.argv) > 2:  # also the backward
        numba_flash.flash_attention_backward(out, q, k, v, out, lse, causal=True) if case != "varlen" else None
cp.cuda.runtime.deviceSynchronize()
print(case, "done")

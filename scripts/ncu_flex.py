"""The kernels of issue #12's overhead bar, one launch each, for Nsight Compute.

    ncu --clock-control none --kernel-name regex:tc_forward --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats python3 scripts/ncu_flex.py

Runs the fp16 forward at (4, 16, 4096, 128) twice (a warm-up, then the profiled one)
for each of: the built-in causal mask, causal as a ``mask_mod`` with its BlockMask, and
a document mask (8 documents of random lengths, N = 16384, 16 heads).
"""

import cupy as cp
import numpy as np

import numba_flash
from numba_flash import create_block_mask

rng = np.random.default_rng(0)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def causal_mod(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def same_doc(b, h, q_idx, kv_idx, doc):
    return doc[q_idx] == doc[kv_idx]


q, k, v = (randn(4, 4096, 16, 128) for _ in range(3))
bm = create_block_mask(causal_mod, None, None, 4096, 4096)
for kw in ({"causal": True}, {"block_mask": bm}):
    for _ in range(2):
        numba_flash.flash_attention(q, k, v, **kw)
N = 16384
cuts = np.sort(rng.choice(np.arange(1, N), size=7, replace=False))
doc = cp.asarray(np.searchsorted(cuts, np.arange(N), side="right").astype(np.int32))
q, k, v = (randn(1, N, 16, 128) for _ in range(3))
bm = create_block_mask(same_doc, None, None, N, N, mod_args=(doc,))
for _ in range(2):
    numba_flash.flash_attention(q, k, v, block_mask=bm)
cp.cuda.runtime.deviceSynchronize()

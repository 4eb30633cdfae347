"""``mask.row_span`` (a tile row's visible columns as two bounds, the tensor-core score
step's form of the mask) against ``mask.visible`` (the one definition of the mask),
element by element, on random windows, causal, lengths and tile positions, both row
kinds (query rows in the forward and dQ kernels, key rows in dK/dV).  Pure Python: the
simulator's device functions are plain calls."""

from __future__ import annotations

import numpy as np
import pytest

from numba_flash._numba_cuda import SIMULATOR
from numba_flash.kernels import mask

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="calls device functions from Python: the CUDA simulator only")


def _mask_info(rng):
    seqlen_q, seqlen_k = (int(x) for x in rng.integers(0, 40, 2))
    has_left, has_right = (bool(x) for x in rng.integers(0, 2, 2))
    left, right = (int(rng.choice([0, 1, 3, 17, 10**9])) for _ in range(2))
    return (seqlen_q, seqlen_k, seqlen_k - seqlen_q, has_left, left if has_left else 0, has_right,
            right if has_right else 0)  # fmt: skip


@pytest.mark.parametrize("keys_are_rows", [False, True], ids=["query-rows", "key-rows"])
def test_row_span_is_the_mask(rng, keys_are_rows):
    for _ in range(200):
        mi = _mask_info(rng)
        ncols = int(rng.choice([8, 16, 32, 64]))
        col0 = int(rng.integers(0, 3)) * ncols
        for idx in range(0, 48):
            lo, hi = mask.row_span(idx, col0, ncols, mi, keys_are_rows)
            for c in range(ncols):
                q, k = (col0 + c, idx) if keys_are_rows else (idx, col0 + c)
                assert bool(lo <= c < hi) == bool(mask.visible(q, k, mi)), (mi, idx, col0, c, keys_are_rows, lo, hi)

"""mma.sync fragments: where a lane's values sit, shared by the tensor-core kernels.

The fp16/bf16 kernels (``mma.sync`` m16n8k16) and the TF32 kernels (m16n8k8) share the
m16n8 fp32 accumulator layout: lane ``lane`` holds, of each 16 × 8 n-tile, rows
``g = lane >> 2`` and ``g + 8`` and columns ``2t, 2t + 1`` (``t = lane & 3``), as
elements ``e = 0, 1`` (row g) and ``e = 2, 3`` (row g + 8) of 4 consecutive registers.
An accumulator array holds n-tile ``nt`` at ``[base + 4·nt, base + 4·nt + 4)``, so
one row's values in it are ``base + 2·(row half) + 4·nt + e`` (e < 2): the layout
``softmax.online_softmax_row`` is given.

:func:`scores_to_logits` is the kernels' score step on such an accumulator (scale,
then mask the tiles that need it); the ``ldsm_*`` helpers give the shared-memory
address a lane hands to ``ldmatrix`` for the three operand shapes of attention
(``ptx``'s module docstring has the recipes), on 16-bit tiles swizzled as
``copy.SW_16BIT``.
"""

from __future__ import annotations

import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32
from numba_flash.kernels.copy import SW_16BIT, chunk_addr
from numba_flash.kernels.mask import visible

NEG_INF = float32(-math.inf)


@device_function
def acc_row_col(nt, e, lane):
    """(row in the 16-row m-tile, column in the 8·NT columns) of element ``e`` of
    n-tile ``nt`` of an m16n8 accumulator, in lane ``lane``."""
    return (lane >> 2) + 8 * (e >> 1), nt * 8 + 2 * (lane & 3) + (e & 1)


@device_function
def scores_to_logits(acc, S0, NT, row0, col0, scale, needs_mask, mi, KEYS_ARE_ROWS):
    """The score step on NT n-tiles of an accumulator from ``acc[S0]``: multiply by
    ``scale``; then, when ``needs_mask``, −inf where the (query, key) is not visible.
    Rows are ``row0 + ...``, columns ``col0 + ...``: queries and keys, or keys and
    queries when ``KEYS_ARE_ROWS`` (the dK/dV kernels' Sᵀ)."""
    for j in range(NT * 4):
        acc[S0 + j] *= scale
    if needs_mask:
        lane = cuda.threadIdx.x & 31
        for nt in range(NT):
            for e in range(4):
                r, c = acc_row_col(nt, e, lane)
                if KEYS_ARE_ROWS:
                    ok = visible(col0 + c, row0 + r, mi)
                else:
                    ok = visible(row0 + r, col0 + c, mi)
                if not ok:
                    acc[S0 + nt * 4 + e] = NEG_INF


@device_function
def ldsm_a(tile, row0, kk, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4`` of the A fragment (16 rows from ``row0`` × k-slice
    ``kk``, 16 columns) of a row-major [m][k] tile."""
    return chunk_addr(tile, row0 + (lane & 15), 2 * kk + (lane >> 4), ROW_BYTES, SW_16BIT)


@device_function
def ldsm_b(tile, n0, kk, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4`` of the B fragments of two n-tiles (rows ``n0 ..
    n0 + 15``) × k-slice ``kk`` of a row-major [n][k] tile (K in S = Q·Kᵀ):
    registers (b0, b1) of n-tile n0, then of n0 + 8."""
    return chunk_addr(tile, n0 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1), ROW_BYTES, SW_16BIT)


@device_function
def ldsm_bt(tile, k0, nn, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4_trans`` of the B fragments of n-tiles ``2·nn`` and
    ``2·nn + 1`` × the 16 rows from ``k0`` of a row-major [k][n] tile (V in O = P·V)."""
    return chunk_addr(tile, k0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * nn + (lane >> 4), ROW_BYTES, SW_16BIT)


@device_function
def load_a(frag, i, tile, row0, kk, lane, ROW_BYTES):
    """``frag[i:i+4]`` = the A fragment at (``row0``, ``kk``) (:func:`ldsm_a`)."""
    frag[i], frag[i + 1], frag[i + 2], frag[i + 3] = ptx.ldmatrix_x4(ldsm_a(tile, row0, kk, lane, ROW_BYTES))

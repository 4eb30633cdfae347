"""Which tiles a block visits, and which of them need masking (FlashAttention's block_info).

Every kernel first builds the mask info of its (batch, head) with :func:`mask_info`, a
tuple ``(seqlen_q, seqlen_k, diag, causal)`` that the masking step
(:func:`numba_flash.kernels.mask.visible`) and the tile ranges below read, and nothing
else does: a new kind of mask (a window band, per-sequence lengths) changes this
module and ``mask.py``, not the kernels.

Visibility (bottom-right aligned causal, as FlashAttention-2 >= 2.1): query i sees key j
iff ``j < seqlen_k`` and, when causal, ``j <= i + diag`` with ``diag = seqlen_k −
seqlen_q`` (query rows past the end are never written or have lse = +inf).

Tile ranges are half-open ranges of tile indices: a query tile of ``BLOCK_M`` rows from
``start_m`` visits key tiles ``[n_lo, n_hi)`` of ``BLOCK_N`` keys (:func:`key_tiles`);
a key tile of ``BLOCK_N`` keys from ``start_n`` is seen by query tiles ``[m_lo, m_hi)``
of ``BLOCK_M`` rows (:func:`query_tiles`, the dK/dV kernels' walk).  Tiles outside
are never loaded.  Inside the range, :func:`tile_needs_mask` tells the tiles that hold
an invisible (query, key) pair from those that can skip the masking step.
"""

from __future__ import annotations

from numba_flash._numba_cuda import cuda, device_function


@device_function
def mask_info(q, k, causal):
    """``(seqlen_q, seqlen_k, diag, causal)`` of the (batch, head) a block works on;
    ``q``, ``k`` are (B, N, H, d) arrays (any element type), ``causal`` a compile-time
    bool."""
    seqlen_q = q.shape[1]
    seqlen_k = k.shape[1]
    return seqlen_q, seqlen_k, seqlen_k - seqlen_q, causal


@device_function
def this_block(q, k, BLOCK, causal):
    """``(start, b, h, mi, seqlen_q, seqlen_k)`` of the block: the first of the BLOCK
    rows it owns (blockIdx.x), its batch (blockIdx.z) and head (blockIdx.y), and the
    mask info of that (batch, head) with its two sequence lengths.  The query-head to
    KV-head map of grouped-query attention belongs here."""
    mi = mask_info(q, k, causal)
    return cuda.blockIdx.x * BLOCK, cuda.blockIdx.z, cuda.blockIdx.y, mi, mi[0], mi[1]


@device_function
def key_tiles(start_m, BLOCK_M, BLOCK_N, mi):
    """Key tiles ``[n_lo, n_hi)`` (of BLOCK_N keys) that query rows ``start_m ..
    start_m + BLOCK_M − 1`` see: causal stops after the tile holding key
    ``start_m + BLOCK_M − 1 + diag``."""
    seqlen_q, seqlen_k, diag, causal = mi
    end_n = seqlen_k
    if causal:
        end_n = min(seqlen_k, max(0, start_m + BLOCK_M + diag))
    return 0, (end_n + BLOCK_N - 1) // BLOCK_N


@device_function
def query_tiles(start_n, BLOCK_M, mi):
    """Query tiles ``[m_lo, m_hi)`` (of BLOCK_M rows) that see any of the keys from
    ``start_n``: causal starts at the tile holding query ``start_n − diag``."""
    seqlen_q, seqlen_k, diag, causal = mi
    m_lo = 0
    if causal:
        m_lo = min(seqlen_q, max(0, start_n - diag)) // BLOCK_M
    return m_lo, (seqlen_q + BLOCK_M - 1) // BLOCK_M


@device_function
def tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi):
    """False when every (query, key) of the tile is visible (``mask.visible``): it ends
    inside the keys and, when causal, lies wholly on or below the diagonal."""
    seqlen_q, seqlen_k, diag, causal = mi
    needs = start_n + BLOCK_N > seqlen_k
    if causal:
        needs = needs or start_n + BLOCK_N - 1 > start_m + diag
    return needs

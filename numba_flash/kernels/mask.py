"""Element masking: which (query, key) pairs take part, one score at a time.

:func:`visible` is the only definition of the mask in the kernels (its tile-level
counterparts, which tiles to visit and which need masking, are in ``block_info``).
:func:`masked_score` is the step every kernel applies to a score that may be
invisible: the score, or −inf (``exp`` of it is exactly 0, in the forward's online
softmax and in the backward's recomputation of P alike).  :func:`row_span` is the same
mask for a whole row of a tile at once, for the tensor-core score step: the columns
of the row that :func:`visible` accepts, as two int32 bounds (per element, two
compares with constants instead of the 64-bit index arithmetic).
"""

from __future__ import annotations

import math

from numba_flash._numba_cuda import device_function, float32, int32

NEG_INF = float32(-math.inf)


@device_function
def visible(q_idx, k_idx, mi):
    """True when query ``q_idx`` sees key ``k_idx`` under the mask info ``mi``
    (``block_info.mask_info``): the key is in range, ``k_idx <= q_idx + diag + right``
    when the right side is bounded (causal: right = 0) and ``k_idx >= q_idx + diag −
    left`` when the left side is.  Query rows past the end need no check: the forward
    and dQ kernels never write them, and the dK/dV kernels drop them in
    ``softmax.softmax_grad`` (``keep``), so they add exactly nothing."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    ok = k_idx < seqlen_k
    if has_right:
        ok = ok and k_idx <= q_idx + diag + right
    if has_left:
        ok = ok and k_idx >= q_idx + diag - left
    return ok


@device_function
def masked_score(x, q_idx, k_idx, mi):
    """``x`` where query ``q_idx`` sees key ``k_idx``, else −inf."""
    return x if visible(q_idx, k_idx, mi) else NEG_INF


@device_function
def row_span(idx, col0, NCOLS, mi, KEYS_ARE_ROWS):
    """``(lo, hi)``, int32: column ``col0 + c`` (0 <= c < NCOLS) of the tile row of
    index ``idx`` is visible (:func:`visible`) iff ``lo <= c < hi``.  The row is query
    ``idx`` and the columns keys, or (``KEYS_ARE_ROWS``) key ``idx`` and the columns
    queries; either way the bounds are clamped to [−1, NCOLS + 1], so they fit an
    int32 whatever the window.  Query rows past the end are not checked (as
    :func:`visible`)."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    lo = -1
    hi = NCOLS + 1
    if KEYS_ARE_ROWS:  # key idx: queries q with idx − diag − right <= q <= idx − diag + left
        if has_right:
            lo = max(lo, idx - diag - right - col0)
        if has_left:
            hi = min(hi, idx - diag + left + 1 - col0)
        if idx >= seqlen_k:
            hi = -1
    else:  # query idx: keys k with idx + diag − left <= k <= idx + diag + right, k < seqlen_k
        hi = min(hi, seqlen_k - col0)
        if has_right:
            hi = min(hi, idx + diag + right + 1 - col0)
        if has_left:
            lo = max(lo, idx + diag - left - col0)
    return int32(max(-1, min(lo, NCOLS + 1))), int32(max(-1, min(hi, NCOLS + 1)))

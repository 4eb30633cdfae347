"""Element masking: which (query, key) pairs take part, one score at a time.

:func:`visible` is the only definition of the mask in the kernels (its tile-level
counterparts, which tiles to visit and which need masking, are in ``block_info``).
:func:`masked_score` (:func:`masked`, with the block mask's ``mask_mod``) is the
step every kernel applies to a score that may be invisible: the score, or −inf (``exp`` of it is exactly 0, in the forward's online
softmax and in the backward's recomputation of P alike).
"""

from __future__ import annotations

import math

from numba_flash._numba_cuda import device_function, float32
from numba_flash.kernels import flex
from numba_flash.variant import MASK_MOD

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
def masked(x, q_idx, k_idx, needs_mask, partial, si, mi, F):
    """``x``, or −inf where the built-in masks hide the element (checked on tiles
    that ``needs_mask``, ``block_info.tile_needs_mask``) or the block mask's
    ``mask_mod`` does (on its ``partial`` tiles, ``flex.mod_visible``)."""
    ok = True
    if needs_mask:
        ok = visible(q_idx, k_idx, mi)
    if F[MASK_MOD] and partial:
        ok = ok and flex.mod_visible(q_idx, k_idx, si, mi, F)
    return x if ok else NEG_INF

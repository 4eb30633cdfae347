"""Element masking: which (query, key) pairs take part, one score at a time.

:func:`visible` is the only definition of the mask in the kernels (its tile-level
counterparts, which tiles to visit and which need masking, are in ``block_info``).
:func:`masked_score` (:func:`masked`, with the block mask's ``mask_mod``) is the
step every kernel applies to a score that may be invisible: the score, or −inf (``exp`` of it is exactly 0, in the forward's online
softmax and in the backward's recomputation of P alike).

The tensor-core kernels' score step (``fragments.element_visible``: the forwards and
dQ, where a fragment's rows are queries; ``fragments.element_visible_any`` in the
backward's per-element pass, dK/dV's Sᵀ included) asks the same question through a lane's
*frame* (:func:`frame`, :func:`visible_at`): an accumulator fragment's elements are
``(q0 + dq, k0 + dk)``, one (q0, k0) a lane and tile and compile-time offsets dq, dk
of at most a few hundred, so each bound of :func:`visible` becomes one 32-bit integer
a tile, compared with an immediate an element.  The frame is :func:`visible`
rewritten, not a second mask: ``k ≤ q + diag + right`` is ``(q0 + diag + right − k0)
≥ dk − dq``, ``k ≥ q + diag − left`` is ``(q0 + diag − left − k0) ≤ dk − dq`` and
``k < seqlen_k`` is ``(seqlen_k − k0) > dk``; clamped to int32 the left-hand sides keep
every such comparison's answer (tests/test_variants.py checks it against
:func:`visible`).  With 64-bit indices compared an element, a masked tile cost the
Hopper forward's key loop 342 instructions more than an unmasked one at d = 128 causal
(200 with the frame; 481 against 280 with a window), and the d = 64 causal softcap
forward spilled 224 bytes in it (none with the frame): ``scripts/sass_mix.py
assemble_masks``, docs/benchmarks/2026-12-05-s28.
"""

from __future__ import annotations

import math

from numba_flash._numba_cuda import device_function, float32, int32
from numba_flash.kernels import flex
from numba_flash.variant import MASK_MOD

NEG_INF = float32(-math.inf)
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


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
def _int32(x):
    """``x`` clamped into int32's range, as an int32: its comparison with an offset
    of a few hundred keeps its answer."""
    return int32(min(max(x, INT32_MIN), INT32_MAX))


@device_function
def frame(q0, k0, mi):
    """The built-in masks of the elements ``(q0 + dq, k0 + dk)`` (the module
    docstring): ``(q0 + diag + right − k0, q0 + diag − left − k0, seqlen_k − k0)``
    as int32, for :func:`visible_at`."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    base = q0 + diag - k0
    return _int32(base + right), _int32(base - left), _int32(seqlen_k - k0)


@device_function
def visible_at(fr, dq, dk, mi):
    """:func:`visible` of query ``q0 + dq`` and key ``k0 + dk``, from
    ``fr = frame(q0, k0, mi)``; ``dq`` and ``dk`` compile-time offsets (|dk − dq| and
    dk below 2**31 / 2): one 32-bit compare with an immediate a bound."""
    hi, lo, room = fr
    has_left, has_right = mi[3], mi[5]
    ok = room > int32(dk)
    if has_right:
        ok = ok and hi >= int32(dk - dq)
    if has_left:
        ok = ok and lo <= int32(dk - dq)
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
    return masked_if(x, ok, q_idx, k_idx, partial, si, mi, F)


@device_function
def masked_if(x, ok, q_idx, k_idx, partial, si, mi, F):
    """:func:`masked` with the built-in masks' answer given (``ok``: :func:`visible`,
    :func:`visible_at`, or True on a tile that needs no mask)."""
    if F[MASK_MOD] and partial:
        ok = ok and flex.mod_visible(q_idx, k_idx, si, mi, F)
    return x if ok else NEG_INF

"""FlexAttention's step: the user's ``score_mod`` and ``mask_mod``, inlined into every kernel.

A call with ``score_mod`` or a ``block_mask`` (``numba_flash.flex``) compiles each
kernel with the user's plain Python functions as numba device functions, inlined
(``Variant.mods``; the kernels' ``F`` holds them at ``SCORE_FN``, ``GRAD_FN``,
``MASK_FN``, and :data:`NO_MOD`, never called, where one is absent).  Per element,
after the built-in score step (scale, softcap, ALiBi: ``kernels.score``)::

    x = score_mod(x, b, h, q_idx, kv_idx, *score_args)          every visited tile
    visible = mask_mod(b, h, q_idx, kv_idx, *mask_args)          PARTIAL tiles only

in natural units (the tensor-core kernels, whose softmax is in the log2 domain, keep
the built-in step natural when there is a score_mod, and fold log2(e) into the
exponent's FFMA: ``softmax.FOLD``).  The backward multiplies dS by
``score_mod_grad(x, b, h, q_idx, kv_idx, *score_args)`` (∂score_mod/∂score at the
same x).  ``b`` is the batch index, ``h`` the query head; indices are the positions
in the sequences.

The run-time side is one kernel parameter, ``fx`` (``numba_flash.flex.flex_buffers``):
``(score_args, mask_args, count, visit, count_t, visit_t, order, pages, split)``, the user's
``mod_args`` of ``score_mod`` and of the block mask's ``mask_mod``, the block-sparse
visit lists that ``block_info.walk_list`` reads (query-major for the forward and dQ,
key-major ``_t`` for dK/dV), and the order in which the launch's blocks take the row
tiles, longest list first (``block_info.block_coords``); then two entries of
``numba_flash.kvcache``'s calls: the cache's block table and a split's key tiles
(``Variant.paged``, ``Variant.split``; dummies otherwise).  Head info (``score.score_info``) carries ``(b, h, fx)``
as its last three entries, so every step that has ``si`` can call the user's
functions.
"""

from __future__ import annotations


from numba_flash._numba_cuda import device_function, float32
from numba_flash.variant import GRAD_FN, MASK_FN, SCORE_FN, SCORE_MOD

SEQ, HEAD, FX = 4, 5, 6  # where score_info keeps (b, h, fx)
SCORE_ARGS, MASK_ARGS, COUNT, VISIT, COUNT_T, VISIT_T, ORDER = range(7)  # positions in fx
PAGES, SPLIT_AT = 7, 8  # a KV cache's block table (B, pages); split-KV's int32 (key tiles a split, sequences,
# GQA decode swap's group or 0, merged in the kernel 1 or 0, row tiles a sequence) (kvcache)
OUT_MERGED, LSE_MERGED, ARRIVALS = 9, 10, 11  # split-KV merged in the kernel: out, lse, and a counter a row tile


def _no_mod(*args):
    return args[0]


#: The stand-in for an absent user function (a call without mods: never called).
NO_MOD = device_function(_no_mod)


@device_function
def in_sequences(q_idx, k_idx, mi):
    """``(q, k, inside)``: the indices clamped into the sequences (``mi``'s lengths) and
    whether they were there.  The user's functions are called with the clamped ones
    on every element and their result kept only ``inside``: no branch per element, so
    the loads a function makes (a document id, a bias table) are issued together
    rather than one after another, and its indices are always in range, as
    FlexAttention's."""
    inside = (q_idx < mi[0]) & (k_idx < mi[1])
    return max(0, min(q_idx, mi[0] - 1)), max(0, min(k_idx, mi[1] - 1)), inside


@device_function
def modded(x, q_idx, k_idx, si, mi, GRAD, F):
    """``(score_mod(x), score_mod_grad(x))`` of the element (query ``q_idx``, key
    ``k_idx``) with ``x`` the built-in step's score, in natural units (with a
    score_mod, ``score.score_info`` keeps them natural, and the log2-domain kernels'
    softmax takes them so: ``softmax.FOLD``); the derivative only when ``GRAD`` (the
    backward), else 1.  ``(x, 1)`` without score_mod, and for the padding past the
    sequences (masked or never written: :func:`in_sequences`)."""
    if F[SCORE_MOD]:
        q, k, inside = in_sequences(q_idx, k_idx, mi)
        args = si[FX][SCORE_ARGS]
        dy = float32(1.0)
        if GRAD:
            dy = float32(F[GRAD_FN](x, si[SEQ], si[HEAD], q, k, *args))
        y = float32(F[SCORE_FN](x, si[SEQ], si[HEAD], q, k, *args))
        if inside:
            return y, dy
    return x, float32(1.0)


@device_function
def mod_visible(q_idx, k_idx, si, mi, F):
    """The block mask's ``mask_mod`` on (``q_idx``, ``k_idx``), for the elements of its
    PARTIAL tiles (the callers check the tile); False past the sequences' ends
    (``mi``; :func:`in_sequences`)."""
    q, k, inside = in_sequences(q_idx, k_idx, mi)
    return inside & bool(F[MASK_FN](si[SEQ], si[HEAD], q, k, *si[FX][MASK_ARGS]))

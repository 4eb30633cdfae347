"""The score step: from ``s = q·k`` to the score the softmax sees (scale, softcap, ALiBi).

Per element, for query ``i`` and key ``j`` of a sequence (``diag = Nk − Nq``)::

    x = scale · s                               plain
    x = c · tanh(scale · s / c)                 softcap c > 0 (FlashAttention-2's order:
                                                the cap first, then the bias)
    x = x − slope · |i + diag − j|              ALiBi, slope of (batch, query head)

In the log2 domain (``LOG2``: the tensor-core kernels, which exponentiate with ``ex2``)
every term is multiplied by log2(e) once, folded into the constants of
:func:`score_info`: ``si = (mul, cap, slope, inv_cap)`` with ``x = s · mul`` (plain) or
``x = cap · tanh(s · mul)`` (softcap), then ``x − slope·|i + diag − j|``.  With
``softmax.CAPPED`` (the wgmma forward's softcap) x stays in tanh units, ``x = tanh(s ·
mul) − (slope / cap)·|i + diag − j|``, and ``cap`` (times log2 e) is the softmax's
exponent factor: the FFMA it runs anyway multiplies by it.  Without softcap, CAPPED means raw
scores (``softmax.raw_scores``: the wgmma forward): ``x = s``, ``mul = 1``, the scale
(times log2 e) in ``cap`` and ALiBi's slope over the scale.  The row-group
kernels hold ``scale · q`` and so start from ``scale · s`` (:func:`prescaled`).

The backward needs ∂x/∂(scale·s): ``1 − tanh²`` with softcap (:func:`softcap_grad`),
else 1; the kernels multiply dS by it before the usual ``scale ·`` of dQ and dK.

Masking (−inf) comes after this step (``mask.masked_score``).  The tensor-core kernels
take ``tanh.approx`` (``ptx.tanh_approx``, as FlashAttention-2), the exact fp32
kernels IEEE ``tanhf``.
"""

from __future__ import annotations

import math

from numba_flash import ptx
from numba_flash._numba_cuda import device_function, float32
from numba_flash.kernels import dropout, flex, mask
from numba_flash.kernels.softmax import CAPPED, FOLD, LOG2E, LOG2E_F32
from numba_flash.variant import ALIBI, CAUSAL, SCORE_MOD, SOFTCAP, SOFTCAP_VALUE


@device_function
def score_info(params, alibi, fx, seq, h, scale, LOG2, F):
    """``(mul, cap, slope, inv_cap, seq, h, fx)`` of query head ``h`` of sequence
    ``seq`` (``alibi`` is (B, H) float32 slopes, or (1, H) for every sequence alike:
    ``_arrays.alibi_rows``; read only with ALiBi) for the softmax
    scale ``scale``; the last three are FlexAttention's (``kernels.flex``: the user's
    functions take (b, h) and read ``fx``)."""
    # a user's score_mod takes natural units: then the step stays natural, and the
    # log2-domain softmax folds log2(e) into its exponent (softmax.FOLD)
    LOG2_HERE = LOG2 and not F[SCORE_MOD]
    log2e = float32(LOG2E) if LOG2_HERE else float32(1.0)
    if F[SOFTCAP]:
        mul = float32(scale / params[SOFTCAP_VALUE])
        cap = float32(params[SOFTCAP_VALUE]) * log2e
        inv_cap = float32(1.0 / params[SOFTCAP_VALUE])
    elif LOG2 == CAPPED:  # raw scores: the scale (times log2 e) is the exponent's factor; scale > 0
        mul = float32(1.0)
        cap = float32(scale * LOG2E)
        inv_cap = float32(1.0 / scale)  # raw_scores: scale > 0
    else:
        mul = float32(scale * LOG2E) if LOG2_HERE else float32(scale)
        cap = float32(1.0)
        inv_cap = float32(1.0)
    slope = float32(0.0)
    if F[ALIBI]:  # CAPPED: in tanh units, slope / cap (the cap·log2 e is the softmax's exponent factor)
        slope = alibi[seq if alibi.shape[0] > 1 else 0, h] * (inv_cap if LOG2 == CAPPED else log2e)
    return mul, cap, slope, inv_cap, seq, h, fx


@device_function
def backward_domain(F):
    """The tensor-core backward's score domain (``softmax``'s LOG2 values): FOLD with a
    user's score_mod (natural units), CAPPED with softcap (tanh units, the cap in the
    exponent's FFMA, as the wgmma forward), else 1 (log2 units).  The kernels pass
    it to :func:`head_info` and ``fragments.p_and_ds`` reads it: the two agree."""
    if F[SCORE_MOD]:
        return FOLD
    if F[SOFTCAP]:
        return CAPPED
    return 1


@device_function
def exponent_factor(si, LOG2):
    """The softmax's exponent factor (``softmax``'s ``fold``) for the score constants
    ``si``: the cap times log2(e) with CAPPED (:func:`score_info` keeps it in ``si[1]``),
    else log2(e) (FOLD's; unused in the other domains)."""
    if LOG2 == CAPPED:
        return si[1]
    return LOG2E_F32


@device_function
def head_info(params, alibi, fx, seq, h, scale, mi, LOG2, F):
    """``(si, di)``: the score step's constants (:func:`score_info`) and dropout's
    (``dropout.dropout_info``) for query head ``h`` of sequence ``seq``."""
    return score_info(params, alibi, fx, seq, h, scale, LOG2, F), dropout.dropout_info(params, seq, h, mi)


@device_function
def _tanh(x, LOG2):
    if LOG2:
        return ptx.tanh_approx(x)
    return math.tanh(x)


@device_function
def _capped(arg, si, LOG2):
    """``(cap · t, 1 − t²)`` with ``t = tanh(arg)``: the softcap and its derivative
    (``(t, ·)`` with CAPPED: the softmax multiplies by the cap in its exponent)."""
    t = _tanh(arg, LOG2)
    if LOG2 == CAPPED:
        return t, float32(1.0) - t * t
    return si[1] * t, float32(1.0) - t * t


@device_function
def softcap_grad(s, si, LOG2, F):
    """``(x, dx)``: the index-free part of the step, ``s · mul`` or ``cap · tanh(s ·
    mul)``, and its derivative with respect to ``scale · s`` (``1 − tanh²``; 1 without
    softcap)."""
    if F[SOFTCAP]:
        return _capped(s * si[0], si, LOG2)
    if LOG2 == CAPPED:  # raw scores (score_info)
        return s, float32(1.0)
    return s * si[0], float32(1.0)


@device_function
def scaled(s, si, LOG2, F):
    """:func:`softcap_grad` without the derivative (the forward's step)."""
    return softcap_grad(s, si, LOG2, F)[0]


@device_function
def prescaled(x, si, F):
    """:func:`softcap_grad` from ``x = scale · s`` (natural domain: the row-group
    kernels hold ``scale · q``): ``cap · tanh(x / cap)``, or ``(x, 1)``."""
    if F[SOFTCAP]:
        return _capped(x * si[3], si, False)
    return x, float32(1.0)


@device_function
def alibi(x, dist, si, F):
    """``x − slope · |dist|`` with ALiBi (``dist = q_idx + diag − k_idx`` as a float),
    else ``x``."""
    if F[ALIBI]:
        return x - si[2] * abs(dist)
    return x


@device_function
def column_frame(F):
    """True when the forward takes ALiBi in the column frame (:func:`frame_max`):
    causal, so every visible key has ``j ≤ i + diag`` and the bias
    ``−slope·(i + diag − j)`` is a column term ``slope·(j − r − diag)`` less a row
    term ``slope·(i − r)`` for any reference row r; the row term is the same for all of
    a row's keys, so the softmax does not see it and the forward adds it back to the
    row's max once, in the epilogue.  The bias then costs one FFMA a column, shared by
    a lane's rows, instead of one an element (FlashAttention-2 adds ``slope·j`` alone
    with causal, as here).  Not with a ``score_mod``, which must see the true score;
    the backward recomputes P from the true score and lse."""
    return F[ALIBI] and F[CAUSAL] and not F[SCORE_MOD]


@device_function
def frame_max(m, si, off, FRAME):
    """A row's running max ``m`` in true units, from the column frame's (``FRAME``:
    :func:`column_frame` was on in the forward's score step) for a row ``off`` rows
    below its frame's reference row: ``m − slope·off``.  −inf stays −inf."""
    if FRAME:
        return m - si[2] * float32(off)
    return m


@device_function
def biased(x, q_idx, k_idx, diag, si, F):
    """:func:`alibi` of query ``q_idx`` and key ``k_idx``."""
    return alibi(x, float32(q_idx + diag - k_idx), si, F)


@device_function
def needs_indices(F):
    """True when the step reads the (query, key) of every element (ALiBi, a user's
    ``score_mod``), so the kernels walk the indices of every tile, not only of those
    that need a mask."""
    return F[ALIBI] or F[SCORE_MOD]


@device_function
def index_step(x, q_idx, k_idx, diag, needs_mask, partial, si, mi, GRAD, F):
    """``(x, dx)``: the step's part that reads the element's (query, key): ALiBi
    (:func:`biased`), the user's ``score_mod`` (``flex.modded``, dx its derivative,
    only when ``GRAD``), then −inf where the element is masked: by the built-in
    masks on tiles that ``needs_mask``, by the block mask's ``mask_mod`` on
    ``partial`` ones (``mask.masked``)."""
    ok = True
    if needs_mask:
        ok = mask.visible(q_idx, k_idx, mi)
    return index_step_if(x, ok, q_idx, k_idx, diag, partial, si, mi, GRAD, F)


@device_function
def index_step_if(x, ok, q_idx, k_idx, diag, partial, si, mi, GRAD, F):
    """:func:`index_step` with the built-in masks' answer given (``ok``:
    ``mask.visible_at`` in the tensor-core kernels' fragments, True on a tile that
    needs no mask)."""
    x = biased(x, q_idx, k_idx, diag, si, F)
    x, dx = flex.modded(x, q_idx, k_idx, si, mi, GRAD, F)
    return mask.masked_if(x, ok, q_idx, k_idx, partial, si, mi, F), dx

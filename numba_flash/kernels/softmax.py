"""The online softmax, its finalize and the backward's recomputation of P.

Per query row i, over the key tiles a block visits (FlashAttention, Algorithm 1)::

    m_new = max(m_i, rowmax(S_tile))                 online_rescale
    alpha = exp(m_i − m_new)                         rescales what came before
    P     = exp(S_tile − m_new),  l_i = alpha·l_i + rowsum(P),  acc = alpha·acc (+ P·V)
    ...after the last tile:  O = acc / l_i,  lse = m_i + log(l_i)      finalize

and in the backward, with the forward's lse (``lse_for_recompute``)::

    P  = exp(S − lse),  dS = P ∘ (dP − delta)        softmax_grad

``LOG2`` (a compile-time value) selects the domain: the tensor-core kernels fold
log2(e) into the softmax scale and use ``ex2.approx`` (``lse = m·ln 2 + ln l``); the
exact fp32 kernels use IEEE ``expf`` in the natural domain (False).  ``LOG2 == FOLD``:
scores in natural units (a user's score_mod takes and returns them) and ``ex2.approx``
with log2(e) folded into the exponent, ``2^(x·log2e − m·log2e)``, one FFMA as the plain
kernels' subtraction (FlashAttention-2's form); m_i natural, ``lse = m + ln l``.
``LOG2 == CAPPED``: the same FFMA with a run-time factor ``fold`` (softcap's ``cap·log2e``):
scores are ``t = tanh(scale·s / cap)`` (less ALiBi over cap), m_i is in those units and
``lse = m·fold·ln 2 + ln l``; the softcap then costs its ``tanh`` alone, not also a
multiply an element (``score.score_info``).  A row's values may be
spread over ``LANES`` consecutive lanes of a warp (a power of two ≤ 32: 4 for an mma
accumulator's quad, TX for a register-blocked micro-tile, G for a row group); its max
and sum are finished with butterfly shuffles (:func:`allreduce_max`, :func:`allreduce_sum`).

Register arrays (``cuda.local.array``) are passed with the compile-time offsets and
strides of one row's values in them; the functions are inlined, so with constant
indices the arrays stay in registers.

Non-finite inputs propagate as in a standard attention: a NaN or +inf score makes its
row NaN (``exp(inf − inf)``), and only a row with no visible key (``l_i == 0``) is
defined as O = 0, lse = −inf.
"""

from __future__ import annotations

import math
import os

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32
from numba_flash.kernels.mask import NEG_INF

POS_INF = float32(math.inf)
NEG_ZERO = float32(-0.0)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FULL_MASK = 0xFFFFFFFF
FOLD = 2  # the LOG2 value of natural-unit scores exponentiated with ex2 (module docstring)
CAPPED = 3  # the LOG2 value of softcap's tanh units, exponentiated with a run-time factor (module docstring)
LOG2E_F32 = float32(LOG2E)


@device_function
def allreduce_max(x, LANES):
    """Max of ``x`` over each group of ``LANES`` consecutive lanes, in every lane."""
    for i in range(5):  # offsets 16, 8, 4, 2, 1: those below LANES remain once inlined
        off = 16 >> i
        if off < LANES:
            x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, off))
    return x


@device_function
def allreduce_sum(x, LANES):
    """Sum of ``x`` over each group of ``LANES`` consecutive lanes, in every lane."""
    for i in range(5):
        off = 16 >> i
        if off < LANES:
            x += cuda.shfl_xor_sync(FULL_MASK, x, off)
    return x


@device_function
def softmax_exp(x, LOG2):
    """``2**x`` (``ex2.approx``) in the log2 domain, else IEEE ``expf``."""
    if LOG2:
        return ptx.ex2_approx(x)
    return math.exp(x)


@device_function
def online_rescale(m_old, row_max, LOG2, fold=LOG2E_F32):
    """``(m_new, m_use, alpha)``: the new running max, the max the tile's P is taken
    against (0 while the row has seen no visible key: no −inf − −inf), and the factor
    ``exp(m_old − m_use)`` that rescales l_i and acc (``fold``: FOLD's and CAPPED's
    factor into the log2 domain)."""
    m_new = max(m_old, row_max)
    m_use = m_new if m_new != NEG_INF else float32(0.0)
    if LOG2 == FOLD or LOG2 == CAPPED:
        return m_new, m_use, ptx.ex2_approx((m_old - m_use) * fold)
    return m_new, m_use, softmax_exp(m_old - m_use, LOG2)


@device_function
def online_softmax_row(s, S0, S_STEP, S_N, S_PAIR, acc, O0, O_STEP, O_N, O_PAIR, m_i, l_i, r, LANES, LOG2):
    """One tile's online-softmax step for row ``r`` (``m_i[r]``, ``l_i[r]``).

    The row's scores (scaled, masked to −inf) are ``s[S0 + n·S_STEP + e]`` for
    ``n < S_N``, ``e < S_PAIR`` in this lane; they become ``P = exp(s − m_new)`` in
    place.  Its accumulator entries ``acc[O0 + n·O_STEP + e]`` (``n < O_N``,
    ``e < O_PAIR``) are rescaled by alpha; ``l_i[r]`` stays this lane's part of the
    row sum (``finalize`` adds the LANES parts).  ``softmax_row_step`` then
    ``rescale_row``."""
    alpha = softmax_row_step(s, S0, S_STEP, S_N, S_PAIR, m_i, l_i, r, LANES, LOG2)
    rescale_row(acc, O0, O_STEP, O_N, O_PAIR, alpha)


@device_function
def softmax_row_step(s, S0, S_STEP, S_N, S_PAIR, m_i, l_i, r, LANES, LOG2, fold=LOG2E_F32):
    """``online_softmax_row`` without touching the accumulator: P in place of the
    row's scores, ``m_i[r]`` and ``l_i[r]`` updated, and alpha returned for
    ``rescale_row`` (a kernel whose accumulator is still being written by an
    asynchronous P·V rescales it after that completes).  ``fold``: the exponent's
    factor with FOLD (log2 e) and CAPPED (softcap's cap·log2 e).  (FlashAttention-4's
    ex2 emulated on the FMA pipe and lazy rescaling, timed slower / no faster here in
    sessions 17 and 29, were removed in session 37.)"""
    mx = NEG_INF
    for n in range(S_N):
        for e in range(S_PAIR):
            mx = max(mx, s[S0 + n * S_STEP + e])
    m_new, m_use, alpha = online_rescale(m_i[r], allreduce_max(mx, LANES), LOG2, fold)
    m_i[r] = m_new
    m_scaled = m_use * fold  # FOLD's and CAPPED's
    row_sum = NEG_ZERO  # −0 + x is x: the first add folds away
    for n in range(S_N):
        part = NEG_ZERO  # a pair's sum first: shorter dependency chains
        for e in range(S_PAIR):
            if LOG2 == FOLD or LOG2 == CAPPED:  # one FFMA
                p = ptx.ex2_approx(s[S0 + n * S_STEP + e] * fold - m_scaled)
            else:
                p = softmax_exp(s[S0 + n * S_STEP + e] - m_use, LOG2)
            s[S0 + n * S_STEP + e] = p
            part += p
        row_sum += part
    l_i[r] = l_i[r] * alpha + row_sum
    return alpha


@device_function
def rescale_row(acc, O0, O_STEP, O_N, O_PAIR, alpha):
    """A row's accumulator entries ``acc[O0 + n·O_STEP + e]`` times alpha."""
    for n in range(O_N):
        for e in range(O_PAIR):
            acc[O0 + n * O_STEP + e] *= alpha


@device_function
def start_rows(acc_o, O_REGS, m_i, l_i, ROWS):
    """The online softmax's state before the first key tile: acc = 0 (``O_REGS``
    floats), m_i = −inf and l_i = 0 for the lane's ``ROWS`` rows."""
    for x in range(O_REGS):
        acc_o[x] = float32(0.0)
    for r in range(ROWS):
        m_i[r] = NEG_INF
        l_i[r] = float32(0.0)


@device_function
def finalize(m, l_part, LANES, LOG2, fold=LOG2E_F32):
    """``(inv_l, lse)`` of a row after its last tile, from its max and this lane's part
    of the row sum: ``O = acc · inv_l``.  A row that saw no visible key (``l == 0``)
    gets ``inv_l = 0`` and ``lse = −inf``; a NaN sum stays NaN in both."""
    l_row = allreduce_sum(l_part, LANES)
    if l_row == float32(0.0):
        return float32(0.0), NEG_INF
    if LOG2 == CAPPED:  # m in tanh units: natural m·cap = m·fold·ln 2
        return float32(1.0) / l_row, m * fold * float32(LN2) + math.log(l_row)
    if LOG2 and LOG2 != FOLD:
        return float32(1.0) / l_row, m * float32(LN2) + math.log(l_row)
    return float32(1.0) / l_row, m + math.log(l_row)


@device_function
def lse_for_recompute(lse, LOG2):
    """A row's saved lse as the backward subtracts it from a scaled score: times
    log2(e) in the log2 domain, and +inf for a row that saw no key (lse = −inf), so
    that every P of that row is exactly 0 (including the −inf of masked scores)."""
    if lse == NEG_INF:
        return POS_INF
    if LOG2:
        return lse * float32(LOG2E)
    return lse


@device_function
def softmax_p(s, lse_r, keep, LOG2, fold=LOG2E_F32):
    """``p = exp(s − lse_r)`` of one element (:func:`softmax_grad`'s P), exactly 0 where not
    ``keep``."""
    if LOG2 == FOLD or LOG2 == CAPPED:
        p = ptx.ex2_approx(s * fold - lse_r)
    else:
        p = softmax_exp(s - lse_r, LOG2)
    if keep:
        return p
    return float32(0.0)


@device_function
def softmax_ds(p, dp, delta, keep):
    """``ds = p·(dp − delta)`` of one element (:func:`softmax_grad`'s dS, from its
    :func:`softmax_p`), exactly 0 where not ``keep`` (even for an infinite dp)."""
    if keep:
        return p * (dp - delta)
    return float32(0.0)


@device_function
def softmax_grad(s, dp, lse_r, delta, keep, LOG2, fold=LOG2E_F32):
    """``(p, ds)`` of one element: ``p = exp(s − lse_r)`` recomputed from the scaled,
    masked score ``s`` and the row's ``lse_for_recompute``, ``ds = p·(dp − delta)``;
    exactly (0, 0) where not ``keep``: the padding rows past the end of the queries in
    the dK/dV kernels, whose zero-filled Q and dO make NaN of an infinite K or V (0·inf)
    and must add nothing to dK and dV.  ``fold``: FOLD's and CAPPED's exponent factor.
    :func:`softmax_p` then :func:`softmax_ds` (the Hopper backward's pipelined step calls
    them apart: P before it waits for dP)."""
    p = softmax_p(s, lse_r, keep, LOG2, fold)
    return p, softmax_ds(p, dp, delta, keep)


@device_function
def row_stats(lse, delta, b, h, row, seqlen_q, LOG2):
    """``(lse_for_recompute, delta)`` of query ``row`` of (b, h); a row past the end gets
    (+inf, 0), so that its P and dS are exactly 0."""
    if row < seqlen_q:
        return lse_for_recompute(lse[b, h, row], LOG2), delta[b, h, row]
    return POS_INF, float32(0.0)


@device_function
def stage_row_stats(dst, LSE_AT, DELTA_AT, lse, delta, b, h, row0, seqlen_q, tid, ROWS, THREADS, LOG2):
    """:func:`row_stats` of query rows ``row0 .. row0 + ROWS − 1`` into the shared
    array ``dst`` (at ``LSE_AT + r`` and ``DELTA_AT + r``), for the kernels that walk
    query tiles (dK/dV); the caller's barrier makes them visible."""
    for r in range(tid, ROWS, THREADS):
        dst[LSE_AT + r], dst[DELTA_AT + r] = row_stats(lse, delta, b, h, row0 + r, seqlen_q, LOG2)


def domain(variant, capped=False):
    """The ``LOG2`` of a log2-domain kernel compiled for ``variant`` (host side):
    ``FOLD`` with a user's score_mod (natural-unit scores); ``CAPPED`` with softcap or
    raw scores (:func:`raw_scores`) when the kernel passes the factor (``capped``: the
    wgmma forward); else True."""
    mods = variant.mods
    if mods is not None and mods.score_fn is not None:
        return FOLD
    return CAPPED if capped and (variant.softcap or raw_scores(variant)) else True


def raw_scores_allowed(variant) -> bool:
    """The scores may stay raw: a positive scale (the raw max is then the scaled max)
    and ``NUMBA_FLASH_RAW_SCORES`` not 0 (:func:`raw_scores`,
    ``wgmma_forward.alibi_on_products``)."""
    return os.environ.get("NUMBA_FLASH_RAW_SCORES", "1") != "0" and not variant.nonpositive_scale


def raw_scores(variant) -> bool:
    """The wgmma forward keeps the scores raw (``s = q·k``, CAPPED with the scale times
    log2 e as the exponent's factor: FlashAttention-2's form, one FMUL an element less
    than scaling each score) where :func:`raw_scores_allowed`, without ALiBi (whose
    column frame fuses the scale with the bias in one FFMA, ``fragments.scale_and_mask``;
    with causal the wgmma forward takes ALiBi's bias on the tensor cores and keeps raw
    scores: ``wgmma_forward.alibi_on_products``)."""
    return raw_scores_allowed(variant) and not variant.alibi

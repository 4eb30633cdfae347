r"""Float64 NumPy reference of FlashAttention (forward and backward).

Everything the GPU kernels compute is computed here again, slowly and in
float64, so tests have something exact to compare against.  Nothing in this
module uses CUDA or numba.

The math
--------
For one (batch, head) pair, with queries ``Q`` (Nq x d), keys ``K`` (Nk x d),
values ``V`` (Nk x dv) and ``scale`` (``softmax_scale``, default
``1/sqrt(d)``)::

    S   = scale * Q K^T                       (Nq x Nk)
    S_ij = -inf   where key j is masked for query i
    m_i = max_j S_ij                          row max
    l_i = sum_j exp(S_ij - m_i)               row sum
    P   = exp(S - m) / l                      softmax, row by row
    O   = P V                                 (Nq x dv)
    lse_i = m_i + log(l_i) = log sum_j exp(S_ij)   (natural log)

Causal masking is *bottom-right aligned*, as in FlashAttention-2 >= 2.1:
query ``i`` (0-based) sees key ``j`` iff ``j <= i + Nk - Nq``.  When
``Nq > Nk`` the first ``Nq - Nk`` query rows see no key at all; for such a row
the library defines ``O_i = 0`` and ``lse_i = -inf`` (never NaN).

FlashAttention never materialises ``S`` or ``P``.  It walks over tiles of
``block_m`` query rows (starting at ``start_m``) and ``block_n`` keys
(starting at ``start_n``), keeping per query row a running max ``m_i``, a
running sum ``l_i`` and an unnormalised output ``acc``.  When a new key tile
raises the max from ``m_old`` to ``m_new``, everything accumulated so far was
exponentiated against the wrong max and is rescaled by
``exp(m_old - m_new)`` (the *online softmax* of Milakov & Gimelshein, 2018)::

    m_new = max(m_i, rowmax(S_tile))
    P_tile = exp(S_tile - m_new)
    l_i    = exp(m_i - m_new) * l_i   + rowsum(P_tile)
    acc    = exp(m_i - m_new) * acc   + P_tile V_tile
    m_i    = m_new
    ...after the last tile:  O = acc / l_i,  lse = m_i + log(l_i)

The backward pass only needs ``lse`` to rebuild ``P`` exactly::

    P     = exp(scale * Q K^T - lse)          (masked entries -> 0)
    delta = D = rowsum(dO * O)
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - D)
    dQ = scale * dS K
    dK = scale * dS^T Q

Shapes and layouts
------------------
All attention functions take 4-D arrays.  With ``layout="bshd"`` (the
default, as ``numba_flash.flash_attention`` and flash-attn) they are
``(batch, seqlen, heads, headdim)``; with ``layout="bhsd"`` (PyTorch SDPA's
order) they are ``(batch, heads, seqlen, headdim)``.  Outputs come back in the
same layout; ``lse`` is always ``(batch, heads, seqlen_q)``.  Batch, heads and
the sequence lengths may be 0 (an empty result; with ``seqlen_k = 0`` every
row sees no key: ``O = 0``, ``lse = -inf``); head dims must be at least 1.
Inputs are never modified.

Non-finite values
-----------------
The reference is a standard attention in IEEE float64 arithmetic, so:

- a NaN or ``+inf`` score ``S_ij`` that query ``i`` sees makes row ``i`` of
  ``O`` and ``lse_i`` NaN (``+inf - +inf`` in the softmax), as in a
  materialised ``softmax(S) V``, and its gradients NaN too (never the 0 and
  ``-inf`` of a row without keys);
- a NaN in ``V[j, c]`` makes ``O[i, c]`` NaN for every query ``i`` that sees
  key ``j`` (``lse`` stays finite), and in the materialised functions also for
  the rows that give key ``j`` weight 0 (``0 * NaN`` is NaN); the tiled ones
  skip key tiles that a causal row cannot see;
- a ``-inf`` score counts as a masked key (weight 0); a row whose visible
  scores are all ``-inf``, or that sees no key at all, gives ``O_i = 0`` and
  ``lse_i = -inf``.

Masked scores are replaced by ``-inf`` before the softmax, so a NaN in a key
that a query cannot see (causal) does not reach that query.

FlashAttention-2's variants
---------------------------
Every attention function and its backward take FlashAttention-2's
``flash_attn_func`` keywords ``window_size``, ``softcap``, ``alibi_slopes``,
``dropout_p`` and ``seed``; their defaults give the plain attention above, bit
for bit.  Per (batch ``b``, query head ``h``), with ``diag = Nk - Nq``::

    S_ij = scale * q_i . k_j
    S_ij = c * tanh(S_ij / c)                    softcap c > 0
    S_ij = S_ij - slope[b, h] * |i + diag - j|   ALiBi (after the softcap)
    S_ij = -inf  unless  i + diag - left <= j <= i + diag + right
                                                 window_size = (left, right), -1
                                                 leaves a side open, as does a
                                                 side >= Nk (FlashAttention-2's
                                                 mha_fwd); causal sets right = 0
                                                 (causal and window)
    P = softmax(S), lse = log sum_j exp(S_ij)    (the undropped softmax)
    O = (P * Z / (1 - p)) V                      dropout p, Z = dropout_mask(...)

Grouped-query (and multi-query) attention: ``k`` and ``v`` may have ``H_kv``
heads, ``H_kv`` dividing q's ``H``; query head ``h`` reads KV head
``h // (H / H_kv)``.  The backward, with ``D = rowsum(dO * O)`` of the
(dropped) output O the forward returned::

    dV = (P * Z / (1 - p))^T dO                  summed over the KV head's group
    dP = (dO V^T) * Z / (1 - p)
    dS = P * (dP - D)
    dS = dS * (1 - tanh^2(S_raw / c))            softcap: d(c tanh(x / c)) / dx
    dQ = scale * dS K,   dK = scale * dS^T Q     (dK summed over the group)

:func:`attention_varlen` and :func:`attention_varlen_backward` take sequences
of different lengths packed along one axis (``flash_attn_varlen_func``); every
index above is then relative to its sequence, and ``b`` is its index.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "causal_mask",
    "window_mask",
    "attention",
    "online_softmax",
    "online_softmax_blocks",
    "flash_forward",
    "attention_backward",
    "flash_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_lowp",
    "attention_backward_lowp",
    "round_tf32",
    "attention_tf32",
    "attention_backward_tf32",
    "philox4x32",
    "seed_key",
    "keep_threshold",
    "dropout_mask",
    "rel_error",
    "max_abs_error",
]

_LAYOUTS = ("bhsd", "bshd")


# ---------------------------------------------------------------------------
# Argument checking and layout handling
# ---------------------------------------------------------------------------

def _shown(value):
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_layout(layout):
    # isinstance first: an array would make ``in`` compare element-wise
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {_LAYOUTS}")


def _check_causal(causal):
    # A truthy string such as "no" would silently mean causal=True.
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal={causal!r}: expected a bool")
    return bool(causal)


def _check_block(name, block):
    if not _is_int(block) or block < 1:
        raise ValueError(f"{name}={block!r}: expected a positive int")
    return int(block)


def _check_seqlen(name, n):
    if not _is_int(n) or n < 0:
        raise ValueError(f"{name}={n!r}: expected a non-negative int")
    return int(n)


def _real(value, ok):
    """``float(value)`` when ``value`` is a real number (not a bool) for which
    ``ok(float)`` holds, else None (an int beyond float64 is not finite)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    try:
        x = float(value)
    except OverflowError:  # an int beyond float64, e.g. 10**400
        return None
    return x if ok(x) else None


def _resolve_scale(softmax_scale, headdim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    value = _real(softmax_scale, math.isfinite)
    if value is None:
        raise ValueError(f"softmax_scale={_shown(softmax_scale)}: "
                         "expected None or a real number finite in float64")
    return value


def _to_bhsd(x, name, layout):
    """``x`` as a float64 (batch, heads, seqlen, headdim) array (maybe a view)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 4:
        raise ValueError(
            f"{name}: shape {x.shape}: expected a 4-D array in layout {layout!r}")
    if x.shape[3] == 0:
        raise ValueError(f"{name}: shape {x.shape}: expected a headdim of at least 1")
    if layout == "bshd":
        x = x.transpose(0, 2, 1, 3)
    return x


def _from_bhsd(x, layout):
    if layout == "bshd":
        x = x.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(x)


def _dims(x):
    b, h, n, d = x.shape
    return f"batch={b}, heads={h}, seqlen={n}, headdim={d}"


def _check_kv_heads(heads_kv, heads):
    """Grouped-query attention: k's heads must divide q's (equal heads: plain MHA)."""
    if heads_kv != heads and (heads_kv == 0 or heads == 0 or heads % heads_kv):
        raise ValueError(
            f"k: heads={heads_kv}: expected a divisor of q's heads={heads} "
            "(grouped-query attention: each KV head serves H / H_kv query heads)")


def _prepare(q, k, v, softmax_scale, layout, causal, window_size, softcap,
             alibi_slopes, dropout_p, seed, mods=None):
    """Validate the common arguments; return bhsd float64 q, k, v, the scale and
    the variants.  k and v keep their own (KV) heads."""
    _check_layout(layout)
    causal = _check_causal(causal)
    q = _to_bhsd(q, "q", layout)
    k = _to_bhsd(k, "k", layout)
    v = _to_bhsd(v, "v", layout)
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k: {_dims(k)}: expected the batch and headdim of q ({_dims(q)})")
    _check_kv_heads(k.shape[1], q.shape[1])
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v: {_dims(v)}: expected the batch, heads and seqlen of k ({_dims(k)})")
    scale = _resolve_scale(softmax_scale, q.shape[3])
    var = _variants(causal, window_size, softcap, alibi_slopes, dropout_p, seed,
                    batch=q.shape[0], heads=q.shape[1], seqlen_k=k.shape[2], **(mods or {}))
    _check_block_mask(var.block_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return q, k, v, scale, var


def _check_block_mask(bm, batch, heads, seqlen_q, seqlen_k, what="q's and k's"):
    """A block mask made for (batch or 1, heads or 1, seqlen_q, seqlen_k)."""
    if bm is None:
        return
    if (bm.seqlen_q, bm.seqlen_k) != (seqlen_q, seqlen_k):
        raise ValueError(f"block_mask: made for seqlen_q={bm.seqlen_q}, seqlen_k={bm.seqlen_k}; "
                         f"expected {seqlen_q}, {seqlen_k} ({what})")
    if bm.kinds.shape[0] not in (1, batch) or bm.kinds.shape[1] not in (1, heads):
        raise ValueError(f"block_mask: kinds of shape {bm.kinds.shape}: expected batch 1 or "
                         f"{batch} and heads 1 or {heads}")


def _prepare_backward(dout, q, k, v, out, lse, softmax_scale, layout, *variants, mods=None):
    q, k, v, scale, var = _prepare(q, k, v, softmax_scale, layout, *variants, mods=mods)
    b, h, nq, _ = q.shape
    dv_dim = v.shape[3]
    out = _to_bhsd(out, "out", layout)
    if out.shape != (b, h, nq, dv_dim):
        raise ValueError(
            f"out: {_dims(out)}: expected batch={b}, heads={h}, seqlen={nq}, "
            f"headdim={dv_dim} (the shape of q with v's headdim)")
    dout = _to_bhsd(dout, "dout", layout)
    if dout.shape != out.shape:
        raise ValueError(f"dout: {_dims(dout)}: expected the shape of out ({_dims(out)})")
    lse = np.asarray(lse, dtype=np.float64)
    if lse.shape != (b, h, nq):
        raise ValueError(
            f"lse: shape {lse.shape}: expected (batch, heads, seqlen_q) = {(b, h, nq)}")
    return dout, q, k, v, out, lse, scale, var


# ---------------------------------------------------------------------------
# FlashAttention-2's variants: window, softcap, ALiBi, dropout (GQA: _expand)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Variants:
    """The validated variants of one call.

    ``window`` is ``(left, right)`` with -1 for an open side and causal folded in
    (right = 0); ``slopes`` the ALiBi slopes as float64 (batch, heads), or None;
    ``key`` the Philox key of the dropout seed (None without dropout) and
    ``batch_ids`` the batch index each batch row has in the dropout counter (for
    varlen, the sequence's index in cu_seqlens)."""

    window: tuple
    softcap: float
    slopes: object
    dropout_p: float
    key: object
    batch_ids: object
    score_mod: object = None
    score_mod_grad: object = None
    block_mask: object = None
    mod_args: tuple = ()

    def sequence(self, b):
        """The variants of batch row ``b`` alone (a varlen sequence)."""
        slopes = None if self.slopes is None else self.slopes[b:b + 1]
        return replace(self, slopes=slopes, batch_ids=self.batch_ids[b:b + 1])


def _check_window(window_size, causal, seqlen_k):
    """``(left, right)`` as FlashAttention-2 runs it: a side of ``seqlen_k`` or more open
    (-1), then ``right = 0`` with causal (the module docstring)."""
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(_is_int(w) and w >= -1 for w in window_size))
    if not ok:
        raise ValueError(f"window_size={_shown(window_size)}: expected a tuple "
                         "(left, right) of two ints >= -1 (-1: that side unbounded)")
    left, right = (-1 if int(w) >= seqlen_k else int(w) for w in window_size)
    return left, 0 if causal else right


def _check_softcap(softcap):
    value = _real(softcap, lambda x: math.isfinite(x) and x >= 0)
    if value is None:
        raise ValueError(f"softcap={_shown(softcap)}: expected a finite real >= 0 "
                         "(0: no softcap)")
    return value


def _check_alibi(alibi_slopes, batch, heads):
    if alibi_slopes is None:
        return None
    try:
        slopes = np.array(alibi_slopes, dtype=np.float64)  # a copy: never modified
    except (TypeError, ValueError):
        slopes = None
    if slopes is None or slopes.shape not in ((heads,), (batch, heads)):
        shape = getattr(alibi_slopes, "shape", None)
        shown = f"shape {shape}" if shape is not None else _shown(alibi_slopes)
        raise ValueError(f"alibi_slopes: {shown}: expected None or real slopes of "
                         f"shape (heads,) = ({heads},) or (batch, heads) = "
                         f"({batch}, {heads})")
    return np.broadcast_to(slopes, (batch, heads))


def _check_dropout(dropout_p, seed):
    p = _real(dropout_p, lambda x: 0 <= x < 1)
    if p is None:
        raise ValueError(f"dropout_p={_shown(dropout_p)}: expected a real in [0, 1)")
    key = None if seed is None and p == 0 else seed_key(seed)  # checked when given
    return p, (key if p > 0 else None)


def _variants(causal, window_size, softcap, alibi_slopes, dropout_p, seed, *,
              batch, heads, seqlen_k, score_mod=None, score_mod_grad=None, block_mask=None,
              mod_args=()):
    window = _check_window(window_size, causal, seqlen_k)
    softcap = _check_softcap(softcap)
    slopes = _check_alibi(alibi_slopes, batch, heads)
    p, key = _check_dropout(dropout_p, seed)
    for name, fn in (("score_mod", score_mod), ("score_mod_grad", score_mod_grad)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: expected a function or None, got {type(fn).__name__}")
    if not isinstance(mod_args, (tuple, list)):
        raise TypeError(f"mod_args: expected a tuple, got {type(mod_args).__name__}")
    if block_mask is not None and not hasattr(block_mask, "dense"):
        raise TypeError(f"block_mask: expected a numba_flash BlockMask or None, got "
                        f"{type(block_mask).__name__}")
    return _Variants(window, softcap, slopes, p, key, np.arange(batch), score_mod,
                     score_mod_grad, block_mask, tuple(mod_args))


def _visible(rows, cols, offset, window):
    """``(len(rows), len(cols))`` bool: query ``i`` sees key ``j`` iff
    ``i + offset - left <= j <= i + offset + right`` (a -1 side is open)."""
    left, right = window
    i, j = rows[:, None], cols[None, :]
    ok = np.ones((rows.size, cols.size), dtype=bool)
    if left >= 0:
        ok &= j >= i + offset - left
    if right >= 0:
        ok &= j <= i + offset + right
    return ok


def _key_range(start_m, end_m, nq, nk, window):
    """Keys ``[lo, hi)`` that any of the query rows ``start_m .. end_m - 1`` sees
    (FlashAttention's n_block_min / n_block_max, in keys)."""
    left, right = window
    offset = nk - nq
    lo = 0 if left < 0 else max(0, start_m + offset - left)
    hi = nk if right < 0 else min(nk, max(0, end_m + offset + right))
    return lo, hi


def _query_range(start_n, end_n, nq, nk, window):
    """Query rows ``[lo, hi)`` that see any of the keys ``start_n .. end_n - 1``."""
    left, right = window
    offset = nk - nq
    lo = 0 if right < 0 else max(0, start_n - offset - right)
    hi = nq if left < 0 else min(nq, max(0, end_n - offset + left))
    return lo, hi


def _tile_needs_mask(start_m, end_m, start_n, end_n, offset, window):
    """False when every (query, key) pair of the tile is inside the window band."""
    left, right = window
    past_right = right >= 0 and end_n - 1 > start_m + offset + right
    before_left = left >= 0 and start_n < end_m - 1 + offset - left
    return past_right or before_left


def _score_mods(s, rows, cols, offset, var, mask=True):
    """Softcap, ALiBi, ``score_mod`` and the masks (window, block mask) applied to
    the scaled scores ``s`` (batch, heads, len(rows), len(cols)), in ``s``'s
    dtype.  Returns ``(s, t)``, ``t`` what the backward needs for dS with respect
    to the raw score (:func:`_softcap_grad`): ``(tanh(s_raw / softcap) or None,
    score_mod_grad at the scores score_mod was given or None)``, or None when
    neither applies."""
    ft = s.dtype.type
    tanh = grad = None
    if var.softcap > 0:
        tanh = np.tanh(s / ft(var.softcap))
        s = ft(var.softcap) * tanh
    if var.slopes is not None:
        dist = np.abs(rows[:, None] + offset - cols[None, :]).astype(s.dtype)
        s = s - var.slopes[:, :, None, None].astype(s.dtype) * dist
    if var.score_mod is not None:
        if var.score_mod_grad is not None:
            grad = _elementwise(var.score_mod_grad, s, rows, cols, var)
        s = _elementwise(var.score_mod, s, rows, cols, var)
    if mask and var.window != (-1, -1):
        s = np.where(_visible(rows, cols, offset, var.window), s, ft(-np.inf))
    if mask and var.block_mask is not None:
        s = np.where(_block_visible(var, s.shape[1], rows, cols), s, ft(-np.inf))
    return s, (None if tanh is None and grad is None else (tanh, grad))


def _elementwise(fn, s, rows, cols, var):
    """``fn(s, b, h, q_idx, kv_idx, *mod_args)`` of every score, in ``s``'s dtype
    (:func:`apply_mod`)."""
    args = tuple(_host_array(a) for a in var.mod_args)
    b = var.batch_ids[:, None, None, None]
    h = np.arange(s.shape[1])[None, :, None, None]
    return apply_mod(fn, (s, b, h, rows[None, None, :, None], cols[None, None, None, :]), args).astype(s.dtype)


def apply_mod(fn, grids, args):
    """A user's scalar function (``score_mod``, ``mask_mod``) of every element of the
    broadcast ``grids`` (arrays: (score,) b, h, q_idx, kv_idx) with ``mod_args``
    ``args``, as an array of the broadcast shape.  Called once on the whole arrays
    when that works (plain arithmetic, comparisons and table lookups broadcast as
    they do on scalars: large shapes in seconds), else element by element on Python
    scalars (a branch, ``math.*`` or ``and`` raise on arrays)."""
    shape = np.broadcast_shapes(*(np.shape(g) for g in grids))
    with np.errstate(all="ignore"):
        try:
            out = np.asarray(fn(*grids, *args))
            if out.dtype.kind in "biuf" and np.broadcast_shapes(out.shape, shape) == shape:
                return np.broadcast_to(out, shape)
        except Exception:  # not array code: element by element below
            pass
        ints = len(grids) - 4  # the index arguments as Python ints

        def one(*xs):
            return fn(*xs[:ints], *(int(x) for x in xs[ints:]), *args)

        return np.frompyfunc(one, len(grids), 1)(*grids)  # objects: the caller casts


def _block_visible(var, heads, rows, cols):
    """The block mask's visible pairs (batch, heads, len(rows), len(cols)), bool."""
    bm = var.block_mask
    return np.stack([np.stack([bm.dense(int(b), h)[np.ix_(rows, cols)] for h in range(heads)])
                     for b in var.batch_ids])


def _host_array(a):
    """A mod_args entry on the host (CuPy arrays copied; scalars as they are)."""
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()
    return a


def _scores(q, k, rows, cols, offset, scale, var, mask=True):
    """``S`` (batch, heads, len(rows), len(cols)) of query rows ``q`` and keys
    ``k`` (the tiles of ``rows`` and ``cols``), with the variants applied; and
    the softcap's tanh (see :func:`_score_mods`)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0, overflow: IEEE
        s = scale * (q @ k.swapaxes(-1, -2))
    return _score_mods(s, rows, cols, offset, var, mask)


def _softcap_grad(ds, t):
    """dS with respect to the raw score ``scale·q·k``: times ``score_mod_grad`` at
    the modded score, then the softcap's ``1 - tanh^2`` (``t`` from
    :func:`_score_mods`)."""
    if t is None:
        return ds
    tanh, grad = t
    if grad is not None:
        ds = ds * grad
    return ds if tanh is None else ds * (1 - tanh * tanh)


def _keep_scale(var, heads, rows, cols, dtype=np.float64):
    """``Z / (1 - p)`` (batch, heads, len(rows), len(cols)) in ``dtype``, or None
    without dropout."""
    if var.key is None:
        return None
    z = _keep_bits(var.key, keep_threshold(var.dropout_p), var.batch_ids,
                   np.arange(heads), rows, cols)
    return z * dtype(1 / (1 - var.dropout_p))


def _expand(x, heads):
    """Grouped-query attention: k or v (b, H_kv, n, d) as (b, heads, n, d), query
    head ``h`` getting KV head ``h // (heads / H_kv)`` (a view when H_kv = heads)."""
    if x.shape[1] == heads:
        return x
    return x[:, np.arange(heads) // (heads // x.shape[1])]


def _group_sum(dx, heads_kv, dtype=None):
    """Gradients of the query heads (b, H, n, d) summed over each KV group; in
    float32 rounded to ``dtype`` when given (a low-precision baseline)."""
    b, h, n, d = dx.shape
    if h == heads_kv:
        return dx
    grouped = dx.reshape(b, heads_kv, h // heads_kv, n, d)
    if dtype is None:
        return grouped.sum(axis=2)
    return grouped.sum(axis=2, dtype=np.float32).astype(dtype)


# ---------------------------------------------------------------------------
# Dropout bits: Philox4x32-7, one call per 16 (query, key) elements
# ---------------------------------------------------------------------------

_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key bumps (golden ratio, sqrt(3) - 1)
_MASK32 = 0xFFFFFFFF


#: Philox rounds of the dropout bits: seven, as FlashAttention-2's ``philox`` (Salmon
#: et al. list Philox4x32-7 among the generators that pass BigCrush; Random123's
#: default of 10 keeps 3 rounds of margin).
DROPOUT_ROUNDS = 7


def philox4x32(c0, c1, c2, c3, k0, k1, rounds=10):
    """Philox4x32 with ``rounds`` rounds (Salmon et al., SC'11; Random123, cuRAND) of
    the counter ``(c0, c1, c2, c3)`` under the key ``(k0, k1)``: 4 uint32 arrays
    (broadcast shape of the counter words).  The dropout bits take
    ``DROPOUT_ROUNDS``.

    One round, with ``mulhilo32(a, b)`` the high and low 32-bit halves of the
    64-bit product::

        (hi0, lo0) = mulhilo32(0xD2511F53, c0)
        (hi1, lo1) = mulhilo32(0xCD9E8D57, c2)
        c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
        k0 += 0x9E3779B9;  k1 += 0xBB67AE85        (mod 2**32)

    ``rounds`` rounds, the first with the key as given.  Computed in uint64.

    >>> [hex(int(x)) for x in philox4x32(0, 0, 0, 0, 0, 0)]  # Random123's answer for 10
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & np.uint64(_MASK32)
                      for c in (c0, c1, c2, c3))
    k0, k1 = int(k0) & _MASK32, int(k1) & _MASK32
    m0, m1, lo = np.uint64(_PHILOX_M0), np.uint64(_PHILOX_M1), np.uint64(_MASK32)
    for _ in range(rounds):
        p0 = m0 * c0  # < 2**64: exact in uint64
        p1 = m1 * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & lo,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & lo)
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return tuple(x.astype(np.uint32) for x in (c0, c1, c2, c3))


def seed_key(seed):
    """The Philox key ``(k0, k1) = (seed & 0xFFFFFFFF, seed >> 32)`` of a dropout
    seed, an int with ``0 <= seed < 2**64``."""
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed={_shown(seed)}: expected an int with 0 <= seed < 2**64 "
                         "(required when dropout_p > 0)")
    seed = int(seed)
    return seed & _MASK32, seed >> 32


def keep_threshold(dropout_p):
    """The 8-bit keep threshold of ``dropout_p``: ``min(256, round((1 - p) * 256))``
    (Python's round, ties to even); a value ``< threshold`` is kept, so p = 0 keeps
    everything.  The drop rate is p rounded to a multiple of 1/256, as
    FlashAttention-2's 8-bit threshold rounds it."""
    p = _real(dropout_p, lambda x: 0 <= x < 1)
    if p is None:
        raise ValueError(f"dropout_p={_shown(dropout_p)}: expected a real in [0, 1)")
    return min(256, round((1 - p) * 256))


def _group_slot(j):
    """The Philox call (``group``) and the key's part of the value's slot (0..7) of
    key ``j``."""
    group = (j // 32) * 4 + (j % 8) // 2
    slot = ((j % 32) // 8) * 2 + j % 2
    return group, slot


def _pair_half(i):
    """The row pair of query ``i`` (rows ``16a + r`` and ``16a + r + 8`` share one
    Philox call) and which of the two it is (0 or 1)."""
    return (i // 16) * 8 + i % 8, (i // 8) % 2


def _keep_bits(key, threshold, batch_ids, heads, rows, cols):
    """Keep mask (len(batch_ids), len(heads), len(rows), len(cols)) of the given
    batch, head, query and key indices (:func:`dropout_mask`); one Philox call
    per distinct (b, h, row pair, group)."""
    groups, key_slots = _group_slot(np.asarray(cols, dtype=np.int64))
    pairs, halves = _pair_half(np.asarray(rows, dtype=np.int64))
    g_needed, g_which = np.unique(groups, return_inverse=True)
    p_needed, p_which = np.unique(pairs, return_inverse=True)
    b = np.asarray(batch_ids)[:, None, None, None]
    h = np.asarray(heads)[None, :, None, None]
    words = np.stack(philox4x32(g_needed[None, None, None, :], p_needed[None, None, :, None], h, b, *key,
                                DROPOUT_ROUNDS),
                     axis=-1)  # (b, h, pair, group, 4)
    slots = halves[:, None] * 8 + key_slots[None, :]  # (i, j), 0..15
    word = words[:, :, p_which[:, None], g_which[None, :], slots // 4].astype(np.uint64)  # (b, h, i, j)
    value = (word >> (8 * (slots % 4)).astype(np.uint64)) & np.uint64(0xFF)
    return value < np.uint64(threshold)


def dropout_mask(seed, dropout_p, batch, heads, seqlen_q, seqlen_k):
    """Dropout keep mask, bool ``(batch, heads, seqlen_q, seqlen_k)``, True = kept.

    The GPU kernels reproduce it bit for bit.  Element ``(b, h, i, j)`` (batch,
    query head, query row, key column; for varlen ``b`` is the sequence's index
    in cu_seqlens and ``i``, ``j`` positions within the sequence)::

        key       (k0, k1) = (seed & 0xFFFFFFFF, seed >> 32)          seed_key
        pair      = (i // 16) * 8 + i % 8                 rows i, i + 8 of 16 share it
        group     = (j // 32) * 4 + (j % 8) // 2
        slot      = ((i // 8) % 2) * 8 + ((j % 32) // 8) * 2 + j % 2   (0..15)
        x0..x3    = philox4x32(c0=group, c1=pair, c2=h, c3=b, k0, k1, DROPOUT_ROUNDS)
        value     = (x[slot // 4] >> (8 * (slot % 4))) & 0xFF
        threshold = min(256, round((1 - dropout_p) * 256))             keep_threshold
        kept      = value < threshold

    One Philox call gives the 16 values of rows ``16a + r`` and ``16a + r + 8``
    (r < 8) at keys ``32b + 8c + 2t + {0, 1}`` for ``c = 0..3`` (``group = 4b + t``):
    the two rows and the keys 2t, 2t+1 of four 8-key n-tiles that one lane of an
    mma.sync m16n8 accumulator holds.  Values are 8-bit, as FlashAttention-2's,
    so dropout_p is rounded to a multiple of 1/256.  The definition itself depends
    only on (seed, b, h, i, j).

    >>> dropout_mask(0, 0.5, 1, 1, 2, 8).astype(int)
    array([[[[1, 0, 1, 1, 1, 1, 0, 0],
             [1, 1, 0, 1, 1, 1, 1, 0]]]])
    """
    key = seed_key(seed)
    threshold = keep_threshold(dropout_p)
    dims = [_check_seqlen(name, n) for name, n in (
        ("batch", batch), ("heads", heads), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k))]
    return _keep_bits(key, threshold, *(np.arange(n) for n in dims))


# ---------------------------------------------------------------------------
# Masks and the materialised ("standard") attention
# ---------------------------------------------------------------------------

def causal_mask(seqlen_q, seqlen_k):
    """Bottom-right aligned causal mask, shape ``(seqlen_q, seqlen_k)``.

    ``mask[i, j]`` is True where query ``i`` sees key ``j``, i.e. where
    ``j <= i + seqlen_k - seqlen_q``.

    >>> causal_mask(2, 3).astype(int)
    array([[1, 1, 0],
           [1, 1, 1]])
    >>> causal_mask(3, 2).astype(int)
    array([[0, 0],
           [1, 0],
           [1, 1]])
    """
    seqlen_q = _check_seqlen("seqlen_q", seqlen_q)
    seqlen_k = _check_seqlen("seqlen_k", seqlen_k)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def window_mask(seqlen_q, seqlen_k, window_size=(-1, -1), *, causal=False):
    """Sliding-window (local) mask, bool ``(seqlen_q, seqlen_k)``, bottom-right
    aligned as :func:`causal_mask`: query ``i`` sees key ``j`` iff
    ``i + diag - left <= j <= i + diag + right`` with ``diag = seqlen_k - seqlen_q``
    and ``(left, right) = window_size``; -1 leaves that side open, as does a side of
    ``seqlen_k`` or more (FlashAttention-2's ``mha_fwd``), and causal sets right = 0.

    >>> window_mask(4, 4, (1, 0)).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    seqlen_q = _check_seqlen("seqlen_q", seqlen_q)
    seqlen_k = _check_seqlen("seqlen_k", seqlen_k)
    window = _check_window(window_size, _check_causal(causal), seqlen_k)
    return _visible(np.arange(seqlen_q), np.arange(seqlen_k), seqlen_k - seqlen_q, window)


def attention(q, k, v, *, causal=False, softmax_scale=None, layout="bshd",
              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
              seed=None, score_mod=None, block_mask=None, mod_args=()):
    """Standard (materialised) attention in float64.

    Parameters
    ----------
    q : array, (batch, seqlen_q, heads, headdim)   [bshd, the default]
    k : array, (batch, seqlen_k, heads_kv, headdim)
    v : array, (batch, seqlen_k, heads_kv, headdim_v)
        With ``layout="bhsd"`` the seqlen and heads axes are swapped.
        ``heads_kv`` divides ``heads`` (grouped-query attention).
    window_size, softcap, alibi_slopes, dropout_p, seed :
        FlashAttention-2's variants (module docstring); ``alibi_slopes`` is
        (heads,) or (batch, heads), ``seed`` an int in [0, 2**64) required when
        ``dropout_p > 0`` (:func:`dropout_mask`).
    score_mod, block_mask, mod_args :
        FlexAttention's user functions (module docstring): ``score_mod(score, b,
        h, q_idx, kv_idx, *mod_args)`` on every scaled score, after softcap and
        ALiBi; ``block_mask`` a ``numba_flash.BlockMask`` whose own ``mask_mod``
        and ``mod_args`` decide its partial blocks.

    Returns
    -------
    out : float64 array, (batch, seqlen_q, heads, headdim_v)  [in ``layout``]
    lse : float64 array, (batch, heads, seqlen_q), natural-log sum-exp of the
        scores (of the undropped softmax); ``-inf`` for a row that sees no key
        (whose ``out`` is 0).

    A NaN or ``+inf`` score in a row makes that row of ``out`` and ``lse``
    NaN; ``-inf`` scores count as masked (see the module docstring).
    """
    q, k, v, scale, var = _prepare(q, k, v, softmax_scale, layout, causal, window_size,
                                   softcap, alibi_slopes, dropout_p, seed,
                                   mods=dict(score_mod=score_mod, block_mask=block_mask,
                                             mod_args=mod_args))
    out, lse = _attention(q, k, v, scale, var)
    return _from_bhsd(out, layout), lse


def _attention(q, k, v, scale, var):
    """:func:`attention` of bhsd float64 arrays: ``(out, lse)``, out bhsd."""
    heads, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    rows, cols = np.arange(nq), np.arange(nk)
    k, v = _expand(k, heads), _expand(v, heads)
    s, _ = _scores(q, k, rows, cols, nk - nq, scale, var)
    p, l_safe, lse = _unnormalised_softmax(s)
    p = p / l_safe
    keep = _keep_scale(var, heads, rows, cols)
    if keep is not None:
        p = p * keep
    return p @ v, lse


def _unnormalised_softmax(s):
    """``(p, l, lse)`` of scores ``s`` (…, Nq, Nk): ``p = exp(s − m)`` with the row max
    m, its row sum l (1 for a row that sees no key, so dividing leaves p = 0) and
    ``lse = m + log l`` (−inf for such a row)."""
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # -inf for Nk = 0
    # A fully masked row has m = -inf; subtracting 0 instead avoids -inf - -inf.
    m_safe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    has_keys = l != 0  # a NaN sum (a NaN or +inf score) keeps its row NaN
    l_safe = np.where(has_keys, l, 1.0)
    return p, l_safe, np.where(has_keys, m_safe + np.log(l_safe), -np.inf)[..., 0]


# ---------------------------------------------------------------------------
# Online softmax (Milakov & Gimelshein 2018; FlashAttention section 3.1)
# ---------------------------------------------------------------------------

def _row(x, name="x"):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name}: shape {x.shape}: expected a non-empty 1-D row")
    return x


def _weights(x, m, l):
    if l == 0.0:
        # Every entry was -inf: no mass anywhere (what attention does to O).
        return np.zeros_like(x)
    return np.exp(x - m) / l


def online_softmax(x):
    """Softmax of a 1-D row in one streaming pass, then a pass for the weights.

    Pass 1 keeps a running max ``m`` and a running sum ``l`` of
    ``exp(x_j - m)``; whenever the max grows the sum is rescaled::

        m_new = max(m, x_j)
        l     = l * exp(m - m_new) + exp(x_j - m_new)

    Pass 2 returns ``weights_j = exp(x_j - m) / l``.

    Returns ``(weights, m, l)`` with ``weights`` a float64 array of
    ``x``'s length and ``m``, ``l`` Python floats.  ``-inf`` entries get
    weight 0; a row of only ``-inf`` gives all-zero weights, ``m = -inf``,
    ``l = 0``.

    >>> w, m, l = online_softmax([2.0, 1.0, 3.0, 0.0])
    >>> print(f"m = {m:.4f}, l = {l:.4f}")
    m = 3.0000, l = 1.5530
    >>> np.round(w, 4)
    array([0.2369, 0.0871, 0.6439, 0.0321])
    """
    x = _row(x)
    m, l = -math.inf, 0.0
    for x_j in x:
        m_new = max(m, float(x_j))
        if m_new == -math.inf:
            continue  # only -inf so far: nothing to add, and -inf - -inf is NaN
        l = l * math.exp(m - m_new) + math.exp(x_j - m_new)
        m = m_new
    return _weights(x, m, l), m, l


def online_softmax_blocks(x, block):
    """Online softmax of a 1-D row processed ``block`` entries at a time.

    As in a FlashAttention key tile, each block contributes its own max and
    its own sum, and the running sum is rescaled once per block::

        m_new = max(m, max(x_blk))
        l     = l * exp(m - m_new) + sum(exp(x_blk - m_new))

    Returns ``(weights, states)`` where ``states`` is the list of running
    ``(m, l)`` after each block (Python floats).

    The worked example: the row ``[2, 1, 3, 0]`` in two blocks of 2.

    >>> w, states = online_softmax_blocks([2.0, 1.0, 3.0, 0.0], block=2)
    >>> for m, l in states:
    ...     print(f"m = {m:.4f}, l = {l:.4f}")
    m = 2.0000, l = 1.3679
    m = 3.0000, l = 1.5530

    Block 1 gives ``l = e^0 + e^-1 = 1.3679`` against max 2.  Block 2 raises
    the max to 3, so that sum is rescaled by ``e^(2-3)``, then block 2's own
    ``e^0 + e^-3`` is added (``1.3679 * e^-1`` is 0.50321 exactly; 0.5033
    only if the rounded 1.3679 and 0.3679 are multiplied):

    >>> (m1, l1), (m2, l2) = states
    >>> print(f"{l1 * np.exp(m1 - m2):.4f} + {np.exp(0.0) + np.exp(-3.0):.4f} = {l2:.4f}")
    0.5032 + 1.0498 = 1.5530
    >>> np.round(w, 4)
    array([0.2369, 0.0871, 0.6439, 0.0321])
    """
    x = _row(x)
    block = _check_block("block", block)
    m, l = -math.inf, 0.0
    states = []
    for start in range(0, x.size, block):
        x_blk = x[start:start + block]
        m_new = max(m, float(x_blk.max()))
        if m_new != -math.inf:  # else the block (and all before) is -inf: l stays 0
            l = l * math.exp(m - m_new) + float(np.exp(x_blk - m_new).sum())
            m = m_new
        states.append((m, l))
    return _weights(x, m, l), states


# ---------------------------------------------------------------------------
# Tiled FlashAttention-2 forward
# ---------------------------------------------------------------------------

def flash_forward(q, k, v, *, causal=False, softmax_scale=None,
                  block_m=16, block_n=16, layout="bshd", window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None):
    """Tiled FlashAttention-2 forward pass in float64 NumPy.

    Same arguments and results as :func:`attention` (``out`` in ``layout``,
    ``lse`` of shape (batch, heads, seqlen_q)), computed tile by tile:
    ``block_m`` query rows at a time (outer loop, ``start_m``), ``block_n``
    keys at a time (inner loop, ``start_n``), never holding more than one
    (block_m x block_n) score tile per (batch, head).  Batch and heads are
    vectorised; only the tiles are looped over.  Key tiles outside the causal
    or window band are skipped; only tiles that cross its edges are masked.
    Dropout multiplies the tile's ``P`` by ``Z / (1 - p)`` before ``P V``, after
    its row sum went into ``l_i`` (lse is that of the undropped softmax).
    """
    q, k, v, scale, var = _prepare(q, k, v, softmax_scale, layout, causal, window_size,
                                   softcap, alibi_slopes, dropout_p, seed)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    b, h, nq, _ = q.shape
    nk, dv_dim = k.shape[2], v.shape[3]
    k, v = _expand(k, h), _expand(v, h)  # GQA: head h reads KV head h // group
    # Bottom-right alignment: query i sees keys i + offset - left .. i + offset + right.
    offset = nk - nq

    out = np.empty((b, h, nq, dv_dim))
    lse = np.empty((b, h, nq))
    for start_m in range(0, nq, block_m):
        end_m = min(start_m + block_m, nq)
        q_i = q[:, :, start_m:end_m]
        rows = np.arange(start_m, end_m)
        m_i = np.full((b, h, end_m - start_m), -np.inf)
        l_i = np.zeros((b, h, end_m - start_m))
        acc = np.zeros((b, h, end_m - start_m, dv_dim))

        # Causal / window: key tiles wholly outside the band [lo, hi) that the
        # tile's rows see are skipped (the first visited tile starts on a tile
        # boundary at or before lo).
        lo, hi = _key_range(start_m, end_m, nq, nk, var.window)
        for start_n in range((lo // block_n) * block_n, hi, block_n):
            end_n = min(start_n + block_n, nk)
            cols = np.arange(start_n, end_n)
            # Only tiles that cross an edge of the band need a mask.
            needs_mask = _tile_needs_mask(start_m, end_m, start_n, end_n, offset, var.window)
            s, _ = _scores(q_i, k[:, :, start_n:end_n], rows, cols, offset, scale, var,
                           mask=needs_mask)

            m_new = np.maximum(m_i, s.max(axis=-1))
            # As in FA2: a row with nothing visible yet has m_new = -inf; use 0
            # in its place so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m_i - m_safe)  # rescale for the grown max (0 at start)
            l_i = alpha * l_i + p.sum(axis=-1)
            keep = _keep_scale(var, h, rows, cols)  # dropout after the row sum
            if keep is not None:
                p = p * keep
            acc = alpha[..., None] * acc + p @ v[:, :, start_n:end_n]
            m_i = m_new

        has_keys = l_i != 0  # NaN (a NaN or +inf score) stays NaN
        l_safe = np.where(has_keys, l_i, 1.0)
        out[:, :, start_m:end_m] = acc / l_safe[..., None]  # acc is 0 where l is 0
        lse[:, :, start_m:end_m] = np.where(has_keys, m_i + np.log(l_safe), -np.inf)
    return _from_bhsd(out, layout), lse


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

def _probs_from_lse(s, lse):
    """``P = exp(S - lse)`` with masked entries (S = -inf) and rows with
    ``lse = -inf`` set to exactly 0."""
    row_ok = ~np.isneginf(lse)[..., None]
    lse_safe = np.where(row_ok, lse[..., None], 0.0)
    # Replace before exp so a -inf row never produces exp(+inf).
    return np.exp(np.where(row_ok, s - lse_safe, -np.inf))


def attention_backward(dout, q, k, v, out, lse, *, causal=False,
                       softmax_scale=None, layout="bshd", window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None,
                       score_mod=None, score_mod_grad=None, block_mask=None, mod_args=()):
    """Materialised float64 backward pass from the saved ``lse``.

    Parameters
    ----------
    dout : (batch, seqlen_q, heads, headdim_v)  gradient of the loss w.r.t. ``out``
    q, k, v : as in :func:`attention`
    out : (batch, seqlen_q, heads, headdim_v)   forward output (dropped, if dropout)
    lse : (batch, heads, seqlen_q)              forward log-sum-exp (any layout)
        ``dout``, ``out`` in ``layout`` as ``q`` (bshd shown; bhsd swaps axes 1, 2).
    The variants' keywords must be those of the forward (the same ``seed``).
    With ``score_mod``, ``score_mod_grad(score, b, h, q_idx, kv_idx, *mod_args)``
    is its derivative with respect to ``score`` (required).

    Returns
    -------
    dq, dk, dv : float64 arrays shaped like ``q``, ``k``, ``v`` (in ``layout``);
    with grouped-query attention dk, dv sum the contributions of each KV head's
    query heads.
    """
    if score_mod is not None and score_mod_grad is None:
        raise ValueError("score_mod_grad: expected the derivative of score_mod with respect "
                         "to its score (the backward needs it), got None")
    dout, q, k, v, out, lse, scale, var = _prepare_backward(
        dout, q, k, v, out, lse, softmax_scale, layout, causal, window_size, softcap,
        alibi_slopes, dropout_p, seed,
        mods=dict(score_mod=score_mod, score_mod_grad=score_mod_grad,
                  block_mask=block_mask, mod_args=mod_args))
    grads = _attention_backward(dout, q, k, v, out, lse, scale, var)
    return tuple(_from_bhsd(g, layout) for g in grads)


def _attention_backward(dout, q, k, v, out, lse, scale, var):
    """:func:`attention_backward` of bhsd float64 arrays: bhsd ``(dq, dk, dv)``."""
    heads, heads_kv, nq, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    rows, cols = np.arange(nq), np.arange(nk)
    k, v = _expand(k, heads), _expand(v, heads)
    s, t = _scores(q, k, rows, cols, nk - nq, scale, var)
    p = _probs_from_lse(s, lse)
    keep = _keep_scale(var, heads, rows, cols)
    delta = np.sum(dout * out, axis=-1)  # D_i = rowsum(dO * O) = rowsum(P * dP)
    dv = (p if keep is None else p * keep).swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    if keep is not None:
        dp = dp * keep
    ds = _softcap_grad(p * (dp - delta[..., None]), t)
    dq = scale * (ds @ k)
    dk = scale * (ds.swapaxes(-1, -2) @ q)
    return dq, _group_sum(dk, heads_kv), _group_sum(dv, heads_kv)


def flash_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None,
                   block_m=16, block_n=16, layout="bshd", window_size=(-1, -1),
                   softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None):
    """Tiled FlashAttention-2 backward pass in float64 NumPy.

    Same arguments and results as :func:`attention_backward`.  As in FA2
    (Algorithm 2) the outer loop runs over key tiles (``start_n``), each
    accumulating its ``dK_j`` and ``dV_j`` over the query tiles
    (``start_m``) that see it, while ``dQ_i`` is accumulated across key
    tiles.  ``P`` is rebuilt tile by tile from ``lse``.  With grouped-query
    attention dK and dV are accumulated per query head and summed over each
    group at the end (as flash-attn's ``dk_expanded``).
    """
    dout, q, k, v, out, lse, scale, var = _prepare_backward(
        dout, q, k, v, out, lse, softmax_scale, layout, causal, window_size, softcap,
        alibi_slopes, dropout_p, seed)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    heads, heads_kv, nq, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k, v = _expand(k, heads), _expand(v, heads)
    offset = nk - nq

    delta = np.sum(dout * out, axis=-1)  # precomputed once, as FA2 does
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for start_n in range(0, nk, block_n):
        end_n = min(start_n + block_n, nk)
        k_j = k[:, :, start_n:end_n]
        v_j = v[:, :, start_n:end_n]
        dk_j = np.zeros_like(k_j)
        dv_j = np.zeros_like(v_j)
        cols = np.arange(start_n, end_n)

        # Causal / window: query tiles wholly outside the rows [lo, hi) that see
        # these keys are skipped (the first starts on a tile boundary).
        lo, hi = _query_range(start_n, end_n, nq, nk, var.window)
        for start_m in range((lo // block_m) * block_m, hi, block_m):
            end_m = min(start_m + block_m, nq)
            sl = slice(start_m, end_m)
            rows = np.arange(start_m, end_m)
            needs_mask = _tile_needs_mask(start_m, end_m, start_n, end_n, offset, var.window)
            s, t = _scores(q[:, :, sl], k_j, rows, cols, offset, scale, var, mask=needs_mask)
            p = _probs_from_lse(s, lse[:, :, sl])
            keep = _keep_scale(var, heads, rows, cols)
            do_i = dout[:, :, sl]
            dv_j += (p if keep is None else p * keep).swapaxes(-1, -2) @ do_i
            dp = do_i @ v_j.swapaxes(-1, -2)
            if keep is not None:
                dp = dp * keep
            ds = _softcap_grad(p * (dp - delta[:, :, sl, None]), t)
            dk_j += ds.swapaxes(-1, -2) @ q[:, :, sl]
            dq[:, :, sl] += ds @ k_j
        dk[:, :, start_n:end_n] = scale * dk_j
        dv[:, :, start_n:end_n] = dv_j
    dq *= scale
    dk, dv = _group_sum(dk, heads_kv), _group_sum(dv, heads_kv)
    return _from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout)


# ---------------------------------------------------------------------------
# Variable-length sequences (flash_attn_varlen_func)
# ---------------------------------------------------------------------------

def _check_packed(x, name, ndim_name):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or x.shape[2] == 0:
        raise ValueError(f"{name}: shape {x.shape}: expected a 3-D array {ndim_name} "
                         "with a headdim of at least 1")
    return x


def _check_cu_seqlens(name, cu_seqlens, total, total_name):
    """The sequence bounds ``[(start, end), ...]`` of int32 offsets ``cu_seqlens``."""
    cu = np.asarray(cu_seqlens)
    if cu.dtype != np.int32:
        raise TypeError(f"{name}: dtype {cu.dtype}: expected int32 offsets")
    if cu.ndim != 1 or cu.size == 0:
        raise ValueError(f"{name}: shape {cu.shape}: expected a 1-D array of "
                         "batch + 1 offsets")
    if cu[0] != 0:
        raise ValueError(f"{name}[0]={int(cu[0])}: expected 0")
    lengths = np.diff(cu.astype(np.int64))
    if np.any(lengths < 0):
        b = int(np.argmax(lengths < 0))
        raise ValueError(f"{name}: {_shown(cu.tolist())}: expected non-decreasing "
                         f"offsets ({name}[{b + 1}]={int(cu[b + 1])} < "
                         f"{name}[{b}]={int(cu[b])})")
    if cu[-1] != total:
        raise ValueError(f"{name}[-1]={int(cu[-1])}: expected {total_name}={total}")
    return [(int(a), int(e)) for a, e in zip(cu[:-1], cu[1:])]


def _check_max_seqlen(name, max_seqlen, bounds, cu_name):
    max_seqlen = _check_seqlen(name, max_seqlen)
    longest = max((e - a for a, e in bounds), default=0)
    if max_seqlen < longest:
        raise ValueError(f"{name}={max_seqlen}: expected at least the longest "
                         f"sequence in {cu_name} ({longest})")


def _prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    causal, softmax_scale, window_size, softcap, alibi_slopes,
                    dropout_p, seed, mods=None):
    """Validate varlen arguments; q, k, v as float64 and the bounds of each
    sequence ``[(q_start, q_end, k_start, k_end), ...]``."""
    causal = _check_causal(causal)
    q = _check_packed(q, "q", "(total_q, heads, headdim)")
    k = _check_packed(k, "k", "(total_k, heads_kv, headdim)")
    v = _check_packed(v, "v", "(total_k, heads_kv, headdim_v)")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k: shape {k.shape}: expected the headdim of q {q.shape}")
    _check_kv_heads(k.shape[1], q.shape[1])
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v: shape {v.shape}: expected the total_k and heads of k {k.shape}")
    bq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q")
    bk = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], "total_k")
    if len(bk) != len(bq):
        raise ValueError(f"cu_seqlens_k: {len(bk) + 1} offsets: expected as many as "
                         f"cu_seqlens_q ({len(bq) + 1}): one per sequence, plus one")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q, bq, "cu_seqlens_q")
    _check_max_seqlen("max_seqlen_k", max_seqlen_k, bk, "cu_seqlens_k")
    scale = _resolve_scale(softmax_scale, q.shape[2])
    var = _variants(causal, window_size, softcap, alibi_slopes, dropout_p, seed,
                    batch=len(bq), heads=q.shape[1], seqlen_k=max_seqlen_k, **(mods or {}))
    _check_block_mask(var.block_mask, len(bq), q.shape[1], max_seqlen_q, max_seqlen_k,
                      "max_seqlen_q and max_seqlen_k")
    bounds = [(a, e, c, f) for (a, e), (c, f) in zip(bq, bk)]
    return q, k, v, bounds, scale, var


def _sequence(x, start, end):
    """Rows ``start .. end - 1`` of a packed (total, H, d) array as (1, H, n, d)."""
    return x[start:end].transpose(1, 0, 2)[None]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, dropout_p=0.0, seed=None, score_mod=None,
                     block_mask=None, mod_args=()):
    """Standard attention of variable-length sequences packed along one axis
    (FlashAttention-2's ``flash_attn_varlen_func``), in float64.

    Parameters
    ----------
    q : (total_q, heads, headdim); k : (total_k, heads_kv, headdim);
    v : (total_k, heads_kv, headdim_v)
    cu_seqlens_q, cu_seqlens_k : int32 (batch + 1,) offsets, starting at 0,
        non-decreasing, ending at total_q / total_k: sequence ``b`` is rows
        ``cu_seqlens[b] .. cu_seqlens[b + 1] - 1`` (it may be empty).
    max_seqlen_q, max_seqlen_k : ints at least every sequence's length.
    The keywords are :func:`attention`'s; each sequence is its own attention
    (causal and window aligned to its own lengths), ``alibi_slopes`` may be
    (batch, heads) indexed by sequence, and dropout's ``b`` is the sequence.
    ``score_mod``, ``block_mask`` and ``mod_args`` as :func:`attention`'s, with
    ``b`` the sequence and ``q_idx``, ``kv_idx`` positions within it: the block
    mask is made for (batch or 1, heads or 1, max_seqlen_q, max_seqlen_k).

    Returns
    -------
    out : float64 (total_q, heads, headdim_v)
    lse : float64 (heads, total_q)
    """
    q, k, v, bounds, scale, var = _prepare_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
        softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
        dict(score_mod=score_mod, block_mask=block_mask, mod_args=mod_args))
    out = np.zeros(q.shape[:2] + v.shape[2:])
    lse = np.empty((q.shape[1], q.shape[0]))
    for b, (q0, q1, k0, k1) in enumerate(bounds):
        o, l = _attention(_sequence(q, q0, q1), _sequence(k, k0, k1),
                          _sequence(v, k0, k1), scale, var.sequence(b))
        out[q0:q1] = o[0].transpose(1, 0, 2)
        lse[:, q0:q1] = l[0]
    return out, lse


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, *, causal=False,
                              softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, dropout_p=0.0, seed=None, score_mod=None,
                              score_mod_grad=None, block_mask=None, mod_args=()):
    """Backward of :func:`attention_varlen` from its ``out`` (total_q, heads,
    headdim_v) and ``lse`` (heads, total_q); ``dout`` is shaped like ``out``.
    Returns float64 ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``."""
    q, k, v, bounds, scale, var = _prepare_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
        softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
        dict(score_mod=score_mod, score_mod_grad=score_mod_grad, block_mask=block_mask,
             mod_args=mod_args))
    out = np.asarray(out, dtype=np.float64)
    want = q.shape[:2] + v.shape[2:]
    if out.shape != want:
        raise ValueError(f"out: shape {out.shape}: expected (total_q, heads, headdim_v) "
                         f"= {want}")
    dout = np.asarray(dout, dtype=np.float64)
    if dout.shape != want:
        raise ValueError(f"dout: shape {dout.shape}: expected the shape of out {want}")
    lse = np.asarray(lse, dtype=np.float64)
    if lse.shape != (q.shape[1], q.shape[0]):
        raise ValueError(f"lse: shape {lse.shape}: expected (heads, total_q) = "
                         f"{(q.shape[1], q.shape[0])}")
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, (q0, q1, k0, k1) in enumerate(bounds):
        grads = _attention_backward(
            _sequence(dout, q0, q1), _sequence(q, q0, q1), _sequence(k, k0, k1),
            _sequence(v, k0, k1), _sequence(out, q0, q1), lse[None, :, q0:q1], scale,
            var.sequence(b))
        for g, x, (a, e) in zip(grads, (dq, dk, dv), ((q0, q1), (k0, k1), (k0, k1))):
            x[a:e] = g[0].transpose(1, 0, 2)
    return dq, dk, dv


# ---------------------------------------------------------------------------
# Inference: a KV cache (flash_attn_with_kvcache), and merging partial attentions
# ---------------------------------------------------------------------------

def merge_attention(out_parts, lse_parts):
    """Combine attentions over disjoint key sets into the attention over their union.

    ``out_parts`` (S, batch, seqlen_q, heads, headdim) and ``lse_parts`` (S, batch,
    heads, seqlen_q): part ``s`` is ``softmax(S_s) V_s`` with its log-sum-exp.  With
    ``m = max_s lse_s`` and ``w_s = exp(lse_s - m)``::

        lse = m + log(sum_s w_s),   out = sum_s w_s * out_s / sum_s w_s

    A part whose lse is -inf (it saw no key) contributes nothing, whatever its out; a
    row no part saw gets out = 0 and lse = -inf; a NaN or +inf lse makes the row NaN.
    Returns float64 ``(out, lse)`` of shapes (batch, seqlen_q, heads, headdim) and
    (batch, heads, seqlen_q)."""
    out = np.asarray(out_parts, dtype=np.float64)
    lse = np.asarray(lse_parts, dtype=np.float64)
    if out.ndim != 5 or lse.shape != (out.shape[0], out.shape[1], out.shape[3], out.shape[2]):
        raise ValueError(f"out_parts, lse_parts: shapes {out.shape}, {lse.shape}: expected (S, batch, seqlen_q, "
                         "heads, headdim) and (S, batch, heads, seqlen_q)")
    bad = np.any(np.isnan(lse) | np.isposinf(lse), axis=0)  # (B, H, Nq)
    lse = np.where(bad, -np.inf, lse)
    m = lse.max(axis=0, initial=-np.inf)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse - m_safe)  # 0 for a part that saw nothing
    total = w.sum(axis=0)
    seen = total > 0
    merged_lse = np.where(seen, m_safe + np.log(np.where(seen, total, 1.0)), -np.inf)
    frac = w / np.where(seen, total, 1.0)  # (S, B, H, Nq)
    used = np.where((w > 0)[..., None].transpose(0, 1, 3, 2, 4), out, 0.0)  # a weight-0 part is not read
    merged = np.einsum("sbhq,sbqhd->bqhd", frac, used)
    nan_rows = bad.transpose(0, 2, 1)[..., None]  # (B, Nq, H, 1)
    return np.where(nan_rows, np.nan, merged), np.where(bad, np.nan, merged_lse)


def apply_rotary(x, cos, sin, positions, interleaved=True):
    """Rotary embeddings (RoPE) of ``x`` (..., n, heads, d) at ``positions`` (n,):
    the first ``rotary_dim = 2 * cos.shape[1]`` features of each row are rotated by
    the angles of row ``positions[i]`` of ``cos``/``sin`` (seqlen_ro, rotary_dim / 2),
    the rest left as they are.  ``interleaved``: pairs (0, 1), (2, 3), ... (GPT-J);
    else the halves (i, i + rotary_dim / 2) (GPT-NeoX), as FlashAttention-2."""
    x = np.asarray(x, dtype=np.float64)
    half = cos.shape[1]
    c = np.asarray(cos, dtype=np.float64)[positions][:, None, :]  # (n, 1, half)
    s = np.asarray(sin, dtype=np.float64)[positions][:, None, :]
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * c - b * s
        out[..., 1:2 * half:2] = a * s + b * c
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * c - b * s
        out[..., half:2 * half] = a * s + b * c
    return out


def _cache_rows(cache, b, cb, n, block_table):
    """Rows 0 .. n - 1 of sequence b's cache: (n, heads_kv, d) views' copies (paged:
    through ``block_table``; else batch ``cb`` of the cache)."""
    if block_table is None:
        return cache[cb, :n]
    page = cache.shape[1]
    pos = np.arange(n)
    return cache[block_table[b, pos // page], pos % page]


def _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                   rotary_cos, rotary_sin):
    """The KV-cache call's shapes and bounds (ValueError naming the argument)."""
    if q.ndim != 4:
        raise ValueError(f"q: shape {q.shape}: expected (batch, seqlen_q, heads, headdim)")
    B, nq, heads, d = q.shape
    if k_cache.ndim != 4 or v_cache.shape[:3] != k_cache.shape[:3] or k_cache.shape[3] != d:
        raise ValueError(f"k_cache, v_cache: shapes {k_cache.shape}, {v_cache.shape}: expected (batch_cache or "
                         f"num_blocks, seqlen_cache or page_size, heads_kv, {d})")
    _check_kv_heads(k_cache.shape[2], heads)
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and values, or neither")
    n_new = 0
    if k is not None:
        want = (B, k.shape[1], k_cache.shape[2], d)
        if k.shape != want or v.shape[:3] != want[:3] or v.shape[3] != v_cache.shape[3]:
            raise ValueError(f"k, v: shapes {k.shape}, {v.shape}: expected (batch, seqlen_new, heads_kv, headdim) "
                             f"= {want}")
        n_new = k.shape[1]
    if cache_seqlens is None:
        lens = np.zeros(B, np.int64)
    elif _is_int(cache_seqlens):
        lens = np.full(B, int(cache_seqlens), np.int64)
    else:
        lens = np.asarray(cache_seqlens)
        if lens.shape != (B,) or lens.dtype.kind not in "iu":
            raise ValueError(f"cache_seqlens: shape {lens.shape}, dtype {lens.dtype}: expected an int or an int32 "
                             f"array ({B},)")
        lens = lens.astype(np.int64)
    if np.any(lens < 0):
        raise ValueError(f"cache_seqlens: {lens.tolist()}: expected lengths >= 0")
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: not with a paged cache (block_table gives each sequence's pages)")
        block_table = np.asarray(block_table)
        if block_table.ndim != 2 or block_table.shape[0] != B or block_table.dtype.kind not in "iu":
            raise ValueError(f"block_table: shape {block_table.shape}: expected int32 (batch, max_blocks) = ({B}, ...)")
        capacity = block_table.shape[1] * k_cache.shape[1]
        used = -(-(lens + n_new) // k_cache.shape[1])
        for b in range(B):
            pages = block_table[b, :used[b]]
            if np.any(pages < 0) or np.any(pages >= k_cache.shape[0]):
                raise ValueError(f"block_table[{b}]: pages {pages.tolist()}: expected indices in [0, "
                                 f"{k_cache.shape[0]}) (num_blocks)")
        batch_idx = None
    else:
        capacity = k_cache.shape[1]
        batch_idx = np.arange(B) if cache_batch_idx is None else np.asarray(cache_batch_idx).astype(np.int64)
        if batch_idx.shape != (B,) or np.any(batch_idx < 0) or np.any(batch_idx >= k_cache.shape[0]):
            raise ValueError(f"cache_batch_idx: {batch_idx.tolist()}: expected ({B},) indices in [0, "
                             f"{k_cache.shape[0]})")
    over = np.nonzero(lens + n_new > capacity)[0]
    if over.size:
        b = int(over[0])
        raise ValueError(f"cache_seqlens[{b}] + seqlen_new = {int(lens[b])} + {n_new} > {capacity}: past the end "
                         "of the cache" + (" (its pages)" if block_table is not None else ""))
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos, rotary_sin: give both or neither")
    if rotary_cos is not None:
        cos, sin = np.shape(rotary_cos), np.shape(rotary_sin)  # (shapes only: device arrays too)
        if len(cos) != 2 or cos != sin or 2 * cos[1] > d or cos[1] == 0:
            raise ValueError(f"rotary_cos, rotary_sin: shapes {cos}, {sin}: expected (seqlen_ro, "
                             f"rotary_dim / 2) each, rotary_dim <= headdim {d}")
        if int((lens + max(n_new, nq)).max(initial=0)) > cos[0]:
            raise ValueError(f"rotary_cos: {cos[0]} positions: expected at least cache_seqlens + "
                             f"max(seqlen_new, seqlen_q) = {int((lens + max(n_new, nq)).max(initial=0))}")
    return lens, n_new, batch_idx, block_table


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None,
                           cache_batch_idx=None, block_table=None, rotary_cos=None,
                           rotary_sin=None, rotary_interleaved=True, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           num_splits=1, return_lse=False):
    """Attention of new queries over a KV cache (FlashAttention-2's
    ``flash_attn_with_kvcache``), in float64, bshd.

    Parameters
    ----------
    q : (batch, seqlen_q, heads, headdim)
    k_cache, v_cache : (batch_cache, seqlen_cache, heads_kv, headdim) NumPy arrays, or
        paged: (num_blocks, page_size, heads_kv, headdim) with ``block_table``
        (batch, max_blocks) int32, logical page j of sequence b being physical page
        ``block_table[b, j]``.
    k, v : optional (batch, seqlen_new, heads_kv, headdim): written into the caches
        **in place** at positions ``cache_seqlens[b] ..`` (k after rotary), nothing
        else of the caches touched; attention then runs over ``cache_seqlens +
        seqlen_new`` keys.
    cache_seqlens : int or (batch,) ints: the cache's lengths before the append (None: 0).
    cache_batch_idx : (batch,) ints: the cache's batch row of each sequence
        (contiguous caches only; default 0 .. batch - 1).
    rotary_cos, rotary_sin : (seqlen_ro, rotary_dim / 2): k rotated at its positions;
        q at ``cache_seqlens + i`` when causal or windowed, else all at
        ``cache_seqlens`` (FlashAttention-2's rule).  :func:`apply_rotary`.
    causal, window_size, softcap, alibi_slopes, softmax_scale : as :func:`attention`,
        aligned bottom-right to each sequence's ``cache_seqlens + seqlen_new`` keys.
    num_splits : the keys cut into this many contiguous parts, each attended alone and
        the parts merged (:func:`merge_attention`): the same result to rounding.

    Returns
    -------
    out : float64 (batch, seqlen_q, heads, headdim_v); with ``return_lse`` also
    lse : float64 (batch, heads, seqlen_q).
    """
    q = np.asarray(q, dtype=np.float64)
    lens, n_new, batch_idx, block_table = _check_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin)
    if not _is_int(num_splits) or num_splits < 1:
        raise ValueError(f"num_splits={_shown(num_splits)}: expected an int >= 1")
    B, nq, heads, d = q.shape
    scale = _resolve_scale(softmax_scale, d)
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])  # FA2's seqlen_k
    var = _variants(causal, window_size, softcap, alibi_slopes, 0.0, None, batch=B, heads=heads,
                    seqlen_k=capacity)
    rotate_q_by_row = causal or var.window != (-1, -1)
    out = np.zeros(q.shape[:3] + (v_cache.shape[3],))
    lse = np.empty((B, heads, nq))
    for b in range(B):
        start = int(lens[b])
        cb = None if batch_idx is None else int(batch_idx[b])
        if n_new:  # the append, in place: rows start .. start + n_new - 1
            k_b = np.asarray(k[b], dtype=np.float64)
            if rotary_cos is not None:
                k_b = apply_rotary(k_b, rotary_cos, rotary_sin, start + np.arange(n_new), rotary_interleaved)
            pos = start + np.arange(n_new)
            for cache, new in ((k_cache, k_b), (v_cache, np.asarray(v[b]))):
                if block_table is None:
                    cache[cb, pos] = new
                else:
                    page = cache.shape[1]
                    cache[block_table[b, pos // page], pos % page] = new
        nk = start + n_new
        q_b = q[b]
        if rotary_cos is not None:
            where = start + (np.arange(nq) if rotate_q_by_row else np.zeros(nq, int))
            q_b = apply_rotary(q_b, rotary_cos, rotary_sin, where, rotary_interleaved)
        kk = np.asarray(_cache_rows(k_cache, b, cb, nk, block_table), dtype=np.float64)
        vv = np.asarray(_cache_rows(v_cache, b, cb, nk, block_table), dtype=np.float64)
        qh, kh, vh = (x.transpose(1, 0, 2)[None] for x in (q_b, kk, vv))
        rows, one = np.arange(nq), var.sequence(b)
        parts = []
        for a, e in _splits(nk, num_splits):
            s, _ = _scores(qh, _expand(kh[:, :, a:e], heads), rows, np.arange(a, e), nk - nq, scale, one)
            p, l_safe, part_lse = _unnormalised_softmax(s)
            parts.append(((p / l_safe) @ _expand(vh[:, :, a:e], heads), part_lse))
        o_parts = np.stack([o.transpose(0, 2, 1, 3) for o, _ in parts])  # (S, 1, nq, heads, dv)
        o_b, l_b = merge_attention(o_parts, np.stack([l for _, l in parts]))
        out[b], lse[b] = o_b[0], l_b[0]
    return (out, lse) if return_lse else out


def _splits(n, parts):
    """``parts`` contiguous ranges covering 0 .. n - 1 (some empty when n < parts)."""
    edges = [n * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


# ---------------------------------------------------------------------------
# "Standard attention in the same precision" baseline
# ---------------------------------------------------------------------------

def _resolve_lowp_dtype(dtype):
    allowed = {np.dtype(np.float16), np.dtype(np.float32)}
    try:
        import ml_dtypes  # lazily: only bfloat16 needs it
        allowed.add(np.dtype(ml_dtypes.bfloat16))
    except ImportError:  # pragma: no cover - then bfloat16 is simply not offered
        pass
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in allowed:
        raise ValueError(
            f"dtype={dtype!r}: expected np.float16, np.float32 or ml_dtypes.bfloat16")
    return dt


def _mm(a, b, dtype):
    """Matmul of two ``dtype`` arrays computed in float32, result rounded to ``dtype``."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)


def _f32(x):
    return x.astype(np.float32)


def _lowp_scores(q, k, scale, var, dtype):
    """S = Q K^T rounded to ``dtype``; then scaled, capped, biased and masked in
    float32; and the softcap's tanh (float32)."""
    nq, nk = q.shape[2], k.shape[2]
    s = scale * _f32(_mm(q, k.swapaxes(-1, -2), dtype))
    s, t = _score_mods(s, np.arange(nq), np.arange(nk), nk - nq, var)
    return s.astype(np.float32), t


def attention_lowp(q, k, v, *, dtype, causal=False, softmax_scale=None, layout="bshd",
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                   seed=None, score_mod=None,
                   block_mask=None, mod_args=()):
    """Standard attention computed in ``dtype``: the FlashAttention-2 style
    "same precision" baseline that kernel errors are measured against.

    Inputs are rounded to ``dtype`` (np.float16, np.float32 or
    ml_dtypes.bfloat16); every matmul is computed in float32 and its output
    rounded to ``dtype``; the softmax (with softcap, ALiBi, mask) is computed
    in float32 and ``P`` (dropped: ``P * Z / (1 - p)``) rounded to ``dtype``.
    Shapes and keywords as in :func:`attention`.

    Returns ``(out, lse)``: ``out`` of ``dtype`` in ``layout``, ``lse`` float32
    (batch, heads, seqlen_q).
    """
    dt = _resolve_lowp_dtype(dtype)
    q, k, v, scale, var = _prepare(q, k, v, softmax_scale, layout, causal, window_size,
                                   softcap, alibi_slopes, dropout_p, seed,
                                   mods=dict(score_mod=score_mod, block_mask=block_mask,
                                             mod_args=mod_args))
    h = q.shape[1]
    q, k, v = q.astype(dt), _expand(k, h).astype(dt), _expand(v, h).astype(dt)
    s, _ = _lowp_scores(q, k, scale, var, dt)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # -inf for Nk = 0
    m_safe = np.where(np.isneginf(m), np.float32(0), m)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True, dtype=np.float32)
    has_keys = l != 0  # a NaN sum (a NaN or +inf score) keeps its row NaN
    l_safe = np.where(has_keys, l, np.float32(1))
    p = p / l_safe
    keep = _keep_scale(var, h, np.arange(q.shape[2]), np.arange(k.shape[2]), np.float32)
    if keep is not None:
        p = p * keep
    out = _mm(p.astype(dt), v, dt)
    lse = np.where(has_keys, m_safe + np.log(l_safe), np.float32(-np.inf))[..., 0]
    return _from_bhsd(out, layout), lse.astype(np.float32)


def attention_backward_lowp(dout, q, k, v, out, lse, *, dtype, causal=False,
                            softmax_scale=None, layout="bshd", window_size=(-1, -1),
                            softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None,
                            score_mod=None, score_mod_grad=None, block_mask=None,
                            mod_args=()):
    """Standard attention backward computed in ``dtype`` (see :func:`attention_lowp`).

    Inputs rounded to ``dtype`` (``lse`` to float32); ``P`` rebuilt from
    ``lse`` in float32 and rounded; ``dV = P^T dO`` (dropped P),
    ``dP = dO V^T``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q`` each
    computed in float32 and rounded to ``dtype``; ``dS = P * (dP - D)`` (with
    dropout's and softcap's factors) computed in float32 and rounded.  With
    grouped-query attention the per-query-head dK, dV are summed over each
    group in float32 and rounded again.  Returns ``(dq, dk, dv)`` of ``dtype``,
    shaped like ``q``, ``k``, ``v`` in ``layout``.
    """
    dt = _resolve_lowp_dtype(dtype)
    dout, q, k, v, out, lse, scale, var = _prepare_backward(
        dout, q, k, v, out, lse, softmax_scale, layout, causal, window_size, softcap,
        alibi_slopes, dropout_p, seed,
        mods=dict(score_mod=score_mod, score_mod_grad=score_mod_grad, block_mask=block_mask,
                  mod_args=mod_args))
    h, h_kv = q.shape[1], k.shape[1]
    k, v = _expand(k, h), _expand(v, h)
    dout, q, k, v, out = (x.astype(dt) for x in (dout, q, k, v, out))
    lse = lse.astype(np.float32)
    s, t = _lowp_scores(q, k, scale, var, dt)
    p = _probs_from_lse(s, lse).astype(np.float32).astype(dt)
    keep = _keep_scale(var, h, np.arange(q.shape[2]), np.arange(k.shape[2]), np.float32)
    p_drop = p if keep is None else (_f32(p) * keep).astype(dt)
    delta = np.sum(_f32(dout) * _f32(out), axis=-1, dtype=np.float32)
    dv = _mm(p_drop.swapaxes(-1, -2), dout, dt)
    dp = _f32(_mm(dout, v.swapaxes(-1, -2), dt))
    if keep is not None:
        dp = dp * keep
    ds = _softcap_grad(_f32(p) * (dp - delta[..., None]), t).astype(dt)
    dq = (np.float32(scale) * (_f32(ds) @ _f32(k))).astype(dt)
    dk = (np.float32(scale) * (_f32(ds).swapaxes(-1, -2) @ _f32(q))).astype(dt)
    dk, dv = _group_sum(dk, h_kv, dt), _group_sum(dv, h_kv, dt)
    return _from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout)


def round_tf32(x):
    """``x`` rounded to TF32 (10 explicit mantissa bits, the fp32 exponent range), as
    ``cvt.rna.tf32.f32``: to nearest, ties away from zero; returned as float32.

    Works on the float32 bit pattern: add half of the 13 dropped bits' range to the
    magnitude bits and clear them (a carry into the exponent is the correct rounding).
    inf and NaN are returned as they are.
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


def _tf32(x):
    return round_tf32(x).astype(np.float64)


def attention_tf32(q, k, v, *, causal=False, softmax_scale=None, layout="bshd",
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                   seed=None, score_mod=None,
                   block_mask=None, mod_args=()):
    """Standard attention with TF32 tensor-core inputs: the "same precision" baseline
    of the ``allow_tf32=True`` forward.

    Q, K and V are rounded to TF32 (:func:`round_tf32`); ``S = scale * Q K^T``, the
    variants, the softmax and ``P V`` are computed in float64, except that the
    unnormalised ``P = exp(S - m)`` is rounded to TF32 before ``P V`` (its row sum
    ``l`` is not), as a kernel feeding P to an mma does; dropout then zeroes the
    dropped entries and scales by ``1 / (1 - p)``.  Returns ``(out, lse)`` in float64,
    ``out`` in ``layout``, ``lse`` (batch, heads, seqlen_q).
    """
    q, k, v, scale, var = _prepare(q, k, v, softmax_scale, layout, causal, window_size,
                                   softcap, alibi_slopes, dropout_p, seed,
                                   mods=dict(score_mod=score_mod, block_mask=block_mask,
                                             mod_args=mod_args))
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    q, k, v = _tf32(q), _tf32(_expand(k, h)), _tf32(_expand(v, h))
    rows, cols = np.arange(nq), np.arange(nk)
    s, _ = _scores(q, k, rows, cols, nk - nq, scale, var)
    p, l_safe, lse = _unnormalised_softmax(s)
    p = _tf32(p)
    keep = _keep_scale(var, h, rows, cols)
    if keep is not None:
        p = p * keep
    out = (p @ v) / l_safe
    return _from_bhsd(out, layout), lse


def attention_backward_tf32(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None,
                            layout="bshd", window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, dropout_p=0.0, seed=None,
                            score_mod=None, score_mod_grad=None, block_mask=None,
                            mod_args=()):
    """Standard attention backward with TF32 tensor-core inputs: the "same precision"
    baseline of the ``allow_tf32=True`` backward.

    Q, K, V and dO are rounded to TF32 (:func:`round_tf32`) as matmul operands;
    ``P = exp(S - lse)`` (S with the variants) and ``dP = dO V^T`` are computed in
    float64 from them; ``dS = P * (dP - D)`` (with dropout's and softcap's factors)
    uses the unrounded P and ``D = rowsum(dO * O)`` the unrounded dO and O; P (dropped)
    and dS are rounded to TF32 before ``dV = P^T dO``, ``dQ = scale * dS K`` and
    ``dK = scale * dS^T Q``, as a kernel feeding them to an mma does.  Returns
    ``(dq, dk, dv)`` in float64, shaped like ``q``, ``k``, ``v`` in ``layout``.
    """
    dout, q, k, v, out, lse, scale, var = _prepare_backward(
        dout, q, k, v, out, lse, softmax_scale, layout, causal, window_size, softcap,
        alibi_slopes, dropout_p, seed,
        mods=dict(score_mod=score_mod, score_mod_grad=score_mod_grad, block_mask=block_mask,
                  mod_args=mod_args))
    h, h_kv, nq, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    rows, cols = np.arange(nq), np.arange(nk)
    delta = np.sum(dout * out, axis=-1)
    t_q, t_k, t_v, t_do = (_tf32(x) for x in (q, _expand(k, h), _expand(v, h), dout))
    s, t = _scores(t_q, t_k, rows, cols, nk - nq, scale, var)
    p = _probs_from_lse(s, lse)
    keep = _keep_scale(var, h, rows, cols)
    dp = t_do @ t_v.swapaxes(-1, -2)
    if keep is not None:
        dp = dp * keep
    ds = _softcap_grad(p * (dp - delta[..., None]), t)
    t_p, t_ds = _tf32(p if keep is None else p * keep), _tf32(ds)
    dv = t_p.swapaxes(-1, -2) @ t_do
    dq = scale * (t_ds @ t_k)
    dk = scale * (t_ds.swapaxes(-1, -2) @ t_q)
    dk, dv = _group_sum(dk, h_kv), _group_sum(dv, h_kv)
    return _from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout)


# ---------------------------------------------------------------------------
# Error measures
# ---------------------------------------------------------------------------

def _abs_diff(x, ref):
    """|x - ref| in float64; equal infinities count 0, NaN anywhere counts inf."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        raise ValueError(f"x: shape {x.shape}: expected the shape of ref {ref.shape}")
    with np.errstate(invalid="ignore"):
        diff = np.abs(x - ref)  # inf - inf gives NaN here, fixed just below
    same_inf = np.isinf(ref) & (x == ref)
    diff = np.where(same_inf, 0.0, diff)
    # A NaN (in x, or -inf against +inf) must never pass a tolerance.
    diff = np.where(np.isnan(diff), np.inf, diff)
    return diff, ref


def max_abs_error(x, ref):
    """``max |x - ref|`` as a float, computed in float64.

    NaN gives inf; equal infinities (e.g. -inf LSE of a fully masked row in
    both) count 0; an infinity in only one of them counts inf.
    """
    diff, _ = _abs_diff(x, ref)
    return float(diff.max()) if diff.size else 0.0


def rel_error(x, ref):
    """``max |x - ref| / max(max |ref|, tiny)`` as a float, computed in float64.

    Infinite entries of ``ref`` are left out of the denominator; NaN and
    infinities are treated as in :func:`max_abs_error`.
    """
    diff, ref = _abs_diff(x, ref)
    if diff.size == 0:
        return 0.0
    finite_ref = np.abs(ref[np.isfinite(ref)])
    denom = max(float(finite_ref.max()) if finite_ref.size else 0.0,
                np.finfo(np.float64).tiny)
    return float(diff.max()) / denom

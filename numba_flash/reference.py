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
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "causal_mask",
    "attention",
    "online_softmax",
    "online_softmax_blocks",
    "flash_forward",
    "attention_backward",
    "flash_backward",
    "attention_lowp",
    "attention_backward_lowp",
    "round_tf32",
    "attention_tf32",
    "attention_backward_tf32",
    "rel_error",
    "max_abs_error",
]

_LAYOUTS = ("bhsd", "bshd")


# ---------------------------------------------------------------------------
# Argument checking and layout handling
# ---------------------------------------------------------------------------

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
    if (isinstance(block, (bool, np.bool_))
            or not isinstance(block, numbers.Integral) or block < 1):
        raise ValueError(f"{name}={block!r}: expected a positive int")
    return int(block)


def _check_seqlen(name, n):
    if (isinstance(n, (bool, np.bool_))
            or not isinstance(n, numbers.Integral) or n < 0):
        raise ValueError(f"{name}={n!r}: expected a non-negative int")
    return int(n)


def _resolve_scale(softmax_scale, headdim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    value = math.nan
    if (not isinstance(softmax_scale, (bool, np.bool_))
            and isinstance(softmax_scale, numbers.Real)):
        try:
            value = float(softmax_scale)
        except OverflowError:  # an int beyond float64, e.g. 10**400
            pass
    if not math.isfinite(value):
        shown = repr(softmax_scale)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ValueError(
            f"softmax_scale={shown}: expected None or a real number finite in float64")
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


def _prepare(q, k, v, causal, softmax_scale, layout):
    """Validate the common arguments; return bhsd float64 q, k, v and the scale."""
    _check_layout(layout)
    causal = _check_causal(causal)
    q = _to_bhsd(q, "q", layout)
    k = _to_bhsd(k, "k", layout)
    v = _to_bhsd(v, "v", layout)
    if k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k: {_dims(k)}: expected the batch, heads and headdim of q ({_dims(q)})")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v: {_dims(v)}: expected the batch, heads and seqlen of k ({_dims(k)})")
    scale = _resolve_scale(softmax_scale, q.shape[3])
    return q, k, v, causal, scale


def _prepare_backward(dout, q, k, v, out, lse, causal, softmax_scale, layout):
    q, k, v, causal, scale = _prepare(q, k, v, causal, softmax_scale, layout)
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
    return dout, q, k, v, out, lse, causal, scale


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


def _masked_scores(q, k, causal, scale):
    """``S = scale * Q K^T`` (b, h, Nq, Nk) with masked entries at -inf."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0, overflow: IEEE
        s = scale * (q @ k.swapaxes(-1, -2))
    if causal:
        s = np.where(causal_mask(q.shape[2], k.shape[2]), s, -np.inf)
    return s


def attention(q, k, v, *, causal=False, softmax_scale=None, layout="bshd"):
    """Standard (materialised) attention in float64.

    Parameters
    ----------
    q : array, (batch, seqlen_q, heads, headdim)   [bshd, the default]
    k : array, (batch, seqlen_k, heads, headdim)
    v : array, (batch, seqlen_k, heads, headdim_v)
        With ``layout="bhsd"`` the seqlen and heads axes are swapped.

    Returns
    -------
    out : float64 array, (batch, seqlen_q, heads, headdim_v)  [in ``layout``]
    lse : float64 array, (batch, heads, seqlen_q), natural-log sum-exp of the
        scaled scores; ``-inf`` for a row that sees no key (whose ``out`` is 0).

    A NaN or ``+inf`` score in a row makes that row of ``out`` and ``lse``
    NaN; ``-inf`` scores count as masked (see the module docstring).
    """
    q, k, v, causal, scale = _prepare(q, k, v, causal, softmax_scale, layout)
    p, l_safe, lse = _unnormalised_softmax(_masked_scores(q, k, causal, scale))
    out = (p / l_safe) @ v
    return _from_bhsd(out, layout), lse


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
                  block_m=16, block_n=16, layout="bshd"):
    """Tiled FlashAttention-2 forward pass in float64 NumPy.

    Same arguments and results as :func:`attention` (``out`` in ``layout``,
    ``lse`` of shape (batch, heads, seqlen_q)), computed tile by tile:
    ``block_m`` query rows at a time (outer loop, ``start_m``), ``block_n``
    keys at a time (inner loop, ``start_n``), never holding more than one
    (block_m x block_n) score tile per (batch, head).  Batch and heads are
    vectorised; only the tiles are looped over.
    """
    q, k, v, causal, scale = _prepare(q, k, v, causal, softmax_scale, layout)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    b, h, nq, _ = q.shape
    nk, dv_dim = k.shape[2], v.shape[3]
    # Bottom-right alignment: query i sees keys j <= i + offset.
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

        # Causal: the last row of the tile sees keys < end_m + offset; key
        # tiles starting at or beyond that are entirely masked and skipped.
        end_n_all = min(nk, max(0, end_m + offset)) if causal else nk
        for start_n in range(0, end_n_all, block_n):
            end_n = min(start_n + block_n, nk)
            s = scale * (q_i @ k[:, :, start_n:end_n].swapaxes(-1, -2))
            # Only tiles that cross the diagonal need a mask: the first row
            # of the tile sees keys up to start_m + offset.
            if causal and end_n - 1 > start_m + offset:
                cols = np.arange(start_n, end_n)
                s = np.where(cols[None, :] <= rows[:, None] + offset, s, -np.inf)

            m_new = np.maximum(m_i, s.max(axis=-1))
            # As in FA2: a row with nothing visible yet has m_new = -inf; use 0
            # in its place so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m_i - m_safe)  # rescale for the grown max (0 at start)
            l_i = alpha * l_i + p.sum(axis=-1)
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
                       softmax_scale=None, layout="bshd"):
    """Materialised float64 backward pass from the saved ``lse``.

    Parameters
    ----------
    dout : (batch, seqlen_q, heads, headdim_v)  gradient of the loss w.r.t. ``out``
    q, k, v : as in :func:`attention`
    out : (batch, seqlen_q, heads, headdim_v)   forward output
    lse : (batch, heads, seqlen_q)              forward log-sum-exp (any layout)
        ``dout``, ``out`` in ``layout`` as ``q`` (bshd shown; bhsd swaps axes 1, 2).

    Returns
    -------
    dq, dk, dv : float64 arrays shaped like ``q``, ``k``, ``v`` (in ``layout``).
    """
    dout, q, k, v, out, lse, causal, scale = _prepare_backward(
        dout, q, k, v, out, lse, causal, softmax_scale, layout)
    p = _probs_from_lse(_masked_scores(q, k, causal, scale), lse)
    delta = np.sum(dout * out, axis=-1)  # D_i = rowsum(dO * O) = rowsum(P * dP)
    dv = p.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - delta[..., None])
    dq = scale * (ds @ k)
    dk = scale * (ds.swapaxes(-1, -2) @ q)
    return _from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout)


def flash_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None,
                   block_m=16, block_n=16, layout="bshd"):
    """Tiled FlashAttention-2 backward pass in float64 NumPy.

    Same arguments and results as :func:`attention_backward`.  As in FA2
    (Algorithm 2) the outer loop runs over key tiles (``start_n``), each
    accumulating its ``dK_j`` and ``dV_j`` over the query tiles
    (``start_m``) that see it, while ``dQ_i`` is accumulated across key
    tiles.  ``P`` is rebuilt tile by tile from ``lse``.
    """
    dout, q, k, v, out, lse, causal, scale = _prepare_backward(
        dout, q, k, v, out, lse, causal, softmax_scale, layout)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    nq, nk = q.shape[2], k.shape[2]
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

        # Causal: key start_n is first seen by query start_n - offset; query
        # tiles wholly before it are skipped (start at that row's tile).
        first_m = 0
        if causal:
            first_row = max(0, start_n - offset)
            first_m = (first_row // block_m) * block_m
        for start_m in range(first_m, nq, block_m):
            end_m = min(start_m + block_m, nq)
            sl = slice(start_m, end_m)
            s = scale * (q[:, :, sl] @ k_j.swapaxes(-1, -2))
            if causal and end_n - 1 > start_m + offset:
                rows = np.arange(start_m, end_m)
                s = np.where(cols[None, :] <= rows[:, None] + offset, s, -np.inf)
            p = _probs_from_lse(s, lse[:, :, sl])
            do_i = dout[:, :, sl]
            dv_j += p.swapaxes(-1, -2) @ do_i
            dp = do_i @ v_j.swapaxes(-1, -2)
            ds = p * (dp - delta[:, :, sl, None])
            dk_j += ds.swapaxes(-1, -2) @ q[:, :, sl]
            dq[:, :, sl] += ds @ k_j
        dk[:, :, start_n:end_n] = scale * dk_j
        dv[:, :, start_n:end_n] = dv_j
    dq *= scale
    return _from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout)


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


def _lowp_scores(q, k, causal, scale, dtype):
    """S = Q K^T rounded to ``dtype``; then scaled and masked in float32."""
    s = scale * _f32(_mm(q, k.swapaxes(-1, -2), dtype))
    if causal:
        s = np.where(causal_mask(q.shape[2], k.shape[2]), s, np.float32(-np.inf))
    return s.astype(np.float32)


def attention_lowp(q, k, v, *, dtype, causal=False, softmax_scale=None, layout="bshd"):
    """Standard attention computed in ``dtype``: the FlashAttention-2 style
    "same precision" baseline that kernel errors are measured against.

    Inputs are rounded to ``dtype`` (np.float16, np.float32 or
    ml_dtypes.bfloat16); every matmul is computed in float32 and its output
    rounded to ``dtype``; the softmax is computed in float32 and ``P`` rounded
    to ``dtype``.  Shapes as in :func:`attention`.

    Returns ``(out, lse)``: ``out`` of ``dtype`` in ``layout``, ``lse`` float32
    (batch, heads, seqlen_q).
    """
    dt = _resolve_lowp_dtype(dtype)
    q, k, v, causal, scale = _prepare(q, k, v, causal, softmax_scale, layout)
    q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
    s = _lowp_scores(q, k, causal, scale, dt)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # -inf for Nk = 0
    m_safe = np.where(np.isneginf(m), np.float32(0), m)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True, dtype=np.float32)
    has_keys = l != 0  # a NaN sum (a NaN or +inf score) keeps its row NaN
    l_safe = np.where(has_keys, l, np.float32(1))
    p = (p / l_safe).astype(dt)
    out = _mm(p, v, dt)
    lse = np.where(has_keys, m_safe + np.log(l_safe), np.float32(-np.inf))[..., 0]
    return _from_bhsd(out, layout), lse.astype(np.float32)


def attention_backward_lowp(dout, q, k, v, out, lse, *, dtype, causal=False,
                            softmax_scale=None, layout="bshd"):
    """Standard attention backward computed in ``dtype`` (see :func:`attention_lowp`).

    Inputs rounded to ``dtype`` (``lse`` to float32); ``P`` rebuilt from
    ``lse`` in float32 and rounded; ``dV = P^T dO``, ``dP = dO V^T``,
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q`` each computed in float32
    and rounded to ``dtype``; ``dS = P * (dP - D)`` computed in float32 and
    rounded.  Returns ``(dq, dk, dv)`` of ``dtype``, shaped like ``q``, ``k``,
    ``v`` in ``layout``.
    """
    dt = _resolve_lowp_dtype(dtype)
    dout, q, k, v, out, lse, causal, scale = _prepare_backward(
        dout, q, k, v, out, lse, causal, softmax_scale, layout)
    dout, q, k, v, out = (x.astype(dt) for x in (dout, q, k, v, out))
    lse = lse.astype(np.float32)
    s = _lowp_scores(q, k, causal, scale, dt)
    p = _probs_from_lse(s, lse).astype(np.float32).astype(dt)
    delta = np.sum(_f32(dout) * _f32(out), axis=-1, dtype=np.float32)
    dv = _mm(p.swapaxes(-1, -2), dout, dt)
    dp = _mm(dout, v.swapaxes(-1, -2), dt)
    ds = (_f32(p) * (_f32(dp) - delta[..., None])).astype(dt)
    dq = (np.float32(scale) * (_f32(ds) @ _f32(k))).astype(dt)
    dk = (np.float32(scale) * (_f32(ds).swapaxes(-1, -2) @ _f32(q))).astype(dt)
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


def attention_tf32(q, k, v, *, causal=False, softmax_scale=None, layout="bshd"):
    """Standard attention with TF32 tensor-core inputs: the "same precision" baseline
    of the ``allow_tf32=True`` forward.

    Q, K and V are rounded to TF32 (:func:`round_tf32`); ``S = scale * Q K^T``, the
    softmax and ``P V`` are computed in float64, except that the unnormalised
    ``P = exp(S - m)`` is rounded to TF32 before ``P V`` (its row sum ``l`` is not),
    as a kernel feeding P to an mma does.  Returns ``(out, lse)`` in float64, ``out``
    in ``layout``, ``lse`` (batch, heads, seqlen_q).
    """
    q, k, v, causal, scale = _prepare(q, k, v, causal, softmax_scale, layout)
    q, k, v = (round_tf32(x).astype(np.float64) for x in (q, k, v))
    p, l_safe, lse = _unnormalised_softmax(_masked_scores(q, k, causal, scale))
    out = (round_tf32(p).astype(np.float64) @ v) / l_safe
    return _from_bhsd(out, layout), lse


def attention_backward_tf32(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None,
                            layout="bshd"):
    """Standard attention backward with TF32 tensor-core inputs: the "same precision"
    baseline of the ``allow_tf32=True`` backward.

    Q, K, V and dO are rounded to TF32 (:func:`round_tf32`) as matmul operands;
    ``P = exp(scale * Q K^T - lse)`` and ``dP = dO V^T`` are computed in float64 from
    them; ``dS = P * (dP - D)`` uses the unrounded P and ``D = rowsum(dO * O)`` the
    unrounded dO and O; P and dS are rounded to TF32 before ``dV = P^T dO``,
    ``dQ = scale * dS K`` and ``dK = scale * dS^T Q``, as a kernel feeding them to an
    mma does.  Returns ``(dq, dk, dv)`` in float64, shaped like ``q``, ``k``, ``v`` in
    ``layout``.
    """
    dout, q, k, v, out, lse, causal, scale = _prepare_backward(
        dout, q, k, v, out, lse, causal, softmax_scale, layout)
    delta = np.sum(dout * out, axis=-1)
    t_q, t_k, t_v, t_do = (round_tf32(x).astype(np.float64) for x in (q, k, v, dout))
    p = _probs_from_lse(_masked_scores(t_q, t_k, causal, scale), lse)
    dp = t_do @ t_v.swapaxes(-1, -2)
    ds = p * (dp - delta[..., None])
    t_p, t_ds = (round_tf32(x).astype(np.float64) for x in (p, ds))
    dv = t_p.swapaxes(-1, -2) @ t_do
    dq = scale * (t_ds @ t_k)
    dk = scale * (t_ds.swapaxes(-1, -2) @ t_q)
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

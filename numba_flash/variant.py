"""FlashAttention-2's variants as the kernels see them: compile-time flags and run-time values.

A variant is written once, in the shared building blocks (``kernels/block_info``,
``kernels/mask``, ``kernels/score``), and every kernel family gets it.  Each kernel is
compiled per :class:`Variant` (a frozen set of flags: a feature that is off costs
nothing, its code is folded away), and takes the run-time values of the call as one
tuple parameter, ``params`` (:func:`params`), plus two arrays: ``alibi`` (B, H) slopes
and the varlen offsets ``cu_seqlens_q`` / ``cu_seqlens_k`` (dummies when unused).

Semantics (FlashAttention-2's, ``flash_attn_func``), per (batch, query head h):

* GQA/MQA: query head h reads KV head ``h // group`` (``group = H / H_kv``).
* window ``(left, right)``, −1 unbounded: query i sees key j iff
  ``i + diag − left ≤ j ≤ i + diag + right`` with ``diag = Nk − Nq``; causal is
  right = 0.
* softcap c > 0: ``s = scale·q·k`` becomes ``c·tanh(s / c)``.
* ALiBi: ``− slope[b, h] · |i + diag − j|`` is added (after the softcap).
* dropout p: kept probabilities are scaled by 1/(1 − p); the keep bit of (b, h, i, j)
  is ``kernels.dropout.keep`` (``reference.dropout_mask``).
* varlen: sequence b is rows ``cu[b] .. cu[b+1] − 1`` of the packed (total, H, d)
  arrays; every index above is relative to its sequence.

Imports no numba.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

#: Positions in the ``flags`` tuple a kernel closes over (``Variant.flags``): the
#: built-in variants' flags, FlexAttention's (``score_mod``, a block mask's ``mask_mod``,
#: a block-sparse walk) and its compiled functions (``numba_flash.kernels.flex``).
CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DROPOUT, VARLEN, GQA = range(8)
SCORE_MOD, MASK_MOD, BLOCK_SPARSE, SCORE_FN, GRAD_FN, MASK_FN = range(8, 14)
HEAVIEST_FIRST = 14  # the grid order of :attr:`Variant.heaviest_first`
PAGED, SPLIT = 15, 16  # a KV cache's keys through its block table; one split of the keys (kvcache)
CLUSTER = 17  # split-KV's splits of a row tile as one thread-block cluster of that many CTAs (0: none)

#: Positions in the ``params`` tuple (:func:`params`); every entry is 8 bytes wide
#: (int64 or float64), as every other kernel parameter.
GROUP, LEFT, RIGHT, SOFTCAP_VALUE, KEEP_THRESHOLD, SEED_K0, SEED_K1, KEEP_SCALE = range(8)
#: L2 sections of a heaviest-first grid (``kernels.spec.l2_sections``, ``block_info.l2_section``):
#: (head, batch) positions a section, of grids whose rows are queries / keys; 0: one section.
SECTION_Q, SECTION_K = 8, 9
PARAM_KINDS = ("int", "int", "int", "float", "int", "int", "int", "float", "int", "int")


@dataclass(frozen=True)
class Variant:
    """The compile-time part of a call's variants (the flags a kernel is compiled for).

    Attributes:
        causal: right bound 0 (bottom-right aligned).
        window_left, window_right: a finite left / right window bound (``window_right``
            is not set with ``causal``, whose bound is 0).
        softcap, alibi, dropout, varlen: the feature is on.
        gqa: KV heads are fewer than query heads (the dK/dV kernels then sum a group).
        mods: FlexAttention's compiled user functions (:class:`Mods`), or None.
        paged: K and V are a KV cache (num_blocks, page_size, H_kv, d): key j of
            sequence b is row ``j % page_size`` of page ``block_table[b, j // page_size]``
            (``fx[PAGES]``), with varlen queries and key lengths from ``cu_seqlens_k``
            (``numba_flash.kvcache``).
        split: split-KV: the grid's batch axis runs over (split, sequence), and split p
            visits key tiles ``[p·n, p·n + n)`` only (``fx[SPLIT_AT] = (n, sequences)``),
            writing its partial O and lse to slot p of out and lse, which
            ``merge_attention`` combines (``block_info.this_block``).
        cluster: with ``split``, the S splits of a row tile run as one thread-block
            cluster of S CTAs (S ≤ ``merge.MAX_CLUSTER``; 0: none), the grid's batch axis then
            sequence-major over (sequence, split), and merge their parts through
            distributed shared memory (``kernels.merge.merge_in_cluster``).
        nonpositive_scale: the softmax scale is ≤ 0 (host side only: the wgmma forward
            then keeps scaled scores, ``kernels.softmax.domain``: the raw scores' max
            is the scaled scores' max only for a positive scale).
    """

    causal: bool = False
    window_left: bool = False
    window_right: bool = False
    softcap: bool = False
    alibi: bool = False
    dropout: bool = False
    varlen: bool = False
    gqa: bool = False
    mods: object = None
    paged: bool = False
    split: bool = False
    cluster: int = 0
    nonpositive_scale: bool = False

    @property
    def heaviest_first(self) -> bool:
        """The row tiles of a launch differ in work (a bound or a block mask leaves them
        different key ranges), so the grid runs them heaviest first, row-tile position
        slowest: grid (heads, batch, row tiles) (``kernels.spec.query_grid``,
        ``block_info.block_coords``)."""
        return self.causal or self.window_left or self.window_right or (self.mods is not None and self.mods.block_sparse)

    @property
    def score_grad(self) -> bool:
        """The backward multiplies dS by a derivative of the score step (softcap, a
        user's score_mod)."""
        return self.softcap or (self.mods is not None and self.mods.score_fn is not None)

    @property
    def flags(self) -> tuple:
        """The tuple the kernels close over, indexed by ``CAUSAL`` … ``MASK_FN``: the
        flags, then the user's device functions (``kernels.flex.NO_MOD``, never called,
        where a function is absent: a call with no mods compiles to the plain kernel),
        then ``HEAVIEST_FIRST`` (the grid order the plan launches with), ``PAGED``,
        ``SPLIT`` and ``CLUSTER``."""
        c, wl, wr, sc, al, dr, vl, g = (self.causal, self.window_left, self.window_right, self.softcap, self.alibi,
                                        self.dropout, self.varlen, self.gqa)  # fmt: skip
        from numba_flash.kernels.flex import NO_MOD  # numba only here, when a kernel is made

        m = self.mods or Mods()
        fns = tuple(NO_MOD if fn is None else fn for fn in (m.score_fn, m.grad_fn, m.mask_fn))
        return (c, wl, wr or c, sc, al, dr, vl, g, m.score_fn is not None, m.mask_fn is not None,
                m.block_sparse) + fns + (self.heaviest_first, self.paged, self.split, self.cluster)  # fmt: skip


@dataclass(frozen=True)
class Mods:
    """FlexAttention's part of a :class:`Variant`: the user's functions compiled as
    numba device functions (``numba_flash.flex``), hashed by identity.

    Attributes:
        score_fn: ``score_mod(score, b, h, q_idx, kv_idx, *mod_args)``, or None.
        grad_fn: ``score_mod_grad`` (same arguments: ∂score_mod/∂score), the backward's.
        mask_fn: ``mask_mod(b, h, q_idx, kv_idx, *mask_args)`` for the partial tiles.
        block_sparse: the kernels walk visit lists (a block mask) instead of ranges.
    """

    score_fn: object = None
    grad_fn: object = None
    mask_fn: object = None
    block_sparse: bool = False


def params(group=1, window=(-1, -1), causal=False, softcap=0.0, keep_threshold=1 << 16, seed_key=(0, 0),
           keep_scale=1.0, sections=(0, 0)) -> tuple:
    """The run-time ``params`` tuple of a call (positions ``GROUP`` … ``SECTION_K``)."""
    left, right = window
    if causal:
        right = 0
    return (int(group), int(left), int(right), float(softcap), int(keep_threshold), int(seed_key[0]),
            int(seed_key[1]), float(keep_scale), int(sections[0]), int(sections[1]))  # fmt: skip


def variant_args(device: int = 0) -> list:
    """The five variant arguments of a plain call (``params`` and the dummy ALiBi,
    varlen and flex arguments), for scripts that launch a kernel themselves."""
    from numba_flash.api import _dummies

    alibi, cu, fx = _dummies(device)
    return [params(), alibi, cu, cu, fx]


def call_keywords(window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None) -> dict:
    """``flash_attention``'s variant keywords that differ from their defaults (for the
    tools that build calls from a case: ``check``, ``bench``)."""
    kw = {}
    if tuple(window) != (-1, -1):
        kw["window_size"] = tuple(window)
    if softcap:
        kw["softcap"] = softcap
    if alibi_slopes is not None:
        kw["alibi_slopes"] = alibi_slopes
    if dropout_p:
        kw.update(dropout_p=dropout_p, seed=seed)
    return kw


def check_kv_heads(kv_heads: int, heads: int) -> int:
    """A case's KV heads (0: as many as ``heads``), which must divide ``heads``."""
    kv = kv_heads or heads
    if kv < 1 or heads % kv:
        raise ValueError(f"kv_heads: expected a divisor of heads={heads}, got {kv_heads}")
    return kv


def describe(heads, kv_heads, window, softcap, alibi, dropout) -> list:
    """A case's variants besides causal, as label words (``check`` and ``bench``)."""
    parts = [f"kv_heads={kv_heads}"] if kv_heads != heads else []
    if tuple(window) != (-1, -1):
        parts.append(f"window={window[0]},{window[1]}")
    parts += [f"softcap={softcap:g}"] if softcap else []
    parts += ["alibi"] if alibi else []
    parts += [f"dropout={dropout:g}"] if dropout else []
    return parts


def variant_of(causal=False, window=(-1, -1), softcap=0.0, alibi=False, dropout_p=0.0, varlen=False,
               group=1, mods=None) -> Variant:
    """The :class:`Variant` of a call's (checked) arguments."""
    left, right = window
    return Variant(bool(causal), left >= 0, right >= 0 and not causal, softcap > 0, bool(alibi), dropout_p > 0,
                   bool(varlen), group > 1, mods)  # fmt: skip


PLAIN = Variant()


# --- checking a call's variant arguments (host side) -------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


#: A window side at least this wide is unbounded (−1): for any sequences of fewer than
#: 2**30 tokens it hides no key (query i sees key j iff i + diag − left ≤ j ≤ i + diag +
#: right), and the kernels never add it to a 64-bit index (2**63 − 1 wrapped around there).
UNBOUNDED_WINDOW = 1 << 31


def fa2_window(window: tuple, seqlen_k: int) -> tuple:
    """``window`` (checked) as FlashAttention-2's ``flash_attn_func`` runs it: a side of
    ``seqlen_k`` or more is unbounded, −1 (``mha_fwd``, ``mha_bwd``; ``max_seqlen_k`` for
    varlen, a KV cache's capacity for ``flash_attn_with_kvcache``).  The mask is the
    formula's (``Variant``) but where ``right ≥ seqlen_k`` and ``seqlen_q > right + 1``:
    there the formula hides keys from the first ``seqlen_q − right − 1`` rows (every key
    from the first ``seqlen_q − seqlen_k − right``), and FlashAttention-2, so this
    library too, shows them every key."""
    return tuple(-1 if side >= seqlen_k else side for side in window)


def check_window(window_size) -> tuple:
    """``window_size`` as ``(left, right)`` ints, each −1 (unbounded) or ≥ 0; a side of
    ``UNBOUNDED_WINDOW`` or more becomes −1 (any size, a Python int past int64 too)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or not all(map(_is_int, window_size)):
        raise TypeError(f"window_size: expected a pair of ints (left, right), -1 meaning unbounded, got "
                        f"{window_size!r}")  # fmt: skip
    left, right = (int(x) for x in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size: expected each side -1 (unbounded) or >= 0, got {(left, right)}")
    return tuple(-1 if side >= UNBOUNDED_WINDOW else side for side in (left, right))


def check_softcap(softcap) -> float:
    """``softcap`` as a float ≥ 0 (0: off)."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap: expected a real number >= 0 (0 is off), got {softcap!r}")
    value = float(softcap)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"softcap: expected a finite number >= 0 (0 is off), got {softcap!r}")
    return value


def check_dropout(dropout_p, seed) -> tuple:
    """``(dropout_p, seed)``: p a real in [0, 1); with p > 0 a seed, an int in [0, 2**64)."""
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a real number in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p: expected a number in [0, 1), got {dropout_p!r}")
    if p > 0:
        if seed is None:
            raise ValueError(f"seed: dropout_p={p} needs a seed (an int in [0, 2**64)) so that the backward "
                             "regenerates the same mask; got None")  # fmt: skip
        if not _is_int(seed):
            raise TypeError(f"seed: expected an int in [0, 2**64), got {seed!r}")
        if not 0 <= int(seed) < 1 << 64:
            raise ValueError(f"seed: expected an int in [0, 2**64), got {seed!r}")
    elif seed is not None and not _is_int(seed):
        raise TypeError(f"seed: expected an int in [0, 2**64) or None, got {seed!r}")
    return p, None if seed is None else int(seed)

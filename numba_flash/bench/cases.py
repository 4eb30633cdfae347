"""Benchmark cases: the shapes timed (:class:`BenchCase`, the ``fa2`` / ``smoke``
presets, grids from options) and the FLOPs one call of a case does.

FLOPs (:func:`attention_flops`)
-------------------------------
``4·B·H·Nq·Nk·d`` for the forward (two matmuls of 2·Nq·Nk·d each), halved when causal,
×2.5 for the backward (five matmuls) and ×3.5 for forward + backward — the convention of
FlashAttention-2's benchmarks.  With a sliding window, only the visible (query, key)
pairs count (4·d each).  TFLOP/s = flops / ms / 1e9.

Varlen cases (:func:`varlen_cases`)
-----------------------------------
A varlen case is a packed batch of ``batch`` sequences (``flash_attn_varlen_func``'s
input) whose lengths (:attr:`BenchCase.seqlens`, q and k alike) have mean exactly
``seqlen_q``: drawn by :func:`varlen_seqlens`, uniformly in [N/4, 7N/4], rescaled to
the total B·N.  Its FLOPs count each sequence's visible pairs (:func:`visible_pairs`,
4·H·d a pair; causal: L(L+1)/2 exactly, not L²/2), whichever implementation runs it:
the peers, without a varlen entry, run the padded batch (:attr:`BenchCase.padded`,
(B, max length, H, d)) and are credited the same real pairs, so TFLOP/s ratios are time
ratios.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

PASSES = ("forward", "backward")
ALL_PASSES = ("forward", "backward", "forward+backward")
DTYPES = ("float16", "bfloat16", "float32")
PRESETS = ("fa2", "smoke")
VARLEN_SEED = 0  # default seed of the varlen lengths: the same lengths every run


@dataclass(frozen=True)
class Shape:
    """The sizes of an attention problem, shared by bench cases and ``check.CaseSpec``:
    batch, heads, seqlen_q, seqlen_k and head_dim are positive ints (ints of any kind,
    NumPy's too; not bools)."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool

    def __post_init__(self):
        for name in ("batch", "heads", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")


@dataclass(frozen=True)
class BenchCase(Shape):
    dtype: str = "float16"
    # FlashAttention-2's variants, as ``flash_attention``'s keywords (0 kv_heads: = heads)
    kv_heads: int = 0
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0
    # varlen: the lengths of the packed sequences, q and k alike (batch of them, mean
    # seqlen_q = seqlen_k, so they sum to batch·seqlen_q); () for a dense batch
    seqlens: tuple = ()
    # FlexAttention (issue #12): "" (none), "block-sparse:DENSITY" (a random block pattern)
    # or "mask:document" / "mask:prefix" / "mask:sink" (numba_flash.bench.flexcases)
    flex: str = ""

    def __post_init__(self):
        super().__post_init__()
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        from numba_flash.variant import check_kv_heads

        object.__setattr__(self, "kv_heads", check_kv_heads(self.kv_heads, self.heads))
        object.__setattr__(self, "window", tuple(self.window))
        lens = tuple(self.seqlens)
        if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in lens):
            raise ValueError(f"seqlens: expected positive ints, got {lens!r}")
        lens = tuple(int(n) for n in lens)
        if lens and self.seqlen_q != self.seqlen_k:
            raise ValueError(f"seqlens: a varlen case gives q and k the same lengths, so seqlen_q must equal "
                             f"seqlen_k, got {self.seqlen_q}:{self.seqlen_k}")  # fmt: skip
        if lens and (len(lens) != self.batch or sum(lens) != self.batch * self.seqlen_q):
            raise ValueError(f"seqlens: expected batch={self.batch} lengths summing to batch·seqlen_q="
                             f"{self.batch * self.seqlen_q}, got {len(lens)} summing to {sum(lens)}")  # fmt: skip
        object.__setattr__(self, "seqlens", lens)
        if self.flex:
            from numba_flash.bench.flexcases import check_flex

            check_flex(self)

    @property
    def varlen(self) -> bool:
        return bool(self.seqlens)

    @property
    def max_seqlen(self) -> int:
        """The longest sequence: a varlen case's padded length, else max(seqlen_q, seqlen_k)."""
        return max(self.seqlens) if self.seqlens else max(self.seqlen_q, self.seqlen_k)

    @property
    def cu_seqlens(self):
        """A varlen case's offsets, int32 (batch + 1,): sequence b is rows cu[b] .. cu[b+1] − 1."""
        return np.concatenate([[0], np.cumsum(self.seqlens, dtype=np.int64)]).astype(np.int32)

    @property
    def padded(self) -> "BenchCase":
        """The dense case a user without varlen runs: the batch padded to (B, max length);
        a dense case is its own."""
        if not self.seqlens:
            return self
        return replace(self, seqlen_q=self.max_seqlen, seqlen_k=self.max_seqlen, seqlens=())

    @property
    def variants(self) -> str:
        from numba_flash.variant import describe

        words = describe(self.heads, self.kv_heads, self.window, self.softcap, self.alibi, self.dropout)
        return " ".join(words + ([self.flex] if self.flex else []))

    @property
    def label(self) -> str:
        seq = f"N={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"Nq={self.seqlen_q} Nk={self.seqlen_k}"
        shape = f"B={self.batch} H={self.heads} {seq}"
        if self.varlen:
            shape = f"varlen B={self.batch} mean={self.seqlen_q} max={self.max_seqlen} H={self.heads}"
        extra = f" {self.variants}" if self.variants else ""
        return f"{self.dtype} {shape} d={self.head_dim} {'causal' if self.causal else 'full'}{extra}"


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, window=(-1, -1)) -> int:
    """(query, key) pairs a (batch, head) computes: query i sees keys ``i + diag − left
    ..  i + diag + right`` within ``[0, seqlen_k)`` (``diag = seqlen_k − seqlen_q``;
    causal: right = 0; −1 unbounded; a side of seqlen_k or more unbounded, as
    FlashAttention-2 runs it: ``variant.fa2_window``)."""
    from numba_flash.variant import fa2_window

    left, right = fa2_window(tuple(window), seqlen_k)
    right = 0 if causal else right
    i = np.arange(seqlen_q, dtype=np.int64) + (seqlen_k - seqlen_q)
    lo = np.zeros_like(i) if left < 0 else np.clip(i - left, 0, seqlen_k)
    hi = np.full_like(i, seqlen_k) if right < 0 else np.clip(i + right + 1, 0, seqlen_k)
    return int(np.maximum(hi - lo, 0).sum())


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, pass_="forward", window=(-1, -1),
                    seqlens=(), flex="") -> float:  # fmt: skip
    """FLOPs of one attention call: 4·B·H·Nq·Nk·d, ×0.5 causal, ×2.5 backward,
    ×3.5 forward+backward (FlashAttention-2's convention); with a window, 4·d a
    visible pair (:func:`visible_pairs`); with a FlexAttention case (``flex``), 4·d a
    pair its mask keeps (``flexcases.flex_pairs``).  With ``seqlens`` (a varlen batch: sequence
    lengths, q and k alike; batch, seqlen_q and seqlen_k then unused), 4·H·d a visible
    pair of each sequence."""
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        f *= 0.5
    if tuple(window) != (-1, -1):
        f = 4.0 * batch * heads * head_dim * visible_pairs(seqlen_q, seqlen_k, causal, window)
    if len(seqlens):
        pairs = sum(count * visible_pairs(n, n, causal, window) for n, count in Counter(seqlens).items())
        f = 4.0 * heads * head_dim * pairs
    if flex:  # FlexAttention's convention: the pairs its mask keeps (block-sparse: the kept blocks')
        from numba_flash.bench.flexcases import flex_pairs

        f = 4.0 * batch * heads * head_dim * flex_pairs(flex, seqlen_q, seqlen_k, causal, window)
    mult = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}
    if pass_ not in mult:
        raise ValueError(f"pass_: expected one of {tuple(mult)}, got {pass_!r}")
    return f * mult[pass_]


def tflops(flops: float, ms: float | None) -> float | None:
    if ms is None or not ms > 0:
        return None
    return flops / ms / 1e9


def fa2_cases(dtypes: Sequence[str] = ("float16",)) -> list[BenchCase]:
    """FlashAttention-2's benchmark grid: batch·seqlen = 16k tokens, hidden 2048,
    d ∈ {64, 128} (heads = 2048 / d), seqlen 512 … 16k, causal off and on."""
    cases = []
    for dt in dtypes:
        for causal in (False, True):
            for d in (64, 128):
                for n in (512, 1024, 2048, 4096, 8192, 16384):
                    cases.append(BenchCase(16384 // n, 2048 // d, n, n, d, causal, dt))
    return cases


def preset_cases(name: str, dtypes: Sequence[str] = ("float16",)) -> list[BenchCase]:
    """``fa2`` (see :func:`fa2_cases`) or ``smoke`` (two quick shapes, for a sanity run)."""
    if name == "fa2":
        return fa2_cases(dtypes)
    if name == "smoke":
        return [BenchCase(4, 8, n, n, 64, c, dt) for dt in dtypes for c in (False, True) for n in (512, 1024)]
    raise ValueError(f"preset: expected one of {PRESETS}, got {name!r}")


def shape_cases(
    *,
    seqlens: Sequence[tuple[int, int]] = ((2048, 2048),),
    head_dims: Sequence[int] = (64,),
    dtypes: Sequence[str] = ("float16",),
    causal: Sequence[bool] = (False, True),
    batch: int | None = None,
    heads: int | None = None,
    variants: dict | None = None,
) -> list[BenchCase]:
    """Cases from options; batch defaults to 16384 // seqlen_q (at least 1) and heads to
    2048 // head_dim, the FlashAttention-2 convention (16k tokens, hidden 2048)."""
    cases = []
    for dt in dtypes:
        for c in causal:
            for d in head_dims:
                for nq, nk in seqlens:
                    b = batch if batch is not None else max(1, 16384 // nq)
                    h = heads if heads is not None else max(1, 2048 // d)
                    cases.append(BenchCase(b, h, nq, nk, d, bool(c), dt, **(variants or {})))
    return cases


def varlen_seqlens(batch: int, mean: int, seed: int = VARLEN_SEED) -> tuple[int, ...]:
    """``batch`` sequence lengths of mean exactly ``mean`` (they sum to batch·mean), each
    at least 1: drawn uniformly in [mean/4, 7·mean/4] (``numpy.random.default_rng(seed)``),
    rescaled to the total, then rounded by largest remainder.  Reproducible: the same
    (batch, mean, seed) gives the same lengths."""
    for name, value in (("batch", batch), ("mean", mean)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    total = int(batch) * int(mean)
    x = np.random.default_rng(seed).uniform(0.25 * mean, 1.75 * mean, int(batch))
    x *= total / x.sum()
    lens = np.maximum(np.floor(x).astype(np.int64), 1)
    frac = x - np.floor(x)
    while (short := total - int(lens.sum())) != 0:
        if short > 0:  # the floors lost < batch tokens: one more to the largest remainders
            lens[np.argsort(-frac, kind="stable")[:short]] += 1
        else:  # the floor of 1 added some: one less to the smallest remainders above 1
            above = np.flatnonzero(lens > 1)
            lens[above[np.argsort(frac[above], kind="stable")][:-short]] -= 1
    return tuple(int(n) for n in lens)


def ragged_lengths(rng, count: int = 16, total: int = 16384) -> np.ndarray:
    """Issue #11's varlen row (the scripts' draw): ``count`` lengths drawn from
    ``rng.integers(256, 1793, count)``, scaled to sum to ``total`` and rounded, the last
    taking the rounding's rest.  One draw from ``rng``, so a script's later draws stay
    where they were."""
    lens = rng.integers(256, 1793, count)
    lens = np.round(lens * total / lens.sum()).astype(int)
    lens[-1] += total - lens.sum()
    return lens


#: The seed of issue #11's varlen row as the scripts time and model it (:func:`ragged_draw`).
RAGGED_SEED = 20261207


def ragged_draw(count: int = 16, total: int = 16384) -> np.ndarray:
    """Issue #11's varlen row as the scripts draw it (``bench_fa2``, ``bench_order``,
    ``tile_ceilings``, ``trace_forward``): :func:`ragged_lengths` from a fresh generator
    seeded :data:`RAGGED_SEED` (16 lengths from 282 to 1744 rows, total 16384)."""
    return ragged_lengths(np.random.default_rng(RAGGED_SEED), count, total)


def varlen_cases(cases: Sequence[BenchCase], seed: int = VARLEN_SEED) -> list[BenchCase]:
    """``cases`` as varlen cases: each a packed batch of its ``batch`` sequences with
    lengths from :func:`varlen_seqlens` (mean its seqlen; seqlen_q must equal seqlen_k)."""
    return [replace(c, seqlens=varlen_seqlens(c.batch, c.seqlen_q, seed)) for c in cases]


def with_variants(cases: Sequence[BenchCase], variants: dict | None) -> list[BenchCase]:
    """``cases`` with the variant fields ``variants`` (kv_heads, window, softcap, alibi,
    dropout) set; kv_heads must divide every case's heads."""
    return [replace(c, **variants) for c in cases] if variants else list(cases)

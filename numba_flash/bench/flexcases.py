"""FlexAttention bench cases (``numba-flash bench --block-sparse D`` / ``--mask KIND``).

A case's ``flex`` field names its mask; :func:`flex_kwargs` makes the call's
``block_mask`` (on the device, once per case: ``create_block_mask`` runs ``mask_mod``
on the GPU), :func:`flex_pairs` counts the (query, key) pairs it keeps (the FLOPs of
FlexAttention's convention: 4·d a kept pair).  The masks, over N = seqlen_q = seqlen_k:

* ``block-sparse:D``: a random pattern of 128 × 128 blocks, each kept with probability
  D, the diagonal always (``BlockMask.from_dense``; FLOPs count the kept blocks);
* ``mask:document``: 8 documents of random lengths packed into N, a query sees its
  own document (``doc[q] == doc[k]``, the ids a ``mod_args`` array);
* ``mask:prefix``: prefix-LM, the first N/4 tokens bidirectional, the rest causal;
* ``mask:sink``: causal sliding window of 1024 keys plus 4 sink tokens.

The built-in masks (``--causal``, ``--window``) apply on top.  Seeded: the same case
gives the same mask every run.
"""

from __future__ import annotations

import functools

import numpy as np

MASKS = ("document", "prefix", "sink")
DOCS, WINDOW, SINKS, BLOCK, SEED = 8, 1024, 4, 128, 0


def parse(flex: str) -> tuple:
    """``("block-sparse", density)`` or ``("mask", kind)``; ValueError otherwise."""
    kind, _, value = flex.partition(":")
    if kind == "block-sparse":
        try:
            density = float(value)
        except ValueError:
            density = -1.0
        if not 0 < density <= 1:
            raise ValueError(f"flex: block-sparse density {value!r}: expected a number in (0, 1]")
        return kind, density
    if kind == "mask" and value in MASKS:
        return kind, value
    raise ValueError(f"flex: {flex!r}: expected 'block-sparse:DENSITY' or 'mask:' one of {MASKS}")


def check_flex(case) -> None:
    parse(case.flex)
    if case.seqlen_q != case.seqlen_k or case.varlen:
        raise ValueError(f"flex: {case.flex} cases take seqlen_q = seqlen_k and no varlen, got "
                         f"{case.seqlen_q}:{case.seqlen_k}{' varlen' if case.varlen else ''}")  # fmt: skip


def doc_ids(n: int) -> np.ndarray:
    cuts = np.sort(np.random.default_rng(SEED).choice(np.arange(1, n), size=min(DOCS, n) - 1, replace=False))
    return np.searchsorted(cuts, np.arange(n), side="right").astype(np.int32)


def pattern(n: int, density: float) -> np.ndarray:
    nb = -(-n // BLOCK)
    keep = np.random.default_rng(SEED).random((nb, nb)) < density
    np.fill_diagonal(keep, True)
    return keep


def _visible_rows(flex: str, n: int) -> np.ndarray:
    """Keys each query row keeps (int64, n)."""
    kind, value = parse(flex)
    i = np.arange(n, dtype=np.int64)
    if kind == "block-sparse":
        keep = pattern(n, value)
        sizes = np.minimum(BLOCK, n - np.arange(keep.shape[0]) * BLOCK)
        per_block_row = keep.astype(np.int64) @ sizes
        return per_block_row[i // BLOCK]
    if value == "document":
        lens = np.bincount(doc_ids(n))
        return lens[doc_ids(n)].astype(np.int64)
    if value == "prefix":
        return np.maximum(i + 1, n // 4)
    return np.minimum(i + 1, WINDOW) + np.clip(i + 1 - WINDOW, 0, SINKS)  # sink


def flex_pairs(flex: str, seqlen_q: int, seqlen_k: int, causal=False, window=(-1, -1)) -> int:
    """(query, key) pairs a (batch, head) keeps: the mask's (block-sparse: its kept
    blocks'), within the built-in masks when those are on (counted on the dense mask
    then: sizes up to 16K)."""
    n = seqlen_q
    if not causal and tuple(window) == (-1, -1):
        return int(_visible_rows(flex, n).sum())
    from numba_flash.reference import window_mask

    builtin = window_mask(n, n, window, causal=causal)
    return int((_dense(flex, n) & builtin).sum())


def _dense(flex: str, n: int) -> np.ndarray:
    kind, value = parse(flex)
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "block-sparse":
        return pattern(n, value)[q // BLOCK, k // BLOCK]
    if value == "document":
        d = doc_ids(n)
        return d[q] == d[k]
    if value == "prefix":
        return (k <= q) | (k < n // 4)
    return (k <= q) & ((q - k < WINDOW) | (k < SINKS))


def _document(b, h, q_idx, kv_idx, doc):
    return doc[q_idx] == doc[kv_idx]


def _prefix(b, h, q_idx, kv_idx, prefix):
    return kv_idx <= q_idx or kv_idx < prefix


def _sink(b, h, q_idx, kv_idx, window, sinks):
    return kv_idx <= q_idx and (q_idx - kv_idx < window or kv_idx < sinks)


@functools.lru_cache(maxsize=16)
def flex_kwargs(flex: str, n: int) -> dict:
    """``flash_attention``'s keywords of a case's mask (a block mask on the device)."""
    from numba_flash import BlockMask, create_block_mask

    kind, value = parse(flex)
    if kind == "block-sparse":
        return {"block_mask": BlockMask.from_dense(pattern(n, value), BLOCK, n, n)}
    if value == "document":
        import cupy

        return {"block_mask": create_block_mask(_document, None, None, n, n, block_size=BLOCK,
                                                mod_args=(cupy.asarray(doc_ids(n)),))}  # fmt: skip
    if value == "prefix":
        return {"block_mask": create_block_mask(_prefix, None, None, n, n, block_size=BLOCK, mod_args=(n // 4,))}
    return {"block_mask": create_block_mask(_sink, None, None, n, n, block_size=BLOCK, mod_args=(WINDOW, SINKS))}

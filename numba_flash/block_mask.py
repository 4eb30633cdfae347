"""Block masks: which (query block, key block) tiles of an attention take part.

FlexAttention's ``BlockMask`` and the FlashAttention paper's block-sparse attention in
one structure.  Over (B, H, seqlen_q, seqlen_k), cut into square blocks of
``block_size`` queries × ``block_size`` keys, ``kinds[b, h, i, j]`` says of block
(i, j)::

    EMPTY    no (query, key) pair of the block is visible: a kernel skips the block
    FULL     every pair is visible: no mask is evaluated
    PARTIAL  ``mask_mod(b, h, q_idx, kv_idx, *mod_args)`` decides, pair by pair

B or H may be 1 in ``kinds`` (the mask does not depend on it: broadcast).  A pair is
visible when its block is FULL, or PARTIAL and ``mask_mod`` says True; the built-in
masks (causal, window) apply on top.  Blocks past the end of a sequence hold only the
pairs inside it (the last block may be short).

* :func:`create_block_mask` classifies every block by evaluating ``mask_mod``, a plain
  Python function of scalars compiled by numba as a device function, on the GPU (one
  CUDA block per mask block; ``syncthreads_or`` / ``syncthreads_and`` of the per-thread
  results), so the N × N mask never exists in memory.
* :meth:`BlockMask.from_dense` takes a fixed pattern (the paper's block-sparse
  FlashAttention): True blocks FULL, False EMPTY, no ``mask_mod``.
* :meth:`BlockMask.dense` expands a (b, h) slice to the N × N boolean mask, in NumPy,
  for tests and the float64 reference (small shapes).
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import numpy as np

from numba_flash._numba_cuda import SIMULATOR, cuda, device_function  # module level: the simulator swaps it
from numba_flash.reference import _host_array as _host  # CuPy mod_args on the host (the reference's reads)
from numba_flash.reference import apply_mod

EMPTY, PARTIAL, FULL = 0, 1, 2
THREADS = 128  # create_block_mask: threads per mask block


@dataclass(frozen=True, eq=False)
class BlockMask:
    """The kinds of every (query block, key block) and how to decide the PARTIAL ones.

    Attributes:
        kinds: int8 NumPy array (B or 1, H or 1, ceil(seqlen_q / block_size),
            ceil(seqlen_k / block_size)) of EMPTY, PARTIAL, FULL.
        block_size: queries and keys per block.
        seqlen_q, seqlen_k: the lengths the mask was made for.
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx, *mod_args) -> bool`` for the PARTIAL
            blocks (None when there are none: ``from_dense``).
        mod_args: the arrays and scalars ``mask_mod`` reads.
    """

    kinds: np.ndarray
    block_size: int
    seqlen_q: int
    seqlen_k: int
    mask_mod: object = None
    mod_args: tuple = ()

    @property
    def density(self) -> float:
        """The fraction of blocks that are not EMPTY (1.0 for an empty grid)."""
        return float(np.mean(self.kinds != EMPTY)) if self.kinds.size else 1.0

    @classmethod
    def from_dense(cls, block_pattern, block_size: int = 128, seqlen_q: int | None = None,
                   seqlen_k: int | None = None) -> BlockMask:
        """The paper's fixed block-sparse pattern: ``block_pattern`` a boolean
        (Nq_blocks, Nk_blocks) array, or (B, H, Nq_blocks, Nk_blocks) (B or H may be
        1); True blocks are FULL, False EMPTY.  ``seqlen_q`` / ``seqlen_k`` default to
        ``block_size`` times the block counts."""
        _check_block_size(block_size)
        pattern = np.asarray(block_pattern)
        if pattern.dtype != np.bool_ or pattern.ndim not in (2, 4):
            raise ValueError(f"block_pattern: dtype {pattern.dtype}, shape {pattern.shape}: expected a boolean array "
                             "(Nq_blocks, Nk_blocks) or (B, H, Nq_blocks, Nk_blocks)")  # fmt: skip
        if pattern.ndim == 2:
            pattern = pattern[None, None]
        nqb, nkb = pattern.shape[2:]
        seqlen_q = nqb * block_size if seqlen_q is None else seqlen_q
        seqlen_k = nkb * block_size if seqlen_k is None else seqlen_k
        for name, n, nb in (("seqlen_q", seqlen_q, nqb), ("seqlen_k", seqlen_k, nkb)):
            if not _is_count(n) or -(-n // block_size) != nb:
                raise ValueError(f"{name}={n!r}: expected a length of {nb} blocks of {block_size} "
                                 f"({(nb - 1) * block_size + 1} to {nb * block_size})")  # fmt: skip
        kinds = np.where(pattern, FULL, EMPTY).astype(np.int8)
        return cls(kinds, int(block_size), int(seqlen_q), int(seqlen_k))

    def tile_kinds(self, block_m: int, block_n: int, keys_are_rows: bool = False) -> np.ndarray:
        """The kinds of a kernel's tiles (``block_m`` queries × ``block_n`` keys), int8
        (B or 1, H or 1, query tiles, key tiles), or with ``keys_are_rows`` (key
        tiles, query tiles), the dK/dV kernels' walk: a tile is EMPTY when every block
        it touches is, FULL when every one is, else PARTIAL.  With a ``mask_mod`` and
        tiles that cut the blocks (``block_size`` a multiple of both sides), the tiles of
        the PARTIAL blocks are classified again by ``mask_mod`` (:meth:`refined`), so a
        tile that falls wholly inside or outside the mask is FULL or EMPTY, not
        PARTIAL because its block is."""
        if self._refinable(block_m, block_n):
            out = self.refined(block_m, block_n)
            return out.swapaxes(2, 3) if keys_are_rows else out

        def ranges(n, tile):  # first block of each tile, for reduceat
            return (np.arange(-(-n // tile)) * tile) // self.block_size

        rows, cols = ranges(self.seqlen_q, block_m), ranges(self.seqlen_k, block_n)
        kinds = self.kinds
        lo = np.minimum.reduceat(np.minimum.reduceat(kinds, rows, axis=2), cols, axis=3) if kinds.size else kinds
        hi = np.maximum.reduceat(np.maximum.reduceat(kinds, rows, axis=2), cols, axis=3) if kinds.size else kinds
        # reduceat over [start_t, start_{t+1}) misses blocks a tile reaches past the next start
        # only when tiles are not whole blocks apart: add the tile's last block
        last_r = (np.minimum((np.arange(rows.size) + 1) * block_m, self.seqlen_q) - 1) // self.block_size
        last_c = (np.minimum((np.arange(cols.size) + 1) * block_n, self.seqlen_k) - 1) // self.block_size
        if kinds.size:
            tail = kinds[:, :, last_r][:, :, :, last_c]
            lo, hi = np.minimum(lo, tail), np.maximum(hi, tail)
        out = np.where(hi == EMPTY, EMPTY, np.where(lo == FULL, FULL, PARTIAL)).astype(np.int8)
        return out.swapaxes(2, 3) if keys_are_rows else out

    def _refinable(self, block_m: int, block_n: int) -> bool:
        bs = self.block_size
        return (self.mask_mod is not None and bs % block_m == 0 and bs % block_n == 0
                and (block_m < bs or block_n < bs) and self.kinds.size > 0)  # fmt: skip

    def refined(self, block_m: int, block_n: int) -> np.ndarray:
        """The kinds of tiles of ``block_m`` queries × ``block_n`` keys (each side
        dividing ``block_size``), int8 (B or 1, H or 1, query tiles, key tiles): those
        of an EMPTY or FULL block inherit its kind, those of a PARTIAL block are
        classified by ``mask_mod`` on the GPU (:func:`create_block_mask`'s kernel,
        pairs of the PARTIAL block only).  Made once per tile shape."""
        key = (block_m, block_n)
        cache = _REFINED.setdefault(self, {})
        if key not in cache:
            nb, nh = self.kinds.shape[:2]
            nqt, nkt = -(-self.seqlen_q // block_m), -(-self.seqlen_k // block_n)
            cache[key] = _classify(self.mask_mod, nb, nh, self.seqlen_q, self.seqlen_k, (block_m, block_n),
                                   self.mod_args, nqt, nkt, self.kinds, self.block_size)  # fmt: skip
        return cache[key]

    def visit_lists(self, block_m: int, block_n: int, keys_are_rows: bool = False, ranges=None) -> tuple:
        """What a kernel walks, FlexAttention's ``kv_num_blocks`` / ``kv_indices``:
        ``(count, index, partial)`` with ``count[b, h, t]`` the non-EMPTY tiles of row
        tile ``t`` (:meth:`tile_kinds`), ``index[b, h, t, :count]`` them in increasing
        order (int32) and ``partial[b, h, t, :count]`` whether each needs the mask.
        ``ranges``: ``(lo, hi)`` int arrays (row tiles,) or (batch, row tiles), row
        tile t (of batch b) keeps only the tiles in ``[lo[t], hi[t])`` (the range the
        built-in masks leave; per batch: varlen's sequences, ``count`` then has a
        batch axis of that size)."""
        kinds = self.tile_kinds(block_m, block_n, keys_are_rows)
        if ranges is not None:
            col = np.arange(kinds.shape[3])
            lo, hi = (np.asarray(x)[..., None] for x in ranges)
            inside = (col >= lo) & (col < hi)
            kinds = np.where(inside[None, None] if inside.ndim == 2 else inside[:, None], kinds, EMPTY)
        keep = kinds != EMPTY
        count = keep.sum(axis=3).astype(np.int32)
        order = np.argsort(~keep, axis=3, kind="stable").astype(np.int32)  # kept tiles first, in order
        partial = np.take_along_axis(kinds, order, axis=3) == PARTIAL
        return count, order, partial.astype(np.int8)

    def dense(self, b: int = 0, h: int = 0) -> np.ndarray:
        """The (seqlen_q, seqlen_k) boolean mask of batch ``b``, head ``h``: FULL
        blocks True, EMPTY False, PARTIAL ones ``mask_mod`` of each pair (evaluated in
        Python: small shapes only)."""
        kinds = self.kinds[b % self.kinds.shape[0], h % self.kinds.shape[1]]
        bs = self.block_size
        block = np.repeat(np.repeat(kinds, bs, axis=0), bs, axis=1)[: self.seqlen_q, : self.seqlen_k]
        out = block == FULL
        part = block == PARTIAL
        if part.any():
            args = tuple(_host(a) for a in self.mod_args)
            rows, cols = np.nonzero(part.any(axis=1))[0], np.nonzero(part.any(axis=0))[0]  # the PARTIAL span
            sub = np.ix_(rows, cols)
            mm = apply_mod(self.mask_mod, (np.array(b), np.array(h), rows[:, None], cols[None, :]), args)
            out[sub] = np.where(part[sub], mm.astype(bool), out[sub])
        return out


def create_block_mask(mask_mod, B, H, seqlen_q: int, seqlen_k: int, *, block_size: int = 128,
                      mod_args=()) -> BlockMask:
    """Classify every (query block, key block) of a (B, H, seqlen_q, seqlen_k)
    attention as EMPTY, FULL or PARTIAL by evaluating ``mask_mod(b, h, q_idx, kv_idx,
    *mod_args) -> bool`` on the GPU (the simulator runs it on the CPU).  ``B`` or ``H``
    None: the mask does not depend on it (evaluated at index 0, broadcast).
    ``mod_args``: device arrays (CuPy, CUDA array interface, DLPack) or scalars."""
    check_mod("mask_mod", mask_mod, 4, mod_args)
    nb = 1 if B is None else B
    nh = 1 if H is None else H
    for name, n, ok in (("B", B, B is None or (_is_count(B) and B >= 1)),
                        ("H", H, H is None or (_is_count(H) and H >= 1)),
                        ("seqlen_q", seqlen_q, _is_count(seqlen_q)), ("seqlen_k", seqlen_k, _is_count(seqlen_k))):
        if not ok:
            raise ValueError(f"{name}={n!r}: expected {'None or ' if name in 'BH' else ''}an int >= "
                             f"{1 if name in 'BH' else 0}")  # fmt: skip
    _check_block_size(block_size)
    nqb, nkb = -(-seqlen_q // block_size), -(-seqlen_k // block_size)
    kinds = np.zeros((nb, nh, nqb, nkb), dtype=np.int8)
    if kinds.size:
        whole = np.full((1, 1, 1, 1), PARTIAL, np.int8)  # every pair asks mask_mod
        kinds = _classify(mask_mod, nb, nh, seqlen_q, seqlen_k, (block_size, block_size), tuple(mod_args), nqb, nkb,
                          whole, max(seqlen_q, seqlen_k, 1))  # fmt: skip
    return BlockMask(kinds, int(block_size), int(seqlen_q), int(seqlen_k), mask_mod, tuple(mod_args))


def butterfly(n_blocks: int) -> np.ndarray:
    """The flat butterfly block pattern (Dao et al., "Pixelated Butterfly", used by the
    FlashAttention paper's block-sparse runs): block (i, j) is kept iff ``i == j`` or
    ``i XOR j`` is a power of two; an (n_blocks, n_blocks) boolean array for
    :meth:`BlockMask.from_dense`, ``1 + log2(n_blocks)`` blocks a row for a power of
    two."""
    if not _is_count(n_blocks) or n_blocks < 1:
        raise ValueError(f"n_blocks={n_blocks!r}: expected an int >= 1")
    x = np.arange(n_blocks)[:, None] ^ np.arange(n_blocks)[None, :]
    return (x & (x - 1)) == 0


def check_mod(name: str, fn, nfixed: int, mod_args) -> None:
    """A ``score_mod`` / ``mask_mod``: callable, taking ``nfixed`` + len(mod_args)
    positional arguments (TypeError naming the function otherwise)."""
    if not callable(fn):
        raise TypeError(f"{name}: expected a Python function, got {type(fn).__name__}")
    if not isinstance(mod_args, (tuple, list)):
        raise TypeError(f"mod_args: expected a tuple of arrays and scalars, got {type(mod_args).__name__}")
    want = nfixed + len(mod_args)
    try:
        sig = inspect.signature(fn)
        sig.bind(*range(want))
    except TypeError:
        fixed = "score, b, h, q_idx, kv_idx" if nfixed == 5 else "b, h, q_idx, kv_idx"
        raise TypeError(f"{name} {getattr(fn, '__name__', fn)!r}: takes {_arity(fn)} arguments, expected {want} "
                        f"({fixed} and {len(mod_args)} mod_args)") from None
    except ValueError:  # no signature (a builtin): numba reports at compile time
        pass


def _arity(fn) -> str:
    try:
        return str(len(inspect.signature(fn).parameters))
    except (TypeError, ValueError):
        return "an unknown number of"


def _classify(mask_mod, nb, nh, seqlen_q, seqlen_k, tile, mod_args, nqt, nkt, coarse, coarse_size) -> np.ndarray:
    """Kinds (nb, nh, nqt, nkt) of the tiles of ``tile = (rows, cols)``; a tile lying in
    a block of ``coarse`` (kinds of ``coarse_size`` blocks, broadcast over batch and
    heads of size 1) that is not PARTIAL takes its kind."""
    kernel = _classify_kernel(_device_mod(mask_mod))
    threads = min(THREADS, tile[0])
    if SIMULATOR:
        out = np.zeros((nb, nh, nqt, nkt), dtype=np.int8)
        args = tuple(_host(a) for a in mod_args)
    else:
        import cupy

        out = cupy.zeros((nb, nh, nqt, nkt), dtype=cupy.int8)
        args = tuple(_device(a) for a in mod_args)
        coarse = cupy.asarray(coarse)
    try:
        kernel[(nkt, nqt, nb * nh), threads](out, nh, seqlen_q, seqlen_k, tile[0], tile[1], coarse, coarse_size, args)
    except Exception as exc:  # a typing error inside the user's function
        if type(exc).__name__ in ("TypingError", "UnsupportedError", "NumbaError", "LoweringError"):
            raise TypeError(f"mask_mod {getattr(mask_mod, '__name__', mask_mod)!r} does not compile for the GPU with "
                            f"mod_args of types {[type(a).__name__ for a in mod_args]}: "
                            f"{str(exc).splitlines()[0]}") from exc  # fmt: skip
        raise
    return out if SIMULATOR else out.get()


_DEVICE_MODS: dict = {}
_KERNELS: dict = {}
_REFINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # BlockMask -> {(rows, cols): kinds}


def _device_mod(fn):
    """``fn`` as an (inlined) numba device function, compiled once per function."""
    if fn not in _DEVICE_MODS:
        _DEVICE_MODS[fn] = device_function(fn)
    return _DEVICE_MODS[fn]


def _classify_kernel(mod):
    """``kernel[(nkt, nqt, B·H), threads](kinds, H, seqlen_q, seqlen_k, rows, cols, coarse,
    coarse_size, mod_args)``: the CUDA block of tile (i, j) of (b, h), ``rows`` queries ×
    ``cols`` keys, takes the kind of its ``coarse`` block when that is not PARTIAL;
    else thread t evaluates the rows ``i·rows + t, + threads, ...`` of the tile against
    all its keys, and the tile is FULL when every evaluation is True, EMPTY when none
    is."""
    if mod in _KERNELS:
        return _KERNELS[mod]

    @cuda.jit
    def classify_blocks(kinds, nh, seqlen_q, seqlen_k, rows, cols, coarse, coarse_size, mod_args):
        j, i, bh = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        b, h = bh // nh, bh % nh
        c = coarse[min(b, coarse.shape[0] - 1), min(h, coarse.shape[1] - 1), (i * rows) // coarse_size,
                   (j * cols) // coarse_size]  # fmt: skip
        if c != PARTIAL:  # the same for every thread of the block: all return
            if cuda.threadIdx.x == 0:
                kinds[b, h, i, j] = c
            return
        q_end = min(seqlen_q, (i + 1) * rows)
        k_end = min(seqlen_k, (j + 1) * cols)
        any_ = 0  # int32 flags: syncthreads_or / _and take integers
        all_ = 1
        for q_idx in range(i * rows + cuda.threadIdx.x, q_end, cuda.blockDim.x):
            for kv_idx in range(j * cols, k_end):
                if mod(b, h, q_idx, kv_idx, *mod_args):
                    any_ = 1
                else:
                    all_ = 0
        any_ = cuda.syncthreads_or(any_)
        all_ = cuda.syncthreads_and(all_)
        if cuda.threadIdx.x == 0:
            kinds[b, h, i, j] = FULL if all_ != 0 else (PARTIAL if any_ != 0 else EMPTY)

    _KERNELS[mod] = classify_blocks
    return classify_blocks


def _device(a):
    if isinstance(a, (int, float, bool, np.number)):
        return a
    import cupy

    return cupy.asarray(a)


def _is_count(n) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0


def _check_block_size(block_size) -> None:
    if not _is_count(block_size) or block_size < 16 or block_size % 16:
        raise ValueError(f"block_size={block_size!r}: expected a multiple of 16 (>= 16)")


__all__ = ["BlockMask", "create_block_mask", "butterfly", "EMPTY", "PARTIAL", "FULL", "check_mod"]

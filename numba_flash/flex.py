"""FlexAttention on the host: a call's ``score_mod``, ``score_mod_grad``, ``block_mask`` and ``mod_args``.

``flash_attention(..., score_mod=, block_mask=, mod_args=)`` and its backward hand
them to :class:`FlexCall`, which

* checks them (a function's arity against its ``mod_args``, the block mask's sizes
  against the call's; ``score_mod_grad`` is required in the backward), and compiles
  each function alone in a probe kernel first, so that one that does not compile
  for the GPU, or returns the wrong type, gets a ``TypeError`` naming it;
* makes the kernels' compile-time part, :class:`numba_flash.variant.Mods` (the user's
  functions as inlined numba device functions, one per Python function: kernels are
  cached per function);
* and their run-time part, ``fx`` (``kernels.flex``): the ``mod_args`` on the
  device, and per launch the block mask's visit lists for that kernel's tiles
  (:func:`visit_lists`, kept on the block mask for the next call).

A block mask without ``mask_mod`` (``BlockMask.from_dense``) has its PARTIAL tiles —
kernel tiles that straddle a kept and a dropped block — decided by its own block
kinds (:func:`_kept_block`).  Visit lists are the block mask's non-EMPTY tiles
inside the range the built-in masks (causal, window) leave, in increasing order, each
``tile << 1 | partial``.
"""

from __future__ import annotations

import numbers
import weakref

import numpy as np

from numba_flash._numba_cuda import SIMULATOR, cuda
from numba_flash.block_mask import PARTIAL, BlockMask, _device_mod, check_mod
from numba_flash.reference import _check_block_mask
from numba_flash.variant import Mods


def _kept_block(b, h, q_idx, kv_idx, kinds, shift):
    """A dense block mask's ``mask_mod``: the pair's block (``2**shift`` a side) is not
    EMPTY (``kinds`` broadcast over a batch or head axis of size 1)."""
    return kinds[min(b, kinds.shape[0] - 1), min(h, kinds.shape[1] - 1), q_idx >> shift, kv_idx >> shift] != 0


def _kept_block_div(b, h, q_idx, kv_idx, kinds, block_size):
    """:func:`_kept_block` for a block size that is not a power of two."""
    return kinds[min(b, kinds.shape[0] - 1), min(h, kinds.shape[1] - 1), q_idx // block_size,
                 kv_idx // block_size] != 0


_LISTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # BlockMask -> {key: (count, visit)}


def visit_lists(bm: BlockMask, block_m: int, block_n: int, keys_are_rows: bool, seqlen_q: int, seqlen_k: int,
                window=(-1, -1), lengths=None) -> tuple:
    """``(count, visit)`` int32 NumPy arrays (B', H', R) and (B', H', R, L): row tile
    r's tiles to visit (query tiles of ``block_m`` rows against key tiles of
    ``block_n``; rows are key tiles when ``keys_are_rows``), ``visit[..., :count]``
    each ``tile << 1 | partial``, increasing: ``BlockMask.visit_lists`` clipped to the
    range the built-in masks leave (``window`` with causal folded in, as
    ``block_info.key_tiles`` / ``query_tiles``; the reference's ranges, in tiles).
    ``lengths``: varlen's (B, 2) sequence lengths (queries, keys), ``seqlen_q`` /
    ``seqlen_k`` the longest: each sequence's lists are clipped to its own ranges
    (B' = B), and its row tiles past its end are empty."""
    from numba_flash.reference import _key_range, _query_range

    rows = -(-(seqlen_k if keys_are_rows else seqlen_q) // (block_n if keys_are_rows else block_m))
    step, tile = (block_n, block_m) if keys_are_rows else (block_m, block_n)
    span = _query_range if keys_are_rows else _key_range

    def clipped(nq, nk):  # (lo, hi) tiles of each row tile of a sequence of nq queries, nk keys
        n_rows = nk if keys_are_rows else nq
        ranges = [span(r * step, r * step + step, nq, nk, window) if r * step < n_rows else (0, 0)
                  for r in range(rows)]  # fmt: skip
        lo = np.array([a // tile for a, _ in ranges], int)
        return lo, np.maximum(lo, np.array([-(-b // tile) for _, b in ranges], int))

    if lengths is None:
        lo, hi = clipped(seqlen_q, seqlen_k)
    else:
        lo, hi = (np.stack(x).reshape(len(lengths), rows) for x in zip(*(clipped(nq, nk) for nq, nk in lengths)))
    count, index, partial = bm.visit_lists(block_m, block_n, keys_are_rows, (lo, hi))
    width = max(int(count.max()) if count.size else 0, 1)
    visit = np.zeros(count.shape + (width,), np.int32)
    visit[..., : index.shape[3]] = (index * 2 + partial)[..., :width]
    return count, visit


def heaviest_first(count: np.ndarray) -> np.ndarray:
    """The row tiles in the order the launch's blocks take them (``block_info.block_coords``):
    by list length summed over batch and heads, longest first (ties in tile order), so
    that the grid does not end on a long block started last."""
    return np.argsort(-count.sum(axis=(0, 1)), kind="stable").astype(np.int32)


def _on_device(a, xp):
    """A ``mod_args`` entry as the kernels take it: arrays on the compute side (CuPy,
    NumPy under the simulator), Python floats as float32 (the user's math stays
    fp32), other scalars as they are."""
    if isinstance(a, (bool, np.bool_)):
        return np.bool_(a)
    if isinstance(a, float):
        return np.float32(a)
    if isinstance(a, (numbers.Integral, np.number)):
        return a if isinstance(a, np.number) else int(a)
    if xp is np:
        return np.ascontiguousarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)
    if hasattr(a, "__cuda_array_interface__"):
        return xp.asarray(a)
    if hasattr(a, "__dlpack__") and not isinstance(a, np.ndarray):
        return xp.from_dlpack(a)
    return xp.asarray(a)


def _check_args(mod_args, name="mod_args") -> tuple:
    if not isinstance(mod_args, (tuple, list)):
        raise TypeError(f"{name}: expected a tuple of arrays and scalars, got {type(mod_args).__name__}")
    for i, a in enumerate(mod_args):
        scalar = isinstance(a, (numbers.Number, np.number, np.bool_))
        array = hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__") or isinstance(a, np.ndarray)
        if not (scalar or array) or isinstance(a, complex):
            raise TypeError(f"{name}[{i}]: expected an array (CuPy, NumPy, CUDA array interface, DLPack) or a real "
                            f"scalar, got {type(a).__name__}")  # fmt: skip
    return tuple(mod_args)


_PROBES: dict = {}


def _probe(name: str, fn, device_fn, fixed: int, args: tuple) -> None:
    """Compile (and run once) ``fn`` alone: a TypeError naming it when it does not
    compile for the GPU with these ``mod_args``, fails, or returns no number/bool."""
    key = (device_fn, tuple(_type_key(a) for a in args))
    if key in _PROBES:
        return
    fname = getattr(fn, "__name__", repr(fn))
    want = "a number (the new score)" if fixed == 5 else "a bool (True: the pair takes part)"
    lead = "score, b, h, q_idx, kv_idx" if fixed == 5 else "b, h, q_idx, kv_idx"
    if SIMULATOR:  # the kernels run the Python function itself
        try:
            value = fn(*((np.float32(0.5),) if fixed == 5 else ()), 0, 0, 0, 0, *args)
        except Exception as exc:
            raise TypeError(f"{name} {fname!r} failed on sample arguments ({lead}, *mod_args): "
                            f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
        if not isinstance(value, (numbers.Real, np.number, np.bool_)):
            raise TypeError(f"{name} {fname!r} returned {type(value).__name__}: expected {want}")
        _PROBES[key] = True
        return
    import cupy

    out = cupy.zeros(1, cupy.float32 if fixed == 5 else cupy.bool_)
    kernel = _probe_kernel(device_fn, fixed == 5)
    try:
        kernel[1, 1](out, args)
    except Exception as exc:
        if "numba" not in type(exc).__module__:
            raise
        first = str(exc).strip().splitlines()
        raise TypeError(f"{name} {fname!r} does not compile for the GPU with mod_args of types "
                        f"{[type(a).__name__ for a in args]} (it takes ({lead}, *mod_args) and must return {want}): "
                        f"{first[0] if first else type(exc).__name__}") from exc  # fmt: skip
    _PROBES[key] = True


def _type_key(a):
    if hasattr(a, "dtype") and getattr(a, "ndim", 0) > 0:
        return (str(a.dtype), a.ndim)
    return type(a)


_PROBE_KERNELS: dict = {}


def _probe_kernel(device_fn, is_score: bool):
    key = (device_fn, is_score)
    if key not in _PROBE_KERNELS:
        from numba import float32

        if is_score:

            @cuda.jit
            def probe(out, args):
                out[0] = device_fn(float32(0.5), 0, 0, 0, 0, *args)

        else:

            @cuda.jit
            def probe(out, args):
                out[0] = bool(device_fn(0, 0, 0, 0, *args))

        _PROBE_KERNELS[key] = probe
    return _PROBE_KERNELS[key]


class FlexCall:
    """A call's FlexAttention arguments, checked, with the kernels' ``mods`` and a
    provider of ``fx`` per launch (:meth:`fx`)."""

    def __init__(self, score_mod, score_mod_grad, block_mask, mod_args, *, batch: int, heads: int, seqlen_q: int,
                 seqlen_k: int, window=(-1, -1), backward: bool = False, lengths=None):  # fmt: skip
        mod_args = _check_args(mod_args)
        if score_mod is None and score_mod_grad is not None:
            raise ValueError("score_mod_grad: given without a score_mod")
        if score_mod is None and mod_args:
            raise ValueError(f"mod_args: {len(mod_args)} given without a score_mod to read them (a block mask's "
                             "mask_mod has its own, BlockMask.mod_args)")  # fmt: skip
        if score_mod is not None:
            check_mod("score_mod", score_mod, 5, mod_args)
            if backward:
                if score_mod_grad is None:
                    raise ValueError("score_mod_grad: the backward needs the derivative of score_mod with respect to "
                                     "the score, score_mod_grad(score, b, h, q_idx, kv_idx, *mod_args) -> float "
                                     "(1.0 for a bias that does not depend on the score); got None")  # fmt: skip
                check_mod("score_mod_grad", score_mod_grad, 5, mod_args)
        if block_mask is not None:
            if not isinstance(block_mask, BlockMask):
                raise TypeError(f"block_mask: expected a numba_flash.BlockMask (create_block_mask, "
                                f"BlockMask.from_dense) or None, got {type(block_mask).__name__}")  # fmt: skip
            _check_block_mask(block_mask, batch, heads, seqlen_q, seqlen_k,
                              "q's and k's" if lengths is None else "max_seqlen_q and max_seqlen_k")  # fmt: skip
        self.block_mask = block_mask
        self.window = tuple(window)
        self.sizes = (seqlen_q, seqlen_k)
        self.lengths = lengths  # varlen: (B, 2) lengths of the sequences, seqlen_q / seqlen_k the longest
        xp = np if SIMULATOR else __import__("cupy")
        self.xp = xp
        self.score_args = tuple(_on_device(a, xp) for a in mod_args)
        score_fn = grad_fn = mask_fn = None
        if score_mod is not None:
            score_fn = _device_mod(score_mod)
            _probe("score_mod", score_mod, score_fn, 5, self.score_args)
            if backward:
                grad_fn = _device_mod(score_mod_grad)
                _probe("score_mod_grad", score_mod_grad, grad_fn, 5, self.score_args)
        self.mask_args = ()
        if block_mask is not None:
            if block_mask.mask_mod is not None:
                mask_fn = _device_mod(block_mask.mask_mod)
                self.mask_args = tuple(_on_device(a, xp) for a in block_mask.mod_args)
                _probe("mask_mod", block_mask.mask_mod, mask_fn, 4, self.mask_args)
        self.mods = Mods(score_fn, grad_fn, mask_fn, block_mask is not None)

    def adapt(self, walks) -> bool:
        """Give a dense block mask (no ``mask_mod``) its own (:func:`_kept_block`) when
        one of the kernels' tile ``walks`` has a PARTIAL tile (a tile that straddles kept
        and dropped blocks; not when the blocks are whole tiles, the common case, whose
        kernels then carry no mask function); True when ``mods`` changed (the caller
        plans again)."""
        bm = self.block_mask
        if bm is None or bm.mask_mod is not None or self.mods.mask_fn is not None:
            return False
        cache = _LISTS.setdefault(bm, {})
        partial = False
        for walk in walks:
            key = ("partial",) + tuple(walk)
            if key not in cache:
                cache[key] = bool(np.any(bm.tile_kinds(*walk) == PARTIAL))
            partial = partial or cache[key]
        if not partial:
            return False
        bs = int(bm.block_size)
        pow2 = bs & (bs - 1) == 0
        self.mask_args = (_on_device(bm.kinds, self.xp), bs.bit_length() - 1 if pow2 else bs)
        self.mods = Mods(self.mods.score_fn, self.mods.grad_fn, _device_mod(_kept_block if pow2 else _kept_block_div),
                         True)  # fmt: skip
        return True

    def fx(self, walk: tuple) -> tuple:
        """``fx`` for a launch whose tile walk is ``walk`` (``KernelLaunch.walk``):
        ``(score_args, mask_args, count, visit, count_t, visit_t, order, pages, split)``
        (the last two a plain call's dummies)."""
        from numba_flash.api import _device_id, _dummies

        plain = _dummies(_device_id())[2]  # a plain call's lists, made once per device
        dummy = plain[2:4]
        lists = plain[2:]
        if self.block_mask is not None and walk:
            block_m, block_n, keys_are_rows = walk
            count, visit, order = self._lists(block_m, block_n, keys_are_rows)
            lists = (dummy + (count, visit) if keys_are_rows else (count, visit) + dummy) + (order,) + plain[7:]
        return (self.score_args, self.mask_args) + lists

    def _lists(self, block_m, block_n, keys_are_rows):
        from numba_flash.api import _device_id

        cache = _LISTS.setdefault(self.block_mask, {})
        key = (block_m, block_n, keys_are_rows, self.sizes, self.window, _device_id())
        lengths = None if self.lengths is None else self.lengths.tobytes()  # varlen: one batch's lengths kept
        if key not in cache or cache[key][0] != lengths:
            count, visit = visit_lists(self.block_mask, block_m, block_n, keys_are_rows, *self.sizes, self.window,
                                       self.lengths)  # fmt: skip
            cache[key] = (lengths, (self.xp.asarray(count), self.xp.asarray(visit),
                                    self.xp.asarray(heaviest_first(count))))  # fmt: skip
        return cache[key][1]


def compile_error(exc: Exception) -> TypeError | None:
    """A TypeError for a numba error raised while compiling a kernel with the user's
    functions inlined (each compiled alone first: rare), or None for other errors."""
    if "numba" not in type(exc).__module__:
        return None
    first = str(exc).strip().splitlines()
    return TypeError(f"the kernels with score_mod / mask_mod inlined do not compile: "
                     f"{first[0] if first else type(exc).__name__}")  # fmt: skip

"""Timing on the device: CUDA-event timing (:func:`time_fn`, :class:`Timing`), the
input sets cycled through (:class:`InputSet`, :func:`rotation_count`) and the device
helpers (:func:`require_device`, L2 / free memory, :func:`release_memory`, :func:`is_oom`).

Timing (:func:`time_fn`)
------------------------
CUDA events around each call; one untimed call first (numba JIT compilation, cuBLAS /
cuDNN plans), ``warmup`` calls to estimate the cost, then ``n`` timed calls where ``n`` is
``rep`` cut down to fit ``budget_ms`` (never below ``min_rep``); the median is reported
with min, max and the quartiles.  Input rotation: several independent input sets are
allocated so that together they exceed ``L2_FACTOR`` (3) × the device's L2 cache (read
from the device) and consecutive calls cycle through them, so no call finds its inputs
in L2 (limited to a quarter of the free memory and ``MAX_SETS`` sets).
"""

from __future__ import annotations

import gc
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from numba_flash.bench.cases import BenchCase

L2_FACTOR = 3
MAX_SETS = 32
DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; only used when the device cannot be asked


class NoDeviceError(RuntimeError):
    """Timings need a CUDA device (the simulator's would mean nothing)."""


@dataclass
class Timing:
    """Timed calls of one function, in milliseconds."""

    ms: float
    ms_min: float
    ms_max: float
    ms_q1: float
    ms_q3: float
    reps: int
    rotation: int = 1
    samples: list = field(default_factory=list, repr=False)

    @classmethod
    def from_samples(cls, samples: Sequence[float], rotation: int = 1) -> "Timing":
        if not samples:
            raise ValueError("no samples")
        s = sorted(float(x) for x in samples)
        if len(s) >= 2:
            q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive")
        else:
            q1 = q3 = s[0]
        return cls(statistics.median(s), s[0], s[-1], q1, q3, len(s), rotation, list(s))


def require_device(what: str = "timings"):
    """Raise :class:`NoDeviceError` unless kernels run on a real CUDA device."""
    from numba_flash.check import runtime_mode

    mode = runtime_mode()
    if mode != "gpu":
        why = (
            f"the kernels would run in numba's CUDA simulator (no GPU found), where {what} mean nothing"
            if mode == "simulator"
            else "no CUDA device was found"
        )
        raise NoDeviceError(f"{what} need a CUDA device: {why}")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - needs a broken CUDA install
        raise NoDeviceError(f"{what} need a CUDA device and CuPy: {type(exc).__name__}: {exc}")


def l2_bytes() -> int | None:
    """The device's L2 cache size in bytes (None when it cannot be read)."""
    try:
        import cupy

        dev = cupy.cuda.Device()
        return int(cupy.cuda.runtime.getDeviceProperties(dev.id)["l2CacheSize"])
    except Exception:
        return None


def free_bytes() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:
        return None


def rotation_count(set_bytes: int, *, l2: int | None = None, free: int | None = None, factor: int = L2_FACTOR, max_sets: int = MAX_SETS) -> int:
    """How many input sets of ``set_bytes`` to cycle through so that together they
    exceed ``factor`` × L2, within a quarter of the free memory and ``max_sets``."""
    if set_bytes <= 0:
        return 1
    l2 = DEFAULT_L2_BYTES if l2 is None else l2
    n = math.ceil(factor * l2 / set_bytes)
    if free is not None:
        n = min(n, max(1, int(0.25 * free) // set_bytes))
    return int(max(1, min(n, max_sets)))


def release_memory():
    """Drop cached blocks of CuPy's and torch's allocators (after an OOM, between peers)."""
    gc.collect()
    try:
        import cupy

        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:
        pass
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


def is_oom(exc: BaseException) -> bool:
    """CuPy's OutOfMemoryError, torch's OutOfMemoryError, or a CUDA/cuBLAS allocation failure."""
    if isinstance(exc, MemoryError):  # cupy.cuda.memory.OutOfMemoryError is a MemoryError
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError",):
        return True
    text = str(exc)
    return any(s in text for s in ("out of memory", "OUT_OF_MEMORY", "ALLOC_FAILED", "cudaErrorMemoryAllocation"))


class _CupyEvents:
    def __init__(self):
        import cupy

        self.cupy = cupy

    def event(self):
        return self.cupy.cuda.Event()

    def record(self, e):
        e.record()

    def elapsed(self, a, b) -> float:
        return float(self.cupy.cuda.get_elapsed_time(a, b))

    def synchronize(self):
        self.cupy.cuda.get_current_stream().synchronize()
        self.cupy.cuda.Device().synchronize()


class _TorchEvents:
    def __init__(self):
        import torch

        self.torch = torch

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, e):
        e.record()

    def elapsed(self, a, b) -> float:
        return float(a.elapsed_time(b))

    def synchronize(self):
        self.torch.cuda.synchronize()


def time_fn(
    fn,
    warmup: int = 5,
    rep: int = 30,
    *,
    min_rep: int = 5,
    budget_ms: float | None = 1500.0,
    setup: Callable[[int], None] | None = None,
    events: str = "cupy",
) -> Timing:
    """Time ``fn`` with CUDA events; return the median and spread in milliseconds.

    ``fn`` is a callable, or a sequence of callables (one per input set) cycled through
    call by call, so that consecutive calls read different memory (input rotation).
    ``setup(i)``, when given, runs before call ``i`` outside the timed region.  One
    untimed call, ``warmup`` calls (also used to estimate the cost), then
    ``min(rep, max(min_rep, budget_ms / estimate))`` timed calls.
    """
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if not fns:
        raise ValueError("fn: nothing to time")
    ev = _TorchEvents() if events == "torch" else _CupyEvents()
    i = 0

    def call():
        nonlocal i
        if setup is not None:
            setup(i)
        fns[i % len(fns)]()
        i += 1

    call()  # compile, plan, allocate
    ev.synchronize()
    warmup = max(1, int(warmup))
    start, end = ev.event(), ev.event()
    ev.record(start)
    for _ in range(warmup):
        call()
    ev.record(end)
    ev.synchronize()
    estimate = max(ev.elapsed(start, end) / warmup, 1e-4)
    n = int(rep)
    if budget_ms is not None:
        n = min(n, max(int(min_rep), int(budget_ms / estimate)))
    n = max(1, n)
    pairs = []
    for _ in range(n):
        if setup is not None:
            setup(i)
        a, b = ev.event(), ev.event()
        ev.record(a)
        fns[i % len(fns)]()
        ev.record(b)
        i += 1
        pairs.append((a, b))
    ev.synchronize()
    return Timing.from_samples([ev.elapsed(a, b) for a, b in pairs], rotation=len(fns))


def _itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _cupy_dtype(dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


class InputSet:
    """q, k, v, dout of one case on the device, (B, N, H, d) contiguous (bshd).

    float16 / float32 are held in their dtype.  bfloat16 is held as float32 holding
    bfloat16 values (CuPy has no bfloat16 arithmetic): :meth:`get` makes the bfloat16
    arrays numba-flash takes, torch converts the float32 ones itself.

    A varlen case is held as its padded batch, (B, max length, H, d) (its rows past a
    sequence's length hold random values like the rest, as a padded model's pad tokens
    have projections too): :meth:`get` and :meth:`bhsd` give that batch, what the peers
    run, and :meth:`packed` and :meth:`cu_seqlens` the real rows packed and their offsets,
    what ``flash_attention_varlen`` takes.

    ``xp`` is the array module: CuPy (the default), or NumPy for the CPU tests (the
    kernels then run in numba's CUDA simulator)."""

    def __init__(self, case: BenchCase, seed: int, xp=None):
        import numpy as np

        if xp is None:
            import cupy as xp
        self.xp = xp
        self.seqlens = case.seqlens
        self._cu = case.cu_seqlens if case.varlen else None
        self._rows = None  # packed(): the padded batch's real rows, (total,) on xp's side
        case = case.padded
        rs = xp.random.RandomState(seed)
        self.dtype = case.dtype
        B, H, d = case.batch, case.heads, case.head_dim

        def make(n, heads=H):
            shape = (B, n, heads, d)
            x = rs.standard_normal(shape).astype(np.float32) if xp is np else rs.standard_normal(shape, xp.float32)
            if case.dtype == "bfloat16":  # round to nearest even at 16 bits, keep float32
                u = x.view(xp.uint32)
                u += xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))
                u &= xp.uint32(0xFFFF0000)
                return x
            return x.astype(_cupy_dtype(case.dtype))

        self.q = make(case.seqlen_q)
        H = getattr(case, "kv_heads", 0) or case.heads  # GQA: k and v have the KV heads
        self.k = make(case.seqlen_k, H)
        self.v = make(case.seqlen_k, H)
        self.dout = make(case.seqlen_q)

    def bhsd(self, name: str):
        """The array as a contiguous (B, H, N, d) copy (float32 for bfloat16)."""
        return self.xp.ascontiguousarray(getattr(self, name).transpose(0, 2, 1, 3))

    def get(self, name: str, layout: str = "bshd"):
        """The array in ``layout`` and in the case's dtype (bfloat16 included)."""
        return self._in_dtype(getattr(self, name) if layout == "bshd" else self.bhsd(name))

    def packed(self, name: str):
        """A varlen case's array as ``flash_attention_varlen`` takes it: (total, H, d), the
        real rows of sequence b at ``cu_seqlens[b] ..``, in the case's dtype (a new array)."""
        import numpy as np

        self._need_varlen("packed")
        x = getattr(self, name)
        B, N = x.shape[:2]
        if self._rows is None:  # row b·N + i of the flattened padded batch, i < seqlens[b]
            self._rows = self.xp.asarray(np.concatenate([b * N + np.arange(n) for b, n in enumerate(self.seqlens)]))
        return self._in_dtype(x.reshape(B * N, *x.shape[2:])[self._rows])

    def cu_seqlens(self):
        """A varlen case's offsets, int32 (B + 1,), on the device (q and k alike)."""
        self._need_varlen("cu_seqlens")
        return self.xp.asarray(self._cu)

    def _need_varlen(self, what: str):
        if not self.seqlens:
            raise ValueError(f"{what}: not a varlen case (BenchCase.seqlens is empty)")

    def _in_dtype(self, x):
        """``x`` in the case's dtype: bfloat16 made from the float32 that holds it."""
        if self.dtype == "bfloat16":
            xp = self.xp
            bf16 = _cupy_dtype("bfloat16")
            try:  # the top 16 bits of the (already rounded) float32 values
                x = (x.view(xp.uint32) >> 16).astype(xp.uint16).view(bf16)
            except Exception:
                try:  # through the host, as cupy.asarray(numpy bfloat16 array)
                    x = xp.asarray(xp.asnumpy(x).astype(bf16))
                except Exception as exc:
                    raise NotImplementedError(f"CuPy cannot hold bfloat16 arrays here ({type(exc).__name__}: {exc})")
        return x

    @staticmethod
    def nbytes(case: BenchCase) -> int:
        case = case.padded
        size = 4 if case.dtype == "bfloat16" else _itemsize(case.dtype)
        return (2 * case.seqlen_q + 2 * case.seqlen_k) * case.batch * case.heads * case.head_dim * size

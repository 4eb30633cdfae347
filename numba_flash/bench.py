"""Benchmark harness: numba-flash against its peers, same shapes, same data, one run.

Everything ``numba-flash bench`` prints comes from here, so it is callable from Python::

    from numba_flash import bench
    results = bench.run_bench(bench.preset_cases("fa2"), passes=("forward", "backward"))
    bench.write_json(results, "out.json"); bench.plot(results, "out.png")

Implementations (``IMPLS``)
---------------------------
``numba-flash``         ``flash_attention`` / ``flash_attention_backward`` (layout option,
                        bshd by default); the backward is timed alone, on the ``out`` and
                        ``lse`` of one forward run outside the timed region.
``numba-flash-tf32``    the same with ``allow_tf32=True`` given to both passes: float32
                        inputs on TF32 tensor cores (~1e-3 relative) for head dims 64 and
                        128.  Other dtypes and head dims are reported ``unsupported``
                        (allow_tf32 would change nothing there).
``cupy-standard``       standard attention with CuPy: fp32 math (inputs cast to fp32 inside
                        the timed region, cuBLAS matmuls, softmax materialising the
                        (B, H, Nq, Nk) score matrix, output cast back); the forward keeps P
                        as a training forward does, the backward is the explicit
                        materialised backward from that saved P (dV = PᵀdO, dP = dO·Vᵀ,
                        dS = P∘(dP − rowsum(dO∘O)), dQ = scale·dS·K, dK = scale·dSᵀ·Q).
``torch-sdpa-flash``    ``torch.nn.functional.scaled_dot_product_attention`` inside
``torch-sdpa-cudnn``    ``torch.nn.attention.sdpa_kernel(SDPBackend.X)`` for X = FLASH_ATTENTION,
``torch-sdpa-efficient`` CUDNN_ATTENTION, EFFICIENT_ATTENTION, MATH; tensors (B, H, N, d)
``torch-sdpa-math``     contiguous, holding the same values; the backward is
                        ``out.backward(dout, retain_graph=True)`` timed alone (gradients
                        reset to None outside the timed region).

An implementation that cannot run a case is *reported*, never a crash: torch not
importable or without that backend → ``unavailable``; a backend refusing the dtype or
shape (e.g. flash with float32) → ``unsupported``; out of device memory → ``oom`` (CuPy
and torch caches are emptied afterwards); anything else → ``error`` with the message.

Timing (:func:`time_fn`)
------------------------
CUDA events around each call; one untimed call first (numba JIT compilation, cuBLAS /
cuDNN plans), ``warmup`` calls to estimate the cost, then ``n`` timed calls where ``n`` is
``rep`` cut down to fit ``budget_ms`` (never below ``min_rep``); the median is reported
with min, max and the quartiles.  Input rotation: several independent input sets are
allocated so that together they exceed ``L2_FACTOR`` (3) × the device's L2 cache (read
from the device) and consecutive calls cycle through them, so no call finds its inputs
in L2 (limited to a quarter of the free memory and ``MAX_SETS`` sets).

FLOPs (:func:`attention_flops`)
-------------------------------
``4·B·H·Nq·Nk·d`` for the forward (two matmuls of 2·Nq·Nk·d each), halved when causal,
×2.5 for the backward (five matmuls) and ×3.5 for forward + backward — the convention of
FlashAttention-2's benchmarks.  TFLOP/s = flops / ms / 1e9.

JSON schema (:func:`to_json_dict`, schema id ``numba-flash-bench/1``)
--------------------------------------------------------------------
Top level::

    {"schema": "numba-flash-bench/1", "created": ISO-8601 time,
     "environment": {...numba_flash.info.gather_info() summary...},
     "settings": {"warmup": int, "rep": int, "min_rep": int, "budget_ms": float,
                  "l2_bytes": int | null, "layout": str},
     "results": [row, ...]}

One ``row`` per (case, implementation, pass)::

    impl                  str   one of IMPLS
    pass                  str   "forward" | "backward" | "forward+backward"
                                (the last is derived: the sum of the two measured passes)
    dtype                 str   "float16" | "bfloat16" | "float32"
    batch, heads          int
    seqlen_q, seqlen_k    int
    head_dim              int
    causal                bool
    flops                 float FLOPs of one call (see above)
    ms                    float | null  median time of one call, milliseconds
    ms_min, ms_max        float | null  fastest and slowest timed call
    ms_q1, ms_q3          float | null  quartiles of the timed calls
    reps                  int   timed calls (0 when it did not run)
    rotation              int   input sets cycled through
    tflops                float | null  flops / ms / 1e9
    status                str   "ok" | "oom" | "unsupported" | "unavailable" | "error"
    detail                str   why, when status is not "ok" ("" otherwise)
    ratio_vs_numba_flash  float | null  ms / ms of numba-flash on the same case and pass:
                                > 1 means numba-flash is faster; 1.0 for numba-flash;
                                null when either did not run

The CSV (:func:`write_csv`) has the row keys as columns, in that order.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from numba_flash import _report

SCHEMA = "numba-flash-bench/1"
IMPLS = (
    "numba-flash",
    "numba-flash-tf32",
    "cupy-standard",
    "torch-sdpa-flash",
    "torch-sdpa-cudnn",
    "torch-sdpa-efficient",
    "torch-sdpa-math",
)
TORCH_BACKENDS = {
    "torch-sdpa-flash": "FLASH_ATTENTION",
    "torch-sdpa-cudnn": "CUDNN_ATTENTION",
    "torch-sdpa-efficient": "EFFICIENT_ATTENTION",
    "torch-sdpa-math": "MATH",
}
PASSES = ("forward", "backward")
ALL_PASSES = ("forward", "backward", "forward+backward")
STATUSES = ("ok", "oom", "unsupported", "unavailable", "error")
DTYPES = ("float16", "bfloat16", "float32")
PRESETS = ("fa2", "smoke")
ROW_KEYS = (
    "impl", "pass", "dtype", "batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "causal",
    "flops", "ms", "ms_min", "ms_max", "ms_q1", "ms_q3", "reps", "rotation", "tflops",
    "status", "detail", "ratio_vs_numba_flash",
)  # fmt: skip
L2_FACTOR = 3
MAX_SETS = 32
DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; only used when the device cannot be asked


class NoDeviceError(RuntimeError):
    """Timings need a CUDA device (the simulator's would mean nothing)."""


# --------------------------------------------------------------------------------------
# Cases, FLOPs, presets
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchCase:
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: str = "float16"

    def __post_init__(self):
        from numba_flash.check import check_shape_fields

        check_shape_fields(self)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")

    @property
    def label(self) -> str:
        seq = f"N={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"Nq={self.seqlen_q} Nk={self.seqlen_k}"
        return f"{self.dtype} B={self.batch} H={self.heads} {seq} d={self.head_dim} {'causal' if self.causal else 'full'}"


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, pass_="forward") -> float:
    """FLOPs of one attention call: 4·B·H·Nq·Nk·d, ×0.5 causal, ×2.5 backward,
    ×3.5 forward+backward (FlashAttention-2's convention)."""
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        f *= 0.5
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
                    cases.append(BenchCase(b, h, nq, nk, d, bool(c), dt))
    return cases


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


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


@dataclass
class BenchResult:
    impl: str
    pass_: str
    case: BenchCase
    status: str = "ok"
    detail: str = ""
    timing: Timing | None = None
    ratio_vs_numba_flash: float | None = None

    @property
    def flops(self) -> float:
        c = self.case
        return attention_flops(c.batch, c.heads, c.seqlen_q, c.seqlen_k, c.head_dim, c.causal, self.pass_)

    @property
    def ms(self) -> float | None:
        return self.timing.ms if (self.timing is not None and self.status == "ok") else None

    @property
    def tflops(self) -> float | None:
        return tflops(self.flops, self.ms)

    def to_dict(self) -> dict:
        """The JSON row (schema in the module docstring)."""
        t = self.timing if self.status == "ok" else None
        c = self.case
        row = {
            "impl": self.impl,
            "pass": self.pass_,
            "dtype": c.dtype,
            "batch": c.batch,
            "heads": c.heads,
            "seqlen_q": c.seqlen_q,
            "seqlen_k": c.seqlen_k,
            "head_dim": c.head_dim,
            "causal": c.causal,
            "flops": self.flops,
            "ms": _round(t.ms) if t else None,
            "ms_min": _round(t.ms_min) if t else None,
            "ms_max": _round(t.ms_max) if t else None,
            "ms_q1": _round(t.ms_q1) if t else None,
            "ms_q3": _round(t.ms_q3) if t else None,
            "reps": t.reps if t else 0,
            "rotation": t.rotation if t else 0,
            "tflops": _round(self.tflops),
            "status": self.status,
            "detail": self.detail,
            "ratio_vs_numba_flash": _round(self.ratio_vs_numba_flash),
        }
        assert tuple(row) == ROW_KEYS
        return row


def _round(x, digits=6):
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def add_derived(results: list[BenchResult]) -> list[BenchResult]:
    """Append "forward+backward" rows (sum of the two passes) where both were measured,
    and fill ``ratio_vs_numba_flash`` on every row.  Returns the full list."""
    by_key = {(r.impl, r.pass_, r.case): r for r in results}
    out = [r for r in results if r.pass_ != "forward+backward"]
    for r in list(out):
        if r.pass_ != "forward":
            continue
        b = by_key.get((r.impl, "backward", r.case))
        if b is None:
            continue
        if r.status == "ok" and b.status == "ok":
            t = Timing(
                r.timing.ms + b.timing.ms,
                r.timing.ms_min + b.timing.ms_min,
                r.timing.ms_max + b.timing.ms_max,
                r.timing.ms_q1 + b.timing.ms_q1,
                r.timing.ms_q3 + b.timing.ms_q3,
                min(r.timing.reps, b.timing.reps),
                max(r.timing.rotation, b.timing.rotation),
            )
            out.append(BenchResult(r.impl, "forward+backward", r.case, "ok", "", t))
        else:
            bad = r if r.status != "ok" else b
            out.append(BenchResult(r.impl, "forward+backward", r.case, bad.status, f"{bad.pass_}: {bad.detail}"))
    ref = {(r.pass_, r.case): r for r in out if r.impl == "numba-flash"}
    for r in out:
        nf = ref.get((r.pass_, r.case))
        if r.ms is not None and nf is not None and nf.ms is not None:
            r.ratio_vs_numba_flash = r.ms / nf.ms
        else:
            r.ratio_vs_numba_flash = None
    order = {name: i for i, name in enumerate(IMPLS)}
    passes = {p: i for i, p in enumerate(ALL_PASSES)}
    case_order = {}
    for r in out:
        case_order.setdefault(r.case, len(case_order))
    out.sort(key=lambda r: (case_order[r.case], passes.get(r.pass_, 9), order.get(r.impl, 99)))
    return out


# --------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------------------


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
    arrays numba-flash takes, torch converts the float32 ones itself."""

    def __init__(self, case: BenchCase, seed: int):
        import cupy

        rs = cupy.random.RandomState(seed)
        self.dtype = case.dtype
        B, H, d = case.batch, case.heads, case.head_dim

        def make(n):
            x = rs.standard_normal((B, n, H, d), dtype=cupy.float32)
            if case.dtype == "bfloat16":  # round to nearest even at 16 bits, keep float32
                u = x.view(cupy.uint32)
                u += cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))
                u &= cupy.uint32(0xFFFF0000)
                return x
            return x.astype(_cupy_dtype(case.dtype))

        self.q = make(case.seqlen_q)
        self.k = make(case.seqlen_k)
        self.v = make(case.seqlen_k)
        self.dout = make(case.seqlen_q)

    def bhsd(self, name: str):
        """The array as a contiguous (B, H, N, d) copy (float32 for bfloat16)."""
        import cupy

        return cupy.ascontiguousarray(getattr(self, name).transpose(0, 2, 1, 3))

    def get(self, name: str, layout: str = "bshd"):
        """The array in ``layout`` and in the case's dtype (bfloat16 included)."""
        x = getattr(self, name) if layout == "bshd" else self.bhsd(name)
        if self.dtype == "bfloat16":
            import cupy

            bf16 = _cupy_dtype("bfloat16")
            try:  # the top 16 bits of the (already rounded) float32 values
                x = (x.view(cupy.uint32) >> 16).astype(cupy.uint16).view(bf16)
            except Exception:
                try:  # through the host, as cupy.asarray(numpy bfloat16 array)
                    x = cupy.asarray(cupy.asnumpy(x).astype(bf16))
                except Exception as exc:
                    raise NotImplementedError(f"CuPy cannot hold bfloat16 arrays here ({type(exc).__name__}: {exc})")
        return x

    @staticmethod
    def nbytes(case: BenchCase) -> int:
        size = 4 if case.dtype == "bfloat16" else _itemsize(case.dtype)
        return (2 * case.seqlen_q + 2 * case.seqlen_k) * case.batch * case.heads * case.head_dim * size


class Impl:
    """One implementation: ``prepare`` builds, per input set, the callable to time."""

    name = ""
    events = "cupy"

    def unavailable(self) -> str | None:
        """None when usable, else why not."""
        return None

    def unsupported(self, case: BenchCase, pass_: str) -> str | None:
        return None

    def extra_set_bytes(self, case: BenchCase, pass_: str) -> int:
        """Device memory one input set needs beyond q, k, v, dout (saved state)."""
        return 0

    def prepare(self, case: BenchCase, pass_: str, sets: Sequence[InputSet]):
        """Return (callables, setup or None, context manager for the timed region)."""
        raise NotImplementedError

    def context(self):
        return contextlib.nullcontext()


class NumbaFlash(Impl):
    """numba-flash; ``allow_tf32`` as in ``flash_attention`` (the "numba-flash-tf32" row)."""

    def __init__(self, layout: str = "bshd", allow_tf32: bool = False):
        self.layout = layout
        self.allow_tf32 = allow_tf32
        self.name = "numba-flash-tf32" if allow_tf32 else "numba-flash"

    def unsupported(self, case, pass_):
        if not self.allow_tf32:
            return None
        if case.dtype != "float32":
            return "allow_tf32 applies to float32 inputs only (fp16/bf16 already run on tensor cores)"
        from numba_flash.kernels.tf32_forward import TF32_HEAD_DIMS

        if case.head_dim not in TF32_HEAD_DIMS:
            return f"TF32 kernels cover head dims {TF32_HEAD_DIMS}; d={case.head_dim} runs the exact fp32 kernel"
        return None

    def extra_set_bytes(self, case, pass_):
        o = case.batch * case.heads * case.seqlen_q * (case.head_dim * _itemsize(case.dtype) + 4)
        return o if pass_ == "backward" else 0

    def prepare(self, case, pass_, sets):
        from numba_flash import api

        kw = dict(causal=case.causal, layout=self.layout)
        if self.allow_tf32:
            kw["allow_tf32"] = True
        fns = []
        for s in sets:
            q, k, v, do = (s.get(n, self.layout) for n in ("q", "k", "v", "dout"))
            if pass_ == "forward":
                fns.append(lambda q=q, k=k, v=v: api.flash_attention(q, k, v, return_lse=True, **kw))
            else:
                out, lse = api.flash_attention(q, k, v, return_lse=True, **kw)
                fns.append(
                    lambda q=q, k=k, v=v, do=do, out=out, lse=lse: api.flash_attention_backward(
                        do, q, k, v, out, lse, **kw
                    )
                )
        return fns, None


def cupy_attention_forward(q, k, v, *, causal=False, softmax_scale=None, bias=None):
    """Standard attention with CuPy (bhsd arrays): fp32 math, materialised scores.

    Returns ``(out, p)``: out in q's dtype and the fp32 probabilities P (B, H, Nq, Nk),
    which a training forward keeps for the backward.  ``bias`` is an optional (Nq, Nk)
    fp32 additive mask (0 / −inf); with ``causal`` and no bias one is built here.
    """
    import cupy as cp

    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    qf, kf, vf = (x.astype(cp.float32, copy=False) for x in (q, k, v))
    s = cp.matmul(qf, kf.swapaxes(-1, -2))
    s *= cp.float32(scale)
    if causal:
        if bias is None:
            bias = causal_bias(q.shape[-2], k.shape[-2])
        s += bias
    m = s.max(axis=-1, keepdims=True)
    m = cp.where(cp.isneginf(m), cp.float32(0), m)  # a row that sees no key
    s -= m
    cp.exp(s, out=s)
    l = s.sum(axis=-1, keepdims=True)
    l = cp.where(l > 0, l, cp.float32(1))
    s /= l
    out = cp.matmul(s, vf).astype(q.dtype, copy=False)
    return out, s


def cupy_attention_backward(dout, q, k, v, out, p, *, softmax_scale=None):
    """The materialised backward from the saved P (see :func:`cupy_attention_forward`)."""
    import cupy as cp

    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    dof, qf, kf, vf, of = (x.astype(cp.float32, copy=False) for x in (dout, q, k, v, out))
    dv = cp.matmul(p.swapaxes(-1, -2), dof)
    dp = cp.matmul(dof, vf.swapaxes(-1, -2))
    delta = (dof * of).sum(axis=-1, keepdims=True)
    dp -= delta
    dp *= p  # dS
    dq = cp.matmul(dp, kf)
    dq *= cp.float32(scale)
    dk = cp.matmul(dp.swapaxes(-1, -2), qf)
    dk *= cp.float32(scale)
    return tuple(x.astype(q.dtype, copy=False) for x in (dq, dk, dv))


def causal_bias(seqlen_q: int, seqlen_k: int):
    """(Nq, Nk) fp32: 0 where query i sees key j (j <= i + Nk − Nq), −inf elsewhere."""
    import cupy as cp

    i = cp.arange(seqlen_q)[:, None]
    j = cp.arange(seqlen_k)[None, :]
    return cp.where(j <= i + (seqlen_k - seqlen_q), cp.float32(0), cp.float32(-cp.inf)).astype(cp.float32)


class CupyStandard(Impl):
    name = "cupy-standard"

    def unavailable(self):
        try:
            import cupy  # noqa: F401
        except Exception as exc:
            return f"CuPy is not importable ({type(exc).__name__})"
        return None

    def unsupported(self, case, pass_):
        if case.dtype == "bfloat16":
            return "CuPy has no bfloat16 arithmetic"
        return None

    def extra_set_bytes(self, case, pass_):
        if pass_ == "backward":  # the saved P and out
            return case.batch * case.heads * (case.seqlen_q * case.seqlen_k * 4 + case.seqlen_q * case.head_dim * 2)
        return 0

    def prepare(self, case, pass_, sets):
        bias = causal_bias(case.seqlen_q, case.seqlen_k) if case.causal else None
        fns = []
        for s in sets:
            q, k, v = s.bhsd("q"), s.bhsd("k"), s.bhsd("v")
            if pass_ == "forward":
                fns.append(lambda q=q, k=k, v=v: cupy_attention_forward(q, k, v, causal=case.causal, bias=bias))
            else:
                do = s.bhsd("dout")
                out, p = cupy_attention_forward(q, k, v, causal=case.causal, bias=bias)
                fns.append(lambda do=do, q=q, k=k, v=v, out=out, p=p: cupy_attention_backward(do, q, k, v, out, p))
        return fns, None


class TorchSDPA(Impl):
    events = "torch"

    def __init__(self, name: str):
        self.name = name
        self.backend_name = TORCH_BACKENDS[name]

    def _torch(self):
        import torch

        return torch

    def unavailable(self):
        try:
            torch = self._torch()
        except Exception as exc:
            return f"torch is not importable ({type(exc).__name__}: {exc})"
        try:
            if not torch.cuda.is_available():
                return "torch sees no CUDA device"
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except Exception as exc:
            return f"torch {getattr(torch, '__version__', '?')} has no torch.nn.attention.sdpa_kernel ({exc})"
        if not hasattr(SDPBackend, self.backend_name):
            return f"torch {torch.__version__} has no SDPBackend.{self.backend_name}"
        return None

    def unsupported(self, case, pass_):
        if case.causal and case.seqlen_q != case.seqlen_k:
            return "torch SDPA's is_causal is top-left aligned; numba-flash's is bottom-right when Nq != Nk"
        if self.name in ("torch-sdpa-flash", "torch-sdpa-cudnn") and case.dtype == "float32":
            return f"{self.backend_name} supports float16 and bfloat16 only"
        return None

    def extra_set_bytes(self, case, pass_):
        if pass_ != "backward":
            return 0
        o = case.batch * case.heads * case.seqlen_q * (case.head_dim * _itemsize(case.dtype) + 4)
        if self.name == "torch-sdpa-math":  # the graph keeps the attention weights
            o += case.batch * case.heads * case.seqlen_q * case.seqlen_k * _itemsize(case.dtype)
        return o

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, self.backend_name))

    def prepare(self, case, pass_, sets):
        torch = self._torch()
        F = torch.nn.functional
        causal = case.causal

        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[case.dtype]

        def tensor(x, grad):
            # the same values in a tensor torch owns: (B, H, N, d) contiguous
            t = torch.from_dlpack(x).to(dtype=dtype).clone()
            return t.requires_grad_(grad)

        fns, leaves = [], []
        for s in sets:
            q, k, v = (tensor(s.bhsd(n), True) for n in ("q", "k", "v"))
            if pass_ == "forward":
                fns.append(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            else:
                do = tensor(s.bhsd("dout"), False)
                with self.context():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fns.append(lambda out=out, do=do: out.backward(do, retain_graph=True))
                leaves.append((q, k, v))

        def setup(i):
            if leaves:
                for t in leaves[i % len(leaves)]:
                    t.grad = None

        return fns, (setup if leaves else None)


def make_impls(names: Iterable[str] = IMPLS, *, layout: str = "bshd") -> list[Impl]:
    impls = []
    for name in names:
        if name in ("numba-flash", "numba-flash-tf32"):
            impls.append(NumbaFlash(layout, allow_tf32=name == "numba-flash-tf32"))
        elif name == "cupy-standard":
            impls.append(CupyStandard())
        elif name in TORCH_BACKENDS:
            impls.append(TorchSDPA(name))
        else:
            raise ValueError(f"impl: expected one of {IMPLS}, got {name!r}")
    return impls


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def measure(impl: Impl, case: BenchCase, pass_: str, *, sets_cache: dict, warmup=5, rep=30, min_rep=5, budget_ms=1500.0, l2=None) -> BenchResult:
    """Time one implementation on one case and pass; never raises for the peer's own
    failures (they become the result's status)."""
    why = impl.unavailable()
    if why:
        return BenchResult(impl.name, pass_, case, "unavailable", why)
    why = impl.unsupported(case, pass_)
    if why:
        return BenchResult(impl.name, pass_, case, "unsupported", why)
    fns = setup = None
    caught: list = []
    try:
        per_set = InputSet.nbytes(case) + impl.extra_set_bytes(case, pass_)
        n_sets = rotation_count(per_set, l2=l2, free=free_bytes())
        sets = sets_cache.setdefault("sets", [])
        while len(sets) < n_sets:
            sets.append(InputSet(case, seed=1234 + len(sets)))
        with warnings.catch_warnings(record=True) as caught_now:
            warnings.simplefilter("always")
            caught = caught_now
            with impl.context():
                fns, setup = impl.prepare(case, pass_, sets[:n_sets])
                timing = time_fn(fns, warmup, rep, min_rep=min_rep, budget_ms=budget_ms, setup=setup, events=impl.events)
        return BenchResult(impl.name, pass_, case, "ok", "", timing)
    except Exception as exc:
        fns = setup = None
        if is_oom(exc):
            status, detail = "oom", "out of memory: " + _short(exc, 160)
        elif isinstance(exc, NotImplementedError):
            status, detail = "unsupported", _short(exc)
        elif "No available kernel" in str(exc):
            reasons = [str(w.message).split("\n")[0] for w in caught]
            status, detail = "unsupported", _short(exc, 80) + (" — " + "; ".join(reasons[:2]) if reasons else "")
            detail = detail[:300]
        elif isinstance(exc, (TypeError, ValueError)) and impl.name.startswith("numba-flash"):
            status, detail = "unsupported", _short(exc)
        else:
            status, detail = "error", _short(exc)
        return BenchResult(impl.name, pass_, case, status, detail)
    finally:
        fns = setup = None
        release_memory()


def run_bench(
    cases: Sequence[BenchCase],
    *,
    impls: Iterable[str] = IMPLS,
    passes: Iterable[str] = PASSES,
    layout: str = "bshd",
    warmup: int = 5,
    rep: int = 30,
    min_rep: int = 5,
    budget_ms: float = 1500.0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[BenchResult]:
    """Time every implementation on every case and pass; returns the rows with derived
    forward+backward rows and ratios (see :func:`add_derived`).

    ``progress(done, total, description)`` is called before each measurement and once
    at the end.  Raises :class:`NoDeviceError` without a CUDA device.
    """
    require_device()
    passes = tuple(passes)
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"passes: expected a subset of {PASSES}, got {p!r}")
    impl_objs = make_impls(impls, layout=layout)
    l2 = l2_bytes()
    total = len(cases) * len(passes) * len(impl_objs)
    done = 0
    results = []
    for case in cases:
        cache: dict = {}
        try:
            for pass_ in passes:
                for impl in impl_objs:
                    if progress is not None:
                        progress(done, total, f"{case.label} · {pass_} · {impl.name}")
                    try:
                        results.append(
                            measure(impl, case, pass_, sets_cache=cache, warmup=warmup, rep=rep,
                                    min_rep=min_rep, budget_ms=budget_ms, l2=l2)
                        )  # fmt: skip
                    except Exception as exc:  # the inputs themselves did not fit, say
                        status = "oom" if is_oom(exc) else "error"
                        results.append(BenchResult(impl.name, pass_, case, status, _short(exc)))
                        release_memory()
                    done += 1
        finally:
            cache.clear()
            release_memory()
    if progress is not None:
        progress(done, total, "done")
    return add_derived(results)


# --------------------------------------------------------------------------------------
# Output: JSON, CSV, plot
# --------------------------------------------------------------------------------------


def to_json_dict(results: Sequence[BenchResult], *, settings: dict | None = None, environment: dict | None = None) -> dict:
    """The JSON document (schema in the module docstring)."""
    return _report.json_document(SCHEMA, results, settings=settings, environment=environment)


def write_json(results, path, **kw) -> None:
    _report.write_json(to_json_dict(results, **kw), path)


def csv_text(results: Sequence[BenchResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(ROW_KEYS), lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow({k: ("" if v is None else v) for k, v in r.to_dict().items()})
    return buf.getvalue()


def write_csv(results, path) -> None:
    with open(path, "w", newline="") as f:
        f.write(csv_text(results))


def rows_from_json(doc: dict) -> list[dict]:
    """The rows of a document written by :func:`write_json` (checks the schema id)."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema={doc.get('schema')!r})")
    return list(doc["results"])


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install 'numba-flash[plot]' (or pip install matplotlib)") from exc
    return plt


def plot(results, path, *, title: str | None = None) -> str:
    """TFLOP/s against sequence length, one bar per implementation, one panel per
    (pass, head dim, causal, dtype) — the layout of FlashAttention-2's README plots.
    ``results``: BenchResult objects or JSON rows.  Returns ``path``."""
    plt = _pyplot()
    rows = [r.to_dict() if isinstance(r, BenchResult) else dict(r) for r in results]
    if not rows:
        raise ValueError("nothing to plot: no results")
    passes = [p for p in ALL_PASSES if any(r["pass"] == p for r in rows)]
    groups = []
    for r in rows:
        g = (r["dtype"], r["head_dim"], r["causal"])
        if g not in groups:
            groups.append(g)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    colors = dict(zip(IMPLS, ("#d62728", "#e377c2", "#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd")))
    fig, axes = plt.subplots(
        len(passes), len(groups), figsize=(max(6.0, 5.2 * len(groups)), 3.8 * len(passes)), squeeze=False
    )
    for pi, p in enumerate(passes):
        for gi, (dt, d, causal) in enumerate(groups):
            ax = axes[pi][gi]
            sel = [r for r in rows if r["pass"] == p and (r["dtype"], r["head_dim"], r["causal"]) == (dt, d, causal)]
            seqs = sorted({r["seqlen_k"] for r in sel})
            width = 0.8 / max(1, len(impls))
            for ii, impl in enumerate(impls):
                for si, n in enumerate(seqs):
                    match = [r for r in sel if r["impl"] == impl and r["seqlen_k"] == n]
                    if not match:
                        continue
                    r = match[0]
                    x = si - 0.4 + width * (ii + 0.5)
                    if r["status"] == "ok" and r["tflops"] is not None:
                        ax.bar(x, r["tflops"], width, color=colors.get(impl), label=impl if si == 0 else None)
                        ax.text(x, r["tflops"], f" {r['tflops']:.0f}", ha="center", va="bottom", fontsize=6,
                                rotation=90 if len(impls) > 3 else 0)  # fmt: skip
                    else:
                        ax.bar(x, 0, width, color=colors.get(impl), label=impl if si == 0 else None)
                        ax.text(x, 0, {"oom": "OOM", "unsupported": "n/s"}.get(r["status"], "–"), ha="center",
                                va="bottom", fontsize=6, rotation=90)  # fmt: skip
            ax.set_xticks(range(len(seqs)))
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in seqs])
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"{p}, head dim {d}, {'causal' if causal else 'non-causal'}, {dt}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    height = fig.get_figheight()
    top = 1.0 - (0.45 + (0.35 if title else 0.0)) / height  # room for the title and the legend
    if title:
        fig.suptitle(title, y=1.0 - 0.12 / height, va="top")
    fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0 - (0.45 if title else 0.08) / height))  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)

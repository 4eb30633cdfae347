"""``numba-flash check``: the kernels against the float64 reference on a grid of cases.

Every case draws fresh random inputs (standard normals, rounded to the case's dtype;
``seed`` makes a run reproducible: case ``i`` uses ``numpy.random.default_rng([seed, i])``),
runs ``flash_attention`` (and ``flash_attention_backward`` on its own ``out`` and ``lse``)
and compares every element of O, LSE, dQ, dK and dV with ``numba_flash.reference``.
The arrays the API allocates start as NaN (:func:`poisoned_outputs`; ``poison=False``
turns it off), so an element that no kernel writes fails instead of passing on stale
memory.

The project's tolerances (:func:`tolerance`, :func:`judge`)
---------------------------------------------------------
Errors are *relative*: ``max |x − ref| / max |ref|`` (:func:`numba_flash.reference.rel_error`),
computed over all elements in float64.

* float32: ≤ 1e-5 for O and LSE, ≤ 1e-4 for dQ, dK, dV.
* float16 / bfloat16 (FlashAttention-2's convention): O may have at most 2× and dQ,
  dK, dV at most 3× the error of a *standard attention computed in the same dtype*
  (``reference.attention_lowp`` / ``reference.attention_backward_lowp``: matmuls in
  fp32 rounded to the dtype, softmax in fp32, P rounded), both measured against the
  float64 reference, plus a floor of half an ulp of 1 in the dtype (:func:`lowp_floor`:
  fp16 2⁻¹¹ ≈ 4.9e-4, bf16 2⁻⁸ ≈ 3.9e-3, relative to max |ref|): an output that is
  exact in float64 (one key: O = V) still rounds once when it is stored, and the
  baseline may happen to be exact there.
* LSE is float32 whatever the inputs' dtype, and computed from the exact fp16/bf16
  inputs (their products are exact in fp32), so for float16 / bfloat16 it is judged by
  the float32 bound, 1e-5, not by the half-precision rule (whose baseline rounds the
  scores to the dtype and would allow ~1e-3).  Measured: ≤ 1.1e-7 in the simulator
  (tensor-core and fallback kernels, tests/test_kernels.py's cases) and ≤ 2.7e-7 on
  the H200's 120-case grid (docs/benchmarks/2026-11-30-s2/check.json, where the
  tensor-core kernels' ``ex2.approx`` runs for real; the simulator computes it exactly):
  1e-5 holds with a margin of ~35×.  TF32 (``--tf32``) keeps the
  baseline rule for LSE too: there the scores come from TF32-rounded Q and K.
* Gradients that vanish in exact arithmetic (a single key: P = 1, so dS = 0 and dQ,
  dK are pure rounding noise in the kernel and the reference alike) have no scale of
  their own: a gradient's error is normalised by
  ``max(max |ref|, ZERO_REF_FLOOR · the largest reference gradient of the case)`` with
  ``ZERO_REF_FLOOR`` = 1e-3 (the convention of ``tests/test_kernels.py``).  Whenever
  ``max |ref|`` exceeds that floor (every ordinary case) the error is exactly
  ``reference.rel_error``.
* LSE's error is normalised by ``max(max |ref|, 1)`` (``LSE_SCALE_FLOOR``): an lse
  carries its scores' rounding, whose scale is theirs, not its own.  One key whose score
  nearly cancels (N = 1, d = 16: lse about 0.002) gave 1.86e-5 "relative" from 3.3e-8
  absolute (a CI run of ``numba-flash check``, seed 149729425).
* LSE: entries that are −inf in the reference (queries that see no key: causal with
  seqlen_q > seqlen_k) must be −inf in the result and vice versa, and no NaN anywhere
  (a NaN counts as an infinite error).

``run_check`` never raises for a failing case: an exception inside the library is
recorded in :attr:`CaseResult.error` and the case fails.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from numba_flash import reference
from numba_flash.bench.cases import Shape
from numba_flash.config import TF32_HEAD_DIMS

__all__ = [
    "FP32_TOLERANCE",
    "LOWP_FACTOR",
    "lowp_floor",
    "ZERO_REF_FLOOR",
    "FP32_OUTPUTS",
    "uses_baseline",
    "CaseSpec",
    "OutputResult",
    "CaseResult",
    "tolerance",
    "judge",
    "check_case",
    "poisoned_outputs",
    "run_check",
    "default_cases",
    "build_cases",
    "parse_seqlen",
    "runtime_mode",
    "new_seed",
]

FORWARD_OUTPUTS = ("out", "lse")
BACKWARD_OUTPUTS = ("dq", "dk", "dv")
FP32_TOLERANCE = {"out": 1e-5, "lse": 1e-5, "dq": 1e-4, "dk": 1e-4, "dv": 1e-4}
LOWP_FACTOR = {"out": 2.0, "lse": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0}
ZERO_REF_FLOOR = 1e-3
#: The smallest denominator of LSE's relative error: an lse carries its scores' rounding, on
#: their scale (about 1), not its own (as the tests' ``lse_error``).
LSE_SCALE_FLOOR = 1.0
DTYPES = ("float32", "float16", "bfloat16")
LOWP_DTYPES = ("float16", "bfloat16")
# outputs that are float32 whatever the inputs' dtype: judged by the float32 bound for
# float16 / bfloat16 inputs (see the module docstring)
FP32_OUTPUTS = ("lse",)
LAYOUTS = ("bshd", "bhsd")
PASSES = ("forward", "backward")


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseSpec(Shape):
    """One configuration to check."""

    layout: str = "bshd"
    dtype: str = "float32"
    tf32: bool = False  # float32 with allow_tf32=True (the TF32 tensor-core kernels)
    # FlashAttention-2's variants (``flash_attention``'s keywords; 0 kv_heads: = heads)
    kv_heads: int = 0
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0
    varlen: bool = False  # packed sequences: seqlen_q / seqlen_k are the mean lengths (module docstring)

    def __post_init__(self):
        super().__post_init__()
        from numba_flash import variant as V

        object.__setattr__(self, "window", V.check_window(tuple(self.window)))
        V.check_softcap(self.softcap)
        V.check_dropout(self.dropout, 0)
        object.__setattr__(self, "kv_heads", V.check_kv_heads(self.kv_heads, self.heads))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if self.tf32 and (self.dtype != "float32" or self.head_dim not in TF32_HEAD_DIMS):
            raise ValueError(
                f"tf32: applies to float32 at head dims {TF32_HEAD_DIMS} (where allow_tf32 selects "
                f"the TF32 kernels), got {self.dtype} at head dim {self.head_dim}"
            )

    @property
    def mode(self) -> str:
        """The tolerance class: the dtype, or "tf32" for float32 with allow_tf32."""
        return "tf32" if self.tf32 else self.dtype

    @property
    def variants(self) -> str:
        """The variants besides causal, as in the label ("" for none)."""
        from numba_flash.variant import describe

        parts = describe(self.heads, self.kv_heads, self.window, self.softcap, self.alibi, self.dropout)
        return " ".join(parts + (["varlen"] if self.varlen else []))

    @property
    def label(self) -> str:
        seq = f"N={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"Nq={self.seqlen_q} Nk={self.seqlen_k}"
        seq = f"mean {seq}" if self.varlen else seq
        extra = f" {self.variants}" if self.variants else ""
        return (
            f"{self.dtype}{'+tf32' if self.tf32 else ''} B={self.batch} H={self.heads} {seq} d={self.head_dim} "
            f"{'causal' if self.causal else 'full'} {self.layout}{extra}"
        )

    def shape(self, seqlen: int, heads: int | None = None) -> tuple:
        heads = self.heads if heads is None else heads
        if self.layout == "bshd":
            return (self.batch, seqlen, heads, self.head_dim)
        return (self.batch, heads, seqlen, self.head_dim)

    def variant_kwargs(self, rng) -> dict:
        """``flash_attention``'s variant keywords of the case, those not at their default
        (ALiBi slopes and the dropout seed drawn from ``rng``; slopes as NumPy float32)."""
        from numba_flash.variant import call_keywords

        slopes = (0.5 * np.abs(rng.standard_normal((self.batch, self.heads)))).astype(np.float32) if self.alibi else None
        seed = int(rng.integers(0, 2**63)) if self.dropout else None
        return call_keywords(self.window, self.softcap, slopes, self.dropout, seed)


def parse_seqlen(text) -> tuple[int, int]:
    """``"127"`` → (127, 127); ``"64:128"`` → (seqlen_q, seqlen_k) = (64, 128)."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        q, k = text
    else:
        s = str(text).strip()
        parts = s.split(":")
        if len(parts) == 1:
            q = k = parts[0]
        elif len(parts) == 2:
            q, k = parts
        else:
            raise ValueError(f"seqlen {text!r}: expected N or NQ:NK (e.g. 127 or 64:128)")
    try:
        q, k = int(q), int(k)
    except (TypeError, ValueError):
        raise ValueError(f"seqlen {text!r}: expected N or NQ:NK with positive integers (e.g. 127 or 64:128)")
    if q < 1 or k < 1:
        raise ValueError(f"seqlen {text!r}: sequence lengths must be at least 1")
    return q, k


# The simulator runs every CUDA thread as a Python thread: a launch costs seconds, so the
# default simulator grid is a handful of tiny cases.  Together they reach every kernel
# family of the launch plan (``numba_flash.plan``): the row-group fp32 kernels (two
# lane-group widths: d = 16 → 2 lanes a row, d = 32 → 4), the register-blocked fp32
# kernels (float32 at d = 64), the fp16 tensor-core kernels, the bf16 tensor-core
# kernels, the TF32 kernels (float32 with allow_tf32=True) and the fp16 fallback
# (fp16 at d = 16 runs the row-group kernels on fp16 as is); and they cover Nq != Nk
# both ways (causal with Nq > Nk leaves queries that see no key), both layouts, two
# heads, seqlen 1 (dQ = dK = 0 exactly).  The whole grid takes ~20 s pinned to one core
# (.ci/run pins it: with two free cores the simulator's threads thrash the GIL, 2-9x slower).
SIM_CASES = (
    CaseSpec(1, 1, 33, 33, 16, False, "bshd", "float32"),  # row-group, d = 16
    CaseSpec(1, 1, 1, 1, 16, True, "bhsd", "float32"),  # row-group, one key
    CaseSpec(1, 1, 17, 33, 32, True, "bhsd", "float32"),  # row-group, d = 32
    CaseSpec(1, 1, 33, 17, 16, True, "bshd", "float32"),  # row-group, rows without keys
    CaseSpec(1, 2, 24, 20, 64, True, "bshd", "float32"),  # register-blocked, two heads
    CaseSpec(1, 1, 20, 31, 16, False, "bhsd", "float16"),  # tensor-core fp16, d = 16 on the tiles of 32
    CaseSpec(1, 1, 20, 17, 64, True, "bhsd", "float16"),  # tensor-core fp16
    CaseSpec(1, 1, 17, 20, 64, False, "bshd", "bfloat16"),  # tensor-core bf16
    CaseSpec(1, 1, 9, 20, 64, True, "bshd", "float32", tf32=True),  # TF32 tensor cores
)

# Axes a GPU grid is the product of (and the fall-back axes when options name only some)
GPU_AXES = dict(
    seqlens=((1, 1), (127, 127), (1024, 1024), (127, 1024), (1024, 127)),
    head_dims=(64, 128),
    dtypes=("float32", "float16", "bfloat16"),
    causal=(False, True),
    layouts=("bshd", "bhsd"),
    batch=2,
    heads=3,
)
SIM_AXES = dict(
    seqlens=((17, 33),),
    head_dims=(16,),
    dtypes=("float32",),
    causal=(False, True),
    layouts=("bshd",),
    batch=1,
    heads=1,
)


def default_cases(simulator: bool) -> list[CaseSpec]:
    """The grid ``numba-flash check`` runs without shape options."""
    if simulator:
        return list(SIM_CASES)
    return build_cases(simulator=False)


def build_cases(
    *,
    simulator: bool,
    seqlens: Sequence | None = None,
    head_dims: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
    causal: Sequence[bool] | None = None,
    layouts: Sequence[str] | None = None,
    batch: int | None = None,
    heads: int | None = None,
    tf32: bool = False,
    variants: dict | None = None,
) -> list[CaseSpec]:
    """The product of the given axes; an axis left as None takes the default of the mode
    (GPU: the full default grid's axis; simulator: one tiny value, so a run stays short).
    ``tf32``: float32 cases run with ``allow_tf32=True`` (dtype defaults to float32 and
    head dims to those of the TF32 kernels).  ``variants``: CaseSpec's variant fields
    (kv_heads, window, softcap, alibi, dropout), the same for every case."""
    axes = SIM_AXES if simulator else GPU_AXES
    seqlens = [parse_seqlen(s) for s in (seqlens or axes["seqlens"])]
    if tf32:
        head_dims = list(head_dims or (TF32_HEAD_DIMS[:1] if simulator else TF32_HEAD_DIMS))
        if list(dtypes or ["float32"]) != ["float32"]:
            raise ValueError(f"--tf32: applies to float32 only, got dtypes {list(dtypes)}")
    head_dims = list(head_dims or axes["head_dims"])
    dtypes = list(dtypes or (["float32"] if tf32 else axes["dtypes"]))
    causal = list(axes["causal"] if causal is None else causal)
    layouts = list(layouts or axes["layouts"])
    batch = axes["batch"] if batch is None else batch
    heads = axes["heads"] if heads is None else heads
    cases = []
    for dt, d, (nq, nk), c, lay in itertools.product(dtypes, head_dims, seqlens, causal, layouts):
        cases.append(CaseSpec(batch, heads, nq, nk, d, bool(c), lay, dt, tf32, **(variants or {})))
    return cases


# --------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------


def lowp_floor(dtype: str) -> float:
    """Half an ulp of 1 in ``dtype`` (float16: 2**-11, bfloat16: 2**-8)."""
    import ml_dtypes

    return 0.5 * float(ml_dtypes.finfo(_np_dtype(dtype)).eps)


def tolerance(output: str, dtype: str, baseline_rel: float | None = None) -> float:
    """The largest relative error ``output`` ("out", "lse", "dq", "dk", "dv") may have.

    float32: a fixed bound.  float16 / bfloat16: ``factor · baseline_rel + lowp_floor(dtype)``
    where ``baseline_rel`` is the relative error of the same-dtype standard attention
    (required for those dtypes), except "lse", which is float32 and gets the float32
    bound (``baseline_rel`` is then not needed).  "tf32": ``factor · baseline_rel`` + the
    float32 bound, for every output.
    """
    if output not in FP32_TOLERANCE:
        raise ValueError(f"output: expected one of {tuple(FP32_TOLERANCE)}, got {output!r}")
    if dtype == "float32" or (output in FP32_OUTPUTS and dtype in LOWP_DTYPES):
        return FP32_TOLERANCE[output]
    if dtype == "tf32":  # fp32 outputs: the TF32 baseline's error times the factor, + fp32's bound
        if baseline_rel is None:
            raise ValueError("tf32: the tolerance needs the error of the TF32-rounded standard attention")
        return LOWP_FACTOR[output] * float(baseline_rel) + FP32_TOLERANCE[output]
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    if baseline_rel is None:
        raise ValueError(f"{dtype}: the tolerance needs the error of the same-dtype standard attention")
    return LOWP_FACTOR[output] * float(baseline_rel) + lowp_floor(dtype)


def uses_baseline(output: str, dtype: str) -> bool:
    """Whether ``output`` of mode ``dtype`` is judged against a same-precision baseline
    (float16 / bfloat16 except LSE, and every TF32 output)."""
    if dtype == "float32":
        return False
    return not (output in FP32_OUTPUTS and dtype in LOWP_DTYPES)


def _finite_max_abs(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = np.abs(x[np.isfinite(x)])
    return float(x.max()) if x.size else 0.0


def measured_error(x, ref, scale_floor: float | None = None) -> tuple[float, float]:
    """(max abs error, relative error) of ``x`` against ``ref``, over all elements.

    The relative error is ``reference.rel_error`` unless ``max|ref|`` is below
    ``scale_floor`` (a reference that is zero everywhere), which is then the denominator.
    """
    abs_err = reference.max_abs_error(x, ref)
    denom = _finite_max_abs(ref)
    if scale_floor is not None:
        denom = max(denom, float(scale_floor))
    denom = max(denom, np.finfo(np.float64).tiny)
    return abs_err, (abs_err / denom if math.isfinite(abs_err) else math.inf)


@dataclass
class OutputResult:
    """One output of one case: its errors, its limit and the verdict."""

    output: str
    max_abs: float
    rel: float
    limit: float
    passed: bool
    baseline_rel: float | None = None  # same-dtype standard attention's error (fp16/bf16)
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("max_abs", "rel", "limit", "baseline_rel"):
            if d[key] is not None and not math.isfinite(d[key]):
                d[key] = str(d[key])  # JSON has no inf
        return d


def judge(output: str, dtype: str, x, ref, *, baseline=None, scale_floor=None) -> OutputResult:
    """Compare ``x`` with the float64 ``ref`` under the project's tolerance.

    ``baseline`` is the same-dtype standard attention's value of this output (needed for
    float16 / bfloat16 except "lse", and for "tf32"; ignored where :func:`uses_baseline`
    is False); ``scale_floor`` the smallest denominator of the relative error
    (for gradients: ``ZERO_REF_FLOOR`` × the case's largest reference gradient).  For
    "lse" the −inf pattern must also match exactly.
    """
    x64 = np.asarray(x, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    if output == "lse":
        scale_floor = max(scale_floor or 0.0, LSE_SCALE_FLOOR)
    if x64.shape != ref64.shape:
        return OutputResult(output, math.inf, math.inf, 0.0, False, None, f"shape {x64.shape} != {ref64.shape}")
    abs_err, rel = measured_error(x64, ref64, scale_floor)
    base_rel = None
    if uses_baseline(output, dtype):
        if baseline is None:
            raise ValueError(f"{output}: {dtype} needs the same-dtype standard attention's result")
        _, base_rel = measured_error(baseline, ref64, scale_floor)
    limit = tolerance(output, dtype, base_rel)
    notes = []
    ok = rel <= limit
    if np.isnan(x64).any():
        ok = False
        notes.append(f"{int(np.isnan(x64).sum())} NaN")
    if output == "lse":
        mismatch = int((np.isneginf(x64) != np.isneginf(ref64)).sum())
        if mismatch:
            ok = False
            notes.append(f"{mismatch} -inf mismatches")
    return OutputResult(output, abs_err, rel, limit, bool(ok), base_rel, ", ".join(notes))


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """The outputs checked for one case (or the error that stopped it)."""

    case: CaseSpec
    seed: int
    index: int
    outputs: list[OutputResult] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.outputs) and all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        return {
            "case": asdict(self.case),
            "label": self.case.label,
            "seed": self.seed,
            "index": self.index,
            "passed": self.passed,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "outputs": [o.to_dict() for o in self.outputs],
        }


def runtime_mode() -> str:
    """Where kernels run: "gpu", "simulator" or "none" (numba without the simulator and
    no device: nothing can run)."""
    from numba_flash._numba_cuda import SIMULATOR, gpu_available

    if SIMULATOR:
        return "simulator"
    return "gpu" if gpu_available() else "none"


def new_seed() -> int:
    """A fresh random seed (printed by the CLI so a run can be replayed)."""
    return int(np.random.SeedSequence().entropy % (2**31))


def _array_module(xp):
    if xp is not None:
        return xp
    if runtime_mode() == "gpu":
        import cupy

        return cupy
    return np


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _nan_bits(dtype) -> tuple:
    """(unsigned word type, bits) of a quiet NaN of ``dtype``: filled through an unsigned
    view, which every array library can fill, also one without bfloat16 arithmetic."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 4:
        return np.uint32, 0x7FC00000
    if dtype == np.float16:
        return np.uint16, 0x7E00
    return np.uint16, 0x7FC0  # bfloat16: float32's upper half


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """While active, every array the API allocates (``numba_flash._arrays.empty``: O,
    LSE, dQ, dK, dV and the backward's delta) starts as NaN, so an element a kernel
    forgets to write is a NaN, which never passes, instead of whatever the memory held
    (often the right answer of the previous call).  Restores ``_arrays.empty`` on exit."""
    if not enabled:
        yield
        return
    from numba_flash import _arrays

    real_empty = _arrays.empty

    def nan_empty(kind, shape, dtype):
        arr = real_empty(kind, shape, dtype)
        word, bits = _nan_bits(arr.dtype)
        arr.view(word).fill(bits)
        return arr

    _arrays.empty = nan_empty
    try:
        yield
    finally:
        _arrays.empty = real_empty


def _api_kwargs(case: CaseSpec, kw: dict, xp) -> dict:
    """The API's keywords of a case: the reference's ``kw``, with ``allow_tf32`` for
    TF32 cases and the ALiBi slopes on the API's side."""
    api_kw = dict(kw, allow_tf32=True) if case.tf32 else dict(kw)
    if "alibi_slopes" in kw:
        api_kw["alibi_slopes"] = xp.asarray(kw["alibi_slopes"])
    return api_kw


def check_case(case: CaseSpec, seed: int, *, index: int = 0, passes: Iterable[str] = PASSES, xp=None,
               poison: bool = True) -> CaseResult:
    """Run one case and judge every output; never raises (errors go in ``.error``).

    ``poison``: the API's output buffers start as NaN (:func:`poisoned_outputs`), so an
    element no kernel writes fails the case."""
    from numba_flash import api  # looked up at call time, so tests can patch it

    passes = tuple(passes)
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"passes: expected a subset of {PASSES}, got {p!r}")
    result = CaseResult(case, int(seed), index)
    t0 = time.perf_counter()
    try:
        xp = _array_module(xp)
        dt = _np_dtype(case.dtype)
        rng = np.random.default_rng([int(seed), int(index)])
        if case.varlen:
            _check_varlen(case, result, rng, xp, passes, poison, api, dt)
            result.seconds = time.perf_counter() - t0
            return result
        q = rng.standard_normal(case.shape(case.seqlen_q)).astype(dt)
        k, v = (rng.standard_normal(case.shape(case.seqlen_k, case.kv_heads)).astype(dt) for _ in range(2))
        dout = rng.standard_normal(case.shape(case.seqlen_q)).astype(dt)
        kw = dict(causal=case.causal, layout=case.layout, **case.variant_kwargs(rng))
        mode = case.mode  # "float32", "float16", "bfloat16" or "tf32"
        api_kw = _api_kwargs(case, kw, xp)

        with poisoned_outputs(poison):
            out, lse = api.flash_attention(xp.asarray(q), xp.asarray(k), xp.asarray(v), return_lse=True, **api_kw)
        out_h, lse_h = _host(out), _host(lse)
        ref_out, ref_lse = reference.attention(q, k, v, **kw)
        low_out = low_lse = None  # the same-precision standard attention (not for float32)
        if case.tf32:
            low_out, low_lse = reference.attention_tf32(q, k, v, **kw)
        elif mode != "float32":
            low_out, low_lse = reference.attention_lowp(q, k, v, dtype=dt, **kw)
        if "forward" in passes:
            result.outputs.append(judge("out", mode, out_h, ref_out, baseline=low_out))
            result.outputs.append(judge("lse", mode, lse_h, ref_lse, baseline=low_lse))
        if "backward" in passes:
            with poisoned_outputs(poison):
                grads = api.flash_attention_backward(
                    xp.asarray(dout), xp.asarray(q), xp.asarray(k), xp.asarray(v), out, lse, **api_kw
                )
            ref_grads = reference.attention_backward(dout, q, k, v, ref_out, ref_lse, **kw)
            low_grads = (None, None, None)
            if case.tf32:
                low_grads = reference.attention_backward_tf32(dout, q, k, v, low_out, low_lse, **kw)
            elif mode != "float32":
                low_grads = reference.attention_backward_lowp(dout, q, k, v, low_out, low_lse, dtype=dt, **kw)
            floor = ZERO_REF_FLOOR * max(_finite_max_abs(g) for g in ref_grads)
            for name, got, want, low in zip(BACKWARD_OUTPUTS, grads, ref_grads, low_grads):
                result.outputs.append(judge(name, mode, _host(got), want, baseline=low, scale_floor=floor))
    except Exception as exc:  # recorded, so one bad case does not hide the others
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
        result.error = f"{type(exc).__name__}: {exc}{where}"
    result.seconds = time.perf_counter() - t0
    return result


def _check_varlen(case: CaseSpec, result: CaseResult, rng, xp, passes, poison, api, dt) -> None:
    """A varlen case: ``batch`` sequences of lengths drawn uniformly from 0 to twice
    ``seqlen_q`` (queries) and ``seqlen_k`` (keys), packed, through
    ``flash_attention_varlen`` and its backward, against ``reference.attention_varlen``.

    The same-precision baseline is computed sequence by sequence (a batch of one each)
    and its error field moved onto the varlen reference (baseline = ref + (low − ref of
    the same call)): with dropout, a batch of one draws batch 0's keep bits, so only the
    error, not the value, carries over."""
    mode = case.mode
    lens_q = rng.integers(0, 2 * case.seqlen_q + 1, case.batch)
    lens_k = rng.integers(0, 2 * case.seqlen_k + 1, case.batch)
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lens_q, lens_k))
    mq, mk = max(int(lens_q.max()), 1), max(int(lens_k.max()), 1)
    H, Hk, d = case.heads, case.kv_heads, case.head_dim
    q = rng.standard_normal((int(cu_q[-1]), H, d)).astype(dt)
    k, v = (rng.standard_normal((int(cu_k[-1]), Hk, d)).astype(dt) for _ in range(2))
    dout = rng.standard_normal(q.shape).astype(dt)
    kw = dict(causal=case.causal, **case.variant_kwargs(rng))
    api_kw = _api_kwargs(case, kw, xp)
    dev = [xp.asarray(x) for x in (q, k, v, dout, cu_q, cu_k)]
    with poisoned_outputs(poison):
        out, lse = api.flash_attention_varlen(*dev[:3], dev[4], dev[5], mq, mk, return_lse=True, **api_kw)
    ref_out, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, **kw)

    def per_sequence(fn, *arrays):
        """(low − exact) of each sequence as a batch of one (bshd), packed like the
        varlen outputs: forward (q, k, v) → [out, lse]; backward (dout, q, k, v, out,
        lse) → [dq, dk, dv]."""
        forward = len(arrays) == 3
        query_rows = (True, False, False) if forward else (True, True, False, False, True, None)
        parts = []
        for b in range(case.batch):
            sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            one = [x[:, sq][None] if rows is None else x[sq if rows else sk][None] for x, rows in zip(arrays, query_rows)]
            bkw = dict(kw, layout="bshd")
            if "alibi_slopes" in kw:
                bkw["alibi_slopes"] = kw["alibi_slopes"][b : b + 1]
            exact = (reference.attention if forward else reference.attention_backward)(*one, **bkw)
            parts.append([np.asarray(lo, np.float64)[0] - ex[0] for lo, ex in zip(fn(*one, **bkw), exact)])
        if forward:  # out (nq, H, d) rows, lse (H, nq) columns
            return [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts], axis=1)]
        return [np.concatenate([p[i] for p in parts]) for i in range(3)]

    low_fwd = low_bwd = None
    if case.tf32:
        low_fwd, low_bwd = reference.attention_tf32, reference.attention_backward_tf32
    elif mode != "float32":
        low_fwd = lambda *a, **k_: reference.attention_lowp(*a, dtype=dt, **k_)  # noqa: E731
        low_bwd = lambda *a, **k_: reference.attention_backward_lowp(*a, dtype=dt, **k_)  # noqa: E731
    if "forward" in passes:
        base = [None, None]
        if low_fwd is not None:
            d_out, d_lse = per_sequence(low_fwd, q, k, v)
            base = [ref_out + d_out, ref_lse + d_lse]
        result.outputs.append(judge("out", mode, _host(out), ref_out, baseline=base[0]))
        result.outputs.append(judge("lse", mode, _host(lse), ref_lse, baseline=base[1]))
    if "backward" in passes:
        o_in, lse_in = ref_out.astype(dt), ref_lse.astype(np.float32)
        with poisoned_outputs(poison):
            grads = api.flash_attention_varlen_backward(dev[3], *dev[:3], xp.asarray(o_in), xp.asarray(lse_in),
                                                        dev[4], dev[5], mq, mk, **api_kw)  # fmt: skip
        refs = reference.attention_varlen_backward(dout, q, k, v, o_in, lse_in, cu_q, cu_k, mq, mk, **kw)
        bases = [None] * 3
        if low_bwd is not None:
            diffs = per_sequence(low_bwd, dout, q, k, v, o_in, lse_in)
            bases = [r + dd for r, dd in zip(refs, diffs)]
        floor = ZERO_REF_FLOOR * max(_finite_max_abs(g) for g in refs)
        for name, got, want, low in zip(BACKWARD_OUTPUTS, grads, refs, bases):
            result.outputs.append(judge(name, mode, _host(got), want, baseline=low, scale_floor=floor))


def run_check(
    cases: Sequence[CaseSpec],
    *,
    seed: int | None = None,
    passes: Iterable[str] = PASSES,
    xp=None,
    on_case: Callable[[CaseResult], None] | None = None,
    before_case: Callable[[int, CaseSpec], None] | None = None,
    poison: bool = True,
) -> list[CaseResult]:
    """Check every case; returns one :class:`CaseResult` per case, in order.

    ``seed`` None draws a fresh one (read it back from any result's ``.seed``).
    ``xp`` is the array module the API is fed with (default: CuPy on a GPU, NumPy in
    the simulator).  ``before_case(i, case)`` / ``on_case(result)`` report progress.
    ``poison``: outputs start as NaN (see :func:`check_case`).
    """
    seed = new_seed() if seed is None else int(seed)
    passes = tuple(passes)
    results = []
    for i, case in enumerate(cases):
        if before_case is not None:
            before_case(i, case)
        r = check_case(case, seed, index=i, passes=passes, xp=xp, poison=poison)
        results.append(r)
        if on_case is not None:
            on_case(r)
    return results

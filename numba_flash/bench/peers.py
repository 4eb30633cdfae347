"""The implementations timed: numba-flash and its peers (``IMPLS``), each an :class:`Impl`
that builds, per input set, the callable to time; and the CuPy standard attention.

Implementations (``IMPLS``)
---------------------------
``numba-flash``         ``flash_attention`` / ``flash_attention_backward`` (layout option,
                        bshd by default); the backward is timed alone, on the ``out`` and
                        ``lse`` of one forward run outside the timed region.
``numba-flash-padded``  varlen cases only: numba-flash (``flash_attention``) on the padded
                        batch, what varlen saves.
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

Varlen cases (``BenchCase.seqlens``): numba-flash and numba-flash-tf32 call
``flash_attention_varlen`` / ``flash_attention_varlen_backward`` on the packed
(total, H, d) arrays with int32 ``cu_seqlens`` on the device (``--layout`` does not
apply); every other implementation (``VARLEN_IMPLS`` lists those that do not) has no
varlen entry and runs the padded batch, (B, max length, H, d) dense, with no padding
mask — the shape a user without varlen runs — and is given that dense case
(:meth:`Impl.run_case`), so it reports ``unsupported`` / ``oom`` on the padded shape.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterable, Sequence

import numpy as np

from numba_flash.bench.cases import BenchCase
from numba_flash.bench.timing import InputSet, _itemsize

IMPLS = (
    "numba-flash",
    "numba-flash-padded",
    "numba-flash-tf32",
    "cupy-standard",
    "torch-sdpa-flash",
    "torch-sdpa-cudnn",
    "torch-sdpa-efficient",
    "torch-sdpa-math",
)
VARLEN_IMPLS = ("numba-flash", "numba-flash-tf32")  # run varlen cases packed; the others padded
TORCH_BACKENDS = {
    "torch-sdpa-flash": "FLASH_ATTENTION",
    "torch-sdpa-cudnn": "CUDNN_ATTENTION",
    "torch-sdpa-efficient": "EFFICIENT_ATTENTION",
    "torch-sdpa-math": "MATH",
}


class Impl:
    """One implementation: ``prepare`` builds, per input set, the callable to time."""

    name = ""
    events = "cupy"
    varlen_only = False  # timed on varlen cases only (numba-flash-padded)

    def run_case(self, case: BenchCase) -> BenchCase:
        """The case this implementation runs: a varlen case's padded batch unless it is
        in ``VARLEN_IMPLS``; ``unsupported``, ``extra_set_bytes`` and ``prepare`` get it."""
        return case if self.name in VARLEN_IMPLS else case.padded

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


def variant_kwargs(case: BenchCase) -> dict:
    """``flash_attention``'s variant keywords of a case: ALiBi with the standard
    geometric slopes ``2^(−8(h+1)/H)`` (on the device), dropout with a fixed seed."""
    from numba_flash.variant import call_keywords

    slopes = None
    if case.alibi:
        import cupy

        slopes = cupy.asarray(2.0 ** (-8.0 * np.arange(1, case.heads + 1) / case.heads), cupy.float32)
    return call_keywords(case.window, case.softcap, slopes, case.dropout, 20261201)


def _plain(case: BenchCase) -> bool:
    return case.kv_heads == case.heads and case.window == (-1, -1) and not (case.softcap or case.alibi or case.dropout
                                                                           or case.flex)  # fmt: skip


class NumbaFlash(Impl):
    """numba-flash; ``allow_tf32`` as in ``flash_attention`` (the "numba-flash-tf32" row);
    ``padded``: the "numba-flash-padded" row, a varlen case's padded batch."""

    def __init__(self, layout: str = "bshd", allow_tf32: bool = False, padded: bool = False):
        if allow_tf32 and padded:
            raise ValueError("NumbaFlash: allow_tf32 and padded are separate rows; give one")
        self.layout = layout
        self.allow_tf32 = allow_tf32
        self.varlen_only = padded
        self.name = "numba-flash-tf32" if allow_tf32 else "numba-flash-padded" if padded else "numba-flash"

    def unsupported(self, case, pass_):
        if not self.allow_tf32:
            return None
        if case.dtype != "float32":
            return "allow_tf32 applies to float32 inputs only (fp16/bf16 already run on tensor cores)"
        from numba_flash.config import TF32_HEAD_DIMS

        if case.head_dim not in TF32_HEAD_DIMS:
            return f"TF32 kernels cover head dims {TF32_HEAD_DIMS}; d={case.head_dim} runs the exact fp32 kernel"
        return None

    def extra_set_bytes(self, case, pass_):
        o = case.batch * case.heads * case.seqlen_q * (case.head_dim * _itemsize(case.dtype) + 4)
        o = o if pass_ == "backward" else 0
        if case.varlen:  # the packed copies of q, k, v, dout (batch·seqlen_q rows each)
            o += 2 * (case.heads + case.kv_heads) * case.batch * case.seqlen_q * case.head_dim * _itemsize(case.dtype)
        return o

    def prepare(self, case, pass_, sets):
        if case.varlen:
            return self._prepare_varlen(case, pass_, sets)
        from numba_flash import api

        kw = dict(causal=case.causal, layout=self.layout, **variant_kwargs(case))
        if self.allow_tf32:
            kw["allow_tf32"] = True
        if case.flex:  # a FlexAttention case: its block mask (made once per case)
            from numba_flash.bench.flexcases import flex_kwargs

            kw.update(flex_kwargs(case.flex, case.seqlen_q))
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

    def _prepare_varlen(self, case, pass_, sets):
        """``flash_attention_varlen`` on the packed rows: q (total, H, d), k and v
        (total, H_kv, d), cu_seqlens int32 (B + 1,) on the device, q and k alike."""
        from numba_flash import api

        n = case.max_seqlen
        kw = dict(causal=case.causal, **variant_kwargs(case))
        if self.allow_tf32:
            kw["allow_tf32"] = True
        fns = []
        for s in sets:
            q, k, v, do = (s.packed(name) for name in ("q", "k", "v", "dout"))
            cu = s.cu_seqlens()
            if pass_ == "forward":
                fns.append(lambda q=q, k=k, v=v, cu=cu: api.flash_attention_varlen(q, k, v, cu, cu, n, n,
                                                                                   return_lse=True, **kw))  # fmt: skip
            else:
                out, lse = api.flash_attention_varlen(q, k, v, cu, cu, n, n, return_lse=True, **kw)
                fns.append(
                    lambda q=q, k=k, v=v, do=do, out=out, lse=lse, cu=cu: api.flash_attention_varlen_backward(
                        do, q, k, v, out, lse, cu, cu, n, n, **kw
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
        if not _plain(case):
            return "the CuPy standard attention here is plain or causal attention only"
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
        missing = [name for name, on in (("sliding window", case.window != (-1, -1)), ("softcap", case.softcap),
                                         ("ALiBi", case.alibi), ("block mask", case.flex)) if on]  # fmt: skip
        if missing:
            return f"torch SDPA has no {' / '.join(missing)} (FlexAttention has; not compared here)"
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
        extra = dict(enable_gqa=True) if case.kv_heads != case.heads else {}
        if case.dropout:
            extra["dropout_p"] = case.dropout

        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[case.dtype]

        def tensor(x, grad):
            # the same values in a tensor torch owns: (B, H, N, d) contiguous
            t = torch.from_dlpack(x).to(dtype=dtype).clone()
            return t.requires_grad_(grad)

        fns, leaves = [], []
        for s in sets:
            q, k, v = (tensor(s.bhsd(n), True) for n in ("q", "k", "v"))
            if pass_ == "forward":
                fns.append(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra))
            else:
                do = tensor(s.bhsd("dout"), False)
                with self.context():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)
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
        if name in ("numba-flash", "numba-flash-padded", "numba-flash-tf32"):
            impls.append(NumbaFlash(layout, allow_tf32=name == "numba-flash-tf32", padded=name == "numba-flash-padded"))
        elif name == "cupy-standard":
            impls.append(CupyStandard())
        elif name in TORCH_BACKENDS:
            impls.append(TorchSDPA(name))
        else:
            raise ValueError(f"impl: expected one of {IMPLS}, got {name!r}")
    return impls

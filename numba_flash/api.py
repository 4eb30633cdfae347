"""The public API: ``flash_attention`` and ``flash_attention_backward``.

Host side only: check the arguments, ask the launch plan (``numba_flash.plan``) which
kernels run, bind their arguments to arrays, launch them on CuPy's current stream, and
hand back arrays of the caller's kind.  The math is in the kernels
(``numba_flash.kernels``) and in the NumPy reference (``numba_flash.reference``).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from numba_flash import _arrays as A
from numba_flash import plan as P
from numba_flash._launch import launch
from numba_flash._numba_cuda import SIMULATOR, compute_capability

_VIEW_DTYPES = {"u16": np.uint16, "u32": np.uint32}


def _out_shape(layout: str, B: int, N: int, H: int, d: int):
    return (B, N, H, d) if layout == "bshd" else (B, H, N, d)


def _bshd(arr, layout: str):
    return arr if layout == "bshd" else arr.transpose(0, 2, 1, 3)


def _plan(problem: P.Problem) -> P.Plan:
    """The plan of ``problem``, made once: the same shapes come again and again (the
    tuning override is part of the key, so a tuning run that changes it is obeyed)."""
    return _cached_plan(problem, os.environ.get("NUMBA_FLASH_TILES"))


@functools.lru_cache(maxsize=512)
def _cached_plan(problem: P.Problem, override) -> P.Plan:
    return P.plan(problem)


def _run(plan: P.Plan, buffers: dict, layout: str) -> None:
    """Launch every kernel of ``plan`` with its arguments bound to ``buffers`` (role →
    array in the caller's layout, or the float scale), 4-D arrays seen as (B, N, H, d)."""
    for k in plan.launches:
        args = []
        for a in k.args:
            x = buffers[a.role]
            if a.view:
                x = x.view(_VIEW_DTYPES[a.view])
            args.append(_bshd(x, layout) if getattr(x, "ndim", 0) == 4 else x)
        launch(k.kernel, k.grid, k.threads, k.smem, *args)


def _check_qkv(q, k, v, causal, softmax_scale, layout):
    """The checks the forward and backward share; returns
    (layout, causal, (q_op, k_op, v_op), (B, Nq, Nk, H, d), scale)."""
    A.require_runtime()
    layout = A.check_layout(layout)
    causal = A.check_flag("causal", causal)
    ops = tuple(A.check_operand(name, x, layout) for name, x in (("q", q), ("k", k), ("v", v)))
    dims = A.check_qkv(*ops, layout)
    return layout, causal, ops, dims, A.check_scale(softmax_scale, dims[-1])


def _problem(pass_, op, dims, causal, allow_tf32, arrays) -> P.Problem:
    B, Nq, Nk, H, d = dims
    aligned = all(A.aligned16(x) for x in arrays)
    return P.Problem(pass_, A.dtype_name(op.dtype), d, causal, allow_tf32, aligned, B, H, Nq, Nk,
                     compute_capability(), SIMULATOR)  # fmt: skip


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, layout="bshd", allow_tf32=False):
    """Exact attention ``softmax(scale · Q·Kᵀ) · V`` without the N×N matrix.

    Args:
        q: (batch, seqlen_q, heads, headdim) for ``layout="bshd"`` (the default, as
            flash-attn), or (batch, heads, seqlen_q, headdim) for ``layout="bhsd"``.
            float32 (exact fp32 kernels), float16 or bfloat16 (``ml_dtypes.bfloat16``;
            tensor-core kernels for head dims 64 and 128 when rows are 16-byte
            aligned, else the exact fp32 kernels as a fallback).  Any strides with the
            last axis contiguous.
        k, v: (batch, seqlen_k, heads, headdim), or (batch, heads, seqlen_k, headdim);
            same dtype and side (host/device) as q.
        causal: mask key j from query i unless j <= i + seqlen_k − seqlen_q
            (bottom-right aligned, as FlashAttention-2 >= 2.1).  A query that sees no
            key gets a zero output row and lse = −inf.
        softmax_scale: multiplies Q·Kᵀ before the softmax; default 1/sqrt(headdim).
        return_lse: also return the log-sum-exp that the backward pass needs.
        layout: "bshd" or "bhsd".
        allow_tf32: float32 inputs only (ignored for fp16/bf16): run the TF32 tensor-core
            kernel (``mma.sync`` m16n8k8 with Q, K, V and P rounded to TF32, fp32
            accumulation) for head dims 64 and 128 with 16-byte aligned rows, as
            PyTorch's ``allow_tf32``.  Precision about 1e-3 relative (10-bit mantissas,
            like cuBLAS TF32) instead of exact fp32; other head dims keep the exact
            kernels.  Default False: exact fp32.  ``flash_attention_backward`` takes its
            own ``allow_tf32`` (default False: the exact fp32 backward).

    Returns:
        ``out`` with q's shape and dtype, or ``(out, lse)`` with lse of shape
        (batch, heads, seqlen_q), float32, natural log.  NumPy in gives NumPy out;
        CuPy (or any ``__cuda_array_interface__`` / ``__dlpack__`` device object) in
        gives CuPy out, computed on CuPy's current stream without copying the inputs.
        Zero-size inputs give zero-size outputs; seqlen_k = 0 gives out = 0 and
        lse = −inf, as torch SDPA.  NaN and ±inf propagate as in a standard attention.
    """
    layout, causal, (q_op, k_op, v_op), dims, scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    return_lse = A.check_flag("return_lse", return_lse)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    B, Nq, Nk, H, d = dims
    kind = q_op.kind
    out = A.empty(kind, _out_shape(layout, B, Nq, H, d), q_op.dtype)
    lse = A.empty(kind, (B, H, Nq), np.float32)
    if 0 in (B, H, Nq, Nk):  # nothing to launch: every row sees no key
        out.fill(0)
        lse.fill(-np.inf)
    else:
        qc, kc, vc = (A.to_compute(op.array, kind) for op in (q_op, k_op, v_op))
        plan = _plan(_problem("forward", q_op, dims, causal, allow_tf32, (qc, kc, vc)))
        work = A.SUPPORTED_BY_NAME[plan.work_dtype]
        if work != q_op.dtype:  # bf16 on fp32 copies
            qc, kc, vc = (x.astype(work) for x in (qc, kc, vc))
        o = out if work == q_op.dtype else A.empty(kind, out.shape, work)
        _run(plan, {"q": qc, "k": kc, "v": vc, "out": o, "lse": lse, "scale": scale}, layout)
        if o is not out:
            out[...] = o.astype(out.dtype)
    out = A.to_caller(out, kind)
    if return_lse:
        return out, A.to_caller(lse, kind)
    return out


def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, layout="bshd",
                             allow_tf32=False):
    """Gradients of ``flash_attention`` by recomputation from the saved log-sum-exp.

    Args:
        dout: gradient of the loss with respect to ``out``; shape and dtype of q.
        q, k, v, causal, softmax_scale, layout: exactly as given to the forward.
        out, lse: what the forward returned (``return_lse=True``); lse is
            (batch, heads, seqlen_q) float32.
        allow_tf32: float32 inputs only (ignored for fp16/bf16): run the backward's
            matmuls on TF32 tensor cores (``mma.sync`` m16n8k8 with Q, K, V, dO, P and dS
            rounded to TF32, fp32 accumulation, fp32 outputs) for head dims 64 and 128
            with 16-byte aligned rows, as PyTorch's ``allow_tf32``.  Precision about
            1e-3 relative instead of exact fp32; still deterministic.  Default False.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v, of the caller's kind.
        dQ is computed without atomics, so the result is bitwise the same run to run.
        fp16/bf16 at head dims 64 and 128 (16-byte aligned rows) run on tensor cores;
        float32 runs the exact fp32 kernels unless ``allow_tf32=True`` (whatever the
        forward was given); other cases run the exact fp32 kernels too.
    """
    layout, causal, (q_op, k_op, v_op), dims, scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    do_op = A.check_operand("dout", dout, layout)
    o_op = A.check_operand("out", out, layout)
    A.check_like("dout", do_op, q_op)
    A.check_like("out", o_op, q_op)
    B, Nq, Nk, H, d = dims
    lse_arr = A.check_lse(lse, q_op, B, H, Nq)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    kind = q_op.kind

    grads = [A.empty(kind, _out_shape(layout, B, n, H, d), q_op.dtype) for n in (Nq, Nk, Nk)]
    if 0 in (B, H, Nq, Nk):  # no (query, key) pair: every gradient is 0
        for g in grads:
            g.fill(0)
        return tuple(A.to_caller(g, kind) for g in grads)
    computed = [A.to_compute(op.array, kind) for op in (q_op, k_op, v_op, do_op, o_op)]
    plan = _plan(_problem("backward", q_op, dims, causal, allow_tf32, computed))
    work = A.SUPPORTED_BY_NAME[plan.work_dtype]
    if work != q_op.dtype:  # bf16 on fp32 copies
        computed = [x.astype(work) for x in computed]
    work_grads = grads if work == q_op.dtype else [A.empty(kind, g.shape, work) for g in grads]
    buffers = dict(zip(("q", "k", "v", "dout", "out"), computed))
    buffers.update(zip(("dq", "dk", "dv"), work_grads))
    buffers.update(lse=A.to_compute(lse_arr, kind), delta=A.empty(kind, (B, H, Nq), np.float32), scale=scale)
    _run(plan, buffers, layout)
    if work_grads is not grads:
        for g, w in zip(grads, work_grads):
            g[...] = w.astype(g.dtype)
    return tuple(A.to_caller(g, kind) for g in grads)

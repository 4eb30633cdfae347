"""The public API: ``flash_attention`` and ``flash_attention_backward``.

Host side only: check the arguments, pick the kernel and its tiles, launch on CuPy's
current stream, hand back arrays of the caller's kind.  The math is in the kernels
(``numba_flash.kernels``) and in the NumPy reference (``numba_flash.reference``).
"""

from __future__ import annotations

import numpy as np

from numba_flash import _arrays as A
from numba_flash import dispatch
from numba_flash._launch import launch
from numba_flash.config import blocked_backward_tiles, blocked_dkdv_smem_bytes, blocked_dq_smem_bytes
from numba_flash.config import blocked_forward_smem_bytes, blocked_forward_tiles
from numba_flash.config import simt_backward_tiles, simt_forward_tiles, tc_smem_bytes
from numba_flash.config import tc_bwd_smem_bytes as tc_smem_bwd
from numba_flash.kernels import simt_backward, simt_blocked_backward, simt_blocked_forward, simt_forward
from numba_flash.kernels import tc_backward, tc_forward
from numba_flash.kernels import tf32_backward, tf32_forward


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _out_shape(layout: str, B: int, N: int, H: int, d: int):
    return (B, N, H, d) if layout == "bshd" else (B, H, N, d)


def _bshd(arr, layout: str):
    return arr if layout == "bshd" else arr.transpose(0, 2, 1, 3)


def _check_qkv(q, k, v, causal, softmax_scale, layout):
    """The checks the forward and backward share; returns
    (layout, causal, (q_op, k_op, v_op), (B, Nq, Nk, H, d), scale)."""
    layout = A.check_layout(layout)
    causal = A.check_causal(causal)
    ops = tuple(A.check_operand(name, x, layout) for name, x in (("q", q), ("k", k), ("v", v)))
    dims = A.check_qkv(*ops, layout)
    return layout, causal, ops, dims, A.check_scale(softmax_scale, dims[-1])


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, layout="bshd", allow_tf32=False):
    """Exact attention ``softmax(scale · Q·Kᵀ) · V`` without the N×N matrix.

    Args:
        q: (batch, seqlen_q, heads, headdim) for ``layout="bshd"`` (the default, as
            flash-attn), or (batch, heads, seqlen_q, headdim) for ``layout="bhsd"``.
            float32 (exact fp32 kernel), float16 or bfloat16 (``ml_dtypes.bfloat16``;
            tensor-core kernel for head dims 64 and 128 when rows are 16-byte
            aligned, else the fp32 kernel as a fallback).  Any strides with the last
            axis contiguous.
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
            kernel.  Default False: exact fp32.  ``flash_attention_backward`` takes its
            own ``allow_tf32`` (default False: the exact fp32 backward).

    Returns:
        ``out`` with q's shape and dtype, or ``(out, lse)`` with lse of shape
        (batch, heads, seqlen_q), float32, natural log.  NumPy in gives NumPy out;
        CuPy (or any ``__cuda_array_interface__`` / ``__dlpack__`` device object) in
        gives CuPy out, computed on CuPy's current stream without copying the inputs.
    """
    layout, causal, (q_op, k_op, v_op), (B, Nq, Nk, H, d), scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    if not isinstance(allow_tf32, (bool, np.bool_)):
        raise TypeError(f"allow_tf32: expected a bool, got {allow_tf32!r}")
    kind = q_op.kind

    qc, kc, vc = (A.to_compute(op.array, kind) for op in (q_op, k_op, v_op))
    out = A.empty(kind, _out_shape(layout, B, Nq, H, d), q_op.dtype)
    lse = A.empty(kind, (B, H, Nq), np.float32)
    aligned = all(A.aligned16(x) for x in (qc, kc, vc))
    family = dispatch.forward_family(q_op.dtype, d, aligned, bool(allow_tf32))

    if family == "tensor-core":
        t = dispatch.tc_forward_tiles(d, causal, A.dtype_name(q_op.dtype))
        kernel = tc_forward.tc_forward_kernel(t, causal, A.dtype_name(q_op.dtype))
        bits = (_bshd(x.view(np.uint16), layout) for x in (qc, kc, vc))
        launch(
            kernel, (_cdiv(Nq, t.block_m), H, B), t.threads, tc_smem_bytes(t),
            *bits, _bshd(out.view(np.uint32), layout), lse, scale,
        )  # fmt: skip
    elif family == "tensor-core-tf32":  # float32 with allow_tf32: fp32 in and out, tf32 mma
        t = tf32_forward.tf32_forward_tiles(d, causal)
        launch(
            tf32_forward.tf32_forward_kernel(t, causal), (_cdiv(Nq, t.block_m), H, B), t.threads,
            tf32_forward.tf32_smem_bytes(t), *(_bshd(x, layout) for x in (qc, kc, vc, out)), lse, scale,
        )  # fmt: skip
    else:  # exact fp32 SIMT kernel; bf16 runs it on fp32 copies (fallback)
        upcast = q_op.dtype == A.BFLOAT16
        if upcast:
            qc, kc, vc = (x.astype(np.float32) for x in (qc, kc, vc))
        o = A.empty(kind, out.shape, np.float32) if upcast else out
        if upcast:  # fresh fp32 copies
            aligned = all(A.aligned16(x) for x in (qc, kc, vc))
        if dispatch.fp32_blocked(qc.dtype, d, aligned):
            t = blocked_forward_tiles(d, causal)
            kernel, smem = simt_blocked_forward.forward_kernel(t, causal), blocked_forward_smem_bytes(t)
        else:  # the row-group kernel: any head dim, fp16 read as is, any alignment
            t = simt_forward_tiles(d)
            kernel, smem = simt_forward.forward_kernel(t, causal), 0
        launch(
            kernel, (_cdiv(Nq, t.block_m), H, B), t.threads, smem,
            *(_bshd(x, layout) for x in (qc, kc, vc, o)), lse, scale,
        )  # fmt: skip
        if upcast:
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
    layout, causal, (q_op, k_op, v_op), (B, Nq, Nk, H, d), scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    do_op = A.check_operand("dout", dout, layout)
    o_op = A.check_operand("out", out, layout)
    A.check_like("dout", do_op, q_op)
    A.check_like("out", o_op, q_op)
    lse_arr = A.check_lse(lse, q_op, B, H, Nq)
    if not isinstance(allow_tf32, (bool, np.bool_)):
        raise TypeError(f"allow_tf32: expected a bool, got {allow_tf32!r}")
    kind = q_op.kind

    computed = [A.to_compute(op.array, kind) for op in (q_op, k_op, v_op, do_op, o_op)]
    lsec = A.to_compute(lse_arr, kind)
    grads = [A.empty(kind, _out_shape(layout, B, n, H, d), q_op.dtype) for n in (Nq, Nk, Nk)]
    delta = A.empty(kind, (B, H, Nq), np.float32)
    aligned = all(A.aligned16(x) for x in computed)
    family = dispatch.backward_family(q_op.dtype, d, aligned, bool(allow_tf32))
    if family == "tensor-core-tf32":  # float32 with allow_tf32: fp32 in and out, tf32 mma
        t = tf32_backward.tf32_backward_tiles(d, causal)
        smem_kv, smem_q = tf32_backward.tf32_bwd_smem_bytes(t)
        qc, kc, vc, doc, oc = (_bshd(x, layout) for x in computed)
        dq, dk, dv = (_bshd(g, layout) for g in grads)
        threads = simt_blocked_backward.PRE_THREADS  # delta in exact fp32, as the exact backward
        launch(simt_blocked_backward.preprocess_kernel(d), (_cdiv(Nq, threads), H, B), threads, 0, oc, doc, delta)
        launch(
            tf32_backward.tf32_bwd_dkdv_kernel(t, causal), (_cdiv(Nk, t.kv_block_n), H, B), t.threads,
            smem_kv, qc, kc, vc, doc, lsec, delta, dk, dv, scale,
        )  # fmt: skip
        launch(
            tf32_backward.tf32_bwd_dq_kernel(t, causal), (_cdiv(Nq, t.q_block_m), H, B), t.threads,
            smem_q, qc, kc, vc, doc, lsec, delta, dq, scale,
        )  # fmt: skip
        return tuple(A.to_caller(x, kind) for x in grads)
    if family == "tensor-core":
        dtype = A.dtype_name(q_op.dtype)
        t = dispatch.tc_backward_tiles(d, causal, dtype)
        smem_kv, smem_q = tc_smem_bwd(t)
        qc, kc, vc, doc, oc = (_bshd(x.view(np.uint16), layout) for x in computed)
        dq, dk, dv = (_bshd(g.view(np.uint32), layout) for g in grads)
        launch(tc_backward.tc_bwd_preprocess_kernel(d, dtype), (_cdiv(Nq, 128), H, B), 128, 0, oc, doc, delta)
        launch(
            tc_backward.tc_bwd_dkdv_kernel(t, causal, dtype), (_cdiv(Nk, t.kv_block_n), H, B), t.threads,
            smem_kv, qc, kc, vc, doc, lsec, delta, dk, dv, scale,
        )  # fmt: skip
        launch(
            tc_backward.tc_bwd_dq_kernel(t, causal, dtype), (_cdiv(Nq, t.q_block_m), H, B), t.threads,
            smem_q, qc, kc, vc, doc, lsec, delta, dq, scale,
        )  # fmt: skip
        return tuple(A.to_caller(x, kind) for x in grads)

    # exact fp32 SIMT kernels (the fallback for fp16/bf16): fp16 reads and writes its
    # own dtype, bf16 runs on fp32 copies
    upcast = q_op.dtype == A.BFLOAT16
    work_dtype = np.float32 if upcast else q_op.dtype
    qc, kc, vc, doc, oc = (_bshd(x.astype(work_dtype, copy=False), layout) for x in computed)
    dq, dk, dv = (A.empty(kind, g.shape, np.float32) for g in grads) if upcast else grads

    if dispatch.fp32_blocked(qc.dtype, d, all(A.aligned16(x) for x in (qc, kc, vc, doc))):
        tkv, tq = blocked_backward_tiles(d, causal)
        pre, pre_threads = simt_blocked_backward.preprocess_kernel(d), simt_blocked_backward.PRE_THREADS
        launch(pre, (_cdiv(Nq, pre_threads), H, B), pre_threads, 0, oc, doc, delta)
        launch(
            simt_blocked_backward.dkdv_kernel(tkv, causal), (_cdiv(Nk, tkv.block_m), H, B), tkv.threads,
            blocked_dkdv_smem_bytes(tkv), qc, kc, vc, doc, lsec, delta, _bshd(dk, layout), _bshd(dv, layout), scale,
        )  # fmt: skip
        launch(
            simt_blocked_backward.dq_kernel(tq, causal), (_cdiv(Nq, tq.block_m), H, B), tq.threads,
            blocked_dq_smem_bytes(tq), qc, kc, vc, doc, lsec, delta, _bshd(dq, layout), scale,
        )  # fmt: skip
    else:  # the row-group kernels: any head dim, fp16 read as is, any alignment
        t = simt_backward_tiles(d)
        rows = t.threads // t.group
        launch(simt_backward.preprocess_kernel(t), (_cdiv(Nq, rows), H, B), t.threads, 0, oc, doc, delta)
        launch(
            simt_backward.dkdv_kernel(t, causal), (_cdiv(Nk, rows), H, B), t.threads, 0,
            qc, kc, vc, doc, lsec, delta, _bshd(dk, layout), _bshd(dv, layout), scale,
        )  # fmt: skip
        launch(
            simt_backward.dq_kernel(t, causal), (_cdiv(Nq, rows), H, B), t.threads, 0,
            qc, kc, vc, doc, lsec, delta, _bshd(dq, layout), scale,
        )  # fmt: skip
    if upcast:
        for g, g32 in zip(grads, (dq, dk, dv)):
            g[...] = g32.astype(g.dtype)
    return tuple(A.to_caller(x, kind) for x in grads)

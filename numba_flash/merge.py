"""``merge_attention``: the attention over a union of disjoint key sets, from the
attention over each (``kernels.merge``).  Host side: checks, dtype and side handling."""

from __future__ import annotations

import numpy as np

from numba_flash import _arrays as A


def merge_attention(out_parts, lse_parts):
    """Combine S partial attentions over disjoint key sets exactly.

    Args:
        out_parts: (S, batch, seqlen_q, heads, headdim), float32, float16 or bfloat16:
            part s is ``softmax(S_s)·V_s`` over its own keys (``flash_attention`` on
            them, or a split of ``flash_attention_with_kvcache``).
        lse_parts: (S, batch, heads, seqlen_q) float32, each part's log-sum-exp
            (``return_lse=True``); on the same side (host/device) as ``out_parts``.

    Returns:
        ``(out, lse)``: (batch, seqlen_q, heads, headdim) in out_parts' dtype and
        (batch, heads, seqlen_q) float32, of the caller's kind.  With
        ``m = max_s lse_s`` and ``w_s = exp(lse_s − m)``: ``lse = m + log Σ w_s`` and
        ``out = Σ w_s·out_s / Σ w_s``.  A part whose lse is −inf (it saw no key)
        contributes nothing (its out is not read into the sum); a row no part saw gets
        0 and −inf.  The parts are summed in a fixed order: deterministic.
    """
    A.require_runtime()
    kind, o = A._as_array("out_parts", out_parts)
    kind_l, lse_in = A._as_array("lse_parts", lse_parts)
    if kind_l != kind:
        raise TypeError("lse_parts: must be on the same side (host/device) as out_parts")
    if o.ndim != 5 or o.shape[0] < 1:
        raise ValueError(f"out_parts: shape {tuple(o.shape)}: expected (S >= 1, batch, seqlen_q, heads, headdim)")
    S, B, Nq, H, D = o.shape
    if A.dtype_name(o.dtype) not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"out_parts: dtype {A.dtype_name(o.dtype)}: expected float32, float16 or bfloat16")
    if tuple(lse_in.shape) != (S, B, H, Nq):
        raise ValueError(f"lse_parts: shape {tuple(lse_in.shape)}: expected (S, batch, heads, seqlen_q) = "
                         f"{(S, B, H, Nq)} (out_parts {tuple(o.shape)})")  # fmt: skip
    if lse_in.dtype != np.float32:
        raise TypeError(f"lse_parts: dtype {A.dtype_name(lse_in.dtype)}: expected float32")
    out = A.empty(kind, (B, Nq, H, D), o.dtype)
    lse = A.empty(kind, (B, H, Nq), np.float32)
    if B * Nq * H:
        parts = A.to_compute(o, kind)
        merge_into(parts if parts.dtype == np.float32 else parts.astype(np.float32), A.to_compute(lse_in, kind), out,
                   lse, 1)  # fmt: skip
    return A.to_caller(out, kind), A.to_caller(lse, kind)


def merge_into(parts, lse_parts, out, lse, group: int) -> None:
    """Launch the merge (``kernels.merge``) of fp32 ``parts`` (S, B, rows, heads, d) and
    ``lse_parts`` (S, B, heads, rows), any strides, into ``out`` (B, Nq, H, d) of fp32,
    fp16 or bf16 and ``lse`` (B, H, Nq), for ``group`` query heads a part's head."""
    from numba_flash._launch import launch
    from numba_flash.kernels import merge

    B, Nq, H, D = out.shape
    name = A.dtype_name(out.dtype)
    view = out if name == "float32" else out.view(np.uint16)
    grid, threads = merge.launch_shape(B, Nq, H, D, parts.shape[0])
    launch(merge.merge_kernel(name), grid, threads, 0, parts, lse_parts, view, lse, group)

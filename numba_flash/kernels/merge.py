"""Merging partial attentions: the attention over a union of disjoint key sets from the
attention over each set (split-KV decoding, ring attention, a prefix cache and a suffix).

Math, per output row (batch b, query i, head h), over the S parts::

    m     = max_s lse_s                      (0 in place of −inf: no part saw a key)
    w_s   = exp(lse_s − m)                   0 for a part that saw no key
    lse   = m + log Σ_s w_s                  −inf when every w_s is 0
    out   = Σ_s w_s · out_s / Σ_s w_s        0 when every w_s is 0

A part whose weight is 0 is skipped, not multiplied (its out may be anything, NaN
included); a NaN or +inf lse makes the row NaN.  The parts are summed in order s = 0, 1, …:
the result is deterministic.

Where the parts are read: output row (b, i, h) takes row ``r = i·GROUP + h % GROUP``
of head ``h // GROUP`` of each part, ``out_parts[s, b, r, h // GROUP, :]`` and
``lse_parts[s, b, h // GROUP, r]``.  ``GROUP = 1`` is ``merge_attention``'s layout, (S,
B, Nq, H, d) and (S, B, H, Nq); ``GROUP = H / H_kv`` reads the GQA decode swap of
``flash_attention_with_kvcache`` as it was computed (a KV head's query heads as the
rows of one sequence: (S, B, GROUP, H_kv, d), Nq = 1), with no copy to reorder it.

Grid and threads:
    grid = (ceil(B·Nq·H / ROWS),), block = 32·ROWS threads; warp w of block x owns row
    ``x·ROWS + w`` (rows ordered b, i, h, h fastest); its lanes read the S lse values
    (the same addresses: broadcasts) and stride over the d columns.

No shared memory.  The parts are fp32 (the host converts 16-bit ones; split-KV writes
fp32 partials); the output is written in its own dtype (:func:`merge_kernel`): fp32,
or fp16 / bf16 rounded to nearest even into a uint16 view.
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, uint16, uint32

ROWS = 4  # warps (output rows) per block
THREADS = 32 * ROWS


@functools.lru_cache(maxsize=None)
def merge_kernel(out_dtype: str):
    """``kernel[grid(B, Nq, H), THREADS](out_parts, lse_parts, out, lse, GROUP)``: out
    (B, Nq, H, d) float32, or a uint16 view of fp16 / bf16 (``out_dtype``), lse (B, H,
    Nq) float32."""
    F32, BF16 = out_dtype == "float32", out_dtype == "bfloat16"

    @cuda.jit
    def merge_parts(out_parts, lse_parts, out, lse, GROUP):
        S = out_parts.shape[0]
        B, Nq, H, D = out.shape
        row = cuda.blockIdx.x * ROWS + cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        if row >= B * Nq * H:
            return
        h = row % H
        i = (row // H) % Nq
        b = row // (H * Nq)
        r = i * GROUP + h % GROUP  # where the parts hold this row (module docstring)
        hp = h // GROUP
        m = float32(-math.inf)
        nan = False
        for s in range(S):
            x = lse_parts[s, b, hp, r]
            nan = nan or math.isnan(x) or x == float32(math.inf)
            m = max(m, x)
        m_safe = float32(0.0) if m == float32(-math.inf) else m
        total = float32(0.0)
        for s in range(S):
            total += math.exp(lse_parts[s, b, hp, r] - m_safe)
        inv = float32(1.0) / total if total > float32(0.0) else float32(0.0)
        for c in range(lane, D, 32):
            acc = float32(0.0)
            for s in range(S):
                w = math.exp(lse_parts[s, b, hp, r] - m_safe)
                if w != float32(0.0):
                    acc += w * out_parts[s, b, r, hp, c]
            o = float32(math.nan) if nan else acc * inv
            if F32:
                out[b, i, h, c] = o
            else:  # the low half of a packed pair is o rounded to the 16-bit dtype
                w16 = ptx.pack_bf16x2(o, float32(0.0)) if BF16 else ptx.pack_f16x2(o, float32(0.0))
                out[b, i, h, c] = uint16(w16 & uint32(0xFFFF))
        if lane == 0:
            if nan:
                lse[b, h, i] = math.nan
            elif total > float32(0.0):
                lse[b, h, i] = m_safe + math.log(total)
            else:
                lse[b, h, i] = -math.inf

    return merge_parts


def grid(B: int, Nq: int, H: int) -> int:
    """Blocks for B·Nq·H output rows."""
    return -(-(B * Nq * H) // ROWS)

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

Grid and threads:
    grid = (ceil(B·Nq·H / ROWS),), block = 32·ROWS threads; warp w of block x owns row
    ``x·ROWS + w`` (rows ordered b, i, h, h fastest); its lanes read the S lse values
    (the same addresses: broadcasts) and stride over the d columns.

No shared memory.  fp32 in and out (the host converts 16-bit parts).
"""

from __future__ import annotations

import math

from numba_flash._numba_cuda import cuda, float32

ROWS = 4  # warps (output rows) per block
THREADS = 32 * ROWS


@cuda.jit
def merge_parts(out_parts, lse_parts, out, lse):
    S, B, Nq, H, D = out_parts.shape
    row = cuda.blockIdx.x * ROWS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row >= B * Nq * H:
        return
    h = row % H
    i = (row // H) % Nq
    b = row // (H * Nq)
    m = float32(-math.inf)
    nan = False
    for s in range(S):
        x = lse_parts[s, b, h, i]
        nan = nan or math.isnan(x) or x == float32(math.inf)
        m = max(m, x)
    m_safe = float32(0.0) if m == float32(-math.inf) else m
    total = float32(0.0)
    for s in range(S):
        total += math.exp(lse_parts[s, b, h, i] - m_safe)
    inv = float32(1.0) / total if total > float32(0.0) else float32(0.0)
    for c in range(lane, D, 32):
        acc = float32(0.0)
        for s in range(S):
            w = math.exp(lse_parts[s, b, h, i] - m_safe)
            if w != float32(0.0):
                acc += w * out_parts[s, b, i, h, c]
        out[b, i, h, c] = math.nan if nan else acc * inv
    if lane == 0:
        if nan:
            lse[b, h, i] = math.nan
        elif total > float32(0.0):
            lse[b, h, i] = m_safe + math.log(total)
        else:
            lse[b, h, i] = -math.inf


def grid(B: int, Nq: int, H: int) -> int:
    """Blocks for B·Nq·H output rows."""
    return -(-(B * Nq * H) // ROWS)

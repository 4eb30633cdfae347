"""Merging partial attentions: the attention over a union of disjoint key sets from the
attention over each set (split-KV decoding, ring attention, a prefix cache and a suffix).

Math, per output row (batch b, query i, head h), over the S parts::

    m     = max_s lse_s                      (0 in place of −inf: no part saw a key)
    w_s   = exp(lse_s − m)                   0 for a part that saw no key
    lse   = m + log Σ_s w_s                  −inf when every w_s is 0
    out   = Σ_s w_s · out_s / Σ_s w_s        0 when every w_s is 0

A part whose weight is 0 is skipped, not multiplied (its out may be anything, NaN
included); a NaN or +inf lse makes the row NaN.  The sums run in a fixed order (warp w
adds parts w, w + W, …; then warp 0 adds the warps' sums in order w = 0, 1, …): the
result is deterministic.

Where the parts are read: output row (b, i, h) takes row ``r = i·GROUP + h % GROUP``
of head ``h // GROUP`` of each part, ``out_parts[s, b, r, h // GROUP, :]`` and
``lse_parts[s, b, h // GROUP, r]``.  ``GROUP = 1`` is ``merge_attention``'s layout, (S,
B, Nq, H, d) and (S, B, H, Nq); ``GROUP = H / H_kv`` reads the GQA decode swap of
``flash_attention_with_kvcache`` as it was computed (a KV head's query heads as the
rows of one sequence: (S, B, GROUP, H_kv, d), Nq = 1), with no copy to reorder it.

Grid and threads (:func:`launch_shape`):
    grid = (B·Nq·H, ceil(d / 128)): block (x, y) owns output row x (rows ordered b, i, h,
    h fastest) and its columns 128y … 128y + 127; block = 32·W threads, W = min(S, 8)
    warps.  Warp w takes parts w, w + W, …; lane l columns 128y + 4l … + 3.  Every
    thread's loads are independent of one another (the lse values, then the parts'
    columns), so a split-KV step's merge costs about two memory latencies, not one a
    part (a warp a row walking the S parts in turn took 20 µs for 8 parts of a decode
    step on the H200, the split kernel itself 39 µs: docs/benchmarks/2026-12-03-s19).

Shared memory: each warp's maximum and NaN flag, then its partial sums (W·(128 + 1)
floats).  The parts are fp32 (the host converts 16-bit ones; split-KV writes fp32
partials); the output is written in its own dtype (:func:`merge_kernel`): fp32, or
fp16 / bf16 rounded to nearest even into a uint16 view.
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, int32, uint16, uint32

MAX_WARPS = 8  # warps a block: the parts a block reads at once
COLUMNS = 128  # output columns a block (4 a lane)


def launch_shape(B: int, Nq: int, H: int, D: int, S: int) -> tuple:
    """``(grid, threads)`` of the merge of S parts into B·Nq·H rows of D columns."""
    return (B * Nq * H, -(-D // COLUMNS), 1), 32 * min(S, MAX_WARPS)


@functools.lru_cache(maxsize=None)
def merge_kernel(out_dtype: str):
    """``kernel[launch_shape(...)](out_parts, lse_parts, out, lse, GROUP)``: out
    (B, Nq, H, d) float32, or a uint16 view of fp16 / bf16 (``out_dtype``), lse (B, H,
    Nq) float32."""
    F32, BF16 = out_dtype == "float32", out_dtype == "bfloat16"

    @cuda.jit
    def merge_parts(out_parts, lse_parts, out, lse, GROUP):
        S = out_parts.shape[0]
        B, Nq, H, D = out.shape
        row = cuda.blockIdx.x
        h = row % H
        i = (row // H) % Nq
        b = row // (H * Nq)
        r = i * GROUP + h % GROUP  # where the parts hold this row (module docstring)
        hp = h // GROUP
        warp = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        W = cuda.blockDim.x // 32
        c0 = cuda.blockIdx.y * COLUMNS + 4 * lane
        warp_max = cuda.shared.array(MAX_WARPS, float32)
        warp_nan = cuda.shared.array(MAX_WARPS, int32)
        warp_tot = cuda.shared.array(MAX_WARPS, float32)
        warp_acc = cuda.shared.array((MAX_WARPS, COLUMNS), float32)
        m = float32(-math.inf)
        nan = 0
        for s in range(warp, S, W):
            x = lse_parts[s, b, hp, r]
            if math.isnan(x) or x == float32(math.inf):
                nan = 1
            m = max(m, x)
        if lane == 0:
            warp_max[warp] = m
            warp_nan[warp] = nan
        cuda.syncthreads()  # every warp's maximum, before any reads them
        for w in range(W):
            m = max(m, warp_max[w])
            nan |= warp_nan[w]
        m_safe = float32(0.0) if m == float32(-math.inf) else m
        tot = float32(0.0)
        acc = cuda.local.array(4, float32)
        for k in range(4):
            acc[k] = float32(0.0)
        for s in range(warp, S, W):
            wt = math.exp(lse_parts[s, b, hp, r] - m_safe)
            tot += wt
            if wt != float32(0.0):  # a part that saw no key is not read (its out may be anything)
                for k in range(4):
                    if c0 + k < D:
                        acc[k] += wt * out_parts[s, b, r, hp, c0 + k]
        for k in range(4):
            warp_acc[warp, 4 * lane + k] = acc[k]
        if lane == 0:
            warp_tot[warp] = tot
        cuda.syncthreads()  # every warp's sums, before warp 0 adds them
        if warp != 0:
            return
        tot = float32(0.0)
        for w in range(W):
            tot += warp_tot[w]
        inv = float32(1.0) / tot if tot > float32(0.0) else float32(0.0)
        for k in range(4):
            c = c0 + k
            if c < D:
                a = float32(0.0)
                for w in range(W):
                    a += warp_acc[w, 4 * lane + k]
                o = float32(math.nan) if nan else a * inv
                if F32:
                    out[b, i, h, c] = o
                else:  # the low half of a packed pair is o rounded to the 16-bit dtype
                    w16 = ptx.pack_bf16x2(o, float32(0.0)) if BF16 else ptx.pack_f16x2(o, float32(0.0))
                    out[b, i, h, c] = uint16(w16 & uint32(0xFFFF))
        if lane == 0 and cuda.blockIdx.y == 0:
            if nan:
                lse[b, h, i] = math.nan
            elif tot > float32(0.0):
                lse[b, h, i] = m_safe + math.log(tot)
            else:
                lse[b, h, i] = -math.inf

    return merge_parts

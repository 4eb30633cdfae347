"""Exact fp32 FlashAttention forward on CUDA cores (SIMT).

Math (one query row i, keys j visible to it; ``scale`` = softmax_scale)::

    s_ij  = scale · q_i · k_j
    m_i   = max_j s_ij                  running max, grown tile by tile
    l_i   = Σ_j exp(s_ij − m_i)         running sum, rescaled by exp(m_old − m_new)
    acc_i = Σ_j exp(s_ij − m_i) · v_j   likewise rescaled
    o_i   = acc_i / l_i,   lse_i = m_i + log(l_i)

A row that sees no key (causal with Nq > Nk) gets o_i = 0 and lse_i = −inf.
Causal masking is bottom-right aligned (FlashAttention-2 >= 2.1): query i sees key j
iff j <= i + Nk − Nq.

Grid and threads:
    grid  = (ceil(Nq / BLOCK_M), H, B), block = THREADS (128) threads.
    Lanes come in groups of G; group ``grp = tid // G`` owns the query rows
    ``start_m + grp + r·(THREADS/G)`` for r < ROWS, and lane ``g = tid % G`` of it
    owns the columns ``c·G + g`` (c < COLS) of those rows: q (pre-scaled) and acc
    live in its registers, m_i and l_i too (l_i as a per-lane partial sum, added
    across the group at the end).

Per key tile (BLOCK_N keys, staged in shared memory):
    1. every lane forms its partial dot products with each key; a butterfly of
       log2(G) shuffles gives every lane of the group the full s_ij; the lane with
       ``j % G == g`` writes it (masked: ``mask.masked_score``) into the score tile
       ``s_p``;
    2. ``softmax.online_softmax_row`` on the lane's own scores (j ≡ g mod G), the max
       finished over the group: p = exp(s − m_new) in place, acc and l_i rescaled;
    3. acc += p · v over the tile (p read back from ``s_p``, broadcast in the group).

Shared memory (fp32): K tile BLOCK_N·d, V tile BLOCK_N·d, score tile
BLOCK_M·(BLOCK_N+1) (one word of padding per row so that the groups of a warp hit
different banks): at most 45.5 KiB (``config.simt_forward_tiles``), under numba's
48 KiB static limit.

Every index into q/k/v/out is a 64-bit element index computed by numba from the
array's strides, so B·H·N·d may exceed 2**31.  The kernel works for any input dtype
numba can read (fp32 here; fp16 through the same code as a fallback), converting to
fp32 on load and accumulating in fp32.
"""

from __future__ import annotations

import functools

from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import SimtTiles
from numba_flash.kernels import copy, dropout, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (key_tiles, kv_pages, no_pages, this_block, tile_at, tile_partial, walk_list,
                                           walk_range)
from numba_flash.variant import DROPOUT, VARLEN, Variant


@functools.lru_cache(maxsize=None)
def simt_forward_kernel(t: SimtTiles, variant: Variant):
    """Compile (lazily, per argument types) the forward kernel for tiles ``t``.

    Signature: ``kernel[grid, THREADS, stream](q, k, v, out, lse, softmax_scale)``
    with q (B, Nq, H, d), k and v (B, Nk, H, d), out like q, lse (B, H, Nq) float32.
    """
    G, COLS, ROWS = t.group, t.lane_cols, t.lane_rows
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.block_m, t.block_n, t.head_dim, t.threads
    GROUPS = THREADS // G  # row groups per block
    S_STRIDE = BLOCK_N + 1  # padded row of the score tile
    P_VALS, REGS = BLOCK_M * S_STRIDE, ROWS * COLS
    F = variant.flags
    DD = t.data_dim or t.head_dim  # the arrays' head dim (columns past it: zero, never written)

    pages = kv_pages if variant.paged else no_pages  # a KV cache's keys through its block table

    @cuda.jit
    def simt_forward(q, k, v, out, lse, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid = cuda.threadIdx.x
        g = tid % G
        grp = tid // G
        scale = float32(softmax_scale)
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)
        pg = pages(fx, seq)

        s_k = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_v = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_p = cuda.shared.array(P_VALS, float32)

        q_reg = cuda.local.array(REGS, float32)  # [r · COLS + c]
        acc = cuda.local.array(REGS, float32)
        m_i = cuda.local.array(ROWS, float32)
        l_i = cuda.local.array(ROWS, float32)
        s = cuda.local.array(ROWS, float32)

        # load q: it stays in registers, pre-multiplied by the softmax scale
        pipeline.zero(acc, REGS)
        for r in range(ROWS):
            copy.load_lane_row(q_reg, r * COLS, q, b, q0 + start_m + grp + r * GROUPS, h, q0 + seqlen_q, g, G, COLS,
                               scale, DD)  # fmt: skip
            m_i[r] = softmax.NEG_INF
            l_i[r] = float32(0.0)

        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)  # a block mask's list, or the range
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        for j in range(n_lo, n_hi):
            start_n = tile_at(j, vr, F) * BLOCK_N
            partial = tile_partial(j, vr, F)
            # K and V of the tile, between barriers (the last tile's readers of s_k, s_v, s_p are done)
            pipeline.load_rows_now(s_k, k, s_v, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, HEAD_DIM, THREADS,
                                   float32(1.0), s_p, lse, lse, False, DD, pg)  # fmt: skip

            # 1. scores s_ij for the tile: lane j % G of a group keeps key j's
            for jj in range(BLOCK_N):
                for r in range(ROWS):
                    s[r] = float32(0.0)
                for c in range(COLS):
                    k_c = s_k[jj, c * G + g]
                    for r in range(ROWS):
                        s[r] += q_reg[r * COLS + c] * k_c
                for r in range(ROWS):  # every lane of the group gets the sum
                    s[r] = softmax.allreduce_sum(s[r], G)
                if jj % G == g:
                    for r in range(ROWS):  # the score step on scale·s (score.prescaled), masked
                        qi = start_m + grp + r * GROUPS
                        x, _ = score.prescaled(s[r], si, F)
                        x, _ = score.index_step(x, qi, start_n + jj, mi[2], True, partial, si, mi, False, F)
                        s_p[(grp + r * GROUPS) * S_STRIDE + jj] = x

            # 2. online softmax on this lane's keys (j ≡ g mod G), max over the group
            for r in range(ROWS):
                softmax.online_softmax_row(s_p, (grp + r * GROUPS) * S_STRIDE + g, G, BLOCK_N // G, 1, acc, r * COLS,
                                           1, COLS, 1, m_i, l_i, r, G, False)  # fmt: skip
                if F[DROPOUT]:  # P·V takes P ∘ Z / (1 − p) of the lane's keys; l_i kept the undropped P
                    for n in range(BLOCK_N // G):
                        at = (grp + r * GROUPS) * S_STRIDE + g + n * G
                        s_p[at] *= dropout.kept_scale(start_m + grp + r * GROUPS, start_n + g + n * G, di)
            # p written by lane j % G is read by every lane of its group (same warp)
            cuda.syncwarp(softmax.FULL_MASK)

            # 3. acc += p · v
            for jj in range(BLOCK_N):
                for r in range(ROWS):
                    s[r] = s_p[(grp + r * GROUPS) * S_STRIDE + jj]
                for c in range(COLS):
                    v_c = s_v[jj, c * G + g]
                    for r in range(ROWS):
                        acc[r * COLS + c] += s[r] * v_c

        # epilogue: o = acc / l, lse = m + log(l)
        for r in range(ROWS):
            inv_l, lse_row = softmax.finalize(m_i[r], l_i[r], G, False)
            row = start_m + grp + r * GROUPS
            if row < seqlen_q:
                for c in range(COLS):
                    if DD >= COLS * G or c * G + g < DD:
                        out[b, q0 + row, h, c * G + g] = acc[r * COLS + c] * inv_l
                if g == 0:
                    lse[b, h, q0 + row] = lse_row

    return simt_forward


def launches(t: SimtTiles, variant: Variant, sz: spec.Sizes) -> list:
    """The forward: one kernel, a block per ``block_m`` queries; static shared memory."""
    hf = variant.heaviest_first  # grid order (spec.query_grid)
    kernel = simt_forward_kernel(t, variant)
    return [spec.KernelLaunch("simt_forward", kernel, t, spec.query_grid(sz, t.block_m, hf), t.threads, 0,
                              spec.forward_args(), (t.block_m, t.block_n, False))]  # fmt: skip

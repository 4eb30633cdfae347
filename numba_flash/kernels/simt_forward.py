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
       ``j % G == g`` writes it into the score tile ``s_p``;
    2. the new max m_new gives alpha = exp(m_old − m_new); acc and l_i are rescaled
       once per tile; lane g turns its own scores (j ≡ g mod G) into p = exp(s − m_new)
       in place and adds them to its partial l_i;
    3. acc += p · v over the tile (p read back from ``s_p``, broadcast in the group).

Shared memory (fp32): K tile BLOCK_N·d, V tile BLOCK_N·d, score tile
BLOCK_M·(BLOCK_N+1) (one word of padding per row so that the groups of a warp hit
different banks): at most 45.5 KiB (``config.forward_smem_bytes``), under numba's
48 KiB static limit.

Every index into q/k/v/out is a 64-bit element index computed by numba from the
array's strides, so B·H·N·d may exceed 2**31.  The kernel works for any input dtype
numba can read (fp32 here; fp16 through the same code as a fallback), converting to
fp32 on load and accumulating in fp32.
"""

from __future__ import annotations

import functools
import math

from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import SimtTiles

NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def forward_kernel(t: SimtTiles, causal: bool):
    """Compile (lazily, per argument types) the forward kernel for tiles ``t``.

    Signature: ``kernel[grid, THREADS, stream](q, k, v, out, lse, softmax_scale)``
    with q (B, Nq, H, d), k and v (B, Nk, H, d), out like q, lse (B, H, Nq) float32.
    """
    G, COLS, ROWS = t.group, t.cols, t.rows
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.block_m, t.block_n, t.head_dim, t.threads
    GROUPS = THREADS // G  # row groups per block
    S_STRIDE = BLOCK_N + 1  # padded row of the score tile
    CAUSAL = causal

    @cuda.jit
    def simt_forward(q, k, v, out, lse, softmax_scale):
        start_m = cuda.blockIdx.x * BLOCK_M
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        g = tid % G
        grp = tid // G
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale = float32(softmax_scale)

        s_k = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_v = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_p = cuda.shared.array((BLOCK_M, S_STRIDE), float32)

        q_reg = cuda.local.array((ROWS, COLS), float32)
        acc = cuda.local.array((ROWS, COLS), float32)
        m_i = cuda.local.array(ROWS, float32)
        l_i = cuda.local.array(ROWS, float32)
        m_tile = cuda.local.array(ROWS, float32)
        s = cuda.local.array(ROWS, float32)

        # load q: it stays in registers, pre-multiplied by the softmax scale
        for r in range(ROWS):
            row = start_m + grp + r * GROUPS
            for c in range(COLS):
                acc[r, c] = float32(0.0)
                if row < seqlen_q:
                    q_reg[r, c] = float32(q[b, row, h, c * G + g]) * scale
                else:
                    q_reg[r, c] = float32(0.0)
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are skipped
            end_n = min(seqlen_k, max(0, start_m + BLOCK_M + diag))

        for start_n in range(0, end_n, BLOCK_N):
            # the previous tile's readers of s_k, s_v and s_p are done
            cuda.syncthreads()
            for idx in range(tid, BLOCK_N * HEAD_DIM, THREADS):
                jj = idx // HEAD_DIM
                col = idx - jj * HEAD_DIM
                kj = start_n + jj
                if kj < seqlen_k:
                    s_k[jj, col] = float32(k[b, kj, h, col])
                    s_v[jj, col] = float32(v[b, kj, h, col])
                else:
                    s_k[jj, col] = float32(0.0)
                    s_v[jj, col] = float32(0.0)
            # the K and V tiles are in shared memory for every thread
            cuda.syncthreads()

            # 1. scores s_ij for the tile, and its row max
            for r in range(ROWS):
                m_tile[r] = NEG_INF
            for jj in range(BLOCK_N):
                kj = start_n + jj
                for r in range(ROWS):
                    s[r] = float32(0.0)
                for c in range(COLS):
                    k_c = s_k[jj, c * G + g]
                    for r in range(ROWS):
                        s[r] += q_reg[r, c] * k_c
                off = G // 2
                while off > 0:  # butterfly: every lane of the group gets the sum
                    for r in range(ROWS):
                        s[r] += cuda.shfl_xor_sync(FULL_MASK, s[r], off)
                    off //= 2
                for r in range(ROWS):
                    row = start_m + grp + r * GROUPS
                    visible = kj < seqlen_k
                    if CAUSAL:
                        visible = visible and kj <= row + diag
                    s_ij = s[r] if visible else NEG_INF
                    m_tile[r] = max(m_tile[r], s_ij)
                    if jj % G == g:
                        s_p[grp + r * GROUPS, jj] = s_ij

            # 2. rescale by exp(m_old - m_new); p = exp(s - m_new) for this lane's keys
            for r in range(ROWS):
                m_new = max(m_i[r], m_tile[r])
                m_use = m_new if m_new != NEG_INF else float32(0.0)  # no -inf - -inf
                alpha = math.exp(m_i[r] - m_use)
                m_i[r] = m_new
                l_i[r] *= alpha
                for c in range(COLS):
                    acc[r, c] *= alpha
                for jj in range(g, BLOCK_N, G):
                    p = math.exp(s_p[grp + r * GROUPS, jj] - m_use)
                    s_p[grp + r * GROUPS, jj] = p
                    l_i[r] += p
            # p written by lane j % G is read by every lane of its group (same warp)
            cuda.syncwarp(FULL_MASK)

            # 3. acc += p · v
            for jj in range(BLOCK_N):
                for r in range(ROWS):
                    s[r] = s_p[grp + r * GROUPS, jj]
                for c in range(COLS):
                    v_c = s_v[jj, c * G + g]
                    for r in range(ROWS):
                        acc[r, c] += s[r] * v_c

        # epilogue: o = acc / l, lse = m + log(l)
        for r in range(ROWS):
            l_row = l_i[r]
            off = G // 2
            while off > 0:
                l_row += cuda.shfl_xor_sync(FULL_MASK, l_row, off)
                off //= 2
            row = start_m + grp + r * GROUPS
            if row < seqlen_q:
                for c in range(COLS):
                    if l_row > float32(0.0):
                        out[b, row, h, c * G + g] = acc[r, c] / l_row
                    else:
                        out[b, row, h, c * G + g] = float32(0.0)
                if g == 0:
                    if l_row > float32(0.0):
                        lse[b, h, row] = m_i[r] + math.log(l_row)
                    else:
                        lse[b, h, row] = NEG_INF

    return simt_forward

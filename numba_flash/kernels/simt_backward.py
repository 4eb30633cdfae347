"""Exact fp32 FlashAttention backward on CUDA cores (SIMT): three kernels.

Math (P is recomputed from the saved log-sum-exp; nothing N×N is stored)::

    delta_i = Σ_c dO_ic · O_ic                       (preprocess, = rowsum(dO∘O))
    p_ij    = exp(scale · q_i·k_j − lse_i)           (0 where j is masked)
    dv_j    = Σ_i p_ij · dO_i
    dp_ij   = dO_i · v_j
    ds_ij   = p_ij · (dp_ij − delta_i)
    dk_j    = scale · Σ_i ds_ij · q_i
    dq_i    = scale · Σ_j ds_ij · k_j

Kernels (THREADS = 128 threads a block; a group of G lanes owns one row and lane g
of it the columns c·G + g, as in the forward; see ``config.simt_backward_tiles``):

- ``preprocess``: grid (ceil(Nq / ROWS_PER_BLOCK), H, B); one group per query row
  writes delta (B, H, Nq) float32.
- ``dkdv``: grid (ceil(Nk / ROWS_PER_BLOCK), H, B); group ``grp`` owns key row
  ``start_n + grp`` and keeps k_j, v_j, dk_j, dv_j in registers while it walks the
  query tiles (BLOCK_N queries of Q and dO staged in shared memory, with lse and
  delta).  With causal masking it starts at the first query tile that sees the block's
  first key.  Each (i, j) costs two dot products finished by shuffles, one exp and four
  COLS-long FMA chains; dK and dV are written once, by their owner: no atomics.
- ``dq``: grid (ceil(Nq / ROWS_PER_BLOCK), H, B); group ``grp`` owns query row
  ``start_m + grp`` (q_i, dO_i, dq_i in registers) and walks the key tiles (K and V in
  shared memory), stopping after the last tile it can see when causal.  dQ is written
  once by its owner: the result is bitwise the same run to run.

Shared memory: two tiles of BLOCK_N·d fp32 (Q and dO, or K and V) plus 2·BLOCK_N
words of lse/delta: at most 32.5 KiB.
"""

from __future__ import annotations

import functools
import math

from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import SimtTiles

NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def preprocess_kernel(t: SimtTiles):
    """``kernel[grid, THREADS, stream](out, dout, delta)``: delta = rowsum(dO∘O)."""
    G, COLS, THREADS = t.group, t.cols, t.threads
    ROWS_PER_BLOCK = THREADS // G

    @cuda.jit
    def simt_bwd_preprocess(out, dout, delta):
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        g = cuda.threadIdx.x % G
        row = cuda.blockIdx.x * ROWS_PER_BLOCK + cuda.threadIdx.x // G
        seqlen_q = out.shape[1]
        acc = float32(0.0)
        if row < seqlen_q:
            for c in range(COLS):
                acc += float32(dout[b, row, h, c * G + g]) * float32(out[b, row, h, c * G + g])
        off = G // 2
        while off > 0:
            acc += cuda.shfl_xor_sync(FULL_MASK, acc, off)
            off //= 2
        if row < seqlen_q and g == 0:
            delta[b, h, row] = acc

    return simt_bwd_preprocess


@functools.lru_cache(maxsize=None)
def dkdv_kernel(t: SimtTiles, causal: bool):
    """``kernel[grid, THREADS, stream](q, k, v, dout, lse, delta, dk, dv, softmax_scale)``."""
    G, COLS, THREADS = t.group, t.cols, t.threads
    BLOCK_Q, HEAD_DIM = t.block_n, t.head_dim  # query rows per shared tile
    ROWS_PER_BLOCK = THREADS // G  # key rows per block
    CAUSAL = causal

    @cuda.jit
    def simt_bwd_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale):
        start_n = cuda.blockIdx.x * ROWS_PER_BLOCK
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        g = tid % G
        kj = start_n + tid // G  # this group's key row
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale = float32(softmax_scale)

        s_q = cuda.shared.array((BLOCK_Q, HEAD_DIM), float32)
        s_do = cuda.shared.array((BLOCK_Q, HEAD_DIM), float32)
        s_lse = cuda.shared.array(BLOCK_Q, float32)
        s_delta = cuda.shared.array(BLOCK_Q, float32)

        k_reg = cuda.local.array(COLS, float32)
        v_reg = cuda.local.array(COLS, float32)
        dk_acc = cuda.local.array(COLS, float32)
        dv_acc = cuda.local.array(COLS, float32)
        for c in range(COLS):
            dk_acc[c] = float32(0.0)
            dv_acc[c] = float32(0.0)
            if kj < seqlen_k:
                k_reg[c] = float32(k[b, kj, h, c * G + g]) * scale
                v_reg[c] = float32(v[b, kj, h, c * G + g])
            else:
                k_reg[c] = float32(0.0)
                v_reg[c] = float32(0.0)

        start_q = 0
        if CAUSAL:  # queries before the one that sees key start_n see none of the block
            first = max(0, start_n - diag)
            start_q = (first // BLOCK_Q) * BLOCK_Q
        for start_m in range(start_q, seqlen_q, BLOCK_Q):
            # the previous tile's readers of s_q, s_do, s_lse, s_delta are done
            cuda.syncthreads()
            for idx in range(tid, BLOCK_Q * HEAD_DIM, THREADS):
                ii = idx // HEAD_DIM
                col = idx - ii * HEAD_DIM
                qi = start_m + ii
                if qi < seqlen_q:
                    s_q[ii, col] = float32(q[b, qi, h, col])
                    s_do[ii, col] = float32(dout[b, qi, h, col])
                else:
                    s_q[ii, col] = float32(0.0)
                    s_do[ii, col] = float32(0.0)
            for ii in range(tid, BLOCK_Q, THREADS):
                qi = start_m + ii
                s_lse[ii] = lse[b, h, qi] if qi < seqlen_q else float32(0.0)
                s_delta[ii] = delta[b, h, qi] if qi < seqlen_q else float32(0.0)
            # the Q, dO, lse and delta tiles are in shared memory for every thread
            cuda.syncthreads()

            for ii in range(BLOCK_Q):
                qi = start_m + ii
                s = float32(0.0)
                dp = float32(0.0)
                for c in range(COLS):
                    s += s_q[ii, c * G + g] * k_reg[c]
                    dp += s_do[ii, c * G + g] * v_reg[c]
                off = G // 2
                while off > 0:  # butterfly: every lane of the group gets both sums
                    s += cuda.shfl_xor_sync(FULL_MASK, s, off)
                    dp += cuda.shfl_xor_sync(FULL_MASK, dp, off)
                    off //= 2
                visible = qi < seqlen_q and kj < seqlen_k
                if CAUSAL:
                    visible = visible and kj <= qi + diag
                p = math.exp(s - s_lse[ii]) if visible else float32(0.0)
                ds = p * (dp - s_delta[ii])
                for c in range(COLS):
                    dv_acc[c] += p * s_do[ii, c * G + g]
                    dk_acc[c] += ds * s_q[ii, c * G + g]

        if kj < seqlen_k:
            for c in range(COLS):
                dk[b, kj, h, c * G + g] = dk_acc[c] * scale
                dv[b, kj, h, c * G + g] = dv_acc[c]

    return simt_bwd_dkdv


@functools.lru_cache(maxsize=None)
def dq_kernel(t: SimtTiles, causal: bool):
    """``kernel[grid, THREADS, stream](q, k, v, dout, lse, delta, dq, softmax_scale)``."""
    G, COLS, THREADS = t.group, t.cols, t.threads
    BLOCK_N, HEAD_DIM = t.block_n, t.head_dim
    ROWS_PER_BLOCK = THREADS // G  # query rows per block
    CAUSAL = causal

    @cuda.jit
    def simt_bwd_dq(q, k, v, dout, lse, delta, dq, softmax_scale):
        start_m = cuda.blockIdx.x * ROWS_PER_BLOCK
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        g = tid % G
        qi = start_m + tid // G  # this group's query row
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q
        scale = float32(softmax_scale)

        s_k = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_v = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)

        q_reg = cuda.local.array(COLS, float32)
        do_reg = cuda.local.array(COLS, float32)
        dq_acc = cuda.local.array(COLS, float32)
        lse_i = float32(0.0)
        delta_i = float32(0.0)
        for c in range(COLS):
            dq_acc[c] = float32(0.0)
            if qi < seqlen_q:
                q_reg[c] = float32(q[b, qi, h, c * G + g]) * scale
                do_reg[c] = float32(dout[b, qi, h, c * G + g])
            else:
                q_reg[c] = float32(0.0)
                do_reg[c] = float32(0.0)
        if qi < seqlen_q:
            lse_i = lse[b, h, qi]
            delta_i = delta[b, h, qi]

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are skipped
            end_n = min(seqlen_k, max(0, start_m + ROWS_PER_BLOCK + diag))
        for start_n in range(0, end_n, BLOCK_N):
            # the previous tile's readers of s_k and s_v are done
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

            for jj in range(BLOCK_N):
                kj = start_n + jj
                s = float32(0.0)
                dp = float32(0.0)
                for c in range(COLS):
                    s += q_reg[c] * s_k[jj, c * G + g]
                    dp += do_reg[c] * s_v[jj, c * G + g]
                off = G // 2
                while off > 0:
                    s += cuda.shfl_xor_sync(FULL_MASK, s, off)
                    dp += cuda.shfl_xor_sync(FULL_MASK, dp, off)
                    off //= 2
                visible = qi < seqlen_q and kj < seqlen_k
                if CAUSAL:
                    visible = visible and kj <= qi + diag
                p = math.exp(s - lse_i) if visible else float32(0.0)
                ds = p * (dp - delta_i)
                for c in range(COLS):
                    dq_acc[c] += ds * s_k[jj, c * G + g]

        if qi < seqlen_q:
            for c in range(COLS):
                dq[b, qi, h, c * G + g] = dq_acc[c] * scale

    return simt_bwd_dq

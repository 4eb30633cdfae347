"""Exact fp32 FlashAttention backward on CUDA cores (SIMT): three kernels.

Math (P is recomputed from the saved log-sum-exp; nothing N×N is stored)::

    delta_i = Σ_c dO_ic · O_ic                       (preprocess, = rowsum(dO∘O))
    p_ij    = exp(scale · q_i·k_j − lse_i)           (0 where j is masked)
    dv_j    = Σ_i p_ij · dO_i
    dp_ij   = dO_i · v_j
    ds_ij   = p_ij · (dp_ij − delta_i)
    dk_j    = scale · Σ_i ds_ij · q_i
    dq_i    = scale · Σ_j ds_ij · k_j

Scores are recomputed exactly as the forward computed them: ``(scale·q_i) · k_j``, the
products summed per lane in column order and finished by the same butterfly, so P is
bitwise the forward's.  Masked scores become −inf (``mask.masked_score``) and a row's
lse comes through ``softmax.lse_for_recompute`` (+inf for rows past the end and rows
that saw no key): their P is exactly 0.

Kernels (THREADS = 128 threads a block; a group of G lanes owns one row and lane g
of it the columns c·G + g, as in the forward; see ``config.simt_backward_tiles``):

- ``preprocess``: grid (ceil(Nq / ROWS_PER_BLOCK), H, B); one group per query row
  writes delta (B, H, Nq) float32.
- ``dkdv``: grid (ceil(Nk / BLOCK_N), H, B); group ``grp`` owns key row
  ``start_n + grp`` and keeps k_j, v_j, dk_j, dv_j in registers while it walks the
  query tiles (BLOCK_M queries of scale·Q and dO staged in shared memory, with lse and
  delta).  With causal masking it starts at the first query tile that sees the block's
  first key.  Each (i, j) costs two dot products finished by shuffles, one exp and four
  COLS-long FMA chains; dK and dV are written once, by their owner: no atomics.
- ``dq``: grid (ceil(Nq / BLOCK_M), H, B); group ``grp`` owns query row
  ``start_m + grp`` (q_i, dO_i, dq_i in registers) and walks the key tiles (K and V in
  shared memory), stopping after the last tile it can see when causal.  dQ is written
  once by its owner: the result is bitwise the same run to run.

Shared memory: two tiles of 64, 32 or 16 rows of d fp32 (Q and dO, or K and V) plus
lse/delta: at most 32.5 KiB.
"""

from __future__ import annotations

import functools

from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import SimtTiles
from numba_flash.kernels import copy, dropout, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (group_steps, group_tile, key_tiles, query_tiles, this_block, tile_at,
                                            tile_partial, walk_list, walk_range)
from numba_flash.variant import DROPOUT, VARLEN, Variant


@functools.lru_cache(maxsize=None)
def simt_bwd_preprocess_kernel(t: SimtTiles):
    """``kernel[grid, THREADS, stream](out, dout, delta)``: delta = rowsum(dO∘O), a
    group of G lanes a query row."""
    G, COLS = t.group, t.lane_cols
    DD = t.data_dim or t.head_dim  # the arrays' head dim (columns past it are not read)

    @cuda.jit
    def simt_bwd_preprocess(out, dout, delta):
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        g = cuda.threadIdx.x % G
        row = cuda.blockIdx.x * (cuda.blockDim.x // G) + cuda.threadIdx.x // G
        acc = float32(0.0)
        if row < out.shape[1]:
            for c in range(COLS):
                if DD >= COLS * G or c * G + g < DD:
                    acc += float32(dout[b, row, h, c * G + g]) * float32(out[b, row, h, c * G + g])
        acc = softmax.allreduce_sum(acc, G)
        if row < out.shape[1] and g == 0:
            delta[b, h, row] = acc

    return simt_bwd_preprocess


@functools.lru_cache(maxsize=None)
def simt_bwd_dkdv_kernel(t: SimtTiles, variant: Variant):
    """``kernel[grid, THREADS, stream](q, k, v, dout, lse, delta, dk, dv, softmax_scale)``."""
    G, COLS, THREADS = t.group, t.lane_cols, t.threads
    BLOCK_M, BLOCK_N, HEAD_DIM = t.block_m, t.block_n, t.head_dim  # queries a tile, keys a block
    ROW_VALS = 2 * BLOCK_M
    F = variant.flags
    DD = t.data_dim or t.head_dim  # the arrays' head dim (columns past it: zero, never written)

    @cuda.jit
    def simt_bwd_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_n, b, h0, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_N, F, True)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_n >= seqlen_k:  # the grid covers the longest sequence
            return
        tid = cuda.threadIdx.x
        g = tid % G
        kj = start_n + tid // G  # this group's key row
        scale = float32(softmax_scale)

        s_q = cuda.shared.array((BLOCK_M, HEAD_DIM), float32)  # scale · Q, as the forward's q
        s_do = cuda.shared.array((BLOCK_M, HEAD_DIM), float32)
        s_rows = cuda.shared.array(ROW_VALS, float32)  # lse (for recompute) | delta

        k_reg = cuda.local.array(COLS, float32)
        v_reg = cuda.local.array(COLS, float32)
        dk_acc = cuda.local.array(COLS, float32)
        dv_acc = cuda.local.array(COLS, float32)
        pipeline.zero(dk_acc, COLS)
        pipeline.zero(dv_acc, COLS)
        copy.load_lane_row(k_reg, 0, k, b, k0 + kj, hk, k0 + seqlen_k, g, G, COLS, float32(1.0), DD)
        copy.load_lane_row(v_reg, 0, v, b, k0 + kj, hk, k0 + seqlen_k, g, G, COLS, float32(1.0), DD)

        m_lo, m_hi = query_tiles(start_n, BLOCK_M, BLOCK_N, mi)
        # GQA: the walk over query tiles once per query head of the group, in order (a
        # deterministic sum); load_rows_now's first barrier orders each tile after the last
        for it in range(group_steps(m_lo, m_hi, h0, start_n // BLOCK_N, fx, seq, params, F)):
            h, i, partial = group_tile(it, m_lo, m_hi, h0, start_n // BLOCK_N, fx, seq, F)
            si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)
            start_m = i * BLOCK_M
            # scale·Q, dO, lse and delta of the tile, between barriers
            pipeline.load_rows_now(s_q, q, s_do, dout, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, HEAD_DIM,
                                   THREADS, scale, s_rows, lse, delta, True, DD)  # fmt: skip

            for ii in range(BLOCK_M):
                s = float32(0.0)
                dp = float32(0.0)
                for c in range(COLS):
                    s += s_q[ii, c * G + g] * k_reg[c]
                    dp += s_do[ii, c * G + g] * v_reg[c]
                x, dx = score.prescaled(softmax.allreduce_sum(s, G), si, F)
                x, dm = score.index_step(x, start_m + ii, kj, mi[2], True, partial, si, mi, True, F)
                dx *= dm
                zf = dropout.kept_scale(start_m + ii, kj, di) if F[DROPOUT] else float32(1.0)
                p, ds = softmax.softmax_grad(x, softmax.allreduce_sum(dp, G) * zf, s_rows[ii], s_rows[BLOCK_M + ii],
                                             start_m + ii < seqlen_q, False)  # fmt: skip
                p *= zf  # dV takes P ∘ Z / (1 − p)
                ds *= dx
                for c in range(COLS):
                    dv_acc[c] += p * s_do[ii, c * G + g]
                    dk_acc[c] += ds * s_q[ii, c * G + g]  # dK = Σ ds · (scale · q)

        if kj < seqlen_k:
            for c in range(COLS):
                if DD >= COLS * G or c * G + g < DD:
                    dk[b, k0 + kj, hk, c * G + g] = dk_acc[c]
                    dv[b, k0 + kj, hk, c * G + g] = dv_acc[c]

    return simt_bwd_dkdv


@functools.lru_cache(maxsize=None)
def simt_bwd_dq_kernel(t: SimtTiles, variant: Variant):
    """``kernel[grid, THREADS, stream](q, k, v, dout, lse, delta, dq, softmax_scale)``."""
    G, COLS, THREADS = t.group, t.lane_cols, t.threads
    BLOCK_M, BLOCK_N, HEAD_DIM = t.block_m, t.block_n, t.head_dim  # queries a block, keys a tile
    F = variant.flags
    DD = t.data_dim or t.head_dim  # the arrays' head dim (columns past it: zero, never written)

    @cuda.jit
    def simt_bwd_dq(q, k, v, dout, lse, delta, dq, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid = cuda.threadIdx.x
        g = tid % G
        qi = start_m + tid // G  # this group's query row
        scale = float32(softmax_scale)
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)

        s_k = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)
        s_v = cuda.shared.array((BLOCK_N, HEAD_DIM), float32)

        q_reg = cuda.local.array(COLS, float32)
        do_reg = cuda.local.array(COLS, float32)
        dq_acc = cuda.local.array(COLS, float32)
        pipeline.zero(dq_acc, COLS)
        copy.load_lane_row(q_reg, 0, q, b, q0 + qi, h, q0 + seqlen_q, g, G, COLS, scale, DD)  # scale · q, as the forward
        copy.load_lane_row(do_reg, 0, dout, b, q0 + qi, h, q0 + seqlen_q, g, G, COLS, float32(1.0), DD)
        lse_i, delta_i = softmax.row_stats(lse, delta, b, h, q0 + qi, q0 + seqlen_q, False)

        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)  # a block mask's list, or the range
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        for j in range(n_lo, n_hi):
            start_n = tile_at(j, vr, F) * BLOCK_N
            partial = tile_partial(j, vr, F)
            # K and V of the tile, between barriers
            pipeline.load_rows_now(s_k, k, s_v, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, HEAD_DIM, THREADS,
                                   float32(1.0), dq_acc, lse, delta, False, DD)  # fmt: skip

            for jj in range(BLOCK_N):
                s = float32(0.0)
                dp = float32(0.0)
                for c in range(COLS):
                    s += q_reg[c] * s_k[jj, c * G + g]
                    dp += do_reg[c] * s_v[jj, c * G + g]
                x, dx = score.prescaled(softmax.allreduce_sum(s, G), si, F)
                x, dm = score.index_step(x, qi, start_n + jj, mi[2], True, partial, si, mi, True, F)
                dx *= dm
                zf = dropout.kept_scale(qi, start_n + jj, di) if F[DROPOUT] else float32(1.0)
                _, ds = softmax.softmax_grad(x, softmax.allreduce_sum(dp, G) * zf, lse_i, delta_i, True, False)
                ds *= dx
                for c in range(COLS):
                    dq_acc[c] += ds * s_k[jj, c * G + g]

        if qi < seqlen_q:
            for c in range(COLS):
                if DD >= COLS * G or c * G + g < DD:
                    dq[b, q0 + qi, h, c * G + g] = dq_acc[c] * scale

    return simt_bwd_dq


def launches(tiles: tuple, variant: Variant, sz: spec.Sizes) -> list:
    """The backward for (dK/dV tiles, dQ tiles): preprocess and dQ a block per
    ``block_m`` queries, dK/dV a block per ``block_n`` keys; static shared memory."""
    hf = variant.heaviest_first  # grid order (spec.query_grid)
    tkv, tq = tiles
    return [
        spec.KernelLaunch("simt_bwd_preprocess", simt_bwd_preprocess_kernel(tq), tq,
                          spec.preprocess_grid(sz, tq.block_m), tq.threads, 0, spec.preprocess_args()),
        spec.KernelLaunch("simt_bwd_dkdv", simt_bwd_dkdv_kernel(tkv, variant), tkv, spec.key_grid(sz, tkv.block_n, hf),
                          tkv.threads, 0, spec.dkdv_args(), (tkv.block_m, tkv.block_n, True)),
        spec.KernelLaunch("simt_bwd_dq", simt_bwd_dq_kernel(tq, variant), tq, spec.query_grid(sz, tq.block_m, hf),
                          tq.threads, 0, spec.dq_args(), (tq.block_m, tq.block_n, False)),
    ]  # fmt: skip

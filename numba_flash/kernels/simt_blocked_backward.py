"""Exact fp32 FlashAttention backward, register-blocked like an SGEMM (CUDA cores).

Math (P is recomputed from the saved log-sum-exp; nothing N×N is stored)::

    delta_i = Σ_c dO_ic · O_ic              (``preprocess``: in dP's summation order)
    p_ij    = exp(scale · q_i·k_j − lse_i)  (0 where key j is masked for query i)
    dv_j    = Σ_i p_ij · dO_i
    dp_ij   = dO_i · v_j
    ds_ij   = p_ij · (dp_ij − delta_i)
    dk_j    = scale · Σ_i ds_ij · q_i
    dq_i    = scale · Σ_j ds_ij · k_j

IEEE fp32 throughout.  dQ is computed by its own kernel (no atomics), so the result is
bitwise the same run to run.  Causal masking is bottom-right aligned (query i sees key j
iff j <= i + Nk − Nq); tiles that no query/key pair of the block can see are skipped.

Both kernels use ``config.BlockedTiles`` t (the forward's scheme, see
``simt_blocked_forward``): a block of TX·TY threads; thread (ty, tx) = (tid // TX,
tid % TX) owns a TM × TN register micro-tile of a score-shaped matrix — rows
``ty + r·TY``, columns ``tx + c·TX``, interleaved so that 16-byte shared loads of
neighbouring lanes fall on different banks — and a TM × d/TX slice of its
accumulators (columns ``4·tx + 4·TX·o + e``).

``dkdv``: grid (ceil(Nk / BLOCK_N), H, B) with BLOCK_N = t.rows keys a block; rows are
the block's keys (K, V resident in shared memory, dK and dV in registers), columns the
BLOCK_M = t.cols queries of a Q/dO tile:
    1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ on the micro-tile: per 4 head-dim columns, TM + TM
       loads of K and V rows, TN + TN of Q and dO rows, 8·TM·TN FMAs;
    2. Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ∘(dPᵀ − delta) in registers, then stored
       as Pᵀ[query][thread-ordered keys] (16-byte stores) for step 3;
    3. per query i: dV += Pᵀ[:, i] ⊗ dO_i and dK += dSᵀ[:, i] ⊗ q_i — TM/4 loads of
       P and of dS (broadcast over the TX lanes), d/(4·TX) loads of dO_i and of q_i.
``dq``: grid (ceil(Nq / BLOCK_M), H, B) with BLOCK_M = t.rows queries a block (Q, dO
resident, lse and delta in registers, dQ in registers), columns the BLOCK_N = t.cols
keys of a K/V tile:
S = Q·Kᵀ, dP = dO·Vᵀ, dS = P∘(dP − delta) → dSᵀ to shared memory → dQ += dS·K.

Masking and P: ``microtile.scale_and_mask`` on the tiles ``block_info.tile_needs_mask``
names, rows' lse through ``softmax.lse_for_recompute`` (+inf past the end and for rows
that saw no key), ``softmax.softmax_grad`` for P and dS.

Shared memory (fp32, one dynamic array; ``dkdv_smem_bytes`` / ``dq_smem_bytes``): rows of d floats read by neighbouring threads as
"columns" are padded to d + 4 (rows i and i+1 are 4 banks apart); thread-ordered
P/dS rows (TY·TM floats, padded by 4 so that the rows stored by neighbouring lanes are
4 banks apart).  dkdv: K, V (BLOCK_N rows), Q, dO, Pᵀ, dSᵀ (BLOCK_M rows), lse and delta
(BLOCK_M); dq: Q, dO (BLOCK_M rows), K, V, dSᵀ (BLOCK_N rows).  Copies from global memory are 16-byte cp.async (rows past the
end zero-filled), so q, k, v, dO rows must be 16-byte aligned.
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import BlockedTiles
from numba_flash.kernels import copy, dropout, microtile, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (group_steps, group_tile, key_tiles, query_tiles, this_block, tile_at,
                                            tile_partial, walk_list, walk_range)
from numba_flash.variant import DROPOUT, SCORE_MOD, SOFTCAP, VARLEN, Variant

PRE_THREADS = 128  # preprocess: one query row a thread


def _layout(t: BlockedTiles):
    """(padded row of d floats, a P/dS row: the block's rows in thread order + 4), in floats."""
    return t.head_dim + 4, t.rows + 4


def _shape(t: BlockedTiles):
    """(d, TM, TN, TX, TY, threads, output columns a thread, 16-byte chunks a row, the
    padded row and the P/dS row in floats): what both kernels are compiled from."""
    return (t.head_dim, t.tm, t.tn, t.tx, t.ty, t.threads, t.head_dim // t.tx, t.head_dim // 4) + _layout(t)


def _regions(*sizes):
    """Offsets of consecutive regions of the given sizes, then their total."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += n
    return tuple(offsets) + (at,)


def _dkdv_layout(t: BlockedTiles):
    """Float offsets of K, V (block rows = keys), Q, dO, Pᵀ, dSᵀ (tile rows = queries),
    lse, delta in the dK/dV kernel's shared array, and its size."""
    rs, ps = _layout(t)
    return _regions(t.rows * rs, t.rows * rs, t.cols * rs, t.cols * rs, t.cols * ps, t.cols * ps, t.cols, t.cols)


def _dq_layout(t: BlockedTiles):
    """Float offsets of Q, dO (block rows = queries), K, V, dSᵀ (tile rows = keys) in the
    dQ kernel's shared array, and its size."""
    rs, ps = _layout(t)
    return _regions(t.rows * rs, t.rows * rs, t.cols * rs, t.cols * rs, t.cols * ps)


def dkdv_smem_bytes(t: BlockedTiles) -> int:
    return 4 * _dkdv_layout(t)[-1]


def dq_smem_bytes(t: BlockedTiles) -> int:
    return 4 * _dq_layout(t)[-1]


@functools.lru_cache(maxsize=None)
def simt_blocked_preprocess_kernel(head_dim: int):
    """``kernel[(ceil(Nq / 128), H, B), 128, stream](out, dout, delta)``: delta = rowsum(dO∘O).

    One thread a row, summing ``dO_c · O_c`` for c = 0, 1, ..., d−1 in one FMA chain:
    the order in which the dK/dV and dQ kernels accumulate dP = dO·v.  So where O is
    exactly v (a query that sees one key), dP − delta is exactly 0, as in exact
    arithmetic, instead of a rounding residue."""
    D = head_dim

    @cuda.jit
    def simt_blocked_preprocess(out, dout, delta):
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        row = cuda.blockIdx.x * PRE_THREADS + cuda.threadIdx.x
        if row < out.shape[1]:
            acc = float32(0.0)
            for c in range(D):
                acc += dout[b, row, h, c] * out[b, row, h, c]
            delta[b, h, row] = acc

    return simt_blocked_preprocess


@functools.lru_cache(maxsize=None)
def simt_blocked_dkdv_kernel(t: BlockedTiles, variant: Variant):
    """``kernel[grid, t.threads, stream, smem](q, k, v, dout, lse, delta, dk, dv, scale)``."""
    D, TM, TN, TX, TY, THREADS, OC, DC, RS, PS = _shape(t)
    BLOCK_N, BLOCK_M = t.rows, t.cols  # keys a block, queries a tile
    K_OFF, V_OFF, Q_OFF, DO_OFF, P_OFF, DS_OFF, LSE_OFF, DELTA_OFF, _ = _dkdv_layout(t)
    S_N, ACC_N, SCRATCH = TM * TN, TM * OC, TN * 4
    F = variant.flags
    DX_N = S_N if variant.score_grad else 1

    @cuda.jit
    def simt_blocked_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale, params, alibi, cu_q, cu_k, fx):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_n, b, h0, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_N, F, True)  # this block's keys
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_n >= seqlen_k:  # the grid covers the longest sequence
            return
        scale = float32(softmax_scale)

        s = cuda.local.array(S_N, float32)  # Sᵀ, then Pᵀ
        dx = cuda.local.array(DX_N, float32)  # softcap, score_mod: ∂score/∂(scale·s) of the micro-tile
        dp = cuda.local.array(S_N, float32)  # dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(ACC_N, float32)
        acc_dv = cuda.local.array(ACC_N, float32)
        qf = cuda.local.array(SCRATCH, float32)  # scratch of the micro-tile steps
        pf = cuda.local.array(TM, float32)
        of = cuda.local.array(OC, float32)
        pipeline.zero(acc_dk, ACC_N)
        pipeline.zero(acc_dv, ACC_N)

        # K and V stay for the whole block (rows past the end of k / v zero-filled)
        copy.copy_tile_pair(base + 4 * K_OFF, k, base + 4 * V_OFF, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N,
                            DC, 4, 4 * RS, copy.SW_NONE, THREADS, True)  # fmt: skip
        ptx.cp_async_commit()

        m_lo, m_hi = query_tiles(start_n, BLOCK_M, BLOCK_N, mi)
        # GQA: the walk over query tiles once per query head of the group, in order (a
        # deterministic sum); load_tiles_now's first barrier orders each tile after the last
        for it in range(group_steps(m_lo, m_hi, h0, start_n // BLOCK_N, fx, seq, params, F)):
            h, i, partial = group_tile(it, m_lo, m_hi, h0, start_n // BLOCK_N, fx, seq, F)
            si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)
            start_m = i * BLOCK_M
            # Q, dO, lse and delta of the tile (after every thread is done with the last one's)
            pipeline.load_tiles_now(base + 4 * Q_OFF, q, base + 4 * DO_OFF, dout, b, h, q0 + start_m, q0 + seqlen_q, tid,
                                    BLOCK_M, DC, 4 * RS, THREADS, smem, LSE_OFF, DELTA_OFF, lse, delta, True)  # fmt: skip

            # 1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ; Sᵀ scaled and masked
            rows_k, rows_q = base + 4 * (ty * RS), base + 4 * (tx * RS)
            microtile.scores_and_dp(s, rows_k + 4 * K_OFF, rows_q + 4 * Q_OFF, dp, rows_k + 4 * V_OFF,
                                    rows_q + 4 * DO_OFF, 4 * TY * RS, 4 * TX * RS, D, TM, TN, qf, start_m, BLOCK_M,
                                    start_n, BLOCK_N, start_n + ty, TY, start_m + tx, TX, si, mi, True, dx, partial,
                                    F)  # fmt: skip

            # 2. Pᵀ and dSᵀ, stored [query][thread-ordered keys]
            for c in range(TN):
                col = tx + c * TX  # a query of the tile: past the last one it is padding
                for r in range(TM):
                    zf = dropout.kept_scale(start_m + col, start_n + ty + r * TY, di) if F[DROPOUT] else float32(1.0)
                    p, ds = softmax.softmax_grad(
                        s[r * TN + c], dp[r * TN + c] * zf, smem[LSE_OFF + col], smem[DELTA_OFF + col],
                        start_m + col < seqlen_q, False,
                    )  # fmt: skip
                    s[r * TN + c], dp[r * TN + c] = p * zf, ds  # dV takes P ∘ Z / (1 − p)
                    if F[SOFTCAP] or F[SCORE_MOD]:
                        dp[r * TN + c] *= dx[r * TN + c]
            microtile.store_transposed(base + 4 * (P_OFF + tx * PS + ty * TM), 4 * TX * PS, s, TM, TN)
            microtile.store_transposed(base + 4 * (DS_OFF + tx * PS + ty * TM), 4 * TX * PS, dp, TM, TN)
            # Pᵀ and dSᵀ are visible to every thread
            cuda.syncthreads()

            # 3. dV += Pᵀ·dO, dK += dSᵀ·Q
            cols = base + 4 * (ty * TM)
            microtile.outer_accumulate(acc_dv, cols + 4 * P_OFF, 4 * PS, base + 4 * (DO_OFF + 4 * tx), 4 * RS, 16 * TX,
                                       BLOCK_M, TM, OC, pf, of)  # fmt: skip
            microtile.outer_accumulate(acc_dk, cols + 4 * DS_OFF, 4 * PS, base + 4 * (Q_OFF + 4 * tx), 4 * RS, 16 * TX,
                                       BLOCK_M, TM, OC, pf, of)  # fmt: skip
        ptx.cp_async_wait_all()  # no copy outlives the block (no query tile: K and V's)

        for r in range(TM):
            key = start_n + ty + r * TY
            if key < seqlen_k:
                microtile.store_row(dk, b, k0 + key, hk, acc_dk, r, tx, TX, OC, scale)
                microtile.store_row(dv, b, k0 + key, hk, acc_dv, r, tx, TX, OC, float32(1.0))

    return simt_blocked_dkdv


@functools.lru_cache(maxsize=None)
def simt_blocked_dq_kernel(t: BlockedTiles, variant: Variant):
    """``kernel[grid, t.threads, stream, smem](q, k, v, dout, lse, delta, dq, scale)``."""
    D, TM, TN, TX, TY, THREADS, OC, DC, RS, PS = _shape(t)
    BLOCK_M, BLOCK_N = t.rows, t.cols  # queries a block, keys a tile
    Q_OFF, DO_OFF, K_OFF, V_OFF, DS_OFF, _ = _dq_layout(t)
    S_N, ACC_N, SCRATCH = TM * TN, TM * OC, TN * 4
    F = variant.flags
    DX_N = S_N if variant.score_grad else 1

    @cuda.jit
    def simt_blocked_dq(q, k, v, dout, lse, delta, dq, softmax_scale, params, alibi, cu_q, cu_k, fx):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)  # this block's queries
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        scale = float32(softmax_scale)
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)

        s = cuda.local.array(S_N, float32)  # S, then P
        dx = cuda.local.array(DX_N, float32)  # softcap, score_mod: ∂score/∂(scale·s) of the micro-tile
        dp = cuda.local.array(S_N, float32)  # dP, then dS
        acc = cuda.local.array(ACC_N, float32)
        lse_r = cuda.local.array(TM, float32)
        delta_r = cuda.local.array(TM, float32)
        kf = cuda.local.array(SCRATCH, float32)  # scratch of the micro-tile steps
        dsf = cuda.local.array(TM, float32)
        xf = cuda.local.array(OC, float32)
        pipeline.zero(acc, ACC_N)
        for r in range(TM):
            lse_r[r], delta_r[r] = softmax.row_stats(lse, delta, b, h, q0 + start_m + ty + r * TY, q0 + seqlen_q, False)

        # Q and dO stay for the whole block
        copy.copy_tile_pair(base + 4 * Q_OFF, q, base + 4 * DO_OFF, dout, b, h, q0 + start_m, q0 + seqlen_q, tid,
                            BLOCK_M, DC, 4, 4 * RS, copy.SW_NONE, THREADS, True)  # fmt: skip
        ptx.cp_async_commit()

        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)  # a block mask's list, or the range
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        for j in range(n_lo, n_hi):
            start_n = tile_at(j, vr, F) * BLOCK_N
            # K and V of the tile (after every thread is done with the last one's K, V, dSᵀ)
            pipeline.load_tiles_now(base + 4 * K_OFF, k, base + 4 * V_OFF, v, b, hk, k0 + start_n, k0 + seqlen_k, tid,
                                    BLOCK_N, DC, 4 * RS, THREADS, smem, 0, 0, lse, delta, False)  # fmt: skip

            # S = Q·Kᵀ (scaled and masked) and dP = dO·Vᵀ
            rows_q, rows_k = base + 4 * (ty * RS), base + 4 * (tx * RS)
            microtile.scores_and_dp(s, rows_q + 4 * Q_OFF, rows_k + 4 * K_OFF, dp, rows_q + 4 * DO_OFF,
                                    rows_k + 4 * V_OFF, 4 * TY * RS, 4 * TX * RS, D, TM, TN, kf, start_m, BLOCK_M,
                                    start_n, BLOCK_N, start_m + ty, TY, start_n + tx, TX, si, mi, False, dx,
                                    tile_partial(j, vr, F), F)  # fmt: skip

            # dS = P∘(dP − delta), stored as dSᵀ[key][thread-ordered queries]
            for r in range(TM):
                for c in range(TN):
                    zf = dropout.kept_scale(start_m + ty + r * TY, start_n + tx + c * TX, di) if F[DROPOUT] else \
                        float32(1.0)
                    _, dp[r * TN + c] = softmax.softmax_grad(s[r * TN + c], dp[r * TN + c] * zf, lse_r[r], delta_r[r],
                                                             True, False)  # fmt: skip
                    if F[SOFTCAP] or F[SCORE_MOD]:
                        dp[r * TN + c] *= dx[r * TN + c]
            microtile.store_transposed(base + 4 * (DS_OFF + tx * PS + ty * TM), 4 * TX * PS, dp, TM, TN)
            # dSᵀ is visible to every thread
            cuda.syncthreads()

            # dQ += dS·K
            microtile.outer_accumulate(acc, base + 4 * (DS_OFF + ty * TM), 4 * PS, base + 4 * (K_OFF + 4 * tx), 4 * RS,
                                       16 * TX, BLOCK_N, TM, OC, dsf, xf)  # fmt: skip
        ptx.cp_async_wait_all()  # no copy outlives the block (no key tile: Q and dO's)

        for r in range(TM):
            row = start_m + ty + r * TY
            if row < seqlen_q:
                microtile.store_row(dq, b, q0 + row, h, acc, r, tx, TX, OC, scale)

    return simt_blocked_dq


def preprocess_launch(t, head_dim: int, sz: spec.Sizes) -> spec.KernelLaunch:
    """The exact fp32 preprocess, one thread a query row (also the TF32 backward's)."""
    grid = spec.preprocess_grid(sz, PRE_THREADS)
    kernel = simt_blocked_preprocess_kernel(head_dim)
    return spec.KernelLaunch("simt_blocked_preprocess", kernel, t, grid, PRE_THREADS, 0, spec.preprocess_args())


def launches(tiles: tuple, variant: Variant, sz: spec.Sizes) -> list:
    """The backward for (dK/dV tiles, dQ tiles): preprocess, dK/dV (a block per
    ``rows`` keys), dQ (a block per ``rows`` queries)."""
    hf = variant.heaviest_first  # grid order (spec.query_grid)
    tkv, tq = tiles
    return [
        preprocess_launch(tkv, tkv.head_dim, sz),
        spec.KernelLaunch("simt_blocked_dkdv", simt_blocked_dkdv_kernel(tkv, variant), tkv, spec.key_grid(sz, tkv.rows, hf),
                          tkv.threads, dkdv_smem_bytes(tkv), spec.dkdv_args(), (tkv.cols, tkv.rows, True)),
        spec.KernelLaunch("simt_blocked_dq", simt_blocked_dq_kernel(tq, variant), tq, spec.query_grid(sz, tq.rows, hf),
                          tq.threads, dq_smem_bytes(tq), spec.dq_args(), (tq.rows, tq.cols, False)),
    ]  # fmt: skip

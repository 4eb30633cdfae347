"""Exact fp32 FlashAttention forward, register-blocked like an SGEMM (CUDA cores).

Math (one query row i, keys j visible to it; ``scale`` = softmax_scale)::

    s_ij  = scale · (q_i · k_j)
    m_i   = max_j s_ij                  running max, grown tile by tile
    l_i   = Σ_j exp(s_ij − m_i)         running sum, rescaled by exp(m_old − m_new)
    acc_i = Σ_j exp(s_ij − m_i) · v_j   likewise rescaled
    o_i   = acc_i / l_i,   lse_i = m_i + log(l_i)

IEEE fp32 throughout (FMA, ``expf``, ``logf``): no TF32, no fast-math.  A row that sees
no key gets o_i = 0 and lse_i = −inf; causal masking is bottom-right aligned (query i
sees key j iff j <= i + Nk − Nq), as in the other kernels.

Grid and threads (``config.BlockedTiles`` t: BLOCK_M = t.rows queries, BLOCK_N =
t.cols keys, TM × TN micro-tile, TX = BLOCK_N/TN, TY = BLOCK_M/TM, threads = TX·TY;
the micro-tile steps are ``kernels.microtile``'s):
    grid = (ceil(Nq / BLOCK_M), H, B).  Thread tid is (ty, tx) = (tid // TX, tid % TX); it owns
    query rows ``start_m + ty + r·TY`` (r < TM) and, in each key tile, keys
    ``start_n + tx + c·TX`` (c < TN): a TM × TN block of S in registers.  For P·V it
    owns the same rows and the output columns ``4·tx + 4·TX·o + e`` (o < d/(4·TX),
    e < 4): a TM × d/TX block of acc in registers.  So m_i, l_i and the rescaling
    of acc are private to the thread; only the row max and the final row sum are
    finished across the TX lanes of a row (consecutive lanes, ``shfl_xor``).

Per key tile:
    1. S = Q·Kᵀ: for every 4 columns of the head dimension, one 16-byte shared load
       per owned row of Q and per owned key of K (``ld.shared.v4``), then TM·TN·4
       FMAs (load:FMA = (TM+TN) : 4·TM·TN = 1:10.7 for 8 × 4);
    2. online softmax on the micro-tile (mask, row max, ``exp``, rescale acc);
    3. P goes to shared memory as Pᵀ[key][thread-ordered rows] (16-byte stores), so
       that each thread reads its TM probabilities of key j as TM/4 vectors;
    4. acc += P·V: per key, TM/4 loads of P (a broadcast across the TX lanes) and
       d/(4·TX) 16-byte loads of V, then TM·d/TX FMAs.
    K_{t+1} is copied (cp.async) while P·V of tile t runs, V_{t+1} while S of tile
    t+1 runs: each buffer is refilled as soon as its last reader is done.

Shared memory (fp32, one dynamic array; ``smem_bytes``):
    Q  BLOCK_M × (d+4)  rows padded by 4 floats: the two ty of a warp read rows i and
                        i+1, 4 banks apart, so their 16-byte loads do not collide
    K  BLOCK_N × (d+4)  the same for keys tx and tx+1
    V  BLOCK_N × d      a row is read by 16-byte vectors of consecutive lanes: no padding
    Pᵀ BLOCK_N × (BLOCK_M+4)
    128 × 64 tiles: 164 KiB at d = 128 (1 block an SM), 100 KiB at d = 64 (2).
Loads from global memory are 16-byte cp.async copies, so q, k, v rows must be 16-byte
aligned (``_arrays.aligned16``; otherwise the API runs ``simt_forward``).
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import BlockedTiles
from numba_flash.kernels import copy, microtile, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (key_tiles, kv_pages, no_pages, this_block, tile_at, tile_needs_mask,
                                           tile_partial, walk_list, walk_range)
from numba_flash.variant import DROPOUT, VARLEN, Variant


def _layout(t: BlockedTiles):
    """Float offsets of Q | K | V | Pᵀ in the dynamic array, and the padded row strides."""
    D, BLOCK_M, BLOCK_N = t.head_dim, t.rows, t.cols
    QS, KS, PS = D + 4, D + 4, BLOCK_M + 4
    K_OFF = BLOCK_M * QS
    V_OFF = K_OFF + BLOCK_N * KS
    P_OFF = V_OFF + BLOCK_N * D
    return QS, KS, PS, K_OFF, V_OFF, P_OFF, P_OFF + BLOCK_N * PS


def smem_bytes(t: BlockedTiles) -> int:
    """Q (block_m rows) and K (block_n rows) padded by 4 floats a row (16-byte reads of
    rows i and i+1 fall on different banks), V unpadded, Pᵀ (block_n × (block_m + 4))."""
    return 4 * _layout(t)[-1]


@functools.lru_cache(maxsize=None)
def simt_blocked_forward_kernel(t: BlockedTiles, variant: Variant):
    """The forward kernel for tiles ``t``.

    Signature: ``kernel[grid, t.threads, stream, smem](q, k, v, out, lse, softmax_scale)``
    with q (B, Nq, H, d), k and v (B, Nk, H, d) float32, out like q, lse (B, H, Nq).
    """
    D, BLOCK_M, BLOCK_N, TM, TN = t.head_dim, t.rows, t.cols, t.tm, t.tn
    TX, TY, THREADS = t.tx, t.ty, t.threads
    OC = D // TX  # output columns per thread
    DC = D // 4  # 16-byte chunks in a row
    QS, KS, PS, K_OFF, V_OFF, P_OFF, _ = _layout(t)
    S_N, ACC_N, SCRATCH = TM * TN, TM * OC, TN * 4  # register array sizes
    F = variant.flags

    pages = kv_pages if variant.paged else no_pages  # a KV cache's keys through its block table

    @cuda.jit
    def simt_blocked_forward(q, k, v, out, lse, softmax_scale, params, alibi, cu_q, cu_k, fx):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)  # byte address of smem[0]
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, False, F)
        pg = pages(fx, seq)
        # this thread's shared-memory byte addresses, computed once: the inner loops add
        # only compile-time strides and the loop offset
        q_addr = base + 4 * (ty * QS)
        k_addr = base + 4 * (K_OFF + tx * KS)
        p_addr = base + 4 * (P_OFF + ty * TM)
        v_addr = base + 4 * (V_OFF + 4 * tx)

        s = cuda.local.array(S_N, float32)  # the S / P micro-tile
        acc = cuda.local.array(ACC_N, float32)
        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)  # this thread's part of the row sum
        kf = cuda.local.array(SCRATCH, float32)  # scratch of the micro-tile steps
        pf = cuda.local.array(TM, float32)
        vf = cuda.local.array(OC, float32)
        for r in range(TM):
            m_i[r] = softmax.NEG_INF
            l_i[r] = float32(0.0)
        pipeline.zero(acc, ACC_N)

        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)  # a block mask's list, or the range
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        # prologue: Q with K_0 in one cp.async group, V_0 in the next; rows past the
        # end of q / k / v are zero-filled (their scores are masked or never written)
        copy.copy_tile(base, q, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, DC, 4, 4 * QS, copy.SW_NONE, THREADS, True)
        if n_hi > n_lo:
            copy.copy_tile(base + 4 * K_OFF, k, b, hk, k0 + tile_at(n_lo, vr, F) * BLOCK_N, k0 + seqlen_k, tid, BLOCK_N, DC, 4,
                           4 * KS, copy.SW_NONE, THREADS, True, 0, False, pg)  # fmt: skip
        ptx.cp_async_commit()
        if n_hi > n_lo:
            copy.copy_tile(base + 4 * V_OFF, v, b, hk, k0 + tile_at(n_lo, vr, F) * BLOCK_N, k0 + seqlen_k, tid, BLOCK_N, DC, 4,
                           4 * D, copy.SW_NONE, THREADS, True, 0, False, pg)  # fmt: skip
        ptx.cp_async_commit()

        for j in range(n_lo, n_hi):
            start_n = tile_at(j, vr, F) * BLOCK_N
            has_next = j + 1 < n_hi
            next_n = tile_at(j + 1, vr, F) * BLOCK_N if has_next else start_n
            ptx.cp_async_wait_group(1)  # Q and K_j have landed (V_j may be in flight)
            # K_j (and Q) written by every thread's copies are visible to all
            cuda.syncthreads()

            # 1. S = Q·Kᵀ on the micro-tile, scaled and masked
            pipeline.zero(s, S_N)
            microtile.dot_tile(s, q_addr, 4 * TY * QS, k_addr, 4 * TX * KS, D, TM, TN, kf)
            needs_mask = tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi)
            microtile.scale_and_mask(s, TM, TN, start_m + ty, TY, start_n + tx, TX, si, needs_mask,
                                     tile_partial(j, vr, F), mi, False, None, F)

            # 2. online softmax on the micro-tile: row max over the TX lanes of a row
            for r in range(TM):
                softmax.online_softmax_row(s, r * TN, 1, TN, 1, acc, r * OC, 1, OC, 1, m_i, l_i, r, TX, False)
            if F[DROPOUT]:  # P·V takes P ∘ Z / (1 − p); l_i kept the undropped P
                microtile.apply_dropout(s, TM, TN, start_m + ty, TY, start_n + tx, TX, di)

            # 3. Pᵀ to shared memory: key tx + c·TX, this thread's rows in order
            microtile.store_transposed(p_addr + 4 * tx * PS, 4 * TX * PS, s, TM, TN)
            # every thread is done reading K_j, and Pᵀ is visible to all
            cuda.syncthreads()
            if has_next:  # K_{j+1} streams in during P·V
                copy.copy_tile(base + 4 * K_OFF, k, b, hk, k0 + next_n, k0 + seqlen_k, tid, BLOCK_N, DC,
                               4, 4 * KS, copy.SW_NONE, THREADS, True, 0, False, pg)  # fmt: skip
                ptx.cp_async_commit()
                ptx.cp_async_wait_group(1)  # V_j has landed (K_{j+1} may be in flight)
            else:
                ptx.cp_async_wait_group(0)
            # V_j written by every thread's copies is visible to all
            cuda.syncthreads()

            # 4. acc += P·V
            microtile.outer_accumulate(acc, p_addr, 4 * PS, v_addr, 4 * D, 16 * TX, BLOCK_N, TM, OC, pf, vf)
            # every thread is done reading V_j and Pᵀ
            cuda.syncthreads()
            if has_next:  # V_{j+1} streams in during S of the next tile
                copy.copy_tile(base + 4 * V_OFF, v, b, hk, k0 + next_n, k0 + seqlen_k, tid, BLOCK_N, DC,
                               4, 4 * D, copy.SW_NONE, THREADS, True, 0, False, pg)  # fmt: skip
                ptx.cp_async_commit()
        ptx.cp_async_wait_all()  # no copy outlives the block (no key tile: Q's)

        # epilogue: the row sum over the TX lanes; o = acc / l, lse = m + log(l)
        for r in range(TM):
            inv_l, lse_row = softmax.finalize(m_i[r], l_i[r], TX, False)
            row = start_m + ty + r * TY
            if row < seqlen_q:
                microtile.store_row(out, b, q0 + row, h, acc, r, tx, TX, OC, inv_l)
                if tx == 0:
                    lse[b, h, q0 + row] = lse_row

    return simt_blocked_forward


def launches(t: BlockedTiles, variant: Variant, sz: spec.Sizes) -> list:
    """The forward: one kernel, a block per ``t.rows`` queries of a (batch, head)."""
    grid = spec.query_grid(sz, t.rows, variant.heaviest_first)
    kernel = simt_blocked_forward_kernel(t, variant)
    return [spec.KernelLaunch("simt_blocked_forward", kernel, t, grid, t.threads, smem_bytes(t), spec.forward_args(),
                              (t.rows, t.cols, False))]

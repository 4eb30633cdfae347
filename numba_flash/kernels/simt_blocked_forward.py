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

Grid and threads (``config.BlockedTiles`` t: BM = block_m, BN = block_n, TM × TN
micro-tile, TX = BN/TN, TY = BM/TM, threads = TX·TY):
    grid = (ceil(Nq / BM), H, B).  Thread tid is (ty, tx) = (tid // TX, tid % TX); it owns
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

Shared memory (fp32, one dynamic array; ``config.blocked_forward_smem_bytes``):
    Q  BM × (d+4)   rows padded by 4 floats: the two ty of a warp read rows i and
                    i+1, 4 banks apart, so their 16-byte loads do not collide
    K  BN × (d+4)   the same for keys tx and tx+1
    V  BN × d       a row is read by 16-byte vectors of consecutive lanes: no padding
    Pᵀ BN × (BM+4)
    128 × 64 tiles: 164 KiB at d = 128 (1 block an SM), 100 KiB at d = 64 (2).
Loads from global memory are 16-byte cp.async copies, so q, k, v rows must be 16-byte
aligned (``_arrays.aligned16``; otherwise the API runs ``simt_forward``).
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import BlockedTiles

NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def forward_kernel(t: BlockedTiles, causal: bool):
    """The forward kernel for tiles ``t``.

    Signature: ``kernel[grid, t.threads, stream, smem](q, k, v, out, lse, softmax_scale)``
    with q (B, Nq, H, d), k and v (B, Nk, H, d) float32, out like q, lse (B, H, Nq).
    """
    D, BM, BN, TM, TN = t.head_dim, t.block_m, t.block_n, t.tm, t.tn
    TX, TY, THREADS = t.tx, t.ty, t.threads
    OC = D // TX  # output columns per thread
    OV = OC // 4  # ... in 16-byte vectors
    DC = D // 4  # 16-byte chunks in a row
    QS, KS, PS = D + 4, D + 4, BM + 4  # row strides (floats)
    K_OFF = BM * QS  # float offsets of the tiles in the dynamic array
    V_OFF = K_OFF + BN * KS
    P_OFF = V_OFF + BN * D
    LOG_TX = TX.bit_length() - 1
    Q_COPIES = BM * DC // THREADS  # 16-byte copies per thread for a Q / K / V tile
    KV_COPIES = BN * DC // THREADS
    assert Q_COPIES * THREADS == BM * DC and KV_COPIES * THREADS == BN * DC
    S_N, ACC_N, KF_N, TM4 = TM * TN, TM * OC, TN * 4, TM // 4  # register array sizes
    K_STEP, Q_STEP = 4 * TX * KS, 4 * TY * QS  # bytes between a thread's keys / rows
    P_ROW, V_ROW, V_STEP = 4 * PS, 4 * D, 16 * TX  # bytes: a Pᵀ row, a V row, a thread's V vectors
    CAUSAL = causal

    @cuda.jit
    def simt_blocked_forward(q, k, v, out, lse, softmax_scale):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)  # byte address of smem[0]
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_m = cuda.blockIdx.x * BM
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale = float32(softmax_scale)
        # this thread's shared-memory byte addresses, computed once: the inner loops add
        # only compile-time strides and the loop offset
        k_addr = base + 4 * (K_OFF + tx * KS)
        q_addr = base + 4 * (ty * QS)
        p_addr = base + 4 * (P_OFF + ty * TM)
        v_addr = base + 4 * (V_OFF + 4 * tx)

        s = cuda.local.array(S_N, float32)  # the S / P micro-tile
        acc = cuda.local.array(ACC_N, float32)
        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)  # this thread's part of the row sum
        kf = cuda.local.array(KF_N, float32)
        pf = cuda.local.array(TM, float32)
        vf = cuda.local.array(OC, float32)
        for r in range(TM):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
        for i in range(ACC_N):
            acc[i] = float32(0.0)

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are not visited
            end_n = min(seqlen_k, max(0, start_m + BM + diag))
        n_tiles = (end_n + BN - 1) // BN

        # prologue: Q with K_0 in one cp.async group, V_0 in the next; rows past the
        # end of q / k / v are zero-filled (their scores are masked or never written)
        for i in range(Q_COPIES):
            idx = tid + i * THREADS
            r = idx // DC
            c = idx - r * DC
            row = start_m + r
            ptx.cp_async_16_zfill(
                base + 4 * (r * QS + 4 * c), q, (b, min(row, seqlen_q - 1), h, 4 * c), row < seqlen_q
            )
        if n_tiles > 0:
            for i in range(KV_COPIES):
                idx = tid + i * THREADS
                r = idx // DC
                c = idx - r * DC
                ptx.cp_async_16_zfill(
                    base + 4 * (K_OFF + r * KS + 4 * c), k, (b, min(r, seqlen_k - 1), h, 4 * c), r < seqlen_k
                )
        ptx.cp_async_commit()
        if n_tiles > 0:
            for i in range(KV_COPIES):
                idx = tid + i * THREADS
                r = idx // DC
                c = idx - r * DC
                ptx.cp_async_16_zfill(
                    base + 4 * (V_OFF + r * D + 4 * c), v, (b, min(r, seqlen_k - 1), h, 4 * c), r < seqlen_k
                )
        ptx.cp_async_commit()

        for it in range(n_tiles):
            start_n = it * BN
            has_next = it + 1 < n_tiles
            ptx.cp_async_wait_group(1)  # Q and K_it have landed (V_it may be in flight)
            # K_it (and Q) written by every thread's copies are visible to all
            cuda.syncthreads()

            # 1. S = Q·Kᵀ on the micro-tile
            for i in range(S_N):
                s[i] = float32(0.0)
            for kb in range(0, 4 * D, 16):  # byte offset of 4 head-dim columns
                for c in range(TN):
                    k0, k1, k2, k3 = ptx.ld_shared_v4_f32(k_addr + (kb + c * K_STEP))
                    kf[4 * c] = k0
                    kf[4 * c + 1] = k1
                    kf[4 * c + 2] = k2
                    kf[4 * c + 3] = k3
                for r in range(TM):
                    q0, q1, q2, q3 = ptx.ld_shared_v4_f32(q_addr + (kb + r * Q_STEP))
                    for c in range(TN):  # four dependent FMAs, as a sequential dot product
                        x = s[r * TN + c] + q0 * kf[4 * c]
                        x += q1 * kf[4 * c + 1]
                        x += q2 * kf[4 * c + 2]
                        s[r * TN + c] = x + q3 * kf[4 * c + 3]

            # 2. online softmax: mask, row max over the TX lanes, rescale, p = exp(s − m)
            for r in range(TM):
                row = start_m + ty + r * TY
                mx = NEG_INF
                for c in range(TN):
                    kj = start_n + tx + c * TX
                    visible = kj < seqlen_k
                    if CAUSAL:
                        visible = visible and kj <= row + diag
                    x = s[r * TN + c] * scale if visible else NEG_INF
                    s[r * TN + c] = x
                    mx = max(mx, x)
                for sh in range(LOG_TX):
                    mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, TX >> (sh + 1)))
                m_new = max(m_i[r], mx)
                m_use = m_new if m_new != NEG_INF else float32(0.0)  # no −inf − −inf
                alpha = math.exp(m_i[r] - m_use)
                m_i[r] = m_new
                l_row = l_i[r] * alpha
                for c in range(TN):
                    p = math.exp(s[r * TN + c] - m_use)
                    s[r * TN + c] = p
                    l_row += p
                l_i[r] = l_row
                for o in range(OC):
                    acc[r * OC + o] *= alpha

            # 3. Pᵀ to shared memory: key tx + c·TX, this thread's rows in order
            for c in range(TN):
                for r4 in range(TM4):
                    ptx.st_shared_v4_f32(
                        base + 4 * (P_OFF + (tx + c * TX) * PS + ty * TM + 4 * r4),
                        s[(4 * r4) * TN + c], s[(4 * r4 + 1) * TN + c],
                        s[(4 * r4 + 2) * TN + c], s[(4 * r4 + 3) * TN + c],
                    )  # fmt: skip
            # every thread is done reading K_it, and Pᵀ is visible to all
            cuda.syncthreads()
            if has_next:  # K_{it+1} streams in during P·V
                for i in range(KV_COPIES):
                    idx = tid + i * THREADS
                    r = idx // DC
                    c = idx - r * DC
                    kj = start_n + BN + r
                    ptx.cp_async_16_zfill(
                        base + 4 * (K_OFF + r * KS + 4 * c), k, (b, min(kj, seqlen_k - 1), h, 4 * c), kj < seqlen_k
                    )
                ptx.cp_async_commit()
                ptx.cp_async_wait_group(1)  # V_it has landed (K_{it+1} may be in flight)
            else:
                ptx.cp_async_wait_group(0)
            # V_it written by every thread's copies is visible to all
            cuda.syncthreads()

            # 4. acc += P·V
            for j in range(BN):
                for r4 in range(TM4):
                    p0, p1, p2, p3 = ptx.ld_shared_v4_f32(p_addr + (j * P_ROW + 16 * r4))
                    pf[4 * r4] = p0
                    pf[4 * r4 + 1] = p1
                    pf[4 * r4 + 2] = p2
                    pf[4 * r4 + 3] = p3
                for o in range(OV):
                    v0, v1, v2, v3 = ptx.ld_shared_v4_f32(v_addr + (j * V_ROW + o * V_STEP))
                    vf[4 * o] = v0
                    vf[4 * o + 1] = v1
                    vf[4 * o + 2] = v2
                    vf[4 * o + 3] = v3
                for r in range(TM):
                    for o in range(OC):
                        acc[r * OC + o] += pf[r] * vf[o]
            # every thread is done reading V_it and Pᵀ
            cuda.syncthreads()
            if has_next:  # V_{it+1} streams in during S of the next tile
                for i in range(KV_COPIES):
                    idx = tid + i * THREADS
                    r = idx // DC
                    c = idx - r * DC
                    kj = start_n + BN + r
                    ptx.cp_async_16_zfill(
                        base + 4 * (V_OFF + r * D + 4 * c), v, (b, min(kj, seqlen_k - 1), h, 4 * c), kj < seqlen_k
                    )
                ptx.cp_async_commit()
        ptx.cp_async_wait_all()  # no copy outlives the block (n_tiles == 0: Q's)

        # epilogue: the row sum over the TX lanes; o = acc / l, lse = m + log(l)
        for r in range(TM):
            l_row = l_i[r]
            for sh in range(LOG_TX):
                l_row += cuda.shfl_xor_sync(FULL_MASK, l_row, TX >> (sh + 1))
            row = start_m + ty + r * TY
            if row < seqlen_q:
                inv = float32(1.0) / l_row if l_row > float32(0.0) else float32(0.0)
                for o in range(OV):
                    for e in range(4):
                        out[b, row, h, 4 * tx + 4 * TX * o + e] = acc[r * OC + 4 * o + e] * inv
                if tx == 0:
                    lse[b, h, row] = m_i[r] + math.log(l_row) if l_row > float32(0.0) else NEG_INF

    return simt_blocked_forward

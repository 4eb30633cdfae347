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

``dkdv``: grid (ceil(Nk / BM), H, B); rows are the block's BM keys (K, V resident in
shared memory, dK and dV in registers), columns the BN queries of a Q/dO tile:
    1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ on the micro-tile: per 4 head-dim columns, TM + TM
       loads of K and V rows, TN + TN of Q and dO rows, 8·TM·TN FMAs;
    2. Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ∘(dPᵀ − delta) in registers, then stored
       as Pᵀ[query][thread-ordered keys] (16-byte stores) for step 3;
    3. per query i: dV += Pᵀ[:, i] ⊗ dO_i and dK += dSᵀ[:, i] ⊗ q_i — TM/4 loads of
       P and of dS (broadcast over the TX lanes), d/(4·TX) loads of dO_i and of q_i.
``dq``: grid (ceil(Nq / BM), H, B); rows are the block's BM queries (Q, dO resident,
lse and delta in registers, dQ in registers), columns the BN keys of a K/V tile:
S = Q·Kᵀ, dP = dO·Vᵀ, dS = P∘(dP − delta) → dSᵀ to shared memory → dQ += dS·K.

Shared memory (fp32, one dynamic array; ``config.blocked_dkdv_smem_bytes`` /
``blocked_dq_smem_bytes``): rows of d floats read by neighbouring threads as
"columns" are padded to d + 4 (rows i and i+1 are 4 banks apart); thread-ordered
P/dS rows (TY·TM floats, padded by 4 so that the rows stored by neighbouring lanes are
4 banks apart).  dkdv: K, V (BM rows), Q, dO (BN rows), Pᵀ, dSᵀ (BN rows), lse and
delta (BN); dq: Q, dO (BM rows), K, V (BN rows), dSᵀ (BN rows).  Copies from global memory are 16-byte cp.async (rows past the
end zero-filled), so q, k, v, dO rows must be 16-byte aligned.
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import BlockedTiles, blocked_bwd_layout

FULL_MASK = 0xFFFFFFFF


PRE_THREADS = 128  # preprocess: one query row a thread


@functools.lru_cache(maxsize=None)
def preprocess_kernel(head_dim: int):
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
def dkdv_kernel(t: BlockedTiles, causal: bool):
    """``kernel[grid, t.threads, stream, smem](q, k, v, dout, lse, delta, dk, dv, scale)``."""
    D, BM, BN, TM, TN = t.head_dim, t.block_m, t.block_n, t.tm, t.tn
    TX, TY, THREADS = t.tx, t.ty, t.threads
    OC, DC = D // t.tx, D // 4
    OV = OC // 4
    RS, TMP, PS = blocked_bwd_layout(t)  # padded row, thread slot, P/dS row (floats)
    K_OFF, V_OFF = 0, BM * RS
    Q_OFF = 2 * BM * RS
    DO_OFF = Q_OFF + BN * RS
    P_OFF = DO_OFF + BN * RS
    DS_OFF = P_OFF + BN * PS
    LSE_OFF = DS_OFF + BN * PS
    DELTA_OFF = LSE_OFF + BN
    KV_COPIES, Q_COPIES = BM * DC // THREADS, BN * DC // THREADS
    assert KV_COPIES * THREADS == BM * DC and Q_COPIES * THREADS == BN * DC and BN <= THREADS
    S_N, ACC_N, QF_N, TM4 = TM * TN, TM * OC, TN * 4, TM // 4
    CAUSAL = causal

    @cuda.jit
    def simt_blocked_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_n = cuda.blockIdx.x * BM  # this block's keys
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale = float32(softmax_scale)

        s = cuda.local.array(S_N, float32)  # Sᵀ, then Pᵀ
        dp = cuda.local.array(S_N, float32)  # dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(ACC_N, float32)
        acc_dv = cuda.local.array(ACC_N, float32)
        qf = cuda.local.array(QF_N, float32)
        df = cuda.local.array(QF_N, float32)
        pf = cuda.local.array(TM, float32)
        dsf = cuda.local.array(TM, float32)
        of = cuda.local.array(OC, float32)
        xf = cuda.local.array(OC, float32)
        for i in range(ACC_N):
            acc_dk[i] = float32(0.0)
            acc_dv[i] = float32(0.0)

        # K and V stay for the whole block (rows past the end of k / v zero-filled)
        for i in range(KV_COPIES):
            idx = tid + i * THREADS
            r = idx // DC
            c = idx - r * DC
            kj = start_n + r
            src = (b, min(kj, seqlen_k - 1), h, 4 * c)
            ptx.cp_async_16_zfill(base + 4 * (K_OFF + r * RS + 4 * c), k, src, kj < seqlen_k)
            ptx.cp_async_16_zfill(base + 4 * (V_OFF + r * RS + 4 * c), v, src, kj < seqlen_k)
        ptx.cp_async_commit()

        begin_q = 0
        if CAUSAL:  # the first query that sees key start_n is start_n − diag
            begin_q = min(seqlen_q, max(0, start_n - diag)) // BN * BN
        for start_q in range(begin_q, seqlen_q, BN):
            # every thread is done with the previous tile's Q, dO, Pᵀ, dSᵀ, lse, delta
            cuda.syncthreads()
            for i in range(Q_COPIES):
                idx = tid + i * THREADS
                r = idx // DC
                c = idx - r * DC
                qi = start_q + r
                src = (b, min(qi, seqlen_q - 1), h, 4 * c)
                ptx.cp_async_16_zfill(base + 4 * (Q_OFF + r * RS + 4 * c), q, src, qi < seqlen_q)
                ptx.cp_async_16_zfill(base + 4 * (DO_OFF + r * RS + 4 * c), dout, src, qi < seqlen_q)
            ptx.cp_async_commit()
            if tid < BN:
                qi = start_q + tid
                smem[LSE_OFF + tid] = lse[b, h, qi] if qi < seqlen_q else float32(0.0)
                smem[DELTA_OFF + tid] = delta[b, h, qi] if qi < seqlen_q else float32(0.0)
            ptx.cp_async_wait_group(0)
            # the tile's copies and lse / delta stores are visible to every thread
            cuda.syncthreads()

            # 1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ
            for i in range(S_N):
                s[i] = float32(0.0)
                dp[i] = float32(0.0)
            for kk in range(0, D, 4):
                for c in range(TN):
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (Q_OFF + (tx + c * TX) * RS + kk))
                    qf[4 * c] = a0
                    qf[4 * c + 1] = a1
                    qf[4 * c + 2] = a2
                    qf[4 * c + 3] = a3
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (DO_OFF + (tx + c * TX) * RS + kk))
                    df[4 * c] = a0
                    df[4 * c + 1] = a1
                    df[4 * c + 2] = a2
                    df[4 * c + 3] = a3
                for r in range(TM):
                    k0, k1, k2, k3 = ptx.ld_shared_v4_f32(base + 4 * (K_OFF + (ty + r * TY) * RS + kk))
                    v0, v1, v2, v3 = ptx.ld_shared_v4_f32(base + 4 * (V_OFF + (ty + r * TY) * RS + kk))
                    for c in range(TN):
                        x = s[r * TN + c] + k0 * qf[4 * c]
                        x += k1 * qf[4 * c + 1]
                        x += k2 * qf[4 * c + 2]
                        s[r * TN + c] = x + k3 * qf[4 * c + 3]
                        y = dp[r * TN + c] + v0 * df[4 * c]
                        y += v1 * df[4 * c + 1]
                        y += v2 * df[4 * c + 2]
                        dp[r * TN + c] = y + v3 * df[4 * c + 3]

            # 2. Pᵀ and dSᵀ, stored [query][thread-ordered keys]
            for c in range(TN):
                ii = tx + c * TX
                qi = start_q + ii
                lse_i = smem[LSE_OFF + ii]
                delta_i = smem[DELTA_OFF + ii]
                for r in range(TM):
                    kj = start_n + ty + r * TY
                    visible = qi < seqlen_q and kj < seqlen_k
                    if CAUSAL:
                        visible = visible and kj <= qi + diag
                    p = math.exp(s[r * TN + c] * scale - lse_i) if visible else float32(0.0)
                    s[r * TN + c] = p
                    dp[r * TN + c] = p * (dp[r * TN + c] - delta_i)
                for r4 in range(TM4):
                    at = (ii * PS + ty * TMP + 4 * r4) * 4
                    ptx.st_shared_v4_f32(
                        base + 4 * P_OFF + at, s[(4 * r4) * TN + c], s[(4 * r4 + 1) * TN + c],
                        s[(4 * r4 + 2) * TN + c], s[(4 * r4 + 3) * TN + c],
                    )  # fmt: skip
                    ptx.st_shared_v4_f32(
                        base + 4 * DS_OFF + at, dp[(4 * r4) * TN + c], dp[(4 * r4 + 1) * TN + c],
                        dp[(4 * r4 + 2) * TN + c], dp[(4 * r4 + 3) * TN + c],
                    )  # fmt: skip
            # Pᵀ and dSᵀ are visible to every thread
            cuda.syncthreads()

            # 3. dV += Pᵀ·dO, dK += dSᵀ·Q
            for i in range(BN):
                for r4 in range(TM4):
                    at = (i * PS + ty * TMP + 4 * r4) * 4
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * P_OFF + at)
                    pf[4 * r4] = a0
                    pf[4 * r4 + 1] = a1
                    pf[4 * r4 + 2] = a2
                    pf[4 * r4 + 3] = a3
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * DS_OFF + at)
                    dsf[4 * r4] = a0
                    dsf[4 * r4 + 1] = a1
                    dsf[4 * r4 + 2] = a2
                    dsf[4 * r4 + 3] = a3
                for o in range(OV):
                    col = 4 * tx + 4 * TX * o
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (DO_OFF + i * RS + col))
                    of[4 * o] = a0
                    of[4 * o + 1] = a1
                    of[4 * o + 2] = a2
                    of[4 * o + 3] = a3
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (Q_OFF + i * RS + col))
                    xf[4 * o] = a0
                    xf[4 * o + 1] = a1
                    xf[4 * o + 2] = a2
                    xf[4 * o + 3] = a3
                for r in range(TM):
                    for o in range(OC):
                        acc_dv[r * OC + o] += pf[r] * of[o]
                        acc_dk[r * OC + o] += dsf[r] * xf[o]
        ptx.cp_async_wait_all()  # no copy outlives the block (no query tile: K and V's)

        for r in range(TM):
            kj = start_n + ty + r * TY
            if kj < seqlen_k:
                for o in range(OV):
                    for e in range(4):
                        col = 4 * tx + 4 * TX * o + e
                        dk[b, kj, h, col] = acc_dk[r * OC + 4 * o + e] * scale
                        dv[b, kj, h, col] = acc_dv[r * OC + 4 * o + e]

    return simt_blocked_dkdv


@functools.lru_cache(maxsize=None)
def dq_kernel(t: BlockedTiles, causal: bool):
    """``kernel[grid, t.threads, stream, smem](q, k, v, dout, lse, delta, dq, scale)``."""
    D, BM, BN, TM, TN = t.head_dim, t.block_m, t.block_n, t.tm, t.tn
    TX, TY, THREADS = t.tx, t.ty, t.threads
    OC, DC = D // t.tx, D // 4
    OV = OC // 4
    RS, TMP, PS = blocked_bwd_layout(t)
    Q_OFF, DO_OFF = 0, BM * RS
    K_OFF = 2 * BM * RS
    V_OFF = K_OFF + BN * RS
    DS_OFF = V_OFF + BN * RS
    Q_COPIES, KV_COPIES = BM * DC // THREADS, BN * DC // THREADS
    assert Q_COPIES * THREADS == BM * DC and KV_COPIES * THREADS == BN * DC
    S_N, ACC_N, KF_N, TM4 = TM * TN, TM * OC, TN * 4, TM // 4
    CAUSAL = causal

    @cuda.jit
    def simt_blocked_dq(q, k, v, dout, lse, delta, dq, softmax_scale):
        smem = cuda.shared.array(0, float32)
        base = ptx.smem_addr(smem, 0)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        start_m = cuda.blockIdx.x * BM  # this block's queries
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q
        scale = float32(softmax_scale)

        s = cuda.local.array(S_N, float32)  # S, then P
        dp = cuda.local.array(S_N, float32)  # dP, then dS
        acc = cuda.local.array(ACC_N, float32)
        lse_r = cuda.local.array(TM, float32)
        delta_r = cuda.local.array(TM, float32)
        kf = cuda.local.array(KF_N, float32)
        vf = cuda.local.array(KF_N, float32)
        dsf = cuda.local.array(TM, float32)
        xf = cuda.local.array(OC, float32)
        for i in range(ACC_N):
            acc[i] = float32(0.0)
        for r in range(TM):
            qi = start_m + ty + r * TY
            lse_r[r] = lse[b, h, qi] if qi < seqlen_q else float32(0.0)
            delta_r[r] = delta[b, h, qi] if qi < seqlen_q else float32(0.0)

        # Q and dO stay for the whole block
        for i in range(Q_COPIES):
            idx = tid + i * THREADS
            r = idx // DC
            c = idx - r * DC
            qi = start_m + r
            src = (b, min(qi, seqlen_q - 1), h, 4 * c)
            ptx.cp_async_16_zfill(base + 4 * (Q_OFF + r * RS + 4 * c), q, src, qi < seqlen_q)
            ptx.cp_async_16_zfill(base + 4 * (DO_OFF + r * RS + 4 * c), dout, src, qi < seqlen_q)
        ptx.cp_async_commit()

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are not visited
            end_n = min(seqlen_k, max(0, start_m + BM + diag))
        for start_n in range(0, end_n, BN):
            # every thread is done with the previous tile's K, V and dSᵀ
            cuda.syncthreads()
            for i in range(KV_COPIES):
                idx = tid + i * THREADS
                r = idx // DC
                c = idx - r * DC
                kj = start_n + r
                src = (b, min(kj, seqlen_k - 1), h, 4 * c)
                ptx.cp_async_16_zfill(base + 4 * (K_OFF + r * RS + 4 * c), k, src, kj < seqlen_k)
                ptx.cp_async_16_zfill(base + 4 * (V_OFF + r * RS + 4 * c), v, src, kj < seqlen_k)
            ptx.cp_async_commit()
            ptx.cp_async_wait_group(0)
            # the tile's copies (and Q, dO) are visible to every thread
            cuda.syncthreads()

            # S = Q·Kᵀ and dP = dO·Vᵀ
            for i in range(S_N):
                s[i] = float32(0.0)
                dp[i] = float32(0.0)
            for kk in range(0, D, 4):
                for c in range(TN):
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (K_OFF + (tx + c * TX) * RS + kk))
                    kf[4 * c] = a0
                    kf[4 * c + 1] = a1
                    kf[4 * c + 2] = a2
                    kf[4 * c + 3] = a3
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (V_OFF + (tx + c * TX) * RS + kk))
                    vf[4 * c] = a0
                    vf[4 * c + 1] = a1
                    vf[4 * c + 2] = a2
                    vf[4 * c + 3] = a3
                for r in range(TM):
                    q0, q1, q2, q3 = ptx.ld_shared_v4_f32(base + 4 * (Q_OFF + (ty + r * TY) * RS + kk))
                    d0, d1, d2, d3 = ptx.ld_shared_v4_f32(base + 4 * (DO_OFF + (ty + r * TY) * RS + kk))
                    for c in range(TN):
                        x = s[r * TN + c] + q0 * kf[4 * c]
                        x += q1 * kf[4 * c + 1]
                        x += q2 * kf[4 * c + 2]
                        s[r * TN + c] = x + q3 * kf[4 * c + 3]
                        y = dp[r * TN + c] + d0 * vf[4 * c]
                        y += d1 * vf[4 * c + 1]
                        y += d2 * vf[4 * c + 2]
                        dp[r * TN + c] = y + d3 * vf[4 * c + 3]

            # dS = P∘(dP − delta), stored as dSᵀ[key][thread-ordered queries]
            for c in range(TN):
                jj = tx + c * TX
                kj = start_n + jj
                for r in range(TM):
                    qi = start_m + ty + r * TY
                    visible = qi < seqlen_q and kj < seqlen_k
                    if CAUSAL:
                        visible = visible and kj <= qi + diag
                    p = math.exp(s[r * TN + c] * scale - lse_r[r]) if visible else float32(0.0)
                    dp[r * TN + c] = p * (dp[r * TN + c] - delta_r[r])
                for r4 in range(TM4):
                    ptx.st_shared_v4_f32(
                        base + 4 * (DS_OFF + jj * PS + ty * TMP + 4 * r4),
                        dp[(4 * r4) * TN + c], dp[(4 * r4 + 1) * TN + c],
                        dp[(4 * r4 + 2) * TN + c], dp[(4 * r4 + 3) * TN + c],
                    )  # fmt: skip
            # dSᵀ is visible to every thread
            cuda.syncthreads()

            # dQ += dS·K
            for j in range(BN):
                for r4 in range(TM4):
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (DS_OFF + j * PS + ty * TMP + 4 * r4))
                    dsf[4 * r4] = a0
                    dsf[4 * r4 + 1] = a1
                    dsf[4 * r4 + 2] = a2
                    dsf[4 * r4 + 3] = a3
                for o in range(OV):
                    a0, a1, a2, a3 = ptx.ld_shared_v4_f32(base + 4 * (K_OFF + j * RS + 4 * tx + 4 * TX * o))
                    xf[4 * o] = a0
                    xf[4 * o + 1] = a1
                    xf[4 * o + 2] = a2
                    xf[4 * o + 3] = a3
                for r in range(TM):
                    for o in range(OC):
                        acc[r * OC + o] += dsf[r] * xf[o]
        ptx.cp_async_wait_all()  # no copy outlives the block (no key tile: Q and dO's)

        for r in range(TM):
            qi = start_m + ty + r * TY
            if qi < seqlen_q:
                for o in range(OV):
                    for e in range(4):
                        dq[b, qi, h, 4 * tx + 4 * TX * o + e] = acc[r * OC + 4 * o + e] * scale

    return simt_blocked_dq

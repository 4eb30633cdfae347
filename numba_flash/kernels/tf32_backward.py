"""TF32 tensor-core FlashAttention backward for float32 inputs (opt-in: ``allow_tf32=True``).

Math, as ``tc_backward`` (P recomputed from the saved log-sum-exp in the log2 domain;
``scale2 = softmax_scale · log2(e)``, ``lse2 = lse · log2(e)``), with every mma operand
rounded to TF32 (``cvt.rna.tf32.f32``: 10 mantissa bits, to nearest, ties away) and
every sum in fp32 (``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``)::

    delta_i = Σ_c dO_ic · O_ic                               preprocess, exact fp32
    s_ij    = tf32(q_i) · tf32(k_j)                          mma
    p_ij    = 2^(s_ij · scale2 − lse2_i)                     fp32; 0 where masked
    dp_ij   = tf32(dO_i) · tf32(v_j)                         mma
    ds_ij   = p_ij · (dp_ij − delta_i)                       fp32, from the unrounded p
    dv_j    = Σ_i tf32(p_ij) · tf32(dO_i)                    dkdv kernel
    dk_j    = scale · Σ_i tf32(ds_ij) · tf32(q_i)            dkdv kernel
    dq_i    = scale · Σ_j tf32(ds_ij) · tf32(k_j)            dq kernel

Outputs are float32.  Precision about 1e-3 relative, as the TF32 forward;
``tests/test_tf32.py`` holds dQ, dK, dV to 3× the error of a float64 backward whose Q, K,
V, dO, P and dS are rounded to TF32 the same way (``reference.attention_backward_tf32``).
A row that sees no key (lse = −inf) gets lse2 = +inf here, so its p is exactly 0.
dQ has its own pass over the key tiles: every output element is written once, by the
warp that owns it; no atomics, bitwise deterministic.

Fragments (m16n8k8 tf32, see ``tf32_forward``): a0 = A[g][t], a1 = A[g+8][t],
a2 = A[g][t+4], a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]; the accumulator holds
C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1] (``g = lane >> 2``, ``t = lane & 3``).
Both kernels are the forward's two products twice over, with its k- and n-permutations,
so no operand is ever transposed in shared memory:

* a product over the head dim (S = Q·Kᵀ, Sᵀ = K·Qᵀ, dP = dO·Vᵀ, dPᵀ = V·dOᵀ) takes
  columns 16p .. 16p+15 as two k-steps, lane t owning columns 16p + 4t .. +3: one
  ``ld.shared.v4.f32`` of an A row gives its a-words of both k-steps, one of a B row
  (the row that is the n index) its b0, b1 of both.  Which matrix is "A" only decides
  which rows are m (the warp's 16) and which are n (the tile's);
* a product over the tile's rows (dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K) takes its A
  operand straight from the accumulator of the first product: slot t ↔ row 2t and slot
  t+4 ↔ row 2t+1 of the 8-row n-tile, a0..a3 = tf32(c0, c2, c1, c3); the B operand is
  rows 2t, 2t+1 of dO, Q or K, whose head-dim columns are permuted (n-tile 4j+i, mma
  column n ↔ column 32j + 4n + i) so that lane g reads 4 contiguous floats.  The
  accumulator then holds output columns 32j + 8t + i and 32j + 8t + 4 + i.

Kernels (4 warps of 16 rows each):

- ``preprocess``: ``simt_blocked_backward.preprocess_kernel``, the exact fp32 one (one
  thread a query row: delta (B, H, Nq)), shared with the exact backward.
- ``dkdv``: grid (ceil(Nk / BLOCK_N), H, B); warp w owns keys start_n + 16w .. +15.
  K and V of the block are copied once; Q, dO (and lse2, delta) tiles of BLOCK_M queries
  are double-buffered with cp.async.  Per query tile a warp forms Sᵀ = K·Qᵀ and
  dPᵀ = V·dOᵀ, then Pᵀ, dSᵀ in registers, then dV += Pᵀ·dO and dK += dSᵀ·Q.
  Causal: query tiles that see none of the block's keys are not visited.
- ``dq``: grid (ceil(Nq / BLOCK_M), H, B); warp w owns queries start_m + 16w .. +15.
  Q and dO stay in shared memory; K, V tiles are double-buffered.  S = Q·Kᵀ,
  dP = dO·Vᵀ, dS, dQ += dS·K.  Causal: key tiles wholly above the diagonal are skipped.

The A fragments over the head dim (K, V rows in dkdv; Q, dO rows in dq) are re-read
from shared memory for every tile rather than kept in registers: at d = 128 the two
fp32 accumulators of 16 × d already take 128 registers a lane.

Shared memory (fp32, one dynamic array, rows XOR-swizzled in 16-byte chunks as the
forward: chunk c of row r at ``c ^ sw(r)``, ``sw(r) = (r & 6) ^ ((r & 1) << 2)``):
dkdv K + V (2·BLOCK_N·d) + two stages of Q and dO (4·BLOCK_M·d), plus a static
4·BLOCK_M floats for lse2 and delta; dq Q + dO (2·BLOCK_M·d) + two stages of K and V
(4·BLOCK_N·d).  ``tf32_bwd_smem_bytes``: 96 KiB for both at d = 64, 128 KiB for both at
d = 128 (one block an SM on an H100/H200; over 48 KiB is opted in at launch).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32
from numba_flash.config import TF32_HEAD_DIMS

LOG2E = 1.4426950408889634
POS_INF = float32(math.inf)
NEG_INF = float32(-math.inf)
_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)

@dataclass(frozen=True)
class Tf32BwdTiles:
    """Compile-time tiles of the TF32 backward (mma.sync m16n8k8).

    Attributes:
        head_dim: d (64 or 128).
        kv_block_n: keys per dkdv block = 16 · warps (a warp owns 16 keys).
        kv_block_m: queries per tile the dkdv block walks.
        q_block_m: queries per dq block = 16 · warps (a warp owns 16 queries).
        q_block_n: keys per tile the dq block walks.
        warps: warps per block (both kernels).
    """

    head_dim: int
    kv_block_m: int
    kv_block_n: int
    q_block_m: int
    q_block_n: int
    warps: int = 4

    def __post_init__(self):
        if self.kv_block_n != 16 * self.warps or self.q_block_m != 16 * self.warps:
            raise ValueError(
                f"kv_block_n={self.kv_block_n} and q_block_m={self.q_block_m} must be 16 · warps = {16 * self.warps}"
            )
        if self.head_dim % 32 or self.kv_block_m % 8 or self.q_block_n % 8:
            raise ValueError(
                f"head_dim={self.head_dim} must be a multiple of 32, kv_block_m={self.kv_block_m} "
                f"and q_block_n={self.q_block_n} of 8"
            )

    @property
    def threads(self) -> int:
        return 32 * self.warps


def tf32_bwd_smem_bytes(t: Tf32BwdTiles) -> tuple[int, int]:
    """Dynamic shared bytes of (dkdv, dq): K, V + two stages of Q, dO; Q, dO + two
    stages of K, V; fp32."""
    row = 4 * t.head_dim
    return row * (2 * t.kv_block_n + 4 * t.kv_block_m), row * (2 * t.q_block_m + 4 * t.q_block_n)


def tf32_backward_tiles(head_dim: int, causal: bool = False) -> Tf32BwdTiles:
    """Tiles of the TF32 backward.

    Four warps of 16 rows.  A dkdv lane holds d/2 dK and d/2 dV floats plus
    BLOCK_M/2 each of Sᵀ and dPᵀ: 128 at d = 64 with 64-query tiles, 160 at d = 128
    with 32-query tiles; a dq lane d/2 dQ floats plus BLOCK_N/2 each of S and dP.  The
    shared memory (96 KiB at d = 64, 128 KiB at d = 128) lets one or two blocks share
    an SM.  Not yet tuned on hardware; causal does not change the choice today.
    """
    if head_dim not in TF32_HEAD_DIMS:
        raise ValueError(f"head_dim: the TF32 backward supports {TF32_HEAD_DIMS}, got {head_dim}")
    if head_dim == 64:
        return Tf32BwdTiles(64, kv_block_m=64, kv_block_n=64, q_block_m=64, q_block_n=64)
    return Tf32BwdTiles(128, kv_block_m=32, kv_block_n=64, q_block_m=64, q_block_n=32)


@functools.lru_cache(maxsize=None)
def dkdv_kernel(t: Tf32BwdTiles, causal: bool):
    """``kernel[grid, threads, stream, tf32_bwd_smem_bytes(t)[0]](q, k, v, dout, lse, delta,
    dk, dv, softmax_scale)``; q, dout (B, Nq, H, d), k, v, dk, dv (B, Nk, H, d) float32
    with 16-byte aligned rows; lse, delta (B, H, Nq) float32."""
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.kv_block_m, t.kv_block_n, t.head_dim, t.threads
    CAUSAL = causal
    KPAIRS = HEAD_DIM // 16  # pairs of k-steps over d: one v4 load a row a pair
    NT_S = BLOCK_M // 8  # n-tiles of Sᵀ (8 queries each) = k-steps of Pᵀ·dO
    OGROUPS = HEAD_DIM // 32  # groups of 4 n-tiles of dK, dV: one v4 load a group
    CHUNKS = HEAD_DIM // 4  # 16-byte chunks in a row
    S_REGS = NT_S * 4
    O_REGS = HEAD_DIM // 2
    ROW_BYTES = HEAD_DIM * 4
    KV_BYTES = BLOCK_N * ROW_BYTES
    QT_BYTES = BLOCK_M * ROW_BYTES  # one stage of Q (or dO)
    ROW_VALS = 4 * BLOCK_M  # [stage][lse2 (BLOCK_M) | delta (BLOCK_M)]
    mma = ptx.mma_m16n8k8_tf32
    tf32 = ptx.cvt_rna_tf32

    @cuda.jit
    def tf32_bwd_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale):
        start_n = cuda.blockIdx.x * BLOCK_N
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane >> 2  # accumulator rows (keys) g and g + 8
        tq = lane & 3  # accumulator columns (queries) 2·tq, 2·tq + 1
        sw_g = (g & 6) ^ ((g & 1) << 2)  # sw(r) of the rows g (mod 8) this lane reads
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale2 = float32(softmax_scale * LOG2E)

        # dynamic: K | V | Q stages | dO stages (byte offsets); static: lse2 | delta
        smem = cuda.shared.array(0, float32, alignment=_ALIGN)
        k_base = ptx.smem_addr(smem, 0)
        v_base = k_base + KV_BYTES
        q_base = v_base + KV_BYTES
        do_base = q_base + 2 * QT_BYTES
        s_rows = cuda.shared.array(ROW_VALS, float32)

        acc_s = cuda.local.array(S_REGS, float32)  # Sᵀ, then Pᵀ
        acc_dp = cuda.local.array(S_REGS, float32)  # dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(O_REGS, float32)
        acc_dv = cuda.local.array(O_REGS, float32)
        for i in range(O_REGS):
            acc_dk[i] = float32(0.0)
            acc_dv[i] = float32(0.0)

        # K and V of this block (rows past the end zero-filled, source clamped in bounds)
        for idx in range(tid, BLOCK_N * CHUNKS, THREADS):
            r = idx // CHUNKS
            c = idx - r * CHUNKS
            row = start_n + r
            off = r * ROW_BYTES + ((c ^ ((r & 6) ^ ((r & 1) << 2))) << 4)
            src = (b, min(row, seqlen_k - 1), h, c * 4)
            ptx.cp_async_16_zfill(k_base + off, k, src, row < seqlen_k)
            ptx.cp_async_16_zfill(v_base + off, v, src, row < seqlen_k)

        start_q = 0
        if CAUSAL:  # queries before start_n - diag see none of this block's keys
            start_q = (max(0, start_n - diag) // BLOCK_M) * BLOCK_M
        n_tiles = (seqlen_q - start_q + BLOCK_M - 1) // BLOCK_M

        row_k = k_base + (warp * 16 + g) * ROW_BYTES  # A rows: keys g, g + 8 of this warp
        row_v = v_base + (warp * 16 + g) * ROW_BYTES
        # i = -1 only starts the copy of query tile 0; tile i+1 is copied while i is used
        for i in range(-1, n_tiles):
            if i >= 0:
                ptx.cp_async_wait_group(0)
                # tile i (and K, V) landed for every thread's copies and its lse2/delta
                # stores are done; every warp is done with tile i-1, whose stage is next
                cuda.syncthreads()
            if i + 1 < n_tiles:
                nxt = (i + 1) & 1
                first = start_q + (i + 1) * BLOCK_M
                for idx in range(tid, BLOCK_M * CHUNKS, THREADS):
                    r = idx // CHUNKS
                    c = idx - r * CHUNKS
                    row = first + r
                    off = nxt * QT_BYTES + r * ROW_BYTES + ((c ^ ((r & 6) ^ ((r & 1) << 2))) << 4)
                    src = (b, min(row, seqlen_q - 1), h, c * 4)
                    ptx.cp_async_16_zfill(q_base + off, q, src, row < seqlen_q)
                    ptx.cp_async_16_zfill(do_base + off, dout, src, row < seqlen_q)
                for r in range(tid, BLOCK_M, THREADS):
                    row = first + r
                    lse2 = POS_INF  # rows past the end and rows that see no key: p = 0
                    dl = float32(0.0)
                    if row < seqlen_q:
                        x = lse[b, h, row]
                        if x != NEG_INF:
                            lse2 = x * float32(LOG2E)
                        dl = delta[b, h, row]
                    s_rows[nxt * 2 * BLOCK_M + r] = lse2
                    s_rows[nxt * 2 * BLOCK_M + BLOCK_M + r] = dl
            ptx.cp_async_commit()
            if i < 0:
                continue
            stage = i & 1
            start_m = start_q + i * BLOCK_M
            q_tile = q_base + stage * QT_BYTES
            do_tile = do_base + stage * QT_BYTES
            rows_off = stage * 2 * BLOCK_M

            # Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: K, V rows are m (A), Q, dO rows are n (B)
            for j in range(S_REGS):
                acc_s[j] = float32(0.0)
                acc_dp[j] = float32(0.0)
            for p in range(KPAIRS):
                off = ((4 * p + tq) ^ sw_g) << 4  # columns 16p + 4t .. +3
                y0, y1, y2, y3 = ptx.ld_shared_v4_f32(row_k + off)  # key g
                z0, z1, z2, z3 = ptx.ld_shared_v4_f32(row_k + 8 * ROW_BYTES + off)  # key g + 8
                ka0, ka1, ka2, ka3 = tf32(y0), tf32(z0), tf32(y1), tf32(z1)  # k-step 2p
                ka4, ka5, ka6, ka7 = tf32(y2), tf32(z2), tf32(y3), tf32(z3)  # k-step 2p + 1
                y0, y1, y2, y3 = ptx.ld_shared_v4_f32(row_v + off)
                z0, z1, z2, z3 = ptx.ld_shared_v4_f32(row_v + 8 * ROW_BYTES + off)
                va0, va1, va2, va3 = tf32(y0), tf32(z0), tf32(y1), tf32(z1)
                va4, va5, va6, va7 = tf32(y2), tf32(z2), tf32(y3), tf32(z3)
                for nt in range(NT_S):
                    s = nt * 4
                    x0, x1, x2, x3 = ptx.ld_shared_v4_f32(q_tile + (nt * 8 + g) * ROW_BYTES + off)
                    acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3] = mma(
                        ka0, ka1, ka2, ka3, tf32(x0), tf32(x1), acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3]
                    )
                    acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3] = mma(
                        ka4, ka5, ka6, ka7, tf32(x2), tf32(x3), acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3]
                    )
                    x0, x1, x2, x3 = ptx.ld_shared_v4_f32(do_tile + (nt * 8 + g) * ROW_BYTES + off)
                    acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3] = mma(
                        va0, va1, va2, va3, tf32(x0), tf32(x1), acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3]
                    )
                    acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3] = mma(
                        va4, va5, va6, va7, tf32(x2), tf32(x3), acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3]
                    )

            # Pᵀ and dSᵀ: element e of n-tile nt is (key g + 8·(e >> 1), query 8nt + 2t + (e & 1));
            # only tiles crossing the causal diagonal need a mask (rows past the end of
            # the queries have lse2 = +inf, so p = 0 there already)
            needs_mask = False
            if CAUSAL:
                needs_mask = start_n + BLOCK_N - 1 > start_m + diag
            for nt in range(NT_S):
                for e in range(4):
                    col = nt * 8 + 2 * tq + (e & 1)
                    p = ptx.ex2_approx(acc_s[nt * 4 + e] * scale2 - s_rows[rows_off + col])
                    if needs_mask:
                        if start_n + warp * 16 + g + 8 * (e >> 1) > start_m + col + diag:
                            p = float32(0.0)
                    acc_s[nt * 4 + e] = p
                    acc_dp[nt * 4 + e] = p * (acc_dp[nt * 4 + e] - s_rows[rows_off + BLOCK_M + col])

            # dV += Pᵀ·dO and dK += dSᵀ·Q: queries are k; slot t ↔ query 2t, slot t+4 ↔
            # 2t+1 of k-step nt, so a0..a3 = tf32(c0, c2, c1, c3); B rows 8nt + 2t, +1
            # (sw = 2t and 2t ^ 4), head-dim columns 32jg + 4g .. +3 (n-tiles 4jg .. +3)
            for nt in range(NT_S):
                s = nt * 4
                pa0, pa1, pa2, pa3 = tf32(acc_s[s]), tf32(acc_s[s + 2]), tf32(acc_s[s + 1]), tf32(acc_s[s + 3])
                da0, da1, da2, da3 = tf32(acc_dp[s]), tf32(acc_dp[s + 2]), tf32(acc_dp[s + 1]), tf32(acc_dp[s + 3])
                row_do = do_tile + (nt * 8 + 2 * tq) * ROW_BYTES
                row_q = q_tile + (nt * 8 + 2 * tq) * ROW_BYTES
                for jg in range(OGROUPS):
                    off0 = ((8 * jg + g) ^ (2 * tq)) << 4
                    off1 = ROW_BYTES + (((8 * jg + g) ^ (2 * tq) ^ 4) << 4)
                    v0, v1, v2, v3 = ptx.ld_shared_v4_f32(row_do + off0)
                    w0, w1, w2, w3 = ptx.ld_shared_v4_f32(row_do + off1)
                    o = 16 * jg
                    acc_dv[o], acc_dv[o + 1], acc_dv[o + 2], acc_dv[o + 3] = mma(
                        pa0, pa1, pa2, pa3, tf32(v0), tf32(w0), acc_dv[o], acc_dv[o + 1], acc_dv[o + 2], acc_dv[o + 3]
                    )
                    acc_dv[o + 4], acc_dv[o + 5], acc_dv[o + 6], acc_dv[o + 7] = mma(
                        pa0, pa1, pa2, pa3, tf32(v1), tf32(w1), acc_dv[o + 4], acc_dv[o + 5], acc_dv[o + 6], acc_dv[o + 7]
                    )
                    acc_dv[o + 8], acc_dv[o + 9], acc_dv[o + 10], acc_dv[o + 11] = mma(
                        pa0, pa1, pa2, pa3, tf32(v2), tf32(w2), acc_dv[o + 8], acc_dv[o + 9], acc_dv[o + 10], acc_dv[o + 11]
                    )
                    acc_dv[o + 12], acc_dv[o + 13], acc_dv[o + 14], acc_dv[o + 15] = mma(
                        pa0, pa1, pa2, pa3, tf32(v3), tf32(w3), acc_dv[o + 12], acc_dv[o + 13], acc_dv[o + 14], acc_dv[o + 15]
                    )
                    v0, v1, v2, v3 = ptx.ld_shared_v4_f32(row_q + off0)
                    w0, w1, w2, w3 = ptx.ld_shared_v4_f32(row_q + off1)
                    acc_dk[o], acc_dk[o + 1], acc_dk[o + 2], acc_dk[o + 3] = mma(
                        da0, da1, da2, da3, tf32(v0), tf32(w0), acc_dk[o], acc_dk[o + 1], acc_dk[o + 2], acc_dk[o + 3]
                    )
                    acc_dk[o + 4], acc_dk[o + 5], acc_dk[o + 6], acc_dk[o + 7] = mma(
                        da0, da1, da2, da3, tf32(v1), tf32(w1), acc_dk[o + 4], acc_dk[o + 5], acc_dk[o + 6], acc_dk[o + 7]
                    )
                    acc_dk[o + 8], acc_dk[o + 9], acc_dk[o + 10], acc_dk[o + 11] = mma(
                        da0, da1, da2, da3, tf32(v2), tf32(w2), acc_dk[o + 8], acc_dk[o + 9], acc_dk[o + 10], acc_dk[o + 11]
                    )
                    acc_dk[o + 12], acc_dk[o + 13], acc_dk[o + 14], acc_dk[o + 15] = mma(
                        da0, da1, da2, da3, tf32(v3), tf32(w3), acc_dk[o + 12], acc_dk[o + 13], acc_dk[o + 14], acc_dk[o + 15]
                    )

        ptx.cp_async_wait_all()  # no copy may land after the block exits (n_tiles <= 0)
        # epilogue: n-tile 4jg+i holds head-dim columns 32jg + 8t + i (c0 / c2) and + 4 (c1 / c3)
        scale = float32(softmax_scale)
        for r in range(2):
            key = start_n + warp * 16 + g + 8 * r
            if key < seqlen_k:
                for jg in range(OGROUPS):
                    for i in range(4):
                        col = 32 * jg + 8 * tq + i
                        a = (4 * jg + i) * 4 + 2 * r
                        dk[b, key, h, col] = acc_dk[a] * scale
                        dk[b, key, h, col + 4] = acc_dk[a + 1] * scale
                        dv[b, key, h, col] = acc_dv[a]
                        dv[b, key, h, col + 4] = acc_dv[a + 1]

    return tf32_bwd_dkdv


@functools.lru_cache(maxsize=None)
def dq_kernel(t: Tf32BwdTiles, causal: bool):
    """``kernel[grid, threads, stream, tf32_bwd_smem_bytes(t)[1]](q, k, v, dout, lse, delta,
    dq, softmax_scale)``; shapes as :func:`dkdv_kernel`, dq like q."""
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.q_block_m, t.q_block_n, t.head_dim, t.threads
    CAUSAL = causal
    KPAIRS = HEAD_DIM // 16
    NT_S = BLOCK_N // 8  # n-tiles of S (8 keys each) = k-steps of dS·K
    OGROUPS = HEAD_DIM // 32
    CHUNKS = HEAD_DIM // 4
    S_REGS = NT_S * 4
    O_REGS = HEAD_DIM // 2
    ROW_BYTES = HEAD_DIM * 4
    Q_BYTES = BLOCK_M * ROW_BYTES
    KV_BYTES = BLOCK_N * ROW_BYTES  # one stage of K (or V)
    mma = ptx.mma_m16n8k8_tf32
    tf32 = ptx.cvt_rna_tf32

    @cuda.jit
    def tf32_bwd_dq(q, k, v, dout, lse, delta, dq, softmax_scale):
        start_m = cuda.blockIdx.x * BLOCK_M
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane >> 2  # accumulator rows (queries) g and g + 8
        tq = lane & 3  # accumulator columns (keys) 2·tq, 2·tq + 1
        sw_g = (g & 6) ^ ((g & 1) << 2)
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q
        scale2 = float32(softmax_scale * LOG2E)

        # dynamic: Q | dO | K stages | V stages (byte offsets)
        smem = cuda.shared.array(0, float32, alignment=_ALIGN)
        q_base = ptx.smem_addr(smem, 0)
        do_base = q_base + Q_BYTES
        k_base = do_base + Q_BYTES
        v_base = k_base + 2 * KV_BYTES

        acc_s = cuda.local.array(S_REGS, float32)  # S, then P
        acc_dp = cuda.local.array(S_REGS, float32)  # dP, then dS
        acc_dq = cuda.local.array(O_REGS, float32)
        lse2 = cuda.local.array(2, float32)  # rows g, g + 8
        delta_i = cuda.local.array(2, float32)
        for i in range(O_REGS):
            acc_dq[i] = float32(0.0)
        for r in range(2):
            row = start_m + warp * 16 + g + 8 * r
            lse2[r] = POS_INF  # rows past the end and rows that see no key: p = 0
            delta_i[r] = float32(0.0)
            if row < seqlen_q:
                x = lse[b, h, row]
                if x != NEG_INF:
                    lse2[r] = x * float32(LOG2E)
                delta_i[r] = delta[b, h, row]

        for idx in range(tid, BLOCK_M * CHUNKS, THREADS):
            r = idx // CHUNKS
            c = idx - r * CHUNKS
            row = start_m + r
            off = r * ROW_BYTES + ((c ^ ((r & 6) ^ ((r & 1) << 2))) << 4)
            src = (b, min(row, seqlen_q - 1), h, c * 4)
            ptx.cp_async_16_zfill(q_base + off, q, src, row < seqlen_q)
            ptx.cp_async_16_zfill(do_base + off, dout, src, row < seqlen_q)

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are skipped
            end_n = min(seqlen_k, max(0, start_m + BLOCK_M + diag))
        n_tiles = (end_n + BLOCK_N - 1) // BLOCK_N

        row_q = q_base + (warp * 16 + g) * ROW_BYTES  # A rows: queries g, g + 8 of this warp
        row_do = do_base + (warp * 16 + g) * ROW_BYTES
        # j = -1 only starts the copy of tile 0; tile j+1 is copied while j is used
        for j in range(-1, n_tiles):
            if j >= 0:
                ptx.cp_async_wait_group(0)
                # tile j (and Q, dO) landed for every thread's copies; every warp is
                # done with tile j-1, whose stage the copies of tile j+1 overwrite next
                cuda.syncthreads()
            if j + 1 < n_tiles:
                nxt = ((j + 1) & 1) * KV_BYTES
                for idx in range(tid, BLOCK_N * CHUNKS, THREADS):
                    r = idx // CHUNKS
                    c = idx - r * CHUNKS
                    row = (j + 1) * BLOCK_N + r
                    off = nxt + r * ROW_BYTES + ((c ^ ((r & 6) ^ ((r & 1) << 2))) << 4)
                    src = (b, min(row, seqlen_k - 1), h, c * 4)
                    ptx.cp_async_16_zfill(k_base + off, k, src, row < seqlen_k)
                    ptx.cp_async_16_zfill(v_base + off, v, src, row < seqlen_k)
            ptx.cp_async_commit()
            if j < 0:
                continue
            start_n = j * BLOCK_N
            k_tile = k_base + (j & 1) * KV_BYTES
            v_tile = v_base + (j & 1) * KV_BYTES

            # S = Q·K_jᵀ and dP = dO·V_jᵀ: Q, dO rows are m (A), K, V rows are n (B)
            for i in range(S_REGS):
                acc_s[i] = float32(0.0)
                acc_dp[i] = float32(0.0)
            for p in range(KPAIRS):
                off = ((4 * p + tq) ^ sw_g) << 4  # columns 16p + 4t .. +3
                y0, y1, y2, y3 = ptx.ld_shared_v4_f32(row_q + off)  # query g
                z0, z1, z2, z3 = ptx.ld_shared_v4_f32(row_q + 8 * ROW_BYTES + off)  # query g + 8
                qa0, qa1, qa2, qa3 = tf32(y0), tf32(z0), tf32(y1), tf32(z1)  # k-step 2p
                qa4, qa5, qa6, qa7 = tf32(y2), tf32(z2), tf32(y3), tf32(z3)  # k-step 2p + 1
                y0, y1, y2, y3 = ptx.ld_shared_v4_f32(row_do + off)
                z0, z1, z2, z3 = ptx.ld_shared_v4_f32(row_do + 8 * ROW_BYTES + off)
                da0, da1, da2, da3 = tf32(y0), tf32(z0), tf32(y1), tf32(z1)
                da4, da5, da6, da7 = tf32(y2), tf32(z2), tf32(y3), tf32(z3)
                for nt in range(NT_S):
                    s = nt * 4
                    x0, x1, x2, x3 = ptx.ld_shared_v4_f32(k_tile + (nt * 8 + g) * ROW_BYTES + off)
                    acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3] = mma(
                        qa0, qa1, qa2, qa3, tf32(x0), tf32(x1), acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3]
                    )
                    acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3] = mma(
                        qa4, qa5, qa6, qa7, tf32(x2), tf32(x3), acc_s[s], acc_s[s + 1], acc_s[s + 2], acc_s[s + 3]
                    )
                    x0, x1, x2, x3 = ptx.ld_shared_v4_f32(v_tile + (nt * 8 + g) * ROW_BYTES + off)
                    acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3] = mma(
                        da0, da1, da2, da3, tf32(x0), tf32(x1), acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3]
                    )
                    acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3] = mma(
                        da4, da5, da6, da7, tf32(x2), tf32(x3), acc_dp[s], acc_dp[s + 1], acc_dp[s + 2], acc_dp[s + 3]
                    )

            # P and dS: element e of n-tile nt is (query g + 8·(e >> 1), key 8nt + 2t + (e & 1));
            # only tiles crossing the end of the keys or the causal diagonal need a mask
            needs_mask = start_n + BLOCK_N > seqlen_k
            if CAUSAL:
                needs_mask = needs_mask or start_n + BLOCK_N - 1 > start_m + diag
            for nt in range(NT_S):
                for e in range(4):
                    r = e >> 1
                    p = ptx.ex2_approx(acc_s[nt * 4 + e] * scale2 - lse2[r])
                    if needs_mask:
                        kj = start_n + nt * 8 + 2 * tq + (e & 1)
                        masked = kj >= seqlen_k
                        if CAUSAL:
                            masked = masked or kj > start_m + warp * 16 + g + 8 * r + diag
                        if masked:
                            p = float32(0.0)
                    acc_dp[nt * 4 + e] = p * (acc_dp[nt * 4 + e] - delta_i[r])

            # dQ += dS·K_j: keys are k; a0..a3 = tf32(c0, c2, c1, c3) of n-tile nt, B rows
            # 8nt + 2t, +1 of K, head-dim columns 32jg + 4g .. +3 (n-tiles 4jg .. +3)
            for nt in range(NT_S):
                s = nt * 4
                a0, a1, a2, a3 = tf32(acc_dp[s]), tf32(acc_dp[s + 2]), tf32(acc_dp[s + 1]), tf32(acc_dp[s + 3])
                row_k = k_tile + (nt * 8 + 2 * tq) * ROW_BYTES
                for jg in range(OGROUPS):
                    v0, v1, v2, v3 = ptx.ld_shared_v4_f32(row_k + (((8 * jg + g) ^ (2 * tq)) << 4))
                    w0, w1, w2, w3 = ptx.ld_shared_v4_f32(row_k + ROW_BYTES + (((8 * jg + g) ^ (2 * tq) ^ 4) << 4))
                    o = 16 * jg
                    acc_dq[o], acc_dq[o + 1], acc_dq[o + 2], acc_dq[o + 3] = mma(
                        a0, a1, a2, a3, tf32(v0), tf32(w0), acc_dq[o], acc_dq[o + 1], acc_dq[o + 2], acc_dq[o + 3]
                    )
                    acc_dq[o + 4], acc_dq[o + 5], acc_dq[o + 6], acc_dq[o + 7] = mma(
                        a0, a1, a2, a3, tf32(v1), tf32(w1), acc_dq[o + 4], acc_dq[o + 5], acc_dq[o + 6], acc_dq[o + 7]
                    )
                    acc_dq[o + 8], acc_dq[o + 9], acc_dq[o + 10], acc_dq[o + 11] = mma(
                        a0, a1, a2, a3, tf32(v2), tf32(w2), acc_dq[o + 8], acc_dq[o + 9], acc_dq[o + 10], acc_dq[o + 11]
                    )
                    acc_dq[o + 12], acc_dq[o + 13], acc_dq[o + 14], acc_dq[o + 15] = mma(
                        a0, a1, a2, a3, tf32(v3), tf32(w3), acc_dq[o + 12], acc_dq[o + 13], acc_dq[o + 14], acc_dq[o + 15]
                    )

        ptx.cp_async_wait_all()  # no copy may land after the block exits (n_tiles = 0)
        scale = float32(softmax_scale)
        for r in range(2):
            row = start_m + warp * 16 + g + 8 * r
            if row < seqlen_q:
                for jg in range(OGROUPS):
                    for i in range(4):
                        col = 32 * jg + 8 * tq + i
                        a = (4 * jg + i) * 4 + 2 * r
                        dq[b, row, h, col] = acc_dq[a] * scale
                        dq[b, row, h, col + 4] = acc_dq[a + 1] * scale

    return tf32_bwd_dq

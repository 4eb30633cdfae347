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
(4·BLOCK_N·d).  ``smem_bytes``: 96 KiB for both at d = 64, 128 KiB for both at
d = 128 (one block an SM on an H100/H200; over 48 KiB is opted in at launch).
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, uint32
from numba_flash.config import Tf32BwdTiles
from numba_flash.kernels import copy, fragments, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (group_size, key_tiles, query_tiles, this_block, tile_partial, walk_list,
                                            walk_range)
from numba_flash.variant import VARLEN, Variant

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)


@functools.lru_cache(maxsize=None)
def tf32_bwd_dkdv_kernel(t: Tf32BwdTiles, variant: Variant):
    """``kernel[grid, threads, stream, smem_bytes(t)[0]](q, k, v, dout, lse, delta,
    dk, dv, softmax_scale)``; q, dout (B, Nq, H, d), k, v, dk, dv (B, Nk, H, d) float32
    with 16-byte aligned rows; lse, delta (B, H, Nq) float32."""
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.kv_block_m, t.kv_block_n, t.head_dim, t.threads
    F = variant.flags
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
    SW = copy.SW_TF32

    @cuda.jit
    def tf32_bwd_dkdv(q, k, v, dout, lse, delta, dk, dv, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_n, b, h0, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_N, F, True)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_n >= seqlen_k:  # the grid covers the longest sequence
            return
        tid, warp, lane, g, tq = pipeline.lane_coords()
        sw_g = copy.swizzle(g, 0, SW)  # the swizzle of the rows ≡ g (mod 8) this lane reads

        # dynamic: K | V | Q stages | dO stages (byte offsets); static: lse2 | delta
        smem = cuda.shared.array(0, float32, alignment=_ALIGN)
        k_base, v_base, q_base, do_base = pipeline.carve(smem, KV_BYTES, KV_BYTES, 2 * QT_BYTES)
        s_rows = cuda.shared.array(ROW_VALS, float32)

        ka = cuda.local.array(8, uint32)  # tf32 A fragments of K and V rows g, g + 8: two k-steps
        va = cuda.local.array(8, uint32)
        pa = cuda.local.array(4, uint32)  # tf32 A fragments of Pᵀ and dSᵀ, one k-step
        da = cuda.local.array(4, uint32)
        acc_s = cuda.local.array(S_REGS, float32)  # Sᵀ, then Pᵀ
        acc_dp = cuda.local.array(S_REGS, float32)  # dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(O_REGS, float32)
        acc_dv = cuda.local.array(O_REGS, float32)
        pipeline.zero(acc_dk, O_REGS)
        pipeline.zero(acc_dv, O_REGS)

        # K and V of this block (rows past the end zero-filled, source clamped in bounds)
        copy.copy_tile_pair(k_base, k, v_base, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, CHUNKS, 4, ROW_BYTES,
                            SW, THREADS)  # fmt: skip
        m_lo, m_hi = query_tiles(start_n, BLOCK_M, BLOCK_N, mi)

        row_k = k_base + (warp * 16 + g) * ROW_BYTES  # A rows: keys g, g + 8 of this warp
        row_v = v_base + (warp * 16 + g) * ROW_BYTES
        # GQA: the walk below once per query head of the group, in order (a deterministic sum)
        for hq in range(group_size(params, F)):
            h = h0 + hq
            vr = walk_list(fx, seq, h, start_n // BLOCK_N, True, F)  # a block mask's list of this head
            p_lo, p_hi = walk_range(m_lo, m_hi, vr, F)
            si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, score.backward_domain(F), F)
            if hq > 0:
                cuda.syncthreads()  # every warp is done with the last tile's stage, which the next prefetch reuses
            # the double-buffered walk (pipeline's docstring): i = p_lo - 1 only starts the first tile
            for i in range(p_lo - 1, p_hi):
                pipeline.wait_for_tile(i, p_lo)  # query tile i, its lse and delta (and K, V) are in shared memory
                pipeline.prefetch_queries(i, p_hi, vr, F, q_base, q, do_base, dout, s_rows, lse, delta, b, h, q0, seqlen_q,
                                          tid, BLOCK_M, CHUNKS, 4, ROW_BYTES, SW, THREADS, QT_BYTES)  # fmt: skip
                if i < p_lo:
                    continue
                start_m, q_tile, do_tile, rows_off = pipeline.query_stage(i, vr, F, q_base, do_base, BLOCK_M, QT_BYTES)

                # Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: K, V rows are m (A), Q, dO rows are n (B); then
                # Pᵀ and dSᵀ (element e of n-tile nt: key g + 8·(e >> 1), query 8nt + 2t + (e & 1))
                fragments.mma_tf32_two(acc_s, acc_dp, ka, va, row_k, row_v, q_tile, do_tile, g, tq, sw_g, KPAIRS, NT_S,
                                       ROW_BYTES)  # fmt: skip
                fragments.p_and_ds(acc_s, acc_dp, NT_S, start_m, BLOCK_M, start_n, BLOCK_N, start_n + warp * 16,
                                   start_m, si, mi, s_rows, rows_off, rows_off + BLOCK_M, True, di,
                                   tile_partial(i, vr, F), F)  # fmt: skip

                # dV += Pᵀ·dO and dK += dSᵀ·Q: queries are k (fragments.mma_tf32_rows)
                for nt in range(NT_S):
                    fragments.tf32_a_from_acc(pa, acc_s, nt * 4)
                    fragments.tf32_a_from_acc(da, acc_dp, nt * 4)
                    rows = (nt * 8 + 2 * tq) * ROW_BYTES
                    fragments.mma_tf32_rows(acc_dv, pa, do_tile + rows, g, tq, OGROUPS, ROW_BYTES)
                    fragments.mma_tf32_rows(acc_dk, da, q_tile + rows, g, tq, OGROUPS, ROW_BYTES)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no query tile)
        scale = float32(softmax_scale)
        for r in range(2):
            key = start_n + warp * 16 + g + 8 * r
            if key < seqlen_k:
                fragments.store_tf32_row(dk, b, k0 + key, hk, acc_dk, r, tq, OGROUPS, scale)
                fragments.store_tf32_row(dv, b, k0 + key, hk, acc_dv, r, tq, OGROUPS, float32(1.0))

    return tf32_bwd_dkdv


@functools.lru_cache(maxsize=None)
def tf32_bwd_dq_kernel(t: Tf32BwdTiles, variant: Variant):
    """``kernel[grid, threads, stream, smem_bytes(t)[1]](q, k, v, dout, lse, delta,
    dq, softmax_scale)``; shapes as :func:`tf32_bwd_dkdv_kernel`, dq like q."""
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.q_block_m, t.q_block_n, t.head_dim, t.threads
    F = variant.flags
    KPAIRS = HEAD_DIM // 16
    NT_S = BLOCK_N // 8  # n-tiles of S (8 keys each) = k-steps of dS·K
    OGROUPS = HEAD_DIM // 32
    CHUNKS = HEAD_DIM // 4
    S_REGS = NT_S * 4
    O_REGS = HEAD_DIM // 2
    ROW_BYTES = HEAD_DIM * 4
    Q_BYTES = BLOCK_M * ROW_BYTES
    KV_BYTES = BLOCK_N * ROW_BYTES  # one stage of K (or V)
    SW = copy.SW_TF32

    @cuda.jit
    def tf32_bwd_dq(q, k, v, dout, lse, delta, dq, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid, warp, lane, g, tq = pipeline.lane_coords()
        sw_g = copy.swizzle(g, 0, SW)
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, score.backward_domain(F), F)

        # dynamic: Q | dO | K stages | V stages (byte offsets)
        smem = cuda.shared.array(0, float32, alignment=_ALIGN)
        q_base, do_base, k_base, v_base = pipeline.carve(smem, Q_BYTES, Q_BYTES, 2 * KV_BYTES)

        qa = cuda.local.array(8, uint32)  # tf32 A fragments of Q and dO rows g, g + 8: two k-steps
        da = cuda.local.array(8, uint32)
        sa = cuda.local.array(4, uint32)  # tf32 A fragment of dS, one k-step
        acc_s = cuda.local.array(S_REGS, float32)  # S, then P
        acc_dp = cuda.local.array(S_REGS, float32)  # dP, then dS
        acc_dq = cuda.local.array(O_REGS, float32)
        stats = cuda.local.array(4, float32)  # lse (for recompute) of rows g, g + 8, then their delta
        pipeline.zero(acc_dq, O_REGS)
        for r in range(2):
            row = q0 + start_m + warp * 16 + g + 8 * r
            stats[r], stats[2 + r] = softmax.row_stats(lse, delta, b, h, row, q0 + seqlen_q, True)

        copy.copy_tile_pair(q_base, q, do_base, dout, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, 4,
                            ROW_BYTES, SW, THREADS)  # fmt: skip
        # the key tiles to visit: a range, or a block mask's list clipped to it (block_info)
        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)

        row_q = q_base + (warp * 16 + g) * ROW_BYTES  # A rows: queries g, g + 8 of this warp
        row_do = do_base + (warp * 16 + g) * ROW_BYTES
        # the double-buffered walk (pipeline's docstring): j = n_lo - 1 only starts tile n_lo
        for j in range(n_lo - 1, n_hi):
            pipeline.wait_for_tile(j, n_lo)  # key tile j (and Q, dO) is in shared memory for all
            pipeline.prefetch_keys(j, n_hi, vr, F, k_base, k, v_base, v, b, hk, k0, seqlen_k, tid, BLOCK_N, CHUNKS, 4,
                                   ROW_BYTES, SW, THREADS, KV_BYTES, 2)  # fmt: skip
            if j < n_lo:
                continue
            start_n, k_tile, v_tile = pipeline.key_stage(j, vr, F, k_base, v_base, BLOCK_N, KV_BYTES, 2)

            # S = Q·K_jᵀ and dP = dO·V_jᵀ: Q, dO rows are m (A), K, V rows are n (B); then
            # P and dS (element e of n-tile nt: query g + 8·(e >> 1), key 8nt + 2t + (e & 1))
            fragments.mma_tf32_two(acc_s, acc_dp, qa, da, row_q, row_do, k_tile, v_tile, g, tq, sw_g, KPAIRS, NT_S,
                                   ROW_BYTES)  # fmt: skip
            fragments.p_and_ds(acc_s, acc_dp, NT_S, start_m, BLOCK_M, start_n, BLOCK_N, start_m + warp * 16, start_n,
                               si, mi, stats, 0, 2, False, di, tile_partial(j, vr, F), F)  # fmt: skip

            # dQ += dS·K_j: keys are k (fragments.mma_tf32_rows)
            for nt in range(NT_S):
                fragments.tf32_a_from_acc(sa, acc_dp, nt * 4)
                fragments.mma_tf32_rows(acc_dq, sa, k_tile + (nt * 8 + 2 * tq) * ROW_BYTES, g, tq, OGROUPS, ROW_BYTES)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no key tile)
        scale = float32(softmax_scale)
        for r in range(2):
            row = start_m + warp * 16 + g + 8 * r
            if row < seqlen_q:
                fragments.store_tf32_row(dq, b, q0 + row, h, acc_dq, r, tq, OGROUPS, scale)

    return tf32_bwd_dq


def smem_bytes(t: Tf32BwdTiles) -> tuple[int, int]:
    """Dynamic shared bytes of (dK/dV, dQ): K, V + two stages of Q, dO; Q, dO + two
    stages of K, V; fp32."""
    row = 4 * t.head_dim
    return row * (2 * t.kv_block_n + 4 * t.kv_block_m), row * (2 * t.q_block_m + 4 * t.q_block_n)


def launches(t: Tf32BwdTiles, variant: Variant, sz: spec.Sizes) -> list:
    """The TF32 backward: the exact fp32 preprocess (``simt_blocked_backward``), then dK/dV
    and dQ on TF32 tensor cores."""
    hf = variant.heaviest_first  # grid order (spec.query_grid)
    from numba_flash.kernels import simt_blocked_backward

    smem_kv, smem_q = smem_bytes(t)
    return [
        simt_blocked_backward.preprocess_launch(t, t.head_dim, sz),
        spec.KernelLaunch("tf32_bwd_dkdv", tf32_bwd_dkdv_kernel(t, variant), t, spec.key_grid(sz, t.kv_block_n, hf),
                          t.threads, smem_kv, spec.dkdv_args(), (t.kv_block_m, t.kv_block_n, True)),
        spec.KernelLaunch("tf32_bwd_dq", tf32_bwd_dq_kernel(t, variant), t, spec.query_grid(sz, t.q_block_m, hf),
                          t.threads, smem_q, spec.dq_args(), (t.q_block_m, t.q_block_n, False)),
    ]  # fmt: skip

"""TF32 tensor-core FlashAttention forward for float32 inputs (opt-in: ``allow_tf32=True``).

Math, per query row i, as ``tc_forward`` but with q, k, v and p rounded to TF32 (10
mantissa bits, ``cvt.rna.tf32.f32``: round to nearest, ties away) before each
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``; everything else is fp32::

    x_ij  = tf32(q_i)·tf32(k_j) · scale · log2(e)     mma, fp32 accumulate
    m_i   = max_j x_ij                                running, per K/V tile
    alpha = 2^(m_old − m_new)
    p_ij  = 2^(x_ij − m_new)                          rounded to tf32 for P·V only
    l_i   = l_i · alpha + Σ_j p_ij                    (fp32, from the unrounded p)
    acc_i = acc_i · alpha + Σ_j tf32(p_ij) · tf32(v_j)
    o_i   = acc_i / l_i,   lse_i = m_i · ln 2 + ln l_i   (natural log)

Precision: each rounding is at most 2^-11 relative (about 4.9e-4), so O is good to about
1e-3 relative, as cuBLAS TF32 GEMMs; ``tests/test_tf32.py`` holds it to 2× the error of a
float64 attention computed from tf32-rounded Q, K, V and P (``reference.attention_tf32``).

Grid and threads:
    grid = (ceil(Nq / BLOCK_M), H, B), block = 32·WARPS threads, BLOCK_M = 16·WARPS;
    warp w owns query rows start_m + 16w .. 16w + 15.  In an m16n8 accumulator lane
    ``lane`` holds rows ``g = lane >> 2`` and ``g + 8``, columns ``2t, 2t+1``
    (``t = lane & 3``); a row's max and sum are finished across the quad with two
    ``shfl_xor`` (1, 2).

m16n8k8 tf32 fragments (``ptx.mma_m16n8k8_tf32``): a0 = A[g][t], a1 = A[g+8][t],
a2 = A[g][t+4], a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]; c as in m16n8k16.
A sum over k does not care in which order its terms come, so both products use a
permutation of k (and P·V one of n) that gives every lane contiguous data:

* S = Q·Kᵀ (k = head dim): 16 columns 16p .. 16p+15 make two k-steps; lane t owns
  columns 16p + 4t .. 16p + 4t + 3, i.e. k-step 2p has slot t ↔ column 16p+4t and slot
  t+4 ↔ 16p+4t+1, k-step 2p+1 the next two.  One ``ld.shared.v4.f32`` of K row g gives
  the b0, b1 of both k-steps (and of Q rows g, g+8 the a0..a3, once, into registers).
* O += P·V (k = key): the S accumulator has columns 2t, 2t+1 where the A operand wants
  t and t+4, so slot t ↔ key 2t and slot t+4 ↔ key 2t+1 of the 8-key n-tile:
  a0, a1, a2, a3 = tf32(c0, c2, c1, c3) and b0 = V[k0+2t][·], b1 = V[k0+2t+1][·].
  The n (head-dim) columns are permuted too: n-tile 4j+i, mma column n ↔ head-dim column
  32j + 4n + i, so lane g reads V[key][32j + 4g .. 32j + 4g + 3] with one v4 load (the
  b of four n-tiles), and holds O columns 32j + 8t .. 32j + 8t + 7 of its rows.

Per block:
    1. cp.async Q (BLOCK_M × d fp32) and the first K, V tiles into shared memory; each
       warp then takes its Q fragments (tf32) into registers, where they stay;
    2. for each K/V tile j (stage j % 2): wait, barrier, start copying tile j+1 into the
       other stage, S = Q·K_jᵀ, mask (only tiles crossing the end of the keys or the
       causal diagonal), online softmax in registers, O += P·V_j with P straight from
       the S accumulators;
    3. O = acc / l (fp32); LSE by the quad's lane 0.  Causal (bottom-right aligned):
       key tiles wholly above the diagonal are not visited.

Shared memory (fp32, one dynamic array): Q BLOCK_M·d + STAGES × (K + V) BLOCK_N·d,
``smem_bytes``: 80 KiB at d = 64 and 96 KiB at d = 128 (two blocks an SM on an
H100/H200; over 48 KiB is opted in at launch).  Rows are 256 or 512 bytes, so the same
column of every row is in the same bank; the 16-byte chunk c of row r is stored at chunk
``c ^ sw(r)``, ``sw(r) = (r & 6) ^ ((r & 1) << 2)``, which makes the three reads
conflict-free: a v4 read serves 8 lanes a phase, and for Q/K those are rows g ∈ {2i,
2i+1} at chunks 4p + t (sw(2i) ^ sw(2i+1) = 4 moves the second row to the other half of
the banks); for V they are rows 2t (or 2t+1), t = 0..3, at chunks 8j + g, g ∈ {2i, 2i+1}
(sw(2t) = 2t spreads the four rows over the chunk bits 1-2, g over bit 0).
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, uint32
from numba_flash.config import TcTiles
from numba_flash.kernels import copy, fragments, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (key_tiles, kv_pages, no_pages, this_block, tile_needs_mask, tile_partial,
                                           walk_list, walk_range)
from numba_flash.variant import DROPOUT, VARLEN, Variant

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)


@functools.lru_cache(maxsize=None)
def tf32_forward_kernel(t: TcTiles, variant: Variant):
    """``kernel[grid, threads, stream, smem_bytes(t)](q, k, v, out, lse, softmax_scale)``
    (launch through ``numba_flash._launch.launch``, which opts in to > 48 KiB).

    q (B, Nq, H, d), k, v (B, Nk, H, d), out (B, Nq, H, d): float32 with 16-byte aligned
    rows; lse (B, H, Nq) float32.
    """
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.block_m, t.block_n, t.head_dim, t.threads
    F = variant.flags
    SOFTMAX = softmax.domain(variant)  # log2 units, or FOLD with a score_mod
    STAGES = t.stages
    KPAIRS = HEAD_DIM // 16  # pairs of k-steps of Q·Kᵀ: one v4 load of K a pair
    NT_S = BLOCK_N // 8  # n-tiles of S (8 keys each) = k-steps of P·V
    NT_O = HEAD_DIM // 8  # n-tiles of O
    OGROUPS = HEAD_DIM // 32  # groups of 4 n-tiles of O: one v4 load of V a group
    CHUNKS = HEAD_DIM // 4  # 16-byte chunks in a row
    Q_REGS = HEAD_DIM // 2  # 4 words for each of the d/8 k-steps
    S_REGS = NT_S * 4
    O_REGS = HEAD_DIM // 2  # 4 floats for each of the d/8 n-tiles
    ROW_BYTES = HEAD_DIM * 4
    Q_BYTES = BLOCK_M * ROW_BYTES
    KV_BYTES = BLOCK_N * ROW_BYTES  # one stage of K (or V)
    SW = copy.SW_TF32

    pages = kv_pages if variant.paged else no_pages  # a KV cache's keys through its block table

    @cuda.jit
    def tf32_forward(q, k, v, out, lse, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid, warp, lane, g, tq = pipeline.lane_coords()
        sw_g = copy.swizzle(g, 0, SW)  # the swizzle of rows ≡ g (mod 8), which this lane reads in Q, K
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, True, F)
        pg = pages(fx, seq)

        # one dynamic shared array (sized at launch: smem_bytes), carved into
        # Q | K stages | V stages; addresses are byte offsets in the shared window
        smem = cuda.shared.array(0, float32, alignment=_ALIGN)
        q_base, k_base, v_base, _ = pipeline.carve(smem, Q_BYTES, STAGES * KV_BYTES, STAGES * KV_BYTES)

        q_frag = cuda.local.array(Q_REGS, uint32)  # tf32 A fragments of the d/8 k-steps
        p_frag = cuda.local.array(4, uint32)  # tf32 A fragment of P, one k-step
        acc_s = cuda.local.array(S_REGS, float32)
        acc_o = cuda.local.array(O_REGS, float32)
        m_i = cuda.local.array(2, float32)  # rows g, g + 8
        l_i = cuda.local.array(2, float32)
        softmax.start_rows(acc_o, O_REGS, m_i, l_i, 2)

        # the key tiles to visit: a range, or a block mask's list clipped to it (block_info)
        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        copy.copy_tile(q_base, q, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, 4, ROW_BYTES, SW, THREADS)

        # the double-buffered walk (pipeline's docstring): j = n_lo - 1 only starts tile n_lo
        for j in range(n_lo - 1, n_hi):
            pipeline.wait_for_tile(j, n_lo)  # tile j (and Q) is in shared memory for all
            if j == n_lo:  # Q fragments (tf32): rows g, g+8 of the warp's 16, kept in registers
                for p in range(KPAIRS):
                    fragments.load_tf32_a(q_frag, 8 * p, q_base + (warp * 16 + g) * ROW_BYTES,
                                          ((4 * p + tq) ^ sw_g) << 4, ROW_BYTES)  # fmt: skip
            pipeline.prefetch_keys(j, n_hi, vr, F, k_base, k, v_base, v, b, hk, k0, seqlen_k, tid, BLOCK_N, CHUNKS, 4,
                                   ROW_BYTES, SW, THREADS, KV_BYTES, STAGES, 0, False, pg)  # fmt: skip
            if j < n_lo:
                continue
            start_n, k_tile, v_tile = pipeline.key_stage(j, vr, F, k_base, v_base, BLOCK_N, KV_BYTES, STAGES)

            # S = Q·K_jᵀ: one v4 load of K row (8·nt + g) feeds the two k-steps of a pair
            pipeline.zero(acc_s, S_REGS)
            for p in range(KPAIRS):
                for nt in range(NT_S):
                    b_addr = k_tile + (nt * 8 + g) * ROW_BYTES + (((4 * p + tq) ^ sw_g) << 4)
                    fragments.mma_tf32_row_pair(acc_s, nt * 4, q_frag, 8 * p, b_addr)

            # scores into the log2 domain, masked where the tile needs it; online softmax
            # for rows g (r = 0) and g + 8 (r = 1)
            needs_mask = tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi)
            fragments.scale_and_mask(acc_s, 0, NT_S, 1, start_m + warp * 16, start_n,
                                     fragments.lane_distance(start_m + warp * 16, start_n, mi, False), si, needs_mask,
                                     tile_partial(j, vr, F), mi, False, True,
                                     score.column_frame(F), F)  # fmt: skip
            for r in range(2):
                softmax.online_softmax_row(acc_s, 2 * r, 4, NT_S, 2, acc_o, 2 * r, 4, NT_O, 2, m_i, l_i, r, 4, SOFTMAX)
            if F[DROPOUT]:  # P·V takes P ∘ Z / (1 − p); l_i kept the undropped P
                fragments.apply_dropout(acc_s, 0, NT_S, 1, start_m + warp * 16, start_n, di)

            # O += P·V_j: n-tile nt of S is k-step nt (keys 8nt..8nt+7) with slot t ↔ key
            # 2t and slot t+4 ↔ key 2t+1, so a0..a3 = tf32(c0, c2, c1, c3), and V's b0, b1
            # come from rows 8nt + 2t and 8nt + 2t + 1 (sw = 2t and 2t ^ 4)
            for nt in range(NT_S):
                fragments.tf32_a_from_acc(p_frag, acc_s, nt * 4)
                fragments.mma_tf32_rows(acc_o, p_frag, v_tile + (nt * 8 + 2 * tq) * ROW_BYTES, g, tq, OGROUPS,
                                        ROW_BYTES)  # fmt: skip

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no key tile)
        # epilogue: o = acc / l (fragments.store_tf32_row); lse = m·ln2 + ln l
        for r in range(2):
            inv_l, lse_row = softmax.finalize(score.frame_max(m_i[r], si, 8 * r, score.column_frame(F)), l_i[r], 4,
                                             SOFTMAX)  # fmt: skip
            row = start_m + warp * 16 + g + 8 * r
            if row < seqlen_q:
                fragments.store_tf32_row(out, b, q0 + row, h, acc_o, r, tq, OGROUPS, inv_l)
                if tq == 0:
                    lse[b, h, q0 + row] = lse_row

    return tf32_forward


def smem_bytes(t: TcTiles) -> int:
    """Dynamic shared bytes: Q tile + ``stages`` K tiles + ``stages`` V tiles, fp32."""
    return 4 * t.head_dim * (t.block_m + 2 * t.stages * t.block_n)


def launches(t: TcTiles, variant: Variant, sz: spec.Sizes) -> list:
    """The TF32 forward: one kernel, a block per ``block_m`` queries of a (batch, head)."""
    grid = spec.query_grid(sz, t.block_m, variant.heaviest_first)
    kernel = tf32_forward_kernel(t, variant)
    return [spec.KernelLaunch("tf32_forward", kernel, t, grid, t.threads, smem_bytes(t), spec.forward_args(),
                              (t.block_m, t.block_n, False))]

"""Tensor-core FlashAttention forward for fp16 and bf16 (mma.sync m16n8k16, fp32 accumulators).

Math, per query row i (log2 domain: the softmax scale and log2(e) are folded into
one multiply, so exponentials are ``ex2``)::

    x_ij  = s_ij · scale · log2(e)            s = Q·Kᵀ from mma, fp32
    m_i   = max_j x_ij                        running, per K/V tile
    alpha = 2^(m_old − m_new)                 rescales l_i and acc when the max grows
    p_ij  = 2^(x_ij − m_new)                  rounded to fp16/bf16: the A operand of P·V
    l_i   = l_i · alpha + Σ_j p_ij            (fp32, from the unrounded p)
    acc_i = acc_i · alpha + Σ_j p_ij · v_j    mma, fp32
    o_i   = acc_i / l_i,   lse_i = m_i · ln 2 + ln l_i   (natural log)

Grid and threads:
    grid = (ceil(Nq / BLOCK_M), H, B), block = 32·WARPS threads;
    warp w owns the WARP_ROWS = 16·MT query rows from start_m + w·WARP_ROWS (MT m-tiles:
    every K and V fragment loaded from shared memory feeds MT mma).  In an m16n8 accumulator, lane
    ``lane`` holds rows ``g = lane >> 2`` and ``g + 8``, columns ``2t, 2t+1`` with
    ``t = lane & 3`` (see ``numba_flash.ptx``); a row's max and sum are finished across
    the 4 lanes of a quad with two ``shfl_xor`` (1, 2).

Per block:
    1. cp.async Q (BLOCK_M × d) and the first K, V tiles into shared memory; each warp
       then loads its Q fragments with ldmatrix into registers, where they stay;
    2. for each K/V tile j (stage j % 2): wait for it, barrier, start copying tile j+1
       into the other stage, then S = Q·K_jᵀ (ldmatrix.x4 of K, 2 mma per load), mask
       (only tiles that cross the end of the keys or the causal diagonal), online
       softmax in registers, P packed to 16-bit pairs in registers is directly the A
       operand of O += P·V_j (ldmatrix.x4.trans of V);
    3. O = acc / l written as 16-bit pairs; LSE (float32) by the quad's lane 0.
    Causal: key tiles wholly above the diagonal (bottom-right aligned) are not visited.

Shared memory (2-byte elements, one dynamic array): Q BLOCK_M·d + STAGES × (K + V)
BLOCK_N·d (``config.tc_smem_bytes``; over 48 KiB is opted in at launch).  Rows are d·2 bytes
(128 or 256), so the 8 rows an ldmatrix reads would all hit the same banks; the 16-byte
chunk c of row r is stored at chunk ``c ^ (r & 7)`` (XOR swizzle), which spreads any 8
consecutive rows over all 32 banks, for the cp.async writes and the ldmatrix reads alike.

Inputs are passed as uint16 views (cp.async moves bytes; the dtype matters only to
mma and to the pack of P and O), the output as a uint32 view (two 16-bit values a word).
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, uint16, uint32
from numba_flash.config import TcTiles

NEG_INF = float32(-math.inf)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FULL_MASK = 0xFFFFFFFF
_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)


@functools.lru_cache(maxsize=None)
def forward_kernel(t: TcTiles, causal: bool, dtype: str):
    """``kernel[grid, threads, stream, config.tc_smem_bytes(t)](q, k, v, out32, lse, softmax_scale)``
    (launch through ``numba_flash._launch.launch``, which opts in to > 48 KiB).

    q (B, Nq, H, d) and k, v (B, Nk, H, d) as uint16 views of fp16/bf16 data, out32
    (B, Nq, H, d/2) a uint32 view of the fp16/bf16 output, lse (B, H, Nq) float32.
    """
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.block_m, t.block_n, t.head_dim, t.threads
    CAUSAL = causal
    STAGES = t.stages
    KSTEPS = HEAD_DIM // 16  # k-slices of Q·Kᵀ
    NT_S = BLOCK_N // 8  # n-tiles of S (8 keys each)
    NT_O = HEAD_DIM // 8  # n-tiles of O (8 columns each)
    PSTEPS = BLOCK_N // 16  # k-slices of P·V
    CHUNKS = HEAD_DIM // 8  # 16-byte chunks in a row
    MT = t.m_tiles  # 16-row m-tiles per warp: each K/V fragment feeds MT mma
    WARP_ROWS = 16 * MT
    S_TILE, O_TILE, Q_TILE = NT_S * 4, NT_O * 4, KSTEPS * 4  # registers per m-tile
    Q_REGS, S_REGS, O_REGS, ROW_REGS = MT * Q_TILE, MT * S_TILE, MT * O_TILE, 2 * MT
    Q_BYTES = BLOCK_M * HEAD_DIM * 2
    KV_BYTES = BLOCK_N * HEAD_DIM * 2  # one stage of K (or V)
    KV_STAGES_BYTES = t.stages * KV_BYTES
    ROW_BYTES = HEAD_DIM * 2
    mma = ptx.mma_m16n8k16_f16_acc if dtype == "float16" else ptx.mma_m16n8k16_bf16_acc
    pack = ptx.pack_f16x2 if dtype == "float16" else ptx.pack_bf16x2

    @cuda.jit
    def tc_forward(q, k, v, out32, lse, softmax_scale):
        start_m = cuda.blockIdx.x * BLOCK_M
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane >> 2  # accumulator rows g and g + 8
        tq = lane & 3  # accumulator columns 2·tq, 2·tq + 1
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
        diag = seqlen_k - seqlen_q  # query i sees keys j <= i + diag
        scale_log2 = float32(softmax_scale * LOG2E)

        # one dynamic shared array (sized at launch: config.tc_smem_bytes), carved into
        # Q | K stages | V stages; addresses are byte offsets in the shared window
        smem = cuda.shared.array(0, uint16, alignment=_ALIGN)
        q_base = ptx.smem_addr(smem, 0)
        k_base = q_base + Q_BYTES
        v_base = k_base + KV_STAGES_BYTES

        q_frag = cuda.local.array(Q_REGS, uint32)
        acc_s = cuda.local.array(S_REGS, float32)
        acc_o = cuda.local.array(O_REGS, float32)
        p_frag = cuda.local.array(Q_TILE, uint32)  # P of one k-slice, all m-tiles (MT·4 words)
        m_i = cuda.local.array(ROW_REGS, float32)  # rows g, g+8 of each m-tile
        l_i = cuda.local.array(ROW_REGS, float32)
        for i in range(O_REGS):
            acc_o[i] = float32(0.0)
        for r in range(ROW_REGS):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)

        end_n = seqlen_k
        if CAUSAL:  # key tiles wholly above the diagonal are skipped
            end_n = min(seqlen_k, max(0, start_m + BLOCK_M + diag))
        n_tiles = (end_n + BLOCK_N - 1) // BLOCK_N

        # Q: BLOCK_M rows, 16-byte chunk c of row r at swizzled chunk c ^ (r & 7);
        # rows past the end are zero-filled (their source row clamped in bounds)
        for idx in range(tid, BLOCK_M * CHUNKS, THREADS):
            r = idx // CHUNKS
            c = idx - r * CHUNKS
            row = start_m + r
            dst = q_base + r * ROW_BYTES + ((c ^ (r & 7)) << 4)
            ptx.cp_async_16_zfill(dst, q, (b, min(row, seqlen_q - 1), h, c * 8), row < seqlen_q)

        # j = -1 only starts the copy of tile 0; tile j+1 is copied while j is used
        for j in range(-1, n_tiles):
            stage = j % STAGES
            if j >= 0:
                ptx.cp_async_wait_group(0)
                # tile j (and Q) landed for every thread's copies; every warp is done
                # with tile j-1, whose stage the copies of tile j+1 overwrite next
                cuda.syncthreads()
            if j == 0:  # Q fragments: A operands, WARP_ROWS rows × d, kept in registers
                for mt in range(MT):
                    for kk in range(KSTEPS):
                        row = warp * WARP_ROWS + mt * 16 + (lane & 15)
                        chunk = 2 * kk + (lane >> 4)
                        a0, a1, a2, a3 = ptx.ldmatrix_x4(q_base + row * ROW_BYTES + ((chunk ^ (row & 7)) << 4))
                        q_frag[mt * Q_TILE + kk * 4 + 0] = a0
                        q_frag[mt * Q_TILE + kk * 4 + 1] = a1
                        q_frag[mt * Q_TILE + kk * 4 + 2] = a2
                        q_frag[mt * Q_TILE + kk * 4 + 3] = a3
            if j + 1 < n_tiles:
                nxt = ((j + 1) % STAGES) * KV_BYTES
                for idx in range(tid, BLOCK_N * CHUNKS, THREADS):
                    r = idx // CHUNKS
                    c = idx - r * CHUNKS
                    row = (j + 1) * BLOCK_N + r
                    off = nxt + r * ROW_BYTES + ((c ^ (r & 7)) << 4)
                    src = (b, min(row, seqlen_k - 1), h, c * 8)
                    ptx.cp_async_16_zfill(k_base + off, k, src, row < seqlen_k)
                    ptx.cp_async_16_zfill(v_base + off, v, src, row < seqlen_k)
            ptx.cp_async_commit()
            if j < 0:
                continue
            start_n = j * BLOCK_N
            k_tile = k_base + stage * KV_BYTES
            v_tile = v_base + stage * KV_BYTES

            # S = Q·K_jᵀ: one ldmatrix.x4 gives the B fragments of two n-tiles, used by
            # 2·MT mma
            for i in range(S_REGS):
                acc_s[i] = float32(0.0)
            for kk in range(KSTEPS):
                for np2 in range(NT_S // 2):
                    row = np2 * 16 + (lane & 7) + ((lane >> 4) << 3)
                    chunk = 2 * kk + ((lane >> 3) & 1)
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(k_tile + row * ROW_BYTES + ((chunk ^ (row & 7)) << 4))
                    for mt in range(MT):
                        qa = mt * Q_TILE + kk * 4
                        n0 = mt * S_TILE + np2 * 8  # accumulator index of n-tile 2·np2
                        mma(acc_s, n0, q_frag, qa, b0, b1)
                        mma(acc_s, n0 + 4, q_frag, qa, b2, b3)

            # scale into the log2 domain; mask only tiles that need it
            needs_mask = start_n + BLOCK_N > seqlen_k
            if CAUSAL:
                needs_mask = needs_mask or start_n + BLOCK_N - 1 > start_m + diag
            for i in range(S_REGS):
                acc_s[i] *= scale_log2
            if needs_mask:
                for mt in range(MT):
                    for nt in range(NT_S):
                        for i in range(4):
                            col = start_n + nt * 8 + 2 * tq + (i & 1)
                            row = start_m + warp * WARP_ROWS + mt * 16 + g + 8 * (i >> 1)
                            masked = col >= seqlen_k
                            if CAUSAL:
                                masked = masked or col > row + diag
                            if masked:
                                acc_s[mt * S_TILE + nt * 4 + i] = NEG_INF

            # online softmax for rows g (r = 0) and g + 8 (r = 1) of each m-tile
            for mt in range(MT):
                for r in range(2):
                    mr = mt * 2 + r
                    sr = mt * S_TILE + 2 * r  # the row's first accumulator
                    mx = m_i[mr]
                    for nt in range(NT_S):
                        mx = max(mx, max(acc_s[sr + nt * 4], acc_s[sr + nt * 4 + 1]))
                    mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))  # across the quad
                    mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
                    m_use = mx if mx != NEG_INF else float32(0.0)  # no -inf - -inf
                    alpha = ptx.ex2_approx(m_i[mr] - m_use)
                    m_i[mr] = mx
                    row_sum = float32(0.0)
                    for nt in range(NT_S):
                        p0 = ptx.ex2_approx(acc_s[sr + nt * 4] - m_use)
                        p1 = ptx.ex2_approx(acc_s[sr + nt * 4 + 1] - m_use)
                        acc_s[sr + nt * 4] = p0
                        acc_s[sr + nt * 4 + 1] = p1
                        row_sum += p0 + p1
                    l_i[mr] = l_i[mr] * alpha + row_sum  # a per-lane partial: the quad adds at the end
                    orow = mt * O_TILE + 2 * r
                    for nt in range(NT_O):
                        acc_o[orow + nt * 4] *= alpha
                        acc_o[orow + nt * 4 + 1] *= alpha

            # O += P·V_j: the S accumulators of n-tiles 2·ps and 2·ps+1, packed, are the
            # A fragment of k-slice ps
            for ps in range(PSTEPS):
                for mt in range(MT):
                    s0 = mt * S_TILE + ps * 8
                    p_frag[mt * 4 + 0] = pack(acc_s[s0], acc_s[s0 + 1])
                    p_frag[mt * 4 + 1] = pack(acc_s[s0 + 2], acc_s[s0 + 3])
                    p_frag[mt * 4 + 2] = pack(acc_s[s0 + 4], acc_s[s0 + 5])
                    p_frag[mt * 4 + 3] = pack(acc_s[s0 + 6], acc_s[s0 + 7])
                for nn in range(NT_O // 2):
                    row = ps * 16 + (lane & 7) + ((lane >> 3) & 1) * 8
                    chunk = 2 * nn + (lane >> 4)
                    b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(v_tile + row * ROW_BYTES + ((chunk ^ (row & 7)) << 4))
                    for mt in range(MT):
                        o0 = mt * O_TILE + nn * 8
                        mma(acc_o, o0, p_frag, mt * 4, b0, b1)
                        mma(acc_o, o0 + 4, p_frag, mt * 4, b2, b3)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (n_tiles = 0)
        # epilogue: o = acc / l as 16-bit pairs; lse = m·ln2 + ln l
        for mt in range(MT):
            for r in range(2):
                mr = mt * 2 + r
                l_row = l_i[mr]
                l_row += cuda.shfl_xor_sync(FULL_MASK, l_row, 1)
                l_row += cuda.shfl_xor_sync(FULL_MASK, l_row, 2)
                row = start_m + warp * WARP_ROWS + mt * 16 + g + 8 * r
                inv = float32(1.0) / l_row if l_row > float32(0.0) else float32(0.0)
                if row < seqlen_q:
                    orow = mt * O_TILE + 2 * r
                    for nt in range(NT_O):
                        out32[b, row, h, nt * 4 + tq] = pack(acc_o[orow + nt * 4] * inv, acc_o[orow + nt * 4 + 1] * inv)
                    if tq == 0:
                        if l_row > float32(0.0):
                            lse[b, h, row] = m_i[mr] * float32(LN2) + math.log(l_row)
                        else:
                            lse[b, h, row] = NEG_INF

    return tc_forward

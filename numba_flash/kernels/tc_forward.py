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
    2. for each K/V tile j (stage j % STAGES): wait for it, barrier, start copying tile
       j + STAGES − 1 into the stage of tile j − 1, then S = Q·K_jᵀ (ldmatrix.x4 of K,
       2 mma per load), mask (only tiles that cross the end of the keys or the causal
       diagonal), online softmax in registers, P packed to 16-bit pairs in registers
       is directly the A operand of O += P·V_j (ldmatrix.x4.trans of V);
    3. O = acc / l written as 16-bit pairs; LSE (float32) by the quad's lane 0.
    Causal: key tiles wholly above the diagonal (bottom-right aligned) are not visited.

Shared memory (2-byte elements, one dynamic array): Q BLOCK_M·d + STAGES × (K + V)
BLOCK_N·d (``smem_bytes``; over 48 KiB is opted in at launch; STAGES is 2 but for the
decode tiles, ``config.tc_decode_tiles``).  Rows are d·2 bytes (a multiple of 64), so
the 8 rows an ldmatrix reads would hit the same banks; the 16-byte chunks of a row are
XOR-swizzled by the row (``copy.SW_16BIT``), which spreads any 8 consecutive rows over
all 32 banks, for the cp.async writes and the ldmatrix reads alike.

Head dims: the tile's d is one of ``config.TC_TILE_DIMS``; an array head dim below it
is zero-filled past its end on load (the zero columns add nothing to Q·Kᵀ, and the
output's are not written).  Rows that are not 16-byte aligned (a head dim that is not
a multiple of 8, or odd strides) are copied by plain loads instead of cp.async
(``aligned``), and an odd head dim's output is stored 16 bits at a time
(``config.tc_array_layout``).  At d = 96 and past 128 the Q fragments are read from the
shared Q tile at every k-slice instead of being kept in registers (``q_in_regs``).

Inputs are passed as uint16 views (cp.async moves bytes; the dtype matters only to
mma and to the pack of P and O), the output as a uint32 view (two 16-bit values a word;
uint16 for an odd head dim: ``config.tc_out_view``), but split-KV's partial outputs
(``Variant.split``) as float32, merged later (``kernels.merge``).

The decode tiles (one warp, ``config.tc_decode_tiles``): a lane copies one 16-byte chunk
column of each K and V tile (``copy._copy_lane_rows``); with split-KV the parts are merged
in this launch, after step 3: by the S splits of a row tile as one thread-block cluster
(``Variant.cluster``: each stages its rows and lse in its shared memory, over the Q and K/V
stages, ``merge.stage_part_row``, and the cluster merges them through distributed shared
memory, ``merge.merge_in_cluster``), or by the last split to finish
(``kernels.merge.merge_if_last``; the Q tile's shared memory then holds its flag and rows'
lse); the GQA decode swap
(``fx[SPLIT_AT][2]`` = G > 0) reads its rows, query heads h·G … of the sequence's one
query, from q seen as (B, H, 1, d).
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, float32, uint16, uint32
from numba_flash.config import TcTiles, tc_array_layout, tc_out_view
from numba_flash.kernels import copy, fragments, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (key_tiles, kv_pages, no_pages, this_block, tile_needs_mask, tile_partial,
                                           walk_list, walk_range)
from numba_flash.kernels.flex import SPLIT_AT
from numba_flash.kernels.merge import (MAX_CLUSTER, cluster_stage_floats, merge_if_last, merge_in_cluster,
                                       merges_in_cluster, merges_in_kernel, no_merge, stage_part_row)
from numba_flash.variant import CLUSTER, DROPOUT, SPLIT, VARLEN, Variant

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)


@functools.lru_cache(maxsize=None)
def tc_forward_kernel(t: TcTiles, variant: Variant, dtype: str):
    """``kernel[grid, threads, stream, smem_bytes(t)](q, k, v, out32, lse, softmax_scale, params, alibi,
    cu_seqlens_q, cu_seqlens_k)``
    (launch through ``numba_flash._launch.launch``, which opts in to > 48 KiB).

    q (B, Nq, H, d) and k, v (B, Nk, H, d) as uint16 views of fp16/bf16 data, out32
    (B, Nq, H, d/2) a uint32 view of the fp16/bf16 output, lse (B, H, Nq) float32.
    """
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.block_m, t.block_n, t.head_dim, t.threads
    F = variant.flags
    SOFTMAX = softmax.domain(variant)  # log2 units, or FOLD with a score_mod
    STAGES = t.stages
    KSTEPS = HEAD_DIM // 16  # k-slices of Q·Kᵀ
    NT_S = BLOCK_N // 8  # n-tiles of S (8 keys each)
    NT_O = HEAD_DIM // 8  # n-tiles of O (8 columns each)
    PSTEPS = BLOCK_N // 16  # k-slices of P·V
    CHUNKS = HEAD_DIM // 8  # 16-byte chunks in a row
    DCOLS, NT_W, SYNC, HALVES = tc_array_layout(t)  # the arrays' head dim against the tile's
    DATA_DIM = t.data_dim or t.head_dim
    Q_IN_REGS = t.q_in_regs
    MT = t.m_tiles  # 16-row m-tiles per warp: each K/V fragment feeds MT mma
    WARP_ROWS = 16 * MT
    S_TILE, O_TILE, Q_TILE = NT_S * 4, NT_O * 4, KSTEPS * 4  # registers per m-tile
    Q_REGS, S_REGS, O_REGS, ROW_REGS = (MT * Q_TILE if Q_IN_REGS else MT * 4), MT * S_TILE, MT * O_TILE, 2 * MT
    ROW_BYTES = HEAD_DIM * 2
    Q_BYTES = BLOCK_M * ROW_BYTES
    KV_BYTES = BLOCK_N * ROW_BYTES  # one stage of K (or V)
    SW = copy.SW_16BIT
    # one warp (the decode tiles) copies 32 chunks of K and V a tile: a column a lane, so
    # the address arithmetic is not most of its instructions (copy._copy_lane_rows)
    KV_COPY = copy.LANE_ROWS if t.warps == 1 and copy.lane_rows_fit(THREADS, CHUNKS, BLOCK_N) else False
    mma = ptx.mma_m16n8k16_f16_acc if dtype == "float16" else ptx.mma_m16n8k16_bf16_acc
    BF16 = dtype == "bfloat16"
    pages = kv_pages if variant.paged else no_pages  # a KV cache's keys through its block table
    # split-KV's parts merged by the last split (kernels.merge.merges_in_kernel: the decode tiles)
    merge_splits = merge_if_last if variant.split and variant.cluster == 0 and merges_in_kernel(t) else no_merge
    # or, with the splits of a row tile as one thread-block cluster, through its shared memory
    CLUSTERED = variant.split and variant.cluster > 0
    if CLUSTERED:
        assert merges_in_cluster(t) and variant.cluster <= MAX_CLUSTER
        assert 4 * cluster_stage_floats(t.block_m, DATA_DIM) <= smem_bytes(t)

    @cuda.jit
    def tc_forward(q, k, v, out32, lse, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid, warp, lane, _, tq = pipeline.lane_coords()
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, True, F)
        pg = pages(fx, seq)

        # one dynamic shared array (sized at launch: smem_bytes), carved into
        # Q | K stages | V stages; addresses are byte offsets in the shared window
        smem = cuda.shared.array(0, uint16, alignment=_ALIGN)
        q_base, k_base, v_base, _ = pipeline.carve(smem, Q_BYTES, STAGES * KV_BYTES, STAGES * KV_BYTES)
        stats = cuda.shared.array(0, float32, alignment=_ALIGN)  # Q's rows again after the walk (the merge's)

        q_frag = cuda.local.array(Q_REGS, uint32)  # all k-slices, or one (not Q_IN_REGS)
        acc_s = cuda.local.array(S_REGS, float32)
        acc_o = cuda.local.array(O_REGS, float32)
        p_frag = cuda.local.array(Q_TILE, uint32)  # P of one k-slice, all m-tiles (MT·4 words)
        m_i = cuda.local.array(ROW_REGS, float32)  # rows g, g+8 of each m-tile
        l_i = cuda.local.array(ROW_REGS, float32)
        softmax.start_rows(acc_o, O_REGS, m_i, l_i, ROW_REGS)

        # the key tiles to visit: a range, or a block mask's list clipped to it (block_info)
        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        if F[SPLIT] and fx[SPLIT_AT][2] > 0:  # the GQA decode swap: rows are query heads h·G … of the sequence's one
            # query, q seen as (B, H, 1, d) (kvcache), so its heads are the rows copied
            G = fx[SPLIT_AT][2]
            copy.copy_tile(q_base, q, seq, 0, h * G + start_m, h * G + seqlen_q, tid, BLOCK_M, CHUNKS, 8, ROW_BYTES, SW,
                           THREADS, False, DCOLS, SYNC)  # fmt: skip
        else:
            copy.copy_tile(q_base, q, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, 8, ROW_BYTES, SW,
                           THREADS, False, DCOLS, SYNC)  # fmt: skip

        # the walk of STAGES buffers (pipeline's docstring): j < n_lo only starts tiles
        # n_lo .. n_lo + STAGES - 2; step j starts tile j + STAGES - 1
        for j in range(n_lo - (STAGES - 1), n_hi):
            pipeline.wait_for_stage(j, n_lo, STAGES)  # tile j (and Q) is in shared memory for all
            if j == n_lo and Q_IN_REGS:  # Q fragments: A operands, WARP_ROWS rows × d, kept in registers
                for mt in range(MT):
                    for kk in range(KSTEPS):
                        fragments.load_a(q_frag, mt * Q_TILE + kk * 4, q_base, warp * WARP_ROWS + mt * 16, kk, lane,
                                         ROW_BYTES)  # fmt: skip
            pipeline.prefetch_keys(j + STAGES - 2, n_hi, vr, F, k_base, k, v_base, v, b, hk, k0, seqlen_k, tid, BLOCK_N,
                                   CHUNKS, 8, ROW_BYTES, SW, THREADS, KV_BYTES, STAGES, DCOLS, SYNC, pg,
                                   KV_COPY)  # fmt: skip
            if j < n_lo:
                continue
            start_n, k_tile, v_tile = pipeline.key_stage(j, vr, F, k_base, v_base, BLOCK_N, KV_BYTES, STAGES)

            # S = Q·K_jᵀ: one ldmatrix.x4 gives the B fragments of two n-tiles, used by
            # 2·MT mma
            pipeline.zero(acc_s, S_REGS)
            for kk in range(KSTEPS):
                if not Q_IN_REGS:  # this k-slice's Q fragments, from the resident Q tile
                    for mt in range(MT):
                        fragments.load_a(q_frag, mt * 4, q_base, warp * WARP_ROWS + mt * 16, kk, lane, ROW_BYTES)
                for np2 in range(NT_S // 2):
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(fragments.ldsm_b(k_tile, np2 * 16, kk, lane, ROW_BYTES))
                    for mt in range(MT):
                        qa = mt * Q_TILE + kk * 4 if Q_IN_REGS else mt * 4
                        n0 = mt * S_TILE + np2 * 8  # accumulator index of n-tile 2·np2
                        mma(acc_s, n0, q_frag, qa, b0, b1)
                        mma(acc_s, n0 + 4, q_frag, qa, b2, b3)

            # scores into the log2 domain, masked where the tile needs it; online softmax
            # for rows g (r = 0) and g + 8 (r = 1) of each m-tile
            needs_mask = tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi)
            fragments.scale_and_mask(acc_s, 0, NT_S, MT, start_m + warp * WARP_ROWS, start_n,
                                     fragments.lane_distance(start_m + warp * WARP_ROWS, start_n, mi, False), si, needs_mask,
                                     tile_partial(j, vr, F), mi,
                                     False, True, score.column_frame(F), F)  # fmt: skip
            for mt in range(MT):
                for r in range(2):
                    softmax.online_softmax_row(acc_s, mt * S_TILE + 2 * r, 4, NT_S, 2, acc_o, mt * O_TILE + 2 * r, 4,
                                               NT_O, 2, m_i, l_i, mt * 2 + r, 4, SOFTMAX)  # fmt: skip

            if F[DROPOUT]:  # P·V takes P ∘ Z / (1 − p); l_i kept the undropped P
                fragments.apply_dropout(acc_s, 0, NT_S, MT, start_m + warp * WARP_ROWS, start_n, di)

            # O += P·V_j: the S accumulators of n-tiles 2·ps and 2·ps+1, packed, are the
            # A fragment of k-slice ps
            for ps in range(PSTEPS):
                for mt in range(MT):
                    fragments.pack_a(p_frag, mt * 4, acc_s, mt * S_TILE + ps * 8, BF16)
                for nn in range(NT_O // 2):
                    b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(fragments.ldsm_bt(v_tile, ps * 16, nn, lane, ROW_BYTES))
                    for mt in range(MT):
                        o0 = mt * O_TILE + nn * 8
                        mma(acc_o, o0, p_frag, mt * 4, b0, b1)
                        mma(acc_o, o0 + 4, p_frag, mt * 4, b2, b3)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no key tile)
        if CLUSTERED:
            cuda.syncthreads()  # every warp's last reads of the K/V stages, which the staged rows overwrite
        # epilogue: o = acc / l as 16-bit pairs; lse = m·ln2 + ln l
        for mt in range(MT):
            for r in range(2):
                m_row = score.frame_max(m_i[mt * 2 + r], si, 16 * mt + 8 * r, score.column_frame(F))
                inv_l, lse_row = softmax.finalize(m_row, l_i[mt * 2 + r], 4, SOFTMAX)
                row = start_m + warp * WARP_ROWS + mt * 16 + (lane >> 2) + 8 * r  # lane >> 2, not g: g kept
                # live through the loop costs the register that tips d = 64 into spilling
                if row < seqlen_q and CLUSTERED:  # a split's partial output, staged for its cluster's merge
                    stage_part_row(stats, row - start_m, acc_o, mt * O_TILE + 2 * r, NT_W, tq, inv_l, lse_row, BLOCK_M,
                                   DATA_DIM)  # fmt: skip
                elif row < seqlen_q:
                    if F[SPLIT]:  # a split's partial output, merged later: fp32
                        fragments.store_row_floats(out32, b, q0 + row, h, acc_o, mt * O_TILE + 2 * r, NT_W, tq, inv_l,
                                                   DCOLS)  # fmt: skip
                    else:
                        fragments.store_row_pairs(out32, b, q0 + row, h, acc_o, mt * O_TILE + 2 * r, NT_W, tq, inv_l,
                                                  BF16, DCOLS, HALVES)  # fmt: skip
                    if tq == 0:
                        lse[b, h, q0 + row] = lse_row
        # split-KV: the last split of the row tile to finish merges the parts (when the call asks: kvcache)
        if CLUSTERED:
            merge_in_cluster(stats, fx, seq, h, start_m, seqlen_q, BLOCK_M, DATA_DIM, tid, THREADS, BF16, F[CLUSTER])
        else:
            merge_splits(out32, lse, fx, stats, seq, h, q0, start_m, seqlen_q, BLOCK_M, DATA_DIM, tid, THREADS, BF16)

    return tc_forward


def smem_bytes(t: TcTiles) -> int:
    """Dynamic shared bytes: Q tile + ``stages`` K tiles + ``stages`` V tiles, 2 bytes an element."""
    return 2 * t.head_dim * (t.block_m + 2 * t.stages * t.block_n)


def launches(t: TcTiles, variant: Variant, dtype: str, sz: spec.Sizes) -> list:
    """The forward: one kernel, a block per ``block_m`` queries of a (batch, head)
    (varlen: of a sequence; the grid covers the longest)."""
    grid = spec.query_grid(sz, t.block_m, variant.heaviest_first)
    kernel = tc_forward_kernel(t, variant, dtype)
    return [spec.KernelLaunch("tc_forward", kernel, t, grid, t.threads, smem_bytes(t),
                              spec.forward_args("u16", "f32" if variant.split else tc_out_view(t)),
                              (t.block_m, t.block_n, False),
                              cluster=spec.cluster_dims(variant))]  # fmt: skip

"""Hopper (sm_90a) FlashAttention forward for fp16 and bf16: wgmma, first version (issue #13).

Experimental: runs only when ``NUMBA_FLASH_WGMMA=1`` (``plan.wgmma_forward``), and has
not yet run on a GPU: its simulator twins (``_ptx_sim``) check the algorithm and the
layouts, the hardware has checked only the intrinsics (tests/test_ptx_hopper.py).

Math: as ``tc_forward`` (log2 domain, online softmax, O = acc / l, lse), with the two
products on the warpgroup's tensor cores::

    S   = Q·K_jᵀ    wgmma m64n{BLOCK_N}k16, A = Q and B = K_j from shared memory (K-major)
    acc += P·V_j    wgmma m64n{d}k16, A = P from registers (S's accumulators packed to
                    16-bit pairs: mma.sync's A layout, ``fragments.pack_a``), B = V_jᵀ
                    from shared memory (K-major: keys contiguous)

Grid and threads: grid = (ceil(Nq / 64), H, B) (``spec.query_grid``), one warpgroup of
128 threads a block.  Warp w owns query rows 16w … 16w + 15 of the block's 64: a
wgmma m64nN accumulator holds, per thread, exactly an m16n8 accumulator's values for
N/8 n-tiles of its warp's rows, so the score step, the online softmax, dropout and the
epilogue are ``tc_forward``'s (``fragments``, ``softmax``) on one m-tile a warp.

Per block, per key tile j (no pipelining yet: one stage, the copies then the products):
    1. K_j by cp.async into 8 × 8 core matrices (``copy.SW_CORE``); V_j by plain loads,
       stored transposed (Vᵀ in core matrices: keys contiguous); Q (64 × d) once, the
       same way as K, before the first tile;
    2. wait for the copies, ``fence.proxy.async`` (the copies are generic-proxy writes,
       wgmma reads through the async proxy), barrier;
    3. S by d/16 wgmma, then wait; mask, online softmax, dropout in registers;
    4. P packed into BLOCK_N/16 A fragments (distinct registers: wgmma reads them
       asynchronously), acc += P·V_j by BLOCK_N/16 wgmma, then wait;
    5. barrier before the next tile's copies overwrite K_j and V_jᵀ.

Shared memory (one dynamic array, 2-byte elements): Q 64·d + K BLOCK_N·d + Vᵀ BLOCK_N·d
(``smem_bytes``: 48 KiB at d = 128).  Core matrix (i, c) of a K-major tile (rows i·8 …,
columns c·8 …) lies at i·(8·row bytes) + c·128, its 8 rows 16 bytes apart: the
descriptors' LBO is 128 (along K) and SBO 8·row bytes (along M or N), the no-swizzle
layout the H200 confirmed (``ptx.wgmma_desc_host``).

Not yet (issue #13): TMA and mbarrier stages, warp specialization (a producer
warpgroup, two consumers ping-ponged), 128-byte swizzle, head dims other than 64 and
128, FlexAttention mods, a KV cache's pages and splits (the copies take pages, but the
plan does not send them here untested), the backward, and any measurement.
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, uint16, uint32
from numba_flash.config import TcTiles, tc_array_layout, tc_out_view
from numba_flash.kernels import copy, fragments, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (key_tiles, kv_pages, no_pages, this_block, tile_needs_mask, tile_partial,
                                           walk_list, walk_range)
from numba_flash.variant import DROPOUT, VARLEN, Variant

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (see ptx.SMEM_ALIGN)

#: The tiles: one warpgroup, 64 query rows, 64 keys a tile (``TcTiles`` fields).
BLOCK_M, BLOCK_N, WARPS = 64, 64, 4
HEAD_DIMS = (64, 128)  # the head dims this version runs (wgmma n = d for P·V)


def tiles(head_dim: int) -> TcTiles:
    """The tile shape at ``head_dim`` (one of ``HEAD_DIMS``)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}: the wgmma forward runs d in {HEAD_DIMS}")
    return TcTiles(head_dim, BLOCK_M, BLOCK_N, WARPS, m_tiles=1, stages=2, q_in_regs=False)


@device_function
def copy_tile_transposed(smem, smem_base, tile, src, b, h, row0, row_end, tid, ROWS, CHUNKS, THREADS, DCOLS, pg):
    """The (ROWS × 8·CHUNKS) rows ``row0 …`` of ``src`` (16-bit) stored transposed at the
    shared address ``tile`` of the dynamic array ``smem`` (whose address is
    ``smem_base``): element (key r, column n) goes to core matrix (n // 8, r // 8) of the
    K-major Vᵀ tile, at byte (n // 8)·(ROWS·16) + (r // 8)·128 + (n % 8)·16 + (r % 8)·2.
    Rows at or past ``row_end`` and columns at or past ``DCOLS`` (when set) are zeros."""
    at0 = (tile - smem_base) >> 1  # the tile's first element in ``smem``
    for idx in range(tid, ROWS * CHUNKS, THREADS):
        r = idx // CHUNKS
        c = idx - r * CHUNKS
        row = row0 + r
        base = at0 + c * (ROWS * 8) + (r >> 3) * 64 + (r & 7)
        for e in range(4):  # columns 8c + 2e and 8c + 2e + 1, bounded as copy's plain loads
            w = copy.load_pair(src, b, row, h, 8 * c + 2 * e, row_end, DCOLS, pg)
            smem[base + 16 * e] = uint16(w & uint32(0xFFFF))
            smem[base + 16 * e + 8] = uint16(w >> uint32(16))


@functools.lru_cache(maxsize=None)
def wgmma_forward_kernel(t: TcTiles, variant: Variant, dtype: str):
    """``kernel[grid, 128, stream, smem_bytes(t)](q, k, v, out32, lse, softmax_scale, params, alibi, cu_seqlens_q,
    cu_seqlens_k, fx)``: ``tc_forward_kernel``'s arguments and outputs."""
    HEAD_DIM, THREADS = t.head_dim, t.threads
    F = variant.flags
    SOFTMAX = softmax.domain(variant)
    KSTEPS = HEAD_DIM // 16  # k-slices of Q·Kᵀ
    NT_S = BLOCK_N // 8
    NT_O = HEAD_DIM // 8
    PSTEPS = BLOCK_N // 16  # k-slices of P·V
    CHUNKS = HEAD_DIM // 8
    S_REGS, O_REGS, P_REGS = NT_S * 4, NT_O * 4, PSTEPS * 4  # registers a thread (literals for local.array)
    DCOLS, NT_W, SYNC, HALVES = tc_array_layout(t)
    ROW_BYTES = HEAD_DIM * 2
    Q_BYTES, KV_BYTES = BLOCK_M * ROW_BYTES, BLOCK_N * ROW_BYTES
    QK_SBO, VT_SBO = 8 * ROW_BYTES, 16 * BLOCK_N  # core-matrix strides along M/N
    NONE = ptx.SWIZZLE_NONE
    kind = "f16" if dtype == "float16" else "bf16"
    wgmma_s = getattr(ptx, f"wgmma_m64n{BLOCK_N}k16_{kind}_acc")
    wgmma_o = getattr(ptx, f"wgmma_m64n{HEAD_DIM}k16_{kind}_rs_acc")
    BF16 = dtype == "bfloat16"
    pages = kv_pages if variant.paged else no_pages

    @cuda.jit
    def wgmma_forward(q, k, v, out32, lse, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:
            return
        tid, warp, lane, _, tq = pipeline.lane_coords()
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, True, F)
        pg = pages(fx, seq)

        smem = cuda.shared.array(0, uint16, alignment=_ALIGN)
        q_base, k_base, vt_base, _ = pipeline.carve(smem, Q_BYTES, KV_BYTES, KV_BYTES)

        acc_s = cuda.local.array(S_REGS, float32)
        acc_o = cuda.local.array(O_REGS, float32)
        p_frag = cuda.local.array(P_REGS, uint32)  # one A fragment a k-slice: wgmma reads them late
        m_i = cuda.local.array(2, float32)  # rows g, g + 8 of the warp's m-tile
        l_i = cuda.local.array(2, float32)
        softmax.start_rows(acc_o, O_REGS, m_i, l_i, 2)

        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        copy.copy_tile(q_base, q, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, 8, ROW_BYTES, copy.SW_CORE,
                       THREADS, False, DCOLS, SYNC)  # fmt: skip
        for j in range(n_lo, n_hi):
            start_n, _, _ = pipeline.key_stage(j, vr, F, k_base, vt_base, BLOCK_N, KV_BYTES, 1)
            copy.copy_tile(k_base, k, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, CHUNKS, 8, ROW_BYTES,
                           copy.SW_CORE, THREADS, False, DCOLS, SYNC, pg)  # fmt: skip
            copy_tile_transposed(smem, q_base, vt_base, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, CHUNKS,
                                 THREADS, DCOLS, pg)  # fmt: skip
            ptx.cp_async_wait_all()
            ptx.fence_proxy_async()  # the generic-proxy writes (cp.async, stores) before wgmma's async-proxy reads
            cuda.syncthreads()  # every thread's chunks of Q, K_j and V_jᵀ are in place

            # S = Q·K_jᵀ: d/16 wgmma chained on one accumulator (the first one overwrites it)
            ptx.wgmma_fence()
            for kk in range(KSTEPS):
                wgmma_s(acc_s, 0, ptx.wgmma_desc(q_base + kk * 256, 128, QK_SBO, NONE),
                        ptx.wgmma_desc(k_base + kk * 256, 128, QK_SBO, NONE), 1 if kk > 0 else 0)  # fmt: skip
            ptx.wgmma_commit_group()
            ptx.wgmma_wait_group(0)

            needs_mask = tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi)
            fragments.scale_and_mask(acc_s, 0, NT_S, 1, start_m + warp * 16, start_n, si, needs_mask,
                                     tile_partial(j, vr, F), mi, False, True, F)  # fmt: skip
            for r in range(2):
                softmax.online_softmax_row(acc_s, 2 * r, 4, NT_S, 2, acc_o, 2 * r, 4, NT_O, 2, m_i, l_i, r, 4,
                                           SOFTMAX)  # fmt: skip
            if F[DROPOUT]:
                fragments.apply_dropout(acc_s, 0, NT_S, 1, start_m + warp * 16, start_n, di)

            # acc += P·V_j: P's k-slice ps is S's n-tiles 2ps, 2ps + 1, packed
            for ps in range(PSTEPS):
                fragments.pack_a(p_frag, ps * 4, acc_s, ps * 8, BF16)
            ptx.wgmma_fence()  # acc_o and p_frag were written by ordinary instructions
            for ps in range(PSTEPS):
                wgmma_o(acc_o, 0, p_frag, ps * 4, ptx.wgmma_desc(vt_base + ps * 256, 128, VT_SBO, NONE), 1)
            ptx.wgmma_commit_group()
            ptx.wgmma_wait_group(0)
            cuda.syncthreads()  # every warp has read K_j and V_jᵀ before the next tile's copies

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no key tile)
        for r in range(2):
            inv_l, lse_row = softmax.finalize(m_i[r], l_i[r], 4, SOFTMAX)
            row = start_m + warp * 16 + (lane >> 2) + 8 * r
            if row < seqlen_q:
                fragments.store_row_pairs(out32, b, q0 + row, h, acc_o, 2 * r, NT_W, tq, inv_l, BF16, DCOLS, HALVES)
                if tq == 0:
                    lse[b, h, q0 + row] = lse_row

    return wgmma_forward


def smem_bytes(t: TcTiles) -> int:
    """Dynamic shared bytes: Q, one K and one Vᵀ tile, 2 bytes an element."""
    return 2 * t.head_dim * (t.block_m + 2 * t.block_n)


def launches(t: TcTiles, variant: Variant, dtype: str, sz: spec.Sizes) -> list:
    """One kernel, a block per 64 queries of a (batch, head), as ``tc_forward``'s."""
    grid = spec.query_grid(sz, t.block_m, variant.heaviest_first)
    return [spec.KernelLaunch("wgmma_forward", wgmma_forward_kernel(t, variant, dtype), t, grid, t.threads,
                              smem_bytes(t), spec.forward_args("u16", tc_out_view(t)),
                              (t.block_m, t.block_n, False))]  # fmt: skip

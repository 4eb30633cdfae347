"""Tensor-core FlashAttention backward for fp16 and bf16 (mma.sync m16n8k16, fp32 accumulators).

Math (P is recomputed from the saved log-sum-exp, in the log2 domain of the forward;
``scale2 = softmax_scale · log2(e)``, ``lse2 = lse · log2(e)``)::

    delta_i = Σ_c dO_ic · O_ic                          preprocess, fp32
    p_ij    = 2^(s_ij · scale2 − lse2_i)                 s = q_i · k_j (mma), 0 where masked
    dp_ij   = dO_i · v_j                                 mma
    ds_ij   = p_ij · (dp_ij − delta_i)
    dv_j    = Σ_i p_ij · dO_i       dk_j = scale · Σ_i ds_ij · q_i       (dkdv kernel)
    dq_i    = scale · Σ_j ds_ij · k_j                                     (dq kernel)

P and dS are rounded to the input dtype to become mma operands (as FlashAttention-2
does); every sum is fp32.  dQ has its own pass over the key tiles, so every output
element is written once by the warp that owns it: no atomics, bitwise deterministic.

Kernels (4 warps, 16 rows a warp; fragment layouts as in ``numba_flash.ptx``):

- ``preprocess``: grid (ceil(Nq / 128), H, B); a warp reads 32 query rows of dO and O
  and writes delta (B, H, Nq) float32: on 16-byte-aligned rows in 16-byte chunks,
  several rows at once (``_warp_deltas_fn``, also the Hopper backward's ``stats``),
  else one row at a time, its lanes on consecutive 16-bit pairs (``_row_delta_fn``).
- ``dkdv``: grid (ceil(Nk / BLOCK_N), H, B); warp w owns keys start_n + 16w .. +15.  K
  and V of the block are staged once; Q, dO (and lse, delta) tiles of BLOCK_M queries
  are double-buffered with cp.async.  Per query tile a warp forms Sᵀ = K·Qᵀ and
  dPᵀ = V·dOᵀ (B operands: Q and dO rows by ldmatrix), then dV += Pᵀ·dO and
  dK += dSᵀ·Q (A operands: Pᵀ and dSᵀ packed from the accumulators in registers;
  B operands: dO and Q by ldmatrix.trans).  Causal: query tiles that see none of the
  block's keys are skipped.
- ``dq``: grid (ceil(Nq / BLOCK_M), H, B); warp w owns queries start_m + 16w .. +15
  (Q and dO fragments in registers, or re-read from shared memory per k-slice past
  d = 128: ``q_frags_in_regs``); K, V tiles double-buffered; S = Q·Kᵀ,
  dP = dO·Vᵀ (K, V by ldmatrix), dQ += dS·K (K by ldmatrix.trans).  Causal: key tiles
  wholly above the diagonal are skipped.
- Past d = 128 (``split_dkdv``) a lane cannot hold both dK and dV (d floats): ``dv``
  (Sᵀ, then dV += Pᵀ·dO) and ``dk`` (Sᵀ, dPᵀ, then dK += dSᵀ·Q) are the dK/dV kernel
  with one accumulator each.

Head dims: as the forward (``tc_forward``'s docstring): tiles of ``TC_TILE_DIMS``, the
arrays' columns past their d zero-filled on load and never written.

Masking: ``fragments.scale_and_mask`` scales Sᵀ / S and sets −inf where a (query,
key) is invisible, on the tiles ``block_info.tile_needs_mask`` names; a row's lse comes
through ``softmax.lse_for_recompute`` (+inf for rows past the end and rows that saw no
key), so every such P is exactly 0.

Shared memory: one dynamic uint16 array (XOR-swizzled 16-byte chunks, as the forward)
for the 16-bit tiles, plus a small static float32 array for lse and delta
(``smem_bytes``).  Inputs arrive as uint16 views, outputs leave as uint32
views (two 16-bit values a word).
"""

from __future__ import annotations

import functools

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, uint16, uint32
from numba_flash.config import TcBwdTiles, tc_array_layout, tc_out_view
from numba_flash.kernels import copy, fragments, pipeline, score, softmax, spec
from numba_flash.kernels.block_info import (group_size, key_tiles, query_tiles, this_block, tile_partial, walk_list,
                                            walk_range)
from numba_flash.variant import VARLEN, Variant

_ALIGN = ptx.SMEM_ALIGN


def _row_delta_fn(head_dim: int, dtype: str):
    """A device function ``(out16, dout16, b, h, row, lane) -> float32``: delta of one
    row, summed by the whole warp (call it with the same ``row`` on every lane): lane
    ``l`` reads the 32-bit pairs ``l, l + 32, ...`` of the row (a warp's loads are
    consecutive words, whole 32-byte sectors) and the lanes are summed with ``shfl_xor``.
    One thread a row, reading its row pair by pair, made every load touch 32 rows'
    sectors: at (1, 16, 65536, 128) it read 3.8 GB from DRAM for O and dO's 0.54 GB
    (ncu, docs/benchmarks/2026-12-01-s8)."""
    WORDS = head_dim // 2
    STEPS = -(-WORDS // 32)  # pairs a lane reads per row
    ODD = head_dim % 2 == 1  # the last element alone
    unpack = ptx.unpack_f16x2 if dtype == "float16" else ptx.unpack_bf16x2

    @device_function
    def row_delta(out16, dout16, b, h, row, lane):
        acc = float32(0.0)
        for i in range(STEPS):
            w = lane + 32 * i
            if w < WORDS:
                o0, o1 = unpack(uint32(out16[b, row, h, 2 * w]) | (uint32(out16[b, row, h, 2 * w + 1]) << 16))
                d0, d1 = unpack(uint32(dout16[b, row, h, 2 * w]) | (uint32(dout16[b, row, h, 2 * w + 1]) << 16))
                acc += o0 * d0 + o1 * d1
        if ODD and lane == 0:
            o0, _ = unpack(uint32(out16[b, row, h, 2 * WORDS]))
            d0, _ = unpack(uint32(dout16[b, row, h, 2 * WORDS]))
            acc += o0 * d0
        return softmax.allreduce_sum(acc, 32)

    return row_delta


def _warp_deltas_fn(head_dim: int, dtype: str):
    """A device function ``(out16, dout16, b, h, q0, first, n, lane) -> float32``: lane
    ``r`` of a warp gets delta of row ``q0 + first + r`` (0 where ``first + r >= n``), for
    16-byte-aligned rows (the Hopper backward's, and the mma.sync one's ``aligned``
    tiles).  ``L`` lanes a row (the row's 16-byte chunks rounded up to a power of two)
    each load one chunk of O and of dO (``ptx.ld_global_nc_v4_b32``), ``R = 32 / L``
    rows a step, ``L`` steps, two an iteration with both steps' loads issued first;
    each step's sum is taken over its ``L`` lanes (``softmax.allreduce_sum``) and
    handed to the lane of its row by one shuffle.  The columns past the last whole
    chunk (``head_dim % 8``) are read one at a time by a row's first lane.  On an H100
    the Hopper preprocess at (1, 16, 16384, 128) (135 MB) took 50–52 µs this way (2.7
    TB/s), 66–68 µs one row a warp at a time in 16-bit loads (``_row_delta_fn``);
    docs/benchmarks/2026-12-06-s39."""
    CHUNKS = head_dim // 8  # whole 16-byte chunks a row
    TAIL = head_dim % 8  # columns past them
    L = 1
    while L < CHUNKS:
        L *= 2  # lanes a row
    R = 32 // L  # rows a step
    U = 2 if L > 1 else 1  # steps a loop iteration
    unpack = ptx.unpack_f16x2 if dtype == "float16" else ptx.unpack_bf16x2

    @device_function
    def dot_words(o, g):
        """Σ of the products of the 16-bit pairs in the words ``o`` and ``g``."""
        o0, o1 = unpack(o)
        g0, g1 = unpack(g)
        return o0 * g0 + o1 * g1

    @device_function
    def row_part(out16, dout16, b, h, q0, first, n, r, c):
        """This lane's part of row ``first + r``'s delta (its chunk, the tail on chunk 0)."""
        acc = float32(0.0)
        if first + r < n:
            row = q0 + first + r
            if c < CHUNKS:
                o = ptx.ld_global_nc_v4_b32(out16, (b, row, h, 8 * c))
                g = ptx.ld_global_nc_v4_b32(dout16, (b, row, h, 8 * c))
                acc = (dot_words(o[0], g[0]) + dot_words(o[1], g[1])) + (dot_words(o[2], g[2]) + dot_words(o[3], g[3]))
            if TAIL > 0 and c == 0:
                for e in range(8 * CHUNKS, 8 * CHUNKS + TAIL):
                    o0, _ = unpack(uint32(out16[b, row, h, e]))
                    g0, _ = unpack(uint32(dout16[b, row, h, e]))
                    acc += o0 * g0
        return acc

    @device_function
    def warp_deltas(out16, dout16, b, h, q0, first, n, lane):
        c, sub = lane & (L - 1), lane // L  # the lane's chunk, its row in a step
        mine = float32(0.0)
        for step in range(0, L, U):  # U steps' loads issued before the first one's shuffles
            part0 = row_part(out16, dout16, b, h, q0, first, n, step * R + sub, c)
            part1 = float32(0.0)
            if U == 2:
                part1 = row_part(out16, dout16, b, h, q0, first, n, (step + 1) * R + sub, c)
            for u in range(U):
                acc = softmax.allreduce_sum(part0 if u == 0 else part1, L)  # every lane: its row's delta
                x = cuda.shfl_sync(softmax.FULL_MASK, acc, (lane % R) * L)  # row (step + u)·R + lane % R
                if lane // R == step + u:
                    mine = x
        return mine

    return warp_deltas


@device_function
def _warp_rows():
    """``(lane, first, h, b)`` of a preprocess thread: its lane, the first of its warp's
    32 rows (a block owns blockDim.x of them), the block's head and batch."""
    lane = cuda.threadIdx.x & 31
    return lane, cuda.blockIdx.x * cuda.blockDim.x + (cuda.threadIdx.x - lane), cuda.blockIdx.y, cuda.blockIdx.z


@functools.lru_cache(maxsize=None)
def tc_bwd_preprocess_kernel(head_dim: int, dtype: str, aligned: bool = False):
    """``kernel[grid, 128, stream](out16, dout16, delta)``: delta = rowsum(dO∘O), from
    uint16 views of O and dO (any strides with the last axis contiguous); ``head_dim``
    is the arrays' (an odd one's last element is read alone).  A block owns 128 rows, a
    warp 32 of them: ``aligned`` (every row 16-byte aligned) in 16-byte chunks, several
    rows at once (``_warp_deltas_fn``), else one row at a time (``_row_delta_fn``)."""
    row_delta = _row_delta_fn(head_dim, dtype)
    warp_deltas = _warp_deltas_fn(head_dim, dtype)
    ALIGNED = aligned

    @cuda.jit
    def tc_bwd_preprocess(out16, dout16, delta):
        lane, first, h, b = _warp_rows()
        if ALIGNED:
            n = out16.shape[1]
            acc = warp_deltas(out16, dout16, b, h, 0, first, n, lane)
            if first + lane < n:
                delta[b, h, first + lane] = acc
            return
        for r in range(32):
            row = first + r
            if row < out16.shape[1]:  # the same for the whole warp: the shuffles see every lane
                acc = row_delta(out16, dout16, b, h, row, lane)
                if lane == 0:
                    delta[b, h, row] = acc

    return tc_bwd_preprocess


@functools.lru_cache(maxsize=None)
def tc_bwd_stats_kernel(head_dim: int, dtype: str, varlen: bool = False):
    """``kernel[grid, 128, stream](out16, dout16, lse, stats, cu_seqlens_q)``: the
    preprocess of the Hopper backward (``wgmma_backward``): ``stats[b, h, 0, row]`` =
    the row's lse as the backward subtracts it (``softmax.lse_for_recompute``),
    ``stats[b, h, 1, row]`` = delta, for every row of ``stats`` (padded past the
    queries: +inf and 0 there, so that P and dS are exactly 0); the grid covers its
    rows.  ``varlen``: the grid's z is the sequence, whose rows lie from
    ``wgmma_backward.stats_row0`` on, its length rounded up to 128 of them.  Rows are
    16-byte aligned (the Hopper backward's rule): a warp reads its 32 rows in 16-byte
    chunks, several at once (``_warp_deltas_fn``), and lane r writes row r's pair."""
    warp_deltas = _warp_deltas_fn(head_dim, dtype)
    VARLEN = varlen
    from numba_flash.kernels.wgmma_backward import ROWS, stats_row0

    @cuda.jit
    def tc_bwd_stats(out16, dout16, lse, stats, cu_q):
        lane, first, h, b = _warp_rows()
        q0, n, s0, end = 0, out16.shape[1], 0, stats.shape[3]
        if VARLEN:  # sequence b of the packed arrays (batch 0)
            q0, n, s0 = cu_q[b], cu_q[b + 1] - cu_q[b], stats_row0(cu_q, b)
            end = s0 + (n + ROWS - 1) // ROWS * ROWS
            b = 0
        if s0 + first < end:  # the same for the whole warp (ends are multiples of 128)
            acc = warp_deltas(out16, dout16, b, h, q0, first, n, lane)
            row = first + lane
            lse2 = softmax.POS_INF
            if row < n:
                lse2 = softmax.lse_for_recompute(lse[b, h, q0 + row], True)
            stats[b, h, 0, s0 + row] = lse2
            stats[b, h, 1, s0 + row] = acc

    return tc_bwd_stats


@functools.lru_cache(maxsize=None)
def tc_bwd_dkdv_kernel(t: TcBwdTiles, variant: Variant, dtype: str, part: str = "dkdv"):
    """``kernel[grid, threads, stream, smem](q, k, v, dout, lse, delta, dk32, dv32, softmax_scale, params, alibi,
    cu_seqlens_q, cu_seqlens_k)``; ``part`` "dk" or "dv" computes and writes only that
    one (``split_dkdv``; the other output is not touched)."""
    WANT_DK, WANT_DV = part in ("dkdv", "dk"), part in ("dkdv", "dv")
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.kv_block_m, t.kv_block_n, t.head_dim, t.threads
    F = variant.flags
    KSTEPS = HEAD_DIM // 16  # k-slices over d (Sᵀ, dPᵀ)
    NT_S = BLOCK_M // 8  # n-tiles of Sᵀ (8 queries each)
    NT_O = HEAD_DIM // 8  # n-tiles of dK, dV
    PSTEPS = BLOCK_M // 16  # k-slices over queries (dV, dK)
    CHUNKS = HEAD_DIM // 8
    DCOLS, NT_W, SYNC, HALVES = tc_array_layout(t)  # the arrays' head dim against the tile's
    ROW_BYTES = HEAD_DIM * 2
    KV_BYTES = BLOCK_N * ROW_BYTES
    QT_BYTES = BLOCK_M * ROW_BYTES  # one stage of Q (or dO)
    S_REGS, O_REGS, F_REGS = NT_S * 4, NT_O * 4, KSTEPS * 4
    DK_REGS, DV_REGS = (O_REGS if WANT_DK else 4), (O_REGS if WANT_DV else 4)  # 4: unused
    ROW_VALS = 4 * BLOCK_M  # lse2 and delta, two stages
    KV_IN_REGS = t.kv_frags_in_regs  # else K and V fragments are re-read from shared memory
    SW = copy.SW_16BIT
    BF16 = dtype == "bfloat16"

    @cuda.jit
    def tc_bwd_dkdv(q, k, v, dout, lse, delta, dk32, dv32, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_n, b, h0, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_N, F, True)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_n >= seqlen_k:  # the grid covers the longest sequence
            return
        tid, warp, lane, g, tq = pipeline.lane_coords()

        # dynamic: K | V | Q stages | dO stages (16-bit, swizzled); static: lse2 | delta
        smem = cuda.shared.array(0, uint16, alignment=_ALIGN)
        k_base, v_base, q_base, do_base = pipeline.carve(smem, KV_BYTES, KV_BYTES, 2 * QT_BYTES)
        s_rows = cuda.shared.array(ROW_VALS, float32)  # [stage][lse2 (BLOCK_M) | delta (BLOCK_M)]

        k_frag = cuda.local.array(F_REGS, uint32)
        v_frag = cuda.local.array(F_REGS, uint32)
        ka = cuda.local.array(4, uint32)  # this k-slice's K and V fragments
        va = cuda.local.array(4, uint32)
        p_frag = cuda.local.array(4, uint32)  # Pᵀ and dSᵀ of one k-slice, packed: A operands
        ds_frag = cuda.local.array(4, uint32)
        acc_s = cuda.local.array(S_REGS, float32)
        acc_dp = cuda.local.array(S_REGS, float32)
        acc_dk = cuda.local.array(DK_REGS, float32)
        acc_dv = cuda.local.array(DV_REGS, float32)
        pipeline.zero(acc_dk, DK_REGS)
        pipeline.zero(acc_dv, DV_REGS)

        # K and V of this block (rows past the end zero-filled)
        copy.copy_tile_pair(k_base, k, v_base, v, b, hk, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, CHUNKS, 8, ROW_BYTES,
                            SW, THREADS, False, DCOLS, SYNC)  # fmt: skip
        m_lo, m_hi = query_tiles(start_n, BLOCK_M, BLOCK_N, mi)

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
                if i == p_lo and KV_IN_REGS:  # K and V fragments of this warp's 16 keys: A operands
                    for kk in range(KSTEPS):
                        fragments.load_a(k_frag, kk * 4, k_base, warp * 16, kk, lane, ROW_BYTES)
                        fragments.load_a(v_frag, kk * 4, v_base, warp * 16, kk, lane, ROW_BYTES)
                pipeline.prefetch_queries(i, p_hi, vr, F, q_base, q, do_base, dout, s_rows, lse, delta, b, h, q0, seqlen_q,
                                          tid, BLOCK_M, CHUNKS, 8, ROW_BYTES, SW, THREADS, QT_BYTES,
                                          DCOLS, SYNC)  # fmt: skip
                if i < p_lo:
                    continue
                start_m, q_tile, do_tile, rows_off = pipeline.query_stage(i, vr, F, q_base, do_base, BLOCK_M, QT_BYTES)

                # Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (not for dV alone): Q and dO rows are the n dimension
                pipeline.zero(acc_s, S_REGS)
                pipeline.zero(acc_dp, S_REGS)
                for kk in range(KSTEPS):
                    if KV_IN_REGS:
                        for e in range(4):
                            ka[e] = k_frag[kk * 4 + e]
                            va[e] = v_frag[kk * 4 + e]
                    else:
                        fragments.load_a(ka, 0, k_base, warp * 16, kk, lane, ROW_BYTES)
                        if WANT_DK:
                            fragments.load_a(va, 0, v_base, warp * 16, kk, lane, ROW_BYTES)
                    fragments.mma_rows(acc_s, ka, 0, q_tile, kk, lane, NT_S, ROW_BYTES, BF16)
                    if WANT_DK:
                        fragments.mma_rows(acc_dp, va, 0, do_tile, kk, lane, NT_S, ROW_BYTES, BF16)

                # Pᵀ and dSᵀ: element e of n-tile nt is (key g + 8·(e >> 1), query nt·8 + 2·tq + (e & 1))
                fragments.p_and_ds(acc_s, acc_dp, NT_S, start_m, BLOCK_M, start_n, BLOCK_N, start_n + warp * 16,
                                   start_m, si, mi, s_rows, rows_off, rows_off + BLOCK_M, True, di,
                                   tile_partial(i, vr, F), F)  # fmt: skip

                # dV += Pᵀ·dO and dK += dSᵀ·Q: queries are the k dimension (ldmatrix.trans)
                for ps in range(PSTEPS):
                    if WANT_DV:
                        fragments.pack_a(p_frag, 0, acc_s, ps * 8, BF16)
                        fragments.mma_rows_trans(acc_dv, p_frag, do_tile, ps * 16, lane, NT_O, ROW_BYTES, BF16)
                    if WANT_DK:
                        fragments.pack_a(ds_frag, 0, acc_dp, ps * 8, BF16)
                        fragments.mma_rows_trans(acc_dk, ds_frag, q_tile, ps * 16, lane, NT_O, ROW_BYTES, BF16)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no query tile)
        # epilogue: dK (times the softmax scale) and dV as 16-bit pairs, written once
        scale = float32(softmax_scale)
        for r in range(2):
            key = start_n + warp * 16 + g + 8 * r
            if key < seqlen_k:
                if WANT_DK:
                    fragments.store_row_pairs(dk32, b, k0 + key, hk, acc_dk, 2 * r, NT_W, tq, scale, BF16, DCOLS,
                                              HALVES)  # fmt: skip
                if WANT_DV:
                    fragments.store_row_pairs(dv32, b, k0 + key, hk, acc_dv, 2 * r, NT_W, tq, float32(1.0), BF16, DCOLS,
                                              HALVES)  # fmt: skip

    return tc_bwd_dkdv


@functools.lru_cache(maxsize=None)
def tc_bwd_dq_kernel(t: TcBwdTiles, variant: Variant, dtype: str):
    """``kernel[grid, threads, stream, smem](q, k, v, dout, lse, delta, dq32, softmax_scale, params, alibi,
    cu_seqlens_q, cu_seqlens_k)``."""
    BLOCK_M, BLOCK_N, HEAD_DIM, THREADS = t.q_block_m, t.q_block_n, t.head_dim, t.threads
    F = variant.flags
    KSTEPS = HEAD_DIM // 16
    NT_S = BLOCK_N // 8
    NT_O = HEAD_DIM // 8
    PSTEPS = BLOCK_N // 16
    CHUNKS = HEAD_DIM // 8
    DCOLS, NT_W, SYNC, HALVES = tc_array_layout(t)  # the arrays' head dim against the tile's
    ROW_BYTES = HEAD_DIM * 2
    Q_BYTES = BLOCK_M * ROW_BYTES
    KV_BYTES = BLOCK_N * ROW_BYTES  # one stage of K (or V)
    FRAGS_IN_REGS = t.q_frags_in_regs
    S_REGS, O_REGS, F_REGS = NT_S * 4, NT_O * 4, (KSTEPS * 4 if FRAGS_IN_REGS else 4)
    SW = copy.SW_16BIT
    BF16 = dtype == "bfloat16"

    @cuda.jit
    def tc_bwd_dq(q, k, v, dout, lse, delta, dq32, softmax_scale, params, alibi, cu_q, cu_k, fx):
        start_m, b, h, hk, q0, k0, mi, seq = this_block(q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        seqlen_q, seqlen_k = mi[0], mi[1]
        if F[VARLEN] and start_m >= seqlen_q:  # the grid covers the longest sequence
            return
        tid, warp, lane, g, tq = pipeline.lane_coords()
        si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, score.backward_domain(F), F)

        # dynamic: Q | dO | K stages | V stages (16-bit, swizzled)
        smem = cuda.shared.array(0, uint16, alignment=_ALIGN)
        q_base, do_base, k_base, v_base = pipeline.carve(smem, Q_BYTES, Q_BYTES, 2 * KV_BYTES)

        q_frag = cuda.local.array(F_REGS, uint32)  # all k-slices, or one (not FRAGS_IN_REGS)
        do_frag = cuda.local.array(F_REGS, uint32)
        acc_s = cuda.local.array(S_REGS, float32)
        acc_dp = cuda.local.array(S_REGS, float32)
        acc_dq = cuda.local.array(O_REGS, float32)
        ds_frag = cuda.local.array(4, uint32)  # dS of one k-slice, packed: the A operand
        stats = cuda.local.array(4, float32)  # lse (for recompute) of rows g, g + 8, then their delta
        pipeline.zero(acc_dq, O_REGS)
        for r in range(2):
            row = q0 + start_m + warp * 16 + g + 8 * r
            stats[r], stats[2 + r] = softmax.row_stats(lse, delta, b, h, row, q0 + seqlen_q, True)

        copy.copy_tile_pair(q_base, q, do_base, dout, b, h, q0 + start_m, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, 8,
                            ROW_BYTES, SW, THREADS, False, DCOLS, SYNC)  # fmt: skip
        # the key tiles to visit: a range, or a block mask's list clipped to it (block_info)
        vr = walk_list(fx, seq, h, start_m // BLOCK_M, False, F)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)

        # the double-buffered walk (pipeline's docstring): j = n_lo - 1 only starts tile n_lo
        for j in range(n_lo - 1, n_hi):
            pipeline.wait_for_tile(j, n_lo)  # key tile j (and Q, dO) is in shared memory for all
            if j == n_lo and FRAGS_IN_REGS:  # Q and dO fragments of this warp's 16 queries: A operands
                for kk in range(KSTEPS):
                    fragments.load_a(q_frag, kk * 4, q_base, warp * 16, kk, lane, ROW_BYTES)
                    fragments.load_a(do_frag, kk * 4, do_base, warp * 16, kk, lane, ROW_BYTES)
            pipeline.prefetch_keys(j, n_hi, vr, F, k_base, k, v_base, v, b, hk, k0, seqlen_k, tid, BLOCK_N, CHUNKS, 8,
                                   ROW_BYTES, SW, THREADS, KV_BYTES, 2, DCOLS, SYNC)  # fmt: skip
            if j < n_lo:
                continue
            start_n, k_tile, v_tile = pipeline.key_stage(j, vr, F, k_base, v_base, BLOCK_N, KV_BYTES, 2)

            # S = Q·K_jᵀ and dP = dO·V_jᵀ: K and V rows are the n dimension
            pipeline.zero(acc_s, S_REGS)
            pipeline.zero(acc_dp, S_REGS)
            for kk in range(KSTEPS):
                fa = kk * 4
                if not FRAGS_IN_REGS:  # this k-slice's fragments, from the resident Q and dO tiles
                    fa = 0
                    fragments.load_a(q_frag, 0, q_base, warp * 16, kk, lane, ROW_BYTES)
                    fragments.load_a(do_frag, 0, do_base, warp * 16, kk, lane, ROW_BYTES)
                fragments.mma_rows(acc_s, q_frag, fa, k_tile, kk, lane, NT_S, ROW_BYTES, BF16)
                fragments.mma_rows(acc_dp, do_frag, fa, v_tile, kk, lane, NT_S, ROW_BYTES, BF16)

            # P and dS: element e of n-tile nt is (query g + 8·(e >> 1), key nt·8 + 2·tq + (e & 1))
            fragments.p_and_ds(acc_s, acc_dp, NT_S, start_m, BLOCK_M, start_n, BLOCK_N, start_m + warp * 16, start_n,
                               si, mi, stats, 0, 2, False, di, tile_partial(j, vr, F), F)  # fmt: skip

            # dQ += dS·K_j: keys are the k dimension (ldmatrix.trans of K rows)
            for ps in range(PSTEPS):
                fragments.pack_a(ds_frag, 0, acc_dp, ps * 8, BF16)
                fragments.mma_rows_trans(acc_dq, ds_frag, k_tile, ps * 16, lane, NT_O, ROW_BYTES, BF16)

        ptx.cp_async_wait_all()  # no copy may land after the block exits (no key tile)
        scale = float32(softmax_scale)
        for r in range(2):
            row = start_m + warp * 16 + g + 8 * r
            if row < seqlen_q:
                fragments.store_row_pairs(dq32, b, q0 + row, h, acc_dq, 2 * r, NT_W, tq, scale, BF16, DCOLS, HALVES)

    return tc_bwd_dq


PRE_THREADS = 128  # preprocess: one query row a thread


def smem_bytes(t: TcBwdTiles) -> tuple[int, int]:
    """Dynamic shared bytes of (dK/dV, dQ): dK/dV holds K, V and two stages of Q and dO;
    dQ holds Q, dO and two stages of K and V (2-byte elements)."""
    row = 2 * t.head_dim
    return row * (2 * t.kv_block_n + 4 * t.kv_block_m), row * (2 * t.q_block_m + 4 * t.q_block_n)


#: What each dK/dV kernel reads and writes (``KernelLaunch.io``): both parts stage K, V
#: and walk Q, dO, lse, delta; each writes its own gradient.
_PART_IO = {part: tuple((r, "r") for r in ("q", "k", "v", "dout", "lse", "delta")) + tuple((g, "w") for g in grads)
            for part, grads in (("dkdv", ("dk", "dv")), ("dk", ("dk",)), ("dv", ("dv",)))}  # fmt: skip


def launches(t: TcBwdTiles, variant: Variant, dtype: str, sz: spec.Sizes) -> list:
    """The backward: preprocess (delta), dK/dV (a block per 16·warps keys of a KV head;
    ``split_dkdv``: dV, then dK), dQ (a block per 16·warps queries)."""
    smem_kv, smem_q = smem_bytes(t)
    parts = ("dv", "dk") if t.split_dkdv else ("dkdv",)
    out = tc_out_view(t)
    return [
        spec.KernelLaunch("tc_bwd_preprocess", tc_bwd_preprocess_kernel(t.data_dim or t.head_dim, dtype, t.aligned), t,
                          spec.preprocess_grid(sz, PRE_THREADS), PRE_THREADS, 0, spec.preprocess_args("u16")),
        *(spec.KernelLaunch(f"tc_bwd_{part}", tc_bwd_dkdv_kernel(t, variant, dtype, part), t,
                            spec.key_grid(sz, t.kv_block_n, variant.heaviest_first), t.threads, smem_kv,
                            spec.dkdv_args("u16", out), (t.kv_block_m, t.kv_block_n, True),
                            _PART_IO[part]) for part in parts),
        spec.KernelLaunch("tc_bwd_dq", tc_bwd_dq_kernel(t, variant, dtype), t,
                          spec.query_grid(sz, t.q_block_m, variant.heaviest_first), t.threads, smem_q,
                          spec.dq_args("u16", out), (t.q_block_m, t.q_block_n, False)),
    ]  # fmt: skip


def stats_launch(t, dtype: str, sz: spec.Sizes, varlen: bool = False) -> spec.KernelLaunch:
    """The Hopper backward's preprocess (``tc_bwd_stats_kernel``): a thread per row of
    the padded ``stats`` (``wgmma_backward.stats_shape``: the query rows rounded up to
    128, what ``spec.query_grid``'s 128-row blocks cover; varlen: each sequence's);
    ``t``: the tiles of the kernels it serves (their head dim)."""
    args = (spec.Arg("out", "u16"), spec.Arg("dout", "u16"), spec.Arg("lse"), spec.Arg("stats"),
            spec.Arg("cu_seqlens_q"))  # fmt: skip
    return spec.KernelLaunch("tc_bwd_stats", tc_bwd_stats_kernel(t.data_dim or t.head_dim, dtype, varlen), t,
                             spec.query_grid(sz, PRE_THREADS), PRE_THREADS, 0, args, (),
                             (("out", "r"), ("dout", "r"), ("lse", "r"), ("stats", "w")))  # fmt: skip

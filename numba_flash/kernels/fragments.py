"""mma.sync fragments: where a lane's values sit, shared by the tensor-core kernels.

The fp16/bf16 kernels (``mma.sync`` m16n8k16) and the TF32 kernels (m16n8k8) share the
m16n8 fp32 accumulator layout: lane ``lane`` holds, of each 16 × 8 n-tile, rows
``g = lane >> 2`` and ``g + 8`` and columns ``2t, 2t + 1`` (``t = lane & 3``), as
elements ``e = 0, 1`` (row g) and ``e = 2, 3`` (row g + 8) of 4 consecutive registers.
An accumulator array holds n-tile ``nt`` at ``[base + 4·nt, base + 4·nt + 4)``, so
one row's values in it are ``base + 2·(row half) + 4·nt + e`` (e < 2): the layout
``softmax.online_softmax_row`` is given.

:func:`scale_and_mask` is the kernels' score step on such an accumulator (scale,
then mask the tiles that need it); the ``ldsm_*`` helpers give the shared-memory
address a lane hands to ``ldmatrix`` for the three operand shapes of attention
(``ptx``'s module docstring has the recipes), on 16-bit tiles swizzled as
``copy.SW_16BIT``; :func:`stage_row_pairs` and :func:`store_staged_rows` are an output
epilogue through shared memory (whole rows to HBM in 16-byte stores).
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, int32, uint16, uint32
from numba_flash.kernels import dropout, flex, mask, score, softmax
from numba_flash.kernels.block_info import tile_needs_mask
from numba_flash.kernels.copy import SW_16BIT, chunk_addr
from numba_flash.variant import DROPOUT, MASK_MOD, SCORE_MOD, SOFTCAP


@device_function
def acc_row_col(nt, e, lane):
    """(row in the 16-row m-tile, column in the 8·NT columns) of element ``e`` of
    n-tile ``nt`` of an m16n8 accumulator, in lane ``lane``."""
    return (lane >> 2) + 8 * (e >> 1), nt * 8 + 2 * (lane & 3) + (e & 1)


@device_function
def lane_distance(row0, col0, mi, KEYS_ARE_ROWS):
    """ALiBi's distance ``q + diag − k`` of this lane's element 0 of an accumulator whose
    rows start at query ``row0`` and columns at key ``col0`` (keys and queries swapped
    with ``KEYS_ARE_ROWS``), as a float: :func:`scale_and_mask`'s ``d0``, to which the
    index pass adds compile-time offsets.  A kernel may compute it before it waits for S:
    the conversion (an I2F, on a slow pipe) is then off the path from S to P."""
    r0, c0 = acc_row_col(0, 0, cuda.threadIdx.x & 31)
    if KEYS_ARE_ROWS:
        return float32(int32(col0 + c0 + mi[2] - row0 - r0))
    return float32(int32(row0 + r0 + mi[2] - col0 - c0))


@device_function
def mask_frame(row0, col0, mi):
    """``mask.frame`` of this lane's element 0 of an accumulator whose rows start at
    query ``row0`` and columns at key ``col0``, for :func:`element_visible`."""
    return mask_frame_any(row0, col0, mi, False)


@device_function
def element_visible(fr, mt, nt, e, q_idx, k_idx, mi, KEYS_ARE_ROWS):
    """``mask.visible`` of element e of n-tile nt of m-tile mt (query ``q_idx``, key
    ``k_idx``): where rows are queries through the lane's frame ``fr``
    (:func:`mask_frame`; the element's offsets from the lane's element 0 are
    compile-time once the loops unroll: a 32-bit compare with an immediate a bound);
    in the dK/dV kernels' Sᵀ (``KEYS_ARE_ROWS``) from the indices, because there the
    frame made ptxas spill: 16 bytes in the d = 64 causal Hopper dK/dV kernel's key loop,
    which had none.  (The per-element pass of softcap, dropout and score_mod takes the
    frame in Sᵀ too: :func:`element_visible_any`.)"""
    if KEYS_ARE_ROWS:
        return mask.visible(q_idx, k_idx, mi)
    return element_visible_any(fr, mt, nt, e, mi, False)


@device_function
def mask_frame_any(row0, col0, mi, KEYS_ARE_ROWS):
    """:func:`mask_frame` of this lane's element 0, rows queries or, in the dK/dV
    kernels' Sᵀ (``KEYS_ARE_ROWS``), keys (the frame's query then from the columns)."""
    r0, c0 = acc_row_col(0, 0, cuda.threadIdx.x & 31)
    if KEYS_ARE_ROWS:
        return mask.frame(col0 + c0, row0 + r0, mi)
    return mask.frame(row0 + r0, col0 + c0, mi)


@device_function
def element_visible_any(fr, mt, nt, e, mi, KEYS_ARE_ROWS):
    """``mask.visible`` of element e of n-tile nt of m-tile mt through the lane's frame
    (:func:`mask_frame_any`), rows queries or keys (``KEYS_ARE_ROWS``; the per-element
    pass of softcap, dropout and score_mod, :func:`_p_and_ds_pass`, where dK/dV's 64-bit
    index compares kept its loop from unrolling): the element's row and column offsets
    from the lane's element 0, compile-time once the loops unroll."""
    dr, dc = 16 * mt + 8 * (e >> 1), nt * 8 + (e & 1)
    if KEYS_ARE_ROWS:
        return mask.visible_at(fr, dc, dr, mi)
    return mask.visible_at(fr, dr, dc, mi)


@device_function
def scale_and_mask(acc, S0, NT, MT, row0, col0, d0, si, needs_mask, partial, mi, KEYS_ARE_ROWS, LOG2, FRAME, F):
    """The score step on MT m-tiles of NT n-tiles each (m-tile ``mt`` at
    ``acc[S0 + 4·NT·mt]``, rows ``row0 + 16·mt + ...``; ``d0``: :func:`lane_distance` of
    ``row0``, ``col0``): ``score.scaled`` (scale, softcap);
    then, where the step needs indices (ALiBi, score_mod) or the tile ``needs_mask``
    (or is a block mask's ``partial`` one), the bias, the user's score_mod and −inf
    where the (query, key) is not visible (``score.index_step``).  Rows are queries
    and columns (``col0 + ...``) keys, or keys and queries when ``KEYS_ARE_ROWS`` (the
    dK/dV kernels' Sᵀ).  The block mask's ``mask_mod`` is a pass of its own
    (:func:`mod_mask`): one loop with both would be too large for the compiler to
    unroll, and the accumulators, indexed at run time, would go to local memory.

    ``FRAME`` (the forwards, ``score.column_frame``): ALiBi in the column frame, the
    reference row of each lane's row g (and g + 8, 16·mt + ...) being row0 + g: an
    element's bias is its column's ``−slope·(row0 + g + diag − key)``, and the row
    keeps ``slope·(16·mt + 8·(row half))`` more than the true score, which
    ``score.frame_max`` takes off the row's max."""
    if not (FRAME and _fused(LOG2, F)):  # fused: the index pass scales with the bias's FFMA
        for j in range(MT * NT * 4):
            acc[S0 + j] = score.scaled(acc[S0 + j], si, LOG2, F)
    # two copies of the index pass, so that neither tests ``needs_mask`` per element: with
    # ALiBi every tile runs it, and a branch an element cost the wgmma forward 1.76× plain
    if needs_mask:
        _index_pass(acc, S0, NT, MT, row0, col0, d0, si, True, mi, KEYS_ARE_ROWS, LOG2, FRAME, F)
    elif score.needs_indices(F):
        _index_pass(acc, S0, NT, MT, row0, col0, d0, si, False, mi, KEYS_ARE_ROWS, LOG2, FRAME, F)
    mod_mask(acc, S0, NT, MT, row0, col0, si, partial, mi, KEYS_ARE_ROWS, F)


@device_function
def _fused(LOG2, F):
    """With ALiBi's column frame, the index pass scales the scores too where
    ``score.scaled`` is ``s · mul`` (no softcap; not raw scores, ``softmax.CAPPED``), so
    that the scale and the bias are one FFMA."""
    return not F[SOFTCAP] and LOG2 != softmax.CAPPED


@device_function
def _index_pass(acc, S0, NT, MT, row0, col0, d0, si, MASK, mi, KEYS_ARE_ROWS, LOG2, FRAME, F):
    """:func:`scale_and_mask`'s pass over the elements' (query, key): ALiBi (in the
    column frame with ``FRAME``), the score_mod, and with ``MASK`` (a literal) the
    built-in masks."""
    lane = cuda.threadIdx.x & 31
    # ALiBi's distance q + diag − k of element (mt, nt, e) is this lane's d0 (lane_distance)
    # plus a compile-time offset: one int → float conversion a tile, not one an element
    # the column frame: column c's bias −slope·(d0 − c) = slope·c + bias0, an FFMA a column
    # (the lane's rows share it) that the scaling's multiply then fuses with (one FFMA an element)
    bias0 = -(si[2] * d0)
    fr = mask_frame(row0, col0, mi)  # the built-in masks' bounds (with MASK; rows are queries)
    for mt in range(MT):
        for nt in range(NT):
            for e in range(4):
                r, c = acc_row_col(nt, e, lane)
                i = S0 + 4 * NT * mt + nt * 4 + e
                q_idx, k_idx = row0 + 16 * mt + r, col0 + c
                dist = d0 + float32(16 * mt + 8 * (e >> 1) - nt * 8 - (e & 1))
                if KEYS_ARE_ROWS:
                    q_idx, k_idx = col0 + c, row0 + 16 * mt + r
                    dist = d0 + float32(nt * 8 + (e & 1) - 16 * mt - 8 * (e >> 1))
                if FRAME:
                    column = si[2] * float32(nt * 8 + (e & 1)) + bias0  # the lane's rows share it
                    if _fused(LOG2, F):  # scale · s + column in one FFMA (one basic block's fmul + fadd
                        x = cuda.fma(acc[i], si[0], column)  # would fuse; across the branch they did not)
                    else:  # softcap's tanh units, scaled already, or raw scores
                        x = acc[i] + column
                else:
                    x = score.alibi(acc[i], dist, si, F)  # index_step's, from the precomputed distance
                x, _ = flex.modded(x, q_idx, k_idx, si, mi, False, F)
                if MASK and not element_visible(fr, mt, nt, e, q_idx, k_idx, mi, KEYS_ARE_ROWS):
                    x = mask.NEG_INF
                acc[i] = x


@device_function
def mod_mask(acc, S0, NT, MT, row0, col0, si, partial, mi, KEYS_ARE_ROWS, F):
    """−inf where the block mask's ``mask_mod`` says False, on its ``partial`` tiles
    (``flex.mod_visible``; nothing without a mask_mod), in the layout of
    :func:`scale_and_mask`."""
    if F[MASK_MOD] and partial:
        lane = cuda.threadIdx.x & 31
        for mt in range(MT):
            for nt in range(NT):
                for e in range(4):
                    r, c = acc_row_col(nt, e, lane)
                    q_idx, k_idx = row0 + 16 * mt + r, col0 + c
                    if KEYS_ARE_ROWS:
                        q_idx, k_idx = col0 + c, row0 + 16 * mt + r
                    i = S0 + 4 * NT * mt + nt * 4 + e
                    if not flex.mod_visible(q_idx, k_idx, si, mi, F):
                        acc[i] = mask.NEG_INF


@device_function
def apply_dropout(acc, S0, NT, MT, row0, col0, di):
    """P ∘ Z / (1 − p) in place, for P·V, on MT m-tiles of NT n-tiles (rows are queries
    from ``row0``, a multiple of 16, columns keys from ``col0``, a multiple of 32): the
    lane's 16 values of an m-tile in a 32-key stretch (rows g, g + 8 × 4 n-tiles × keys
    2t, 2t + 1) come from one Philox call (``dropout``'s grouping).  The row sums l_i
    keep the undropped P (FlashAttention-2)."""
    lane = cuda.threadIdx.x & 31
    for mt in range(MT):
        i = row0 + 16 * mt + (lane >> 2)
        for a in range((NT + 3) // 4):
            x0, x1, x2, x3 = dropout.chunk_values(i, (col0 // 32 + a) * 4 + (lane & 3), di)
            for c in range(4):
                nt = 4 * a + c
                if nt < NT:
                    for rh in range(2):
                        for e in range(2):
                            at = S0 + 4 * NT * mt + nt * 4 + 2 * rh + e
                            acc[at] *= dropout.scale_of(x0, x1, x2, x3, 8 * rh + 2 * c + e, di)


@device_function
def keep_stretch(row0, col0, a, di):
    """``dropout.keep_chunk`` of this lane's row pair (rows ``row0`` + g, g + 8) for the
    a-th 32-key stretch from key ``col0`` (its Philox call ``(col0 / 32 + a)·4 + t``):
    :func:`drop_packed`'s and :func:`keep_words`'s one call."""
    lane = cuda.threadIdx.x & 31
    return dropout.keep_chunk(row0 + (lane >> 2), (((col0 >> 5) + a) << 2) | (lane & 3), di)


@device_function
def drop_packed(frag, PSTEPS, row0, col0, di):
    """P ∘ Z on packed P, in place: ``frag`` holds PSTEPS k-slices of one m-tile as
    :func:`pack_a` packs them (rows are queries ``row0`` …, a multiple of 16; keys
    ``col0`` …, a multiple of 32).  One Philox call a 32-key stretch (two k-slices),
    as :func:`apply_dropout`'s, then ``dropout.drop_slice`` on each slice.  O is scaled
    by ``dropout.out_scale`` in the epilogue instead of each P by 1 / (1 − p): the
    16-bit forward on the H200 spent a third of its time on the per-element
    dropout (1.48× the plain forward, with 64-bit Philox)."""
    for a in range((PSTEPS + 1) // 2):
        ka0, kb0, ka1, kb1 = keep_stretch(row0, col0, a, di)
        dropout.apply_keep(frag, 8 * a, ka0, kb0)
        if 2 * a + 1 < PSTEPS:
            dropout.apply_keep(frag, 8 * a + 4, ka1, kb1)


@device_function
def keep_words(keep, PSTEPS, row0, col0, di):
    """:func:`drop_packed`'s keep words, made before the P they drop exists (the wgmma
    forward's key loop with ``wgmma_forward.hold_exponentials`` 2: the Philox calls run
    under the previous tile's P·V): ``keep[2ps]``, ``keep[2ps + 1]`` are k-slice ps's
    (rows g and g + 8, ``dropout.keep_chunk``'s), for :func:`drop_kept`."""
    for a in range((PSTEPS + 1) // 2):
        ka0, kb0, ka1, kb1 = keep_stretch(row0, col0, a, di)
        keep[4 * a] = ka0
        keep[4 * a + 1] = kb0
        if 2 * a + 1 < PSTEPS:
            keep[4 * a + 2] = ka1
            keep[4 * a + 3] = kb1
            ptx.hold_u32x4(ka0, kb0, ka1, kb1)  # made here, not sunk past a later branch to their use
        else:
            ptx.hold_u32x4(ka0, kb0, ka0, kb0)


@device_function
def drop_kept(frag, keep, PSTEPS):
    """:func:`drop_packed` with the keep words :func:`keep_words` made."""
    for ps in range(PSTEPS):
        dropout.apply_keep(frag, 4 * ps, keep[2 * ps], keep[2 * ps + 1])


@device_function
def softmax_grad_tile(acc_s, acc_dp, NT, stats, LSE_AT, DELTA_AT, q_end, KEYS_ARE_ROWS):
    """P and dS in place of S (scaled and masked, ``scale_and_mask``) and dP, over NT
    n-tiles (``softmax.softmax_grad``, log2 domain).  An element's query has its lse
    (``softmax.lse_for_recompute``) at ``stats[LSE_AT + x]`` and its delta at
    ``stats[DELTA_AT + x]``, where x is the query's column in the tile when
    ``KEYS_ARE_ROWS`` (dK/dV: the query tile's staged rows; columns at or past
    ``q_end`` are padding past the last query, and give exactly 0), else its row half
    ``e >> 1`` (dQ: rows g and g + 8, held by the lane).  In one pass (:func:`p_tile`, then
    :func:`ds_tile` is the same apart: the Hopper backward's pipelined step)."""
    lane = cuda.threadIdx.x & 31
    for nt in range(NT):
        for e in range(4):
            x, keep = _stat_at(nt, e, lane, q_end, KEYS_ARE_ROWS)
            acc_s[nt * 4 + e], acc_dp[nt * 4 + e] = softmax.softmax_grad(
                acc_s[nt * 4 + e], acc_dp[nt * 4 + e], stats[LSE_AT + x], stats[DELTA_AT + x], keep, True
            )


@device_function
def p_tile(acc_s, NT, stats, LSE_AT, q_end, KEYS_ARE_ROWS):
    """:func:`softmax_grad_tile`'s P, in place of S (``softmax.softmax_p``)."""
    lane = cuda.threadIdx.x & 31
    for nt in range(NT):
        for e in range(4):
            x, keep = _stat_at(nt, e, lane, q_end, KEYS_ARE_ROWS)
            acc_s[nt * 4 + e] = softmax.softmax_p(acc_s[nt * 4 + e], stats[LSE_AT + x], keep, True)


@device_function
def ds_tile(acc_s, acc_dp, NT, stats, DELTA_AT, q_end, KEYS_ARE_ROWS):
    """:func:`softmax_grad_tile`'s dS, in place of dP, from :func:`p_tile`'s P (``softmax.softmax_ds``)."""
    lane = cuda.threadIdx.x & 31
    for nt in range(NT):
        for e in range(4):
            x, keep = _stat_at(nt, e, lane, q_end, KEYS_ARE_ROWS)
            acc_dp[nt * 4 + e] = softmax.softmax_ds(acc_s[nt * 4 + e], acc_dp[nt * 4 + e], stats[DELTA_AT + x], keep)


@device_function
def _stat_at(nt, e, lane, q_end, KEYS_ARE_ROWS):
    """(where the element's query has its lse and delta, whether it is a real query)."""
    if KEYS_ARE_ROWS:
        x = nt * 8 + 2 * (lane & 3) + (e & 1)
        return x, x < q_end
    return e >> 1, True


@device_function
def p_and_ds(acc_s, acc_dp, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, stats, LSE_AT, DELTA_AT,
             KEYS_ARE_ROWS, di, partial, F):
    """The backward's step on one warp's 16 rows of a (BLOCK_M queries × BLOCK_N keys)
    tile: S through the score step and masked where the tile needs it
    (:func:`scale_and_mask`, rows from ``row0``, columns from ``col0``), then P and dS
    in place (:func:`softmax_grad_tile`).  With softcap, dropout or a score_mod, one
    pass per element instead, which multiplies dS by the cap's and the score_mod's
    derivatives (``score.softcap_grad``, ``score.index_step``) and, with dropout, gives dV's P ∘ Z/(1−p) and
    dS = P ∘ (dP ∘ Z/(1−p) − delta), drawing the keep bits one Philox call per 16
    elements in dQ (rows are queries, as the forward's :func:`apply_dropout`) and per 8
    in dK/dV (:func:`_pair_words`); ``col0`` is a multiple of 32 in dQ, of 16 in dK/dV (di:
    ``dropout.dropout_info``).  ``partial``: the tile is a block mask's PARTIAL one
    (``block_info.tile_partial``).  (:func:`p_first`, then :func:`ds_then`, is the same in two
    parts: the first reads S only.)"""
    if F[SOFTCAP] or F[DROPOUT] or F[SCORE_MOD]:
        ds_then(acc_s, acc_dp, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, stats, LSE_AT, DELTA_AT,
                KEYS_ARE_ROWS, di, partial, F)  # fmt: skip
    else:
        _scores_for_p(acc_s, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, KEYS_ARE_ROWS, partial, F)
        softmax_grad_tile(acc_s, acc_dp, NT, stats, LSE_AT, DELTA_AT, mi[0] - start_m, KEYS_ARE_ROWS)


@device_function
def _scores_for_p(acc_s, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, KEYS_ARE_ROWS, partial, F):
    """The backward's S scaled and masked where the tile needs it (:func:`scale_and_mask`),
    ready for P (:func:`p_and_ds`, :func:`p_first`)."""
    scale_and_mask(acc_s, 0, NT, 1, row0, col0, lane_distance(row0, col0, mi, KEYS_ARE_ROWS), si,
                   tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi), partial, mi, KEYS_ARE_ROWS, True, False,
                   F)  # fmt: skip


@device_function
def p_first(acc_s, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, stats, LSE_AT, KEYS_ARE_ROWS, partial,
            F):
    """:func:`p_and_ds`'s part that needs S alone: S scaled and masked, then P in its place
    (:func:`p_tile`); nothing with softcap, dropout or a score_mod (their one pass an
    element is :func:`ds_then`'s).  The Hopper backward calls it before it waits for dP."""
    if not (F[SOFTCAP] or F[DROPOUT] or F[SCORE_MOD]):
        _scores_for_p(acc_s, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, KEYS_ARE_ROWS, partial, F)
        p_tile(acc_s, NT, stats, LSE_AT, mi[0] - start_m, KEYS_ARE_ROWS)


@device_function
def ds_then(acc_s, acc_dp, NT, start_m, BLOCK_M, start_n, BLOCK_N, row0, col0, si, mi, stats, LSE_AT, DELTA_AT,
            KEYS_ARE_ROWS, di, partial, F):
    """:func:`p_and_ds`'s rest, after :func:`p_first` and once dP is there: dS in place of
    dP (:func:`ds_tile`), or with softcap, dropout or a score_mod the one pass an element
    (P and dS)."""
    if F[SOFTCAP] or F[DROPOUT] or F[SCORE_MOD]:
        # two copies, so that no element tests ``needs_mask`` (as scale_and_mask's index pass):
        # with the test an element, softcap's backward ran 1.22–1.28× plain on the H200
        if tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi):
            _p_and_ds_pass(acc_s, acc_dp, NT, start_m, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, KEYS_ARE_ROWS, di,
                           partial, True, F)  # fmt: skip
        else:
            _p_and_ds_pass(acc_s, acc_dp, NT, start_m, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, KEYS_ARE_ROWS, di,
                           partial, False, F)  # fmt: skip
    else:
        ds_tile(acc_s, acc_dp, NT, stats, DELTA_AT, mi[0] - start_m, KEYS_ARE_ROWS)


@device_function
def _p_and_ds_pass(acc_s, acc_dp, NT, start_m, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, KEYS_ARE_ROWS, di, partial,
                   MASK, F):
    """:func:`p_and_ds`'s per-element pass (softcap, dropout, score_mod), the built-in
    masks applied when ``MASK`` (a literal)."""
    lane = cuda.threadIdx.x & 31
    fr = mask_frame_any(row0, col0, mi, KEYS_ARE_ROWS)  # the built-in masks' bounds (with MASK)
    if KEYS_ARE_ROWS:  # dK/dV: one Philox call per two n-tiles, shared by a lane pair
        # (NT even: col0 and the query tile are multiples of 16); in two loops of NT // 4 pairs, each short
        # enough for the compiler to unroll with dropout's Philox calls in it
        _pair_steps(acc_s, acc_dp, 0, NT // 4, lane, fr, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, start_m, di,
                    partial, MASK, KEYS_ARE_ROWS, F)  # fmt: skip
        _pair_steps(acc_s, acc_dp, NT // 4, NT // 2, lane, fr, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, start_m,
                    di, partial, MASK, KEYS_ARE_ROWS, F)  # fmt: skip
    else:  # dQ: one Philox call per 32-key stretch and m-tile, as the forward's apply_dropout
        for a in range((NT + 3) // 4):
            x0, x1, x2, x3 = _stretch_words(a, row0, col0, lane, di, F)
            for c in range(4):
                nt = 4 * a + c
                if nt < NT:
                    for e in range(4):
                        zf = float32(1.0)
                        if F[DROPOUT]:
                            zf = dropout.scale_of(x0, x1, x2, x3, 8 * (e >> 1) + 2 * c + (e & 1), di)
                        _p_and_ds_at(acc_s, acc_dp, nt, e, lane, zf, row0, col0, si, MASK, fr, partial, mi,
                                     stats, LSE_AT, DELTA_AT, start_m, KEYS_ARE_ROWS, F)  # fmt: skip


@device_function
def _pair_steps(acc_s, acc_dp, u0, u1, lane, fr, row0, col0, si, mi, stats, LSE_AT, DELTA_AT, start_m, di, partial,
                MASK, KEYS_ARE_ROWS, F):
    """:func:`_p_and_ds_pass`'s dK/dV steps on the n-tile pairs ``u0 ≤ u < u1``: one Philox
    call a pair (:func:`_pair_words`), then its 8 elements (:func:`_p_and_ds_at`)."""
    for u in range(u0, u1):
        wa, wb, pa, pb = _pair_words(u, row0, col0, lane, di, F)
        for e in range(4):
            zf = _pair_scale(wa, wb, pa, pb, 0, e, lane, di, F)
            _p_and_ds_at(acc_s, acc_dp, 2 * u, e, lane, zf, row0, col0, si, MASK, fr, partial, mi, stats,
                         LSE_AT, DELTA_AT, start_m, KEYS_ARE_ROWS, F)  # fmt: skip
        for e in range(4):
            zf = _pair_scale(wa, wb, pa, pb, 1, e, lane, di, F)
            _p_and_ds_at(acc_s, acc_dp, 2 * u + 1, e, lane, zf, row0, col0, si, MASK, fr, partial, mi,
                         stats, LSE_AT, DELTA_AT, start_m, KEYS_ARE_ROWS, F)  # fmt: skip


@device_function
def _p_and_ds_at(acc_s, acc_dp, nt, e, lane, zf, row0, col0, si, MASK, fr, partial, mi, stats, LSE_AT, DELTA_AT,
                 start_m, KEYS_ARE_ROWS, F):
    """:func:`p_and_ds`'s per-element step on element ``e`` of n-tile ``nt``, with the
    dropout factor ``zf`` (1 / (1 − p), 0, or 1 without dropout); the built-in masks
    from the lane's frame ``fr`` when ``MASK`` (a literal)."""
    r, c = acc_row_col(nt, e, lane)
    q_idx, k_idx = row0 + r, col0 + c
    if KEYS_ARE_ROWS:
        q_idx, k_idx = col0 + c, row0 + r
    i = nt * 4 + e
    DOM = score.backward_domain(F)
    x, dx = score.softcap_grad(acc_s[i], si, DOM, F)
    ok = True
    if MASK:
        ok = element_visible_any(fr, 0, nt, e, mi, KEYS_ARE_ROWS)
    x, dm = score.index_step_if(x, ok, q_idx, k_idx, mi[2], partial, si, mi, True, F)
    dx *= dm
    at, keep = _stat_at(nt, e, lane, mi[0] - start_m, KEYS_ARE_ROWS)
    p, ds = softmax.softmax_grad(x, acc_dp[i] * zf, stats[LSE_AT + at], stats[DELTA_AT + at], keep, DOM,
                                 score.exponent_factor(si, DOM))  # fmt: skip
    acc_s[i], acc_dp[i] = p * zf, ds * dx


@device_function
def _stretch_words(a, row0, col0, lane, di, F):
    """The Philox words of 32-key stretch ``a`` (from ``col0``, a multiple of 32) for
    the lane's rows g and g + 8 (queries from ``row0``, a multiple of 16), as in
    :func:`apply_dropout`; zeros without dropout."""
    if F[DROPOUT]:
        return dropout.chunk_values(row0 + (lane >> 2), (((col0 >> 5) + a) << 2) | (lane & 3), di)
    z = uint32(0)
    return z, z, z, z


@device_function
def _pair_words(u, row0, col0, lane, di, F):
    """Dropout words of n-tiles ``2u`` and ``2u + 1`` of an Sᵀ accumulator (rows: keys
    ``row0 + g``, ``row0 + g + 8``, ``row0`` a multiple of 16; columns: queries ``col0 +
    16u + 8r + 2t + {0, 1}``, r = 0, 1, ``col0`` a multiple of 16).  A query column
    2t + s names one row pair for both n-tiles (r is its half), and both keys of a lane
    lie in one Philox group: the call of (pair, group) holds the lane's values of
    n-tile r in word ``2r + hb`` (hb: ``row0`` is odd in 16), bytes ``2·(key half) + (g
    & 1)``.  Lanes g and g ^ 1 (lane ^ 4) need the same two calls (columns 2t and 2t +
    1), so each makes one, for column 2t + (g & 1), and they swap words: ``(wa, wb)``
    this lane's words of n-tiles 2u and 2u + 1, ``(pa, pb)`` the partner's.  Zeros
    without dropout."""
    z = uint32(0)
    if not F[DROPOUT]:
        return z, z, z, z
    g = lane >> 2
    group = ((row0 >> 5) << 2) | (g >> 1)
    x0, x1, x2, x3 = dropout.chunk_values(col0 + 16 * u + 2 * (lane & 3) + (g & 1), group, di)
    wa, wb = x0, x2
    if (row0 & 16) != 0:
        wa, wb = x1, x3
    # (shfl_sync takes signed words)
    pa = uint32(cuda.shfl_xor_sync(softmax.FULL_MASK, int32(wa), 4))
    pb = uint32(cuda.shfl_xor_sync(softmax.FULL_MASK, int32(wb), 4))
    return wa, wb, pa, pb


@device_function
def _pair_scale(wa, wb, pa, pb, r, e, lane, di, F):
    """The dropout factor of element ``e`` of n-tile ``2u + r`` from :func:`_pair_words`:
    the query of column ``2t + (e & 1)`` is this lane's call when ``e & 1 == g & 1``,
    else the partner's; ``r`` picks the word, the key (row half ``e >> 1``) and ``g &
    1`` the byte; 1 without dropout."""
    if not F[DROPOUT]:
        return float32(1.0)
    s = (lane >> 2) & 1
    w = wa if r == 0 else wb
    if (e & 1) != s:
        w = pa if r == 0 else pb
    return dropout.byte_scale(w, 2 * (e >> 1) + s, di)


@device_function
def ldsm_a(tile, row0, kk, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4`` of the A fragment (16 rows from ``row0`` × k-slice
    ``kk``, 16 columns) of a row-major [m][k] tile."""
    return chunk_addr(tile, row0 + (lane & 15), 2 * kk + (lane >> 4), ROW_BYTES, SW_16BIT)


@device_function
def ldsm_b(tile, n0, kk, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4`` of the B fragments of two n-tiles (rows ``n0 ..
    n0 + 15``) × k-slice ``kk`` of a row-major [n][k] tile (K in S = Q·Kᵀ):
    registers (b0, b1) of n-tile n0, then of n0 + 8."""
    return chunk_addr(tile, n0 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1), ROW_BYTES, SW_16BIT)


@device_function
def ldsm_bt(tile, k0, nn, lane, ROW_BYTES):
    """Address for ``ldmatrix_x4_trans`` of the B fragments of n-tiles ``2·nn`` and
    ``2·nn + 1`` × the 16 rows from ``k0`` of a row-major [k][n] tile (V in O = P·V)."""
    return chunk_addr(tile, k0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * nn + (lane >> 4), ROW_BYTES, SW_16BIT)


@device_function
def load_a(frag, i, tile, row0, kk, lane, ROW_BYTES):
    """``frag[i:i+4]`` = the A fragment at (``row0``, ``kk``) (:func:`ldsm_a`)."""
    frag[i], frag[i + 1], frag[i + 2], frag[i + 3] = ptx.ldmatrix_x4(ldsm_a(tile, row0, kk, lane, ROW_BYTES))


@device_function
def mma16(acc, i, a, ai, b0, b1, BF16):
    """``acc[i:i+4] +=`` A (``a[ai:ai+4]``) · B (b0, b1): ``mma.sync`` m16n8k16 with fp32
    accumulators, on bf16 fragments when ``BF16`` else fp16."""
    if BF16:
        ptx.mma_m16n8k16_bf16_acc(acc, i, a, ai, b0, b1)
    else:
        ptx.mma_m16n8k16_f16_acc(acc, i, a, ai, b0, b1)


@device_function
def mma_rows(acc, a, ai, tile, kk, lane, NT, ROW_BYTES, BF16):
    """``acc += A · tileᵀ`` for k-slice ``kk`` over NT n-tiles of the tile's rows: the A
    fragment ``a[ai:ai+4]``, B by ``ldmatrix_x4`` of the row-major [n][k] tile (K in
    S = Q·Kᵀ; V, Q, dO in the backward's products)."""
    for np2 in range(NT // 2):
        b0, b1, b2, b3 = ptx.ldmatrix_x4(ldsm_b(tile, np2 * 16, kk, lane, ROW_BYTES))
        mma16(acc, np2 * 8, a, ai, b0, b1, BF16)
        mma16(acc, np2 * 8 + 4, a, ai, b2, b3, BF16)


@device_function
def mma_rows_trans(acc, a, tile, k0, lane, NT, ROW_BYTES, BF16):
    """``acc += A · tile[k0 : k0 + 16, :]`` over NT n-tiles of the tile's columns: the A
    fragment ``a[0:4]`` (16 rows × this k-slice), B by ``ldmatrix_x4_trans`` of the
    row-major [k][n] tile (V in O += P·V; dO, Q, K in the backward's products)."""
    for nn in range(NT // 2):
        b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(ldsm_bt(tile, k0, nn, lane, ROW_BYTES))
        mma16(acc, nn * 8, a, 0, b0, b1, BF16)
        mma16(acc, nn * 8 + 4, a, 0, b2, b3, BF16)


@device_function
def pack16x2(lo, hi, BF16):
    """``lo`` and ``hi`` rounded to bf16 (``BF16``) or fp16 and packed in one word, ``lo``
    in the low half (``ptx.pack_bf16x2`` / ``pack_f16x2``)."""
    if BF16:
        return ptx.pack_bf16x2(lo, hi)
    return ptx.pack_f16x2(lo, hi)


@device_function
def pack_a(frag, i, acc, s0, BF16):
    """``frag[i:i+4]`` = the 16-bit A fragment of the k-slice held by accumulator n-tiles
    ``acc[s0:s0+4]`` and ``acc[s0+4:s0+8]`` (columns 16·slice .. +15): their pairs
    rounded to fp16 (bf16 when ``BF16``), lower column in the low half."""
    for e in range(4):
        frag[i + e] = pack16x2(acc[s0 + 2 * e], acc[s0 + 2 * e + 1], BF16)


@device_function
def store_row_pairs(dst, b, row, h, acc, A0, NT, tq, scale, BF16, DCOLS=0, HALVES=False, NT0=0):
    """One row of NT accumulator n-tiles (``acc[A0 + 4·nt]``, ``acc[A0 + 4·nt + 1]``:
    A0 = 2 for row g + 8), times ``scale``, as 16-bit pairs to ``dst[b, row, h, :]``
    (a uint32 view: word ``4·nt + t`` holds columns 8·nt + 2t, + 1).  ``DCOLS``: the
    row's length when it ends inside the last n-tile (columns past it are not
    written; 0: 8·NT); ``HALVES``: ``dst`` is a uint16 view (an odd head dim), each
    16-bit value stored alone; ``NT0``: the n-tiles are the row's ``NT0`` … (columns
    from 8·NT0)."""
    for nt in range(NT):
        x0 = acc[A0 + nt * 4] * scale
        x1 = acc[A0 + nt * 4 + 1] * scale
        w = pack16x2(x0, x1, BF16)
        col = (NT0 + nt) * 8 + 2 * tq
        if HALVES:
            if DCOLS == 0 or col < DCOLS:
                dst[b, row, h, col] = uint16(w & uint32(0xFFFF))
            if DCOLS == 0 or col + 1 < DCOLS:
                dst[b, row, h, col + 1] = uint16(w >> uint32(16))
        elif DCOLS == 0 or col < DCOLS:
            dst[b, row, h, (NT0 + nt) * 4 + tq] = w


@device_function
def store_row_floats(dst, b, row, h, acc, A0, NT, tq, scale, DCOLS=0):
    """:func:`store_row_pairs` into a float32 ``dst[b, row, h, :]`` (split-KV's partial
    outputs, kept in fp32 as FlashAttention-2 keeps them): columns 8·nt + 2t, + 1."""
    for nt in range(NT):
        col = nt * 8 + 2 * tq
        if DCOLS == 0 or col < DCOLS:
            dst[b, row, h, col] = acc[A0 + nt * 4] * scale
        if DCOLS == 0 or col + 1 < DCOLS:
            dst[b, row, h, col + 1] = acc[A0 + nt * 4 + 1] * scale


# --- the output through shared memory ----------------------------------------------------
# A warp's 16 output rows × NT n-tiles are staged in shared memory, then written to HBM a
# whole row at a time with 16-byte stores (FlashAttention-2/3's epilogue): stored straight
# from the accumulators, one warp instruction writes 16 bytes (4 lanes' words) in each of 8
# rows, and every 32-byte sector is written in halves by two instructions.  The staging rows are 16·NT bytes
# (n-tile nt = 16-byte chunk nt of its rows); row r's chunk c lies at
# ``stage + r·16·NT + (c XOR r mod 8)·16``, so the 8 rows of one 4-byte store instruction
# (same n-tile, rows g = 0..7 of a half, words t = 0..3) hit 32 different banks, and the
# 8 lanes of each quarter of a 16-byte load (8 consecutive chunks of one row) 8 different
# 16-byte bank groups: neither side has a conflict.  NT is a multiple of 8.


@device_function
def stage_row_pairs(stage, acc, half, NT, scale, BF16):
    """Row half ``half`` of the warp's NT accumulator n-tiles (rows ``g + 8·half``:
    ``acc[4·nt + 2·half]``, ``+ 1``, columns 8·nt + 2t, + 1), times ``scale``, rounded to
    16-bit pairs (bf16 when ``BF16``, else fp16) into the warp's staging rows at the
    shared address ``stage`` (16 rows × 16·NT bytes, 16-byte aligned): the pair is word t
    of chunk nt of its row, at the swizzled offset above.  Then :func:`store_staged_rows`."""
    lane = cuda.threadIdx.x & 31
    row = (lane >> 2) + 8 * half
    at = stage + row * (16 * NT) + 4 * (lane & 3)
    for nt in range(NT):
        x0 = acc[nt * 4 + 2 * half] * scale
        x1 = acc[nt * 4 + 2 * half + 1] * scale
        w = pack16x2(x0, x1, BF16)
        ptx.st_shared_b32(at + ((nt ^ (row & 7)) << 4), w)


@device_function
def store_staged_rows(dst, b, row0, h, stage, rows, NT, words, CHUNKS):
    """The warp's 16 staged rows (:func:`stage_row_pairs`, both halves) to
    ``dst[b, row0 + r, h, :]`` (a uint32 view of 16-bit pairs, 4·CHUNKS words a row,
    each row's first word 16-byte aligned) for r < ``rows`` (rows past a sequence are not
    written), chunks c < ``CHUNKS`` of each (a literal: ``NT``, or the arrays' d / 8 when
    the tile is wider): lane ``lane`` moves chunks ``32·i + lane`` (row ``(32·i + lane) // NT``,
    chunk ``(32·i + lane) mod NT``) for i < NT/2, one ``ld.shared.v4`` and one
    ``st.global.v4`` each, so that one warp instruction writes 32/NT whole rows (2 at
    d = 128, 4 at d = 64).  Every load is issued before the first store, into
    ``words`` (uint32, 2·NT of them: registers the caller no longer needs), so that
    their latencies overlap.  Syncs the warp before the loads (they read what other lanes
    staged) and after them (the staging rows may then be staged into again: a persistent
    block's next tile)."""
    lane = cuda.threadIdx.x & 31
    cuda.syncwarp()  # RAW: the lanes read chunks that other lanes of the warp staged
    for i in range(NT // 2):
        r = (32 * i + lane) // NT
        c = (32 * i + lane) % NT
        at = stage + r * (16 * NT) + ((c ^ (r & 7)) << 4)
        words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3] = ptx.ld_shared_v4_b32(at)
    cuda.syncwarp()  # WAR: every lane has read its chunks before the warp stages its next tile's rows
    for i in range(NT // 2):
        r = (32 * i + lane) // NT
        c = (32 * i + lane) % NT
        if r < rows and (CHUNKS == NT or c < CHUNKS):
            ptx.st_global_v4_b32(dst, (b, row0 + r, h, 4 * c), words[4 * i], words[4 * i + 1], words[4 * i + 2],
                                 words[4 * i + 3])  # fmt: skip


# --- TF32 (m16n8k8) operands from fp32 tiles ---------------------------------------------
# The TF32 kernels read fp32 tiles (swizzled as copy.SW_TF32) with ld.shared.v4 in an
# order that gives every lane contiguous data (tf32_forward's docstring has the
# derivation): a product over the head dim takes columns 16p .. 16p+15 as two k-steps,
# lane t owning columns 16p + 4t .. +3; a product over a tile's rows takes its A operand
# from an accumulator (slot t ↔ row 2t, slot t+4 ↔ row 2t+1 of an 8-row n-tile) and its
# B rows 2t, 2t+1 with the head-dim columns permuted (n-tile 4j+i, mma column n ↔
# column 32j + 4n + i).


@device_function
def load_tf32_a(frag, i, row_addr, off, ROW_BYTES):
    """``frag[i:i+8]`` = the tf32 A fragments of the two k-steps of a column group:
    one v4 load of row g at ``row_addr + off`` and one of row g + 8, in the slot order
    (a0, a1, a2, a3) of k-step 2p, then of k-step 2p + 1."""
    y0, y1, y2, y3 = ptx.ld_shared_v4_f32(row_addr + off)
    z0, z1, z2, z3 = ptx.ld_shared_v4_f32(row_addr + 8 * ROW_BYTES + off)
    frag[i + 0] = ptx.cvt_rna_tf32(y0)
    frag[i + 1] = ptx.cvt_rna_tf32(z0)
    frag[i + 2] = ptx.cvt_rna_tf32(y1)
    frag[i + 3] = ptx.cvt_rna_tf32(z1)
    frag[i + 4] = ptx.cvt_rna_tf32(y2)
    frag[i + 5] = ptx.cvt_rna_tf32(z2)
    frag[i + 6] = ptx.cvt_rna_tf32(y3)
    frag[i + 7] = ptx.cvt_rna_tf32(z3)


@device_function
def mma_tf32_row_pair(acc, n0, a, ai, b_addr):
    """``acc[n0:n0+4] +=`` the two k-steps of a column group: A from ``a[ai:ai+8]``
    (:func:`load_tf32_a`), B from one v4 load of the tile row at ``b_addr``."""
    x0, x1, x2, x3 = ptx.ld_shared_v4_f32(b_addr)
    ptx.mma_m16n8k8_tf32_acc(acc, n0, a, ai, ptx.cvt_rna_tf32(x0), ptx.cvt_rna_tf32(x1))
    ptx.mma_m16n8k8_tf32_acc(acc, n0, a, ai + 4, ptx.cvt_rna_tf32(x2), ptx.cvt_rna_tf32(x3))


@device_function
def mma_tf32_two(acc_s, acc_dp, xa, ya, x_rows, y_rows, s_tile, dp_tile, g, tq, sw_g, KPAIRS, NT, ROW_BYTES):
    """The backward's two products over the head dim, from zero, for the warp's 16 rows:
    ``acc_s = X·S_tileᵀ`` and ``acc_dp = Y·dP_tileᵀ``, with X and Y rows g, g + 8 at
    ``x_rows`` and ``y_rows`` (A operands, through the scratch fragments ``xa``,
    ``ya``) and NT n-tiles of 8 rows of the two tiles (B operands)."""
    for i in range(NT * 4):
        acc_s[i] = 0
        acc_dp[i] = 0
    for p in range(KPAIRS):
        off = ((4 * p + tq) ^ sw_g) << 4  # columns 16p + 4t .. +3
        load_tf32_a(xa, 0, x_rows, off, ROW_BYTES)
        load_tf32_a(ya, 0, y_rows, off, ROW_BYTES)
        for nt in range(NT):
            mma_tf32_row_pair(acc_s, nt * 4, xa, 0, s_tile + (nt * 8 + g) * ROW_BYTES + off)
            mma_tf32_row_pair(acc_dp, nt * 4, ya, 0, dp_tile + (nt * 8 + g) * ROW_BYTES + off)


@device_function
def tf32_a_from_acc(frag, acc, s):
    """``frag[0:4]`` = the tf32 A fragment of the k-step held by accumulator n-tile
    ``acc[s:s+4]`` (slot t ↔ row 2t, slot t + 4 ↔ row 2t + 1: c0, c2, c1, c3)."""
    frag[0] = ptx.cvt_rna_tf32(acc[s])
    frag[1] = ptx.cvt_rna_tf32(acc[s + 2])
    frag[2] = ptx.cvt_rna_tf32(acc[s + 1])
    frag[3] = ptx.cvt_rna_tf32(acc[s + 3])


@device_function
def mma_tf32_rows(acc, a, rows_addr, g, tq, OGROUPS, ROW_BYTES):
    """``acc += A·B`` over one k-step of a tile's rows: A from ``a[0:4]``
    (:func:`tf32_a_from_acc`), B rows 2t and 2t + 1 of the 8-row group at
    ``rows_addr`` (swizzle 2t and 2t ^ 4), head-dim columns 32jg + 4g .. +3 giving the
    b of n-tiles 4jg .. 4jg + 3 (accumulators ``acc[16jg:16jg+16]``)."""
    for jg in range(OGROUPS):
        v0, v1, v2, v3 = ptx.ld_shared_v4_f32(rows_addr + (((8 * jg + g) ^ (2 * tq)) << 4))
        w0, w1, w2, w3 = ptx.ld_shared_v4_f32(rows_addr + ROW_BYTES + (((8 * jg + g) ^ (2 * tq) ^ 4) << 4))
        ptx.mma_m16n8k8_tf32_acc(acc, 16 * jg, a, 0, ptx.cvt_rna_tf32(v0), ptx.cvt_rna_tf32(w0))
        ptx.mma_m16n8k8_tf32_acc(acc, 16 * jg + 4, a, 0, ptx.cvt_rna_tf32(v1), ptx.cvt_rna_tf32(w1))
        ptx.mma_m16n8k8_tf32_acc(acc, 16 * jg + 8, a, 0, ptx.cvt_rna_tf32(v2), ptx.cvt_rna_tf32(w2))
        ptx.mma_m16n8k8_tf32_acc(acc, 16 * jg + 12, a, 0, ptx.cvt_rna_tf32(v3), ptx.cvt_rna_tf32(w3))


@device_function
def store_tf32_row(dst, b, row, h, acc, r, tq, OGROUPS, scale):
    """Row half ``r`` (row g + 8r) of a TF32 kernel's output accumulator, times
    ``scale``, to ``dst[b, row, h, :]``: n-tile 4jg + i holds head-dim columns
    32jg + 8t + i (c0 / c2) and + 4 (c1 / c3), so a lane writes 8 contiguous floats a
    group."""
    for jg in range(OGROUPS):
        for i in range(4):
            col = 32 * jg + 8 * tq + i
            a = (4 * jg + i) * 4 + 2 * r
            dst[b, row, h, col] = acc[a] * scale
            dst[b, row, h, col + 4] = acc[a + 1] * scale


# --- ALiBi on the tensor cores (the wgmma forward, causal) --------------------------------
# With causal, every visible key j of row i has j ≤ i + diag, and ALiBi's bias in raw-score
# units is v·(j − c) − v·(i + diag − c), v = slope / scale, c = col0 + BLOCK_N / 2 the tile's
# middle key: a column term of the tile and a row term.  The column term is one more k-slice
# of S's products, issued after Q·Kᵀ's: A (registers, every row the same) = (hi, mid, lo, 0,
# …) with v ≈ hi + mid + lo in three 16-bit values, B (one constant swizzled tile in shared
# memory) = (j − c, j − c, j − c, 0, …) for the tile's key j: integers in [−64, 64), exact in
# fp16 and bf16.  The row term goes into the running max once a row (the wgmma forward's
# ``scores_to_p``).


@device_function
def _to16(x, BF16):
    """``x`` rounded to fp16 (bf16 when ``BF16``) and back to float32."""
    w = pack16x2(x, float32(0.0), BF16)
    return ptx.unpack_bf16x2(w)[0] if BF16 else ptx.unpack_f16x2(w)[0]


@device_function
def bias_fragment(frag, v, BF16):
    """``frag[0:4]``: the A fragment (:func:`pack_a`'s layout: lane t holds columns 2t,
    2t + 1 and 2t + 8, 2t + 9 of rows g and g + 8) of a 16-column k-slice whose every row
    is ``(hi, mid, lo, 0, …, 0)``, ``hi + mid + lo`` = ``v`` to about 2⁻³³ (fp16; 2⁻²⁴ in
    bf16) relative: the slope's factor of ALiBi's column term."""
    hi = _to16(v, BF16)
    mid = _to16(v - hi, BF16)
    lo = v - hi - mid
    t = cuda.threadIdx.x & 3
    w = uint32(0)
    if t == 0:
        w = pack16x2(hi, mid, BF16)
    elif t == 1:
        w = pack16x2(lo, float32(0.0), BF16)
    frag[0] = w
    frag[1] = w
    frag[2] = uint32(0)
    frag[3] = uint32(0)


@device_function
def stage_key_ramp(base, tid, THREADS, ROWS, BF16):
    """The B operand of :func:`bias_fragment`'s k-slice for a ``ROWS``-key tile: one
    128-byte-swizzled atom at the shared address ``base`` (``ROWS`` rows of 128 bytes, row
    r's 16-byte chunk c at ``(c XOR r mod 8)·16``) whose row r is ``(x, x, x, 0, …)`` in
    16-bit values, ``x = r − ROWS / 2`` (the key's offset from the tile's middle: at most
    ``ROWS / 2`` in size, so S's rounding after the column term is added is half what it
    would be from the tile's first key); the ``THREADS`` threads of the block (``tid``)
    share the words.  The caller fences (``fence.proxy.async``: wgmma reads it through the
    async proxy) and syncs before the first product reads it."""
    for w in range(tid, ROWS * 32, THREADS):
        r = w >> 5  # the row (key j − col0) and, within it, the 16-byte chunk and the word
        chunk = (w >> 2) & 7
        k = w & 3
        x = float32(r - ROWS // 2)
        val = uint32(0)
        if (chunk ^ (r & 7)) == 0:  # the row's logical chunk 0: columns 0–7
            if k == 0:
                val = pack16x2(x, x, BF16)
            elif k == 1:
                val = pack16x2(x, float32(0.0), BF16)
        ptx.st_shared_b32(base + 4 * w, val)

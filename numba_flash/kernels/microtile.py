"""Register micro-tiles of the exact fp32 kernels (SGEMM-style), shared by the
register-blocked forward, dK/dV and dQ kernels.

A block of TX·TY threads computes a ROWS × COLS score-shaped tile (queries × keys in
the forward and dQ kernels, keys × queries in dK/dV).  Thread (ty, tx) owns the TM × TN
micro-tile of rows ``ty + r·TY`` (r < TM) and columns ``tx + c·TX`` (c < TN), kept in
registers as ``s[r·TN + c]``, and the TM × d/TX slice of an output accumulator,
``acc[r·OC + o]`` for the head-dim columns ``4·tx + 4·TX·(o // 4) + o % 4`` (o < OC =
d/TX).  Rows and columns are interleaved so that the 16-byte shared loads of
neighbouring lanes fall on different banks; the TX lanes of a row are consecutive
lanes of one warp (a row's max and sum are finished over them with shuffles).

Shared-memory operands are fp32 rows addressed in bytes (``ptx.smem_addr`` plus
offsets) and read as 16-byte vectors (``ptx.ld_shared_v4_f32``); every address passed
here is 16-byte aligned.  ``scratch`` arguments are small register arrays the caller
owns (numba cannot allocate them here and keep them in registers across the caller's
loops).
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import device_function
from numba_flash.kernels import dropout, score
from numba_flash.kernels.block_info import tile_needs_mask
from numba_flash.variant import SCORE_MOD, SOFTCAP


@device_function
def dot_tile(s, a_addr, A_STEP, b_addr, B_STEP, D, TM, TN, scratch):
    """``s[r·TN + c] += a_r · b_c`` over D columns, for the micro-tile's rows
    ``a_r`` at ``a_addr + r·A_STEP`` and columns ``b_c`` at ``b_addr + c·B_STEP``
    (``scratch``: TN·4 floats).  Per 4 columns, TN + TM vector loads feed 4·TM·TN FMAs,
    each sum taken in column order (the order ``preprocess``'s delta uses)."""
    for kb in range(0, 4 * D, 16):  # byte offset of 4 head-dim columns
        for c in range(TN):
            scratch[4 * c], scratch[4 * c + 1], scratch[4 * c + 2], scratch[4 * c + 3] = ptx.ld_shared_v4_f32(
                b_addr + (kb + c * B_STEP)
            )
        for r in range(TM):
            a0, a1, a2, a3 = ptx.ld_shared_v4_f32(a_addr + (kb + r * A_STEP))
            for c in range(TN):  # four dependent FMAs, as a sequential dot product
                x = s[r * TN + c] + a0 * scratch[4 * c]
                x += a1 * scratch[4 * c + 1]
                x += a2 * scratch[4 * c + 2]
                s[r * TN + c] = x + a3 * scratch[4 * c + 3]


@device_function
def scores_and_dp(s, a_s, b_s, dp, a_dp, b_dp, A_STEP, B_STEP, D, TM, TN, scratch, start_m, BLOCK_M, start_n, BLOCK_N,
                  row0, ROW_STEP, col0, COL_STEP, si, mi, KEYS_ARE_ROWS, dx, partial, F):
    """The backward's two products on one micro-tile, from zero, each by :func:`dot_tile`
    (rows ``A_STEP``, columns ``B_STEP`` bytes apart): the scores ``s = a·b`` through
    the score step and masked where the (BLOCK_M queries × BLOCK_N keys) tile needs it
    (:func:`scale_and_mask`, which leaves the softcap's and score_mod's derivative in
    ``dx``; ``partial``: a block mask's PARTIAL tile), and ``dp = a'·b'``."""
    for i in range(TM * TN):
        s[i] = 0
        dp[i] = 0
    dot_tile(s, a_s, A_STEP, b_s, B_STEP, D, TM, TN, scratch)
    dot_tile(dp, a_dp, A_STEP, b_dp, B_STEP, D, TM, TN, scratch)
    needs_mask = tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi)
    scale_and_mask(s, TM, TN, row0, ROW_STEP, col0, COL_STEP, si, needs_mask, partial, mi, KEYS_ARE_ROWS, dx, F)


@device_function
def scale_and_mask(s, TM, TN, row0, ROW_STEP, col0, COL_STEP, si, needs_mask, partial, mi, KEYS_ARE_ROWS, dx, F):
    """The score step on the micro-tile (natural domain): ``score.scaled`` (scale,
    softcap; with softcap its derivative goes to ``dx[i]`` unless ``dx`` is None: the
    backward's); then, where the step needs indices (ALiBi, score_mod) or the tile
    ``needs_mask`` or is ``partial`` (a block mask's), ``score.index_step`` (bias,
    score_mod, whose derivative multiplies ``dx[i]``, and −inf where the element is
    masked) on element (r, c) — row ``row0 + r·ROW_STEP``, column ``col0 +
    c·COL_STEP``; keys are the rows when ``KEYS_ARE_ROWS``."""
    for i in range(TM * TN):
        if F[SOFTCAP] and dx is not None:
            s[i], dx[i] = score.softcap_grad(s[i], si, False, F)
        else:
            s[i] = score.scaled(s[i], si, False, F)
    if needs_mask or partial or score.needs_indices(F):
        for r in range(TM):
            for c in range(TN):
                q_idx, k_idx = row0 + r * ROW_STEP, col0 + c * COL_STEP
                if KEYS_ARE_ROWS:
                    q_idx, k_idx = col0 + c * COL_STEP, row0 + r * ROW_STEP
                s[r * TN + c], dm = score.index_step(s[r * TN + c], q_idx, k_idx, mi[2], needs_mask, partial, si, mi,
                                                     dx is not None, F)  # fmt: skip
                if F[SCORE_MOD] and dx is not None:
                    dx[r * TN + c] = dx[r * TN + c] * dm if F[SOFTCAP] else dm


@device_function
def apply_dropout(s, TM, TN, row0, ROW_STEP, col0, COL_STEP, di):
    """P ∘ Z / (1 − p) in place on the micro-tile (rows queries ``row0 + r·ROW_STEP``,
    columns keys ``col0 + c·COL_STEP``), one Philox call an element
    (``dropout.kept_scale``)."""
    for r in range(TM):
        for c in range(TN):
            s[r * TN + c] *= dropout.kept_scale(row0 + r * ROW_STEP, col0 + c * COL_STEP, di)


@device_function
def store_transposed(addr, COL_BYTES, s, TM, TN):
    """The micro-tile to shared memory transposed, column c (TM values, this thread's
    rows in order) as TM/4 16-byte stores at ``addr + c·COL_BYTES``: P or dS as
    [column][row], so that each thread reads the column it needs as vectors."""
    for c in range(TN):
        for r4 in range(TM // 4):
            ptx.st_shared_v4_f32(
                addr + c * COL_BYTES + 16 * r4,
                s[(4 * r4) * TN + c], s[(4 * r4 + 1) * TN + c], s[(4 * r4 + 2) * TN + c], s[(4 * r4 + 3) * TN + c],
            )  # fmt: skip


@device_function
def outer_accumulate(acc, p_addr, P_BYTES, v_addr, V_BYTES, V_STEP, N, TM, OC, p_scratch, v_scratch):
    """``acc[r·OC + o] += Σ_j p_j[r] · v_j[o]`` over N rows j: ``p_j`` the TM values at
    ``p_addr + j·P_BYTES`` (a column stored by :func:`store_transposed`), ``v_j`` this
    thread's OC head-dim columns of the row at ``v_addr + j·V_BYTES``, as OC/4 vectors
    ``V_STEP`` bytes apart (``p_scratch``: TM floats, ``v_scratch``: OC floats).  P·V,
    dS·K, Pᵀ·dO and dSᵀ·Q alike."""
    for j in range(N):
        for r4 in range(TM // 4):
            p_scratch[4 * r4], p_scratch[4 * r4 + 1], p_scratch[4 * r4 + 2], p_scratch[4 * r4 + 3] = (
                ptx.ld_shared_v4_f32(p_addr + (j * P_BYTES + 16 * r4))
            )
        for o in range(OC // 4):
            v_scratch[4 * o], v_scratch[4 * o + 1], v_scratch[4 * o + 2], v_scratch[4 * o + 3] = ptx.ld_shared_v4_f32(
                v_addr + (j * V_BYTES + o * V_STEP)
            )
        for r in range(TM):
            for o in range(OC):
                acc[r * OC + o] += p_scratch[r] * v_scratch[o]


@device_function
def store_row(dst, b, row, h, acc, r, tx, TX, OC, scale):
    """Row ``r`` of the thread's accumulator slice, times ``scale``, to
    ``dst[b, row, h, 4·tx + 4·TX·(o // 4) + o % 4]``."""
    for o in range(OC // 4):
        for e in range(4):
            dst[b, row, h, 4 * tx + 4 * TX * o + e] = acc[r * OC + 4 * o + e] * scale

"""The double-buffered tile walk of the cp.async kernels, and a block's coordinates.

A kernel that walks tiles ``lo .. hi − 1`` keeps two stages in shared memory: tile
``j + 1`` is copied into one while tile ``j`` is used from the other.  The walk starts
one step early, at ``j = lo − 1``, which only starts the copy of tile ``lo``::

    for j in range(lo - 1, hi):
        wait_for_tile(j, lo)                 # tile j is in shared memory for all
        <fragments of data resident for the whole block, when j == lo>
        prefetch_keys(...) / prefetch_queries(...)   # tile j + 1, then commit
        if j < lo: continue
        <compute on tile j>

With more stages (``STAGES`` buffers, the tensor-core forward's decode tiles), the copies
run ``STAGES − 1`` tiles ahead: the walk starts at ``j = lo − (STAGES − 1)``, tile
``j + STAGES − 1`` is copied at step j (``prefetch_keys(j + STAGES − 2, ...)``), and
:func:`wait_for_stage` lets the ``STAGES − 2`` younger groups stay in flight; with two
stages it is the walk above.

The kernels without a second stage (the register-blocked and row-group backward, the
row-group forward) load each tile with one call, between two barriers:
:func:`load_tiles_now` (cp.async) and :func:`load_rows_now` (element-wise, converting
to fp32).

``lane_coords`` names a thread's place in its warp and in the mma fragments (where a
block is: ``block_info.this_block``).
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function
from numba_flash.kernels import copy, softmax
from numba_flash.kernels.block_info import tile_at


@device_function
def lane_coords():
    """``(tid, warp, lane, g, t)``: the thread, its warp and lane, and the mma fragment
    coordinates ``g = lane >> 2`` (accumulator rows g, g + 8) and ``t = lane & 3``
    (columns 2t, 2t + 1)."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    return tid, tid // 32, lane, lane >> 2, lane & 3


@device_function
def wait_for_tile(j, lo):
    """Before tile ``j`` is used (``j >= lo``): wait for this thread's copies of it, then
    a barrier, after which every thread's copies of tile j (and whatever was staged
    with them) are visible to all, and every warp is done with tile j − 1, whose stage
    the copies of tile j + 1 overwrite next (:func:`wait_for_stage` of two stages)."""
    wait_for_stage(j, lo, 2)


@device_function
def wait_for_stage(j, lo, STAGES):
    """:func:`wait_for_tile` of a walk with ``STAGES`` (2 to 4) buffers, whose copies run
    ``STAGES − 1`` tiles ahead (``prefetch_keys(j + STAGES − 2, ...)``, the walk started
    at ``lo − (STAGES − 1)``): wait until at most ``STAGES − 2`` of this thread's
    groups are pending, which leaves tile j's complete, then the barrier, after which
    tile j is visible to all and every warp is done with tile j − 1, whose stage the
    copies of tile j + STAGES − 1 overwrite next."""
    if j >= lo:
        if STAGES == 2:
            ptx.cp_async_wait_group(0)
        elif STAGES == 3:
            ptx.cp_async_wait_group(1)
        else:
            ptx.cp_async_wait_group(2)
        cuda.syncthreads()


@device_function
def carve(smem, S0, S1, S2):
    """Shared byte addresses of four consecutive regions of the dynamic shared array
    ``smem``, of S0, S1 and S2 bytes (the last runs to the end)."""
    base = ptx.smem_addr(smem, 0)
    return base, base + S0, base + S0 + S1, base + S0 + S1 + S2


@device_function
def key_stage(j, vr, F, k_base, v_base, BLOCK_N, STAGE_BYTES, STAGES):
    """``(start_n, k_tile, v_tile)`` of the key tile at walk position ``j`` (its tile:
    ``block_info.tile_at``, ``vr`` the block-sparse list): its first key and the
    shared addresses of its stage of K and V (by position)."""
    at = (j % STAGES) * STAGE_BYTES
    return tile_at(j, vr, F) * BLOCK_N, k_base + at, v_base + at


@device_function
def query_stage(i, vr, F, q_base, do_base, BLOCK_M, STAGE_BYTES):
    """``(start_m, q_tile, do_tile, rows_at)`` of the query tile at position ``i`` of the
    dK/dV walk (``block_info.tile_at``): its first query, the shared addresses of its stage of Q and dO, and where its lse and
    delta start in the staged rows (``prefetch_queries``)."""
    stage = i & 1
    return tile_at(i, vr, F) * BLOCK_M, q_base + stage * STAGE_BYTES, do_base + stage * STAGE_BYTES, stage * 2 * BLOCK_M


@device_function
def zero(acc, N):
    """``acc[0:N] = 0``."""
    for i in range(N):
        acc[i] = 0


@device_function
def prefetch_keys(j, hi, vr, F, k_base, k, v_base, v, b, h, k0, seqlen_k, tid, BLOCK_N, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                  THREADS, STAGE_BYTES, STAGES, DCOLS=0, SYNC=False, pg=None, UNROLL=False):
    """Start copying the key tile at walk position ``j + 1`` (K and V; the sequence starts at row ``k0``)
    into its stage, when there is one, and close the cp.async group (an empty group
    when there is not); ``DCOLS``, ``SYNC``, ``pg`` (a paged KV cache), ``UNROLL``:
    ``copy.copy_rows``."""
    if j + 1 < hi:
        start_n, k_tile, v_tile = key_stage(j + 1, vr, F, k_base, v_base, BLOCK_N, STAGE_BYTES, STAGES)
        copy.copy_tile_pair(k_tile, k, v_tile, v, b, h, k0 + start_n, k0 + seqlen_k, tid, BLOCK_N, CHUNKS, ELEMS, ROW_BYTES,
                            SWIZZLE, THREADS, UNROLL, DCOLS, SYNC, pg)  # fmt: skip
    ptx.cp_async_commit()


@device_function
def prefetch_queries(i, hi, vr, F, q_base, q, do_base, dout, s_rows, lse, delta, b, h, q0, seqlen_q, tid, BLOCK_M, CHUNKS,
                     ELEMS, ROW_BYTES, SWIZZLE, THREADS, STAGE_BYTES, DCOLS=0, SYNC=False):
    """The dK/dV kernels' walk: start copying the query tile at position ``i + 1`` (Q and dO; the
    sequence starts at row ``q0``) into its
    stage (of two) and stage its rows' lse and delta in ``s_rows`` ([stage][lse | delta],
    BLOCK_M each, ``softmax.stage_row_stats``), then close the cp.async group."""
    if i + 1 < hi:
        row0, q_tile, do_tile, rows_at = query_stage(i + 1, vr, F, q_base, do_base, BLOCK_M, STAGE_BYTES)
        copy.copy_tile_pair(q_tile, q, do_tile, dout, b, h, q0 + row0, q0 + seqlen_q, tid, BLOCK_M, CHUNKS, ELEMS, ROW_BYTES,
                            SWIZZLE, THREADS, False, DCOLS, SYNC)  # fmt: skip
        softmax.stage_row_stats(s_rows, rows_at, rows_at + BLOCK_M, lse, delta, b, h, q0 + row0, q0 + seqlen_q, tid,
                                BLOCK_M, THREADS, True)  # fmt: skip
    ptx.cp_async_commit()


@device_function
def load_tiles_now(tile_a, src_a, tile_b, src_b, b, h, row0, nrows, tid, ROWS, CHUNKS, ROW_BYTES, THREADS,
                   stats, LSE_AT, DELTA_AT, lse, delta, STATS):
    """One single-buffered step of the register-blocked backward: a barrier (every
    thread is done with the previous tile and what was computed from it), then ROWS
    rows of two fp32 arrays by cp.async into padded tiles and, when ``STATS``, the
    rows' lse and delta staged in ``stats`` (``softmax.stage_row_stats``); then a wait
    and a barrier, after which all of it is visible to every thread."""
    cuda.syncthreads()
    copy.copy_tile_pair(tile_a, src_a, tile_b, src_b, b, h, row0, nrows, tid, ROWS, CHUNKS, 4, ROW_BYTES,
                        copy.SW_NONE, THREADS, True)  # fmt: skip
    ptx.cp_async_commit()
    if STATS:
        softmax.stage_row_stats(stats, LSE_AT, DELTA_AT, lse, delta, b, h, row0, nrows, tid, ROWS, THREADS, False)
    ptx.cp_async_wait_group(0)
    cuda.syncthreads()


@device_function
def load_rows_now(dst_a, src_a, dst_b, src_b, b, h, row0, nrows, tid, ROWS, D, THREADS, scale_a,
                  stats, lse, delta, STATS, DCOLS, pg=None):
    """The row-group kernels' step: a barrier (every thread is done with the previous
    tile), ROWS rows of two arrays as fp32 into 2-D shared tiles (``copy.load_rows_f32``,
    the first times ``scale_a``) and, when ``STATS``, their lse and delta into
    ``stats`` ([lse | delta], ROWS each); then a barrier: all of it visible to every
    thread."""
    cuda.syncthreads()
    copy.load_rows_f32(dst_a, src_a, dst_b, src_b, True, b, h, row0, nrows, tid, ROWS, D, THREADS, scale_a, DCOLS, pg)
    if STATS:
        softmax.stage_row_stats(stats, 0, ROWS, lse, delta, b, h, row0, nrows, tid, ROWS, THREADS, False)
    cuda.syncthreads()

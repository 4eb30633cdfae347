"""Tile copies from global to shared memory: cp.async in 16-byte chunks, with swizzle.

A tile is ``ROWS`` consecutive rows of one (batch, head) of a (B, N, H, d) array,
from row ``row0``; rows at or past ``nrows`` (the end of the sequence) are zero-filled
(``cp.async`` with a source size of 0; the source row is clamped in bounds).  Row r of
the tile starts ``r · ROW_BYTES`` bytes into the shared tile (``ROW_BYTES`` may include
padding), and its 16-byte chunk c is stored at chunk ``swizzle(r, c, SWIZZLE)``:

* ``SW_NONE``: chunk c (padded rows keep the banks apart instead);
* ``SW_16BIT``: 16-bit tiles read by ldmatrix, whose 8 row addresses must hit 8
  different 16-byte bank groups: ``c ^ (r & 7)`` when rows are a multiple of 128 bytes
  (head dims 64, 128, 192, 256); when they are 64 bytes more than one (32, 96, 160,
  224), two consecutive rows already fill 128 bytes, so the low two bits of the chunk
  are XORed with ``(r >> 1) & 3`` (``c`` stays in its aligned group of four);
* ``SW_TF32``: ``c ^ ((r & 6) ^ ((r & 1) << 2))`` — fp32 tiles read with
  ``ld.shared.v4`` in the TF32 kernels' fragment order (``tf32_forward``'s docstring).
* ``SW_CORE``: not a swizzle of the row but wgmma's no-swizzle layout, 8-row × 16-byte
  core matrices (:func:`chunk_addr`).

Paged KV caches: with ``pg = (block_table, seq)`` (``block_info.kv_pages``) instead of
None, row ``r`` of the sequence is row ``r % page_size`` of page ``block_table[seq, r //
page_size]`` of a (num_blocks, page_size, H, d) array (:func:`source_at`); ``b`` is not
used.  A tile whose rows lie in one page looks its page up once (:func:`page_of`); a
tile across a page boundary finds each row's page.  ``pg is None`` is decided when numba
compiles the function, so the unpaged copies carry no trace of it.

The copies belong to the thread's open cp.async group: the caller commits
(``ptx.cp_async_commit``), waits, and then needs a ``syncthreads`` before other threads
read the tile.  All ``THREADS`` threads of the block share the work, chunk
``tid + i·THREADS`` each.
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, int64, uint32

SW_NONE = 0
SW_16BIT = 1
SW_TF32 = 2
SW_CORE = 3  # wgmma's no-swizzle K-major layout: 8 x 8 core matrices (chunk_addr)

#: ``UNROLL`` of :func:`copy_rows` for a thread that keeps one chunk column
#: (:func:`_copy_lane_rows`; the caller checks :func:`lane_rows_fit`).
LANE_ROWS = 2


@device_function
def swizzle(r, c, SWIZZLE, ROW_BYTES=128):
    """Where chunk ``c`` of row ``r`` (of ``ROW_BYTES``) is stored in its row (see the
    module docstring)."""
    if SWIZZLE == SW_16BIT:
        if ROW_BYTES % 128 == 0:
            return c ^ (r & 7)
        return c ^ ((r >> 1) & 3)
    if SWIZZLE == SW_TF32:
        return c ^ ((r & 6) ^ ((r & 1) << 2))
    return c


@device_function
def chunk_addr(tile, r, c, ROW_BYTES, SWIZZLE):
    """Shared byte address of chunk ``c`` of row ``r`` of the tile at ``tile``; with
    ``SW_CORE``, in core matrix (r // 8, c) of 8 rows × 16 bytes: byte (r // 8)·(8·row
    bytes) + c·128 + (r % 8)·16 (``kernels.wgmma_forward``'s descriptors)."""
    if SWIZZLE == SW_CORE:
        return tile + (r >> 3) * (ROW_BYTES * 8) + (c << 7) + ((r & 7) << 4)
    return tile + r * ROW_BYTES + (swizzle(r, c, SWIZZLE, ROW_BYTES) << 4)


@device_function
def source_at(src, b, row, h, col, pg):
    """The index of element ``col`` of row ``row`` (of head ``h``, batch ``b``) in
    ``src``: ``(b, row, h, col)``, or through a block table (module docstring)."""
    if pg is None:
        return b, row, h, col
    page = uint32(src.shape[1])
    at = uint32(row)
    if page & (page - uint32(1)) == 0:  # a power of two (the same for every thread): a shift and a mask
        p = uint32(at >> uint32(cuda.ffs(page) - 1))
        r = uint32(at & (page - uint32(1)))
    else:
        p = uint32(at // page)  # 32-bit: a 64-bit division costs several times the instructions
        r = uint32(at - p * page)
    return pg[0][pg[1], p], r, h, col


@device_function
def copy_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
              THREADS, UNROLL, DCOLS, SYNC, pg=None):
    """Start copying rows ``row0 .. row0 + ROWS − 1`` of ``src_a[b, :, h, :]`` (CHUNKS
    16-byte chunks of ELEMS elements a row) into the shared tile at ``tile_a``, and when
    ``TWO`` the same rows of ``src_b`` into ``tile_b`` (same layout, same index
    arithmetic).  Thread ``tid`` takes chunks ``tid + i·THREADS``: in a loop the
    compiler unrolls when ``UNROLL`` (ROWS·CHUNKS a multiple of THREADS: every address
    computed up front, more registers), else in a counted loop; ``UNROLL=LANE_ROWS``
    (:func:`lane_rows_fit`): the same chunks, a tile whose rows all exist copied by
    :func:`_copy_lane_rows`.  When the arrays' rows
    hold ``DCOLS`` < CHUNKS·ELEMS elements (a head dim padded up to the tile's; 0: all),
    the columns past them are zero-filled.  ``SYNC``: the source rows are not 16-byte
    aligned, so a chunk is read by plain loads (16-bit elements, ELEMS = 8) and stored
    with one 16-byte shared store, at once (:func:`_load_chunk`).  ``pg``: a paged
    source (module docstring)."""
    if pg is None:
        _copy_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                   THREADS, UNROLL, DCOLS, SYNC, None)  # fmt: skip
        return
    page, first = page_of(src_a, row0, ROWS, pg)
    if page >= 0:  # the tile's rows are rows first .. of one page: looked up once, not a row at a time
        _copy_rows(tile_a, src_a, tile_b, src_b, TWO, page, h, first, first + (nrows - row0), tid, ROWS, CHUNKS, ELEMS,
                   ROW_BYTES, SWIZZLE, THREADS, UNROLL, DCOLS, SYNC, None)  # fmt: skip
    else:
        _copy_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                   THREADS, UNROLL, DCOLS, SYNC, pg)  # fmt: skip


@device_function
def page_of(src, row0, ROWS, pg):
    """``(page, row in it)`` of row ``row0`` of a paged sequence (``pg``) when rows
    ``row0 .. row0 + ROWS − 1`` all lie in that page (a contiguous cache's single page
    always holds them; a paged one when pages are a multiple of the tile, or the tile
    does not cross a page's end), else ``(−1, 0)``: a tile then finds its rows one by
    one (:func:`source_at`).  Both results are int64 pairs (numba may compile a branch
    on ``pg is None`` for a tuple too, so nothing here may be Optional)."""
    page = uint32(src.shape[1])
    at = uint32(row0)
    if page & (page - uint32(1)) == 0:
        shift = uint32(cuda.ffs(page) - 1)
        p = at >> shift
        last = (at + uint32(ROWS - 1)) >> shift
        r = at & (page - uint32(1))
    else:
        p = at // page
        last = (at + uint32(ROWS - 1)) // page
        r = at - p * page
    if p == last:
        return int64(pg[0][pg[1], p]), int64(r)
    return int64(-1), int64(0)


@device_function
def _copy_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
               THREADS, UNROLL, DCOLS, SYNC, pg):
    """The loop of :func:`copy_rows` (``pg``: rows looked up one by one, or None)."""
    if UNROLL == LANE_ROWS and not SYNC and pg is None and row0 + ROWS <= nrows:
        _copy_lane_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                        THREADS, DCOLS)  # fmt: skip
    elif UNROLL and UNROLL != LANE_ROWS:
        for i in range(ROWS * CHUNKS // THREADS):
            _copy_chunk(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, tid + i * THREADS, CHUNKS, ELEMS,
                        ROW_BYTES, SWIZZLE, DCOLS, SYNC, pg)  # fmt: skip
    else:
        for idx in range(tid, ROWS * CHUNKS, THREADS):
            _copy_chunk(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, idx, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                        DCOLS, SYNC, pg)  # fmt: skip


def lane_rows_fit(threads: int, chunks: int, rows: int) -> bool:
    """Whether a tile of ``rows`` rows of ``chunks`` chunks splits over ``threads``
    threads with each thread's chunk column fixed (``UNROLL=LANE_ROWS``), in at most 16
    copies a thread and array (32 at d = 256 in one warp spilled: ``ptxas``)."""
    return threads % chunks == 0 and rows % (threads // chunks) == 0 and rows // (threads // chunks) <= 16


@device_function
def _copy_lane_rows(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                    THREADS, DCOLS):
    """:func:`_copy_rows` of a tile whose rows all exist (``row0 + ROWS <= nrows``), when
    ``THREADS`` is a multiple of ``CHUNKS``: thread ``tid`` copies chunk column
    ``tid % CHUNKS`` of rows ``tid // CHUNKS + i·STEP`` (``STEP = THREADS // CHUNKS``),
    in an unrolled loop.  The source's address is computed once, and each copy reads
    ``i·STEP`` rows (a byte count: ``ptx.cp_async_16_zfill_at``) past it, with no row
    clamped or tested: three or four instructions a 16-byte copy, where the general
    loop's division of the chunk index, clamp and 64-bit products took about 25 (most
    of the instructions of the one-warp decode tiles' key tile, 32 copies a lane:
    docs/benchmarks/2026-12-04-s22)."""
    STEP = THREADS // CHUNKS
    c = tid % CHUNKS
    r = tid // CHUNKS
    col = c * ELEMS
    ok = True
    if DCOLS != 0 and DCOLS < CHUNKS * ELEMS:  # columns past the data: zeros (the source clamped, not read)
        ok = col < DCOLS
        col = min(col, DCOLS - ELEMS)
    step_a = STEP * src_a.strides[1]  # bytes from one of the thread's rows to the next
    step_b = STEP * src_b.strides[1]
    for i in range(ROWS // STEP):
        at = chunk_addr(0, r + i * STEP, c, ROW_BYTES, SWIZZLE)
        ptx.cp_async_16_zfill_at(tile_a + at, src_a, (b, row0 + r, h, col), i * step_a, ok)
        if TWO:
            ptx.cp_async_16_zfill_at(tile_b + at, src_b, (b, row0 + r, h, col), i * step_b, ok)


@device_function
def _copy_chunk(tile_a, src_a, tile_b, src_b, TWO, b, h, row0, nrows, idx, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE, DCOLS,
                SYNC, pg):
    r = idx // CHUNKS
    c = idx - r * CHUNKS
    row = row0 + r
    at = chunk_addr(0, r, c, ROW_BYTES, SWIZZLE)
    if SYNC:
        _load_chunk(tile_a + at, src_a, b, row, h, c * ELEMS, nrows, DCOLS, pg)
        if TWO:
            _load_chunk(tile_b + at, src_b, b, row, h, c * ELEMS, nrows, DCOLS, pg)
        return
    if DCOLS == 0 or DCOLS >= CHUNKS * ELEMS:
        ok = row < nrows
        src_at = source_at(src_a, b, min(row, nrows - 1), h, c * ELEMS, pg)
    else:  # columns past the data: zeros (the source clamped in bounds, not read)
        ok = row < nrows and c * ELEMS < DCOLS
        src_at = source_at(src_a, b, min(row, nrows - 1), h, min(c * ELEMS, DCOLS - ELEMS), pg)
    ptx.cp_async_16_zfill(tile_a + at, src_a, src_at, ok)
    if TWO:
        ptx.cp_async_16_zfill(tile_b + at, src_b, src_at, ok)


@device_function
def _load_chunk(dst, src, b, row, h, col0, nrows, DCOLS, pg):
    """The 8 16-bit elements ``src[b, row, h, col0 .. col0 + 7]`` (0 past ``nrows`` and
    past ``DCOLS`` columns) by plain loads, as one 16-byte store to ``dst``."""
    w0 = load_pair(src, b, row, h, col0, nrows, DCOLS, pg)
    w1 = load_pair(src, b, row, h, col0 + 2, nrows, DCOLS, pg)
    w2 = load_pair(src, b, row, h, col0 + 4, nrows, DCOLS, pg)
    w3 = load_pair(src, b, row, h, col0 + 6, nrows, DCOLS, pg)
    ptx.st_shared_v4_b32(dst, w0, w1, w2, w3)


@device_function
def load_pair(src, b, row, h, col, nrows, DCOLS, pg):
    """Elements ``col`` (low half) and ``col + 1`` of ``src[b, row, h]`` as one word."""
    lo = uint32(0)
    hi = uint32(0)
    if row < nrows:
        if DCOLS == 0 or col < DCOLS:
            lo = uint32(src[source_at(src, b, row, h, col, pg)])
        if DCOLS == 0 or col + 1 < DCOLS:
            hi = uint32(src[source_at(src, b, row, h, col + 1, pg)])
    return lo | (hi << uint32(16))


@device_function
def copy_tile(tile, src, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE, THREADS, UNROLL=False,
              DCOLS=0, SYNC=False, pg=None):
    """:func:`copy_rows` of one array."""
    copy_rows(tile, src, tile, src, False, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE, THREADS,
              UNROLL, DCOLS, SYNC, pg)  # fmt: skip


@device_function
def copy_tile_pair(tile_a, src_a, tile_b, src_b, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
                   THREADS, UNROLL=False, DCOLS=0, SYNC=False, pg=None):
    """:func:`copy_rows` of the same rows of two arrays (K and V, or Q and dO)."""
    copy_rows(tile_a, src_a, tile_b, src_b, True, b, h, row0, nrows, tid, ROWS, CHUNKS, ELEMS, ROW_BYTES, SWIZZLE,
              THREADS, UNROLL, DCOLS, SYNC, pg)  # fmt: skip


@device_function
def load_rows_f32(dst_a, src_a, dst_b, src_b, TWO, b, h, row0, nrows, tid, ROWS, D, THREADS, scale_a, DCOLS, pg=None):
    """Element-wise synchronous copy, for inputs that cp.async cannot take (rows not
    16-byte aligned, or fp16 read as is by the row-group kernels): rows ``row0 ..
    row0 + ROWS − 1`` of ``src_a[b, :, h, :]``, converted to float32 and multiplied by
    ``scale_a``, into the 2-D shared array ``dst_a`` (ROWS × D), and when ``TWO`` those
    of ``src_b`` (unscaled) into ``dst_b``; zeros past ``nrows`` and, when the arrays'
    rows are ``DCOLS < D`` long, in columns past ``DCOLS``.  Consecutive threads take
    consecutive elements of a row (coalesced reads).  ``pg``: a paged source."""
    for idx in range(tid, ROWS * D, THREADS):
        r = idx // D
        col = idx - r * D
        row = row0 + r
        if row < nrows and (DCOLS >= D or col < DCOLS):
            at = source_at(src_a, b, row, h, col, pg)
            dst_a[r, col] = float32(src_a[at]) * scale_a
            if TWO:
                dst_b[r, col] = float32(src_b[at])
        else:
            dst_a[r, col] = float32(0.0)
            if TWO:
                dst_b[r, col] = float32(0.0)


@device_function
def load_lane_row(dst, D0, src, b, row, h, nrows, g, G, COLS, scale, DCOLS):
    """A row-group lane's columns ``c·G + g`` (c < COLS) of ``src[b, row, h, :]``, as
    float32 times ``scale``, into registers ``dst[D0 + c]``; zeros past ``nrows`` and,
    when the arrays' rows are ``DCOLS < COLS·G`` long, in columns past ``DCOLS``."""
    for c in range(COLS):
        if row < nrows and (DCOLS >= COLS * G or c * G + g < DCOLS):
            dst[D0 + c] = float32(src[b, row, h, c * G + g]) * scale
        else:
            dst[D0 + c] = float32(0.0)

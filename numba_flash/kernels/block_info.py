"""Which tiles a block visits, and which of them need masking (FlashAttention's block_info).

Every kernel first asks :func:`this_block` where it is: its rows, batch, query and KV
head, the row offsets of its sequence in the arrays, and the mask info ``mi``, a tuple
``(seqlen_q, seqlen_k, diag, HAS_LEFT, left, HAS_RIGHT, right)`` that the masking
step (:func:`numba_flash.kernels.mask.visible`) and the tile ranges below read, and
nothing else does: a new kind of mask changes this module and ``mask.py``, not the
kernels.  ``F`` is the kernel's compile-time ``Variant.flags`` tuple
(``numba_flash.variant``), ``params`` its run-time values.

Visibility (bottom-right aligned, as FlashAttention-2 >= 2.1): query i sees key j iff
``j < seqlen_k``, ``j <= i + diag + right`` when the right side is bounded (causal:
right = 0) and ``j >= i + diag − left`` when the left side is, with ``diag = seqlen_k
− seqlen_q`` (query rows past the end are never written or have lse = +inf).

Tile ranges are half-open ranges of tile indices: a query tile of ``BLOCK_M`` rows from
``start_m`` visits key tiles ``[n_lo, n_hi)`` of ``BLOCK_N`` keys (:func:`key_tiles`);
a key tile of ``BLOCK_N`` keys from ``start_n`` is seen by query tiles ``[m_lo, m_hi)``
of ``BLOCK_M`` rows (:func:`query_tiles`, the dK/dV kernels' walk).  Tiles outside
(past the causal diagonal, outside a window's band) are never loaded, so time scales
with the visible area.  Inside the range, :func:`tile_needs_mask` tells the tiles that
hold an invisible (query, key) pair from those that can skip the masking step.
"""

from __future__ import annotations

from numba_flash._numba_cuda import cuda, device_function, int32
from numba_flash.kernels.flex import COUNT, COUNT_T, ORDER, PAGES, SPLIT_AT, VISIT, VISIT_T
from numba_flash.variant import (BLOCK_SPARSE, CAUSAL, CLUSTER, GQA, GROUP, HAS_LEFT, HAS_RIGHT, HEAVIEST_FIRST,
                                  LEFT, PAGED, RIGHT, SECTION_K, SECTION_Q, SPLIT, VARLEN)


@device_function
def this_block(q, k, params, cu_q, cu_k, fx, BLOCK, F, KV_MAJOR):
    """``(start, b, h, hk, q0, k0, mi, seq)`` of the block: the first of the BLOCK rows
    it owns, the batch index of the arrays ``b``, its query head ``h`` and KV head
    ``hk`` (``h // group``, grouped-query attention), the first row of its sequence in
    q and in k (0 unless varlen), the mask info and the sequence's index (the batch, or
    the varlen sequence; ALiBi and dropout use it).  Row tile, y and z come from
    :func:`block_coords` (blockIdx, reordered heaviest first).

    y is the query head, or when ``KV_MAJOR`` (the dK/dV kernels, which sum the
    group's query heads) the KV head, and ``h`` the group's first query head.
    q, k are (B, N, H, d) arrays of any element type; for varlen B = 1 and sequence b
    is rows ``cu_q[b] .. cu_q[b + 1] − 1`` (``cu_k`` for k).  With a paged KV cache
    (``F[PAGED]``, always varlen queries) ``cu_k`` gives the key lengths only: keys are
    addressed by their position in the sequence through the block table
    (:func:`kv_pages`), so ``k0`` is 0.  With split-KV (``F[SPLIT]``) the grid's batch
    axis is split-major over (split, sequence), and ``b`` is the split: the slot of
    out and lse it writes (:func:`walk_list` clips its key tiles)."""
    t, h, seq = block_coords(fx, KV_MAJOR, F)
    return block_at(t, h, seq, q, k, params, cu_q, cu_k, fx, BLOCK, F, KV_MAJOR)


@device_function
def block_at(t, h, seq, q, k, params, cu_q, cu_k, fx, BLOCK, F, KV_MAJOR):
    """:func:`this_block` of the block at row tile ``t``, head ``h`` and batch or
    sequence ``seq`` (a persistent kernel's tile: :func:`grid_coords`)."""
    part = 0
    if F[SPLIT]:
        part, seq = split_of(seq, fx, F)
    if F[VARLEN]:
        b = part  # the arrays' batch: 0, or a split's slot of out and lse (q seen with a stride-0 split axis)
        q0 = cu_q[seq]
        seqlen_q = cu_q[seq + 1] - q0
        seqlen_k = cu_k[seq + 1] - cu_k[seq]
        k0 = 0 if F[PAGED] else cu_k[seq]
    else:
        b = seq
        q0 = 0
        k0 = 0
        seqlen_q = q.shape[1]
        seqlen_k = k.shape[1]
    hk = h
    if F[GQA]:
        if KV_MAJOR:
            h = hk * params[GROUP]
        else:
            hk = h // params[GROUP]
    return t * BLOCK, b, h, hk, q0, k0, mask_info(seqlen_q, seqlen_k, params, F), seq


@device_function
def split_of(z, fx, F):
    """``(split, sequence)`` of position ``z`` of the grid's batch axis under split-KV,
    which runs split-major over (split, sequence): ``fx[SPLIT_AT] = (key tiles a split,
    sequences)``; sequence-major when the splits of a row tile form a thread-block
    cluster (``F[CLUSTER]`` = S CTAs: z and the S − 1 positions after it, the cluster's
    ranks along z, are the splits of one sequence)."""
    if F[CLUSTER]:
        seq = z // F[CLUSTER]
        return z - seq * F[CLUSTER], seq
    part = z // fx[SPLIT_AT][1]
    return part, z - part * fx[SPLIT_AT][1]


@device_function
def block_coords(fx, KEYS_ARE_ROWS, F):
    """``(row tile, head, batch)`` of this block (query tile, or key tile when
    ``KEYS_ARE_ROWS``; the KV head for the dK/dV kernels; the batch or varlen
    sequence).  The hardware starts blocks in linear blockIdx order (x fastest), so
    the last ones started should be short, or a long block finishes alone after the
    rest (the tail of the grid).  When row tiles differ in work (a bound, a block
    mask: ``Variant.heaviest_first``) the grid is (heads, batch, row tiles) and
    position ``blockIdx.z`` runs for every head and sequence before the next, its row
    tile the heaviest first: a block mask's ``ORDER`` (``fx``: its row tiles by list
    length, longest first); under a right bound (causal) the last query tiles, which see
    the most keys, and the first key tiles; under a left bound alone the reverse.
    Otherwise the grid is (row tiles, heads, batch) and concurrent blocks share a head's
    K and V in L2.  blockIdx only (no extra live registers): the heads in one L2 section.
    The Hopper kernels take their tiles through :func:`grid_coords` with the call's
    sections (:func:`section_of`), where they were measured; on the mma.sync kernels the
    computed coordinates cost a register (the sm_80 d = 128 causal dK/dV kernel at 255,
    28 bytes spilled under nvJitLink 13.5)."""
    return grid_coords(cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.gridDim.x, cuda.gridDim.y,
                       cuda.gridDim.z, 0, fx, KEYS_ARE_ROWS, F)  # fmt: skip


@device_function
def section_of(params, KEYS_ARE_ROWS, F):
    """The L2 section of a Hopper kernel's heaviest-first grid (``params[SECTION_Q]`` for
    query rows, ``[SECTION_K]`` for key rows: ``spec.l2_sections``); 0 (one section) for
    other grids, and for split-KV's, whose batch axis holds a row tile's splits (a
    cluster's CTAs along z)."""
    if not F[HEAVIEST_FIRST] or F[SPLIT] or F[CLUSTER]:
        return 0
    return params[SECTION_K] if KEYS_ARE_ROWS else params[SECTION_Q]


@device_function
def grid_coords(x, y, z, gx, gy, gz, section, fx, KEYS_ARE_ROWS, F):
    """:func:`block_coords` of the block at (x, y, z) of a grid (gx, gy, gz): blockIdx,
    or a tile of a persistent kernel's virtual grid (:func:`linear_coords`)."""
    if not F[HEAVIEST_FIRST]:
        return x, y, z
    x, y, z = l2_section(x, y, z, gx, gy, gz, section)
    if F[BLOCK_SPARSE]:
        t = fx[ORDER][z]
    elif (F[CAUSAL] or F[HAS_RIGHT]) != KEYS_ARE_ROWS:  # causal queries, or a left bound's keys: the last tiles first
        t = gz - 1 - z
    else:
        t = z
    return t, x, y


@device_function
def l2_section(x, y, z, gx, gy, gz, section):
    """Position (x, y, z) of a heaviest-first grid (heads, batch, row-tile positions),
    started in linear order ``at = x + gx·(y + gy·z)``, as the (head, batch, position) it
    runs when the gx·gy (head, batch) pairs are taken ``section`` at a time: the first
    ``section·gz`` positions run every position of the first section's pairs (all their
    row tiles, position by position: heaviest first within it), and so on, the last
    section holding the rest.  Concurrent blocks then stream the K/V (or Q/dO) of a few
    heads, which stay in L2 (``spec.l2_sections``).  A bijection of the grid; the
    identity when one section holds every pair (``section`` ≥ gx·gy, or 0)."""
    pairs = int32(gx * gy)
    sec = int32(section)
    if sec <= 0 or sec >= pairs:
        return x, y, z
    # int32: a grid's positions fit, and a 64-bit division is a call that spills in the producer warp
    at = int32(x + gx * (y + gy * z))
    span = sec * int32(gz)  # the grid positions of a whole section
    s = at // span
    r = at - s * span
    width = min(sec, pairs - s * sec)  # the pairs of section s (the last may hold fewer)
    p = r // width
    pair = s * sec + r - p * width
    yy = pair // int32(gx)
    return pair - yy * int32(gx), yy, p


@device_function
def linear_coords(tile, gx, gy):
    """(x, y, z) of position ``tile`` of a grid (gx, gy, ·) numbered x fastest, the
    order in which the hardware starts blocks: a persistent block's tiles ``blockIdx.x``,
    ``blockIdx.x + gridDim.x``, … run in the order a full grid's blocks would."""
    x = tile % gx
    yz = tile // gx
    return x, yz % gy, yz // gy


@device_function
def query_grid_dims(q, cu_q, BLOCK, F):
    """``(row tiles, sequences)`` of ``spec.query_grid`` computed in the kernel (a
    persistent kernel's virtual grid): BLOCK-row tiles of the longest sequence and the
    batch, or varlen's sequences (a loop over ``cu_q``: ``max_seqlen_q`` may be longer
    than the longest, and the kernel is not given it)."""
    if F[VARLEN]:
        longest = 0
        for s in range(cu_q.shape[0] - 1):
            longest = max(longest, cu_q[s + 1] - cu_q[s])
        return (longest + BLOCK - 1) // BLOCK, cu_q.shape[0] - 1
    return (q.shape[1] + BLOCK - 1) // BLOCK, q.shape[0]


@device_function
def group_size(params, F):
    """Query heads per KV head (1 without GQA: a literal, the loop over them folds away)."""
    if F[GQA]:
        return params[GROUP]
    return 1


@device_function
def group_walk(it, m_lo, m_hi, h0, F):
    """``(h, i)`` of step ``it`` of a dK/dV walk over query tiles ``[m_lo, m_hi)`` done
    once per query head of the group from ``h0`` (GQA), heads in order: the walk is
    one loop of ``group_size · (m_hi − m_lo)`` steps."""
    if F[GQA]:
        return h0 + it // (m_hi - m_lo), m_lo + it % (m_hi - m_lo)
    return h0, m_lo + it


@device_function
def mask_info(seqlen_q, seqlen_k, params, F):
    """``(seqlen_q, seqlen_k, diag, HAS_LEFT, left, HAS_RIGHT, right)`` (the module
    docstring); causal without a window has the literal bound 0."""
    right = 0
    if F[HAS_RIGHT] and not F[CAUSAL]:
        right = params[RIGHT]
    left = 0
    if F[HAS_LEFT]:
        left = params[LEFT]
    return seqlen_q, seqlen_k, seqlen_k - seqlen_q, F[HAS_LEFT], left, F[HAS_RIGHT], right


@device_function
def key_tiles(start_m, BLOCK_M, BLOCK_N, mi):
    """Key tiles ``[n_lo, n_hi)`` (of BLOCK_N keys) that query rows ``start_m ..
    start_m + BLOCK_M − 1`` see: a right bound stops after the tile holding key
    ``start_m + BLOCK_M − 1 + diag + right``, a left bound starts at the tile holding
    key ``start_m + diag − left``.  Empty (n_hi = n_lo) when no key is visible."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    end_n = seqlen_k
    if has_right:
        end_n = min(seqlen_k, max(0, start_m + BLOCK_M + diag + right))
    n_lo = 0
    if has_left:
        n_lo = min(seqlen_k, max(0, start_m + diag - left)) // BLOCK_N
    return n_lo, max(n_lo, (end_n + BLOCK_N - 1) // BLOCK_N)


@device_function
def query_tiles(start_n, BLOCK_M, BLOCK_N, mi):
    """Query tiles ``[m_lo, m_hi)`` (of BLOCK_M rows) that see any of the keys
    ``start_n .. start_n + BLOCK_N − 1``: a right bound starts at the tile holding query
    ``start_n − diag − right``, a left bound stops after the one holding query
    ``start_n + BLOCK_N − 1 − diag + left``."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    m_lo = 0
    if has_right:
        m_lo = min(seqlen_q, max(0, start_n - diag - right)) // BLOCK_M
    end_m = seqlen_q
    if has_left:
        end_m = min(seqlen_q, max(0, start_n + BLOCK_N - diag + left))
    return m_lo, max(m_lo, (end_m + BLOCK_M - 1) // BLOCK_M)


@device_function
def tile_needs_mask(start_m, BLOCK_M, start_n, BLOCK_N, mi):
    """False when every (query, key) of the tile is visible (``mask.visible``): it ends
    inside the keys, lies wholly on or left of the right bound (the causal diagonal)
    and wholly on or right of the left bound."""
    seqlen_q, seqlen_k, diag, has_left, left, has_right, right = mi
    needs = start_n + BLOCK_N > seqlen_k
    if has_right:
        needs = needs or start_n + BLOCK_N - 1 > start_m + diag + right
    if has_left:
        needs = needs or start_n < start_m + BLOCK_M - 1 + diag - left
    return needs


#: Entries of a visit list a block stages in shared memory (:func:`walk_list`); a longer
#: list's tail is read from global memory.
STAGED = 1024


@device_function
def visit_row(fx, seq, h, t, KEYS_ARE_ROWS, F):
    """``(count, entries, entries)``: the block-sparse list of row tile ``t`` (query
    tile, or key tile when ``KEYS_ARE_ROWS``) of sequence ``seq`` and query head ``h``
    (the lists broadcast over a batch or head axis of size 1), in global memory;
    ``(0, a row, a row)`` without block sparsity (never read)."""
    count, visit = fx[COUNT], fx[VISIT]
    if KEYS_ARE_ROWS:
        count, visit = fx[COUNT_T], fx[VISIT_T]
    if F[BLOCK_SPARSE]:
        bb = seq if count.shape[0] > 1 else 0
        hh = h if count.shape[1] > 1 else 0
        return count[bb, hh, t], visit[bb, hh, t], visit[bb, hh, t]
    return 0, visit[0, 0, 0], visit[0, 0, 0]


@device_function
def kv_pages(fx, seq):
    """``(block_table, seq)``: what ``copy.copy_rows`` needs to find the keys of
    sequence ``seq`` in a paged KV cache (``Variant.paged``)."""
    return fx[PAGES], seq


@device_function
def no_pages(fx, seq):
    """None: keys are rows of K and V (the kernels pick this or :func:`kv_pages` when
    they are made, so that ``copy``'s ``pg is None`` is decided at compile time)."""
    return None


@device_function
def walk_list(fx, seq, h, t, KEYS_ARE_ROWS, F):
    """:func:`visit_row` with its first ``STAGED`` entries copied to shared memory by
    the whole block (the third entry), so that the walk's next tile index is a shared
    load, not a global one on the critical path of every step.  Every thread of the
    block calls it (two barriers, with a block mask only).  The last two entries are a
    split's key tiles ``[lo, hi)`` (``F[SPLIT]``: split p of the grid's batch axis,
    :func:`this_block`, owns tiles ``[p·n, p·n + n)`` with ``n = fx[SPLIT_AT][0]``; 0, 0
    otherwise), which :func:`walk_range` clips the walk to."""
    n, row, _ = visit_row(fx, seq, h, t, KEYS_ARE_ROWS, F)
    staged = cuda.shared.array(STAGED, int32)
    if F[BLOCK_SPARSE]:
        cuda.syncthreads()  # every thread is done with the last list staged here (dK/dV: the last head's)
        for i in range(cuda.threadIdx.x, min(n, STAGED), cuda.blockDim.x):
            staged[i] = row[i]
        cuda.syncthreads()  # the staged entries are visible to all
    split_lo = 0
    split_hi = 0
    if F[SPLIT]:
        split_lo = split_of(block_coords(fx, KEYS_ARE_ROWS, F)[2], fx, F)[0] * fx[SPLIT_AT][0]
        split_hi = split_lo + fx[SPLIT_AT][0]
    return n, row, staged, split_lo, split_hi


@device_function
def read_walk_list(fx, seq, h, t, KEYS_ARE_ROWS, F, part=0):
    """:func:`walk_list` for a warp-specialized kernel, whose roles walk a tile at
    different times and cannot stage the list together: its entries read from global
    memory (the second and third entries both the list); with split-KV (``F[SPLIT]``)
    the key tiles of split ``part`` (the tile's, not the block's: a persistent block
    runs tiles of several splits), else (0, 0)."""
    n, row, _ = visit_row(fx, seq, h, t, KEYS_ARE_ROWS, F)
    split_lo = 0
    split_hi = 0
    if F[SPLIT]:
        split_lo = part * fx[SPLIT_AT][0]
        split_hi = split_lo + fx[SPLIT_AT][0]
    return n, row, row, split_lo, split_hi


@device_function
def walk_range(lo, hi, vr, F):
    """Positions ``[lo, hi)`` of a walk over the tile range ``[lo, hi)``, or over the
    visit list ``vr`` (:func:`visit_row`, already clipped to that range); with a split
    (``F[SPLIT]``, no block mask), the part of the range inside its key tiles."""
    if F[BLOCK_SPARSE]:
        return 0, vr[0]
    if F[SPLIT]:
        lo2 = max(lo, vr[3])
        return lo2, max(lo2, min(hi, vr[4]))
    return lo, hi


@device_function
def _entry(p, vr):
    return vr[2][p] if p < STAGED else vr[1][p]


@device_function
def tile_at(p, vr, F):
    """The tile index at position ``p`` of the walk (:func:`walk_range`)."""
    if F[BLOCK_SPARSE]:
        return _entry(p, vr) >> 1
    return p


@device_function
def tile_partial(p, vr, F):
    """True when the tile at position ``p`` is a block mask's PARTIAL one (its
    ``mask_mod`` is evaluated); the literal False without a block mask."""
    if F[BLOCK_SPARSE]:
        return (_entry(p, vr) & 1) != 0
    return False


@device_function
def group_steps(m_lo, m_hi, h0, t, fx, seq, params, F):
    """Steps of a dK/dV walk over query tiles done once per query head of the group
    (:func:`group_walk`): ``group_size · (m_hi − m_lo)``, or with a block mask the
    sum of the heads' list lengths (key tile ``t``)."""
    if F[BLOCK_SPARSE]:
        n = 0
        for hq in range(group_size(params, F)):
            n += visit_row(fx, seq, h0 + hq, t, True, F)[0]
        return n
    return group_size(params, F) * (m_hi - m_lo)


@device_function
def group_tile(it, m_lo, m_hi, h0, t, fx, seq, F):
    """``(h, i, partial)`` of step ``it`` of that walk: the query head, the query tile
    and whether it is a block mask's PARTIAL one (heads in order, each head's tiles in
    increasing order)."""
    if F[BLOCK_SPARSE]:
        h = h0
        p = it
        vr = visit_row(fx, seq, h, t, True, F)
        while p >= vr[0]:
            p -= vr[0]
            h += 1
            vr = visit_row(fx, seq, h, t, True, F)
        return h, tile_at(p, vr, F), tile_partial(p, vr, F)
    h, i = group_walk(it, m_lo, m_hi, h0, F)
    return h, i, False

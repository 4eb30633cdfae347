"""The Hopper kernels' shared steps (``wgmma_forward``, ``wgmma_backward``): mbarrier
phases, TMA row copies into 128-byte-swizzled tiles, and the two wgmma chains every
product of these kernels is made of.

A 16-bit tile of ``rows`` rows × d columns lies in shared memory as d / 64 atoms (64
columns, 128 bytes a row: a TMA box, ``tma.attention_maps``), atom a at
``a · rows · 128`` bytes; row r of an atom at ``r · 128``, its 16-byte chunk c at
``(c XOR r mod 8) · 16`` (the 128-byte swizzle, ``_ptx_sim.swizzle_128b``).  The tile
starts 1024-byte aligned (the swizzle's repeat).

* ``ss_chain``: D (64 × N) = A·Bᵀ over d, both operands such tiles, K-major (their
  rows' d contiguous): S = Q·Kᵀ, Sᵀ = K·Qᵀ, dP = dO·Vᵀ, dPᵀ = V·dOᵀ.
* ``rs_chain``: D (64 × d) += A·B over the B tile's rows, A from registers (packed
  accumulators: P, Pᵀ, dS, dSᵀ) and B such a tile read MN-major (its rows are the
  product's k dimension, as V, dO, Q and K lie in HBM): O += P·V, dV += Pᵀ·dO,
  dK += dSᵀ·Q, dQ += dS·K.
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, int32, uint32
from numba_flash.kernels.copy import source_at
from numba_flash.variant import PAGED, VARLEN

ATOM = 64  # columns of a 128-byte swizzle atom (16-bit elements): a TMA box's width
FULL_MASK = 0xFFFFFFFF  # every lane of a warp (its shuffles)
ROW_GROUP = 1024  # bytes of 8 swizzled rows: a descriptor's stride between 8-row groups
K_SLICE = 16 * 128  # bytes of 16 rows of an atom: one k-slice of an MN-major B operand
SMEM_LIMIT = 227 * 1024  # the dynamic shared memory a block may have on an H100/H200


def tile_dim(head_dim: int, dims: tuple) -> int:
    """The tiles' head dim (one of ``dims``, a kernel's) for arrays of ``head_dim``
    columns: ``head_dim`` itself when it is one of them, else the next for a multiple of
    8 below the last (TMA zero-fills a box's columns past the array's d, so the products
    see zeros there, and the epilogue writes d columns: the tiles' ``data_dim``); 0 for
    any other (the plan sends those to the mma.sync kernels).  Multiples of 8 only: TMA
    needs 16-byte row strides, and the 16-byte stores of O 16-byte rows."""
    if head_dim in dims:
        return head_dim
    if head_dim % 8 or not 0 < head_dim < dims[-1]:
        return 0
    return next(d for d in dims if d > head_dim)


@device_function
def wait_phase(bar, parity):
    """Spin until the mbarrier at ``bar`` has completed the phase of this ``parity``."""
    while ptx.mbarrier_try_wait_parity(bar, parity) == 0:
        pass


@device_function
def hold_before_wait(row_sum):
    """End a basic block here, so that ptxas keeps the instructions above before the
    ``wgmma.wait_group`` that follows.  ptxas schedules a block at a time, and within one
    it hoisted the forward's wait for P·V above the softmax's row max (all 66
    exponentials of a step after the wait, none under the P·V they should hide behind)
    and the backward's waits for dP and the products above P (session 26; session 48
    read both in the SASS).  ``row_sum`` (a row's l_i, or a P) is never negative, so the
    fence never runs; its branch is the boundary (a predicated ``MEMBAR`` and a
    ``BSSY``/``BSYNC`` pair a step).  What the condition does not read may still be sunk
    into the next block: by LLVM unless :func:`hold_tile` holds it first, and even then by
    ptxas (8 of the backward step's 32 exponentials).
    (``wgmma_forward.hold_exponentials``, ``wgmma_backward.hold``.)"""
    if row_sum < float32(0.0):
        cuda.threadfence_block()


@device_function
def hold_tile(acc, N):
    """``acc[0:N]`` (N a multiple of 4) computed here, before a following
    :func:`hold_before_wait`'s branch, not sunk past it by LLVM (``ptx.hold_f32x4``)."""
    for i in range(N // 4):
        ptx.hold_f32x4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])


@device_function
def load_rows(dst, tmap, rows0, h, b, bar, ATOMS, ATOM_BYTES):
    """TMA copies of rows ``rows0 …`` of head ``h``, batch ``b``: ``ATOMS`` boxes of 64
    columns, box a at ``dst + a·ATOM_BYTES``, completing on ``bar``."""
    for a in range(ATOMS):
        ptx.cp_async_bulk_tensor_4d_g2s(dst + a * ATOM_BYTES, tmap, a * ATOM, rows0, h, b, bar)


@device_function
def page_of_box(cache, start, seqlen, pg, lane, ROWS, BOX):
    """Lane ``lane``'s lookup for a paged KV cache's tile of rows ``start`` …
    ``start + ROWS − 1`` of a sequence of ``seqlen`` keys, copied in TMA boxes of ``BOX``
    rows (``wgmma_forward.key_box``: a box lies inside one page): ``(page, row in it)``
    of box ``lane`` (``copy.source_at``'s, through ``pg`` = (block table, sequence)), or
    (−1, 0) for a lane past the tile's boxes or a box past the sequence (no table entry
    past it is read).  The producer warp's lanes look up a tile's boxes at once, a tile
    ahead of its copies (:func:`load_page_boxes`), so that the table's latency is not
    on the copies' path."""
    page = int32(-1)
    row = int32(0)
    at = start + lane * BOX
    if lane < ROWS // BOX and at < seqlen:
        p, r, _, _ = source_at(cache, 0, at, 0, 0, pg)
        page = int32(p)
        row = int32(r)
    return page, row


@device_function
def load_page_boxes(dst, tmap, page, row, start, seqlen, h, bar, lead, ATOMS, ATOM_BYTES, ROWS, BOX):
    """A paged tile (rows ``start`` … of a sequence of ``seqlen`` keys) into the tile at
    ``dst``, by the producer warp (every lane takes part in the shuffles; lane 0,
    ``lead``, issues): lane i's ``page``, ``row`` are box i's (:func:`page_of_box`);
    ``arrive.expect_tx`` of the boxes' bytes on ``bar``, then each box's TMA copies
    (head ``h``; the map's box over the cache, (pages, page rows, H_kv, d)) to rows
    ``i·BOX`` … of every atom.  Boxes past the sequence (page −1) are not copied: those
    rows keep what the stage held, which masking ignores in K and ``past_rows`` zeroes
    in V."""
    if lead:
        boxes = min(ROWS, seqlen - start + BOX - 1) // BOX  # the boxes page_of_box gave a page
        ptx.mbarrier_arrive_expect_tx(bar, boxes * BOX * 128 * ATOMS)
    for i in range(ROWS // BOX):
        p = cuda.shfl_sync(FULL_MASK, page, i)
        r = cuda.shfl_sync(FULL_MASK, row, i)
        if lead and p >= 0:
            for a in range(ATOMS):
                ptx.cp_async_bulk_tensor_4d_g2s(dst + a * ATOM_BYTES + i * BOX * 128, tmap, a * ATOM, r, h, p, bar)


@device_function
def zero_rows(tile, first, ROWS, ATOMS, ATOM_BYTES, lane):
    """Zero rows ``first`` … ``ROWS − 1`` of each atom of the tile at shared address
    ``tile``, a warp four rows a store (a row of an atom is one 128-byte line: eight lanes'
    16-byte stores, so its swizzled chunk order does not matter).  The producer warp zeroes
    while the consumers wait on the tile: as a row a store of 4-byte words (before session
    36) it cost the 16-sequence varlen backward (issue #11's row) 6%, 1.027–1.043 ms against
    0.961–0.967 with no zeroing at all (a diagnostic, exact only on finite rows); with 16-byte
    stores 0.976–0.985 (H100, docs/benchmarks/2026-12-06-s36 §2)."""
    zero = uint32(0)
    chunk = (lane % 8) * 16
    for a in range(ATOMS):
        for r in range(first + lane // 8, ROWS, 4):
            ptx.st_shared_v4_b32(uint32(tile + a * ATOM_BYTES + r * 128 + chunk), zero, zero, zero, zero)


@device_function
def past_rows(start, ROWS, seqlen, row0, total, F):
    """The first row of a walked tile (rows ``start`` … of a sequence of ``seqlen`` rows
    from array row ``row0``) to zero after its TMA copy, or ``ROWS`` for none: varlen's
    rows past the sequence that lie inside the array hold the next sequence's data
    (TMA zero-fills only past the array), a paged cache's the rest of the page or what
    the stage held (``load_page_boxes``).  Zeroed, a neighbour's inf or NaN cannot reach
    this sequence through a 0 · x of the products (P's masked columns times V)."""
    if F[VARLEN] and start + ROWS > seqlen and (F[PAGED] or row0 + seqlen < total):
        return max(0, seqlen - start)
    return ROWS


@device_function
def land_and_zero(tiles, first, land, parity, full, lane, ROWS, ATOMS, ATOM_BYTES):
    """The producer warp's step after the copies of ``tiles`` walked tiles (at shared
    addresses ``tiles[0]`` …) were issued on the barrier ``land``: wait for them, zero
    their rows from ``first`` (``zero_rows``), make the zeros visible to wgmma's reads
    (``fence.proxy.async``) and arrive on ``full`` (count 1), which the consumers wait on."""
    wait_phase(land, parity)
    for i in range(len(tiles)):
        zero_rows(tiles[i], first, ROWS, ATOMS, ATOM_BYTES, lane)
    ptx.fence_proxy_async()  # this lane's zeros (generic proxy) before wgmma reads the tile (async proxy)
    cuda.syncwarp()  # every lane's zeros are written and fenced before lane 0 arrives
    if lane == 0:
        ptx.mbarrier_arrive(full)


@device_function
def sw128_desc(addr):
    """The descriptor of a 128-byte-swizzled K-major operand at ``addr`` (8-row groups
    1024 bytes apart; LBO unused)."""
    return ptx.wgmma_desc(addr, 16, ROW_GROUP, ptx.SWIZZLE_128B)


def ss_chain(wgmma, KSTEPS, A_ATOM, B_ATOM, COMMIT=True):
    """A device function ``(acc, a_tile, b_tile)``: ``acc`` (64 × N) = A·Bᵀ, A's 64 rows
    at ``a_tile`` and B's N rows at ``b_tile`` (tiles whose atoms are ``A_ATOM`` and
    ``B_ATOM`` bytes), ``KSTEPS`` = d / 16 wgmma (``wgmma``: an
    ``m64nNk16_*_acc`` of ``ptx``) chained on one accumulator (the first overwrites
    it), one commit group (not ``COMMIT``: the caller adds a product to it and commits).
    Each k-slice's descriptors come from its address (session 33's 32-bit adds to a tile's
    descriptor, fewer instructions, timed no faster on an H100 in session 34: removed)."""

    @device_function
    def chain(acc, a_tile, b_tile):
        for kk in range(KSTEPS):
            at = (kk % 4) * 32  # the k-slice's 32 bytes within its atom's rows
            a_desc = sw128_desc(a_tile + (kk // 4) * A_ATOM + at)
            b_desc = sw128_desc(b_tile + (kk // 4) * B_ATOM + at)
            wgmma(acc, 0, a_desc, b_desc, 1 if kk > 0 else 0)
        if COMMIT:
            ptx.wgmma_commit_group()

    return chain


def rs_chain(wgmma, PSTEPS, B_ATOM):
    """A device function ``(acc, a_frag, b_tile)``: ``acc`` (64 × d) += A·B, A's k-slice
    ps in ``a_frag[4ps : 4ps + 4]`` (``fragments.pack_a``), B's rows 16ps … of the tile
    at ``b_tile`` (atoms ``B_ATOM`` bytes apart: the descriptor's LBO), ``PSTEPS``
    wgmma (``wgmma``: an ``m64n{d}k16_*_rs_bmn_acc``), one commit group."""

    @device_function
    def chain(acc, a_frag, b_tile):
        for ps in range(PSTEPS):
            b_desc = ptx.wgmma_desc(b_tile + ps * K_SLICE, B_ATOM, ROW_GROUP, ptx.SWIZZLE_128B)
            wgmma(acc, 0, a_frag, ps * 4, b_desc, 1)
        ptx.wgmma_commit_group()

    return chain

"""Hopper (sm_90a) FlashAttention backward for fp16 and bf16: TMA, mbarriers, wgmma and
warp specialization (issue #13).

Runs by default on sm_90a (``plan.wgmma_backward``; ``NUMBA_FLASH_WGMMA=0`` turns it
off).  Three launches: the preprocess, the dK/dV kernel, the dQ kernel.

Math (as ``tc_backward``: log2 domain, P recomputed from the saved lse)::

    stats[b, h, 0, i] = lse_i · log2(e)  (+inf for a row that saw no key, or past Nq)
    stats[b, h, 1, i] = delta_i = Σ_c dO_ic · O_ic   (0 past Nq)        preprocess
    Sᵀ  = K·Q_iᵀ,  dPᵀ = V·dO_iᵀ     wgmma m64n{BLOCK_M}k16, both operands from shared memory
    Pᵀ, dSᵀ                           ``fragments.p_and_ds`` (keys are rows)
    dV += Pᵀ·dO_i,  dK += dSᵀ·Q_i    wgmma m64n{d}k16, A from registers, B MN-major;
                                      dK ·= softmax_scale at the end        dK/dV kernel
    S   = Q·K_jᵀ,  dP  = dO·V_jᵀ,  P, dS,  dQ += dS·K_j,  dQ ·= softmax_scale   dQ kernel

Both kernels are one factory (``wgmma_bwd_kernel``): a block owns 128 rows (keys in
dK/dV, queries in dQ: the ``fixed`` tiles, loaded once) and walks tiles of the other
axis (the ``ring`` tiles, two stages).  At d = 256 dV and dK are two kernels of it
(``WgmmaBwdTiles.part``, ``RINGS``: a thread cannot hold both), the dV one without dP
and V.  Head dims: 64, 128, 256, and the multiples of 8 below 256 on the next of them
(``hopper.tile_dim``: TMA zero-fills the columns past d, the epilogue writes d).  The products are ``hopper.ss_chain`` and
``hopper.rs_chain``; P and dS are ``tc_backward``'s steps on one m-tile a warp, since a
wgmma m64nN accumulator holds per thread an m16n8 accumulator's values for N/8 n-tiles.

dQ is its own pass (no atomics: every dQ element is written once, bitwise
deterministic).  It costs recomputing S and dP there: 7 matrix products where an
atomic dQ would make 5.  Session 24's dK/dV kernel that summed dQ itself in a deterministic
order (FlashAttention-3's: bulk reductions in L2, a semaphore a query tile) measured 1.18–1.40×
the dQ kernel's time on the H200 and was removed in session 38 (docs/hopper.md).

Grid and threads: dK/dV grid = (ceil(Nk / 128), H_kv, B) (``spec.key_grid``), dQ grid =
(ceil(Nq / 128), H, B) (``spec.query_grid``); 384 threads a block:

* warpgroup 0, the producer (``setmaxnreg`` 24): its thread 0 issues every copy, by TMA
  (``tma.attention_maps``: 64-column boxes, the 128-byte swizzle): the two fixed tiles
  once, then the two ring tiles of each step into a two-stage ring, each stage filling
  after both consumers released it.  In dK/dV it also copies the step's lse and delta
  rows from ``stats`` (1-D bulk copies; the preprocess pads ``stats`` to a multiple of
  128 rows, so every copy is whole) onto the same barrier.  varlen: the walked rows
  past a sequence, which hold the next sequence's, are zeroed by the producer's warp
  once they land (``hopper.land_and_zero``: they land on ``land``, and ``full[s]``
  completes after the zeros), so that a masked 0 never meets a neighbour's inf or
  NaN; a sequence's stats rows start 16-byte aligned (``stats_row0``).
* warpgroups 1 and 2, the consumers (``setmaxnreg`` 240), own rows 0–63 and 64–127 of
  the block; warp w of one owns 16 of them.  In dQ a lane keeps its two rows' lse and
  delta in registers.  Group-query attention (dK/dV): the walk over the query tiles
  once per query head of the group, in order (a deterministic sum).

Synchronisation (position p of the walk: stage s = p mod 2, its fill p // 2; a phase's
parity is the fill's):
    fixed_full   the producer's arrive.expect_tx + the TMA bytes of the fixed tiles
    full[s]      the same for the ring tiles (and dK/dV's stats rows) of the step, or
                 (varlen, rows past the sequence) the producer's arrival after zeroing them
    land         varlen's such steps' copies landed (one at a time: the producer waits)
    empty[s]     256 consumer arrivals after the wait_group that retires their last
                 wgmma on the stage: the producer may overwrite it
No ``syncthreads`` after the roles split (one before it: the barriers are initialised).

The pipelined step (``pipelined``, on by default: the dQ kernel up to d = 128, session 25): the
walk's first step issues its Sᵀ and dPᵀ alone; every next step issues its S and dP, then the previous
step's gradient products behind them (``pipelined_step``), waits for S (``wgmma_wait_group``: the
groups complete in order), computes P (``fragments.p_first``), waits for dP, computes dS
(``fragments.ds_then``), waits for the products, releases the previous step's stage and packs its P
and dS; the last step's products go alone.  Nothing is in flight across a branch or the loop's back
edge: ptxas serializes every wgmma of a kernel where in-flight wgmma cross one (C7514/C7515).  A
stage is released a step later than unpipelined, so the ring has three stages.  The gradients are
bitwise those of the unpipelined step; over three calls the dQ kernel ran 0.97–1.31× as fast
(median 1.04×), the backward 0.98–1.05× (median 1.014×; docs/benchmarks/2026-12-04-s25).  In the
SASS (d = 128) P's scaling and masking come before the waits, but of its 32 exponentials only one
comes before the wait for dP and six before the wait for the products (ptxas sinks the rest
below): the gain is mostly the tensor cores' queue.  Not in dK/dV (``pipelined``: its registers).

Shared memory (one dynamic array, 1024-byte aligned: a swizzled tile's repeat; ``smem_layout``):
the two fixed tiles (128·d·2 bytes each; one in d = 256's dV kernel), ``t.stages`` stages (two, or
three in the pipelined dQ kernel) of the two ring tiles (ring·d·2 each), in dK/dV two stages of
lse and delta (ring·8 bytes), then the mbarriers: 128 KiB at d = 128 (dK/dV: 64 queries a step,
dQ: 64 keys, 160 KiB with its three stages), 96 KiB at d = 64 (128 a step; dQ 128 KiB), 192 KiB
at d = 256 (dK and dQ 32 rows a step, dV 64).

Persistent dK/dV (``persistent``, session 31; by default since session 33 at d ≤ 64 and ≤ 1024 query
rows with no variant but causal, where the backward measured 1.05–1.12× (256–1024 rows); 0.93–1.02× on
long and varlen batches, 0.98–1.01× at d = 128 and ≤ 1024 rows: docs/benchmarks/2026-12-06-s32, -s33):
a block an SM runs the
virtual grid's key blocks in turn, K and V in two buffers (``fixed_full`` and buffer 1's full
barrier, each buffer's ``fix_empty``: 256 consumer arrivals once its block's walk is done).

Not yet (issue #13): dK/dV's step pipelined (with steps of half the queries its registers allow
it; measured slower); persistent blocks past d = 64's short walks, and in dQ; head dims not a multiple of 8.

FlexAttention's mods come with the shared steps (``fragments.p_and_ds``: the score_mod
and its derivative, a mask_mod on PARTIAL tiles); a block mask's visit lists (key-major
in dK/dV) are read from global memory (``block_info.read_walk_list``), since the roles
walk apart.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

from numba_flash import ptx
from numba_flash._numba_cuda import SIMULATOR, cuda, device_function, float32, kernel, uint8, uint32
from numba_flash.config import tc_array_layout
from numba_flash.kernels import fragments, pipeline, score, spec
from numba_flash.kernels.block_info import (block_at, grid_coords, group_size, key_tiles, linear_coords,
                                            query_grid_dims, query_tiles, read_walk_list, section_of, tile_at,
                                            tile_partial, walk_range)
from numba_flash.kernels.hopper import (ATOM, SMEM_LIMIT, hold_before_wait, hold_tile, land_and_zero, load_rows,
                                        past_rows, rs_chain, ss_chain, tile_dim, wait_phase)
from numba_flash.variant import HEAVIEST_FIRST, VARLEN, Variant

_ALIGN = None if SIMULATOR else 1024  # a module global, so numba sees a literal; the simulator aligns by itself

HEAD_DIMS = (64, 128, 256)  # the head dims this version runs (wgmma n = d for the gradients)
CONSUMERS = 2
ROWS = 64 * CONSUMERS  # rows a block owns: 64 a consumer warpgroup (wgmma's m)
THREADS = 128 * (CONSUMERS + 1)
PRODUCER_REGS, CONSUMER_REGS = 24, 240  # 128·24 + 256·240 = 64 Ki registers: an SM's
#: varlen's ``stats``: sequence s's rows start at row 4·⌈cu_q[s] / 4⌉ + SEQ_PAD·s (``stats_row0``),
#: 16-byte aligned for the bulk copies, its length rounded up to ``ROWS`` fitting before the next's.
SEQ_PAD = ROWS + 4
#: The kernels' names (their launches' and, in the PTX, their functions'), by ``WgmmaBwdTiles.part``.
NAMES = {"dkdv": "wgmma_bwd_dkdv", "dv": "wgmma_bwd_dv", "dk": "wgmma_bwd_dk", "dq": "wgmma_bwd_dq"}
#: The walked rows a step (the ring's tiles) by head dim and part (``tiles``).  Past d = 128 a
#: thread cannot hold dK and dV (d/2 floats each: 256 registers at d = 256), so ``dv`` (Sᵀ, then
#: dV += Pᵀ·dO; only K fixed) and ``dk`` (Sᵀ, dPᵀ, then dK += dSᵀ·Q) are two kernels, as
#: ``tc_backward``'s ``split_dkdv``: 8 products where one kernel makes 7.  Their shared memory sets
#: the steps: d = 256's fixed tiles are 64 KiB each, so dk and dq (two fixed tiles, 128 KiB) walk
#: 32 rows a step (4 ring tiles of 16 KiB) and dv (one) 64 (4 of 32 KiB): 192 KiB each.
RINGS = {64: {"dkdv": 128, "dq": 128}, 128: {"dkdv": 64, "dq": 64}, 256: {"dv": 64, "dk": 32, "dq": 32}}
#: The maps of ``tma.attention_maps`` (q, k, v, dout), by role in each kernel.
Q_MAP, K_MAP, V_MAP, DO_MAP = 0, 1, 2, 3
#: The pipelined step by default (``pipelined``): backwards 0.98–1.05× as fast on the H200, median
#: 1.014× (the dQ kernel 0.97–1.31×, median 1.04×), bitwise the same gradients
#: (docs/benchmarks/2026-12-04-s25).
PIPE_DEFAULT = "3"


def barrier_layout(stages: int, persistent: bool = False) -> tuple:
    """Byte offsets, from fixed_full (the first mbarrier), of ``(full[0], empty[0], land,
    fix_full1, fix_empty[0], the barriers' bytes)`` for a ring of ``stages`` stages (stage s:
    + 8·s).  Only a persistent kernel has the last three barriers: the second fixed buffer's
    full barrier, then both buffers' empty barriers (``wgmma_bwd_kernel``'s ``FIX_FULL1``,
    ``FIX_EMPTY``)."""
    full, empty, land, end = 8, 8 + 8 * stages, 8 + 16 * stages, 8 * (2 + 2 * stages)
    return full, empty, land, end, end + 8, end + (24 if persistent else 0)


@dataclass(frozen=True)
class WgmmaBwdTiles:
    """One kernel's tiles: ``block_m`` queries by ``block_n`` keys; ``keys_are_rows``:
    the dK/dV kernel (a block owns ``block_n`` = 128 keys and walks query tiles), else
    dQ (owns ``block_m`` = 128 queries, walks key tiles).  ``data_dim``/``aligned``: as
    ``TcTiles``'s (``hopper.tile_dim``: TMA zero-fills the tile's columns past ``data_dim``;
    rows are always 16-byte aligned).  ``part``: what the kernel computes and writes, "dkdv", "dv" or
    "dk" (a dK/dV kernel; ``RINGS``), or "dq"."""

    head_dim: int
    block_m: int
    block_n: int
    keys_are_rows: bool
    data_dim: int = 0
    aligned: bool = True
    part: str = ""
    #: The ring's stages (the walked tiles' buffers in shared memory).
    stages: int = 2
    #: Each step's gradient products issued behind the next step's Sᵀ and dPᵀ, P computed apart from
    #: dS (``wgmma_bwd_kernel``'s PIPE; ``pipelined``).
    pipelined: bool = False
    #: A block an SM running the virtual grid's blocks blockIdx.x, + gridDim.x, …, with two buffers of
    #: the fixed tiles, so that the next block's load under the current one's walk (``persistent``).
    persistent: bool = False
    #: The pipelined step's P and dS held before the waits that follow them (``hold``).
    hold: bool = False

    def __post_init__(self):
        if not self.part:  # the default: the one kernel of its axis
            object.__setattr__(self, "part", "dkdv" if self.keys_are_rows else "dq")

    @property
    def ring(self) -> int:
        """Rows of the walked tiles."""
        return self.block_m if self.keys_are_rows else self.block_n

    @property
    def l2_sections(self) -> bool:
        """Whether the kernel runs its heaviest-first grid in the call's L2 sections
        (``block_info.l2_section``): the one-block-a-tile kernels, where they were measured;
        not the persistent dK/dV kernel, where the section math spilled 92 bytes
        (``traffic.dram`` asks this too)."""
        return not self.persistent


def tiles(head_dim: int, short: bool = False) -> tuple[WgmmaBwdTiles, ...]:
    """The tiles for arrays of ``head_dim`` columns (on ``hopper.tile_dim``'s, ``data_dim``
    the arrays'): the dK/dV kernel(s), then dQ's (``RINGS``): 64 rows a step at
    d = 128 and 128 at d = 64.  A consumer thread holds its gradients (d/2 floats each:
    dK and dV, or dQ), S and dP (ring/2 each) and the packed P and dS (ring/4 each): at
    d = 128 with 64-row steps dK/dV needs 192 of its 240 registers, with 128-row steps it
    would need 256 (ptxas: 848 bytes of spills); at d = 64 the ring is not larger than
    the fixed tile; at d = 256 (dV, then dK: ``RINGS``) shared memory sets them.
    ``NUMBA_FLASH_WGMMA_BWD_RING=kv,q`` sets the dK/dV kernels' and dQ's (the
    benchmark's comparison).  ``short``: :func:`persistent`'s (the call's walks are short)."""
    tile_d = tile_dim(head_dim, HEAD_DIMS)
    if not tile_d:
        raise ValueError(f"head_dim={head_dim}: the wgmma backward runs d in {HEAD_DIMS} and other multiples of 8 "
                         f"below {HEAD_DIMS[-1]}")
    data_dim = head_dim if head_dim != tile_d else 0
    rings = dict(RINGS[tile_d])
    forced = os.environ.get("NUMBA_FLASH_WGMMA_BWD_RING", "")
    if forced:
        kv, q = (int(x) for x in forced.split(","))
        rings = {part: (q if part == "dq" else kv) for part in rings}
    ts = tuple(WgmmaBwdTiles(tile_d, ring, ROWS, True, data_dim, part=part) if part != "dq" else
               WgmmaBwdTiles(tile_d, ROWS, ring, False, data_dim) for part, ring in rings.items())  # fmt: skip
    return tuple(persistent(pipelined(t), short) for t in ts)


def pipelined(t: WgmmaBwdTiles) -> WgmmaBwdTiles:
    """``t`` with the step pipelined or not (``NUMBA_FLASH_WGMMA_BWD_PIPE``; unset: ``PIPE_DEFAULT``):
    ``0`` off; ``1`` on, two stages; ``3`` on, three stages where they fit in shared memory (else
    two); ``3k`` as ``3``, and dK/dV's ring three stages too (not pipelined).  Pipelined, a
    consumer issues each step's gradient products behind the next step's Sᵀ and dPᵀ, so that the
    tensor cores do not wait for its own step; it then releases a stage a step later, which a
    third stage covers (two stages measured slower than none).  The dQ kernel up to d = 128 only:
    past it (d = 256's dQ, dk and dv kernels) ptxas spilled them, and dK/dV's consumer would hold
    dK, dV, Sᵀ, dPᵀ and the packed Pᵀ and dSᵀ at once (224 of its 240 registers at d = 128: ptxas
    spilled 216 bytes; with steps of half the queries it fits, and its kernel measured 1.05–1.16×
    slower: docs/benchmarks/2026-12-04-s25)."""
    mode = os.environ.get("NUMBA_FLASH_WGMMA_BWD_PIPE", PIPE_DEFAULT)
    if mode not in ("0", "1", "3", "3k"):
        raise ValueError(f"NUMBA_FLASH_WGMMA_BWD_PIPE={mode!r}: expected 0, 1, 3 or 3k")
    three = replace(t, stages=3)
    if t.part == "dkdv":
        return three if mode == "3k" and smem_bytes(three) <= SMEM_LIMIT else t
    if mode == "0" or t.head_dim > 128:
        return t
    if mode != "1" and smem_bytes(three) <= SMEM_LIMIT:
        return replace(three, pipelined=True, hold=hold())
    return replace(t, pipelined=True, hold=hold())


def hold() -> bool:
    """``NUMBA_FLASH_WGMMA_BWD_HOLD=1`` (off by default: no faster when timed): the pipelined
    step ends a basic block after P (``hopper.hold_tile``, ``hopper.hold_before_wait``) and
    after dS, so that ptxas keeps them before the waits for dP and for the previous step's
    products.  Without it ptxas hoisted both waits above P's exponentials: in the SASS of
    the d = 128 dQ kernel (ptxas 13.0, session 48) 1 of a step's 32 MUFU.EX2 ran between
    the wait for Sᵀ and the wait for dP, 5 before the wait for the products and 26 after
    it, so the step was pipelined in name only (session 25 measured 0.98–1.05× the
    unpipelined step).  As ``wgmma_forward.hold_exponentials``; outputs bit for bit.  Timed
    (session 49, H100, processes alternated): plain's backward moved −2.6 to +1.9 %, within
    the noise between processes on the power-capped card."""
    return os.environ.get("NUMBA_FLASH_WGMMA_BWD_HOLD", "0") == "1"


#: The persistent dK/dV kernel by default (``persistent``'s ``auto``) for d ≤ this and query
#: rows ≤ ``PERSISTENT_MAX_ROWS``, plain or causal attention only: where its walks are short and
#: its blocks many.  With a variant (softcap, dropout, ALiBi, a window, GQA) its d = 64 kernel
#: spills 24–168 bytes (ptxas, offline, session 33); varlen measured 0.93× (at d = 128).
PERSISTENT_MAX_DIM, PERSISTENT_MAX_ROWS = 64, 1024


def persistent(t: WgmmaBwdTiles, short: bool = False) -> WgmmaBwdTiles:
    """``t`` persistent or not (``NUMBA_FLASH_WGMMA_BWD_PERSISTENT``: unset or ``auto`` where
    ``short``, ``0`` off, ``on`` a block an SM, a number n at most n blocks: the tests' small
    shapes, so that a block runs several): the dK/dV kernel at d ≤ 128 (``part`` "dkdv").  A
    block then runs the virtual grid's blocks blockIdx.x, + gridDim.x, … (the order a full
    grid's would start in), with two buffers of K and V: the producer
    loads the next block's while the consumers walk this one, and its ring runs on, so a
    block's fixed costs (K and V's load, the ring's fill) hide under the previous block's walk
    and epilogue, and blocks past a varlen sequence cost nothing.  Shared memory: 192 KiB at
    d = 128, 128 KiB at d = 64.  ``short`` (:func:`launches`: d ≤ ``PERSISTENT_MAX_DIM``, at
    most ``PERSISTENT_MAX_ROWS`` query rows, no variant but causal) is where it measured faster:
    the backward 1.046–1.075× at (16, 32, 1024, 64) causal in three runs (sessions 32 and 33),
    1.05–1.12× at d = 64 with 1024, 512 and 256 rows, causal and not; at d = 128 with 512 or
    1024 rows 0.98–1.01×, past 1024 rows 0.93–1.02×, the varlen backward 0.93×
    (docs/benchmarks/2026-12-06-s32 §4, 2026-12-06-s33 §4–5)."""
    mode = os.environ.get("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "auto")
    if mode not in ("on", "auto") and not mode.isdigit():
        raise ValueError(f"NUMBA_FLASH_WGMMA_BWD_PERSISTENT={mode!r}: expected auto, 0, on or a number of blocks")
    if mode == "0" or (mode == "auto" and not short) or t.part != "dkdv":
        return t
    on = replace(t, persistent=True)
    return on if smem_bytes(on) <= SMEM_LIMIT else t


def persistent_blocks(blocks: int) -> int:
    """The blocks a persistent kernel launches for a virtual grid of ``blocks``: one an SM
    (``wgmma_forward._sms``: 2 in the simulator), or at most ``NUMBA_FLASH_WGMMA_BWD_PERSISTENT``."""
    from numba_flash.kernels.wgmma_forward import _sms

    mode = os.environ.get("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "auto")
    return max(1, min(blocks, int(mode) if mode.isdigit() else _sms()))


def stats_shape(batch: int, heads: int, seqlen_q: int, sequences: int = 0) -> tuple:
    """The shape of the preprocess's ``stats`` (float32): (batch, heads, 2, rows), rows
    the query rows rounded up to 128, so that a 128-row tile's copy never runs past it.
    varlen (``sequences`` > 0; batch 1, ``seqlen_q`` the packed rows): room for every
    sequence's rows from ``stats_row0`` (at most 4·⌈total / 4⌉ + ``SEQ_PAD``·sequences)."""
    if sequences:
        return batch, heads, 2, 4 * spec.cdiv(seqlen_q, 4) + SEQ_PAD * sequences
    return batch, heads, 2, spec.cdiv(seqlen_q, ROWS) * ROWS


@device_function
def stats_row0(cu_q, seq):
    """varlen: the row of ``stats`` where sequence ``seq``'s rows start (``SEQ_PAD``)."""
    return (cu_q[seq] + 3) // 4 * 4 + SEQ_PAD * seq


@functools.lru_cache(maxsize=None)
def wgmma_bwd_kernel(t: WgmmaBwdTiles, variant: Variant, dtype: str):
    """dK/dV (``t.keys_are_rows``): ``kernel[grid, THREADS, stream, smem_bytes(t)](q, k, v, dout, stats, dk32, dv32,
    softmax_scale, params, alibi, cu_seqlens_q, cu_seqlens_k, fx, tmaps)`` (``t.part`` "dv" or "dk": that output
    only, the other never touched); dQ: the same with ``dq32, dq32`` for ``dk32, dv32`` (the second never
    touched: one signature for all): ``tc_backward``'s kernels' arguments, ``stats`` for lse and delta, and the
    tensor maps of q, k, v and dout (``tma.attention_maps``)."""
    HEAD_DIM, BLOCK_M, BLOCK_N, KEYS_ARE_ROWS = t.head_dim, t.block_m, t.block_n, t.keys_are_rows
    RING, STAGES = t.ring, t.stages
    # persistent (``persistent``): two buffers of the fixed tiles, buffer u's full barrier at fixed_full
    # + u·FIX_FULL1 and its empty one at fixed_full + FIX_EMPTY + 8u
    FULL, EMPTY, LAND, FIX_FULL1, FIX_EMPTY, _ = barrier_layout(STAGES, t.persistent)
    PERSIST = t.persistent
    NFIX = 2 if PERSIST else 1
    F = variant.flags
    WANT_G1 = t.part != "dv"  # dK (or dQ): dP and dS wanted, the second fixed tile (V, or dO) loaded
    WANT_DV = t.part in ("dkdv", "dv")
    FIXED = 2 if WANT_G1 else 1  # the fixed tiles loaded: K and V (dK/dV, dk), K (dv), Q and dO (dq)
    KSTEPS = HEAD_DIM // 16  # k-slices of S, dP (over d)
    PSTEPS = RING // 16  # k-slices of the gradients' products (over the ring tile's rows)
    NT_S, NT_O = RING // 8, HEAD_DIM // 8
    S_REGS, O_REGS, P_REGS = NT_S * 4, NT_O * 4, PSTEPS * 4
    G1_REGS = O_REGS if WANT_G1 else 4  # dK's or dQ's accumulator (4: unused)
    G2_REGS = O_REGS if WANT_DV else 4  # dV's (4: unused in dk and dQ)
    DCOLS, NT_W, _, HALVES = tc_array_layout(t)
    ATOMS = HEAD_DIM // ATOM
    FIX_ATOM, RING_ATOM = ROWS * 128, RING * 128  # bytes of a 64-column atom of a tile
    FIX_BYTES, RING_BYTES = ATOMS * FIX_ATOM, ATOMS * RING_ATOM
    WG_ROWS = 64 * 128  # bytes of a consumer's 64 rows within a fixed atom
    STAT_BYTES = 4 * RING  # one stage's lse (or delta) rows (dK/dV)
    RING_TX = 2 * RING_BYTES + (2 * STAT_BYTES if KEYS_ARE_ROWS else 0)  # bytes landing on full[s]
    STATS_AT, BARS_AT, _ = smem_layout(t)  # byte offsets: the stats stages, the barriers
    # each step's gradient products behind the next step's Sᵀ and dPᵀ (``pipelined_step``; ``pipelined`` chose
    # the tiles whose registers allow it)
    PIPE = t.pipelined
    HOLD = t.hold  # P, then dS, kept before the waits that follow them (``hold``)
    # the pipelined step's waits: its groups are Sᵀ, dPᵀ (not in dv), then the previous step's dV (dkdv,
    # dv) and dK or dQ (not in dv); Sᵀ has landed when at most the others are in flight
    N_GRADS = int(WANT_DV) + int(WANT_G1)
    WAIT_DP = N_GRADS
    WAIT_S = N_GRADS + int(WANT_G1)
    WAIT_S_FIRST = int(WANT_G1)  # the walk's first step: no products before it
    SECTIONED = t.l2_sections
    # the maps of the fixed and the ring tiles
    FIX1, FIX2, RING1, RING2 = (K_MAP, V_MAP, Q_MAP, DO_MAP) if KEYS_ARE_ROWS else (Q_MAP, DO_MAP, K_MAP, V_MAP)
    kind = "f16" if dtype == "float16" else "bf16"
    BF16 = dtype == "bfloat16"
    issue_t = ss_chain(getattr(ptx, f"wgmma_m64n{RING}k16_{kind}_acc"), KSTEPS, FIX_ATOM, RING_ATOM, True)
    issue_grad = rs_chain(getattr(ptx, f"wgmma_m64n{HEAD_DIM}k16_{kind}_rs_bmn_acc"), PSTEPS, RING_ATOM)

    @device_function
    def stats_word(s):
        """The index in ``s_rows`` (floats) of stage ``s``'s lse rows (its delta rows follow,
        ``RING`` on).  PERSIST: through uint32, so that LLVM sees it non-negative (the ring's
        position carried across blocks hides that ``s`` is) and pairs the lse and delta loads
        as ``ld.shared.v2`` (else each pair is two loads behind a negative index's wraparound);
        not otherwise, where ptxas then spent 30 more LOP3 a step (d = 128)."""
        if PERSIST:
            return (STATS_AT + uint32(s) * 2 * STAT_BYTES) // 4
        return (STATS_AT + s * 2 * STAT_BYTES) // 4

    @device_function
    def skipped(start, mi):
        """PERSIST: whether the block at ``start`` (``block_walk``) lies past its varlen sequence, so
        that the producer and the consumers skip it alike (one block a tile: never)."""
        return PERSIST and start >= (mi[1] if KEYS_ARE_ROWS else mi[0])

    @device_function
    def fixed_buffer(done):
        """The buffer of the fixed tiles of a role's ``done``-th block (PERSIST: two, alternating,
        ``FIXED · FIX_BYTES`` apart; else 0)."""
        if PERSIST:
            return done & 1
        return 0

    @device_function
    def stage_tiles(fix1, s):
        """The shared-memory addresses of stage ``s``'s two ring tiles (Q and dO in dK/dV, K and V
        in dQ): the ring's first tiles follow the fixed ones, its second tiles the first."""
        ring1 = fix1 + NFIX * FIXED * FIX_BYTES
        return ring1 + s * RING_BYTES, ring1 + (STAGES + s) * RING_BYTES

    @device_function
    def issue_sdp(acc_s, acc_dp, a1, a2, fix1, pos):
        """Once walk position ``pos``'s ring tiles are in (``full``), issue its Sᵀ = K·Q_iᵀ (or
        S = Q·K_jᵀ) and dPᵀ = V·dO_iᵀ (or dP = dO·V_jᵀ), a commit group each, with this
        consumer's fixed rows at ``a1``, ``a2`` (the pipelined step's: ``PIPE``)."""
        s = pos % STAGES
        b1, b2 = stage_tiles(fix1, s)
        wait_phase(fix1 + BARS_AT + FULL + 8 * s, (pos // STAGES) & 1)
        ptx.wgmma_fence()  # the accumulators were written by ordinary instructions
        issue_t(acc_s, a1, b1)
        if WANT_G1:
            issue_t(acc_dp, a2, b2)

    @device_function
    def pack_p_ds(p_frag, ds_frag, acc_s, acc_dp):
        """P(ᵀ) and dS(ᵀ) packed as the gradients' A fragments: the ring tile's rows 16ps … are
        their k-slice ps."""
        for ps in range(PSTEPS):
            if WANT_DV:
                fragments.pack_a(p_frag, ps * 4, acc_s, ps * 8, BF16)
            if WANT_G1:
                fragments.pack_a(ds_frag, ps * 4, acc_dp, ps * 8, BF16)

    @device_function
    def issue_grads(acc_g1, acc_g2, p_frag, ds_frag, b1, b2):
        """dV += Pᵀ·dO_i and dK += dSᵀ·Q_i (or dQ += dS·K_j), a commit group each, B the stage's
        ring tiles at ``b2``, ``b1``."""
        if WANT_DV:
            issue_grad(acc_g2, p_frag, b2)
        if WANT_G1:
            issue_grad(acc_g1, ds_frag, b1)

    @device_function
    def p_part(acc_s, s_rows, row_stats, other, s, start, row0, si, mi, partial):
        """``fragments.p_first`` of the step at stage ``s`` (ring tile from row ``other``): P(ᵀ)
        in place of S(ᵀ), from S alone."""
        if KEYS_ARE_ROWS:
            at = stats_word(s)
            fragments.p_first(acc_s, NT_S, other, BLOCK_M, start, BLOCK_N, row0, other, si, mi, s_rows, at, True,
                              partial, F)  # fmt: skip
        else:
            fragments.p_first(acc_s, NT_S, start, BLOCK_M, other, BLOCK_N, row0, other, si, mi, row_stats, 0, False,
                              partial, F)  # fmt: skip

    @device_function
    def ds_part(acc_s, acc_dp, s_rows, row_stats, other, s, start, row0, si, di, mi, partial):
        """``fragments.ds_then`` of the same step: dS(ᵀ) in place of dP(ᵀ)."""
        if KEYS_ARE_ROWS:
            at = stats_word(s)
            fragments.ds_then(acc_s, acc_dp, NT_S, other, BLOCK_M, start, BLOCK_N, row0, other, si, mi, s_rows, at,
                              at + RING, True, di, partial, F)  # fmt: skip
        else:
            fragments.ds_then(acc_s, acc_dp, NT_S, start, BLOCK_M, other, BLOCK_N, row0, other, si, mi, row_stats, 0,
                              2, False, di, partial, F)  # fmt: skip

    @device_function
    def pipelined_step(acc_s, acc_dp, acc_g1, acc_g2, p_frag, ds_frag, s_rows, row_stats, fix1, a1, a2, vr, it, pos,
                       start, row0, si, di, mi):  # fmt: skip
        """Walk position ``pos`` (the walk's step ``it``, not its first) pipelined (``PIPE``):
        issue its Sᵀ and dPᵀ, then the previous step's gradient products (their packed P and dS
        in the fragments) behind them; P once Sᵀ landed, while the rest run; dS once dPᵀ
        landed; then, the products done, release the previous step's stage and pack this
        step's P and dS.  Nothing is in flight when it returns (ptxas serializes every wgmma
        of a kernel where wgmma in flight cross a branch or a loop's back edge)."""
        s, sp = pos % STAGES, (pos - 1) % STAGES
        other = tile_at(it, vr, F) * RING
        partial = tile_partial(it, vr, F)
        issue_sdp(acc_s, acc_dp, a1, a2, fix1, pos)  # (its wgmma.fence also covers the packed fragments)
        b1, b2 = stage_tiles(fix1, sp)
        issue_grads(acc_g1, acc_g2, p_frag, ds_frag, b1, b2)
        ptx.wgmma_wait_group(WAIT_S)  # Sᵀ landed: dPᵀ and the previous step's products may still run
        p_part(acc_s, s_rows, row_stats, other, s, start, row0, si, mi, partial)
        if HOLD:  # P under dPᵀ and the products
            hold_tile(acc_s, S_REGS)
            hold_before_wait(acc_s[0])
        ptx.wgmma_wait_group(WAIT_DP)  # dPᵀ landed
        ds_part(acc_s, acc_dp, s_rows, row_stats, other, s, start, row0, si, di, mi, partial)
        if HOLD:  # dS under the products
            hold_tile(acc_dp, S_REGS)
            hold_before_wait(acc_s[0])
        ptx.wgmma_wait_group(0)  # the previous step's products are done with its stage and the fragments
        ptx.mbarrier_arrive(fix1 + BARS_AT + EMPTY + 8 * sp)
        pack_p_ds(p_frag, ds_frag, acc_s, acc_dp)

    @device_function
    def first_step(acc_s, acc_dp, p_frag, ds_frag, s_rows, row_stats, fix1, a1, a2, vr, it, pos, start, row0, si, di,
                   mi):  # fmt: skip
        """The walk's first step pipelined: :func:`pipelined_step` with no products before it."""
        s = pos % STAGES
        other = tile_at(it, vr, F) * RING
        partial = tile_partial(it, vr, F)
        issue_sdp(acc_s, acc_dp, a1, a2, fix1, pos)
        ptx.wgmma_wait_group(WAIT_S_FIRST)  # Sᵀ landed: dPᵀ may still run
        p_part(acc_s, s_rows, row_stats, other, s, start, row0, si, mi, partial)
        if HOLD:  # P under dPᵀ
            hold_tile(acc_s, S_REGS)
            hold_before_wait(acc_s[0])
        ptx.wgmma_wait_group(0)
        ds_part(acc_s, acc_dp, s_rows, row_stats, other, s, start, row0, si, di, mi, partial)
        pack_p_ds(p_frag, ds_frag, acc_s, acc_dp)

    @device_function
    def block_walk(q, k, params, cu_q, cu_k, fx, item, gx, gy, gz):
        """``(start, b, h0, hk, q0, k0, mi, seq, lo, hi, group)``: ``block_info.this_block``
        of this block (``start`` its first row: a key in dK/dV, a query in dQ; ``h0`` the
        group's first query head in dK/dV), the ring tiles ``[lo, hi)`` it visits, and the
        query heads it walks them for (``group``: GQA's in dK/dV, 1 in dQ).  ``PERSIST``: of
        block ``item`` of the virtual grid (gx, gy, gz) instead (``block_info.linear_coords``)."""
        if PERSIST:  # one L2 section (``t.l2_sections``)
            x, y, z = linear_coords(item, gx, gy)
            tt, hh, sq = grid_coords(x, y, z, gx, gy, gz, 0, fx, KEYS_ARE_ROWS, F)
        else:
            section = section_of(params, KEYS_ARE_ROWS, F) if SECTIONED else 0
            tt, hh, sq = grid_coords(cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.gridDim.x,
                                     cuda.gridDim.y, cuda.gridDim.z, section, fx, KEYS_ARE_ROWS, F)  # fmt: skip
        start, b, h0, hk, q0, k0, mi, seq = block_at(tt, hh, sq, q, k, params, cu_q, cu_k, fx, ROWS, F, KEYS_ARE_ROWS)
        if KEYS_ARE_ROWS:
            lo, hi = query_tiles(start, BLOCK_M, BLOCK_N, mi)
            if start >= mi[1]:  # varlen: a block past its sequence's keys walks nothing
                hi = lo
            return start, b, h0, hk, q0, k0, mi, seq, lo, hi, group_size(params, F)
        lo, hi = key_tiles(start, BLOCK_M, BLOCK_N, mi)
        if start >= mi[0]:  # … past its queries
            hi = lo
        return start, b, h0, hk, q0, k0, mi, seq, lo, hi, 1

    @device_function
    def head_walk(fx, seq, h, start, lo, hi):
        """The walk list ``vr`` of head ``h`` (a block mask's, or the range) and its steps."""
        vr = read_walk_list(fx, seq, h, start // ROWS, KEYS_ARE_ROWS, F)  # the roles walk apart: not staged
        p_lo, p_hi = walk_range(lo, hi, vr, F)
        return vr, p_lo, p_hi

    @device_function
    def consume_block(q, k, stats, g1, g2, softmax_scale, params, alibi, cu_q, cu_k, fx, fix1, fixed_full, s_rows,
                      acc_s, acc_dp, acc_g1, acc_g2, p_frag, ds_frag, row_stats, cw, warp, lane, item, gx, gy, gz,
                      pos, done):  # fmt: skip
        """A consumer's part of one block (block ``item`` of the virtual grid when PERSIST): its walk
        from ring position ``pos`` and, PERSIST, its K and V in buffer ``done`` mod 2, then the
        epilogue; returns ``(pos, done)`` after it.  A function, so that the kernel calls it once
        without a loop when not PERSIST: a one-trip loop around the walk made ptxas recompute the
        fixed tiles' wgmma descriptors every step (the d = 128 causal dK/dV step 719 → 769
        instructions)."""
        start, b, h0, hk, q0, k0, mi, seq, lo, hi, group = block_walk(q, k, params, cu_q, cu_k, fx, item, gx, gy,
                                                                      gz)  # fmt: skip
        if skipped(start, mi):
            return pos, done
        u = fixed_buffer(done)
        row0 = start + 64 * cw + 16 * warp  # the warp's first row (key or query)
        a1 = fix1 + u * (FIXED * FIX_BYTES) + cw * WG_ROWS  # this consumer's rows of the fixed tiles
        a2 = a1 + FIX_BYTES
        pipeline.zero(acc_g1, G1_REGS)
        pipeline.zero(acc_g2, G2_REGS)
        if not WANT_G1:  # dv: no dPᵀ; p_and_ds's dS of these zeros is never read
            pipeline.zero(acc_dp, S_REGS)
        wait_phase(fixed_full + u * FIX_FULL1, (done >> 1) & 1)
        for hq in range(group):
            h = h0 + hq
            vr, p_lo, p_hi = head_walk(fx, seq, h, start, lo, hi)
            si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, score.backward_domain(F), F)
            if not KEYS_ARE_ROWS and start < mi[0]:  # the padded stats hold every row of the block
                s_row0 = stats_row0(cu_q, seq) if F[VARLEN] else 0
                for r in range(2):
                    row = s_row0 + row0 + (lane >> 2) + 8 * r
                    row_stats[r], row_stats[2 + r] = stats[b, h, 0, row], stats[b, h, 1, row]
            if PIPE:  # each step's gradient products issued behind the next step's Sᵀ and dPᵀ
                if p_lo < p_hi:
                    first_step(acc_s, acc_dp, p_frag, ds_frag, s_rows, row_stats, fix1, a1, a2, vr, p_lo, pos, start,
                               row0, si, di, mi)  # fmt: skip
                    for it in range(p_lo + 1, p_hi):
                        pos += 1
                        pipelined_step(acc_s, acc_dp, acc_g1, acc_g2, p_frag, ds_frag, s_rows, row_stats, fix1, a1, a2,
                                       vr, it, pos, start, row0, si, di, mi)  # fmt: skip
                    s = pos % STAGES  # the last step's products, alone
                    ptx.wgmma_fence()  # the fragments were written by ordinary instructions
                    b1, b2 = stage_tiles(fix1, s)
                    issue_grads(acc_g1, acc_g2, p_frag, ds_frag, b1, b2)
                    ptx.wgmma_wait_group(0)
                    ptx.mbarrier_arrive(fixed_full + EMPTY + 8 * s)  # this thread is done with the stage
                    pos += 1
                continue
            for i in range(p_lo, p_hi):
                s = pos % STAGES
                other = tile_at(i, vr, F) * RING
                b1, b2 = stage_tiles(fix1, s)
                wait_phase(fixed_full + FULL + 8 * s, (pos // STAGES) & 1)
                ptx.wgmma_fence()  # the accumulators were written by ordinary instructions
                issue_t(acc_s, a1, b1)  # Sᵀ = K·Q_iᵀ, or S = Q·K_jᵀ
                if WANT_G1:
                    issue_t(acc_dp, a2, b2)  # dPᵀ = V·dO_iᵀ, or dP = dO·V_jᵀ
                ptx.wgmma_wait_group(0)
                # P(ᵀ) and dS(ᵀ): element e of n-tile nt is (row g + 8·(e >> 1), column nt·8 + 2·tq + (e & 1))
                if KEYS_ARE_ROWS:
                    at = stats_word(s)
                    fragments.p_and_ds(acc_s, acc_dp, NT_S, other, BLOCK_M, start, BLOCK_N, row0, other, si, mi,
                                       s_rows, at, at + RING, True, di, tile_partial(i, vr, F), F)  # fmt: skip
                else:
                    fragments.p_and_ds(acc_s, acc_dp, NT_S, start, BLOCK_M, other, BLOCK_N, row0, other, si, mi,
                                       row_stats, 0, 2, False, di, tile_partial(i, vr, F), F)  # fmt: skip
                pack_p_ds(p_frag, ds_frag, acc_s, acc_dp)
                ptx.wgmma_fence()  # the fragments were written by ordinary instructions
                issue_grads(acc_g1, acc_g2, p_frag, ds_frag, b1, b2)
                ptx.wgmma_wait_group(0)
                ptx.mbarrier_arrive(fixed_full + EMPTY + 8 * s)  # this thread is done with the stage
                pos += 1
        if PERSIST:  # every wgmma reading this buffer's K and V has completed (wait_group(0))
            ptx.mbarrier_arrive(fixed_full + FIX_EMPTY + 8 * u)

        # epilogue: dK or dQ (times the softmax scale) and dV as 16-bit pairs, written once
        scale = float32(softmax_scale)
        tq = lane & 3
        for r in range(2):
            row = row0 + (lane >> 2) + 8 * r
            if KEYS_ARE_ROWS:
                if row < mi[1]:
                    if WANT_G1:
                        fragments.store_row_pairs(g1, b, k0 + row, hk, acc_g1, 2 * r, NT_W, tq, scale, BF16, DCOLS,
                                                  HALVES)  # fmt: skip
                    if WANT_DV:
                        fragments.store_row_pairs(g2, b, k0 + row, hk, acc_g2, 2 * r, NT_W, tq, float32(1.0), BF16,
                                                  DCOLS, HALVES)  # fmt: skip
            elif row < mi[0]:
                fragments.store_row_pairs(g1, b, q0 + row, h0, acc_g1, 2 * r, NT_W, tq, scale, BF16, DCOLS, HALVES)

        return pos, done + 1

    def wgmma_bwd(q, k, v, dout, stats, g1, g2, softmax_scale, params, alibi, cu_q, cu_k, fx, tmaps):
        tid = cuda.threadIdx.x
        wg = tid // 128

        smem = cuda.shared.array(0, uint8, alignment=_ALIGN)
        s_rows = cuda.shared.array(0, float32, alignment=_ALIGN)  # the same memory: the stats stages as floats
        fix1 = ptx.smem_addr(smem, 0)  # the fixed tiles (persistent: buffer 0's), and the base of the rest
        fixed_full = fix1 + BARS_AT  # then full[s] at + FULL + 8s, empty[s] at + EMPTY + 8s
        if tid == 0:
            ptx.mbarrier_init(fixed_full, 1)
            ptx.mbarrier_init(fixed_full + LAND, 1)
            for s in range(STAGES):
                ptx.mbarrier_init(fixed_full + FULL + 8 * s, 1)
                ptx.mbarrier_init(fixed_full + EMPTY + 8 * s, 128 * CONSUMERS)
            if PERSIST:  # the second fixed buffer's full barrier, both buffers' empty ones
                ptx.mbarrier_init(fixed_full + FIX_FULL1, 1)
                for u in range(2):
                    ptx.mbarrier_init(fixed_full + FIX_EMPTY + 8 * u, 128 * CONSUMERS)
            ptx.fence_proxy_async()  # the initialised barriers, before TMA completes on them
        cuda.syncthreads()  # the barriers are initialised before anyone waits or arrives on them

        # persistent: the virtual grid (``spec.key_grid``'s, from the arrays), this block running its
        # blocks blockIdx.x, blockIdx.x + gridDim.x, … (the order a full grid's start in); else one trip
        if PERSIST:
            n_tiles, n_seq = query_grid_dims(k, cu_k, ROWS, F)  # the key tiles of the longest sequence
            gx, gy, gz = (k.shape[2], n_seq, n_tiles) if F[HEAVIEST_FIRST] else (n_tiles, k.shape[2], n_seq)
            items_start, items_end, items_step = cuda.blockIdx.x, gx * gy * gz, cuda.gridDim.x
        else:
            gx, gy, gz = 1, 1, 1
            items_start, items_end, items_step = 0, 1, 1

        # each role finds its block after the split: nothing is live across it
        if wg == 0:  # the producer: warp 0 (its lane 0 issues the copies; the warp zeroes varlen's tails)
            ptx.setmaxnreg_dec(PRODUCER_REGS)
            if tid < 32:
                lead = tid == 0
                pos = 0  # the ring's position over the block's whole walk: stage pos mod 2, fill pos // 2
                zeroed = 0  # the tiles zeroed past their sequence (land's phases)
                done = 0  # the blocks of the virtual grid this one ran (persistent)
                for item in range(items_start, items_end, items_step):
                    walk = block_walk(q, k, params, cu_q, cu_k, fx, item, gx, gy, gz)
                    start, b, h0, hk, q0, k0, mi, seq, lo, hi, group = walk
                    if skipped(start, mi):
                        continue
                    u = fixed_buffer(done)
                    fk1 = fix1 + u * (FIXED * FIX_BYTES)
                    fk2 = fk1 + FIX_BYTES  # (dv: not there, never read)
                    if PERSIST and done >= 2:  # the buffer's last block's consumers released it
                        wait_phase(fixed_full + FIX_EMPTY + 8 * u, ((done >> 1) - 1) & 1)
                    fix_row, fix_h, ring_h = (k0 + start, hk, hk) if KEYS_ARE_ROWS else (q0 + start, h0, hk)
                    # the walked rows: queries in dK/dV, keys in dQ (their sequence's length, first row, the
                    # array's rows)
                    seqlen, ring0, total = (mi[0], q0, q.shape[1]) if KEYS_ARE_ROWS else (mi[1], k0, k.shape[1])
                    s_row0 = stats_row0(cu_q, seq) if F[VARLEN] else 0  # the sequence's first row of stats
                    fix_bar = fixed_full + u * FIX_FULL1
                    if lead:
                        ptx.mbarrier_arrive_expect_tx(fix_bar, FIXED * FIX_BYTES)
                        load_rows(fk1, tmaps[FIX1], fix_row, fix_h, b, fix_bar, ATOMS, FIX_ATOM)
                        if WANT_G1:
                            load_rows(fk2, tmaps[FIX2], fix_row, fix_h, b, fix_bar, ATOMS, FIX_ATOM)
                    for hq in range(group):
                        h = h0 + hq
                        if KEYS_ARE_ROWS:
                            ring_h = h
                        vr, p_lo, p_hi = head_walk(fx, seq, h, start, lo, hi)
                        for i in range(p_lo, p_hi):
                            s = pos % STAGES
                            other = tile_at(i, vr, F) * RING  # the ring tile's first row
                            full = fixed_full + FULL + 8 * s
                            if pos >= STAGES:  # both consumers released this stage's last fill
                                wait_phase(fixed_full + EMPTY + 8 * s, ((pos // STAGES) - 1) & 1)
                            # varlen: rows past the sequence (the next one's) are zeroed after they land
                            # (masked P and dS are 0, and 0 · inf is NaN); the copies land on ``land`` first
                            first = past_rows(other, RING, seqlen, ring0, total, F)
                            bar = full if first == RING else fixed_full + LAND
                            b1, b2 = stage_tiles(fix1, s)
                            if lead:
                                ptx.mbarrier_arrive_expect_tx(bar, RING_TX)
                                load_rows(b1, tmaps[RING1], ring0 + other, ring_h, b, bar, ATOMS, RING_ATOM)
                                load_rows(b2, tmaps[RING2], ring0 + other, ring_h, b, bar, ATOMS, RING_ATOM)
                                if KEYS_ARE_ROWS:  # the tile's lse and delta rows (stats is padded: whole copies)
                                    at = fix1 + STATS_AT + s * 2 * STAT_BYTES
                                    ptx.cp_async_bulk_g2s(at, stats, (b, h, 0, s_row0 + other), STAT_BYTES, bar)
                                    ptx.cp_async_bulk_g2s(at + STAT_BYTES, stats, (b, h, 1, s_row0 + other), STAT_BYTES,
                                                          bar)  # fmt: skip
                            if first < RING:
                                land_and_zero((b1, b2), first, bar, zeroed & 1, full, tid, RING, ATOMS,
                                              RING_ATOM)  # fmt: skip
                                zeroed += 1
                            pos += 1
                    done += 1
            return

        ptx.setmaxnreg_inc(CONSUMER_REGS)
        cw = wg - 1  # this consumer's 64 rows of the block
        wtid = tid - 128 * wg
        warp, lane = wtid // 32, wtid % 32

        acc_s = cuda.local.array(S_REGS, float32)
        acc_dp = cuda.local.array(S_REGS, float32)
        acc_g1 = cuda.local.array(G1_REGS, float32)  # dK, or dQ
        acc_g2 = cuda.local.array(G2_REGS, float32)  # dV
        p_frag = cuda.local.array(P_REGS, uint32)  # P(ᵀ) and dS(ᵀ) packed, one A fragment a k-slice
        ds_frag = cuda.local.array(P_REGS, uint32)
        row_stats = cuda.local.array(4, float32)  # dQ: lse of rows g, g + 8, then their delta
        pos = 0
        done = 0  # the blocks of the virtual grid this one ran (persistent)
        if PERSIST:
            for item in range(items_start, items_end, items_step):
                pos, done = consume_block(q, k, stats, g1, g2, softmax_scale, params, alibi, cu_q, cu_k, fx, fix1,
                                          fixed_full, s_rows, acc_s, acc_dp, acc_g1, acc_g2, p_frag, ds_frag,
                                          row_stats, cw, warp, lane, item, gx, gy, gz, pos, done)  # fmt: skip
        else:
            consume_block(q, k, stats, g1, g2, softmax_scale, params, alibi, cu_q, cu_k, fx, fix1, fixed_full, s_rows,
                          acc_s, acc_dp, acc_g1, acc_g2, p_frag, ds_frag, row_stats, cw, warp, lane, 0, 1, 1, 1, pos,
                          done)  # fmt: skip

    # the kernel's name in the PTX, ncu and the sanitizers: its launch's (``traffic.measure`` picks kernels by it)
    wgmma_bwd.__name__ = NAMES[t.part]
    wgmma_bwd.__qualname__ = f"wgmma_bwd_kernel.<locals>.{wgmma_bwd.__name__}"
    return kernel(launch_bounds=(THREADS, 1), whole_program=True)(wgmma_bwd)


def smem_layout(t: WgmmaBwdTiles) -> tuple:
    """Byte offsets in the dynamic shared memory ``(stats, barriers, total)``: the two fixed
    tiles (one in dv; persistent: two buffers of them) and ``t.stages`` stages of the two ring
    tiles (2 bytes an element) from 0, dK/dV's stages of lse and delta rows, then the
    mbarriers."""
    fixed = (1 if t.part == "dv" else 2) * (2 if t.persistent else 1)  # persistent: two buffers of them
    stats_at = 2 * t.head_dim * (fixed * ROWS + 2 * t.stages * t.ring)
    bars_at = stats_at + (2 * t.stages * 4 * t.ring if t.keys_are_rows else 0)
    return stats_at, bars_at, bars_at + barrier_layout(t.stages, t.persistent)[5]


def smem_bytes(t: WgmmaBwdTiles) -> int:
    """Dynamic shared bytes (``smem_layout``): 128 KiB at d = 128 (the pipelined dQ kernel's
    three stages 160 KiB), 96 KiB at d = 64 (dQ's three stages 128 KiB), 192 KiB at d = 256."""
    return smem_layout(t)[2]


#: What each kernel reads and writes (``KernelLaunch.io``), by part.
_IO = {"dkdv": (("q", "r"), ("k", "r"), ("v", "r"), ("dout", "r"), ("stats", "r"), ("dk", "w"), ("dv", "w")),
       "dv": (("q", "r"), ("k", "r"), ("dout", "r"), ("stats", "r"), ("dv", "w")),
       "dk": (("q", "r"), ("k", "r"), ("v", "r"), ("dout", "r"), ("stats", "r"), ("dk", "w")),
       "dq": (("q", "r"), ("k", "r"), ("v", "r"), ("dout", "r"), ("stats", "r"), ("dq", "w"))}  # fmt: skip

def launches(variant: Variant, dtype: str, sz: spec.Sizes, head_dim: int) -> list:
    """``tc_backward``'s preprocess writing ``stats`` (lse and delta, padded), the dK/dV
    kernel (a block per 128 keys of a KV head; at d = 256 two: dV, then dK), the dQ
    kernel (a block per 128 queries of a query head); the last argument of each the
    tensor maps (``spec.Arg("tmaps")``)."""
    from numba_flash.kernels import tc_backward

    short = (head_dim <= PERSISTENT_MAX_DIM and sz.seqlen_q <= PERSISTENT_MAX_ROWS
             and replace(variant, causal=False, nonpositive_scale=False) == Variant())  # fmt: skip
    ts = tiles(head_dim, short)
    out = []
    for t in ts:
        if t.keys_are_rows:
            grid, outs = spec.key_grid(sz, ROWS, variant.heaviest_first), ("dk", "dv")
            if t.persistent:  # the virtual grid's blocks, blockIdx.x + gridDim.x, … in a block an SM
                grid = (persistent_blocks(grid[0] * grid[1] * grid[2]), 1, 1)
        else:
            grid, outs = spec.query_grid(sz, ROWS, variant.heaviest_first), ("dq", "dq")
        args = (tuple(spec.Arg(r, "u16") for r in ("q", "k", "v", "dout")) + (spec.Arg("stats"),) +
                tuple(spec.Arg(g, "u32") for g in outs) + (spec.Arg("scale"),) + spec.VARIANT_ARGS +
                (spec.Arg("tmaps"),))  # fmt: skip
        kern = wgmma_bwd_kernel(t, variant, dtype)
        out.append(spec.KernelLaunch(NAMES[t.part], kern, t, grid, THREADS, smem_bytes(t), args,
                                     (t.block_m, t.block_n, t.keys_are_rows), _IO[t.part]))  # fmt: skip
    return [tc_backward.stats_launch(ts[0], dtype, sz, variant.varlen)] + out


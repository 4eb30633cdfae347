"""Hopper (sm_90a) FlashAttention forward for fp16 and bf16: TMA, mbarriers, wgmma and
warp specialization (issue #13).

Runs by default on sm_90a (``plan.wgmma_forward``; ``NUMBA_FLASH_WGMMA=0`` turns it off).

Math: as ``tc_forward`` (log2 domain, online softmax, O = acc / l, lse), except that S
stays raw and the exponent is ``ex2(s·c − m·c)`` with ``c = scale·log2 e``, one FFMA an
element (``softmax.raw_scores``; scaled scores with a scale ≤ 0, and with ALiBi off the
tensor cores), with the two products on the warpgroups' tensor cores::

    S   = Q·K_jᵀ    wgmma m64nNk16 (N = BLOCK_N, 128 keys; 64 past d = 128: ``key_tile``),
                    A = Q and B = K_j from shared memory (K-major,
                    128-byte swizzle), d/16 of them chained; with causal ALiBi
                    (``alibi_on_products``) after one more: its bias's column term
                    v·(j − start_n), v = slope / scale, A = v's three 16-bit parts
                    from registers, B = a constant key ramp (``fragments.bias_fragment``,
                    ``stage_key_ramp``); the row term goes into the running max
    acc += P·V_j    wgmma m64n{d}k16, A = P from registers (S's accumulators packed to
                    16-bit pairs: mma.sync's A layout, ``fragments.pack_a``), B = V_j
                    from shared memory as it lies in HBM (MN-major, imm-trans-b)

Grid and threads: grid = (ceil(Nq / BLOCK_M), H, B) (``spec.query_grid``), a producer
warpgroup and ``consumers(d)`` consumer warpgroups of 128 threads a block (three at
d = 64: BLOCK_M = 192; two at d = 128: BLOCK_M = 128; FlashAttention-3's warp
specialization and tile sizes; past d = 128 two, on 64-key tiles):

* warpgroup 0, the producer, gives its registers back (``setmaxnreg`` 24, 32 with three
  consumers) and one
  thread of it issues every copy: Q once, then K_j and V_j into a two-stage ring, by
  TMA (``tma.attention_maps``: boxes of 64 columns, the 128-byte swizzle), each stage
  filling after its consumers released it;
* warpgroups 1, 2 (, 3), the consumers (``setmaxnreg`` 240, 160 with three), own query
  rows 0–63, 64–127 (, 128–191) of the block.  Warp w of a consumer owns 16 rows: a wgmma m64nN accumulator
  holds, per thread, exactly an m16n8 accumulator's values for N/8 n-tiles of its
  warp's rows, so the score step, the online softmax and dropout are ``tc_forward``'s
  (``fragments``, ``softmax``) on one m-tile a warp; the epilogue goes through shared
  memory (below).
* within a consumer (FlashAttention-3's intra-warpgroup overlap): tile i's S is
  issued together with tile i − 1's P·V, and tile i's softmax runs while that P·V is
  on the tensor cores (``softmax.softmax_row_step``; ptxas hoists the wait for that
  P·V above the softmax unless a block boundary holds it there: ``hold_exponentials``,
  off: slower when timed); acc is rescaled by tile i's alpha (``softmax.rescale_row``) once
  the P·V completed (with ``hold_exponentials`` 3, while tile i + 1's S runs, before
  tile i's P·V is issued).  The first tile is peeled
  so that no wgmma in flight crosses a divergent branch (ptxas would serialize them).
  Between the two consumers, the scheduler interleaves one's softmax with the other's
  wgmma by itself (a named-barrier ping-pong measured slower: removed, below).

Assembly: the driver's JIT assembles the PTX as a whole program
(``_numba_cuda.whole_program_dispatcher``).  numba-cuda's linker assembles a
relocatable unit, in which ptxas ignores ``setmaxnreg`` (the consumers keep 168
registers: at d = 128 the overlap spills) and serializes every wgmma.

Synchronisation, per stage s of the ring (position i of the block's walk, over all its
tiles: s = i mod 2, its fill i // 2; a phase's parity is the fill's):
    k_full[s], v_full[s]   the producer's arrive.expect_tx + the TMA bytes: the tile landed
    k_empty[s], v_empty[s] 128·consumers arrivals after the wait_group that retires their
                           wgmma on the tile: the producer may overwrite it
and per tile t of the block (parity t mod 2):
    q_full                 Q landed
    q_empty                128·consumers arrivals after the tile's last S (d = 256: after its
                           epilogue, ``o_in_q``): Q may be overwritten
    tile slots             the dynamic scheduler's (``dynamic_tiles``): slot t mod 2 holds the
                           block's t-th tile (or n_tiles: the end) and its (row tile, head,
                           batch), four int32 written by the producer before its arrival on
                           q_full, read by the consumers after q_full
    v_land                 varlen: a V tile whose rows past the sequence the producer's warp
                           zeroes once it landed (``hopper.land_and_zero``), then arrives on
                           v_full[s]: a neighbour's inf or NaN never meets P's masked 0
A consumer whose rows lie past the sequence waits each full phase, then arrives on its
empty barrier: an arrival never counts towards the phase before.
No ``syncthreads`` after the roles split (one before it: the barriers are initialised).

Epilogue (FlashAttention-2/3's, through shared memory; ``store_tile``): a consumer warp writes its 16 rows
of O = acc / l, packed to 16-bit pairs, into staging rows of its own with 4-byte shared
stores (``fragments.stage_row_pairs``), syncs the warp, then moves whole rows to HBM, one
16-byte ``st.global.v4`` a lane and consecutive lanes on consecutive chunks of a row: a warp
instruction writes 2 rows at d = 128, 4 at d = 64 (``fragments.store_staged_rows``; stored
straight from the accumulators, it wrote 16 bytes in each of 8 rows: half sectors).  Rows
past the sequence are not written; the lanes t = 0 write lse as before.  The warp syncs
again before its next tile (persistent blocks) stages into the same rows.

Shared memory (one dynamic array, 1024-byte aligned: a swizzled tile's repeat), per
64-column atom of d a block of rows × 128 bytes: Q BLOCK_M·d·2, K and V 2 stages of
128·d·2 each, with causal ALiBi on the tensor cores its key ramp (one atom of 128 rows,
16 KiB), then the eleven 8-byte mbarriers (128 bytes), then the staging rows of O,
16·d·2 bytes a consumer warp (warp w of consumer c at (4c + w)·16·d·2; 16-byte aligned;
row r's 16-byte chunk j at r·d·2 + (j XOR r mod 8)·16: both sides conflict-free).
``smem_bytes``: d = 128, two consumers: 160 KiB + 8 warps × 4 KiB = 192.1 KiB; d = 64,
three consumers: 88 KiB + 12 × 2 KiB = 112.1 KiB (two, causal ≤ 2048 rows: 80 + 16 =
96.1 KiB); d = 192 (64-key tiles): 48 + 96 + 48 KiB = 192.1 KiB; d = 256 (64-key tiles):
Q 64 KiB and the ring 128 KiB leave no room for 64 KiB of staging rows, so a warp stages
its 16 rows of O (8 KiB) in its consumer's 64 rows of Q's atom ``warp`` (``o_in_q``: the
consumer releases Q after its epilogue, with ``fence.proxy.async`` before the producer's
TMA writes the next Q there, and the producer issues a tile's Q after its first K and V,
``Q_LATE``): 192.1 KiB.  At most 224.1 KiB (d = 128 with three consumers, forced) of the
227 KiB a block may have.  Atom a of a tile starts a·rows·128 bytes in; row r of it at r·128,
16-byte chunk c at (c XOR r mod 8)·16 (``_ptx_sim.swizzle_128b``).

Persistent blocks (``blocks``): with more tiles than SMs, one block an SM runs tiles of
the virtual grid (``block_info.linear_coords``, ``grid_coords``: the order a full grid's
blocks would start in), its first blockIdx.x, then the next one a counter in global
memory gives out (``dynamic_tiles``: the producer warp takes it with an atomic add and
passes it to the consumers in a shared-memory slot that q_full's completion publishes;
n_tiles there ends their loop), or with the static order blockIdx.x + gridDim.x, …;
the producer loads a
tile's Q once the consumers released the previous one (``q_empty``, after their last
S) and the ring's position runs on across tiles, so a tile's Q and first K/V land while
the previous tile's last P·V and epilogue run.  Every merge point of the control flow is
reached with no wgmma in flight, and no ordinary instruction writes a wgmma's registers
while one is: ptxas otherwise serializes every wgmma of the kernel, silently (the SASS
then has a ``WARPGROUP.DEPBAR`` after each HGMMA: a version that deferred the wait across
the tile loop's header ran 26% slower, docs/benchmarks/2026-12-03-s19).
With fewer tiles, a block a tile and the loop is compiled away.

varlen: the virtual grid is (tiles of the longest sequence, heads, sequences), from
``cu_seqlens_q`` (``block_info.query_grid_dims``); tiles past their sequence are
skipped by every role.

FlexAttention's mods (``kernels.flex``): a score_mod in the score step (natural units,
``softmax.FOLD``; not raw scores, not ALiBi on the tensor cores), a block mask's visit
list walked by every role, read from global memory (``block_info.read_walk_list``: the
roles walk a tile at different times, so the list is not staged in shared memory by the
whole block), its PARTIAL tiles through the mask_mod; the heaviest rows first
(``fx``'s order).

A KV cache's pages (``flash_attention_with_kvcache``'s prefills; ``F[PAGED]``): queries
packed as varlen, and a K/V tile copied in ``key_box`` rows a TMA box, each inside one
page (``hopper.page_of_box``, ``load_page_boxes``: the producer warp's lanes look up a
tile's pages a tile ahead, boxes past the sequence are not copied), so pages of 8, 16,
48 or 256 rows are read in place; V's rows past the sequence are zeroed as varlen's
(``hopper.past_rows``).

Not yet (issue #13): head dims not a multiple of 8 (TMA needs 16-byte row strides; the
others run on the next of d = 64's, 128's, 192's or 256's tiles: ``hopper.tile_dim``);
FlashAttention-3's 80-key tiles at d = 256 (dropout's keep bits come 32 keys a Philox call);
pages whose rows are not a multiple of 8 (the plan sends those to the mma.sync forward); O's
staged rows stored by TMA (the warps store them with 16-byte ``st.global.v4``).
A KV cache's splits run here since session 29 (each split's part in fp32 from the
accumulators, the merge kernel after; ``plan.wgmma_split``).

Tried, measured no faster (or inexact), and removed in session 37 (figures: docs/hopper.md,
each under its "measured and removed" heading): the consumers' ping-pong, the epilogue under
the next tile's first S, FlashAttention-4's lazy rescaling and emulated ex2 (softcap),
softcap's Q prescaled in shared memory, wgmma descriptors built by 32-bit adds, and other
key tiles (160 / 80 keys where nothing bounds the walk, 64 with three consumers at d = 128).
"""

from __future__ import annotations

import functools
import math
import os

from numba_flash import ptx
from numba_flash._numba_cuda import (SIMULATOR, cuda, device_function, float32, gpu_available, int32, int64,
                                     kernel, uint8, uint32)
from numba_flash.config import TcTiles, tc_array_layout, tc_out_view
from numba_flash.kernels import dropout, fragments, score, softmax, spec
from numba_flash.kernels.hopper import (ATOM, SMEM_LIMIT, hold_before_wait, land_and_zero, load_page_boxes, load_rows,
                                        page_of_box, past_rows, rs_chain, ss_chain, sw128_desc, tile_dim, wait_phase)
from numba_flash.kernels.block_info import (block_at, grid_coords, key_tiles, kv_pages, linear_coords, query_grid_dims,
                                            read_walk_list, section_of, tile_at, tile_needs_mask, tile_partial,
                                            walk_range)
from numba_flash.variant import ALIBI, DROPOUT, HEAVIEST_FIRST, PAGED, SPLIT, Variant

_ALIGN = None if SIMULATOR else 1024  # a module global, so numba sees a literal; the simulator aligns by itself

#: The tiles: consumer warpgroups of 64 query rows each (``consumers``), 128 keys a tile, two stages;
#: 64 keys a tile past d = 128 (``key_tile``: Q, K and V's stages fill shared memory otherwise).
BLOCK_N, WIDE_D_BLOCK_N, STAGES = 128, 64, 2
#: setmaxnreg of (the producer, each consumer) by the consumers a block: 128·24 + 256·240
#: and 128·32 + 384·160 are the 65536 registers of an SM (FlashAttention-3's split).
REGS = {2: (24, 240), 3: (32, 160)}
HEAD_DIMS = (64, 128, 192, 256)  # the head dims this version runs (wgmma n = d for P·V)
BARRIER_BYTES = 128  # q_full, k_full[2], v_full[2], k_empty[2], v_empty[2], q_empty, v_land: 8 bytes each
#: Byte offsets from q_full of each stage-0 barrier (stage s: + 8·s), of q_empty and v_land.
K_FULL, V_FULL, K_EMPTY, V_EMPTY, Q_EMPTY, V_LAND = (8 + 8 * STAGES * j for j in range(6))
#: Byte offset from q_full of the dynamic scheduler's two tile slots (after v_land, within BARRIER_BYTES): 16
#: bytes each, the tile and its (row tile, head, batch) as int32 (``tile_coords``).
TILE_SLOT, SLOT_BYTES = V_LAND + 8, 16
assert TILE_SLOT % 16 == 0 and TILE_SLOT + 2 * SLOT_BYTES <= BARRIER_BYTES
#: A traced tile's record (``trace_tiles``): int32 words 0–7 the first consumer's SM clock at its
#: steps, then the key tiles walked and the tile, the producer's clock at three points, the global
#: timer at the consumer's first and last step, and one word unused.
TRACE_WORDS, T_STEPS, T_PRODUCER, T_GLOBAL = 16, 8, 10, 13


def consumers(head_dim: int, causal: bool = False, seqlen_q: int = 4096, block_mask: bool = False,
              window: bool = False) -> int:
    """Consumer warpgroups a block (64 query rows each), chosen by what the H200
    measured (docs/benchmarks/2026-12-02-s12, queued calls against FlashAttention-2):

    * d = 128: two (128 rows; O alone is 64 registers a thread), as FlashAttention-3;
    * d = 64: three (192 rows), FlashAttention-3's tile: the consumers' accumulators
      (S 64, O 32, P 32 registers) fit in 160 registers and a block's fixed costs (its
      Q, the ring's fill, the epilogue) are spread over 1.5× the rows — 1.24–1.34× FA2
      at (4, 32, 4096, 64) against 1.12–1.18× with two;
    * except causal at d = 64 with at most 2048 query rows: two, persistent (``blocks``).
      At (16, 32, 1024, 64) causal the 192-row tiles leave a third of the last tile of
      each head idle and unequal tiles unbalanced: 0.91–0.93× FA2 with three, 1.04–1.08×
      with two.  (Measured at 1024 and 4096 rows; 2048 is the guess between.)

    * with a block mask (``block_mask``) two: 128-row query tiles lie on FlexAttention's
      128-blocks, where 192-row tiles straddle two block rows, visit the union of their
      key tiles and evaluate the mask in the straddled ones (session 21, call 3: a 50%
      random pattern at (1, 8, 16384, 64) ran its forward 2.05× slower than dense).
    * with a sliding window (``window``: a finite left or right side) two: a 128-row tile's
      band crosses fewer key tiles a row than a 192-row tile's (window (1024, 0): 9 tiles
      of 128 keys a 128-row tile, 10–11 a 192-row one), and with softcap three consumers
      spill (276 bytes at d = 64 causal).  Session 29 (H100, one process, in turn:
      docs/benchmarks/2026-12-06-s29): 1.08–1.25× the forward's speed with three at
      (4, 32, 4096, 64) windows (256, 0), (1024, 0), (512, 512), 1.09× at (1, 32, 16384, 64)
      (1024, 0), 1.18× with softcap 30 and (1024, 0); plain causal there 1.002×.

    ``NUMBA_FLASH_WGMMA_CONSUMERS=2`` (or 3) sets it (the benchmark's comparison,
    ``scripts/bench_wgmma.py``)."""
    forced = os.environ.get("NUMBA_FLASH_WGMMA_CONSUMERS")
    if forced in ("2", "3"):
        return int(forced)
    if head_dim > 64 or (causal and seqlen_q <= 2048) or block_mask or window:
        return 2
    return 3


def tiles(head_dim: int, causal: bool = False, seqlen_q: int = 4096, block_mask: bool = False,
          variant: Variant | None = None) -> TcTiles:
    """The tile shape for arrays of ``head_dim`` columns (on ``hopper.tile_dim``'s tiles:
    one of ``HEAD_DIMS``, ``data_dim`` the arrays' when they differ; ``consumers`` picks
    the rows, ``variant``'s window among its reasons, and ``key_tile`` the keys): ``warps``
    counts the consumer warps (the producer warpgroup is ``threads(t)`` − 128·consumers
    more)."""
    tile_d = tile_dim(head_dim, HEAD_DIMS)
    if not tile_d:
        raise ValueError(f"head_dim={head_dim}: the wgmma forward runs d in {HEAD_DIMS} and other multiples of 8 "
                         f"below {HEAD_DIMS[-1]}")
    window = variant is not None and (variant.window_left or variant.window_right)
    c = consumers(tile_d, causal, seqlen_q, block_mask, window)
    t = TcTiles(tile_d, 64 * c, key_tile(tile_d), 4 * c, m_tiles=1, stages=STAGES, q_in_regs=False,
                data_dim=head_dim if head_dim != tile_d else 0)
    assert smem_bytes(t) <= SMEM_LIMIT  # every (d, consumers) above fits: at most 224.1 KiB
    return t


def key_tile(head_dim: int) -> int:
    """Keys a K/V tile at ``head_dim`` (a tile's d): 128 up to d = 128, as FlashAttention-3;
    64 past it, where a stage of K and V is 64·d·2 bytes each (d = 256: Q's 64 KiB and two
    stages, 192 KiB of the 227; 128 keys would need 320).  A multiple of 32 (dropout's
    keep bits come 32 keys a Philox call, ``fragments.drop_packed``), so not
    FlashAttention-3's 80.  Session 26 timed 160 keys at d = 128 and 80 at d = 256 where no
    causal bound or window limits the walk (0.84–1.00× the default's speed), session 27 three
    consumers on 64-key tiles at d = 128 (0.82–0.93×): both removed in session 37."""
    return BLOCK_N if head_dim <= 128 else WIDE_D_BLOCK_N


def o_in_q(t: TcTiles) -> bool:
    """The epilogue stages O in the consumer's own rows of the Q tile instead of rows of
    its own: at d = 256, where Q (64 KiB) and two stages of K and V (128 KiB) leave no
    room for 64 KiB of staging rows.  A warp's 16 staged rows (16·d·2 = 8 KiB) are then
    exactly its consumer's 64 rows of one 64-column atom of Q (64 · 128 bytes): warp w of
    consumer c stages at atom w, rows 64c ….  The consumer releases Q (``q_empty``) after
    its epilogue instead of after its last S, so the producer loads the next tile's Q
    after the first K and V (``Q_LATE``)."""
    return 16 * t.head_dim * 2 == 64 * 128


def threads(t: TcTiles) -> int:
    """Threads a block: the producer warpgroup, then the consumers'."""
    return 32 * t.warps + 128


@functools.lru_cache(maxsize=None)
def wgmma_forward_kernel(t: TcTiles, variant: Variant, dtype: str, persistent: bool = True, domain: int = 1,
                         alibi_mma: bool = False, key_rows: int = 0, dynamic: bool = False, trace: int = 0,
                         hold: int = 0):
    """``kernel[grid, threads(t), stream, smem_bytes(t)](q, k, v, out32, lse, softmax_scale, params, alibi,
    cu_seqlens_q, cu_seqlens_k, fx, sched, tmaps)``: ``tc_forward_kernel``'s arguments and outputs, the
    scheduler's counter (a zeroed int32 pair; read only when ``dynamic``) and the tensor
    maps of q, k and v (``tma.attention_maps``).  ``persistent``: a block runs tiles blockIdx.x,
    + gridDim.x, … (``blocks``); else the grid has a block a tile and the tile loop is compiled
    away (at d = 64 the loop's carried state costs the 160-register consumers spills).  ``domain``: the
    softmax's (``softmax.domain(variant, capped=True)``); ``alibi_mma``: ALiBi's bias on the tensor cores
    (:func:`alibi_on_products`; raw scores); ``key_rows``: a paged cache's K/V boxes (:func:`key_box`; the
    maps' key boxes); ``dynamic``: persistent blocks take their tiles from a counter (:func:`dynamic_tiles`);
    ``trace``: with ``dynamic``, the first ``trace`` tiles of each block leave timestamps after
    the counter in ``sched`` (:func:`trace_tiles`); ``hold``: a step's softmax (2: and dropout's keep
    words; 3: and acc's rescale, before the P·V's issue) kept ahead of the wait for P·V
    (:func:`hold_exponentials`)."""
    HEAD_DIM, BLOCK_M, PERSISTENT = t.head_dim, t.block_m, persistent
    CONSUMERS = BLOCK_M // 64
    THREADS, CONSUMER_THREADS = threads(t), 128 * CONSUMERS
    PRODUCER_REGS, CONSUMER_REGS = REGS[CONSUMERS]
    F = variant.flags
    ALIBI_MMA = alibi_mma
    # the score step's flags: with ALiBi on the tensor cores, S holds the bias's column term already
    F_S = tuple(False if i == ALIBI else f for i, f in enumerate(F)) if ALIBI_MMA else F
    SOFTMAX = domain  # softcap: the cap in the exponent's FFMA
    BLOCK_N = t.block_n  # keys a K/V tile (``key_tile``)
    KEY_BOX = key_rows or BLOCK_N  # a paged cache's K/V tile: BLOCK_N / KEY_BOX TMA boxes, each within a page
    KX_BYTES = BLOCK_N * 128  # ALiBi on the tensor cores: its key ramp, one swizzled atom (``alibi_on_products``)
    # d = 256: O staged in the consumer's rows of Q, released after the epilogue, loaded after K_0, V_0 (``o_in_q``)
    O_IN_Q = Q_LATE = o_in_q(t)
    # persistent blocks: the producer takes each next tile from the ``sched`` counter and
    # hands it to the consumers in a slot of shared memory (``dynamic_tiles``)
    DYNAMIC = persistent and dynamic
    TRACE = trace if DYNAMIC else 0  # tiles a block traced (``trace_tiles``); 0: no trace code
    HOLD = hold  # the step's softmax before the wait for P·V (``hold_exponentials``; 2 and 3 below)
    # … not with three consumers: their 160 registers spill the keep words (96 bytes at d = 64)
    KEEP_AHEAD = hold >= 2 and variant.flags[DROPOUT] and CONSUMERS == 2
    # 3: acc rescaled by the previous tile's alpha while S runs, before that tile's P·V is issued
    # (FlashAttention-3's order), instead of after the wait for it
    RESCALE_EARLY = hold >= 3
    KSTEPS = HEAD_DIM // 16  # k-slices of Q·Kᵀ
    NT_S = BLOCK_N // 8
    NT_O = HEAD_DIM // 8
    PSTEPS = BLOCK_N // 16  # k-slices of P·V
    S_REGS, O_REGS, P_REGS = NT_S * 4, NT_O * 4, PSTEPS * 4  # registers a thread (literals for local.array)
    KEEP_WORDS = PSTEPS * 2  # rows g, g + 8 a k-slice (``fragments.keep_words``)
    STAGED_WORDS = 2 * NT_O  # the epilogue's staged words a lane (``fragments.store_staged_rows``)
    STAGE_IN_P = P_REGS >= STAGED_WORDS  # p_frag, spent by then, holds them (not at d = 256)
    DCOLS, NT_W, _, HALVES = tc_array_layout(t)
    if DCOLS % 8 or HALVES:  # the epilogue stores 16-byte chunks of 8 columns
        raise ValueError(f"tiles {t}: the wgmma forward writes rows of a multiple of 8 columns")
    CHUNKS = (DCOLS or HEAD_DIM) // 8  # 16-byte chunks of out's rows (the tile's past data_dim are not written)
    ATOMS = HEAD_DIM // ATOM
    Q_ATOM, KV_ATOM = BLOCK_M * 128, BLOCK_N * 128  # bytes of a 64-column atom of a tile
    Q_BYTES, KV_BYTES = ATOMS * Q_ATOM, ATOMS * KV_ATOM
    WG_ROWS = 64 * 128  # bytes of a consumer's 64 rows within a Q atom
    O_WARP = 16 * HEAD_DIM * 2  # bytes of a consumer warp's staging rows of O (16 rows × d, 16-bit)
    kind = "f16" if dtype == "float16" else "bf16"
    wgmma_s = getattr(ptx, f"wgmma_m64n{BLOCK_N}k16_{kind}_acc")
    wgmma_o = getattr(ptx, f"wgmma_m64n{HEAD_DIM}k16_{kind}_rs_bmn_acc")
    BF16 = dtype == "bfloat16"

    # (acc_s, q_wg, k_tile): S = Q·Kᵀ (with ALiBi on the tensor cores its k-slice follows, and issue_bias commits)
    issue_scores = ss_chain(wgmma_s, KSTEPS, Q_ATOM, KV_ATOM, not ALIBI_MMA)  # ALiBi: issue_bias commits
    wgmma_bias = getattr(ptx, f"wgmma_m64n{BLOCK_N}k16_{kind}_rs_acc")  # ALiBi's k-slice: A from registers
    issue_pv = rs_chain(wgmma_o, PSTEPS, KV_ATOM)  # (acc_o, p_frag, v_tile): acc += P·V

    @device_function
    def scores_to_p(acc_s, alpha, m_i, l_i, j, start_n, d0, row0, rows0, si, di, mi, vr):
        """Tile j's scores (keys ``start_n`` …, ``d0`` its ``fragments.lane_distance``,
        computed before the wait for S) in ``acc_s`` become P: scaled, masked where the
        tile needs it, the online softmax's step (``alpha`` out, for ``rescale_row`` once
        acc is free)."""
        needs_mask = tile_needs_mask(rows0, 64, start_n, BLOCK_N, mi)
        fragments.scale_and_mask(acc_s, 0, NT_S, 1, row0, start_n, d0, si, needs_mask, tile_partial(j, vr, F), mi,
                                 False, SOFTMAX, score.column_frame(F_S), F_S)  # fmt: skip
        for r in range(2):
            # ALiBi on the tensor cores: row r's scores are S + shift, shift its bias's row term
            # −v·(i + diag − c), c = start_n + BLOCK_N / 2 the key ramp's centre
            # (``fragments.bias_fragment``, ``stage_key_ramp``); the step runs in S's frame
            shift = float32(0.0)
            if ALIBI_MMA:
                shift = -si[2] * (d0 + float32(2 * (cuda.threadIdx.x & 3) + 8 * r - BLOCK_N // 2))
                m_i[r] -= shift
            alpha[r] = softmax.softmax_row_step(acc_s, 2 * r, 4, NT_S, 2, m_i, l_i, r, 4, SOFTMAX,
                                                score.exponent_factor(si, SOFTMAX))  # fmt: skip
            if ALIBI_MMA:
                m_i[r] += shift

    @device_function
    def rescale_acc(acc_o, alpha):
        """acc's rows g, g + 8 times their alpha (``softmax.rescale_row``)."""
        for r in range(2):
            softmax.rescale_row(acc_o, 2 * r, 4, NT_O, 2, alpha[r])

    @device_function
    def pack_p(p_frag, acc_s, row0, start_n, di):
        """P's k-slice ps is S's n-tiles 2ps, 2ps + 1 packed to 16-bit pairs (V's keys 16ps …);
        with dropout, the dropped values zeroed in the pairs (the epilogue scales O by
        1 / (1 − p); l_i kept the undropped P)."""
        for ps in range(PSTEPS):
            fragments.pack_a(p_frag, ps * 4, acc_s, ps * 8, BF16)
        if F[DROPOUT]:
            fragments.drop_packed(p_frag, PSTEPS, row0, start_n, di)

    @device_function
    def pack_kept(p_frag, acc_s, keep):
        """``pack_p`` with dropout's keep words made before the wait (``KEEP_AHEAD``)."""
        for ps in range(PSTEPS):
            fragments.pack_a(p_frag, ps * 4, acc_s, ps * 8, BF16)
        fragments.drop_kept(p_frag, keep, PSTEPS)

    @device_function
    def issue_bias(acc_s, bias_frag, kx_base):
        """ALiBi on the tensor cores (``ALIBI_MMA``): S += the bias's column term,
        v·(j − start_n − BLOCK_N / 2) for key j, one wgmma of a k-slice (``fragments.bias_fragment``
        times the key ramp, ``fragments.stage_key_ramp``) after ``issue_scores``' Q·Kᵀ, closing
        S's commit group.  Last, not first: Q·Kᵀ's k-slices then accumulate at their own
        magnitude and the column term (at most v·64 raw) is added with one rounding, not with
        each k-slice's (issued first, the LSE's error reached 4–5e-5 on an H100 with slopes
        near 2: ``test_wgmma_forward_causal_alibi_column_frame``)."""
        if ALIBI_MMA:
            wgmma_bias(acc_s, 0, bias_frag, 0, sw128_desc(kx_base), 1)
            ptx.wgmma_commit_group()

    @device_function
    def load_keys(dst, tmap, start_n, seqlen_k, k0, hk, b, page, row, bar, lead):
        """The producer warp's copy of a K or V tile (keys ``start_n`` … of the sequence)
        into ``dst``, completing on ``bar``: rows ``k0 + start_n`` … of the arrays, or a
        KV cache's pages in boxes of ``KEY_BOX`` rows, the lanes' ``page``, ``row``
        (``hopper.page_of_box``, ``load_page_boxes``).  Lane 0 (``lead``) issues."""
        if F[PAGED]:
            load_page_boxes(dst, tmap, page, row, start_n, seqlen_k, hk, bar, lead, ATOMS, KV_ATOM, BLOCK_N, KEY_BOX)
        elif lead:
            ptx.mbarrier_arrive_expect_tx(bar, KV_BYTES)
            load_rows(dst, tmap, k0 + start_n, hk, b, bar, ATOMS, KV_ATOM)

    @device_function
    def hand_over(q_full, done, tile, coords, lead):
        """The producer's turn at q_full for the block's ``done``-th tile: once the
        consumers released the previous tile's Q (``q_empty``), and DYNAMIC, lane 0 writes
        ``tile`` and its ``coords`` (``tile_coords``) into its slot (q_full's completion
        publishes them; n_tiles: the end).  The consumers read the coordinates instead of
        computing them: up to ten integer divisions (seven of them 64-bit), 1.1–1.6 µs of a
        tile's set-up on the path from its Q to its first S on an H100 (``trace_tiles``, docs/benchmarks/2026-12-07-s44)."""
        if done > 0:
            wait_phase(q_full + Q_EMPTY, (done - 1) & 1)
        if DYNAMIC and lead:
            ptx.st_shared_v4_b32(q_full + TILE_SLOT + SLOT_BYTES * (done % 2), tile, coords[0], coords[1], coords[2])

    @device_function
    def load_q(q_base, tmap, rows0, h, b, q_full, done, lead, tile, coords):
        """The producer's copy of a tile's Q (rows ``rows0`` … of head ``h``) to ``q_base``
        after its ``hand_over``."""
        hand_over(q_full, done, tile, coords, lead)
        if lead:
            ptx.mbarrier_arrive_expect_tx(q_full, Q_BYTES)
            load_rows(q_base, tmap, rows0, h, b, q_full, ATOMS, Q_ATOM)

    @device_function
    def next_tile(sched, lead):
        """DYNAMIC: the producer warp's next tile, ``gridDim.x`` + the counter's count
        (lane 0 takes it, the warp shares it; the blocks' first tiles are their own
        ``blockIdx.x``)."""
        taken = int32(0)
        if lead:
            taken = cuda.atomic.add(sched, 0, 1)
        return int64(cuda.gridDim.x) + int64(cuda.shfl_sync(0xFFFFFFFF, taken, 0))

    @device_function
    def look_up_pages(cache, j, n_hi, vr, mi, fx, seq, lane):
        """A paged cache's boxes of key tile ``j`` (``hopper.page_of_box``: lane i's box
        i), looked up by the producer warp a tile ahead of its copies; (−1, 0) past the
        walk or without pages."""
        if F[PAGED] and j < n_hi:
            return page_of_box(cache, tile_at(j, vr, F) * BLOCK_N, mi[1], kv_pages(fx, seq), lane, BLOCK_N, KEY_BOX)
        return int32(-1), int32(0)

    @device_function
    def finalize_rows(fin, m_i, l_i, si, di):
        """The epilogue's factors of rows g, g + 8 once the tile's softmax is final: 1 / l
        (with dropout, times 1 / (1 − p): P·V took the kept P unscaled) in ``fin[0:2]``,
        lse in ``fin[2:4]``."""
        for r in range(2):
            m_row = score.frame_max(m_i[r], si, 8 * r, score.column_frame(F_S))  # ALiBi's column frame
            inv_l, lse_row = softmax.finalize(m_row, l_i[r], 4, SOFTMAX, score.exponent_factor(si, SOFTMAX))
            if F[DROPOUT]:
                inv_l *= dropout.out_scale(di)
            fin[r] = inv_l
            fin[2 + r] = lse_row

    @device_function
    def store_tile(acc_o, fin, p_frag, o_stage, out32, lse, b, h, q0, row0, seqlen_q, q_full):
        """The epilogue: O = acc · (1 / l) as 16-bit pairs into the warp's staging rows, then
        whole rows to HBM, one 16-byte store a lane (``fragments.store_staged_rows``: it
        syncs the warp before reading the rows and again after, before the warp's next
        tile stages into them); lse by the quads' lane 0.  Rows past ``seqlen_q`` (out's
        rows from ``q0``) are not written; each row starts 16-byte aligned, as
        st.global.v4 needs: the API allocates out itself (C-contiguous, its base 256-byte
        aligned) and a row is d·2 bytes, d a multiple of 8 (plan's ``aligned`` covers only
        q, k and v, which TMA reads).  The staged words go through P's registers (spent by
        then; at d = 256 through registers of their own)."""
        for r in range(2):
            lane = cuda.threadIdx.x & 31  # read here: held across the key walk, it spilled at d = 64 causal
            row = row0 + (lane >> 2) + 8 * r
            if F[SPLIT]:  # a split's part b, fp32 (the merge kernel combines them): straight from acc
                if row < seqlen_q:
                    fragments.store_row_floats(out32, b, q0 + row, h, acc_o, 2 * r, NT_W, lane & 3, fin[r], DCOLS)
            else:
                fragments.stage_row_pairs(o_stage, acc_o, r, NT_O, fin[r], BF16)
            if row < seqlen_q and (lane & 3) == 0:
                lse[b, h, q0 + row] = fin[2 + r]
        if not F[SPLIT]:  # the staged rows to HBM
            if STAGE_IN_P:  # nothing in flight: P's registers, spent by now (fewer registers: no spills added)
                fragments.store_staged_rows(out32, b, q0 + row0, h, o_stage, seqlen_q - row0, NT_O, p_frag, CHUNKS)
            else:  # more words than P has (d = 256)
                words = cuda.local.array(STAGED_WORDS, uint32)
                fragments.store_staged_rows(out32, b, q0 + row0, h, o_stage, seqlen_q - row0, NT_O, words, CHUNKS)
        if O_IN_Q:  # the staged rows were read: the producer may load the next Q over them (TMA, the async proxy)
            ptx.fence_proxy_async()
            ptx.mbarrier_arrive(q_full + Q_EMPTY)

    @device_function
    def issue_first_scores(acc_s, bias_frag, q_wg, k_base, kx_base, q_full, pos):
        """A tile's first S, with no P·V of its own beside it: wait for its K (ring
        position ``pos``), then ALiBi's k-slice and Q·Kᵀ in one group."""
        s = pos % STAGES
        wait_phase(q_full + K_FULL + 8 * s, (pos // STAGES) & 1)
        ptx.wgmma_fence()  # acc_s was written by ordinary instructions
        issue_scores(acc_s, q_wg, k_base + s * KV_BYTES)
        issue_bias(acc_s, bias_frag, kx_base)

    @device_function
    def trace_word(sched, done, word, value, who):
        """``TRACE``: word ``word`` of the block's ``done``-th tile's record (``trace_tiles``:
        ``TRACE_WORDS`` int32 words a tile after the counter pair) is ``value``, written by
        the thread ``who`` is true on, where the buffer holds it; nothing without a trace."""
        if TRACE:
            at = 2 + (int64(cuda.blockIdx.x) * TRACE + done) * TRACE_WORDS + word
            if who and done < TRACE and at < sched.shape[0]:
                sched[at] = int32(value)

    @device_function
    def trace_clock(sched, done, word, who):
        """``TRACE``: the SM's clock now into the record's word ``word`` (``trace_word``)."""
        if TRACE:
            if who:
                trace_word(sched, done, word, ptx.sm_clock(), who)

    @device_function
    def trace_timer(sched, done, word, who):
        """``TRACE``: the global timer now into the record's word ``word`` (``trace_word``)."""
        if TRACE:
            if who:
                trace_word(sched, done, word, ptx.global_timer_lo(), who)

    @device_function
    def tile_coords(tile, gx, gy, gz, params, fx):
        """``(row tile, head, batch)`` of tile ``tile`` of the virtual grid (gx, gy, gz), in
        the order the grid runs (``block_info.linear_coords``, ``grid_coords``: the L2
        sections); a tile past the grid as its last."""
        x, y, z = linear_coords(min(tile, gx * gy * gz - 1), gx, gy)
        tm, th, tb = grid_coords(x, y, z, gx, gy, gz, section_of(params, False, F), fx, False, F)
        return int64(tm), int64(th), int64(tb)

    @device_function
    def tile_walk(tile, coords, n_tiles, q, k, params, cu_q, cu_k, fx):
        """Tile ``tile`` of the virtual grid (of ``n_tiles``) at ``coords`` (``tile_coords``):
        ``block_info.block_at``'s ``(start_m, b, h, hk, q0, k0, mi, seq)``, its walk list ``vr``,
        the key tiles ``[n_lo, n_hi)`` it visits and whether it is ``live`` (not past the
        virtual grid or past its sequence: varlen's grid is the launch's, of ``max_seqlen_q``
        rows a sequence); the producer and the consumers walk the same."""
        tm, th, tb = coords
        start_m, b, h, hk, q0, k0, mi, seq = block_at(tm, th, tb, q, k, params, cu_q, cu_k, fx, BLOCK_M, F, False)
        # a block mask's list (the roles walk apart: not staged), or a split's key tiles (varlen: b is the split)
        vr = read_walk_list(fx, seq, h, tm, False, F, b if F[SPLIT] else 0)
        n_lo, n_hi = walk_range(*key_tiles(start_m, BLOCK_M, BLOCK_N, mi), vr, F)
        return start_m, b, h, hk, q0, k0, mi, seq, vr, n_lo, n_hi, tile < n_tiles and start_m < mi[0]

    @kernel(launch_bounds=(THREADS, 1), whole_program=True)
    def wgmma_forward(q, k, v, out32, lse, softmax_scale, params, alibi, cu_q, cu_k, fx, sched, tmaps):
        tid = cuda.threadIdx.x
        wg = tid // 128

        smem = cuda.shared.array(0, uint8, alignment=_ALIGN)
        q_base = ptx.smem_addr(smem, 0)
        k_base = q_base + Q_BYTES
        v_base = k_base + STAGES * KV_BYTES
        kx_base = v_base + STAGES * KV_BYTES  # ALiBi on the tensor cores: the key ramp (KX_BYTES, else none)
        q_full = kx_base + (KX_BYTES if ALIBI_MMA else 0)  # then k_full[s] at + K_FULL + 8s, v_full, … likewise
        o_base = q_full + BARRIER_BYTES  # the consumer warps' staging rows of O, O_WARP bytes each (16-byte aligned)
        if tid == 0:
            ptx.mbarrier_init(q_full, 1)
            ptx.mbarrier_init(q_full + Q_EMPTY, CONSUMER_THREADS)
            ptx.mbarrier_init(q_full + V_LAND, 1)
            for s in range(STAGES):
                ptx.mbarrier_init(q_full + K_FULL + 8 * s, 1)
                ptx.mbarrier_init(q_full + V_FULL + 8 * s, 1)
                ptx.mbarrier_init(q_full + K_EMPTY + 8 * s, CONSUMER_THREADS)
                ptx.mbarrier_init(q_full + V_EMPTY + 8 * s, CONSUMER_THREADS)
            ptx.fence_proxy_async()  # the initialised barriers, before TMA completes on them
        if ALIBI_MMA:  # the B operand of ALiBi's k-slice, written once by every thread, read by wgmma
            fragments.stage_key_ramp(kx_base, tid, THREADS, BLOCK_N, BF16)
            ptx.fence_proxy_async()  # these generic-proxy writes, before wgmma (the async proxy) reads them
        cuda.syncthreads()  # the barriers are initialised (and the key ramp written) before anyone uses them

        # The virtual grid (``spec.query_grid``'s): this block runs its tiles blockIdx.x,
        # blockIdx.x + gridDim.x, … (one, when the grid is the whole virtual grid).
        m_blocks, n_seq = query_grid_dims(q, cu_q, BLOCK_M, F)
        if F[SPLIT]:  # split-major over (split, sequence): out holds a part a split
            n_seq *= out32.shape[0]
        gx, gy, gz = (q.shape[2], n_seq, m_blocks) if F[HEAVIEST_FIRST] else (m_blocks, q.shape[2], n_seq)
        n_tiles = gx * gy * gz
        if DYNAMIC:  # trips enough for any share of the tiles (and the end's): the slots say which
            tiles_start, tiles_end, tiles_step = 0, n_tiles + 1, 1
        elif PERSISTENT:
            tiles_start, tiles_end, tiles_step = cuda.blockIdx.x, n_tiles, cuda.gridDim.x
        else:  # a block a tile: one trip, the loop and its carried state compiled away
            tiles_start, tiles_end, tiles_step = cuda.blockIdx.x, cuda.blockIdx.x + 1, 1

        if wg == 0:  # the producer: warp 0 (its lane 0 issues the copies; the warp zeroes varlen's tails)
            ptx.setmaxnreg_dec(PRODUCER_REGS)
            if tid < 32:
                lead = tid == 0
                # int32 counters: the producer has 24 registers (session 34: with int64 ones a second Q
                # buffer's few more values spilled 56 bytes; int32 ones: no spills, 24 instructions fewer).
                # 2**31 key steps would take one block over an hour (~2 µs a step)
                pos = int32(0)  # the K/V ring's position, over all of this block's tiles: stage pos mod 2, fill pos // 2
                done = int32(0)  # the tiles this block loaded Q for
                zeroed = int32(0)  # the V tiles zeroed past their sequence (v_land's phases)
                tile = int64(cuda.blockIdx.x)  # DYNAMIC: each block's first, then the counter's
                for it in range(tiles_start, tiles_end, tiles_step):
                    if not DYNAMIC:
                        tile = it
                    elif tile >= n_tiles:  # the end: the consumers read it from the slot, released by q_full
                        hand_over(q_full, done, n_tiles, (int64(0), int64(0), int64(0)), lead)
                        if lead:
                            ptx.mbarrier_arrive(q_full)
                        break
                    coords = tile_coords(tile, gx, gy, gz, params, fx)
                    start_m, b, h, hk, q0, k0, mi, seq, vr, n_lo, n_hi, live = tile_walk(tile, coords, n_tiles, q, k,
                                                                                         params, cu_q, cu_k, fx)
                    if not live:  # varlen: a tile past its sequence (the consumers skip it too)
                        if DYNAMIC:
                            tile = next_tile(sched, lead)
                        continue
                    qb = 0 if F[SPLIT] else b  # split-KV: b is the split's part of out; every split reads q's one batch
                    trace_clock(sched, done, T_PRODUCER, lead)
                    if not Q_LATE or n_hi == n_lo:
                        load_q(q_base, tmaps[0], q0 + start_m, h, qb, q_full, done, lead, tile, coords)
                    trace_clock(sched, done, T_PRODUCER + 1, lead)
                    page, row = look_up_pages(k, n_lo, n_hi, vr, mi, fx, seq, tid)  # a paged cache's first tile
                    for j in range(n_lo, n_hi):
                        s = pos % STAGES
                        start_n = tile_at(j, vr, F) * BLOCK_N
                        if pos >= STAGES:  # the consumers released this stage's last fill
                            wait_phase(q_full + K_EMPTY + 8 * s, ((pos // STAGES) - 1) & 1)
                        load_keys(k_base + s * KV_BYTES, tmaps[1], start_n, mi[1], k0, hk, b, page, row,
                                  q_full + K_FULL + 8 * s, lead)  # fmt: skip
                        if pos >= STAGES:
                            wait_phase(q_full + V_EMPTY + 8 * s, ((pos // STAGES) - 1) & 1)
                        # V's rows past a varlen sequence are zeroed (P's masked columns are 0, and 0 · inf
                        # is NaN); K's need not be: masking selects −inf whatever the score
                        first = past_rows(start_n, BLOCK_N, mi[1], k0, k.shape[1], F)
                        v_bar = q_full + (V_FULL + 8 * s if first == BLOCK_N else V_LAND)
                        load_keys(v_base + s * KV_BYTES, tmaps[2], start_n, mi[1], k0, hk, b, page, row, v_bar, lead)
                        if Q_LATE and j == n_lo:  # the tile's first K and V are on their way: now its Q
                            load_q(q_base, tmaps[0], q0 + start_m, h, qb, q_full, done, lead, tile, coords)
                        # the next tile's pages, while this tile's copies land and the stage's next release comes
                        page, row = look_up_pages(k, j + 1, n_hi, vr, mi, fx, seq, tid)
                        if first < BLOCK_N:
                            land_and_zero((v_base + s * KV_BYTES,), first, v_bar, zeroed & 1,
                                          q_full + V_FULL + 8 * s, tid, BLOCK_N, ATOMS, KV_ATOM)  # fmt: skip
                            zeroed = int32(zeroed + 1)
                        pos = int32(pos + 1)
                    trace_clock(sched, done, T_PRODUCER + 2, lead)
                    done = int32(done + 1)
                    if DYNAMIC:
                        tile = next_tile(sched, lead)
            return

        ptx.setmaxnreg_inc(CONSUMER_REGS)
        cw = wg - 1  # this consumer's 64 rows of the block
        warp = (tid // 32) % 4  # this consumer's warp: rows 16·warp … of its 64
        q_wg = q_base + cw * WG_ROWS

        acc_s = cuda.local.array(S_REGS, float32)
        acc_o = cuda.local.array(O_REGS, float32)
        p_frag = cuda.local.array(P_REGS, uint32)  # one A fragment a k-slice: wgmma reads them late
        keep = cuda.local.array(KEEP_WORDS, uint32)  # dropout's keep words a k-slice (``KEEP_AHEAD``)
        bias_frag = cuda.local.array(4, uint32)  # ALiBi on the tensor cores: its k-slice's A fragment
        m_i = cuda.local.array(2, float32)  # rows g, g + 8 of the warp's m-tile
        l_i = cuda.local.array(2, float32)
        alpha = cuda.local.array(2, float32)
        fin = cuda.local.array(4, float32)  # the epilogue's 1 / l (dropout's scale in it) and lse, rows g, g + 8
        if O_IN_Q:  # this warp's staging rows of O: its consumer's rows of Q's atom ``warp`` (``o_in_q``)
            o_stage = q_wg + warp * Q_ATOM
        else:
            o_stage = o_base + (4 * cw + warp) * O_WARP
        pos = 0  # the ring's position, as the producer's
        done = 0
        tracer = tid == 128  # the first consumer's thread 0 writes the trace (``TRACE``)
        for it in range(tiles_start, tiles_end, tiles_step):
            tile = it
            trace_clock(sched, done, 0, tracer)
            trace_timer(sched, done, T_GLOBAL, tracer)
            if DYNAMIC:  # the producer's next tile (live), or n_tiles: the end
                wait_phase(q_full, done & 1)
                # the tile and its coordinates (16-byte aligned), in slot done mod 2
                w0, w1, w2, w3 = ptx.ld_shared_v4_b32(q_full + TILE_SLOT + SLOT_BYTES * (done % 2))
                tile = int64(w0)
                coords = (int64(w1), int64(w2), int64(w3))
                trace_clock(sched, done, 1, tracer)
                if tile >= n_tiles:
                    break
            if not DYNAMIC:
                coords = tile_coords(tile, gx, gy, gz, params, fx)
            start_m, b, h, hk, q0, k0, mi, seq, vr, n_lo, n_hi, live = tile_walk(tile, coords, n_tiles, q, k, params,
                                                                                 cu_q, cu_k, fx)  # fmt: skip
            if not live:  # varlen: a tile past its sequence (the producer skips it too)
                continue
            seqlen_q = mi[0]
            rows0 = start_m + 64 * cw  # this consumer's first query row
            # q_full's phase first, then q_empty's arrival (it must not count towards the previous tile's)
            if not DYNAMIC:
                wait_phase(q_full, done & 1)
            if rows0 >= seqlen_q:  # rows past the sequence (the last block): release each tile, compute nothing
                ptx.mbarrier_arrive(q_full + Q_EMPTY)
                for j in range(n_lo, n_hi):
                    g = pos + j - n_lo
                    s = g % STAGES
                    # the full phase first: this fill's arrival must not count towards the stage's previous fill
                    wait_phase(q_full + K_FULL + 8 * s, (g // STAGES) & 1)
                    ptx.mbarrier_arrive(q_full + K_EMPTY + 8 * s)
                    wait_phase(q_full + V_FULL + 8 * s, (g // STAGES) & 1)
                    ptx.mbarrier_arrive(q_full + V_EMPTY + 8 * s)
                pos += n_hi - n_lo
                done += 1
                continue
            row0 = rows0 + 16 * warp  # the warp's first query row
            si, di = score.head_info(params, alibi, fx, seq, h, softmax_scale, mi, SOFTMAX, F)
            if ALIBI_MMA:  # v = slope / scale (raw scores) split in three 16-bit values
                fragments.bias_fragment(bias_frag, si[2], BF16)
            softmax.start_rows(acc_o, O_REGS, m_i, l_i, 2)
            trace_clock(sched, done, 2, tracer)
            trace_word(sched, done, T_STEPS, n_hi - n_lo, tracer)
            trace_word(sched, done, T_STEPS + 1, tile, tracer)
            # Tile i's S = Q·K_iᵀ is issued with tile i − 1's acc += P·V, and its softmax runs
            # while that P·V is still on the tensor cores (FlashAttention-3's intra-warpgroup
            # overlap); acc is rescaled by tile i's alpha once that P·V completed. The first
            # tile is peeled, so that every wgmma in the loop is issued on every path (ptxas
            # serializes all wgmma of a kernel whose in-flight wgmma cross a divergent branch).
            if n_hi > n_lo:
                s = pos % STAGES
                start_n = tile_at(n_lo, vr, F) * BLOCK_N
                issue_first_scores(acc_s, bias_frag, q_wg, k_base, kx_base, q_full, pos)
                d0 = fragments.lane_distance(row0, start_n, mi, False)  # while S runs (ALiBi's)
                ptx.wgmma_wait_group(0)
                ptx.mbarrier_arrive(q_full + K_EMPTY + 8 * s)  # this thread is done with K_0
                trace_clock(sched, done, 3, tracer)
                scores_to_p(acc_s, alpha, m_i, l_i, n_lo, start_n, d0, row0, rows0, si, di, mi, vr)
                pack_p(p_frag, acc_s, row0, start_n, di)  # acc_o is 0: no rescale
                trace_clock(sched, done, 4, tracer)
            for j in range(n_lo + 1, n_hi):
                g = pos + j - n_lo
                s, sp = g % STAGES, (g - 1) % STAGES
                wait_phase(q_full + K_FULL + 8 * s, (g // STAGES) & 1)
                wait_phase(q_full + V_FULL + 8 * sp, ((g - 1) // STAGES) & 1)
                ptx.wgmma_fence()  # acc_o and p_frag were written by ordinary instructions
                issue_scores(acc_s, q_wg, k_base + s * KV_BYTES)
                issue_bias(acc_s, bias_frag, kx_base)
                if RESCALE_EARLY:  # acc to tile i − 1's max while S runs (its P·V adds at that max)
                    rescale_acc(acc_o, alpha)
                    ptx.wgmma_fence()  # acc_o was written by ordinary instructions
                issue_pv(acc_o, p_frag, v_base + sp * KV_BYTES)  # the previous tile's, behind this S
                start_n = tile_at(j, vr, F) * BLOCK_N
                d0 = fragments.lane_distance(row0, start_n, mi, False)  # while S runs (ALiBi's)
                ptx.wgmma_wait_group(1)  # S done (groups complete in order); P·V may still run
                ptx.mbarrier_arrive(q_full + K_EMPTY + 8 * s)  # this thread is done with K_i
                scores_to_p(acc_s, alpha, m_i, l_i, j, start_n, d0, row0, rows0, si, di, mi, vr)
                if KEEP_AHEAD:  # the Philox calls under that P·V too
                    fragments.keep_words(keep, PSTEPS, row0, start_n, di)
                if HOLD:  # the softmax above stays under that P·V (``hold_exponentials``)
                    hold_before_wait(min(l_i[0], l_i[1]))
                ptx.wgmma_wait_group(0)  # the previous P·V landed in acc_o and is done with p_frag
                ptx.mbarrier_arrive(q_full + V_EMPTY + 8 * sp)  # … and with V_{i−1}
                if not RESCALE_EARLY:
                    rescale_acc(acc_o, alpha)
                if KEEP_AHEAD:
                    pack_kept(p_frag, acc_s, keep)
                else:
                    pack_p(p_frag, acc_s, row0, start_n, di)
            trace_clock(sched, done, 5, tracer)
            if not O_IN_Q:  # every S of the tile is done: the producer may load the next Q (O_IN_Q: after O)
                ptx.mbarrier_arrive(q_full + Q_EMPTY)
            # The epilogue's factors now (m_i and l_i are final; the last P·V does not change them)
            finalize_rows(fin, m_i, l_i, si, di)
            g = pos + n_hi - n_lo - 1
            pos += n_hi - n_lo
            done += 1  # (the trace's last two steps below are this tile's: done − 1)
            if n_hi > n_lo:  # the last tile's P·V
                s = g % STAGES
                if RESCALE_EARLY:  # acc to the last tile's max (the loop's steps rescale before their P·V)
                    rescale_acc(acc_o, alpha)
                wait_phase(q_full + V_FULL + 8 * s, (g // STAGES) & 1)
                ptx.wgmma_fence()
                issue_pv(acc_o, p_frag, v_base + s * KV_BYTES)
                ptx.wgmma_wait_group(0)
                ptx.mbarrier_arrive(q_full + V_EMPTY + 8 * s)
            trace_clock(sched, done - 1, 6, tracer)
            store_tile(acc_o, fin, p_frag, o_stage, out32, lse, b, h, q0, row0, seqlen_q, q_full)
            trace_clock(sched, done - 1, 7, tracer)
            trace_timer(sched, done - 1, T_GLOBAL + 1, tracer)

    return wgmma_forward


def smem_bytes(t: TcTiles, alibi_mma: bool = False) -> int:
    """Dynamic shared bytes: Q, two stages of K and of V, ALiBi's key ramp (``alibi_mma``:
    a key tile's rows × 128 bytes, 16 KiB at 128 keys), the mbarriers, then the consumer
    warps' staging rows of O (16 rows each; 2 bytes an element; none at d = 256, which
    stages O in Q: ``o_in_q``).  d = 192: 48 + 96 + 48 KiB; d = 256: 64 + 128 KiB.  At
    most 224.1 KiB (d = 128 with three consumers, only by ``NUMBA_FLASH_WGMMA_CONSUMERS``;
    no key ramp there) of an H100/H200 block's 227 KiB."""
    return (2 * t.head_dim * (t.block_m + 2 * STAGES * t.block_n) + (t.block_n * 128 if alibi_mma else 0)
            + BARRIER_BYTES + (0 if o_in_q(t) else t.warps * 16 * 2 * t.head_dim))  # fmt: skip


def alibi_on_products(t: TcTiles, variant: Variant) -> bool:
    """ALiBi's bias as one more k-slice of S's products (``fragments.bias_fragment``,
    ``stage_key_ramp``) and a row term in the running max, so that the score step is
    plain raw scores' (one FFMA an element, the scale in the exponent): with causal (the
    bias is then a column term less a row term, as ``score.column_frame``'s), no
    softcap (whose bias comes after the tanh), raw scores (``softmax.raw_scores_allowed``),
    two consumers (with three, d = 64's 160-register consumers spilled 60 bytes, against 8
    with the column frame) and room for the 16 KiB ramp.  The price: one wgmma of 16
    columns more for S (d = 128: 9 k-slices where there were 8).
    ``NUMBA_FLASH_ALIBI_PRODUCTS=0`` turns it off (the column frame's FFMA an element)."""
    return (variant.alibi and variant.causal and not variant.softcap and softmax.raw_scores_allowed(variant)
            and softmax.domain(variant) != softmax.FOLD  # a score_mod must see the true score
            and os.environ.get("NUMBA_FLASH_ALIBI_PRODUCTS", "1") != "0"
            and t.block_m == 128 and smem_bytes(t, True) <= SMEM_LIMIT)  # fmt: skip


def dynamic_tiles() -> bool:
    """Persistent blocks take their tiles in turn from a counter in global memory
    (FlashAttention-3's dynamic scheduler) instead of tiles blockIdx.x, + gridDim.x, …:
    the producer warp's lane 0 takes the next with an atomic add when it starts a tile
    and hands it to the consumers in a slot of shared memory (two, alternating), which
    q_full's completion publishes; n_tiles in the slot ends the consumers' loop.  The
    counter is a fresh zeroed int32 pair a call (the API's ``sched`` buffer), so calls
    on other streams never share one.  The static order deals a ragged varlen batch's
    tiles so that a block sees a few of its sequences only (132 blocks over 16 heads ×
    16 sequences: 4 of them), and its causal tiles' unequal walks leave blocks idle at the
    end: at (16 sequences of mean 1024, 16 heads, d = 128) causal the varlen forward ran
    0.737× a uniform batch of the same tokens, 16 equal sequences through the varlen API
    0.942× (docs/benchmarks/2026-12-03-s20, call 3).  With it (call 4): the ragged batch
    0.910× (0.261 against 0.328 ms), the rest of the forward table within ±3% but causal;
    in one process (call 7, ``scripts/ab_scheduler.py``) causal (1, 16, 16384, 128) 1.069×
    and (4, 16, 4096, 128) 1.030× the static order's TF/s.  On
    by default; ``NUMBA_FLASH_WGMMA_SCHEDULER=static`` walks the static order."""
    return os.environ.get("NUMBA_FLASH_WGMMA_SCHEDULER", "dynamic") != "static"


def trace_tiles() -> int:
    """A diagnostic: ``NUMBA_FLASH_WGMMA_TRACE=n`` makes the persistent forward with the
    dynamic scheduler record, for the first n tiles of each block, when its first consumer
    reached each step of a tile (words 0–7 of a 16-word int32 record, the SM's clock, low
    32 bits: the loop's top, Q landed, the tile set up, the first S done, the first P
    packed, the walk done, the last P·V done, O written), the key tiles walked and the
    tile (8, 9), the producer's clock when it set up the tile, issued its Q (after the
    previous tile released Q) and issued its last K/V (10–12), and the global timer at the
    consumer's first and last step (13, 14: the clock rate).  Record ``blockIdx.x · n + t``
    follows the counter pair (words ``2 + 16·(blockIdx.x · n + t)`` … of the ``sched``
    buffer), which must then be made that large
    (``scripts/trace_forward.py`` replaces ``api.SCHEDULER_BUFFERS``; a smaller buffer
    records what fits).  0 (the default): the kernels hold no trace code."""
    n = os.environ.get("NUMBA_FLASH_WGMMA_TRACE", "0")
    return int(n) if n.isdigit() else 0


def hold_exponentials() -> int:
    """``NUMBA_FLASH_WGMMA_HOLD`` (0, off, by default: see the timing below), cumulative:

    * ``1``: the key loop ends a basic block between a step's softmax and its
      ``wgmma.wait_group 0`` (``hopper.hold_before_wait``).  Without it ptxas hoists that
      wait, for the previous tile's P·V, above the row max, and the step's exponentials
      run after the P·V instead of under it (docs/hopper.md, "Where ptxas puts the wait").
    * ``2``: dropout's keep words (its Philox calls, ``fragments.keep_words``) made before
      the wait too, with two consumers (three consumers' 160 registers spill them).
    * ``3``: acc rescaled by the previous tile's alpha while S runs, before that tile's P·V
      is issued (FlashAttention-3's order: acc·alpha + P·V instead of (acc + P·V)·alpha, so
      O is not bit for bit the others'), so that only P's packing follows the wait.

    Read in the SASS (ptxas 13.0, d = 128 causal, ``scripts/sass_mix.py waits``), the
    instructions a step issues with none of its wgmma in flight, 0 → 1 → 2 → 3: plain 441
    → 161 → 161 → 96, softcap 439 → 161 → 161 → 96, dropout 689 → 411 → 223 → 159; every
    MUFU.EX2 of a step under the P·V from 1 on.  No spills at d = 64 (two and three
    consumers), 128, 192 or 256, except softcap with dropout at 2 and 3: 52 bytes of a
    tile's state, outside the key loop.

    Timed (session 49, H100 at its power cap, (4, 16, 4096, 128) fp16 causal, processes
    alternated): at 1 plain's forward ran 2–4 % slower, softcap's and dropout's 0–3 %
    faster; at 2 dropout's 11 % slower; at 3 every forward at 4 096 keys or more 1.6–5.4 %
    slower.  So the default stays 0 (docs/hopper.md, "A block boundary before the wait")."""
    hold = os.environ.get("NUMBA_FLASH_WGMMA_HOLD", "0")
    return int(hold) if hold in ("1", "2", "3") else 0


#: Query rows a sequence past which the blocks are not persistent (``blocks``).
PERSISTENT_MAX_ROWS = 16384


def blocks(t: TcTiles, tiles: int, seqlen_q: int) -> int:
    """The blocks launched for ``tiles`` tiles of ``t``: with two consumers persistent,
    one block an SM (its registers hold one), each running tiles blockIdx.x,
    + gridDim.x, …, so that a tile's Q and first K/V load while the block's previous
    tile finishes its last P·V and writes O (1.42→1.56× FA2 at (1, 16, 16384, 128)).
    With three (192 rows) a block a tile: there the tile loop's carried state costs the
    160-register consumers spills (1.27 against 1.34× FA2 at (4, 32, 4096, 64)).
    At d = 256 (O staged in Q's rows: ``o_in_q``) also a block a tile: at (4, 8, 4096, 256)
    persistent blocks ran 556.2 / 417.1 TF/s (full / causal) with the dynamic scheduler,
    a block a tile 568.5 / 474.7 (a persistent block's next Q waits for its epilogue); at
    d = 192 persistent blocks with the dynamic scheduler ran 530.7 / 446.0 against 480.9 /
    445.5 a block a tile (docs/benchmarks/2026-12-03-s20, calls 1, 2 and 4).
    Past ``PERSISTENT_MAX_ROWS`` query rows also a block a tile: a persistent block's
    tiles drift apart from its neighbours' over a long walk, and the K/V tiles they
    share are read from DRAM again (ncu at (1, 16, 32768, 128): 1.05 GB read
    persistent, 0.53 GB a block a tile, 0.65 GB ``traffic.dram``'s model).
    ``NUMBA_FLASH_WGMMA_PERSISTENT=0`` launches a block a tile, ``=n`` at most n
    blocks (the benchmark's comparison; the sanitizers' small shapes, so that their
    blocks run several tiles)."""
    forced = os.environ.get("NUMBA_FLASH_WGMMA_PERSISTENT", "")
    if forced.isdigit():
        return tiles if int(forced) == 0 else min(tiles, int(forced))
    if t.block_m > 128 or o_in_q(t) or seqlen_q > PERSISTENT_MAX_ROWS:
        return tiles
    return min(tiles, _sms())


@functools.lru_cache(maxsize=None)
def _sms() -> int:
    """The current device's SMs; 2 on the simulator (so that its tests run a block's
    tile loop more than once); an H100/H200's 132 where there is no GPU (a plan made to
    be inspected, ``numba-flash inspect``)."""
    if SIMULATOR:
        return 2
    if not gpu_available():
        return 132
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def key_box(page_rows: int, block_n: int = BLOCK_N) -> int:
    """Rows of a K/V tile's TMA boxes: the tile's ``block_n`` keys, or for a paged KV cache
    whose sequences span pages of ``page_rows`` rows, ``gcd(page_rows, block_n)``: each
    box then lies inside one page (``hopper.load_page_boxes``), block_n / box of them a
    tile (pages of 16 rows: 8 boxes a 64-column atom).  The plan takes the mma.sync
    forward below 8 rows: a box must start on the 128-byte swizzle's 8-row (1024-byte)
    repeat."""
    return block_n if not page_rows else math.gcd(page_rows, block_n)


def launches(t: TcTiles, variant: Variant, dtype: str, sz: spec.Sizes, page_rows: int = 0) -> list:
    """One kernel on a 1-D grid of ``blocks`` blocks over the tiles of ``spec.query_grid``
    (a tile per ``t.block_m`` queries of a (batch, head), as ``tc_forward``'s blocks), the
    scheduler's counter (``spec.Arg("sched")``, a fresh one a call, with persistent blocks
    and :func:`dynamic_tiles`; else ``sched0``, never read) and the tensor maps as its
    last argument (``spec.Arg("tmaps")``; a paged cache's ``page_rows``: its keys in
    :func:`key_box`'s boxes)."""
    tiles = math.prod(spec.query_grid(sz, t.block_m, variant.heaviest_first))
    n = blocks(t, tiles, sz.seqlen_q)
    bias = alibi_on_products(t, variant)
    dom = softmax.CAPPED if bias else softmax.domain(variant, capped=True)  # raw scores there too
    box = key_box(page_rows, t.block_n) if variant.paged else t.block_n
    dyn = n < tiles and dynamic_tiles()
    kern = wgmma_forward_kernel(t, variant, dtype, n < tiles, dom, bias, box, dyn, trace_tiles() if dyn else 0,
                                hold_exponentials())
    # the scheduler's counter: a zeroed one a call (``sched``), or a stand-in it never reads
    # (split-KV: out and lse are the parts, fp32, that the merge kernel combines)
    args = spec.forward_args("u16", "f32" if variant.split else tc_out_view(t)) + (
        spec.Arg("sched" if dyn else "sched0"), spec.Arg("tmaps"))
    return [spec.KernelLaunch("wgmma_forward", kern, t, (n, 1, 1), threads(t), smem_bytes(t, bias), args,
                              (t.block_m, t.block_n, False), boxes=(t.block_m, box))]  # fmt: skip

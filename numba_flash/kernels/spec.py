"""What a kernel module states about each of its kernels, for the launch plan.

Every kernel module ends with a ``launches(...)`` function that returns, for its
tiles and a problem's sizes, one :class:`KernelLaunch` per kernel in launch order:
the compiled dispatcher, its tiles, grid, threads, dynamic shared memory, and its
parameters as :class:`Arg` roles.  ``numba_flash.plan`` picks the module and tiles;
``numba_flash.api`` binds the roles to arrays, ``numba_flash.inspection`` to numba
types.  Imports no numba.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The buffers a kernel parameter can be (``scale`` is the float softmax scale).
ROLES = ("q", "k", "v", "out", "lse", "dout", "delta", "dq", "dk", "dv", "scale", "params", "alibi", "cu_seqlens_q",
         "cu_seqlens_k", "flex", "tmaps", "stats", "sched", "sched0")
#: ``tmaps``: the TMA tensor maps of q, k and v (and, in a backward, dout), a (3, 128)
#: (or (4, 128)) uint8 device array that the launch makes from the arrays it binds
#: (``numba_flash.tma.attention_maps``).
#: ``sched``: a fresh zeroed int32 pair a call, the counter of a persistent kernel whose
#: blocks take their tiles in turn (``wgmma_forward.dynamic_tiles``); ``sched0``: a
#: stand-in for a kernel that never reads it.
#: ``stats``: the Hopper backward's (B, H, 2, rows) float32 workspace, lse (as the
#: backward subtracts it) and delta of each query row, padded (``wgmma_backward.stats_shape``).
#: How a 4-D buffer is viewed: as it is, 16-bit elements as uint16 (cp.async moves
#: bytes; the dtype matters only to mma), pairs of 16-bit elements as uint32, or float32
#: (split-KV's partial outputs of a 16-bit call: ``Variant.split``).
VIEWS = ("", "u16", "u32", "f32")


@dataclass(frozen=True)
class Arg:
    """One kernel parameter: which buffer (``role``) and how it is viewed."""

    role: str
    view: str = ""

    def __post_init__(self):
        if self.role not in ROLES or self.view not in VIEWS:
            raise ValueError(f"kernel argument {self.role!r} viewed as {self.view!r}: unknown")


@dataclass(frozen=True)
class Sizes:
    """The sizes a launch grid depends on.

    Attributes:
        batch: sequences (the batch, or varlen's number of sequences): grid z.
        heads, heads_k: query and KV heads (GQA: heads_k divides heads).
        seqlen_q, seqlen_k: the lengths (varlen: the longest; the grid covers them).
        rows_q: rows of q's sequence axis (seqlen_q, or varlen's total_q).
        batch_arrays: the arrays' batch (1 for varlen's packed arrays).
    """

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    heads_k: int = 0
    rows_q: int = 0
    batch_arrays: int = 0

    def __post_init__(self):
        object.__setattr__(self, "heads_k", self.heads_k or self.heads)
        object.__setattr__(self, "rows_q", self.rows_q or self.seqlen_q)
        object.__setattr__(self, "batch_arrays", self.batch_arrays or self.batch)


#: CUDA's limit on grid y and z.
MAX_GRID_YZ = 65535


def query_grid(sz: Sizes, block_m: int, heaviest_first: bool = False) -> tuple:
    """A block per ``block_m`` queries of a (sequence, query head): (row tiles, heads,
    batch), or with ``heaviest_first`` (``Variant.heaviest_first``) (heads, batch, row
    tiles), the order the kernels take row tiles in (``block_info.block_coords``)."""
    return _grid(cdiv(sz.seqlen_q, block_m), sz.heads, sz.batch, heaviest_first, "seqlen_q", block_m)


def key_grid(sz: Sizes, block_n: int, heaviest_first: bool = False) -> tuple:
    """A block per ``block_n`` keys of a (sequence, KV head): the dK/dV kernels
    (:func:`query_grid`'s orders, KV heads)."""
    return _grid(cdiv(sz.seqlen_k, block_n), sz.heads_k, sz.batch, heaviest_first, "seqlen_k", block_n)


def _grid(tiles: int, heads: int, batch: int, heaviest_first: bool, name: str, block: int) -> tuple:
    if not heaviest_first:
        return (tiles, heads, batch)
    if tiles > MAX_GRID_YZ:
        raise ValueError(f"{name}: {tiles} tiles of {block} rows; with causal, a window or a block mask at most "
                         f"{MAX_GRID_YZ} (CUDA's grid z), i.e. {name} <= {MAX_GRID_YZ * block}")  # fmt: skip
    return (heads, batch, tiles)


#: L2 bytes and SMs where no device says (the simulator, ``traffic``'s models): an H100's / H200's.
DEFAULT_L2_BYTES, DEFAULT_SMS = 50 * 2**20, 132

#: The share of L2 one section's streamed tiles may take (the rest: the blocks' own rows,
#: outputs, the next section's first tiles).
L2_SECTION_SHARE = 3
#: The forward's grid runs in sections only when the heads its blocks stream at once hold
#: more than this many L2s (the backward's grids: more than one).
FORWARD_SECTIONS_OVER = 3
#: ``l2_sections(unshared=True)``, the default: the forward's blocks at once per K/V stream
#: below which it takes sections past one L2 (then bandwidth-bound: session 36).
UNSHARED_BELOW = 2


def l2_sections(pass_: str, batch: int, heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                itemsize: int, l2_bytes: int, sms: int, unshared: bool = True) -> tuple:  # fmt: skip
    """``(SECTION_Q, SECTION_K)`` of ``variant.params``: how many (head, batch) positions
    of a heaviest-first grid run as one L2 section (``block_info.l2_section``); 0 for one
    section (the plain heaviest-first order).

    A heaviest-first grid is (heads, batch, row tiles), so the blocks that run at once
    hold the same row tile of up to ``sms`` heads: under causal each streams its own
    head's K and V (keys: Q and dO).  At (4, 32, 4096, 128) fp16 that is 128 heads × 2 MiB
    of K/V, 5× a 50 MB L2: ``traffic.dram`` counts 4.56 GB of DRAM reads for the causal
    forward, 17× the 0.27 GB of the non-causal grid, whose row tiles run fastest, and
    the H100 ran it at 360 TF/s against 495 at 16 heads.  Split into sections of heads
    whose streamed tiles take at most ``l2_bytes / L2_SECTION_SHARE``, each run heaviest
    first before the next (as FlashAttention-3's scheduler swizzles heads by L2 size),
    the model counts 0.54 GB and the H100 ran the forward 1.25–1.36× (three runs,
    docs/benchmarks/2026-12-06-s32), the backward 1.06–1.17×.

    Where the heads streamed at once hold 2.6 L2s (128 MB: (4, 16, 4096, 128),
    (4, 32, 4096, 64), (1, 16, 16384, 128)), the backward ran 1.06–1.10× with sections
    (its dQ grid most, dK/dV's 1.02–1.03×) and the forward 0.95–0.99×, within the noise
    of an A/B of two identical settings (0.946); at 33 MB ((16, 32, 1024, 64): 132 heads
    of 256 KiB) both ran slower (dK/dV 0.96×).  So the forward takes sections over
    ``FORWARD_SECTIONS_OVER`` L2s, where they measured faster, the backward's grids over one.

    Query-row grids (forward, dQ) stream K and V, ``2·seqlen_k·d·itemsize`` bytes a KV
    head shared by ``group`` consecutive query heads, so a section holds whole groups;
    key-row grids (dK/dV, KV heads) stream Q and dO of the group's query heads.
    Sections of one group or KV head are the floor (a head's tiles larger than the share).

    ``unshared`` (the default since session 36; ``False``, session 32's rule alone:
    ``NUMBA_FLASH_L2_SECTIONS=shared``): the forward takes sections over one L2 too where each
    K/V stream is shared by fewer than two blocks at once (``UNSHARED_BELOW``) at d > 64.
    Such a block reads a K/V tile from DRAM a step, 1/128 bytes a FLOP at 128 query rows:
    over an H100's 3.35 TB/s for ~500 TFLOP/s.
    On an H100, 16 sequences padded to 2254 rows, 16 heads, d = 128, causal, ran the forward at
    2.9 TB/s of DRAM reads with the tensor pipe 37% active (ncu; the long causal kernel: 70%),
    and ``traffic.dram`` counts 3.00 GB there (ncu: 3.007 GB), 0.44 GB with sections.  Where
    s32 measured sections no faster, the streams were shared (GQA groups of 4, 16 heads ×
    4 batches: ≥ 2 blocks a stream) or d = 64 (192-row blocks, two thirds the bytes a FLOP).
    Timed on an H100 (session 36, two processes a side in turn, docs/benchmarks/2026-12-06-s36
    §1): causal forwards of (16, 16, 1024, 128) 0.260 → 0.190 ms (1.36×), (16, 16, 1536, 128)
    0.515 → 0.353–0.364 (1.43×), (8, 16, 2048, 128) 0.430 → 0.301–0.313 (1.40×), 16
    sequences of 265–1631 rows padded to 1631 0.591 → 0.425–0.431 (1.38×) and their varlen
    batch 0.330 → 0.292–0.301 (1.11×); the backwards and the control (4, 16, 4096, 128), whose sections the
    rule leaves alone, within noise."""
    share = l2_bytes // L2_SECTION_SHARE
    kv_head = 2 * seqlen_k * head_dim * itemsize
    q_group = 2 * group * seqlen_q * head_dim * itemsize
    kv_pairs = batch * (heads // group)
    over = FORWARD_SECTIONS_OVER if pass_ == "forward" else 1
    streams = max(1, min(batch * heads, sms) // group)  # the K/V heads the forward's or dQ's blocks stream at once
    at_once_q = streams * kv_head
    at_once_k = min(kv_pairs, sms) * q_group  # the Q/dO dK/dV's blocks stream
    if unshared and pass_ == "forward" and head_dim > 64 and sms < UNSHARED_BELOW * streams:
        over = 1  # each stream read by fewer than two blocks at once: bandwidth-bound past one L2
    section_q = group * max(1, share // max(kv_head, 1)) if at_once_q > over * l2_bytes else 0
    section_k = max(1, share // max(q_group, 1)) if pass_ != "forward" and at_once_k > l2_bytes else 0
    return section_q, section_k


def preprocess_grid(sz: Sizes, threads: int) -> tuple:
    """delta = rowsum(dO∘O): a thread per row of the arrays (varlen: the packed rows)."""
    return (cdiv(sz.rows_q, threads), sz.heads, sz.batch_arrays)


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: ``kernel[grid, threads, stream, smem](*args bound to buffers)``."""

    name: str
    kernel: Any  # the numba dispatcher
    tiles: Any
    grid: tuple  # (x, y, z): x tiles the rows a block owns, y heads, z batch; or (heads, batch, tiles)
    threads: int
    smem: int  # dynamic shared memory, bytes (0: static only)
    args: tuple  # Arg, in the kernel's parameter order
    #: (BLOCK_M, BLOCK_N, KEYS_ARE_ROWS) of the tile walk: query tiles of BLOCK_M rows against
    #: key tiles of BLOCK_N, the blocks own query tiles (forward, dQ) or key tiles (dK/dV);
    #: a block mask's visit lists are made for it (``numba_flash.flex``).  () for no walk.
    walk: tuple = ()
    #: What the kernel reads ("r") and writes ("w") in HBM, as ``(role, direction)``
    #: pairs, when not the rule of ``numba_flash.traffic.kernel_io`` (every input role
    #: read, every output role written); the split dK/dV kernels write one each.
    io: tuple = ()
    #: (query rows, key rows) of the boxes of the TMA maps (``tmaps``) when not the walk's
    #: (BLOCK_M, BLOCK_N): a paged KV cache's key tile in boxes within a page
    #: (``wgmma_forward.key_box``).  () for the walk's.
    boxes: tuple = ()
    #: The thread-block cluster's dimensions (``Variant.cluster``: the splits of a row tile
    #: along the grid's batch axis, z or, heaviest first, y); (1, 1, 1): no cluster.
    cluster: tuple = (1, 1, 1)


def cluster_dims(variant) -> tuple:
    """The thread-block cluster of a split-KV launch whose splits of a row tile form one
    (``Variant.cluster`` = S): S CTAs along the grid's batch axis (:func:`query_grid`'s
    z, or y when the row tiles run heaviest first); (1, 1, 1) otherwise."""
    S = variant.cluster if variant.split else 0
    if S <= 1:
        return (1, 1, 1)
    return (1, S, 1) if variant.heaviest_first else (1, 1, S)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: What every attention kernel takes after the softmax scale: the run-time values of the
#: variants (``numba_flash.variant.params``), the ALiBi slopes (B, H), the varlen
#: offsets and FlexAttention's ``fx`` tuple (``kernels.flex``; dummies when a feature
#: is off).
VARIANT_ARGS = (Arg("params"), Arg("alibi"), Arg("cu_seqlens_q"), Arg("cu_seqlens_k"), Arg("flex"))


def forward_args(inputs: str = "", output: str = "") -> tuple:
    """``(q, k, v, out, lse, softmax_scale, params, alibi, cu_seqlens_q, cu_seqlens_k, fx)``."""
    return (Arg("q", inputs), Arg("k", inputs), Arg("v", inputs), Arg("out", output), Arg("lse"),
            Arg("scale")) + VARIANT_ARGS  # fmt: skip


def preprocess_args(view: str = "") -> tuple:
    """``(out, dout, delta)``: delta = rowsum(dO∘O)."""
    return Arg("out", view), Arg("dout", view), Arg("delta")


def dkdv_args(inputs: str = "", outputs: str = "") -> tuple:
    """``(q, k, v, dout, lse, delta, dk, dv, softmax_scale, <VARIANT_ARGS>)``."""
    ins = tuple(Arg(r, inputs) for r in ("q", "k", "v", "dout"))
    return ins + (Arg("lse"), Arg("delta"), Arg("dk", outputs), Arg("dv", outputs), Arg("scale")) + VARIANT_ARGS


def dq_args(inputs: str = "", outputs: str = "") -> tuple:
    """``(q, k, v, dout, lse, delta, dq, softmax_scale, <VARIANT_ARGS>)``."""
    ins = tuple(Arg(r, inputs) for r in ("q", "k", "v", "dout"))
    return ins + (Arg("lse"), Arg("delta"), Arg("dq", outputs), Arg("scale")) + VARIANT_ARGS

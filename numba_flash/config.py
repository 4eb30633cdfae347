"""Tile sizes: one readable function per kernel family, all of them here.

Every tile choice is a pure function of (head dim, causal, dtype, simulator), tuned on
an H200 where a docstring says so.  :func:`choose` is what the launch plan
(``numba_flash.plan``) calls: the tuned choice, or for tuning runs an override from the
one environment variable ``NUMBA_FLASH_TILES`` (:func:`tuning_override`).

Names: ``block_m`` is always query rows and ``block_n`` key rows (per block, or per tile
a block walks); the register-blocked fp32 tiles, used with queries as rows in one
kernel and keys as rows in another, say ``rows`` and ``cols`` instead.

Families:

* **row-group fp32** (``SimtTiles``; any head dim, any alignment, fp16 read as is): a
  group of ``G`` consecutive lanes owns one row (a query row in the forward and dQ
  kernels, a key row in dK/dV); lane ``g`` owns the head-dim columns ``c·G + g``
  (interleaved: the G lanes read G consecutive words of a shared row, other groups the
  same words, a broadcast).  A dot product is a per-lane partial sum and log2(G)
  butterfly shuffles.  ``G`` is a power of two dividing d with ``d / G >= 8`` (each
  shuffle paid for by 8 FMAs).  A forward thread holds ``2·rows·d/G`` floats (q, acc):
  two rows a lane while ``d/G <= 16``.  Static shared memory is capped at 48 KiB by
  numba: K and V tiles are ``2 · block_n · d · 4`` bytes, so ``block_n`` is 64 for
  d <= 64, 32 for d <= 128 and 16 beyond, plus the padded score tile.
* **register-blocked fp32** (``BlockedTiles``; d = 64, 128, 16-byte aligned rows).
* **tensor cores** fp16/bf16 (``TcTiles``, ``TcBwdTiles``; any d, on the tiles of
  ``tc_tile_dim(d)``).
* **TF32 tensor cores** for float32 with ``allow_tf32`` (``TcTiles``, ``Tf32BwdTiles``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

SIMT_THREADS = 128  # 4 warps per block in every row-group kernel
SMEM_LIMIT = 48 * 1024  # numba's static shared arrays: 48 KiB per block
#: The tensor-core kernels' tile head dims: a head dim d (at most 256) runs on the
#: tiles of the smallest of these >= d (``tc_tile_dim``), its columns past d
#: zero-filled on load and never written.
TC_TILE_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
TF32_HEAD_DIMS = (64, 128)
BLOCKED_HEAD_DIMS = (64, 128)


# --- the override -----------------------------------------------------------------------


def tuning_override(kind: str, head_dim: int):
    """The tiles ``NUMBA_FLASH_TILES`` gives for kernel family ``kind`` at ``head_dim``,
    or None: a JSON object ``{kind: {str(head_dim): [fields after head_dim]}}``, e.g.
    ``{"tc_forward": {"128": [128, 64, 8, 1]}}`` (block_m, block_n, warps, m_tiles) or
    ``{"blocked_backward": {"64": [[128, 64, 8, 4], [128, 32, 8, 4]]}}`` (dK/dV, dQ).
    For the tuning scripts; nothing else reads the environment for tiles."""
    text = os.environ.get("NUMBA_FLASH_TILES")
    if not text:
        return None
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"NUMBA_FLASH_TILES: not JSON ({exc}): {text!r}") from None
    return table.get(kind, {}).get(str(head_dim))


def choose(kind: str, head_dim: int, causal: bool = False, dtype: str = "float32", simulator: bool = False):
    """The tiles of kernel family ``kind`` ("simt_forward", "simt_backward",
    "blocked_forward", "blocked_backward", "tc_forward", "tc_decode", "tc_backward",
    "tf32_forward", "tf32_backward"): :func:`tuning_override` if set, else the tuned choice."""
    fields = tuning_override(kind, head_dim)
    if fields is not None:
        if kind == "blocked_backward":
            return BlockedTiles(head_dim, *fields[0]), BlockedTiles(head_dim, *fields[1])
        return _TILE_CLASS[kind](head_dim, *fields)
    if kind.startswith("simt"):
        return _CHOICE[kind](head_dim)
    if kind.startswith("blocked"):
        return _CHOICE[kind](head_dim, causal, simulator)
    if kind.startswith("tc"):
        return _CHOICE[kind](head_dim, causal, dtype)
    return _CHOICE[kind](head_dim, causal)


# --- row-group fp32 ---------------------------------------------------------------------


@dataclass(frozen=True)
class SimtTiles:
    """Compile-time tiles of a row-group fp32 kernel.

    Attributes:
        head_dim: d, the length of a q/k/v row.
        group: G, lanes that share one row (power of two, divides d).
        lane_cols: d / G, columns of a row held by one lane.
        lane_rows: rows per lane group (2 in the forward while d/G <= 16, else 1).
        block_m: query rows per block (forward, dQ) or per shared tile (dK/dV).
        block_n: key rows per shared tile (forward, dQ) or per block (dK/dV).
        threads: threads per block.
        data_dim: the arrays' head dim when it is less than ``head_dim`` (a head dim
            that is not a multiple of 8 runs on tiles of the next multiple of 8: the
            columns past it are zero on load and never written); 0: ``head_dim``.
    """

    head_dim: int
    group: int
    lane_cols: int
    lane_rows: int
    block_m: int
    block_n: int
    threads: int = SIMT_THREADS
    data_dim: int = 0


def _group(head_dim: int) -> int:
    g = 8
    while g > 1 and head_dim // g < 8:
        g //= 2
    return g


def _simt_tile_rows(head_dim: int) -> int:
    if head_dim <= 64:
        return 64
    if head_dim <= 128:
        return 32
    return 16


def simt_forward_tiles(head_dim: int) -> SimtTiles:
    """Tiles of the row-group forward: K and V tiles of ``block_n`` keys and a padded
    score tile ``block_m × (block_n + 1)`` in static shared memory, under 48 KiB."""
    g = _group(head_dim)
    cols = head_dim // g
    rows = 2 if cols <= 16 else 1
    block_m, block_n = rows * SIMT_THREADS // g, _simt_tile_rows(head_dim)
    while 4 * (2 * block_n * head_dim + block_m * (block_n + 1)) > SMEM_LIMIT:  # small d: a narrower tile
        block_n //= 2
    return SimtTiles(head_dim, g, cols, rows, block_m, block_n)


def simt_backward_tiles(head_dim: int) -> tuple[SimtTiles, SimtTiles]:
    """(dK/dV tiles, dQ tiles) of the row-group backward: one row per lane group, so a
    dK/dV block owns ``threads / G`` keys and walks query tiles, a dQ block owns
    ``threads / G`` queries and walks key tiles, both tiles of 64, 32 or 16 rows."""
    g = _group(head_dim)
    cols = head_dim // g
    per_block, tile = SIMT_THREADS // g, _simt_tile_rows(head_dim)
    return SimtTiles(head_dim, g, cols, 1, tile, per_block), SimtTiles(head_dim, g, cols, 1, per_block, tile)


# --- register-blocked fp32 ---------------------------------------------------------------


@dataclass(frozen=True)
class BlockedTiles:
    """Compile-time tiles of the register-blocked fp32 kernels (``kernels.microtile``).

    A block of ``threads = (rows / tm) · (cols / tn)`` threads computes a ``rows × cols``
    score-shaped tile: queries × keys in the forward and dQ kernels (rows = block_m,
    cols = block_n), keys × queries in dK/dV (rows = block_n, cols = block_m).  Thread
    (ty, tx) owns a ``tm × tn`` register micro-tile of it and the matching ``tm × d/TX``
    slice of the output accumulator; the TX = cols / tn threads of a row are
    consecutive lanes of one warp.

    Attributes:
        head_dim: d (a multiple of 4·TX).
        rows: rows of the score-shaped tile a block owns.
        cols: columns per tile it walks.
        tm, tn: the register micro-tile (tm a multiple of 4: P is read as 16-byte vectors).
    """

    head_dim: int
    rows: int
    cols: int
    tm: int
    tn: int

    def __post_init__(self):
        tx, ty = self.cols // self.tn, self.rows // self.tm
        ok = (
            tx * self.tn == self.cols
            and ty * self.tm == self.rows
            and tx in (1, 2, 4, 8, 16, 32)
            and self.tm % 4 == 0
            and self.head_dim % (4 * tx) == 0
        )
        if not ok:
            raise ValueError(f"inconsistent register-blocked tiles {self}")

    @property
    def tx(self) -> int:
        return self.cols // self.tn

    @property
    def ty(self) -> int:
        return self.rows // self.tm

    @property
    def threads(self) -> int:
        return self.tx * self.ty


#: (rows, cols, tm, tn) on a GPU, tuned on the H200 (scripts/tune_fp32_tiles.py,
#: docs/benchmarks/fp32.md): d = 64 32.4 / 29.8 TFLOP/s (full / causal) where 128 × 64
#: gave 27.8 / 26.5; d = 128 34.0 / 30.7 where 64 × 32 gave 30.1 / 28.4.
BLOCKED_FORWARD_GPU = {64: (128, 32, 8, 4), 128: (128, 64, 8, 4)}
#: (dK/dV tiles, dQ tiles) on a GPU (scripts/tune_fp32_bwd_tiles.py)
BLOCKED_BACKWARD_GPU = {64: ((128, 64, 8, 4), (128, 32, 8, 4)), 128: ((64, 64, 4, 4), (64, 32, 4, 4))}
#: The simulator's cost grows with the tile, not the problem: small tiles there (same
#: code; the GPU tests cover the real tiles).
BLOCKED_SIMULATOR = (16, 16, 4, 2)


def _check_blocked(head_dim: int):
    if head_dim not in BLOCKED_HEAD_DIMS:
        raise ValueError(f"head_dim: the register-blocked fp32 kernels support {BLOCKED_HEAD_DIMS}, got {head_dim}")


def blocked_forward_tiles(head_dim: int, causal: bool = False, simulator: bool = False) -> BlockedTiles:
    """Tiles of the register-blocked fp32 forward.

    An 8 × 4 micro-tile: per 4 steps of the head dimension a thread issues 8 + 4
    16-byte shared loads for 128 FMAs, and per key of P·V 2 + d/(4·TX) loads for 8·d/TX
    FMAs.  Tuned on the H200: d = 128 takes 128 × 64 tiles of 256 threads (164 KiB of
    shared memory, one block an SM), d = 64 128 × 32 tiles of 128 threads (67 KiB,
    three blocks an SM)."""
    _check_blocked(head_dim)
    return BlockedTiles(head_dim, *(BLOCKED_SIMULATOR if simulator else BLOCKED_FORWARD_GPU[head_dim]))


def blocked_backward_tiles(head_dim: int, causal: bool = False, simulator: bool = False):
    """(dK/dV tiles, dQ tiles) of the register-blocked fp32 backward.

    dK/dV: ``rows`` keys a block, query tiles of ``cols``; a thread holds dK and dV
    (2·tm·d/TX floats) and Sᵀ, dPᵀ (2·tm·tn).  dQ: ``rows`` queries, key tiles of
    ``cols``; dQ (tm·d/TX) and S, dP.  Registers are the limit: at d = 128 the dK/dV
    kernel needs 254 with 64 × 64 tiles of 4 × 4 (256 threads), so 8 × 4 micro-tiles
    fit only at d = 64."""
    _check_blocked(head_dim)
    if simulator:
        return BlockedTiles(head_dim, *BLOCKED_SIMULATOR), BlockedTiles(head_dim, *BLOCKED_SIMULATOR)
    kv, q = BLOCKED_BACKWARD_GPU[head_dim]
    return BlockedTiles(head_dim, *kv), BlockedTiles(head_dim, *q)


# --- tensor cores: fp16 / bf16 ------------------------------------------------------------


def tc_tile_dim(head_dim: int) -> int:
    """The tensor-core tile head dim for ``head_dim``: the smallest of ``TC_TILE_DIMS``
    that holds it."""
    for t in TC_TILE_DIMS:
        if head_dim <= t:
            return t
    raise ValueError(f"head_dim: the tensor-core kernels support up to {TC_TILE_DIMS[-1]}, got {head_dim}")


@dataclass(frozen=True)
class TcTiles:
    """Compile-time tile shape of the tensor-core forward (mma.sync m16n8k16).

    Attributes:
        head_dim: the tile's d (one of ``TC_TILE_DIMS``; 64 or 128 for TF32).
        block_m: query rows per block = 16 · m_tiles · warps.
        block_n: keys per K/V tile.
        warps: warps per block.
        m_tiles: 16-row m-tiles per warp (each K/V fragment feeds m_tiles mma).
        stages: K/V shared-memory buffers, 2 to 4: the copies run ``stages − 1`` tiles
            ahead of the tile in use (``kernels.pipeline.wait_for_stage``).
        q_in_regs: each warp keeps its Q fragments in registers (d/4 words a lane per
            m-tile); else it reads them from the shared Q tile at every k-slice (head
            dims past 128, where the registers hold the d/2 output floats instead).
        data_dim: the arrays' d when less than ``head_dim`` (columns past it are
            zero-filled on load and never written); 0: ``head_dim``.
        aligned: the input rows start on 16-byte boundaries (cp.async); else the
            tiles are filled by plain loads (a head dim that is not a multiple of 8,
            or odd strides).
    """

    head_dim: int
    block_m: int
    block_n: int
    warps: int
    m_tiles: int = 1
    stages: int = 2
    q_in_regs: bool = True
    data_dim: int = 0
    aligned: bool = True

    def __post_init__(self):
        if self.block_m != 16 * self.m_tiles * self.warps:
            raise ValueError(f"block_m={self.block_m} must be 16 · m_tiles · warps = {16 * self.m_tiles * self.warps}")
        if not 2 <= self.stages <= 4:
            raise ValueError(f"stages={self.stages}: expected 2 to 4")

    @property
    def threads(self) -> int:
        return 32 * self.warps


def _check_tc(head_dim: int, what: str, dims=TC_TILE_DIMS):
    if head_dim not in dims:
        raise ValueError(f"head_dim: the {what} supports {dims}, got {head_dim}")


def tc_forward_tiles(head_dim: int, causal: bool = False, dtype: str = "float16") -> TcTiles:
    """Tiles of the tensor-core forward.

    Tuned on the H200 (scripts/tune_tc_tiles.py, docs/benchmarks/tc-forward.md): at
    d = 64 four warps of two m-tiles (32 rows each: every K/V fragment feeds two mma:
    0.74-0.79× FA2 where 4 × 1 gave 0.64-0.71×); at d = 128 eight warps of 16 rows (K/V
    tiles shared by 128 queries: 0.645× where 64 × 64 × 4 gave 0.585×) since two m-tiles
    do not fit the registers with Q held in them.  K/V tiles of BLOCK_N keys are
    double-buffered in dynamic shared memory.  The limits: registers (a lane holds
    d/16·4 Q words, BLOCK_N/2 S floats and d/2 O floats) and shared memory per SM
    (228 KiB, so at most two 80 KiB blocks at d = 128).  Causal and dtype do not change
    the choice today.  32 runs as 64.  At d = 96 four warps of two m-tiles with Q read
    from shared memory at every k-slice (H200, scripts/bench_head_dims.py: 0.70 / 0.68×
    FA2 full / causal where 128 × 64 × 8 warps with Q in registers gave 0.58 / 0.59×,
    and 128 × 128 × 8 warps 0.56×; 254 registers, no spills).  Past 128 eight warps of
    16 rows with Q read from shared memory at every k-slice (a lane holds d/2 O floats
    and BLOCK_N/2 S floats: 160 at d = 256), in 64 KiB (Q) + 128 KiB (two K/V stages) of
    shared memory at d = 256."""
    _check_tc(head_dim, "tensor-core forward")
    if head_dim <= 64:
        return TcTiles(head_dim, block_m=128, block_n=64, warps=4, m_tiles=2)
    if head_dim <= 96:  # Q from shared memory frees the registers for two m-tiles
        return TcTiles(head_dim, block_m=128, block_n=64, warps=4, m_tiles=2, q_in_regs=False)
    if head_dim <= 128:
        return TcTiles(head_dim, block_m=128, block_n=64, warps=8)
    return TcTiles(head_dim, block_m=128, block_n=64, warps=8, q_in_regs=False)


#: Query rows (per sequence, or a GQA group's decode rows) up to which the tensor-core
#: forward runs on :func:`tc_decode_tiles` (``numba_flash.plan``).
DECODE_ROWS = 16


def tc_decode_tiles(head_dim: int, causal: bool = False, dtype: str = "float16") -> TcTiles:
    """Tiles of the tensor-core forward for at most ``DECODE_ROWS`` query rows (decoding
    against a KV cache: one new token, or a GQA group's heads as rows).

    One warp of one 16-row m-tile: the 128-row tiles of :func:`tc_forward_tiles` would
    run eight warps of mma on rows that do not exist, and the step would be bound by
    tensor-core work instead of by reading K and V.  A block is then 32 threads with
    Q (16 rows) and ``stages`` K/V buffers of ``block_n`` keys in shared memory, the
    copies running ``stages − 1`` tiles ahead.  On the H200 (B = 8, 32/8 heads,
    d = 128, 131072 keys, docs/benchmarks/2026-12-02-s9), once a tile's page is looked
    up once (``copy.page_of``): 32 keys and three stages (52 KiB, four blocks an SM)
    reach 0.97 of the copy bandwidth, two stages 0.82, 16 keys and four stages 0.71.
    The parallelism comes from split-KV (``kvcache.split_count``), not from more rows."""
    _check_tc(head_dim, "tensor-core forward")
    return TcTiles(head_dim, block_m=16, block_n=32, warps=1, stages=3, q_in_regs=head_dim <= 128)


def tc_array_layout(t) -> tuple:
    """``(DCOLS, NT_W, SYNC, HALVES)``: how the tensor-core kernels of tiles ``t``
    (``TcTiles`` or ``TcBwdTiles``) meet arrays of head dim ``t.data_dim``: the arrays'
    row length when shorter than the tile's (0: as long; ``copy.copy_rows`` zero-fills
    past it), the 8-column n-tiles an output row spans, whether rows are copied by plain
    loads (not 16-byte aligned) and whether outputs are stored 16 bits at a time (an odd
    head dim: a uint16 view, ``tc_out_view``)."""
    data_dim = t.data_dim or t.head_dim
    return (0 if data_dim == t.head_dim else data_dim), -(-data_dim // 8), not t.aligned, data_dim % 2 == 1


def tc_out_view(t) -> str:
    """How the tensor-core kernels of tiles ``t`` see their outputs: pairs of 16-bit
    values as "u32", or "u16" for an odd head dim."""
    return "u16" if tc_array_layout(t)[3] else "u32"


@dataclass(frozen=True)
class TcBwdTiles:
    """Compile-time tiles of the tensor-core backward (dK/dV and dQ kernels).

    Attributes:
        head_dim: the tile's d (one of ``TC_TILE_DIMS``).
        warps: warps per block; each owns 16 rows (keys in dK/dV, queries in dQ).
        kv_block_m: queries per Q/dO tile walked by a dK/dV block (of 16·warps keys).
        q_block_n: keys per K/V tile walked by a dQ block (of 16·warps queries).
        kv_frags_in_regs: dK/dV keeps its K and V fragments in registers (else re-reads
            them from shared memory for every query tile).
        q_frags_in_regs: dQ keeps its Q and dO fragments in registers (else re-reads
            them from shared memory for every key tile).
        split_dkdv: dK and dV come from two kernels, one accumulator each (head dims
            past 128, where a lane cannot hold the d floats of both; the dV kernel
            skips dP, the dK kernel recomputes P).
        data_dim, aligned: as ``TcTiles``'s.
    """

    head_dim: int
    warps: int
    kv_block_m: int
    q_block_n: int
    kv_frags_in_regs: bool
    q_frags_in_regs: bool = True
    split_dkdv: bool = False
    data_dim: int = 0
    aligned: bool = True

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def kv_block_n(self) -> int:
        return 16 * self.warps

    @property
    def q_block_m(self) -> int:
        return 16 * self.warps


def tc_backward_tiles(head_dim: int, causal: bool = False, dtype: str = "float16") -> TcBwdTiles:
    """Tiles of the tensor-core backward.

    Registers are the limit: a dK/dV lane holds dK and dV (d floats) plus Sᵀ and dPᵀ
    (kv_block_m / 2 floats) plus, at d = 64, the K and V fragments (d / 4 words); a dQ
    lane holds Q and dO fragments (d / 4), S and dP (q_block_n / 2) and dQ (d / 2).  At
    d = 128 the K/V fragments stay in shared memory and the tiles are 32 wide, keeping
    both kernels near 160 registers a lane.  32 runs as 64.  At 96 the tiles are 64 wide
    (H200, scripts/sweep_tc_bwd.sh, non-causal N = 4096: 0.591× FA2 where 32 × 32 gave
    0.566× and eight warps 0.575×; 252 / 255 registers, no spills).  Past 128, dK and
    dV come from two kernels (``split_dkdv``: 9 products instead of 7) and dQ reads its
    Q and dO fragments from shared memory: a lane then holds d/2 accumulator floats
    and the S and dP of its tile; dK/dV walks query tiles of 64 (d = 256: 0.436× FA2
    where 32 gave 0.382×)."""
    _check_tc(head_dim, "tensor-core backward")
    if head_dim <= 64:
        return TcBwdTiles(head_dim, warps=4, kv_block_m=64, q_block_n=64, kv_frags_in_regs=True)
    if head_dim <= 96:
        return TcBwdTiles(head_dim, warps=4, kv_block_m=64, q_block_n=64, kv_frags_in_regs=False)
    if head_dim <= 128:
        return TcBwdTiles(head_dim, warps=4, kv_block_m=32, q_block_n=32, kv_frags_in_regs=False)
    return TcBwdTiles(head_dim, warps=4, kv_block_m=64, q_block_n=32, kv_frags_in_regs=False, q_frags_in_regs=False,
                      split_dkdv=True)


# --- TF32 tensor cores: float32 with allow_tf32 -------------------------------------------


def tf32_forward_tiles(head_dim: int, causal: bool = False) -> TcTiles:
    """Tiles of the TF32 forward (``TcTiles`` with one m-tile a warp; d a multiple of 32
    and block_n of 8, as its operand layout needs).

    Four warps of 16 rows.  A lane holds d/2 Q words (tf32), BLOCK_N/2 S floats and d/2
    O floats: 96 at d = 64 with BLOCK_N = 64, 144 at d = 128 with BLOCK_N = 32.  fp32
    tiles take twice the shared memory of fp16 ones: 80 KiB (d = 64) and 96 KiB
    (d = 128), two blocks per SM within Hopper's 228 KiB.  Not yet tuned on hardware."""
    _check_tc(head_dim, "TF32 forward", TF32_HEAD_DIMS)
    if head_dim == 64:
        return TcTiles(64, block_m=64, block_n=64, warps=4)
    return TcTiles(128, block_m=64, block_n=32, warps=4)


@dataclass(frozen=True)
class Tf32BwdTiles:
    """Compile-time tiles of the TF32 backward (mma.sync m16n8k8).

    Attributes:
        head_dim: d (64 or 128).
        kv_block_m: queries per tile a dK/dV block walks.
        kv_block_n: keys per dK/dV block = 16 · warps (a warp owns 16 keys).
        q_block_m: queries per dQ block = 16 · warps (a warp owns 16 queries).
        q_block_n: keys per tile a dQ block walks.
        warps: warps per block (both kernels).
    """

    head_dim: int
    kv_block_m: int
    kv_block_n: int
    q_block_m: int
    q_block_n: int
    warps: int = 4

    def __post_init__(self):
        if self.kv_block_n != 16 * self.warps or self.q_block_m != 16 * self.warps:
            raise ValueError(
                f"kv_block_n={self.kv_block_n} and q_block_m={self.q_block_m} must be 16 · warps = {16 * self.warps}"
            )
        if self.head_dim % 32 or self.kv_block_m % 8 or self.q_block_n % 8:
            raise ValueError(
                f"head_dim={self.head_dim} must be a multiple of 32, kv_block_m={self.kv_block_m} "
                f"and q_block_n={self.q_block_n} of 8"
            )

    @property
    def threads(self) -> int:
        return 32 * self.warps


def tf32_backward_tiles(head_dim: int, causal: bool = False) -> Tf32BwdTiles:
    """Tiles of the TF32 backward.

    Four warps of 16 rows.  A dK/dV lane holds d/2 dK and d/2 dV floats plus
    kv_block_m/2 each of Sᵀ and dPᵀ: 128 at d = 64 with 64-query tiles, 160 at d = 128
    with 32-query tiles; a dQ lane d/2 dQ floats plus q_block_n/2 each of S and dP.
    The shared memory (96 KiB at d = 64, 128 KiB at d = 128) lets one or two blocks
    share an SM.  Not yet tuned on hardware."""
    _check_tc(head_dim, "TF32 backward", TF32_HEAD_DIMS)
    if head_dim == 64:
        return Tf32BwdTiles(64, kv_block_m=64, kv_block_n=64, q_block_m=64, q_block_n=64)
    return Tf32BwdTiles(128, kv_block_m=32, kv_block_n=64, q_block_m=64, q_block_n=32)


_TILE_CLASS = {
    "simt_forward": SimtTiles, "blocked_forward": BlockedTiles, "tc_forward": TcTiles, "tc_decode": TcTiles,
    "tc_backward": TcBwdTiles,
    "tf32_forward": TcTiles, "tf32_backward": Tf32BwdTiles,
}  # fmt: skip
_CHOICE = {
    "simt_forward": simt_forward_tiles, "simt_backward": simt_backward_tiles,
    "blocked_forward": blocked_forward_tiles, "blocked_backward": blocked_backward_tiles,
    "tc_forward": tc_forward_tiles, "tc_decode": tc_decode_tiles, "tc_backward": tc_backward_tiles,
    "tf32_forward": tf32_forward_tiles, "tf32_backward": tf32_backward_tiles,
}  # fmt: skip

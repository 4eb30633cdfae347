"""Tile sizes: one readable function per kernel family, of (head dim, dtype, causal).

The fp32 SIMT kernels map a *group* of ``G`` consecutive lanes onto one row (a query
row in the forward and dQ kernels, a key row in the dK/dV kernel).  Lane ``g`` of a
group owns the columns ``c·G + g`` for ``c = 0 .. COLS-1`` (interleaved, so the G lanes
of a group read G consecutive words of a shared-memory row: no bank conflict, and the
other groups of the warp read the same words: a broadcast).  A dot product over the
head dimension is a partial sum per lane, then ``log2(G)`` butterfly shuffles.

Limits that shape the choice:
- ``G`` is a power of two that divides the head dim (head dims are multiples of 8, so
  ``G <= 8`` always divides) and keeps ``COLS = d / G >= 8`` so each shuffle is paid for
  by at least 8 FMAs.
- registers: a forward thread holds ``2·ROWS·COLS`` floats (q and acc); we allow
  ``ROWS = 2`` while ``COLS <= 16`` (d <= 128) and 1 beyond.  A backward thread holds
  ``4·COLS`` (k, v, dk, dv or q, dO, dq).
- static shared memory is capped at 48 KiB per block in numba: K and V tiles are
  ``2 · BLOCK_N · d · 4`` bytes, so ``BLOCK_N = 64`` for d <= 64, 32 for d <= 128 and
  16 beyond (32 KiB at most), plus a padded score tile of ``BLOCK_M · (BLOCK_N + 1)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

THREADS = 128  # 4 warps per block in every fp32 kernel


@dataclass(frozen=True)
class SimtTiles:
    """Compile-time tile shape of an fp32 SIMT kernel.

    Attributes:
        head_dim: d, the length of a q/k/v row.
        group: G, lanes that share one row (power of two, divides d).
        cols: d / G, columns of a row held by one lane.
        rows: rows per lane (register blocking of the forward; 1 in the backward).
        block_m: query rows per block = rows · THREADS / G (forward, dQ).
        block_n: key rows per shared-memory tile (forward, dQ) or per block (dK/dV).
        threads: threads per block.
    """

    head_dim: int
    group: int
    cols: int
    rows: int
    block_m: int
    block_n: int
    threads: int = THREADS


def _group(head_dim: int) -> int:
    g = 8
    while g > 1 and head_dim // g < 8:
        g //= 2
    return g


def _block_n(head_dim: int) -> int:
    if head_dim <= 64:
        return 64
    if head_dim <= 128:
        return 32
    return 16


SMEM_LIMIT = 48 * 1024  # numba's static shared arrays: 48 KiB per block


def forward_smem_bytes(t: SimtTiles) -> int:
    """K tile + V tile + the padded score tile, fp32."""
    return 4 * (2 * t.block_n * t.head_dim + t.block_m * (t.block_n + 1))


def simt_forward_tiles(head_dim: int) -> SimtTiles:
    """Tiles of the fp32 forward kernel for head dim ``head_dim``."""
    g = _group(head_dim)
    cols = head_dim // g
    rows = 2 if cols <= 16 else 1
    t = SimtTiles(head_dim, g, cols, rows, rows * THREADS // g, _block_n(head_dim))
    while forward_smem_bytes(t) > SMEM_LIMIT:  # small d: many rows, so a narrower tile
        t = SimtTiles(head_dim, g, cols, rows, t.block_m, t.block_n // 2)
    return t


def simt_backward_tiles(head_dim: int) -> SimtTiles:
    """Tiles of the fp32 backward kernels (dQ, dK/dV) for head dim ``head_dim``.

    One row per lane group: a dK/dV block owns ``THREADS / G`` key rows and walks the
    query tiles of ``block_n`` rows (named by what they tile: here queries);
    a dQ block owns ``THREADS / G`` query rows and walks key tiles of ``block_n`` rows.
    """
    g = _group(head_dim)
    cols = head_dim // g
    return SimtTiles(head_dim, g, cols, 1, THREADS // g, _block_n(head_dim))


# --- tensor-core (fp16 / bf16) kernels ---------------------------------------------


@dataclass(frozen=True)
class TcTiles:
    """Compile-time tile shape of a tensor-core kernel (mma.sync m16n8k16).

    Attributes:
        head_dim: d (64 or 128).
        block_m: query rows per block = 16 · m_tiles · warps.
        block_n: keys per K/V tile.
        warps: warps per block.
        stages: K/V shared-memory buffers (2: tile j+1 is copied while j is used).
        m_tiles: 16-row m-tiles per warp (each K/V fragment feeds m_tiles mma).
    """

    head_dim: int
    block_m: int
    block_n: int
    warps: int
    stages: int = 2
    m_tiles: int = 1

    def __post_init__(self):
        if self.block_m != 16 * self.m_tiles * self.warps:
            raise ValueError(f"block_m={self.block_m} must be 16 · m_tiles · warps = {16 * self.m_tiles * self.warps}")

    @property
    def threads(self) -> int:
        return 32 * self.warps


TC_HEAD_DIMS = (64, 128)
TF32_HEAD_DIMS = (64, 128)  # float32 with allow_tf32=True: kernels/tf32_forward.py, tf32_backward.py


def tc_smem_bytes(t: TcTiles) -> int:
    """Q tile + ``stages`` K tiles + ``stages`` V tiles, 2 bytes an element."""
    return 2 * t.head_dim * (t.block_m + 2 * t.stages * t.block_n)


def tc_forward_tiles(head_dim: int, causal: bool = False, dtype: str = "float16") -> TcTiles:
    """Tiles of the tensor-core forward.

    Tuned on the H200 (scripts/tune_tc_tiles.py, docs/benchmarks/tc-forward.md): at
    d = 64 four warps of two m-tiles (32 rows each: every K/V fragment feeds two mma);
    at d = 128 eight warps of 16 rows (K/V tiles shared by 128 queries) since two
    m-tiles do not fit the registers with Q held in them.  K/V tiles of BLOCK_N keys
    are double-buffered in dynamic shared memory.  The limits: registers (a lane holds d/16·4 Q words, BLOCK_N/2 S floats and
    d/2 O floats: 112 at d = 128, BLOCK_N = 64) and shared memory per SM (228 KiB, so
    at most two 80 KiB blocks at d = 128).  Causal and dtype do not change the choice
    today (they are arguments so that a tuned table can).
    """
    if head_dim not in TC_HEAD_DIMS:
        raise ValueError(f"head_dim: the tensor-core forward supports {TC_HEAD_DIMS}, got {head_dim}")
    override = os.environ.get("NUMBA_FLASH_TC_TILES")  # tuning runs: {"64": [bm, bn, warps, m_tiles]}
    if override and str(head_dim) in json.loads(override):
        bm, bn, warps, m_tiles = json.loads(override)[str(head_dim)]
        return TcTiles(head_dim, bm, bn, warps, m_tiles=m_tiles)
    if head_dim == 64:  # 4 warps × 2 m-tiles: 0.74-0.79× FA2 where 4 × 1 gave 0.64-0.71×
        return TcTiles(64, block_m=128, block_n=64, warps=4, m_tiles=2)
    return TcTiles(head_dim, block_m=128, block_n=64, warps=8)  # 0.645× where 64×64×4 gave 0.585×


@dataclass(frozen=True)
class TcBwdTiles:
    """Compile-time tiles of the tensor-core backward (dkdv and dq kernels).

    Attributes:
        head_dim: d (64 or 128).
        warps: warps per block; each owns 16 rows (keys in dkdv, queries in dq).
        kv_block_m: queries per Q/dO tile walked by a dkdv block (16·warps keys).
        q_block_n: keys per K/V tile walked by a dq block (16·warps queries).
        kv_frags_in_regs: dkdv keeps its K and V fragments in registers (else re-reads
            them from shared memory for every query tile).
    """

    head_dim: int
    warps: int
    kv_block_m: int
    q_block_n: int
    kv_frags_in_regs: bool

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def kv_block_n(self) -> int:
        return 16 * self.warps

    @property
    def q_block_m(self) -> int:
        return 16 * self.warps


def tc_bwd_smem_bytes(t: TcBwdTiles) -> tuple[int, int]:
    """Dynamic shared bytes of (dkdv, dq): dkdv holds K, V and two stages of Q and dO;
    dq holds Q, dO and two stages of K and V (2-byte elements)."""
    row = 2 * t.head_dim
    return row * (2 * t.kv_block_n + 4 * t.kv_block_m), row * (2 * t.q_block_m + 4 * t.q_block_n)


def tc_backward_tiles(head_dim: int, causal: bool = False, dtype: str = "float16") -> TcBwdTiles:
    """Tiles of the tensor-core backward.

    Registers are the limit: a dkdv lane holds dK and dV (d floats) plus Sᵀ and dPᵀ
    (kv_block_m / 2 floats) plus, at d = 64, the K and V fragments (d / 4 words); a dq
    lane holds Q and dO fragments (d / 4), S and dP (q_block_n / 2) and dQ (d / 2).  At
    d = 128 the K/V fragments stay in shared memory and the tiles are 32 wide, keeping
    both kernels near 160 registers a lane.
    """
    if head_dim not in TC_HEAD_DIMS:
        raise ValueError(f"head_dim: the tensor-core backward supports {TC_HEAD_DIMS}, got {head_dim}")
    if head_dim == 64:
        return TcBwdTiles(64, warps=4, kv_block_m=64, q_block_n=64, kv_frags_in_regs=True)
    return TcBwdTiles(head_dim, warps=4, kv_block_m=32, q_block_n=32, kv_frags_in_regs=False)


# --- register-blocked fp32 (SGEMM-style) kernels ------------------------------------


@dataclass(frozen=True)
class BlockedTiles:
    """Compile-time tiles of the register-blocked fp32 kernels.

    A block of ``threads = (block_m / tm) · (block_n / tn)`` threads computes a
    ``block_m × block_n`` score tile; thread (ty, tx) owns a ``tm × tn`` register
    micro-tile of it (rows ``ty + i·TY``, keys ``tx + j·TX``, interleaved so that the
    threads of a warp read different shared-memory banks) and the matching
    ``tm × d/TX`` slice of the output accumulator.  The TX = block_n / tn threads of a
    row are consecutive lanes of one warp, so a row's max and sum are finished with
    log2(TX) shuffles.

    Attributes:
        head_dim: d (a multiple of 4·TX).
        block_m: query rows per block (forward) / key rows per block (dK/dV).
        block_n: key columns per tile (forward) / query columns per tile (dK/dV).
        tm, tn: the register micro-tile (tm a multiple of 4: P is read as 16-byte vectors).
    """

    head_dim: int
    block_m: int
    block_n: int
    tm: int
    tn: int

    def __post_init__(self):
        tx, ty = self.block_n // self.tn, self.block_m // self.tm
        ok = (
            tx * self.tn == self.block_n
            and ty * self.tm == self.block_m
            and tx in (1, 2, 4, 8, 16, 32)
            and self.tm % 4 == 0
            and self.head_dim % (4 * tx) == 0
        )
        if not ok:
            raise ValueError(f"inconsistent register-blocked tiles {self}")

    @property
    def tx(self) -> int:
        return self.block_n // self.tn

    @property
    def ty(self) -> int:
        return self.block_m // self.tm

    @property
    def threads(self) -> int:
        return self.tx * self.ty


BLOCKED_HEAD_DIMS = (64, 128)
#: (block_m, block_n, tm, tn) on a GPU, tuned on the H200 (scripts/tune_fp32_tiles.py,
#: docs/benchmarks/fp32.md): d = 64 32.4 / 29.8 TFLOP/s (full / causal) where 128 × 64
#: gave 27.8 / 26.5; d = 128 34.0 / 30.7 where 64 × 32 gave 30.1 / 28.4.
BLOCKED_FORWARD_GPU = {64: (128, 32, 8, 4), 128: (128, 64, 8, 4)}
#: (dK/dV tiles, dQ tiles) on a GPU (scripts/tune_fp32_bwd_tiles.py)
BLOCKED_BACKWARD_GPU = {64: ((128, 64, 8, 4), (128, 32, 8, 4)), 128: ((64, 64, 4, 4), (64, 32, 4, 4))}


def blocked_forward_smem_bytes(t: BlockedTiles) -> int:
    """Q (block_m rows) and K (block_n rows) padded by 4 floats a row (16-byte reads of
    rows i and i+1 fall on different banks), V unpadded, Pᵀ (block_n × (block_m + 4))."""
    d = t.head_dim
    return 4 * (t.block_m * (d + 4) + t.block_n * (d + 4) + t.block_n * d + t.block_n * (t.block_m + 4))


def blocked_forward_tiles(head_dim: int, causal: bool = False) -> BlockedTiles:
    """Tiles of the register-blocked fp32 forward.

    An 8 × 4 micro-tile: per 4 steps of the head dimension a thread issues 8 + 4
    16-byte shared loads for 128 FMAs, and per key of P·V 2 + d/(4·TX) loads for 8·d/TX
    FMAs.  Tuned on the H200 (``scripts/tune_fp32_tiles.py``,
    docs/benchmarks/fp32-forward.md): d = 128 takes 128 × 64 tiles of 256 threads
    (164 KiB of shared memory, one block an SM, 253 registers), d = 64 128 × 32 tiles
    of 128 threads (67 KiB, three blocks an SM, 229 registers).  The simulator gets 16 × 16 tiles of 32
    threads (same code, tests run in seconds; the GPU tests cover the real tiles).
    ``NUMBA_FLASH_FP32_TILES``
    (``{"128": [block_m, block_n, tm, tn]}``) overrides it for tuning runs.
    """
    if head_dim not in BLOCKED_HEAD_DIMS:
        raise ValueError(f"head_dim: the register-blocked fp32 kernels support {BLOCKED_HEAD_DIMS}, got {head_dim}")
    override = os.environ.get("NUMBA_FLASH_FP32_TILES")
    if override and str(head_dim) in json.loads(override):
        return BlockedTiles(head_dim, *json.loads(override)[str(head_dim)])
    from numba_flash._numba_cuda import SIMULATOR

    if SIMULATOR:  # the simulator's cost grows with the tile, not the problem: small tiles
        return BlockedTiles(head_dim, block_m=16, block_n=16, tm=4, tn=2)
    return BlockedTiles(head_dim, *BLOCKED_FORWARD_GPU[head_dim])


def blocked_bwd_layout(t: BlockedTiles) -> tuple[int, int, int]:
    """(padded row of d floats, one thread's slot in a P/dS row, P/dS row) of the
    register-blocked backward kernels, in floats."""
    return t.head_dim + 4, t.tm, t.ty * t.tm + 4


def blocked_dkdv_smem_bytes(t: BlockedTiles) -> int:
    """K, V (block_m rows), Q, dO (block_n rows), Pᵀ, dSᵀ (block_n rows), lse, delta."""
    rs, _, ps = blocked_bwd_layout(t)
    return 4 * (2 * t.block_m * rs + 2 * t.block_n * rs + 2 * t.block_n * ps + 2 * t.block_n)


def blocked_dq_smem_bytes(t: BlockedTiles) -> int:
    """Q, dO (block_m rows), K, V (block_n rows), dSᵀ (block_n rows)."""
    rs, _, ps = blocked_bwd_layout(t)
    return 4 * (2 * t.block_m * rs + 2 * t.block_n * rs + t.block_n * ps)


def blocked_backward_tiles(head_dim: int, causal: bool = False) -> tuple[BlockedTiles, BlockedTiles]:
    """(dK/dV tiles, dQ tiles) of the register-blocked fp32 backward.

    dK/dV: block_m keys a block, query tiles of block_n; a thread holds dK and dV
    (2·tm·d/TX floats) and Sᵀ, dPᵀ (2·tm·tn).  dQ: block_m queries, key tiles of
    block_n; dQ (tm·d/TX) and S, dP.  Registers are the limit: at d = 128 the dK/dV
    kernel needs 254 with 64 × 64 tiles of 4 × 4 (256 threads), so 8 × 4 micro-tiles
    fit only at d = 64.  ``NUMBA_FLASH_FP32_BWD_TILES``
    (``{"128": [[dkdv bm, bn, tm, tn], [dq bm, bn, tm, tn]]}``) overrides it.
    """
    if head_dim not in BLOCKED_HEAD_DIMS:
        raise ValueError(f"head_dim: the register-blocked fp32 kernels support {BLOCKED_HEAD_DIMS}, got {head_dim}")
    override = os.environ.get("NUMBA_FLASH_FP32_BWD_TILES")
    if override and str(head_dim) in json.loads(override):
        a, b = json.loads(override)[str(head_dim)]
        return BlockedTiles(head_dim, *a), BlockedTiles(head_dim, *b)
    from numba_flash._numba_cuda import SIMULATOR

    if SIMULATOR:  # small tiles: the simulator's cost grows with the tile
        return BlockedTiles(head_dim, 16, 16, 4, 2), BlockedTiles(head_dim, 16, 16, 4, 2)
    kv, q = BLOCKED_BACKWARD_GPU[head_dim]
    return BlockedTiles(head_dim, *kv), BlockedTiles(head_dim, *q)

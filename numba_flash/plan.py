"""The launch plan: which kernels run for a problem, with which tiles, grid and memory.

:func:`plan` maps a :class:`Problem` (pass, dtype, head dim, causal, ``allow_tf32``,
row alignment, sizes, target) to a :class:`Plan`: the family, the dtype the kernels
work in, and the list of launches (``kernels.spec.KernelLaunch``) in order.  It is the
one place kernels are chosen: ``flash_attention`` runs the list (``api``), ``numba-flash
inspect`` compiles it (``inspection``), ``numba-flash info`` prints it (:func:`table`),
and the tests check it.  Tiles come from ``config.choose``; each kernel module states
its own grid, threads, shared memory and arguments (its ``launches`` function).

The rule, in order (FlashAttention-2's dtypes on tensor cores, everything else exact):

1. fp16 / bf16 at any head dim (on the tiles of ``config.tc_tile_dim``), on sm_80 or
   newer: **tensor-core** (``mma.sync`` m16n8k16; rows that are not 16-byte aligned
   are copied by plain loads instead of cp.async); a forward of at most
   ``config.DECODE_ROWS`` query rows on one-warp tiles (:func:`decode_tiles`).
2. float32 with ``allow_tf32`` at head dims 64 and 128, rows aligned, sm_80+:
   **tensor-core-tf32**.
3. Otherwise **simt-fp32**, exact fp32 on CUDA cores: the register-blocked kernels for
   float32 work at head dims 64 and 128 with aligned rows on sm_80+ (they use cp.async
   too), else the row-group kernels (any head dim, any alignment, any architecture).
   fp16 is read as is by the row-group kernels; bf16, which numba cannot type, runs on
   float32 copies (``Plan.work_dtype``) made by the API, and so always meets the
   alignment of the blocked kernels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from numba_flash import config
from numba_flash.kernels.spec import Sizes
from numba_flash.variant import PLAIN, Variant

PASSES = ("forward", "backward")
DTYPES = ("float32", "float16", "bfloat16")
FAMILIES = ("tensor-core", "tensor-core-tf32", "simt-fp32")
MIN_TENSOR_CORE_CC = (8, 0)  # mma.sync m16n8k16 / m16n8k8 tf32, ldmatrix, cp.async


@dataclass(frozen=True)
class Problem:
    """What the kernel choice depends on.

    Attributes:
        pass_: "forward" or "backward".
        dtype: "float32", "float16" or "bfloat16" (the inputs').
        head_dim: d.
        causal: causal masking (a compile-time variant of every kernel).
        allow_tf32: float32 on TF32 tensor cores.
        aligned: every q/k/v (and dout, out) row starts on a 16-byte boundary.
        batch, heads, seqlen_q, seqlen_k: sizes (the grid).
        arch: the target's compute capability.
        simulator: numba's CUDA simulator (small register-blocked tiles there).
        features: the variants other than causal (``numba_flash.variant.Variant``; each
            kernel is compiled for its flags).
        heads_k: KV heads (GQA/MQA: fewer than ``heads``; 0 means ``heads``).
        rows_q: rows of q's sequence axis when it differs from seqlen_q (varlen: the
            packed total; 0 means ``seqlen_q``).
        page_rows: a paged KV cache's rows a page when a sequence spans several pages
            (``features.paged``; the Hopper forward copies each key tile in boxes that
            lie within one page: ``wgmma_forward.key_box``); 0 otherwise (keys are
            rows of K and V, or one page holds a sequence: a contiguous cache).
    """

    pass_: str
    dtype: str
    head_dim: int
    causal: bool = False
    allow_tf32: bool = False
    aligned: bool = True
    batch: int = 1
    heads: int = 1
    seqlen_q: int = 1
    seqlen_k: int = 1
    arch: tuple = (9, 0)
    simulator: bool = False
    features: Variant = PLAIN
    heads_k: int = 0
    rows_q: int = 0
    page_rows: int = 0

    @property
    def variant(self) -> Variant:
        """The flags the kernels are compiled for (``features`` with ``causal``)."""
        return replace(self.features, causal=self.causal)

    @property
    def sizes(self) -> Sizes:
        """What the launch grids depend on."""
        return Sizes(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.heads_k, self.rows_q,
                     1 if self.features.varlen else self.batch)  # fmt: skip

    def __post_init__(self):
        if self.pass_ not in PASSES:
            raise ValueError(f"pass: expected one of {PASSES}, got {self.pass_!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if not 1 <= self.head_dim <= 256:
            raise ValueError(f"head_dim: expected 1 to 256, got {self.head_dim}")


@dataclass(frozen=True)
class Plan:
    """The launches of one pass, in order.

    Attributes:
        family: "tensor-core", "tensor-core-tf32" or "simt-fp32".
        work_dtype: the dtype the kernels read and write ("float32" when bf16 runs on
            float32 copies); the API converts inputs to it and outputs back.
        launches: ``kernels.spec.KernelLaunch`` records.
        note: why a faster family does not apply (empty when the first rule holds).
    """

    family: str
    work_dtype: str
    launches: tuple
    note: str = ""
    problem: Problem = field(default=None, repr=False)


def family(p: Problem) -> tuple[str, str]:
    """(family, note): the rule of the module docstring."""
    tensor_cores = tuple(p.arch[:2]) >= MIN_TENSOR_CORE_CC
    if p.dtype in ("float16", "bfloat16") or (p.dtype == "float32" and p.allow_tf32):
        name = "tensor-core" if p.dtype != "float32" else "tensor-core-tf32"
        why = []
        if p.dtype == "float32" and p.head_dim not in config.TF32_HEAD_DIMS:
            why.append(f"head dim {p.head_dim} is not one of {config.TF32_HEAD_DIMS}")
        if p.dtype == "float32" and not p.aligned:
            why.append("rows are not 16-byte aligned")
        if not tensor_cores:
            why.append(f"sm_{p.arch[0]}{p.arch[1]} has no mma.sync/cp.async (they need sm_80+)")
        if not why:
            return name, ""
        return "simt-fp32", f"the {name} kernels do not apply ({'; '.join(why)}): exact fp32 kernels run instead"
    return "simt-fp32", ""


def decode_tiles(p: Problem) -> bool:
    """The tensor-core forward of ``p`` runs on ``config.tc_decode_tiles``: at most
    ``config.DECODE_ROWS`` query rows a sequence, and no FlexAttention mods (a block
    mask's blocks are laid over the usual 128-row tiles)."""
    return p.pass_ == "forward" and p.seqlen_q <= config.DECODE_ROWS and p.features.mods is None


def wgmma_backward(p: Problem) -> bool:
    """The Hopper backward (``kernels.wgmma_backward``: its preprocess, dK/dV and dQ
    kernels) runs ``p``: as :func:`wgmma_forward`'s rule, for the backward (no split,
    pages or decode tiles there), varlen and FlexAttention's mods included, at d = 64,
    128 and 256 (there dV and dK are two kernels: ``wgmma_backward.RINGS``) and every
    other multiple of 8 below 256, on the next one's tiles (``hopper.tile_dim``)."""
    from numba_flash.kernels.hopper import tile_dim
    from numba_flash.kernels.wgmma_backward import HEAD_DIMS

    return (wgmma_switch(p) and p.pass_ == "backward" and tuple(p.arch) == (9, 0, "a")
            and p.dtype in ("float16", "bfloat16") and tile_dim(p.head_dim, HEAD_DIMS) > 0 and p.aligned)  # fmt: skip


def wgmma_forward(p: Problem) -> bool:
    """The Hopper forward (``kernels.wgmma_forward``) runs ``p``: switched on
    (``wgmma_switch``), on sm_90a (``arch`` (9, 0, "a"): numba-cuda's target on an
    H100/H200; wgmma exists on no other), fp16/bf16 at d = 64, 128, 192 or 256 and every other
    multiple of 8 below 256 (on the next one's tiles: ``hopper.tile_dim``) on 16-byte-aligned
    rows (TMA's strides), no KV cache's split (unless ``wgmma_split``), and no decode tiles (issue #13).
    FlexAttention's mods run there (a block mask's visit lists read from global memory:
    ``block_info.read_walk_list``), varlen too (its V rows past a sequence zeroed after the copy:
    ``hopper.past_rows``), and a KV cache's pages whose key boxes are 8 rows or more
    (``wgmma_forward.key_box``: pages of a multiple of 8 rows, or one page a sequence).
    Everything else runs the mma.sync kernels."""
    from numba_flash.kernels.hopper import tile_dim
    from numba_flash.kernels.wgmma_forward import HEAD_DIMS, key_box, key_tile

    tile_d = tile_dim(p.head_dim, HEAD_DIMS)
    return (wgmma_switch(p) and p.pass_ == "forward" and tuple(p.arch) == (9, 0, "a")
            and p.dtype in ("float16", "bfloat16") and tile_d > 0 and p.aligned
            and (not p.features.split or wgmma_split())
            and (not p.features.paged or key_box(p.page_rows, key_tile(tile_d)) >= 8)
            and not decode_tiles(p))  # fmt: skip


def wgmma_split() -> bool:
    """A KV cache's split-KV runs the Hopper forward too (each split's parts in fp32, merged
    by the merge kernel after it), where the plan would take it without the split (more
    query rows than the decode tiles take).  On by default since session 29 (H100,
    ``scripts/bench_prefill_split.py``, docs/benchmarks/2026-12-06-s29): 1.37–2.02× the
    mma.sync forward's splits where the GPU's time shows (caches of 32768–65536 tokens),
    0.93× in a call of 8192 tokens the host's time bounds.  ``NUMBA_FLASH_WGMMA_SPLIT=0``
    runs the splits on the mma.sync forward."""
    return os.environ.get("NUMBA_FLASH_WGMMA_SPLIT", "1") != "0"


def wgmma_switch(p: Problem) -> bool:
    """``NUMBA_FLASH_WGMMA``: ``1`` on, ``0`` off; unset, on except in the simulator
    (where its 384- and 512-thread blocks cost the suite minutes: the simulator tests
    that run it switch it on)."""
    env = os.environ.get("NUMBA_FLASH_WGMMA")
    if env in ("0", "1"):
        return env == "1"
    return not p.simulator


def plan(p: Problem) -> Plan:
    """The launch plan of problem ``p``."""
    fam, note = family(p)
    d, causal, v, sz = p.head_dim, p.causal, p.variant, p.sizes
    if fam == "tensor-core" and wgmma_forward(p):
        from numba_flash.kernels import wgmma_forward as W

        sparse = v.mods is not None and v.mods.block_sparse  # 128-row tiles on a block mask's 128-blocks
        return Plan(fam, p.dtype, tuple(W.launches(W.tiles(d, causal, p.seqlen_q, sparse, v), v, p.dtype, sz,
                                                   p.page_rows)),
                    note, p)
    if fam == "tensor-core" and wgmma_backward(p):
        from numba_flash.kernels import wgmma_backward as W

        return Plan(fam, p.dtype, tuple(W.launches(v, p.dtype, sz, d)), note, p)
    if fam == "tensor-core":
        from numba_flash.kernels import tc_backward, tc_forward

        tile_d = config.tc_tile_dim(d)  # d on the tiles of the next tile head dim
        kind = "tc_decode" if decode_tiles(p) else "tc_" + p.pass_
        t = config.choose(kind, tile_d, causal, p.dtype)
        t = replace(t, data_dim=d if tile_d != d else 0, aligned=p.aligned and d % 8 == 0)
        module = tc_forward if p.pass_ == "forward" else tc_backward
        launches = module.launches(t, v, p.dtype, sz)
        return Plan(fam, p.dtype, tuple(launches), note, p)
    if fam == "tensor-core-tf32":
        from numba_flash.kernels import tf32_backward, tf32_forward

        if p.pass_ == "forward":
            launches = tf32_forward.launches(config.choose("tf32_forward", d, causal), v, sz)
        else:
            launches = tf32_backward.launches(config.choose("tf32_backward", d, causal), v, sz)
        return Plan(fam, "float32", tuple(launches), note, p)

    work = "float16" if p.dtype == "float16" else "float32"
    aligned = p.aligned or p.dtype == "bfloat16"  # bf16 runs on fresh (aligned) fp32 copies
    blocked = work == "float32" and d in config.BLOCKED_HEAD_DIMS and aligned and p.arch[:2] >= MIN_TENSOR_CORE_CC
    if blocked:
        from numba_flash.kernels import simt_blocked_backward, simt_blocked_forward

        kind = "blocked_" + p.pass_
        t = config.choose(kind, d, causal, simulator=p.simulator)
        module = simt_blocked_forward if p.pass_ == "forward" else simt_blocked_backward
    else:
        from numba_flash.kernels import simt_backward, simt_forward

        padded = -(-d // 8) * 8  # a head dim that is not a multiple of 8 runs on the next one's tiles
        t = config.choose("simt_" + p.pass_, padded)
        if padded != d:
            t = tuple(replace(x, data_dim=d) for x in t) if isinstance(t, tuple) else replace(t, data_dim=d)
        module = simt_forward if p.pass_ == "forward" else simt_backward
    return Plan(fam, work, tuple(module.launches(t, v, sz)), note, p)


def table(arch: tuple = (9, 0), simulator: bool = False) -> list[dict]:
    """What runs where, for ``numba-flash info``: one row per (dtype, head-dim class),
    the kernels of each pass with their tiles (from :func:`plan` itself), on ``arch``
    (a compile target: (9, 0, "a") for an H200) or in the simulator."""
    cases = [("float32", "64, 128 (16-byte aligned rows)", 64, False, True),
             ("float32", "any other from 1 to 256, or unaligned rows", 96, False, True),
             ("float32, allow_tf32=True", "64, 128 (16-byte aligned rows)", 64, True, True)]
    for half in ("float16", "bfloat16"):
        cases += [(half, "64, 128 (16-byte aligned rows)", 64, False, True),
                  (half, "8 to 120, multiples of 8 (16-byte aligned rows)", 96, False, True),
                  (half, "136 to 256, multiples of 8 (16-byte aligned rows)", 256, False, True),
                  (half, "any other from 1 to 256, or unaligned rows", 100, False, True)]  # fmt: skip
    rows = []
    for label, dims, d, tf32, aligned in cases:
        dtype = label.split(",")[0]
        row = {"dtype": label, "head_dims": dims}
        for pass_ in PASSES:
            pl = plan(Problem(pass_, dtype, d, allow_tf32=tf32, aligned=aligned, arch=arch, seqlen_q=4096,
                              seqlen_k=4096, simulator=simulator))  # fmt: skip
            kernels = " → ".join(k.name for k in pl.launches)
            work = f" (on {pl.work_dtype} copies)" if pl.work_dtype != dtype and dtype == "bfloat16" else ""
            row[pass_] = f"{pl.family}: {kernels}{work}"
        rows.append(row)
    return rows


def with_sizes(p: Problem, batch: int, heads: int, seqlen_q: int, seqlen_k: int, heads_k: int = 0,
               rows_q: int = 0) -> Problem:
    """``p`` for other sizes (the kernels and tiles do not depend on them, but for
    :func:`decode_tiles`, chosen by ``seqlen_q``)."""
    return replace(p, batch=batch, heads=heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_k=heads_k, rows_q=rows_q)


__all__ = ["Problem", "Plan", "plan", "family", "table", "with_sizes"]

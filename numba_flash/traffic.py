"""HBM traffic of attention: numba-flash's kernels, predicted from the launch plan they
run with, and a standard attention (the CuPy peer), predicted from its operations.

The paper's argument (FlashAttention, Dao et al. 2022, Theorem 2).  Standard attention
writes the N×N scores to HBM and reads them back, pass after pass: Θ(N·d + N²) bytes.
The tiled kernel reads Q once, K and V once per query tile and writes O and the LSE once:
with query tiles of ``block_m`` rows, about ``2·N²·d / block_m`` elements, and since
``block_m`` grows with the on-chip memory M (``block_m ~ M / d``), Θ(N²·d²/M).  The
ratio of the two grows with ``block_m / d``: for the forward at d = 64 in fp16 with
128-row tiles, ``(12 passes · 4 bytes · N²) / (2 · 2 bytes · N² · 64 / 128) = 24``.

**The flash model** (:func:`flash`) walks the plan's launches as the kernels walk
their tiles:

* Each block owns a row tile: ``block_m`` queries, or ``block_n`` keys in the dK/dV
  kernels. It reads the rows of its own axis once (Q, dO, lse and delta of a query tile,
  or K and V of a key tile). For every tile of the other axis it visits, it reads that
  tile's rows.
* Visited tiles are clipped by causal and the window as ``block_info.key_tiles`` /
  ``query_tiles`` clip them (the reference's ranges).
* Rows past the ends are zero-filled, not read. Outputs are written once.
* A row is d elements of the dtype the kernels work in; lse and delta rows are 4 bytes.
* Which roles a kernel reads and writes comes from its arguments
  (``KernelLaunch.args``), or from its own ``io`` where it writes only some of them.
* GQA: each query head's blocks read their KV head's tiles. What L2 shares between
  them is for the measurement to show.

**The standard model** (:func:`standard`) follows
``numba_flash.bench.peers.cupy_attention_forward`` / ``cupy_attention_backward``
operation by operation:

* the scores are fp32;
* 16-bit inputs are cast to fp32 copies first;
* each elementwise pass reads and writes its arrays once;
* a row reduction reads once;
* a matmul reads each operand once and writes its result once (the d-wide operands fit
  in L2, the N×N one streams).

The causal bias is built once, outside the call (as ``bench`` does), and read by
every (batch, head).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from numba_flash import plan as P
from numba_flash import variant as V
from numba_flash.kernels import spec

#: Roles whose rows are queries, and keys (what a block's rows are in a walk).
QUERY_ROLES = ("q", "dout", "out", "lse", "delta", "stats", "dq")
KEY_ROLES = ("k", "v", "dk", "dv")
#: Roles a kernel writes: its outputs (the rest of its 4-D and row arguments it reads).
OUTPUT_ROLES = {"forward": ("out", "lse"), "preprocess": ("delta", "stats"), "backward": ("dq", "dk", "dv")}
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Bytes:
    """Bytes one kernel (or one operation of the standard attention) reads and writes."""

    name: str
    read: int
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write


def kernel_io(launch) -> tuple:
    """``(role, "r" | "w")`` of what ``launch`` moves in HBM: its ``io``, else every
    q/k/v/out/lse/dout/delta/dq/dk/dv argument, written when it is an output of its
    kind of kernel (forward: out, lse; preprocess: delta; backward: dq, dk, dv)."""
    if launch.io:
        return launch.io
    roles = [a.role for a in launch.args if a.role in QUERY_ROLES + KEY_ROLES]
    kind = "preprocess" if not launch.walk else ("forward" if "out" in roles and "dout" not in roles else "backward")
    return tuple((r, "w" if r in OUTPUT_ROLES[kind] else "r") for r in roles)


def _row_bytes(role: str, d: int, item: int) -> int:
    if role == "stats":  # lse and delta
        return 8
    return 4 if role in ("lse", "delta") else d * item


def _tile_ranges(rows_tile: int, other_tile: int, keys_are_rows: bool, nq: int, nk: int, window) -> list:
    """Per row tile: the tiles ``[t_lo, t_hi)`` of the other axis it visits
    (``flex.visit_lists``' ranges, without a block mask)."""
    from numba_flash.reference import _key_range, _query_range

    n_rows = nk if keys_are_rows else nq
    span = _query_range if keys_are_rows else _key_range
    out = []
    for r in range(-(-n_rows // rows_tile)):
        lo, hi = span(r * rows_tile, r * rows_tile + rows_tile, nq, nk, window)
        out.append((lo // other_tile, max(lo // other_tile, -(-hi // other_tile))))
    return out


def _tile_rows(t: int, other_tile: int, n_other: int) -> int:
    """Rows of tile ``t`` of an axis of ``n_other`` rows (the last one may be short)."""
    return min(other_tile, n_other - t * other_tile)


def _problem(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k, allow_tf32, arch):
    features = V.variant_of(False, window, 0.0, False, 0.0, False, heads // (heads_k or heads))
    return P.Problem(pass_, dtype, head_dim, causal, allow_tf32, True, batch, heads, seqlen_q, seqlen_k, arch, False,
                     features, heads_k)  # fmt: skip


def _planned(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k, allow_tf32, arch):
    """What both models start from: (problem, plan, bytes an element the kernels work
    in, the window with causal's right bound 0)."""
    problem = _problem(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k, allow_tf32,
                       arch)  # fmt: skip
    plan = P.plan(problem)
    win = V.check_window(window)
    return problem, plan, _ITEM[plan.work_dtype], ((win[0], 0) if causal else win)


def flash(pass_: str, dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
          causal: bool = False, window=(-1, -1), heads_k: int = 0, allow_tf32: bool = False,
          arch=(9, 0)) -> list[Bytes]:  # fmt: skip
    """HBM bytes of each kernel numba-flash launches for this problem (the module
    docstring's model), in launch order."""
    _, plan, item, win = _planned(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k,
                                  allow_tf32, arch)  # fmt: skip
    d, h_kv = head_dim, heads_k or heads
    out = []
    for k in plan.launches:
        io = kernel_io(k)
        read = write = 0
        if not k.walk:  # preprocess: every query row once
            for role, rw in io:
                n = batch * heads * seqlen_q * _row_bytes(role, d, item)
                read, write = (read + n, write) if rw == "r" else (read, write + n)
            out.append(Bytes(k.name, read, write))
            continue
        block_m, block_n, keys_are_rows = k.walk
        rows_tile, other_tile = (block_n, block_m) if keys_are_rows else (block_m, block_n)
        own = KEY_ROLES if keys_are_rows else QUERY_ROLES
        n_rows, n_other = (seqlen_k, seqlen_q) if keys_are_rows else (seqlen_q, seqlen_k)
        steps = sum(_tile_rows(t, other_tile, n_other)
                    for lo, hi in _tile_ranges(rows_tile, other_tile, keys_are_rows, seqlen_q, seqlen_k, win)
                    for t in range(lo, hi))  # fmt: skip
        # blocks: a row tile of every (batch, head of the grid); dK/dV blocks are per KV
        # head and walk the group's query heads, so their other-axis reads count every query head
        grid_heads = h_kv if keys_are_rows else heads
        for role, rw in io:
            row = _row_bytes(role, d, item)
            if role in own:
                n = batch * grid_heads * n_rows * row
            else:
                n = batch * heads * steps * row
            read, write = (read + n, write) if rw == "r" else (read, write + n)
        out.append(Bytes(k.name, read, write))
    return out


# --- DRAM: what L2 shares between blocks that run at the same time ------------------------

#: H200 (sm_90): SMs; the L2 bytes that serve re-reads by every SM (the 60 MB L2 is two
#: partitions, each caching for the SMs wired to it, so a tile read from both halves is
#: held twice, leaving 30 MB, of which Q and O streaming through take some: 24 MB fitted
#: the H200's forward counts, docs/io.md); the shared
#: memory an SM has for blocks (and reserves per block); and the 32-bit registers a
#: thread of numba-flash's tensor-core kernels holds (250-255 by ``compile_ptx``,
#: allocated in steps of 8, so 256).
SMS, L2_BYTES, SMEM_PER_SM, SMEM_RESERVED, REGS = 132, 24 * 2**20, 228 * 1024, 1024, 256


def blocks_per_sm(launch, regs: int = REGS) -> int:
    """Blocks of ``launch`` one SM holds at once: the least of its shared memory
    (``SMEM_PER_SM`` with ``SMEM_RESERVED`` a block), its 64K registers (``regs`` a
    thread), 2048 threads and 32 blocks."""
    by_smem = SMEM_PER_SM // (launch.smem + SMEM_RESERVED) if launch.smem else 32
    return max(1, min(by_smem, 65536 // (launch.threads * regs), 2048 // launch.threads, 32))


def _issue_order(launch, variant, heads_grid: int, batch: int, tiles: int, section: int = 0) -> list:
    """``(batch, head, row tile)`` of the blocks in the order the hardware starts them
    (linear blockIdx, x fastest), with ``block_info.block_coords``' mapping: a
    heaviest-first grid's (head, batch) pairs ``section`` at a time (``l2_section``)."""
    keys_are_rows = launch.walk[2]
    if not variant.heaviest_first:
        return [(b, h, t) for b in range(batch) for h in range(heads_grid) for t in range(tiles)]
    reverse = (variant.causal or variant.window_right) != keys_are_rows  # as block_coords: F[CAUSAL] or F[HAS_RIGHT]
    pairs = heads_grid * batch
    width = section if 0 < section < pairs else pairs
    return [(pair // heads_grid, pair % heads_grid, tiles - 1 - p if reverse else p)
            for first in range(0, pairs, width) for p in range(tiles)
            for pair in range(first, min(first + width, pairs))]  # fmt: skip


def dram(pass_: str, dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
         causal: bool = False, window=(-1, -1), heads_k: int = 0, allow_tf32: bool = False, arch=(9, 0),
         sms: int = SMS, l2_bytes: int = L2_BYTES, regs: int = REGS) -> list[Bytes]:  # fmt: skip
    """HBM (DRAM) bytes of each kernel when L2 serves the re-reads of the blocks that
    run at the same time: :func:`flash` counts every tile load, which is what the SMs
    ask of L2; this counts what L2 asks of DRAM.

    The blocks start in grid order (``_issue_order``), ``sms · blocks_per_sm`` at a
    time: a *wave*.  The blocks of a wave walk their tiles at about the same pace, so
    a tile that several of them load (the K/V tiles of one KV head, or the Q/dO tiles
    of one query head in dK/dV) is asked of L2 by the wave once: per wave and head,
    the union of the tiles its blocks visit, walked in step.  L2 is a least-recently-
    used cache of ``l2_bytes`` over those tiles, across waves: a tile comes from DRAM
    when it is not in it.  So when a head's tiles fit, the next wave on that head
    reads nothing again; when they do not, the walk from tile 0 evicts what the next
    wave needs first, and every wave reads them all.  A block's own rows are read once
    and outputs written once, as in :func:`flash`.  Not modelled: write-back that L2
    defers past the kernel's end (a kernel's writes may be counted by the next), and
    the order of a block mask's row tiles (the plain grid order is used)."""
    problem, plan, item, win = _planned(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window,
                                        heads_k, allow_tf32, arch)  # fmt: skip
    modelled = flash(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k,
                     allow_tf32, arch)  # fmt: skip
    d, h_kv = head_dim, heads_k or heads
    group = heads // h_kv
    sections = spec.l2_sections(pass_, batch, heads, group, seqlen_q, seqlen_k, d, _ITEM[dtype], spec.DEFAULT_L2_BYTES,
                                spec.DEFAULT_SMS)  # as the API's on an H100 / H200
    out = []
    for k, tiles_model in zip(plan.launches, modelled):
        if not k.walk:
            out.append(tiles_model)
            continue
        block_m, block_n, keys_are_rows = k.walk
        rows_tile, other_tile = (block_n, block_m) if keys_are_rows else (block_m, block_n)
        n_rows, n_other = (seqlen_k, seqlen_q) if keys_are_rows else (seqlen_q, seqlen_k)
        own = KEY_ROLES if keys_are_rows else QUERY_ROLES
        io = kernel_io(k)
        other_row = sum(_row_bytes(r, d, item) for r, rw in io if r not in own and rw == "r")
        heads_grid = h_kv if keys_are_rows else heads
        ranges = _tile_ranges(rows_tile, other_tile, keys_are_rows, seqlen_q, seqlen_k, win)
        tiles = len(ranges)
        slots = sms * blocks_per_sm(k, regs)
        # the Hopper kernels' sections (a backward kernel's tiles say whether it takes them)
        sectioned = k.name.startswith("wgmma") and getattr(k.tiles, "l2_sections", True)
        section = sections[1 if keys_are_rows else 0] if sectioned else 0
        order = _issue_order(k, problem.variant, heads_grid, batch, tiles, section)
        tile_bytes = other_tile * other_row
        cache = OrderedDict()  # (batch, head, tile) in L2, least recently used first
        misses = 0  # rows of the other axis read from DRAM
        for w in range(0, len(order), slots):
            per_head = {}  # this wave's tiles per (batch, head of the other axis)
            for b, h, t in order[w:w + slots]:
                for ho in (range(h * group, h * group + group) if keys_are_rows else (h // group,)):
                    per_head.setdefault((b, ho), set()).update(range(*ranges[t]))
            walks = [[(key, t) for t in sorted(ts)] for key, ts in per_head.items()]
            for step in range(max((len(x) for x in walks), default=0)):  # the wave's heads in lockstep
                for x in walks:
                    if step < len(x):
                        if x[step] in cache:
                            cache.move_to_end(x[step])
                        else:
                            misses += _tile_rows(x[step][1], other_tile, n_other)
                            cache[x[step]] = None
                            if len(cache) * tile_bytes > l2_bytes:
                                cache.popitem(last=False)
        read = batch * heads_grid * n_rows * sum(_row_bytes(r, d, item) for r, rw in io if r in own and rw == "r")
        out.append(Bytes(k.name, read + misses * other_row, tiles_model.write))
    return out


def standard(pass_: str, dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
             causal: bool = False) -> list[Bytes]:  # fmt: skip
    """HBM bytes of each operation of the CuPy standard attention (the module
    docstring's model), per call, for all (batch, head) pairs.  The forward is
    ``cupy_attention_forward``; the backward ``cupy_attention_backward`` from the
    forward's saved P."""
    bh, nq, nk, d, e = batch * heads, seqlen_q, seqlen_k, head_dim, _ITEM[dtype]
    s = 4 * nq * nk * bh  # one fp32 N×N array
    rq, rk, row = 4 * nq * d * bh, 4 * nk * d * bh, 4 * nq * bh  # fp32 (Nq, d), (Nk, d), (Nq,)
    half = e != 4

    def cast(name, rows):  # a 16-bit (rows, d) array to an fp32 copy, or back
        return [Bytes(name, rows * e // 4, rows)] if half else []

    if pass_ == "forward":
        ops = cast("q, k, v to fp32", rq + 2 * rk)
        ops += [Bytes("S = Q·Kᵀ", rq + rk, s), Bytes("S *= scale", s, s)]
        if causal:
            ops.append(Bytes("S += causal bias", 2 * s, s))
        ops += [Bytes("m = rowmax(S)", s, row), Bytes("S -= m", s + row, s), Bytes("S = exp(S)", s, s),
                Bytes("l = rowsum(S)", s, row), Bytes("P = S / l", s + row, s), Bytes("O = P·V", s + rk, rq)]  # fmt: skip
        ops += [Bytes("O to " + dtype, rq, rq * e // 4)] if half else []
        return ops
    ops = cast("dO, q, k, v, O to fp32", 3 * rq + 2 * rk)
    ops += [Bytes("dV = Pᵀ·dO", s + rq, rk), Bytes("dP = dO·Vᵀ", rq + rk, s), Bytes("dO∘O", 2 * rq, rq),
            Bytes("delta = rowsum(dO∘O)", rq, row), Bytes("dP -= delta", s + row, s), Bytes("dS = dP∘P", 2 * s, s),
            Bytes("dQ = dS·K", s + rk, rq), Bytes("dQ *= scale", rq, rq), Bytes("dK = dSᵀ·Q", s + rq, rk),
            Bytes("dK *= scale", rk, rk)]  # fmt: skip
    ops += [Bytes("dQ, dK, dV to " + dtype, rq + 2 * rk, (rq + 2 * rk) * e // 4)] if half else []
    return ops


def asymptotic(pass_: str, dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
               block_m: int) -> dict:  # fmt: skip
    """The leading terms, in bytes, beside the models: standard ``c·4·Nq·Nk`` (c fp32
    passes over the scores: 12 forward, 9 backward; 14 forward with causal's bias) and flash
    ``2·Nq·Nk·d·item / block_m`` (K and V once per query tile; the backward reads
    them once per query tile in dQ and Q, dO once per key tile in dK/dV: about twice)."""
    bh, item = batch * heads, _ITEM[dtype]
    c = 12 if pass_ == "forward" else 9
    tiles = 2 if pass_ == "forward" else 4
    return {
        "standard": c * 4 * seqlen_q * seqlen_k * bh,
        "standard_formula": f"{c}·4·B·H·Nq·Nk",
        "flash": tiles * seqlen_q * seqlen_k * head_dim * item * bh // block_m,
        "flash_formula": f"{tiles}·B·H·Nq·Nk·d·{item}/block_m (block_m = {block_m})",
    }


def device_arch() -> tuple:
    """The plan's target for the models here: the current GPU's (``_numba_cuda.target_arch``:
    (9, 0, "a") on an H200, where the forward is the wgmma one), else an sm_90's generic
    target (the mma.sync kernels)."""
    from numba_flash._numba_cuda import gpu_available, target_arch

    return target_arch() if gpu_available() else (9, 0)


def summary(pass_: str, dtype: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool = False) -> dict:
    """One row of ``numba-flash io``: predicted bytes of both (numba-flash's as tile
    loads, :func:`flash`, and as DRAM traffic behind L2, :func:`dram`), the ratio
    standard / flash (tile loads: the paper's count), and the asymptotic terms (square
    attention, ``seqlen`` queries and keys)."""
    arch = device_arch()
    fl = flash(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, arch=arch)
    dr = dram(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, arch=arch)
    st = standard(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal)
    plan = P.plan(_problem(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, (-1, -1), 0, False, arch))
    walks = [k.walk for k in plan.launches if k.walk and not k.walk[2]]  # the query-tile walk
    block_m = walks[0][0] if walks else 1
    flash_total, standard_total = sum(b.total for b in fl), sum(b.total for b in st)
    return {
        "pass": pass_, "dtype": dtype, "batch": batch, "heads": heads, "seqlen": seqlen, "head_dim": head_dim,
        "causal": causal, "flash_bytes": flash_total, "flash_dram_bytes": sum(b.total for b in dr),
        "standard_bytes": standard_total,
        "ratio": standard_total / flash_total if flash_total else float("nan"),
        "flash_kernels": [b.__dict__ for b in fl], "flash_dram_kernels": [b.__dict__ for b in dr],
        "standard_ops": [b.__dict__ for b in st],
        "asymptotic": asymptotic(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, block_m),
    }  # fmt: skip


# --- measuring (Nsight Compute in a child process) ------------------------------------------

#: DRAM bytes, and the 32-byte sectors the SMs ask of L2 (what :func:`flash` counts).
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
               "lts__t_sectors_srcunit_tex_op_write.sum")


def ncu_unavailable() -> str | None:
    """Why DRAM bytes cannot be measured here (no ``ncu`` on PATH, no GPU), or None."""
    import shutil

    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not on PATH"
    from numba_flash.bench import NoDeviceError, require_device

    try:
        require_device("DRAM byte counts")
    except NoDeviceError as exc:
        return str(exc)
    return None


def measure(pass_: str, dtype: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool = False,
            timeout: float = 600.0) -> dict:  # fmt: skip
    """DRAM bytes read and written by numba-flash's kernels and by the CuPy standard
    attention for one call each, from Nsight Compute's ``dram__bytes_read.sum`` /
    ``dram__bytes_write.sum`` in a child process (``ncu --clock-control none``, only
    the calls between ``cudaProfilerStart`` / ``Stop``: after a warm-up that compiles).
    Returns ``{"flash": Bytes, "flash_l2": bytes the SMs asked of L2, "standard": Bytes
    or None (it did not fit in memory), "kernels": [Bytes, ...]}``; raises RuntimeError
    with ncu's output when the run fails."""
    import json
    import subprocess
    import sys

    if dtype not in ("float16", "float32"):  # the child makes its inputs with CuPy, which has no bfloat16
        raise ValueError(f"dtype={dtype!r}: measured for float16 and float32 (bfloat16 moves float16's bytes)")

    args = json.dumps(dict(pass_=pass_, dtype=dtype, batch=batch, heads=heads, seqlen=seqlen, head_dim=head_dim,
                           causal=causal))  # fmt: skip
    cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(NCU_METRICS),
           "--csv", "--print-units", "base", sys.executable, "-m", "numba_flash.traffic", "--child", args]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0 or '"ID"' not in run.stdout:
        raise RuntimeError(f"ncu failed (exit {run.returncode}): {(run.stderr or run.stdout)[-2000:]}")
    names = {k.name for k in P.plan(_problem(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, (-1, -1), 0,
                                             False, device_arch())).launches}  # fmt: skip
    profiled = ncu_kernels(run.stdout)
    kernels = [Bytes(name, int(m.get(NCU_METRICS[0], 0)), int(m.get(NCU_METRICS[1], 0))) for name, m in profiled]
    mine = [any(n in name for n in names) for name, _ in profiled]
    ours = [b for b, is_ours in zip(kernels, mine) if is_ours]
    theirs = [b for b, is_ours in zip(kernels, mine) if not is_ours]
    l2 = sum(32 * int(m.get(NCU_METRICS[2], 0) + m.get(NCU_METRICS[3], 0)) for (_, m), is_ours in zip(profiled, mine)
             if is_ours)  # fmt: skip
    return {"flash": Bytes("numba-flash", sum(b.read for b in ours), sum(b.write for b in ours)),
            "flash_l2": l2,
            "standard": (Bytes("cupy-standard", sum(b.read for b in theirs), sum(b.write for b in theirs))
                         if theirs else None),
            "kernels": kernels}  # fmt: skip


def ncu_kernels(text: str) -> list:
    """``(kernel name, {metric: value})`` of every kernel in the ``--csv --print-units
    base`` output of ncu, in the order they ran."""
    import csv
    import io

    per: dict = {}
    for row in csv.DictReader(io.StringIO(text[text.find('"ID"'):])):
        entry = per.setdefault((int(row["ID"]), row["Kernel Name"]), {})
        entry[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return [(name, metrics) for (_, name), metrics in sorted(per.items())]


def _child(pass_, dtype, batch, heads, seqlen, head_dim, causal):
    """The measured process: a warm-up of both implementations, then one call each
    between cudaProfilerStart and cudaProfilerStop (the backward from a forward made
    before the window)."""
    import cupy as cp
    import numpy as np

    import numba_flash
    from numba_flash.bench.peers import causal_bias, cupy_attention_backward, cupy_attention_forward

    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal((batch, seqlen, heads, head_dim), np.float32)).astype(dt)
                   for _ in range(4))  # fmt: skip
    qh, kh, vh, doh = (x.transpose(0, 2, 1, 3) for x in (q, k, v, do))  # the standard attention's bhsd views
    out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
    both_fit, bias, s_out, p = True, None, None, None

    def both():  # one call of each implementation
        if pass_ == "forward":
            numba_flash.flash_attention(q, k, v, causal=causal)
            if both_fit:
                cupy_attention_forward(qh, kh, vh, causal=causal, bias=bias)
        else:
            numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
            if both_fit:
                cupy_attention_backward(doh, qh, kh, vh, s_out, p)

    try:  # the standard attention's N×N arrays may not fit: then numba-flash alone
        bias = causal_bias(seqlen, seqlen) if causal else None
        if pass_ == "backward":  # the saved forward's N×N probabilities stay alive beside the backward's
            s_out, p = cupy_attention_forward(qh, kh, vh, causal=causal, bias=bias)
        for _ in range(2):  # warm-up: compiles, fills caches of plans and launches; two calls
            both()  # as the measured one (an H100's 80 GB fit one N = 32768 forward's S, not two at once)
    except cp.cuda.memory.OutOfMemoryError:
        both_fit, bias, s_out, p = False, None, None, None
        cp.get_default_memory_pool().free_all_blocks()
        both()
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    both()
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()


# --- the sweep of ``numba-flash io`` ---------------------------------------------------------

SCHEMA = "numba-flash-io/1"


def sweep(passes, dtype: str, batch: int, heads: int, seqlens, head_dim: int, causal: bool = False,
          measure_bytes: bool = False, progress=None) -> list[dict]:  # fmt: skip
    """:func:`summary` rows for every (pass, N); with ``measure_bytes`` each also gets
    ``measured_flash`` ({"read", "write"} DRAM bytes), ``measured_flash_l2`` (bytes
    asked of L2) and, where the standard attention fitted, ``measured_standard`` from
    :func:`measure`, or ``measure_error``."""
    rows = []
    todo = [(p, n) for p in passes for n in seqlens]
    for i, (pass_, n) in enumerate(todo):
        row = summary(pass_, dtype, batch, heads, n, head_dim, causal)
        if measure_bytes:
            try:
                got = measure(pass_, dtype, batch, heads, n, head_dim, causal)
                row["measured_flash"] = {"read": got["flash"].read, "write": got["flash"].write}
                row["measured_flash_l2"] = got["flash_l2"]
                if got["standard"] is not None:
                    row["measured_standard"] = {"read": got["standard"].read, "write": got["standard"].write}
            except Exception as exc:  # one failed size (the standard attention out of memory) leaves the rest
                row["measure_error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
        rows.append(row)
        if progress:
            progress(i + 1, len(todo), f"{pass_} N={n}")
    return rows


def plot(rows, path: str) -> str:
    """Predicted (lines) and measured (markers) bytes against N, log axes: numba-flash's
    tile loads (against what ncu saw the SMs ask of L2) and its DRAM traffic, and the
    standard attention's; a line style per pass."""
    from numba_flash.bench import _pyplot

    plt = _pyplot()
    if not rows:
        raise ValueError("nothing to plot: no rows")
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for pass_, ls in (("forward", "-"), ("backward", "--")):
        sel = sorted((r for r in rows if r["pass"] == pass_), key=lambda r: r["seqlen"])
        if not sel:
            continue
        n = [r["seqlen"] for r in sel]
        for key, meas, color, label in (("flash_bytes", "measured_flash_l2", "#ff7f0e", "numba-flash tile loads (L2)"),
                                        ("flash_dram_bytes", "measured_flash", "#d62728", "numba-flash DRAM"),
                                        ("standard_bytes", "measured_standard", "#7f7f7f", "standard (CuPy)")):
            ax.plot(n, [r[key] for r in sel], ls, color=color, label=f"{label} {pass_}, predicted")
            got = [(r["seqlen"], r[meas] if isinstance(r[meas], int) else r[meas]["read"] + r[meas]["write"])
                   for r in sel if meas in r]  # fmt: skip
            if got:
                ax.plot(*zip(*got), "o" if pass_ == "forward" else "s", color=color, fillstyle="none",
                        label=f"{label} {pass_}, measured (ncu)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes read + written")
    r0 = rows[0]
    ax.set_title(f"HBM traffic, B={r0['batch']} H={r0['heads']} d={r0['head_dim']} {r0['dtype']}"
                 f"{' causal' if r0['causal'] else ''}", fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":  # the child of :func:`measure`
    import json
    import sys

    if sys.argv[1:2] == ["--child"]:
        _child(**json.loads(sys.argv[2]))

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

from dataclasses import dataclass

from numba_flash import plan as P
from numba_flash import variant as V

#: Roles whose rows are queries, and keys (what a block's rows are in a walk).
QUERY_ROLES = ("q", "dout", "out", "lse", "delta", "dq")
KEY_ROLES = ("k", "v", "dk", "dv")
#: Roles a kernel writes: its outputs (the rest of its 4-D and row arguments it reads).
OUTPUT_ROLES = {"forward": ("out", "lse"), "preprocess": ("delta",), "backward": ("dq", "dk", "dv")}
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
    return 4 if role in ("lse", "delta") else d * item


def _visited(rows_tile: int, other_tile: int, keys_are_rows: bool, nq: int, nk: int, window) -> list:
    """Per row tile: the rows of the other axis it reads, summed over the tiles it visits
    (``flex.visit_lists``' ranges, without a block mask)."""
    from numba_flash.reference import _key_range, _query_range

    n_rows, n_other = (nk, nq) if keys_are_rows else (nq, nk)
    span = _query_range if keys_are_rows else _key_range
    out = []
    for r in range(-(-n_rows // rows_tile)):
        lo, hi = span(r * rows_tile, r * rows_tile + rows_tile, nq, nk, window)
        t_lo, t_hi = lo // other_tile, max(lo // other_tile, -(-hi // other_tile))
        out.append(sum(min(other_tile, n_other - t * other_tile) for t in range(t_lo, t_hi)))
    return out


def _problem(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k, allow_tf32, arch):
    features = V.variant_of(False, window, 0.0, False, 0.0, False, heads // (heads_k or heads))
    return P.Problem(pass_, dtype, head_dim, causal, allow_tf32, True, batch, heads, seqlen_q, seqlen_k, arch, False,
                     features, heads_k)  # fmt: skip


def flash(pass_: str, dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
          causal: bool = False, window=(-1, -1), heads_k: int = 0, allow_tf32: bool = False,
          arch=(9, 0)) -> list[Bytes]:  # fmt: skip
    """HBM bytes of each kernel numba-flash launches for this problem (the module
    docstring's model), in launch order."""
    plan = P.plan(_problem(pass_, dtype, batch, heads, seqlen_q, seqlen_k, head_dim, causal, window, heads_k,
                           allow_tf32, arch))  # fmt: skip
    item = _ITEM[plan.work_dtype]
    d, h_kv = head_dim, heads_k or heads
    win = V.check_window(window)
    win = (win[0], 0) if causal else win
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
        n_rows = seqlen_k if keys_are_rows else seqlen_q
        steps = sum(_visited(rows_tile, other_tile, keys_are_rows, seqlen_q, seqlen_k, win))
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


def summary(pass_: str, dtype: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool = False) -> dict:
    """One row of ``numba-flash io``: predicted bytes of both, their ratio, and the
    asymptotic terms (square attention, ``seqlen`` queries and keys)."""
    fl = flash(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal)
    st = standard(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal)
    plan = P.plan(_problem(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, (-1, -1), 0, False, (9, 0)))
    walks = [k.walk for k in plan.launches if k.walk and not k.walk[2]]  # the query-tile walk
    block_m = walks[0][0] if walks else 1
    flash_total, standard_total = sum(b.total for b in fl), sum(b.total for b in st)
    return {
        "pass": pass_, "dtype": dtype, "batch": batch, "heads": heads, "seqlen": seqlen, "head_dim": head_dim,
        "causal": causal, "flash_bytes": flash_total, "standard_bytes": standard_total,
        "ratio": standard_total / flash_total if flash_total else float("nan"),
        "flash_kernels": [b.__dict__ for b in fl], "standard_ops": [b.__dict__ for b in st],
        "asymptotic": asymptotic(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, block_m),
    }  # fmt: skip


# --- measuring (Nsight Compute in a child process) ------------------------------------------

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


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
    Returns ``{"flash": Bytes, "standard": Bytes, "kernels": [Bytes, ...]}``; raises
    RuntimeError with ncu's output when the run fails."""
    import csv
    import io
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
    text = run.stdout
    start = text.find('"ID"')
    if run.returncode != 0 or start < 0:
        raise RuntimeError(f"ncu failed (exit {run.returncode}): {(run.stderr or text)[-2000:]}")
    names = {k.name for k in P.plan(_problem(pass_, dtype, batch, heads, seqlen, seqlen, head_dim, causal, (-1, -1), 0,
                                             False, (9, 0))).launches}  # fmt: skip
    per: dict = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        key = (row["ID"], row["Kernel Name"])
        value = int(float(row["Metric Value"].replace(",", "")))
        entry = per.setdefault(key, [0, 0])
        entry[0 if row["Metric Name"] == NCU_METRICS[0] else 1] += value
    kernels = [Bytes(name, r, w) for (_, name), (r, w) in per.items()]
    ours = [b for b in kernels if any(n in b.name for n in names)]
    theirs = [b for b in kernels if b not in ours]
    return {"flash": Bytes("numba-flash", sum(b.read for b in ours), sum(b.write for b in ours)),
            "standard": Bytes("cupy-standard", sum(b.read for b in theirs), sum(b.write for b in theirs)),
            "kernels": kernels}  # fmt: skip


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
    bias = causal_bias(seqlen, seqlen) if causal else None
    out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
    s_out, p = cupy_attention_forward(qh, kh, vh, causal=causal, bias=bias)

    def both():  # one call of each implementation
        if pass_ == "forward":
            numba_flash.flash_attention(q, k, v, causal=causal)
            cupy_attention_forward(qh, kh, vh, causal=causal, bias=bias)
        else:
            numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
            cupy_attention_backward(doh, qh, kh, vh, s_out, p)

    for _ in range(2):  # warm-up: compiles, fills caches of plans and launches
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
    ``measured_flash`` / ``measured_standard`` ({"read", "write"}) from :func:`measure`,
    or ``measure_error``."""
    rows = []
    todo = [(p, n) for p in passes for n in seqlens]
    for i, (pass_, n) in enumerate(todo):
        row = summary(pass_, dtype, batch, heads, n, head_dim, causal)
        if measure_bytes:
            try:
                got = measure(pass_, dtype, batch, heads, n, head_dim, causal)
                row["measured_flash"] = {"read": got["flash"].read, "write": got["flash"].write}
                row["measured_standard"] = {"read": got["standard"].read, "write": got["standard"].write}
            except Exception as exc:  # one failed size (the standard attention out of memory) leaves the rest
                row["measure_error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
        rows.append(row)
        if progress:
            progress(i + 1, len(todo), f"{pass_} N={n}")
    return rows


def plot(rows, path: str) -> str:
    """Predicted (lines) and measured (markers) HBM bytes against N, log axes, one
    colour per implementation and a line style per pass."""
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
        for key, meas, color, label in (("flash_bytes", "measured_flash", "#d62728", "numba-flash"),
                                        ("standard_bytes", "measured_standard", "#7f7f7f", "standard (CuPy)")):
            ax.plot(n, [r[key] for r in sel], ls, color=color, label=f"{label} {pass_}, predicted")
            got = [(r["seqlen"], r[meas]["read"] + r[meas]["write"]) for r in sel if meas in r]
            if got:
                ax.plot(*zip(*got), "o" if pass_ == "forward" else "s", color=color, fillstyle="none",
                        label=f"{label} {pass_}, measured (ncu)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("HBM bytes read + written")
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

"""Peak device memory of attention against sequence length: linear for numba-flash,
quadratic for a standard attention (which materialises the N×N scores).

How it is measured (:func:`measure_peak`): the inputs are allocated first, from CuPy's
default pool; then the call runs with CuPy's allocator switched to a *fresh*
``cupy.cuda.MemoryPool`` that never returns memory to the device while it is measured,
so its ``total_bytes()`` afterwards is the high-water mark of everything the call
allocated (outputs, temporaries and saved tensors, rounded up to CuPy's 512-byte
granularity; fragmentation can only make it larger).  numba-flash allocates all its
device memory through CuPy, so this is all of it.  Not counted: memory that libraries
allocate behind CuPy's back (cuBLAS workspaces), the CUDA context, and the inputs, which
are reported separately.

``forward``           ``flash_attention(q, k, v, return_lse=True)``: outputs O and LSE.
``forward+backward``  the forward, then ``flash_attention_backward``: outputs O, LSE,
                      dQ, dK, dV (dout is an input).

For the CuPy standard attention (``numba_flash.bench.cupy_attention_forward`` /
``cupy_attention_backward``) the forward also keeps P, as a training forward does.
``beyond_outputs`` = peak − outputs: what the call needed on top of what it returns
(numba-flash: 0 in the forward — it allocates nothing beyond O and LSE — and one fp32
row vector, delta, in the backward; two, lse and delta padded to 128 rows, in the Hopper
backward's ``stats``).

JSON schema (``numba-flash-memory/1``): ``{"schema", "created", "environment",
"settings", "results": [row, ...]}`` with rows::

    impl ("numba-flash" | "cupy-standard"), pass ("forward" | "forward+backward"),
    dtype, batch, heads, seqlen, head_dim, causal,
    input_bytes, output_bytes, peak_bytes, beyond_outputs_bytes (int | null),
    growth (peak / peak at the previous, half, seqlen: ≈2 linear, ≈4 quadratic; null),
    status ("ok" | "oom" | "skipped" | "error" | "unsupported"), detail (str)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from numba_flash import _report

SCHEMA = "numba-flash-memory/1"
IMPLS = ("numba-flash", "cupy-standard")
PASSES = ("forward", "forward+backward")
ROW_KEYS = (
    "impl", "pass", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "input_bytes",
    "output_bytes", "peak_bytes", "beyond_outputs_bytes", "growth", "status", "detail",
)  # fmt: skip
DEFAULT_SEQLENS = tuple(1024 * 2**i for i in range(8))  # 1024 … 131072


@dataclass
class MemoryResult:
    impl: str
    pass_: str
    dtype: str
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool
    input_bytes: int = 0
    output_bytes: int = 0
    peak_bytes: int | None = None
    status: str = "ok"
    detail: str = ""
    growth: float | None = None

    @property
    def beyond_outputs_bytes(self) -> int | None:
        if self.peak_bytes is None:
            return None
        return max(0, self.peak_bytes - self.output_bytes)

    def to_dict(self) -> dict:
        row = {
            "impl": self.impl,
            "pass": self.pass_,
            "dtype": self.dtype,
            "batch": self.batch,
            "heads": self.heads,
            "seqlen": self.seqlen,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "peak_bytes": self.peak_bytes,
            "beyond_outputs_bytes": self.beyond_outputs_bytes,
            "growth": None if self.growth is None else round(self.growth, 3),
            "status": self.status,
            "detail": self.detail,
        }
        assert tuple(row) == ROW_KEYS
        return row


def seqlens_up_to(max_seqlen: int, start: int = 1024) -> list[int]:
    """start, 2·start, … up to max_seqlen (inclusive)."""
    if start < 1 or max_seqlen < start:
        raise ValueError(f"seqlens: need 1 <= start ({start}) <= max ({max_seqlen})")
    out, n = [], start
    while n <= max_seqlen:
        out.append(n)
        n *= 2
    return out


def measure_peak(fn: Callable[[], object], summarize: Callable[[object], object] = lambda r: None) -> tuple[int, object]:
    """Run ``fn`` with a fresh CuPy memory pool; return (peak bytes, ``summarize(result)``).

    The pool keeps every block it ever got while it is measured, so its
    ``total_bytes()`` is the high-water mark of the call's allocations.  ``fn``'s result
    is dropped (and the pool emptied) before returning: read what you need from it in
    ``summarize``."""
    import cupy

    pool = cupy.cuda.MemoryPool()
    result = None
    try:
        with cupy.cuda.using_allocator(pool.malloc):
            result = fn()
            cupy.cuda.Device().synchronize()
        peak = int(pool.total_bytes())
        summary = summarize(result)
        return peak, summary
    finally:
        result = None
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()


def _nbytes(arrays) -> int:
    return int(sum(int(a.nbytes) for a in arrays))


def _make_inputs(impl, dtype, batch, heads, n, head_dim, seed=0):
    import cupy

    rs = cupy.random.RandomState(seed)
    dt = cupy.dtype(dtype)
    shape = (batch, n, heads, head_dim) if impl == "numba-flash" else (batch, heads, n, head_dim)
    return [rs.standard_normal(shape, dtype=cupy.float32).astype(dt) for _ in range(4)]  # q, k, v, dout


def _run_one(impl: str, pass_: str, dtype: str, batch: int, heads: int, n: int, head_dim: int, causal: bool) -> MemoryResult:
    from numba_flash import api, bench

    r = MemoryResult(impl, pass_, dtype, batch, heads, n, head_dim, causal)
    inputs = None
    try:
        inputs = _make_inputs(impl, dtype, batch, heads, n, head_dim)
        q, k, v, dout = inputs
        r.input_bytes = _nbytes(inputs[:3] if pass_ == "forward" else inputs)
        if impl == "numba-flash":

            def fn():
                out, lse = api.flash_attention(q, k, v, causal=causal, return_lse=True)
                if pass_ == "forward":
                    return (out, lse)
                return (out, lse) + tuple(api.flash_attention_backward(dout, q, k, v, out, lse, causal=causal))

        else:

            def fn():
                out, p = bench.cupy_attention_forward(q, k, v, causal=causal)
                if pass_ == "forward":
                    return (out,), p  # P is saved for the backward: part of the peak, not an output
                grads = bench.cupy_attention_backward(dout, q, k, v, out, p)
                del p
                return (out,) + tuple(grads), None

        peak, out_bytes = measure_peak(fn, lambda res: _nbytes(res if impl == "numba-flash" else res[0]))
        r.output_bytes = out_bytes
        r.peak_bytes = peak
    except Exception as exc:
        r.status = "oom" if bench.is_oom(exc) else "error"
        r.detail = ("out of memory: " if r.status == "oom" else "") + bench._short(exc, 160)
    finally:
        inputs = q = k = v = dout = None
        bench.release_memory()
    return r


def run_memory(*, seqlens: Sequence[int] = DEFAULT_SEQLENS, impls: Iterable[str] = IMPLS,
               passes: Iterable[str] = PASSES, dtype: str = "float16", batch: int = 1, heads: int = 1,
               head_dim: int = 64, causal: bool = False, max_seqlen_standard: int | None = None,
               progress: Callable[[int, int, str], None] | None = None) -> list[MemoryResult]:  # fmt: skip
    """Peak memory for every (impl, pass, seqlen).  Once an implementation runs out of
    memory at some seqlen, its larger seqlens are recorded as ``skipped`` without trying.
    ``max_seqlen_standard`` caps the seqlens tried for the CuPy standard attention.
    Raises ``bench.NoDeviceError`` without a CUDA device."""
    from numba_flash import bench

    bench.require_device("memory measurements")
    impls, passes = tuple(impls), tuple(passes)
    for i in impls:
        if i not in IMPLS:
            raise ValueError(f"impl: expected one of {IMPLS}, got {i!r}")
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"pass: expected one of {PASSES}, got {p!r}")
    if dtype not in ("float16", "float32"):
        raise ValueError(f"dtype: expected float16 or float32, got {dtype!r}")
    seqlens = sorted(int(n) for n in seqlens)
    total = len(impls) * len(passes) * len(seqlens)
    done = 0
    results = []
    for impl in impls:
        for pass_ in passes:
            stopped = None
            prev = None
            for n in seqlens:
                if progress is not None:
                    progress(done, total, f"{impl} · {pass_} · N={n}")
                if stopped is not None:
                    r = MemoryResult(impl, pass_, dtype, batch, heads, n, head_dim, causal, status="skipped",
                                     detail=f"not tried: out of memory at N={stopped}")  # fmt: skip
                elif impl == "cupy-standard" and max_seqlen_standard is not None and n > max_seqlen_standard:
                    r = MemoryResult(impl, pass_, dtype, batch, heads, n, head_dim, causal, status="skipped",
                                     detail=f"not tried: above --max-seqlen-standard {max_seqlen_standard}")  # fmt: skip
                else:
                    r = _run_one(impl, pass_, dtype, batch, heads, n, head_dim, causal)
                    if r.status == "oom":
                        stopped = n
                if r.peak_bytes is not None and prev is not None and prev.peak_bytes and prev.seqlen * 2 == n:
                    r.growth = r.peak_bytes / prev.peak_bytes
                prev = r
                results.append(r)
                done += 1
    if progress is not None:
        progress(done, total, "done")
    return results


def to_json_dict(results: Sequence[MemoryResult], *, settings: dict | None = None, environment: dict | None = None) -> dict:
    """The JSON document (schema in the module docstring)."""
    return _report.json_document(SCHEMA, results, settings=settings, environment=environment)


def write_json(results, path, **kw) -> None:
    _report.write_json(to_json_dict(results, **kw), path)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    x = float(n)
    for u in units:
        x /= 1024.0
        if x < 1024 or u == units[-1]:
            return f"{x:.1f} {u}" if x < 100 else f"{x:.0f} {u}"
    return f"{n} B"  # pragma: no cover


def plot(results, path, *, title: str | None = None) -> str:
    """Peak memory (log scale) against seqlen (log scale), one line per (impl, pass);
    out-of-memory points marked.  ``results``: MemoryResult objects or JSON rows."""
    from numba_flash.bench import _pyplot

    plt = _pyplot()
    rows = [r.to_dict() if isinstance(r, MemoryResult) else dict(r) for r in results]
    if not rows:
        raise ValueError("nothing to plot: no results")
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    styles = {"numba-flash": ("#d62728", "o"), "cupy-standard": ("#7f7f7f", "s")}
    for impl in IMPLS:
        for pass_, ls in zip(PASSES, ("-", "--")):
            sel = sorted((r for r in rows if r["impl"] == impl and r["pass"] == pass_), key=lambda r: r["seqlen"])
            if not sel:
                continue
            color, marker = styles.get(impl, ("black", "."))
            ok = [r for r in sel if r["status"] == "ok" and r["peak_bytes"]]
            if ok:
                ax.plot([r["seqlen"] for r in ok], [r["peak_bytes"] / 2**20 for r in ok], ls, color=color,
                        marker=marker, label=f"{impl} {pass_}")  # fmt: skip
            oom = [r for r in sel if r["status"] == "oom"]
            for r in oom[:1]:
                y = ok[-1]["peak_bytes"] / 2**20 if ok else 1.0
                ax.plot([r["seqlen"]], [y], "x", color=color, markersize=9)
                ax.annotate("out of memory", (r["seqlen"], y), textcoords="offset points", xytext=(4, 6),
                            fontsize=7, color=color)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak device memory beyond inputs (MiB)")
    seqs = sorted({r["seqlen"] for r in rows})
    ax.set_xticks(seqs)
    ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in seqs])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    r0 = rows[0]
    ax.set_title(
        title or f"peak memory, B={r0['batch']} H={r0['heads']} d={r0['head_dim']} {r0['dtype']}"
        f"{' causal' if r0['causal'] else ''}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)

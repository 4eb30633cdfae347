"""Benchmark results: :class:`BenchResult` rows, the derived forward+backward rows and
ratios (:func:`add_derived`), and the output: JSON, CSV, plot.

JSON schema (:func:`to_json_dict`, schema id ``numba-flash-bench/1``)
--------------------------------------------------------------------
Top level::

    {"schema": "numba-flash-bench/1", "created": ISO-8601 time,
     "environment": {...numba_flash.info.gather_info() summary...},
     "settings": {"warmup": int, "rep": int, "min_rep": int, "budget_ms": float,
                  "l2_bytes": int | null, "layout": str, ...; the command line adds
                  "preset" and "varlen_seed" (int, or null without --varlen)},
     "results": [row, ...]}

One ``row`` per (case, implementation, pass)::

    impl                  str   one of IMPLS
    pass                  str   "forward" | "backward" | "forward+backward"
                                (the last is derived: the sum of the two measured passes)
    dtype                 str   "float16" | "bfloat16" | "float32"
    batch, heads          int
    seqlen_q, seqlen_k    int   (varlen: the mean sequence length, both)
    head_dim              int
    causal                bool
    varlen                bool  a packed batch of sequences of different lengths
    padded                bool  this implementation ran the varlen case's padded batch,
                                (batch, max_seqlen, heads, head_dim): it has no varlen
                                entry (numba-flash-padded: on purpose); its flops are
                                still the real pairs', so its ratio is a time ratio
    total_seqlen          int | null  varlen: the tokens packed, batch·seqlen_q
    max_seqlen            int | null  varlen: the longest sequence (the padded length)
    seqlens               [int] | null  varlen: the lengths, q and k alike (CSV: space-separated)
    flops                 float FLOPs of one call (see above; varlen: 4·H·d per visible
                                pair of each sequence, padded rows too)
    ms                    float | null  median time of one call, milliseconds
    ms_min, ms_max        float | null  fastest and slowest timed call
    ms_q1, ms_q3          float | null  quartiles of the timed calls
    reps                  int   timed calls (0 when it did not run)
    rotation              int   input sets cycled through
    tflops                float | null  flops / ms / 1e9
    status                str   "ok" | "oom" | "unsupported" | "unavailable" | "error"
    detail                str   why, when status is not "ok" ("" otherwise)
    ratio_vs_numba_flash  float | null  ms / ms of numba-flash on the same case and pass:
                                > 1 means numba-flash is faster; 1.0 for numba-flash;
                                null when either did not run

The CSV (:func:`write_csv`) has the row keys as columns, in that order.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Sequence

from numba_flash import _report
from numba_flash.bench.cases import ALL_PASSES, BenchCase, attention_flops, tflops
from numba_flash.bench.peers import IMPLS, VARLEN_IMPLS
from numba_flash.bench.timing import Timing

SCHEMA = "numba-flash-bench/1"
STATUSES = ("ok", "oom", "unsupported", "unavailable", "error")
ROW_KEYS = (
    "impl", "pass", "dtype", "batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "causal",
    "varlen", "padded", "total_seqlen", "max_seqlen", "seqlens", "flops", "ms", "ms_min", "ms_max", "ms_q1", "ms_q3", "reps", "rotation", "tflops",
    "status", "detail", "ratio_vs_numba_flash",
)  # fmt: skip


@dataclass
class BenchResult:
    impl: str
    pass_: str
    case: BenchCase
    status: str = "ok"
    detail: str = ""
    timing: Timing | None = None
    ratio_vs_numba_flash: float | None = None

    @property
    def padded(self) -> bool:
        """This row timed a varlen case's padded batch (an implementation without varlen)."""
        return self.case.varlen and self.impl not in VARLEN_IMPLS

    @property
    def flops(self) -> float:
        c = self.case
        return attention_flops(c.batch, c.heads, c.seqlen_q, c.seqlen_k, c.head_dim, c.causal, self.pass_, c.window,
                               c.seqlens, c.flex)  # fmt: skip

    @property
    def ms(self) -> float | None:
        return self.timing.ms if (self.timing is not None and self.status == "ok") else None

    @property
    def tflops(self) -> float | None:
        return tflops(self.flops, self.ms)

    def to_dict(self) -> dict:
        """The JSON row (schema in the module docstring)."""
        t = self.timing if self.status == "ok" else None
        c = self.case
        row = {
            "impl": self.impl,
            "pass": self.pass_,
            "dtype": c.dtype,
            "batch": c.batch,
            "heads": c.heads,
            "seqlen_q": c.seqlen_q,
            "seqlen_k": c.seqlen_k,
            "head_dim": c.head_dim,
            "causal": c.causal,
            "varlen": c.varlen,
            "padded": self.padded,
            "total_seqlen": sum(c.seqlens) if c.varlen else None,
            "max_seqlen": c.max_seqlen if c.varlen else None,
            "seqlens": list(c.seqlens) if c.varlen else None,
            "flops": self.flops,
            "ms": _round(t.ms) if t else None,
            "ms_min": _round(t.ms_min) if t else None,
            "ms_max": _round(t.ms_max) if t else None,
            "ms_q1": _round(t.ms_q1) if t else None,
            "ms_q3": _round(t.ms_q3) if t else None,
            "reps": t.reps if t else 0,
            "rotation": t.rotation if t else 0,
            "tflops": _round(self.tflops),
            "status": self.status,
            "detail": self.detail,
            "ratio_vs_numba_flash": _round(self.ratio_vs_numba_flash),
        }
        assert tuple(row) == ROW_KEYS
        return row


def _round(x, digits=6):
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def add_derived(results: list[BenchResult]) -> list[BenchResult]:
    """Append "forward+backward" rows (sum of the two passes) where both were measured,
    and fill ``ratio_vs_numba_flash`` on every row.  Returns the full list."""
    by_key = {(r.impl, r.pass_, r.case): r for r in results}
    out = [r for r in results if r.pass_ != "forward+backward"]
    for r in list(out):
        if r.pass_ != "forward":
            continue
        b = by_key.get((r.impl, "backward", r.case))
        if b is None:
            continue
        if r.status == "ok" and b.status == "ok":
            t = Timing(
                r.timing.ms + b.timing.ms,
                r.timing.ms_min + b.timing.ms_min,
                r.timing.ms_max + b.timing.ms_max,
                r.timing.ms_q1 + b.timing.ms_q1,
                r.timing.ms_q3 + b.timing.ms_q3,
                min(r.timing.reps, b.timing.reps),
                max(r.timing.rotation, b.timing.rotation),
            )
            out.append(BenchResult(r.impl, "forward+backward", r.case, "ok", "", t))
        else:
            bad = r if r.status != "ok" else b
            out.append(BenchResult(r.impl, "forward+backward", r.case, bad.status, f"{bad.pass_}: {bad.detail}"))
    ref = {(r.pass_, r.case): r for r in out if r.impl == "numba-flash"}
    for r in out:
        nf = ref.get((r.pass_, r.case))
        if r.ms is not None and nf is not None and nf.ms is not None:
            r.ratio_vs_numba_flash = r.ms / nf.ms
        else:
            r.ratio_vs_numba_flash = None
    order = {name: i for i, name in enumerate(IMPLS)}
    passes = {p: i for i, p in enumerate(ALL_PASSES)}
    case_order = {}
    for r in out:
        case_order.setdefault(r.case, len(case_order))
    out.sort(key=lambda r: (case_order[r.case], passes.get(r.pass_, 9), order.get(r.impl, 99)))
    return out


def to_json_dict(results: Sequence[BenchResult], *, settings: dict | None = None, environment: dict | None = None) -> dict:
    """The JSON document (schema in the module docstring)."""
    return _report.json_document(SCHEMA, results, settings=settings, environment=environment)


def write_json(results, path, **kw) -> None:
    _report.write_json(to_json_dict(results, **kw), path)


def csv_text(results: Sequence[BenchResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(ROW_KEYS), lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow({k: ("" if v is None else " ".join(map(str, v)) if isinstance(v, list) else v)
                    for k, v in r.to_dict().items()})  # fmt: skip
    return buf.getvalue()


def write_csv(results, path) -> None:
    with open(path, "w", newline="") as f:
        f.write(csv_text(results))


def rows_from_json(doc: dict) -> list[dict]:
    """The rows of a document written by :func:`write_json` (checks the schema id)."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema={doc.get('schema')!r})")
    return list(doc["results"])


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install 'numba-flash[plot]' (or pip install matplotlib)") from exc
    return plt


def plot(results, path, *, title: str | None = None) -> str:
    """TFLOP/s against sequence length, one bar per implementation, one panel per
    (pass, head dim, causal, dtype) — the layout of FlashAttention-2's README plots.
    Varlen cases sit at their mean length; a padded row's bar is hatched and its legend
    entry says "(padded)".  ``results``: BenchResult objects or JSON rows.  Returns ``path``."""
    plt = _pyplot()
    rows = [r.to_dict() if isinstance(r, BenchResult) else dict(r) for r in results]
    if not rows:
        raise ValueError("nothing to plot: no results")
    passes = [p for p in ALL_PASSES if any(r["pass"] == p for r in rows)]
    groups = []
    for r in rows:
        g = (r["dtype"], r["head_dim"], r["causal"])
        if g not in groups:
            groups.append(g)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    colors = {"numba-flash": "#d62728", "numba-flash-padded": "#8c564b", "numba-flash-tf32": "#e377c2",
              "cupy-standard": "#7f7f7f", "torch-sdpa-flash": "#1f77b4", "torch-sdpa-cudnn": "#2ca02c",
              "torch-sdpa-efficient": "#ff7f0e", "torch-sdpa-math": "#9467bd"}  # fmt: skip
    varlen = any(r.get("varlen") for r in rows)  # rows of an older document have no varlen keys
    fig, axes = plt.subplots(
        len(passes), len(groups), figsize=(max(6.0, 5.2 * len(groups)), 3.8 * len(passes)), squeeze=False
    )
    for pi, p in enumerate(passes):
        for gi, (dt, d, causal) in enumerate(groups):
            ax = axes[pi][gi]
            sel = [r for r in rows if r["pass"] == p and (r["dtype"], r["head_dim"], r["causal"]) == (dt, d, causal)]
            seqs = sorted({r["seqlen_k"] for r in sel})
            width = 0.8 / max(1, len(impls))
            for ii, impl in enumerate(impls):
                for si, n in enumerate(seqs):
                    match = [r for r in sel if r["impl"] == impl and r["seqlen_k"] == n]
                    if not match:
                        continue
                    r = match[0]
                    x = si - 0.4 + width * (ii + 0.5)
                    label = (f"{impl} (padded)" if r.get("padded") else impl) if si == 0 else None
                    bar = dict(color=colors.get(impl), label=label, hatch="//" if r.get("padded") else None)
                    if r["status"] == "ok" and r["tflops"] is not None:
                        ax.bar(x, r["tflops"], width, **bar)
                        ax.text(x, r["tflops"], f" {r['tflops']:.0f}", ha="center", va="bottom", fontsize=6,
                                rotation=90 if len(impls) > 3 else 0)  # fmt: skip
                    else:
                        ax.bar(x, 0, width, **bar)
                        ax.text(x, 0, {"oom": "OOM", "unsupported": "n/s"}.get(r["status"], "–"), ha="center",
                                va="bottom", fontsize=6, rotation=90)  # fmt: skip
            ax.set_xticks(range(len(seqs)))
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in seqs])
            ax.set_xlabel("mean sequence length (varlen)" if varlen else "sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"{p}, head dim {d}, {'causal' if causal else 'non-causal'}, {dt}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    height = fig.get_figheight()
    top = 1.0 - (0.45 + (0.35 if title else 0.0)) / height  # room for the title and the legend
    if title:
        fig.suptitle(title, y=1.0 - 0.12 / height, va="top")
    fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0 - (0.45 if title else 0.08) / height))  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)

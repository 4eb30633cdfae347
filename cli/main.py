"""``numba-flash``: check, bench, memory, info, inspect.

Only option parsing and output formatting live here; every number comes from a library
function (``numba_flash.check``, ``.bench``, ``.memory``, ``.info``, ``.inspection``).
The group's first action, before numba is imported anywhere, is to turn numba's CUDA
simulator on when there is no GPU (``numba_flash._gpu_probe.use_simulator_without_gpu``).

Conventions shared by the commands: every file a command writes (``--json``, ``--csv``,
``--plot``) is checked while the options are parsed, before any work (:class:`OutputFile`);
``--json FILE`` everywhere, ``--json -`` for stdout; stdout carries one thing (the JSON
of ``--json -``, else the PTX of ``inspect --ptx``, else the tables), the rest goes to
stderr (:class:`_Out`).
"""

from __future__ import annotations

import math
import os
import sys

import click

from numba_flash._report import write_json  # json and time only: imports no numba
from numba_flash.bench import IMPLS

CONTEXT = dict(help_option_names=["-h", "--help"], max_content_width=100)
ON_OFF_BOTH = click.Choice(["on", "off", "both"])
CHECK_DTYPES = ("float32", "float16", "bfloat16")
KERNEL_DTYPES = ("float32", "float16", "bfloat16")
BENCH_IMPLS = IMPLS  # numba_flash.bench imports only the standard library: --help stays fast


# --------------------------------------------------------------------------------------
# helpers: consoles, option parsing
# --------------------------------------------------------------------------------------


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(file=stream, highlight=False, width=None if tty else 150, soft_wrap=False)


def _fail(message: str, code: int = 1):
    """A clean error: the message on stderr, exit ``code``, no traceback."""
    click.echo(f"numba-flash: error: {message}", err=True)
    sys.exit(code)


def _causal_values(value: str) -> list[bool]:
    return {"on": [True], "off": [False], "both": [False, True]}[value]


def _split_multi(values) -> list[str]:
    """Options given several times and/or comma-separated: ("1,2", "3") → ["1","2","3"]."""
    out = []
    for v in values or ():
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def _parse_seqlens(ctx, param, values):
    items = _split_multi(values)
    if not items:
        return None
    from numba_flash.check import parse_seqlen  # pure Python, no numba

    try:
        return [parse_seqlen(s) for s in items]
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param)


def _parse_head_dims(ctx, param, values):
    items = _split_multi(values)
    if not items:
        return None
    dims = []
    for s in items:
        try:
            d = int(s)
        except ValueError:
            raise click.BadParameter(f"{s!r} is not an integer", ctx=ctx, param=param)
        if not 1 <= d <= 256:
            raise click.BadParameter(f"{d}: head dims are 1 to 256", ctx=ctx, param=param)
        dims.append(d)
    return dims


def _head_dim_one(ctx, param, value):
    if value is None:
        return None
    return _parse_head_dims(ctx, param, [str(value)])[0]


def _parse_window(ctx, param, value):
    """``--window L,R`` as flash-attn's ``window_size`` (-1: unbounded)."""
    if value is None:
        return None
    try:
        left, right = (int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected L,R (two ints, -1 meaning unbounded), got {value!r}")
    if left < -1 or right < -1:
        raise click.BadParameter(f"expected each side -1 (unbounded) or >= 0, got {value!r}")
    return left, right


def _variant_options(fn):
    """The variant options ``check`` and ``bench`` share (flash_attention's keywords)."""
    for opt in reversed([
        click.option("--kv-heads", type=click.IntRange(1, 65535), default=None,
                     help="KV heads (GQA/MQA; a divisor of the heads). Default: the heads (MHA)."),
        click.option("--window", type=str, default=None, callback=_parse_window, metavar="L,R",
                     help="Sliding window (flash-attn's window_size; -1 unbounded), e.g. 256,0."),
        click.option("--softcap", type=click.FloatRange(0), default=None, help="softcap (> 0: c·tanh(s/c))."),
        click.option("--alibi", is_flag=True, default=False, help="ALiBi with random slopes (batch, heads)."),
        click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None,
                     help="dropout_p (a seed is drawn per case)."),
    ]):  # fmt: skip
        fn = opt(fn)
    return fn


def _variants(kv_heads, window, softcap, alibi, dropout) -> dict:
    """The variant fields given on the command line ({} for none)."""
    v = {}
    if kv_heads is not None:
        v["kv_heads"] = kv_heads
    if window is not None:
        v["window"] = window
    if softcap:
        v["softcap"] = softcap
    if alibi:
        v["alibi"] = True
    if dropout:
        v["dropout"] = dropout
    return v


def _fmt_sci(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.2e}"


class OutputFile(click.ParamType):
    """A file a command will write, checked when the options are parsed, before any work:
    not a directory, its directory exists and is writable (and so is the file, if it
    exists).  ``stdout_ok``: ``-`` means standard output (``--json -``)."""

    name = "file"

    def __init__(self, stdout_ok: bool = False):
        self.stdout_ok = stdout_ok

    def get_metavar(self, param, ctx=None):
        return "FILE|-" if self.stdout_ok else "FILE"

    def convert(self, value, param, ctx):
        path = os.fsdecode(value) if isinstance(value, bytes) else str(value)
        if path == "-":
            if self.stdout_ok:
                return path
            self.fail("'-' (standard output) is taken by --json only; give a file name", param, ctx)
        if not path.strip():
            self.fail("empty file name", param, ctx)
        if os.path.isdir(path):
            self.fail(f"{path!r} is a directory, not a file", param, ctx)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.exists(parent):
            self.fail(f"cannot write {path!r}: directory {parent!r} does not exist", param, ctx)
        if not os.path.isdir(parent):
            self.fail(f"cannot write {path!r}: {parent!r} is not a directory", param, ctx)
        if os.path.exists(path):
            if not os.access(path, os.W_OK):
                self.fail(f"cannot write {path!r}: the file is not writable", param, ctx)
        elif not os.access(parent, os.W_OK | os.X_OK):
            self.fail(f"cannot write {path!r}: directory {parent!r} is not writable", param, ctx)
        return path


def _json_option(what: str):
    return click.option(
        "--json", "json_path", type=OutputFile(stdout_ok=True), default=None,
        help=f"Write {what} as JSON to FILE; '-' prints it on stdout (the tables then go to stderr).",
    )  # fmt: skip


def _distinct_outputs(**paths):
    """Two options naming the same file would overwrite each other: a usage error."""
    seen = {}
    for opt, path in paths.items():
        if path is None or path == "-":
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {opt} name the same file {path!r}")
        seen[key] = opt


class _Out:
    """Where the human-readable output goes: stdout, or stderr when stdout carries
    something else (the JSON of ``--json -``, the PTX of ``inspect --ptx``)."""

    def __init__(self, to_stderr: bool = False):
        self.err = to_stderr
        self._console = None

    def echo(self, message: str = "") -> None:
        click.echo(message, err=self.err)

    def wrote(self, path: str) -> None:
        """Say that ``path`` was written (nothing for ``-``: stdout was the file)."""
        if path != "-":
            self.echo(f"wrote {path}")

    def print(self, *objects) -> None:  # rich renderables and markup
        if self._console is None:
            self._console = _console(stderr=self.err)
        self._console.print(*objects)


def _need_matplotlib(plot_path: str):
    """matplotlib importable and the file name's extension a format it writes; else a
    clean error before any measurement."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        _fail("--plot needs matplotlib: pip install 'numba-flash[plot]' (or pip install matplotlib)")
    ext = os.path.splitext(plot_path)[1].lower().lstrip(".")
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext and ext not in formats:
        raise click.BadParameter(f"{plot_path!r}: matplotlib cannot write .{ext} files "
                                 f"(it writes {', '.join(sorted(formats))})", param_hint="'--plot'")  # fmt: skip


# --------------------------------------------------------------------------------------
# the group
# --------------------------------------------------------------------------------------


def _plot(draw, path: str, out) -> None:
    """Run ``draw()`` (it writes ``path``) and say so; a failure is a warning and exit 1."""
    try:
        draw()
        out.wrote(path)
    except Exception as exc:
        click.echo(f"numba-flash: warning: plotting failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)


def _print_version(ctx, param, value):
    if not value or ctx.resilient_parsing:
        return
    from numba_flash import __version__  # imports no numba

    click.echo(f"numba-flash {__version__}")
    ctx.exit()


@click.group(context_settings=CONTEXT)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
def main():
    """numba-flash: exact FlashAttention with kernels written in numba.cuda.

    Without a GPU the kernels run in numba's CUDA simulator (tiny shapes only).

    \b
    Examples:
      numba-flash check                      # kernels vs the float64 reference
      numba-flash bench --preset fa2 --json out.json --plot out.png
      numba-flash memory --json mem.json --plot mem.png
      numba-flash info --json -
      numba-flash inspect --pass forward --dtype float32 --head-dim 64
    """
    import warnings

    from numba_flash._gpu_probe import use_simulator_without_gpu  # imports no numba

    use_simulator_without_gpu()
    # numba warns about small grids ("Grid size 6 will likely result in GPU
    # under-utilization"): expected for the small cases these commands run
    warnings.filterwarnings("ignore", message=".*Grid size .* under-utilization")


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


@main.command(context_settings=CONTEXT)
@click.option("--seqlen", "seqlens", multiple=True, callback=_parse_seqlens, metavar="N|NQ:NK",
              help="Sequence length(s): N, or NQ:NK for seqlen_q != seqlen_k; repeat or comma-separate.")
@click.option("--head-dim", "head_dims", multiple=True, callback=_parse_head_dims, metavar="D",
              help="Head dim(s), 1 to 256; repeat or comma-separate.")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(CHECK_DTYPES), help="Dtype(s); repeatable.")
@click.option("--causal", type=ON_OFF_BOTH, default=None, help="Causal masking: on, off or both.")
@click.option("--layout", type=click.Choice(["bshd", "bhsd", "both"]), default=None, help="Input layout(s).")
@click.option("--batch", type=click.IntRange(1, 65535), default=None, help="Batch size.")
@click.option("--heads", type=click.IntRange(1, 65535), default=None, help="Number of heads.")
@click.option("--pass", "pass_", type=click.Choice(["forward", "backward", "both"]), default="both",
              show_default=True, help="Which outputs to check (backward also runs the forward).")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=None,
              help="Random seed (default: a fresh one, printed).")
@_json_option("the results (schema numba-flash-check/1)")
@click.option("--tf32", is_flag=True, default=False,
              help="float32 with allow_tf32=True (the TF32 tensor-core kernels, head dims 64 and 128), "
                   "judged against a TF32-rounded standard attention.")
@_variant_options
@click.option("--varlen", is_flag=True, default=False,
              help="Packed variable-length sequences (flash_attention_varlen): --batch sequences of lengths drawn "
                   "from 0 to twice the --seqlen values (their means).")
def check(seqlens, head_dims, dtypes, causal, layout, batch, heads, pass_, seed, json_path, tf32, kv_heads, window,
          softcap, alibi, dropout, varlen):
    """Forward and backward against the float64 reference, PASS/FAIL per output.

    Without shape options: the default grid (on a GPU: N in 1, 127, 1024 and Nq != Nk
    both ways, d in 64, 128, causal on/off, both layouts, float32, float16 and bfloat16;
    in the simulator: 9 tiny cases reaching every kernel family).  With some options: the
    product of the given values, the others taken from that grid.  Exit code 1 if any
    output fails its tolerance (float32: rel. error <= 1e-5 for O and LSE, <= 1e-4 for dQ,
    dK, dV; float16/bfloat16: O, dQ, dK, dV <= 2x / 3x the error of a standard attention in
    the same dtype, + half an ulp, and LSE (float32) <= 1e-5; --tf32: <= 2x / 3x the error
    of a standard attention on TF32-rounded operands, + the float32 bound).

    \b
    Examples:
      numba-flash check
      numba-flash check --seqlen 127 --seqlen 64:128 --head-dim 64 --causal both --seed 7
      numba-flash check --dtype float16 --layout bhsd --pass forward --json check.json
      numba-flash check --seqlen 9:17 --head-dim 16 --json - > check.json
      numba-flash check --tf32 --seqlen 1000:1500
      numba-flash check --heads 4 --kv-heads 1 --window 64,0 --softcap 30 --alibi --dropout 0.1
      numba-flash check --varlen --batch 8 --seqlen 500:700 --causal on
    """
    from numba_flash import check as C

    mode = C.runtime_mode()
    if mode == "none":
        _fail("no CUDA device found and numba's CUDA simulator is off "
              "(unset NUMBA_ENABLE_CUDASIM=0 to run the kernels in the simulator)")  # fmt: skip
    simulator = mode == "simulator"
    variants = _variants(kv_heads, window, softcap, alibi, dropout)
    if varlen:
        variants["varlen"] = True
    options_given = any(x is not None for x in (seqlens, head_dims, causal, layout, batch, heads)) or bool(dtypes)
    try:
        if options_given or tf32 or variants:
            cases = C.build_cases(
                simulator=simulator,
                seqlens=seqlens,
                head_dims=head_dims,
                dtypes=list(dtypes) or None,
                causal=None if causal is None else _causal_values(causal),
                layouts=None if layout is None else (["bshd", "bhsd"] if layout == "both" else [layout]),
                batch=batch,
                heads=heads,
                tf32=tf32,
                variants=variants,
            )
        else:
            cases = C.default_cases(simulator)
    except ValueError as exc:
        raise click.UsageError(str(exc))
    seed = C.new_seed() if seed is None else seed
    passes = ("forward", "backward") if pass_ == "both" else (pass_,)

    out = _Out(to_stderr=json_path == "-")  # stdout: the JSON alone
    if simulator:
        head = "CUDA simulator (no GPU found): kernels run on the CPU, so only tiny shapes"
    else:
        from numba_flash.info import device_info

        dev = device_info("gpu")
        head = f"{dev['name']} (compute capability {dev['compute_capability']})"
    out.echo(f"numba-flash check: {head}; {len(cases)} case(s), seed {seed}")
    if simulator and any(max(c.seqlen_q, c.seqlen_k) > 64 or c.batch * c.heads > 4 for c in cases):
        out.echo("  note: the simulator runs every CUDA thread as a Python thread; these shapes will take long")

    def on_case(r):
        status = "PASS" if r.passed else "FAIL"
        out.echo(f"  {status}  [{r.index + 1}/{len(cases)}] {r.case.label}  ({r.seconds:.1f} s)"
                 + (f"  {r.error}" if r.error else ""))  # fmt: skip

    results = C.run_check(cases, seed=seed, passes=passes, on_case=on_case)

    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"numba-flash check — seed {seed}", title_justify="left", show_lines=False)
    for col, just in (("#", "right"), ("case", "left"), ("output", "left"), ("max abs err", "right"),
                      ("rel err", "right"), ("limit", "right"), ("result", "left")):  # fmt: skip
        table.add_column(col, justify=just, no_wrap=col != "case")
    for r in results:
        if r.error:
            table.add_row(str(r.index + 1), escape(r.case.label), "—", "—", "—", "—", "[bold red]ERROR[/] " + escape(r.error))
            continue
        for j, o in enumerate(r.outputs):
            res = "[green]PASS[/]" if o.passed else "[bold red]FAIL[/]"
            if o.note:
                res += " " + escape(o.note)
            limit = _fmt_sci(o.limit)
            if o.baseline_rel is not None:
                limit += f" (base {_fmt_sci(o.baseline_rel)})"
            table.add_row(
                str(r.index + 1) if j == 0 else "",
                escape(r.case.label) if j == 0 else "",
                {"out": "O", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV"}[o.output],
                _fmt_sci(o.max_abs),
                _fmt_sci(o.rel),
                limit,
                res,
            )
        table.add_section()
    out.print(table)
    failed = [r for r in results if not r.passed]
    if json_path:
        doc = {
            "schema": "numba-flash-check/1",
            "mode": mode,
            "seed": seed,
            "passes": list(passes),
            "tolerances": {"float32": C.FP32_TOLERANCE, "lowp_factor": C.LOWP_FACTOR,
                           "lowp_floor": {dt: C.lowp_floor(dt) for dt in ("float16", "bfloat16")},
                           "zero_ref_floor": C.ZERO_REF_FLOOR},  # fmt: skip
            "passed": not failed,
            "results": [r.to_dict() for r in results],
        }
        write_json(doc, json_path)
        out.wrote(json_path)
    if failed:
        out.echo(f"FAILED: {len(failed)} of {len(results)} case(s) (seed {seed})")
        sys.exit(1)
    out.echo(f"all {len(results)} case(s) passed (seed {seed})")


# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------


def _progress(enabled: bool):
    """A rich progress bar as a ``progress(done, total, description)`` callback."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def cm():
        prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=_console(stderr=True), transient=True)  # fmt: skip
        with prog:
            task = prog.add_task("starting", total=None)

            def update(done, total, desc):
                prog.update(task, completed=done, total=total, description=desc[:70])

            yield update

    return cm()


def _bench_tables(results, out):
    from rich.markup import escape
    from rich.table import Table

    from numba_flash.bench import ALL_PASSES, IMPLS

    rows = [r.to_dict() for r in results]
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    short = {"ok": None, "oom": "OOM", "unsupported": "n/s", "unavailable": "n/a", "error": "error"}
    notes = {}
    shape = ("dtype", "batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "causal", "max_seqlen")
    for p in ALL_PASSES:
        sel = [r for r in rows if r["pass"] == p]
        if not sel:
            continue
        t = Table(title=f"{p}: TFLOP/s (time ÷ numba-flash's time; > 1 = numba-flash faster)", title_justify="left")
        t.add_column("case", no_wrap=True)
        for i in impls:
            t.add_column(i, justify="right", no_wrap=True)
        cases = []
        for r in sel:
            key = tuple(r[k] for k in shape)
            if key not in cases:
                cases.append(key)
        for key in cases:
            dt, b, h, nq, nk, d, c, n_max = key
            seq = f"N={nq}" if nq == nk else f"Nq={nq} Nk={nk}"
            seq = f"B={b} H={h} {seq}" if n_max is None else f"varlen B={b} mean={nq} max={n_max} H={h}"
            cells = [f"{dt} {seq} d={d}{' causal' if c else ''}"]
            for i in impls:
                m = [r for r in sel if r["impl"] == i and tuple(r[k] for k in shape) == key]
                if not m:
                    cells.append("")
                    continue
                r = m[0]
                if r["status"] == "ok":
                    if i == "numba-flash":
                        cells.append(f"{r['tflops']:.1f} ({r['ms']:.3g} ms)")
                    else:
                        ratio = r["ratio_vs_numba_flash"]
                        cells.append(f"{r['tflops']:.1f}" + (f" ({ratio:.2f}×)" if ratio is not None else ""))
                else:
                    cells.append(short.get(r["status"], r["status"]))
                    if r["detail"]:
                        notes.setdefault((i, r["status"], r["detail"]), None)
                cells[-1] += " p" if r["padded"] else ""
            t.add_row(*[escape(c) for c in cells])
        out.print(t)
    if any(r["padded"] for r in rows):
        out.print("p: ran the padded batch (B, max, H, d), as a user without varlen would (numba-flash-padded: on "
                  "purpose); TFLOP/s count the real pairs alone, so the bracket is the time ratio")  # fmt: skip
    if notes:
        out.print("[bold]not measured:[/]")
        for i, status, detail in list(notes)[:30]:
            out.print(f"  {escape(i)}: {short.get(status, status)} — {escape(detail)}")


@main.command(context_settings=CONTEXT)
@click.option("--preset", type=click.Choice(["fa2", "smoke"]), default=None,
              help="fa2: FlashAttention-2's grid (batch·seqlen = 16k, hidden 2048, d 64/128, seqlen 512…16k, "
                   "causal off/on). smoke: 4 quick shapes.")  # fmt: skip
@click.option("--seqlen", "seqlens", multiple=True, callback=_parse_seqlens, metavar="N|NQ:NK",
              help="Sequence length(s) for a single-shape run (default 2048).")
@click.option("--head-dim", "head_dims", multiple=True, callback=_parse_head_dims, metavar="D",
              help="Head dim(s) (default 64).")
@click.option("--batch", type=click.IntRange(1, 65535), default=None, help="Batch (default 16384 // seqlen).")
@click.option("--heads", type=click.IntRange(1, 65535), default=None, help="Heads (default 2048 // head dim).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["float16", "bfloat16", "float32"]),
              help="Dtype(s) (default float16, as FlashAttention-2's benchmarks).")
@click.option("--causal", type=ON_OFF_BOTH, default="both", show_default=True, help="Causal masking.")
@click.option("--pass", "pass_", type=click.Choice(["forward", "backward", "both"]), default="both",
              show_default=True, help="Which pass to time (both also reports forward+backward).")
@click.option("--impl", "impls", multiple=True, type=click.Choice(BENCH_IMPLS),
              help="Implementations to time (default: all; those not available are reported as such).")
@click.option("--layout", type=click.Choice(["bshd", "bhsd"]), default="bshd", show_default=True,
              help="numba-flash's input layout.")
@click.option("--warmup", type=click.IntRange(1, 1000), default=5, show_default=True, help="Warm-up calls.")
@click.option("--rep", type=click.IntRange(1, 100000), default=30, show_default=True, help="Most timed calls.")
@click.option("--min-rep", type=click.IntRange(1, 100000), default=5, show_default=True, help="Fewest timed calls.")
@click.option("--budget-ms", type=click.FloatRange(0, min_open=True), default=1500.0, show_default=True,
              help="Timed calls are cut to fit about this much time per measurement.")
@_json_option("the results (schema numba-flash-bench/1)")
@click.option("--csv", "csv_path", type=OutputFile(), default=None, help="Write the results as CSV to FILE.")
@click.option("--plot", "plot_path", type=OutputFile(), default=None,
              help="Draw TFLOP/s against seqlen per implementation into FILE (.png; needs matplotlib).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar (on stderr).")
@_variant_options
@click.option("--varlen", is_flag=True, default=False,
              help="Each case a packed batch (flash_attention_varlen) of --batch sequences (default 16384 // seqlen) "
                   "of random lengths, q and k alike, mean exactly the --seqlen N (uniform in [N/4, 7N/4], rescaled "
                   "to B·N tokens; NQ:NK is refused). The peers and numba-flash-padded time the padded batch "
                   "(B, max length, H, d); all count only the real pairs.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=None,
              help="Seed of the --varlen lengths (default 0: the same lengths every run).")
@click.option("--block-sparse", "block_sparse", type=click.FloatRange(0, 1, min_open=True), default=None,
              metavar="DENSITY", help="Block-sparse attention (FlexAttention's BlockMask, the FlashAttention paper's "
              "variant): a random pattern of 128-blocks kept with probability DENSITY (the diagonal always); "
              "TFLOP/s count the kept blocks.")
@click.option("--mask", "mask_kind", type=click.Choice(["document", "prefix", "sink"]), default=None,
              help="A mask_mod with its BlockMask: document (8 packed documents of random lengths), prefix "
              "(prefix-LM, N/4 bidirectional), sink (causal window of 1024 plus 4 sink tokens); TFLOP/s count "
              "the kept pairs. --causal defaults to off.")
@click.option("--decode", is_flag=True, default=False,
              help="Decode steps of flash_attention_with_kvcache instead: one new query a sequence against full "
                   "caches of each --seqlen N keys (default 4096, 32768, 131072), --batch (default 8), --heads "
                   "(default 32) on --kv-heads (default 8), --head-dim (default 128); prints K+V bytes read / time "
                   "against the device's copy bandwidth, queued and replayed from a CUDA graph, beside torch SDPA "
                   "flash and cuDNN.")
@click.option("--page-size", "page_sizes", multiple=True, type=click.IntRange(0), metavar="P",
              help="With --decode: cache layouts, 0 contiguous, P > 0 paged in pages of P rows (default 0 and 256).")
def bench(preset, seqlens, head_dims, batch, heads, dtypes, causal, pass_, impls, layout, warmup, rep, min_rep,
          budget_ms, json_path, csv_path, plot_path, progress, kv_heads, window, softcap, alibi, dropout, varlen,
          seed, block_sparse, mask_kind, decode, page_sizes):  # fmt: skip
    """Time forward / backward against CuPy and torch SDPA, with CUDA events.

    Median of many calls after warm-up, inputs rotated through more than 3x the L2
    cache.  TFLOP/s counts 4·B·H·Nq·Nk·d (x0.5 causal, x2.5 backward); with --varlen,
    4·H·d per visible (query, key) pair of each sequence.  Peers in the same run: a CuPy
    standard attention (fp32 math, materialised N×N) and, when torch is importable, torch
    SDPA's flash, cudnn, efficient and math backends (with --varlen, on the padded batch).
    A peer that is unavailable, unsupported or out of memory is reported, not a crash.
    Needs a GPU.

    \b
    Examples:
      numba-flash bench --preset fa2 --json out.json --plot out.png
      numba-flash bench --seqlen 4096 --head-dim 128 --causal on --pass forward
      numba-flash bench --seqlen 1024 --dtype float32 --impl numba-flash --impl cupy-standard --csv out.csv
      numba-flash bench --varlen --seqlen 1024 --head-dim 128 --causal on --seed 7
      numba-flash bench --seqlen 65536 --block-sparse 0.1 --batch 1 --heads 8
      numba-flash bench --seqlen 16384 --head-dim 128 --mask document
      numba-flash bench --decode --seqlen 4096,32768,131072 --json decode.json
    """
    if decode:
        _bench_decode(seqlens, head_dims, batch, heads, kv_heads, dtypes, page_sizes, json_path, progress,
                      preset=preset, varlen=varlen, flex=block_sparse is not None or mask_kind is not None,
                      variants=_variants(None, window, softcap, alibi, dropout), csv=csv_path, plot=plot_path)  # fmt: skip
        return
    if page_sizes:
        raise click.UsageError("--page-size is a --decode option: add --decode")
    if block_sparse is not None and mask_kind is not None:
        raise click.UsageError("--block-sparse and --mask are two kinds of block mask: give one")
    flex = f"block-sparse:{block_sparse:g}" if block_sparse is not None else f"mask:{mask_kind}" if mask_kind else ""
    if flex and varlen:
        raise click.UsageError(f"--{flex.split(':')[0]} and --varlen: a block mask is for a dense batch (a "
                               "document mask is the packed-sequence form: --mask document)")  # fmt: skip
    if mask_kind is not None and click.get_current_context().get_parameter_source("causal").name == "DEFAULT":
        causal = "off"  # the mask decides what a query sees
    if preset is not None and any(x is not None for x in (seqlens, head_dims, batch, heads)):
        raise click.UsageError("--preset fixes the shapes: drop --seqlen / --head-dim / --batch / --heads")
    if min_rep > rep:
        raise click.UsageError(f"--min-rep {min_rep} is larger than --rep {rep}")
    if varlen:
        unequal = [f"{nq}:{nk}" for nq, nk in seqlens or () if nq != nk]
        if unequal:
            raise click.UsageError(f"--varlen gives q and k the same sequence lengths (mean N): give --seqlen N, "
                                   f"not NQ:NK (got {', '.join(unequal)})")  # fmt: skip
    else:
        if seed is not None:
            raise click.UsageError("--seed draws the --varlen lengths: add --varlen, or drop --seed")
        if "numba-flash-padded" in impls:
            raise click.UsageError("--impl numba-flash-padded times a --varlen case's padded batch: add --varlen")
    _distinct_outputs(**{"--json": json_path, "--csv": csv_path, "--plot": plot_path})
    if plot_path:
        _need_matplotlib(plot_path)
    from numba_flash import bench as B

    dtypes = list(dtypes) or ["float16"]
    causal_vals = _causal_values(causal)
    variants = _variants(kv_heads, window, softcap, alibi, dropout)
    try:
        if preset is not None:
            cases = [c for c in B.preset_cases(preset, dtypes) if c.causal in causal_vals]
        else:
            cases = B.shape_cases(
                seqlens=seqlens or [(2048, 2048)],
                head_dims=head_dims or [64],
                dtypes=dtypes,
                causal=causal_vals,
                batch=batch,
                heads=heads,
            )
        cases = B.with_variants(cases, {**variants, **({"flex": flex} if flex else {})})
        if varlen:
            seed = B.VARLEN_SEED if seed is None else seed
            cases = B.varlen_cases(cases, seed)
    except ValueError as exc:
        raise click.UsageError(str(exc))
    try:
        B.require_device()
    except B.NoDeviceError as exc:
        _fail(f"bench: {exc}. Run it on a machine with an NVIDIA GPU (CuPy installed).")
    passes = ("forward", "backward") if pass_ == "both" else (pass_,)
    impl_names = list(impls) or [i for i in B.IMPLS if varlen or i != "numba-flash-padded"]
    from numba_flash.info import gather_info

    env = gather_info()
    dev = env["device"]
    out = _Out(to_stderr=json_path == "-")  # stdout: the JSON alone
    out.echo(f"numba-flash bench on {dev['name']} (cc {dev['compute_capability']}, {dev['sms']} SMs): "
             f"{len(cases)} case(s) × {len(passes)} pass(es) × {len(impl_names)} implementation(s)"
             + (f"; varlen lengths of seed {seed}, peers on the padded batch" if varlen else ""))  # fmt: skip
    with _progress(progress) as update:
        results = B.run_bench(cases, impls=impl_names, passes=passes, layout=layout, warmup=warmup, rep=rep,
                              min_rep=min_rep, budget_ms=budget_ms, progress=update)  # fmt: skip
    _bench_tables(results, out)
    settings = dict(warmup=warmup, rep=rep, min_rep=min_rep, budget_ms=budget_ms, l2_bytes=B.l2_bytes(),
                    layout=layout, preset=preset, varlen_seed=seed if varlen else None)  # fmt: skip
    environment = {"device": dev, "versions": env["versions"]}
    if json_path:
        B.write_json(results, json_path, settings=settings, environment=environment)
        out.wrote(json_path)
    if csv_path:
        B.write_csv(results, csv_path)
        out.wrote(csv_path)
    if plot_path:  # after the JSON and CSV: a plot must not lose the measurements
        _plot(lambda: B.plot(results, plot_path, title=f"numba-flash vs peers on {dev['name']}"), plot_path, out)


def _decode_cases(seqlens, head_dims, batch, heads, kv_heads, dtypes, page_sizes):
    """``bench --decode`` / ``memory --decode``'s cases from the shape options."""
    from numba_flash.bench import decode as D

    unequal = [f"{nq}:{nk}" for nq, nk in seqlens or () if nq != nk]
    if unequal:
        raise click.UsageError(f"--decode: --seqlen N gives the cache length (one query a sequence), not NQ:NK "
                               f"(got {', '.join(unequal)})")  # fmt: skip
    if len(head_dims or ()) > 1 or len(dtypes or ()) > 1:
        raise click.UsageError("--decode times one head dim and one dtype at a time")
    try:
        return D.decode_cases([nk for _, nk in seqlens] if seqlens else [4096, 32768, 131072],
                              page_sizes=tuple(page_sizes) or (0, 256), batch=batch or 8, heads=heads or 32,
                              heads_k=kv_heads or 8, head_dim=(head_dims or [128])[0],
                              dtype=(dtypes or ["float16"])[0])  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(f"--decode: {exc}")


def _bench_decode(seqlens, head_dims, batch, heads, kv_heads, dtypes, page_sizes, json_path, progress, *, preset,
                  varlen, flex, variants, csv, plot):  # fmt: skip
    if preset or varlen or flex or variants or csv or plot:
        raise click.UsageError("--decode times plain decode steps: it takes --seqlen, --batch, --heads, --kv-heads, "
                               "--head-dim, --dtype, --page-size and --json only")  # fmt: skip
    cases = _decode_cases(seqlens, head_dims, batch, heads, kv_heads, dtypes, page_sizes)
    from numba_flash import bench as B
    from numba_flash.bench import decode as D

    try:
        B.require_device()
    except B.NoDeviceError as exc:
        _fail(f"bench --decode: {exc}. Run it on a machine with an NVIDIA GPU (CuPy installed).")
    from rich.markup import escape
    from rich.table import Table

    from numba_flash.info import gather_info

    env = gather_info()
    out = _Out(to_stderr=json_path == "-")
    out.echo(f"numba-flash bench --decode on {env['device']['name']}: {len(cases)} case(s)")
    with _progress(progress) as update:
        results = D.run_decode(cases, progress=update)
    rows = [r.to_dict() for r in results]
    copy = rows[0]["copy_tbs"] if rows else float("nan")
    t = Table(title=f"decode steps: K+V bytes read / time, against the copy bandwidth ({copy:.2f} TB/s)",
              title_justify="left")  # fmt: skip
    for col in ("keys", "layout", "B", "H/H_kv", "splits", "queued ms", "TB/s", "of copy", "graph ms", "of copy ",
                "SDPA flash ms", "cuDNN ms", "status"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("layout", "status") else "right", no_wrap=True)

    def ms(x):
        return "—" if x != x else f"{x:.3f}"

    for r in rows:
        status = r["status"] if r["status"] != "ok" else (f"graph: {r['graph_error']}" if r["graph_error"] else "ok")
        t.add_row(str(r["cache_len"]), r["layout"], str(r["batch"]), f"{r['heads']}/{r['heads_k']}", str(r["splits"]),
                  ms(r["queued_ms"]), f"{r['queued_tbs']:.2f}", f"{r['queued_of_copy']:.2f}", ms(r["graph_ms"]),
                  f"{r['graph_of_copy']:.2f}", ms(r.get("sdpa_flash_ms", float("nan"))),
                  ms(r.get("sdpa_cudnn_ms", float("nan"))), escape(status + (f" {r['detail']}" if r["detail"] else "")))
    out.print(t)
    if json_path:
        from numba_flash import _report

        _report.write_json(_report.json_document(D.SCHEMA, rows, environment={"device": env["device"],
                                                                               "versions": env["versions"]}),
                           json_path)  # fmt: skip
        out.wrote(json_path)


# --------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------


@main.command(context_settings=CONTEXT)
@click.option("--max-seqlen", type=click.IntRange(1), default=131072, show_default=True,
              help="Largest N (N doubles from --min-seqlen).")
@click.option("--min-seqlen", type=click.IntRange(1), default=1024, show_default=True, help="Smallest N.")
@click.option("--batch", type=click.IntRange(1, 65535), default=1, show_default=True, help="Batch size.")
@click.option("--heads", type=click.IntRange(1, 65535), default=1, show_default=True, help="Number of heads.")
@click.option("--head-dim", type=int, default=64, show_default=True, callback=_head_dim_one, metavar="D",
              help="Head dim (1 to 256).")
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="Input dtype.")
@click.option("--causal/--no-causal", default=False, show_default=True, help="Causal masking.")
@click.option("--pass", "pass_", type=click.Choice(["forward", "forward+backward", "both"]), default="both",
              show_default=True, help="The call measured: the forward, forward then backward, or both.")
@click.option("--impl", "impls", multiple=True, type=click.Choice(["numba-flash", "cupy-standard"]),
              help="Implementations (default both).")
@click.option("--max-seqlen-standard", type=click.IntRange(1), default=None,
              help="Do not try the CuPy standard attention above this N (it stops at out-of-memory anyway).")
@_json_option("the results (schema numba-flash-memory/1)")
@click.option("--plot", "plot_path", type=OutputFile(), default=None,
              help="Draw peak memory against N into FILE (.png; needs matplotlib).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show a progress bar (on stderr).")
@click.option("--decode", is_flag=True, default=False,
              help="The workspace of a flash_attention_with_kvcache decode step instead (one query a sequence, "
                   "full caches of N = --min-seqlen … --max-seqlen keys, --heads on --kv-heads): predicted and "
                   "measured beside the split count; it grows with batch · heads · splits, not with N.")
@click.option("--kv-heads", type=click.IntRange(1, 65535), default=None, help="With --decode: KV heads (default "
              "--heads).")
@click.option("--page-size", "page_sizes", multiple=True, type=click.IntRange(0), metavar="P",
              help="With --decode: 0 contiguous, P > 0 pages of P rows (default 0 and 256).")
def memory(max_seqlen, min_seqlen, batch, heads, head_dim, dtype, causal, pass_, impls, max_seqlen_standard,
           json_path, plot_path, progress, decode, kv_heads, page_sizes):  # fmt: skip
    """Peak device memory against N: numba-flash (linear) vs a standard attention (quadratic).

    Peak = high-water mark of a fresh CuPy memory pool around the call (inputs counted
    separately).  The CuPy standard attention stops with "out of memory" gracefully.
    Needs a GPU.

    \b
    Examples:
      numba-flash memory --json mem.json --plot mem.png
      numba-flash memory --max-seqlen 32768 --head-dim 128 --dtype float32 --pass forward
      numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096
    """
    if min_seqlen > max_seqlen:
        raise click.UsageError(f"--min-seqlen {min_seqlen} is larger than --max-seqlen {max_seqlen}")
    if decode:
        if causal or impls or plot_path or max_seqlen_standard is not None:
            raise click.UsageError("--decode measures numba-flash's decode step: --causal, --impl, --plot and "
                                   "--max-seqlen-standard do not apply")  # fmt: skip
        _memory_decode(max_seqlen, min_seqlen, batch, heads, kv_heads or heads, head_dim, dtype, page_sizes,
                       json_path, progress)  # fmt: skip
        return
    if kv_heads is not None or page_sizes:
        raise click.UsageError("--kv-heads and --page-size are --decode options: add --decode")
    _distinct_outputs(**{"--json": json_path, "--plot": plot_path})
    if plot_path:
        _need_matplotlib(plot_path)
    from numba_flash import bench as B
    from numba_flash import memory as M

    try:
        B.require_device("memory measurements")
    except B.NoDeviceError as exc:
        _fail(f"memory: {exc}. Run it on a machine with an NVIDIA GPU (CuPy installed).")
    seqlens = M.seqlens_up_to(max_seqlen, min_seqlen)
    passes = ("forward", "forward+backward") if pass_ == "both" else (pass_,)
    from numba_flash.info import gather_info

    env = gather_info()
    out = _Out(to_stderr=json_path == "-")  # stdout: the JSON alone
    out.echo(f"numba-flash memory on {env['device']['name']}: B={batch} H={heads} d={head_dim} {dtype}"
             f"{' causal' if causal else ''}, N = {seqlens[0]} … {seqlens[-1]}")  # fmt: skip
    with _progress(progress) as update:
        results = M.run_memory(seqlens=seqlens, impls=list(impls) or list(M.IMPLS), passes=passes, dtype=dtype,
                               batch=batch, heads=heads, head_dim=head_dim, causal=causal,
                               max_seqlen_standard=max_seqlen_standard, progress=update)  # fmt: skip
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="peak device memory of the call (inputs listed apart)", title_justify="left")
    for col in ("N", "impl", "pass", "inputs", "outputs", "peak", "beyond outputs", "growth ×", "status"):
        t.add_column(col, justify="left" if col in ("impl", "pass", "status") else "right", no_wrap=True)
    notes = {}
    for r in sorted(results, key=lambda r: (r.seqlen, M.IMPLS.index(r.impl), M.PASSES.index(r.pass_))):
        status = r.status
        if r.status != "ok" and r.detail:
            mark = notes.setdefault(r.detail, len(notes) + 1)
            status = f"{r.status} [{mark}]"
        t.add_row(
            str(r.seqlen), r.impl, r.pass_, M.human_bytes(r.input_bytes), M.human_bytes(r.output_bytes),
            M.human_bytes(r.peak_bytes), M.human_bytes(r.beyond_outputs_bytes),
            "—" if r.growth is None else f"{r.growth:.2f}", escape(status),
        )  # fmt: skip
    out.print(t)
    for detail, mark in notes.items():
        out.print(escape(f"  [{mark}] {detail}"))
    settings = dict(seqlens=seqlens, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, causal=causal,
                    max_seqlen_standard=max_seqlen_standard)  # fmt: skip
    if json_path:
        M.write_json(results, json_path, settings=settings, environment={"device": env["device"],
                                                                       "versions": env["versions"]})  # fmt: skip
        out.wrote(json_path)
    if plot_path:
        _plot(lambda: M.plot(results, plot_path), plot_path, out)


def _memory_decode(max_seqlen, min_seqlen, batch, heads, kv_heads, head_dim, dtype, page_sizes, json_path, progress):
    from numba_flash import bench as B
    from numba_flash import memory as M
    from numba_flash.bench import decode as D

    lens = M.seqlens_up_to(max_seqlen, min_seqlen)
    cases = _decode_cases([(n, n) for n in lens], [head_dim], batch, heads, kv_heads, [dtype], page_sizes)
    try:
        B.require_device("memory measurements")
    except B.NoDeviceError as exc:
        _fail(f"memory --decode: {exc}. Run it on a machine with an NVIDIA GPU (CuPy installed).")
    from rich.markup import escape
    from rich.table import Table

    from numba_flash.info import gather_info

    env = gather_info()
    out = _Out(to_stderr=json_path == "-")
    out.echo(f"numba-flash memory --decode on {env['device']['name']}: B={batch} H={heads}/{kv_heads} d={head_dim} "
             f"{dtype}, one query a sequence, caches of {lens[0]} … {lens[-1]} keys")  # fmt: skip
    with _progress(progress) as update:
        rows = D.decode_memory(cases, progress=update)
    t = Table(title="decode workspace: what a step allocates beyond its output", title_justify="left")
    for col in ("keys", "layout", "cache (K+V)", "splits", "predicted", "measured", "output", "status"):
        t.add_column(col, justify="left" if col in ("layout", "status") else "right", no_wrap=True)
    for r in rows:
        splits = str(r.get("splits", "—")) + (" (in a cluster)" if r.get("cluster", 0) > 1 else "")
        t.add_row(str(r["cache_len"]), r["layout"], M.human_bytes(r["cache_bytes"]), splits,
                  M.human_bytes(r.get("predicted_workspace_bytes")), M.human_bytes(r.get("workspace_bytes")),
                  M.human_bytes(r.get("output_bytes")), escape(r["status"] + (f" {r['detail']}" if r["detail"] else "")))
    out.print(t)
    if json_path:
        from numba_flash import _report

        _report.write_json(_report.json_document(D.SCHEMA.replace("bench-decode", "memory-decode"), rows,
                                                 environment={"device": env["device"], "versions": env["versions"]}),
                           json_path)  # fmt: skip
        out.wrote(json_path)


# --------------------------------------------------------------------------------------
# launch
# --------------------------------------------------------------------------------------


@main.command(context_settings=dict(CONTEXT, ignore_unknown_options=True, allow_interspersed_args=False))
@click.option("-n", "--nproc", type=click.IntRange(1), default=None,
              help="Processes, one per GPU of this host (default: every GPU).")
@click.option("--print-id", is_flag=True, default=False,
              help="Print a fresh NCCL unique id (hex) and exit: for mpirun, set NUMBA_FLASH_NCCL_ID to it on "
                   "every rank.")  # fmt: skip
@click.argument("script", required=False, type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch(nproc, print_id, script, args):
    """Run SCRIPT in one process per GPU, for ring attention over NCCL.

    Each process gets NUMBA_FLASH_RANK, NUMBA_FLASH_WORLD_SIZE and the NCCL unique id
    (NUMBA_FLASH_NCCL_ID) in its environment, and NCCL_NVLS_ENABLE=0 unless set;
    numba_flash.distributed.init_ring() in the script builds the ring from them. If a
    process fails, the others are stopped and its exit code is returned.

    \b
    Examples:
      numba-flash launch -n 2 scripts/ring_attention_example.py --seqlen 131072 --causal
      numba-flash launch --print-id
    """
    from numba_flash import launch as L

    try:
        if print_id:
            click.echo(L.nccl_unique_id())
            return
        if script is None:
            raise click.UsageError("SCRIPT: give the Python script to run in every process")
        sys.exit(L.launch(script, args, nproc=L.gpu_count() if nproc is None else nproc))
    except (ValueError, RuntimeError) as exc:
        _fail(f"launch: {exc}")


# --------------------------------------------------------------------------------------
# io
# --------------------------------------------------------------------------------------


@main.command("io", context_settings=CONTEXT)
@click.option("--seqlen", "seqlens", multiple=True, callback=_parse_seqlens, metavar="N",
              help="Sequence length(s) N (queries = keys); repeatable or comma-separated "
                   "[default: 1024 … 65536, doubling].")
@click.option("--head-dim", type=int, default=64, show_default=True, callback=_head_dim_one, metavar="D",
              help="Head dim (1 to 256).")
@click.option("--batch", type=click.IntRange(1, 65535), default=1, show_default=True, help="Batch size.")
@click.option("--heads", type=click.IntRange(1, 65535), default=16, show_default=True, help="Number of heads.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True,
              help="Input dtype.")
@click.option("--causal/--no-causal", default=False, show_default=True, help="Causal masking.")
@click.option("--pass", "pass_", type=click.Choice(["forward", "backward", "both"]), default="both",
              show_default=True, help="The pass modelled (and measured).")
@click.option("--measure/--no-measure", default=None,
              help="Measure DRAM bytes with Nsight Compute (default: when ncu and a GPU are there).")
@_json_option("the rows (schema numba-flash-io/1)")
@click.option("--plot", "plot_path", type=OutputFile(), default=None,
              help="Draw predicted (and measured) bytes against N into FILE (.png; needs matplotlib).")
def io_traffic(seqlens, head_dim, batch, heads, dtype, causal, pass_, measure, json_path, plot_path):
    """HBM traffic: numba-flash's kernels against a standard attention (the paper's IO claim).

    Predicted from the launch plan the kernels run with (numba_flash.traffic): each
    block's tile loads and stores (what the SMs ask of L2, the paper's count), and the
    DRAM traffic behind L2 (blocks running at once share their tiles; L2 keeps 30 MB
    of them) and, for the CuPy standard attention, from its operations (fp32 scores
    written and read pass by pass).  With Nsight Compute (ncu) on PATH and a GPU, also
    measured: dram__bytes_read.sum + dram__bytes_write.sum and the L2 sectors the SMs
    asked for, of one call each, in a child process under ncu --clock-control none.

    \b
    Examples:
      numba-flash io --seqlen 1024,4096,16384 --pass forward
      numba-flash io --head-dim 128 --causal --json io.json --plot io.png
    """
    _distinct_outputs(**{"--json": json_path, "--plot": plot_path})
    if plot_path:
        _need_matplotlib(plot_path)
    from numba_flash import traffic as T

    out = _Out(to_stderr=json_path == "-")
    ns = []
    for nq, nk in seqlens or [(1024 * 2**i, 1024 * 2**i) for i in range(7)]:
        if nq != nk:
            raise click.BadParameter(f"{nq}:{nk}: io models square attention; give N", param_hint="--seqlen")
        ns.append(nq)
    why = T.ncu_unavailable() if measure is not False else "--no-measure"
    if measure and why:
        _fail(f"io: cannot measure: {why}")
    passes = ("forward", "backward") if pass_ == "both" else (pass_,)
    out.echo(f"numba-flash io: B={batch} H={heads} d={head_dim} {dtype}{' causal' if causal else ''}; "
             + ("measured with ncu beside the model" if not why else f"model only (not measured: {why})"))  # fmt: skip
    rows = T.sweep(passes, dtype, batch, heads, ns, head_dim, causal, measure_bytes=not why)
    from rich.table import Table

    from numba_flash.memory import human_bytes

    t = Table(title="HBM bytes read + written by one call (predicted; measured by ncu where given)",
              title_justify="left")  # fmt: skip
    cols = ["N", "pass", "flash tile loads", "flash DRAM predicted", "standard predicted", "standard / flash"]
    if not why:
        cols += ["flash L2 measured", "/ tile loads", "flash DRAM measured", "/ predicted", "standard measured",
                 "/ predicted"]  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "pass" else "right", no_wrap=True)
    for r in rows:
        cells = [str(r["seqlen"]), r["pass"], human_bytes(r["flash_bytes"]), human_bytes(r["flash_dram_bytes"]),
                 human_bytes(r["standard_bytes"]), f"{r['ratio']:.1f}"]  # fmt: skip
        if not why:
            if "measure_error" in r:
                cells += ["—", "", "—", r["measure_error"][:40], "—", ""]
            else:
                mf = r["measured_flash"]["read"] + r["measured_flash"]["write"]
                cells += [human_bytes(r["measured_flash_l2"]), f"{r['measured_flash_l2'] / r['flash_bytes']:.2f}",
                          human_bytes(mf), f"{mf / r['flash_dram_bytes']:.2f}"]  # fmt: skip
                if "measured_standard" in r:
                    ms = r["measured_standard"]["read"] + r["measured_standard"]["write"]
                    cells += [human_bytes(ms), f"{ms / r['standard_bytes']:.2f}"]
                else:
                    cells += ["did not fit", ""]
        t.add_row(*cells)
    out.print(t)
    for p in passes:
        a = next(r["asymptotic"] for r in rows if r["pass"] == p)
        out.echo(f"leading terms, {p}: standard {a['standard_formula']}, flash {a['flash_formula']}")
    if json_path:
        from numba_flash import _report

        settings = dict(seqlens=ns, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, causal=causal,
                        passes=list(passes), measured=not why, not_measured_because=why)  # fmt: skip
        _report.write_json(_report.json_document(T.SCHEMA, rows, settings=settings), json_path)
        out.wrote(json_path)
    if plot_path:
        _plot(lambda: T.plot(rows, plot_path), plot_path, out)


# --------------------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------------------


@main.command(context_settings=CONTEXT)
@_json_option("the information")
def info(json_path):
    """Device, versions, simulator on/off, and the kernels the launch plan runs (dtype × head dim).

    \b
    Examples:
      numba-flash info
      numba-flash info --json -
      numba-flash info --json info.json
    """
    from rich.markup import escape
    from rich.table import Table

    from numba_flash.info import gather_info
    from numba_flash.memory import human_bytes

    data = gather_info()
    out = _Out(to_stderr=json_path == "-")  # stdout: the JSON alone
    out.echo(f"simulator: {'on' if data['simulator'] else 'off'}"
             + ("  (no GPU found: kernels run in numba's CUDA simulator)" if data["simulator"] else ""))  # fmt: skip
    dev = data["device"]

    def mem(x):
        return human_bytes(x) if isinstance(x, int) else str(x)

    t = Table(title="device", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value")
    for label, key, fmt in (
        ("name", "name", str), ("compute capability", "compute_capability", str), ("SMs", "sms", str),
        ("shared memory per block", "shared_memory_per_block", mem),
        ("shared memory per block (opt-in)", "shared_memory_per_block_optin", mem),
        ("L2 cache", "l2_cache", mem), ("memory", "total_memory", mem),
        ("driver (CUDA version)", "driver_version", str), ("CUDA runtime", "runtime_version", str),
    ):  # fmt: skip
        t.add_row(label, escape(fmt(dev[key])))
    out.print(t)
    t = Table(title="software", title_justify="left", show_header=False)
    t.add_column("package")
    t.add_column("version")
    for k, v in data["versions"].items():
        t.add_row(k, escape(str(v)))
    out.print(t)
    t = Table(title="kernels available", title_justify="left")
    for col in ("dtype", "head dims", "forward", "backward"):
        t.add_column(col)
    for row in data["kernels"]:
        t.add_row(*(escape(str(row.get(k, ""))) for k in ("dtype", "head_dims", "forward", "backward")))
    out.print(t)
    if json_path:
        write_json(data, json_path)
        out.wrote(json_path)


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------


def _tiles_text(tiles: dict) -> str:
    short = {"group": "G", "block_m": "M", "block_n": "N", "threads": "T", "warps": "W", "stages": "S",
             "rows": "R", "cols": "C"}  # fmt: skip
    return " ".join(f"{short.get(k, k)}={v}" for k, v in tiles.items() if k != "head_dim")


def _parse_arch_opt(ctx, param, value):
    from numba_flash.inspection import arch_name  # pure Python

    try:
        return arch_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param)


@main.command(context_settings=CONTEXT)
@click.option("--pass", "pass_", type=click.Choice(["forward", "backward"]), required=True, help="Which pass.")
@click.option("--dtype", type=click.Choice(KERNEL_DTYPES), required=True, help="Input dtype.")
@click.option("--head-dim", type=int, required=True, callback=_head_dim_one, metavar="D",
              help="Head dim (1 to 256).")
@click.option("--causal/--no-causal", default=False, show_default=True, help="The causal variant.")
@click.option("--arch", default="sm_90", show_default=True, callback=_parse_arch_opt,
              help="Target architecture, sm_XY (sm_90a: the arch-specific target wgmma needs).")
@click.option("--tf32", is_flag=True,
              help="As allow_tf32=True: the float32 forward / backward on TF32 tensor cores (--dtype float32 only).")
@click.option("--ptx", "show_ptx", is_flag=True,
              help="Print the PTX on stdout, alone (the summary goes to stderr); with --json, the PTX is in "
                   "the JSON too.")  # fmt: skip
@click.option("--seqlen-q", type=click.IntRange(1), default=4096, show_default=True, metavar="N",
              help="Query rows a sequence the kernels are planned for (at most 16: the forward's one-warp "
                   "decode tiles).")  # fmt: skip
@_json_option("the summary (schema numba-flash-inspect/1)")
def inspect(pass_, dtype, head_dim, causal, arch, tf32, show_ptx, seqlen_q, json_path):
    """Compile the kernels a pass would launch (no GPU needed) and summarise them.

    The kernels are the launch plan's for the pass, dtype, head dim and architecture;
    when a faster family does not apply there (e.g. tensor cores before sm_80) the plan's
    note says why, above the table.  Registers, spills, stack, shared and local memory
    (from nvJitLink or ptxas when one is available, else "n/a"), static shared/local
    memory from the PTX, the dynamic shared memory of the launch, and static counts of
    the instructions that matter: mma, ldmatrix, cp.async, ld/st by state space (shared,
    global, generic, local), ex2, shfl, bar.sync, fma, atom.

    \b
    Examples:
      numba-flash inspect --pass forward --dtype float32 --head-dim 64
      numba-flash inspect --pass backward --dtype float16 --head-dim 128 --causal --arch sm_80
      numba-flash inspect --pass forward --dtype float16 --head-dim 64 --arch sm_75
      numba-flash inspect --pass forward --dtype float32 --head-dim 64 --ptx > fwd.ptx
      numba-flash inspect --pass forward --dtype float32 --head-dim 128 --tf32 --json -
      numba-flash inspect --pass forward --dtype float16 --head-dim 128 --seqlen-q 1
    """
    if tf32 and dtype != "float32":
        raise click.UsageError(f"--tf32 applies to --dtype float32 (got --dtype {dtype})")
    from numba_flash._report import json_document
    from numba_flash.info import versions
    from numba_flash.inspection import COUNT_KEYS, inspect_kernels

    try:
        reports = inspect_kernels(pass_, dtype, head_dim, causal, arch=arch, tf32=tf32, seqlen_q=seqlen_q)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc))
    except RuntimeError as exc:
        _fail(str(exc))
    from rich.markup import escape
    from rich.table import Table

    from numba_flash.memory import human_bytes

    # stdout carries one thing: the JSON (--json -), else the PTX (--ptx), else the summary
    out = _Out(to_stderr=show_ptx or json_path == "-")
    note = next((r.note for r in reports if r.note), "")
    out.echo(f"numba-flash inspect: {pass_}, {dtype}{' (allow_tf32)' if tf32 else ''}, head dim {head_dim}, "
             f"{'causal' if causal else 'non-causal'}, "
             f"{arch}: {len(reports)} kernel(s), compiled with numba.cuda.compile_ptx (no GPU needed)")  # fmt: skip
    if note:
        out.echo(f"note: {note}")
    out.echo("resources, and instruction counts in the PTX (static: in the code, not executed):")
    t = Table()
    t.add_column("")
    for r in reports:
        t.add_column(r.name, justify="right")

    def na(x, fmt=str):
        return "n/a" if x is None else fmt(x)

    rows = [
        ("family", [r.family for r in reports]),
        ("tiles", [_tiles_text(r.tiles) for r in reports]),
        ("registers / thread", [na(r.registers) for r in reports]),
        ("spill stores / loads", [na(r.spill_stores, lambda x: f"{x} B") + " / " + na(r.spill_loads, lambda x: f"{x} B")
                                  for r in reports]),  # fmt: skip
        ("stack frame", [na(r.stack_bytes, lambda x: f"{x} B") for r in reports]),
        ("shared memory (assembler)", [na(r.shared_bytes, human_bytes) for r in reports]),
        ("local memory (assembler)", [na(r.local_bytes, lambda x: f"{x} B") for r in reports]),
        ("shared memory (PTX decl.)", [human_bytes(r.shared_bytes_ptx) + (" + dynamic" if r.dynamic_shared else "")
                                       for r in reports]),  # fmt: skip
        ("dynamic shared (launch)", [na(r.dynamic_shared_bytes, human_bytes) if r.dynamic_shared else "—"
                                     for r in reports]),  # fmt: skip
        ("local memory (PTX decl.)", [f"{r.local_bytes_ptx} B" for r in reports]),
    ]
    for label, cells in rows:
        t.add_row(label, *(escape(str(c)) for c in cells))
    t.add_section()
    for key in COUNT_KEYS:
        t.add_row(key, *(str(r.counts.get(key, 0)) for r in reports))
    out.print(t)
    out.echo("registers/spills from: " + "; ".join(sorted({r.assembler for r in reports})))
    if json_path:
        settings = {"pass": pass_, "dtype": dtype, "head_dim": head_dim, "causal": causal, "arch": arch, "tf32": tf32}
        doc = json_document("numba-flash-inspect/1", [r.to_dict(with_ptx=show_ptx) for r in reports],
                            settings=settings, environment={"versions": versions()},
                            family=reports[0].family if reports else "", note=note)  # fmt: skip
        write_json(doc, json_path)
        out.wrote(json_path)
    if show_ptx and json_path != "-":
        for i, r in enumerate(reports):
            click.echo(("\n" if i else "") + f"// ===== {r.name} ({r.arch}) =====")
            click.echo(r.ptx)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="numba-flash")

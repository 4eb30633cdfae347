"""What the profile says about issue #11's missed bars: one call of each row's kernels under
Nsight Compute, after a warm-up outside the profiled range (fp16, causal, d = 128).

    ncu --clock-control none --profile-from-start off --csv --page raw --log-file bars.csv \\
        --metrics "$(python3 scripts/ncu_bars.py --metrics)" python3 scripts/ncu_bars.py
    python3 scripts/ncu_bars.py --table bars.csv          # the table, a row a kernel

Cases, in order (each opened by a ``bars_mark`` launch, a one-thread CuPy kernel that
names nothing but splits the report): plain / softcap 30 / ALiBi / dropout 0.1 forward at
(4, 16, 4096, 128); causal and window (1024, 0) forward and backward at (1, 16, 16384, 128);
the padded batch and the varlen batch (NumPy offsets, bench_variants' lengths: 16 sequences,
mean 1024) forward and backward.  Per kernel: its time, the tensor pipe's active cycles,
issue slots used, the SFU (xu), FMA and ALU pipes' share of their peak, instructions
executed, DRAM bytes read and the three largest stall reasons (warps stalled per issued
instruction).
"""

import csv
import sys

METRICS = ",".join([
    "gpu__time_duration.sum", "smsp__inst_executed.sum", "dram__bytes_read.sum",
    r"regex:^smsp__issue_active\.avg\.pct_of_peak_sustained_active$",
    r"regex:^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_active$",
    r"regex:^sm__inst_executed_pipe_(xu|fma|alu)\.avg\.pct_of_peak_sustained_active$",
    r"regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$",
])  # fmt: skip

CASES = ["plain fwd", "softcap fwd", "alibi fwd", "dropout fwd", "causal 16384 fwd", "causal 16384 bwd",
         "window fwd", "window bwd", "padded fwd", "padded bwd", "varlen fwd", "varlen bwd"]  # fmt: skip


def run():
    import cupy as cp
    import numpy as np

    import numba_flash
    from numba_flash.bench.cases import ragged_lengths

    rng = np.random.default_rng(20261201)

    def randn(*shape):
        return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)

    mark = cp.RawKernel(r'extern "C" __global__ void bars_mark(int c) {}', "bars_mark")
    calls = []  # (name, fn), in CASES' order
    B, H, N, d = 4, 16, 4096, 128
    q, k, v = randn(B, N, H, d), randn(B, N, H, d), randn(B, N, H, d)
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    for name, kw in (("plain", {}), ("softcap", dict(softcap=30.0)), ("alibi", dict(alibi_slopes=slopes)),
                     ("dropout", dict(dropout_p=0.1, seed=1234))):  # fmt: skip
        calls.append((f"{name} fwd", lambda kw=kw: numba_flash.flash_attention(q, k, v, causal=True, **kw)))
    B, H, N = 1, 16, 16384
    ql, kl, vl, dol = (randn(B, N, H, d) for _ in range(4))
    for name, kw in (("causal 16384", {}), ("window", dict(window_size=(1024, 0)))):
        o, lse = numba_flash.flash_attention(ql, kl, vl, causal=True, return_lse=True, **kw)
        calls.append((f"{name} fwd", lambda kw=kw: numba_flash.flash_attention(ql, kl, vl, causal=True, **kw)))
        calls.append((f"{name} bwd", lambda kw=kw, o=o, lse=lse: numba_flash.flash_attention_backward(
            dol, ql, kl, vl, o, lse, causal=True, **kw)))  # fmt: skip
    # bench_variants' varlen lengths (the same generator draws after its GQA rows': drawn anew here)
    lens = ragged_lengths(rng)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    Np, total = int(lens.max()), int(lens.sum())
    qp, kp, vp, dop = (randn(16, Np, H, d) for _ in range(4))
    op, lsep = numba_flash.flash_attention(qp, kp, vp, causal=True, return_lse=True)
    calls.append(("padded fwd", lambda: numba_flash.flash_attention(qp, kp, vp, causal=True)))
    calls.append(("padded bwd", lambda: numba_flash.flash_attention_backward(dop, qp, kp, vp, op, lsep, causal=True)))
    qv, kv, vv, dov = (randn(total, H, d) for _ in range(4))
    ov, lsev = numba_flash.flash_attention_varlen(qv, kv, vv, cu, cu, Np, Np, causal=True, return_lse=True)
    calls.append(("varlen fwd", lambda: numba_flash.flash_attention_varlen(qv, kv, vv, cu, cu, Np, Np, causal=True)))
    calls.append(("varlen bwd", lambda: numba_flash.flash_attention_varlen_backward(dov, qv, kv, vv, ov, lsev, cu, cu,
                                                                                    Np, Np, causal=True)))  # fmt: skip
    assert [c[0] for c in calls] == CASES
    for _, fn in calls:  # compiled and warm, outside the profiled range
        fn()
        fn()
    mark((1,), (1,), (np.int32(-1),))
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    for i, (name, fn) in enumerate(calls):
        mark((1,), (1,), (np.int32(i),))
        fn()
        cp.cuda.runtime.deviceSynchronize()
        print(f"ncu_bars: {name}", flush=True)
    cp.cuda.profiler.stop()
    print(f"ncu_bars: done (varlen lengths {lens.tolist()}, padded to {Np})")


def _num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return float("nan")


def table(path):
    lines = open(path).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    units = rows[0]  # the row after the header: each column's unit
    rows = [r for r in rows if r.get("ID", "").isdigit()]
    # ncu 2025's units ("ns", "byte"; older ones spell "nsecond", "Mbyte")
    to_us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[
        units["gpu__time_duration.sum"]]
    to_mb = {"byte": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0, "Gbyte": 1e3, "GB": 1e3}[
        units["dram__bytes_read.sum"]]
    stall = [c for c in rows[0] if c.startswith("smsp__average_warps_issue_stalled_")]

    def col(r, prefix):
        """The column named ``prefix`` or, for the short names below, its one
        ``.avg.pct_of_peak_sustained_active`` reading."""
        c = next((c for c in (prefix, prefix + ".avg.pct_of_peak_sustained_active") if c in r), None)
        return _num(r[c]) if c else float("nan")

    print("| case | kernel | µs | tensor pipe % | issue % | xu % | fma % | alu % | inst (M) | DRAM read MB | "
          "top stalls (per issue) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    case = -1
    for r in rows:
        name = r["Kernel Name"]
        if "bars_mark" in name:
            case += 1
            continue
        if case < 0 or case >= len(CASES):
            continue
        # numba's mangled names: the factory's (the backward's dK/dV and dQ share one: their grids tell)
        short = next((s for s in ("wgmma_forward", "wgmma_bwd", "stats") if s in name), name[:28])
        short += " " + r.get("Grid Size", "").replace(" ", "")
        dur = col(r, "gpu__time_duration.sum") * to_us
        st = sorted(((_num(r[c]), c.split("stalled_")[1].split("_per_issue")[0]) for c in stall), reverse=True)[:3]
        print(f"| {CASES[case]} | {short} | {dur:.1f} | {col(r, 'sm__pipe_tensor_cycles_active'):.1f} | "
              f"{col(r, 'smsp__issue_active'):.1f} | {col(r, 'sm__inst_executed_pipe_xu'):.1f} | "
              f"{col(r, 'sm__inst_executed_pipe_fma'):.1f} | {col(r, 'sm__inst_executed_pipe_alu'):.1f} | "
              f"{col(r, 'smsp__inst_executed.sum') / 1e6:.1f} | {col(r, 'dram__bytes_read.sum') * to_mb:.1f} | "
              + ", ".join(f"{n} {x:.2f}" for x, n in st) + " |")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:] == ["--metrics"]:
        print(METRICS)
    elif sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        run()

"""A variant against its baseline, timed in three orders, fp16, causal, d = 128:

    python3 scripts/bench_order.py out.jsonl [MODE ...]   (softcap | gqa | alibi | dropout | window | varlen)

issue #11's rows, each as its bar reads it: ``softcap`` (30, the default), ``alibi`` (slopes
2^-1 .. 2^-16) and ``dropout`` (0.1) against plain at (4, 16, 4096, 128), the variant's time over
plain's (bars 1.10, 1.10, 1.15 forward); ``gqa``: 32 query heads over 8 KV heads against MHA at
(4, 32, 4096, 128), time (bar 1.05); ``window`` (1024, 0) against causal at (1, 16, 16384, 128)
and ``varlen`` (16 causal sequences of mean 1024, total 16384, ``ragged_draw``, as
``bench_fa2.py``) against the batch padded to the longest, each the variant's TFLOP/s over the
baseline's, counting visible pairs (bar 0.9). ``ratio`` is printed as the bar reads it: above 1
is slower for the time rows; for the TF/s rows (the work factor folded in) below 1 is less efficient.

Session 38 measured the same softcap kernel at 1.14× plain's forward time in ``bench_fa2.py``
(softcap timed after dropout, FlashAttention-2's kernels between rounds) and 1.23–1.24× in
``bench_variants.py`` (softcap timed right after plain's backward), twice each.  Here:
``pairs`` — forwards only, baseline then variant, seven rounds; ``pairs reversed`` — variant
then baseline; ``with backwards`` — ``bench_variants``' round (baseline forward, its backward,
the variant's forward, its backward), five rounds; ``pairs primed`` — as ``pairs``, with
the events behind one untimed call (``bench_variants.primed_ms``: the first call's host
time out of the events), printed beside the bar's median over the other three, not in
it.  Every timing is 10 queued calls between two events (``bench_variants.queued_ms``,
``primed_ms``); each line carries its wall-clock start (``t``), to
be read against a clock and power log taken beside it (``nvidia-smi -lms``: session 39 found
the GPU at its software power cap, the SM clock moving with each kernel's power).  Prints each
forward's host time a call (``bench_table.host_ms``: where it nears the events' time a call, the
row times the host), the ratios last, and each one's median over the three orders.
"""

import json
import sys
import time

import cupy as cp
import numpy as np

import bench_variants as bv  # calls, queued_ms, randn (scripts/ is on sys.path)
from bench_table import host_ms
from numba_flash.bench.cases import ragged_draw, visible_pairs


def cases_of(mode):
    """``({baseline: calls, variant: calls}, work)``: ``work`` the variant's visible pairs over the
    baseline's for the TF/s rows (window, varlen), else None (the bar reads time)."""
    work = None
    if mode == "gqa":
        B, H, N, d = 4, 32, 4096, 128
        q, dout, km, vm = (bv.randn(B, N, H, d) for _ in range(4))
        k, v = bv.randn(B, N, 8, d), bv.randn(B, N, 8, d)
        cases = {"mha": bv.calls(q, km, vm, dout, causal=True), "gqa": bv.calls(q, k, v, dout, causal=True)}
    elif mode in ("softcap", "alibi", "dropout"):
        B, H, N, d = 4, 16, 4096, 128
        q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
        kw = {"softcap": dict(softcap=30.0), "dropout": dict(dropout_p=0.1, seed=1234),
              "alibi": dict(alibi_slopes=cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32)))}[mode]
        cases = {"plain": bv.calls(q, k, v, dout, causal=True), mode: bv.calls(q, k, v, dout, causal=True, **kw)}
    elif mode == "window":
        B, H, N, d = 1, 16, 16384, 128
        q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
        cases = {"causal": bv.calls(q, k, v, dout, causal=True),
                 "window": bv.calls(q, k, v, dout, causal=True, window_size=(1024, 0))}  # fmt: skip
        work = visible_pairs(N, N, True, (1024, 0)) / visible_pairs(N, N, True)
    elif mode == "varlen":
        lens = ragged_draw()  # bench_fa2.py's draw
        H, d, total, Np = 16, 128, int(lens.sum()), int(lens.max())
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # NumPy: no host wait a call
        q, k, v, dout = (bv.randn(total, H, d) for _ in range(4))
        qp, kp, vp, dop = (bv.randn(len(lens), Np, H, d) for _ in range(4))
        cases = {"padded": bv.calls(qp, kp, vp, dop, causal=True),
                 "varlen": bv.varlen_calls(q, k, v, dout, cu, Np, causal=True)}  # fmt: skip
        work = sum(visible_pairs(int(n), int(n), True) for n in lens) / (len(lens) * visible_pairs(Np, Np, True))
    else:
        raise SystemExit(f"mode {mode!r}: expected softcap, gqa, alibi, dropout, window or varlen")
    return cases, work


def main(path, *modes):
    """Each mode in turn (``softcap`` alone without one), its rows appended to ``path``."""
    open(path, "w").close()
    for mode in modes or ("softcap",):
        one(path, mode)


def one(path, mode):
    cases, work = cases_of(mode)
    base, var = cases  # the baseline, the variant
    outs = {name: fwd() for name, (fwd, _) in cases.items()}  # compiled and warm
    for name, (_, bwd) in cases.items():
        bwd(*outs[name])
    # each forward's host time a call (20 calls issued without a wait): where it nears the events' time
    # a call, the queued calls wait for the host and the row times the host (session 44's slow varlen)
    host = {name: host_ms(fwd) for name, (fwd, _) in cases.items()}
    rows = [dict(mode=mode, order="host", case=name, part="fwd", round=0, t=time.time(), ms=ms)
            for name, ms in host.items()]

    def timed(order, name, part, rnd):
        fwd, bwd = cases[name]
        t = time.time()
        timer = bv.primed_ms if order == "pairs primed" else bv.queued_ms
        ms = timer(fwd if part == "fwd" else (lambda: bwd(*outs[name])))
        rows.append(dict(mode=mode, order=order, case=name, part=part, round=rnd, t=t, ms=ms))

    for rnd in range(7):
        timed("pairs", base, "fwd", rnd)
        timed("pairs", var, "fwd", rnd)
    for rnd in range(7):
        timed("pairs reversed", var, "fwd", rnd)
        timed("pairs reversed", base, "fwd", rnd)
    for rnd in range(5):
        for name in (base, var):
            timed("with backwards", name, "fwd", rnd)
            timed("with backwards", name, "bwd", rnd)
    for rnd in range(7):  # the GPU's time alone (bench_variants.primed_ms): not in the median over orders
        timed("pairs primed", base, "fwd", rnd)
        timed("pairs primed", var, "fwd", rnd)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    # the bar's reading: time over the baseline's, or (work given) TF/s over the baseline's
    ratio = (lambda x, y: y / x) if work is None else (lambda x, y: work * x / y)
    print(f"{mode}: {'variant time / baseline' if work is None else f'variant TF/s / baseline (work {work:.4f})'}")
    print(f"{'order':16} {'part':4} {base + ' ms':>10} {var + ' ms':>10} {'ratio':>6}  per-round ratios")
    print(f"{'host a call':16} {'fwd':4} {host[base]:10.3f} {host[var]:10.3f}")
    medians = {"fwd": [], "bwd": []}
    for order, part in (("pairs", "fwd"), ("pairs reversed", "fwd"), ("with backwards", "fwd"),
                        ("with backwards", "bwd"), ("pairs primed", "fwd")):  # fmt: skip
        ms = {n: [r["ms"] for r in rows if r["order"] == order and r["case"] == n and r["part"] == part]
              for n in cases}  # fmt: skip
        per = [ratio(x, y) for x, y in zip(ms[base], ms[var])]
        x, y = float(np.median(ms[base])), float(np.median(ms[var]))
        medians[part].append(ratio(x, y))
        print(f"{order:16} {part:4} {x:10.3f} {y:10.3f} {ratio(x, y):6.3f}  {' '.join(f'{r:.3f}' for r in per)}")
    fwd_median = float(np.median(medians["fwd"][:3]))
    print(f"{mode} median over orders: fwd {fwd_median:.3f}  bwd {medians['bwd'][0]:.3f}  "
          f"(pairs primed: fwd {medians['fwd'][3]:.3f})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):  # `--help` was once taken for the output path
        raise SystemExit(__doc__)
    main(*sys.argv[1:])

"""A variant's time against its baseline's, timed in three orders, fp16, causal:

    python3 scripts/bench_order.py out.jsonl [softcap | gqa]

``softcap`` (the default): softcap 30 against plain at (4, 16, 4096, 128).  ``gqa``: 32 query
heads over 8 KV heads against MHA at (4, 32, 4096, 128) (issue #11's bar: ≤ 1.05× MHA's time;
session 38 measured its forward at 1.078 and 0.994 in two calls, MHA's own time 6% apart).

Session 38 measured the same softcap kernel at 1.14× plain's forward time in ``bench_fa2.py``
(softcap timed after dropout, FlashAttention-2's kernels between rounds) and 1.23–1.24× in
``bench_variants.py`` (softcap timed right after plain's backward), twice each.  Here:
``pairs`` — forwards only, baseline then variant, seven rounds; ``pairs reversed`` — variant
then baseline; ``with backwards`` — ``bench_variants``' round (baseline forward, its backward,
the variant's forward, its backward), five rounds.  Every timing is 10 queued calls between
two events (``bench_variants.queued_ms``); each line carries its wall-clock start (``t``), to
be read against a clock and power log taken beside it (``nvidia-smi -lms``: session 39 found
the GPU at its software power cap, the SM clock moving with each kernel's power).  Prints the
ratios last.
"""

import json
import sys
import time

import numpy as np

import bench_variants as bv  # calls, queued_ms, randn (scripts/ is on sys.path)


def main(path, mode="softcap"):
    if mode == "gqa":
        B, H, N, d = 4, 32, 4096, 128
        q, dout, km, vm = (bv.randn(B, N, H, d) for _ in range(4))
        k, v = bv.randn(B, N, 8, d), bv.randn(B, N, 8, d)
        cases = {"mha": bv.calls(q, km, vm, dout, causal=True), "gqa": bv.calls(q, k, v, dout, causal=True)}
    elif mode == "softcap":
        B, H, N, d = 4, 16, 4096, 128
        q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
        cases = {"plain": bv.calls(q, k, v, dout, causal=True),
                 "softcap": bv.calls(q, k, v, dout, causal=True, softcap=30.0)}  # fmt: skip
    else:
        raise SystemExit(f"mode {mode!r}: expected softcap or gqa")
    base, var = cases  # the baseline, the variant
    outs = {name: fwd() for name, (fwd, _) in cases.items()}  # compiled and warm
    for name, (_, bwd) in cases.items():
        bwd(*outs[name])
    rows = []

    def timed(order, name, part, rnd):
        fwd, bwd = cases[name]
        t = time.time()
        ms = bv.queued_ms(fwd if part == "fwd" else (lambda: bwd(*outs[name])))
        rows.append(dict(order=order, case=name, part=part, round=rnd, t=t, ms=ms))

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
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{'order':16} {'part':4} {base + ' ms':>10} {var + ' ms':>10} {'ratio':>6}  per-round ratios")
    for order, part in (("pairs", "fwd"), ("pairs reversed", "fwd"), ("with backwards", "fwd"),
                        ("with backwards", "bwd")):  # fmt: skip
        ms = {n: [r["ms"] for r in rows if r["order"] == order and r["case"] == n and r["part"] == part]
              for n in cases}  # fmt: skip
        per = [y / x for x, y in zip(ms[base], ms[var])]
        x, y = float(np.median(ms[base])), float(np.median(ms[var]))
        print(f"{order:16} {part:4} {x:10.3f} {y:10.3f} {y / x:6.3f}  {' '.join(f'{r:.3f}' for r in per)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])

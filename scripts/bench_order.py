"""softcap's forward cost against plain's, timed in three orders, fp16 (4, 16, 4096, 128) causal:

    python3 scripts/bench_order.py out.jsonl

Session 38 measured the same softcap kernel at 1.14× plain's forward time in ``bench_fa2.py``
(softcap timed after dropout, FlashAttention-2's kernels between rounds) and 1.23–1.24× in
``bench_variants.py`` (softcap timed right after plain's backward), twice each.  Here:
``pairs`` — forwards only, plain then softcap, seven rounds; ``pairs reversed`` — softcap then
plain; ``with backwards`` — ``bench_variants``' round (plain forward, plain backward, softcap
forward, softcap backward), five rounds.  Every timing is 10 queued calls between two events
(``bench_variants.queued_ms``); each line carries its wall-clock start (``t``), to be read
against a clock and power log taken beside it (``nvidia-smi -lms``).  Prints the ratios last.
"""

import json
import sys
import time

import numpy as np

import bench_variants as bv  # calls, queued_ms, randn (scripts/ is on sys.path)


def main(path):
    B, H, N, d = 4, 16, 4096, 128
    q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
    cases = {"plain": bv.calls(q, k, v, dout, causal=True),
             "softcap": bv.calls(q, k, v, dout, causal=True, softcap=30.0)}  # fmt: skip
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
        timed("pairs", "plain", "fwd", rnd)
        timed("pairs", "softcap", "fwd", rnd)
    for rnd in range(7):
        timed("pairs reversed", "softcap", "fwd", rnd)
        timed("pairs reversed", "plain", "fwd", rnd)
    for rnd in range(5):
        for name in ("plain", "softcap"):
            timed("with backwards", name, "fwd", rnd)
            timed("with backwards", name, "bwd", rnd)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{'order':16} {'plain fwd ms':>12} {'softcap fwd ms':>14} {'ratio':>6}  per-round ratios")
    for order in ("pairs", "pairs reversed", "with backwards"):
        ms = {n: [r["ms"] for r in rows if r["order"] == order and r["case"] == n and r["part"] == "fwd"]
              for n in cases}  # fmt: skip
        per = [s / p for p, s in zip(ms["plain"], ms["softcap"])]
        p, s = float(np.median(ms["plain"])), float(np.median(ms["softcap"]))
        print(f"{order:16} {p:12.3f} {s:14.3f} {s / p:6.3f}  {' '.join(f'{x:.3f}' for x in per)}")


if __name__ == "__main__":
    main(sys.argv[1])

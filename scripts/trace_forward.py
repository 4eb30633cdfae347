"""Where a persistent Hopper forward's tile spends its time: the kernel's own timestamps
(``wgmma_forward.trace_tiles``), fp16, d = 128, causal, issue #11's window and varlen rows
beside their baselines.

    python3 scripts/trace_forward.py out.jsonl [TILES [CASE ...]]   (TILES traced a block, default 32;
                                                                     CASE: the cases whose names start so)

Sets ``NUMBA_FLASH_WGMMA_TRACE`` before the library loads and replaces the API's ``sched``
buffer with one large enough for the records.  Each case runs three warm calls, then one
traced call; its records give, per tile, the first consumer's time in each step
(microseconds, at the clock the records' global timer gives):

    wait Q     loop top → the tile's Q landed (the producer's slot published by q_full)
    set-up     → block_info, the head's factors, acc zeroed
    first S    → the tile's first S done (its wait for K_0 included)
    softmax 0  → its first softmax and P packed (nothing on the tensor cores beside it)
    walk       → the rest of the walk: a step each further key tile (``step`` = walk / (tiles − 1))
    last P·V   → the last P·V done
    epilogue   → O and lse written

and the producer's wait for the previous tile's Q to be released, and how long after the
producer issued a tile's Q the consumer saw it land (``Q latency``).  ``per tile`` is the
sum; ``fixed`` all but the walk, in steps of the case's own walk.  The cases: causal and
window (1024, 0) at (1, 16, 16384, 128); the varlen draw of ``bench_order.py`` (16
sequences, ``ragged_draw``) and its batch padded to the longest; plain and ALiBi (slopes
2^-1 .. 2^-16) at (4, 16, 4096, 128), ``bench_order.py``'s ALiBi row.  Times with the trace on
(10 queued calls) are printed beside the tables, to be read against untraced runs.
"""

import json
import os
import sys

TILES = int(sys.argv[2]) if len(sys.argv) > 2 else 32
os.environ["NUMBA_FLASH_WGMMA_TRACE"] = str(TILES)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import bench_variants as bv  # noqa: E402  (scripts/ is on sys.path)
from numba_flash import api  # noqa: E402
from numba_flash.bench.cases import ragged_draw  # noqa: E402
from numba_flash.kernels import wgmma_forward as wf  # noqa: E402

SMS = wf._sms()
WORDS = wf.TRACE_WORDS
_made = []


def traced_sched(walk=None):
    """The ``sched`` buffer with room for every block's records (zeroed: a record whose
    last steps are 0 was not written)."""
    buf = cp.zeros(2 + SMS * TILES * WORDS, np.int32)
    _made.append(buf)
    return buf


api.SCHEDULER_BUFFERS["sched"] = traced_sched

PHASES = [("wait Q", 0, 1), ("set-up", 1, 2), ("first S", 2, 3), ("softmax 0", 3, 4), ("walk", 4, 5),
          ("last P·V", 5, 6), ("epilogue", 6, 7)]  # fmt: skip


def cases():
    """(name, forward) of each case, in order."""
    B, H, N, d = 1, 16, 16384, 128
    q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
    yield "causal 16384", bv.calls(q, k, v, dout, causal=True)[0]
    yield "window (1024, 0)", bv.calls(q, k, v, dout, causal=True, window_size=(1024, 0))[0]
    lens = ragged_draw()  # bench_order.py's draw
    total, Np = int(lens.sum()), int(lens.max())
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    qp, kp, vp, dop = (bv.randn(len(lens), Np, H, d) for _ in range(4))
    yield f"padded 16 × {Np}", bv.calls(qp, kp, vp, dop, causal=True)[0]
    qv, kv, vv, dov = (bv.randn(total, H, d) for _ in range(4))
    yield "varlen", bv.varlen_calls(qv, kv, vv, dov, cu, Np, causal=True)[0]
    B, H, N = 4, 16, 4096  # bench_order.py's alibi row: plain beside ALiBi (slopes 2^-1 .. 2^-16)
    q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    yield "plain 4 × 4096", bv.calls(q, k, v, dout, causal=True)[0]
    yield "alibi 4 × 4096", bv.calls(q, k, v, dout, causal=True, alibi_slopes=slopes)[0]


def analyse(words):
    """Per-phase figures of one traced call's records (``words``: the sched buffer)."""
    rec = words[2:].reshape(SMS, TILES, WORDS).view(np.uint32).astype(np.int64)
    ok = (rec[..., 7] != 0) & (rec[..., 6] != 0) & (rec[..., 0] != 0)
    r = rec[ok]

    def cyc(a, b):  # cycles from word a to word b (the clock's low 32 bits wrap)
        return (r[:, b] - r[:, a]) % (1 << 32)

    ns = ((r[:, wf.T_GLOBAL + 1] - r[:, wf.T_GLOBAL]) % (1 << 32)).sum()
    ghz = cyc(0, 7).sum() / max(ns, 1)
    us = {name: cyc(a, b) / ghz / 1e3 for name, a, b in PHASES}
    steps = r[:, wf.T_STEPS]
    multi = steps > 1
    step_us = us["walk"][multi] / (steps[multi] - 1)
    p = wf.T_PRODUCER
    q_release = cyc(p, p + 1) / ghz / 1e3  # the producer's wait for q_empty (and the Q copies' issue)
    # Q issued (producer, word p + 1) → the consumer saw q_full (word 1); the same SM's clock
    q_latency = ((r[:, 1] - r[:, p + 1]) % (1 << 32)) / ghz / 1e3
    q_latency = q_latency[q_latency < 1e3]  # tile 0's Q may come before the consumer's loop top
    # each block's span on the global timer (its first tile's loop top to its last tile's O written) and
    # the sum of its tiles' times: the difference is the block's time outside its tiles (the end, the first
    # tile's wait); the kernel's span (first start to last end over the blocks) against both
    blk = np.nonzero(ok)[0]
    start = r[:, wf.T_GLOBAL].min()  # the timer's low word may wrap: both ends relative to the earliest start
    g0, g1 = ((r[:, wf.T_GLOBAL + i] - start) % (1 << 32) for i in (0, 1))
    spans = np.array([g1[blk == i].max() - g0[blk == i].min() for i in np.unique(blk)]) / 1e3
    busy = np.array([cyc(0, 7)[blk == i].sum() for i in np.unique(blk)]) / ghz / 1e3
    total = sum(us[n] for n, _, _ in PHASES)
    fixed = total - us["walk"]
    med_step = float(np.median(step_us)) if step_us.size else float("nan")
    return {
        "tiles": int(ok.sum()), "ghz": round(float(ghz), 3), "mean_steps": round(float(steps.mean()), 2),
        **{f"{n} us": round(float(np.median(x)), 3) for n, x in us.items()},
        "step us": round(med_step, 3), "per tile us": round(float(np.median(total)), 3),
        "fixed us": round(float(np.median(fixed)), 3), "fixed steps": round(float(np.median(fixed)) / med_step, 2),
        "fixed share": round(float(fixed.sum() / total.sum()), 3),
        "producer waits for q_empty us": round(float(np.median(q_release)), 3),
        "Q latency us": round(float(np.median(q_latency)), 3) if q_latency.size else None,
        "wait Q mean / max us": f"{us['wait Q'].mean():.2f} / {us['wait Q'].max():.1f}",
        "kernel span us": round(float(g1.max() - g0.min()) / 1e3, 1),
        "block span median / max us": f"{np.median(spans):.1f} / {spans.max():.1f}",
        "block tiles' sum median / max us": f"{np.median(busy):.1f} / {busy.max():.1f}",
        "tiles a block min / max": f"{np.bincount(blk).min()} / {np.bincount(blk).max()}",
    }  # fmt: skip


def main(path, only=()):
    rows = []
    with open(path, "w") as f:
        for name, fwd in cases():
            if only and not any(name.startswith(o) for o in only):
                continue
            for _ in range(3):
                fwd()
            cp.cuda.runtime.deviceSynchronize()
            _made.clear()
            fwd()
            cp.cuda.runtime.deviceSynchronize()
            words = _made[-1].get()
            row = {"case": name, "traced ms (10 queued)": round(bv.queued_ms(fwd), 4), **analyse(words)}
            f.write(json.dumps(row) + "\n")
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = [k for k in rows[0] if k != "case"]
    print("\n| figure | " + " | ".join(r["case"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r[k]) for r in rows) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:])

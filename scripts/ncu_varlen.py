"""Where issue #11's varlen forward loses to a uniform batch of the same tokens (0.64–0.76
of its TFLOP/s, where the tiles' work predicts 0.96): the Hopper forward, causal, fp16,
16 heads, d = 128, on bench_variants' ragged lengths (mean 1024, total 16384), on 16
sequences of 1024 through the varlen API, and as a (16, 1024) batch.

    python3 scripts/ncu_varlen.py out.jsonl            # timings (queued, CUDA events), a table
    ncu --clock-control none --kernel-name regex:wgmma_forward --section SpeedOfLight \\
        --section WarpStateStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum \\
        python3 scripts/ncu_varlen.py --ncu               # one call of each, after a warm-up

If the varlen API on equal lengths runs as fast as the batch, the loss is the ragged
lengths' (scheduling, partial tiles); if not, it is the varlen path's own (its offsets,
its per-tile bookkeeping).
"""

import json
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.bench.cases import ragged_lengths, visible_pairs

NCU = "--ncu" in sys.argv
rng = np.random.default_rng(20261203)
H, d = 16, 128


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def main():
    lens = ragged_lengths(rng)
    cases = []
    for tag, ls in (("varlen ragged", lens), ("varlen equal 1024", np.full(16, 1024))):
        cu = np.concatenate([[0], np.cumsum(ls)]).astype(np.int32)
        q, k, v = (randn(int(ls.sum()), H, d) for _ in range(3))
        mx = int(ls.max())
        call = (lambda q=q, k=k, v=v, cu=cu, mx=mx:  # noqa: E731
                numba_flash.flash_attention_varlen(q, k, v, cu, cu, mx, mx, causal=True))
        cases.append((tag, call, H * sum(visible_pairs(int(n), int(n), True) for n in ls)))
    qb, kb, vb = (randn(16, 1024, H, d) for _ in range(3))
    cases.append(("batch 16x1024", lambda: numba_flash.flash_attention(qb, kb, vb, causal=True),
                  16 * H * visible_pairs(1024, 1024, True)))
    if NCU:
        for tag, call, _ in cases:
            call()  # compile (warm-up)
            cp.cuda.runtime.deviceSynchronize()
            print(f"ncu_varlen: {tag}", flush=True)
            call()
            cp.cuda.runtime.deviceSynchronize()
        print("ncu_varlen: done")
        return
    from numba_flash.bench.decode import queued_ms

    import os

    rows = []
    for persistent in ("", "0"):  # the default, then a block a tile (the plan's key includes the switch)
        os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = persistent
        for tag, call, pairs in cases:
            ms = queued_ms(call, 10, 9, 3)
            rows.append(dict(case=tag + (" (a block a tile)" if persistent else ""), ms=ms,
                             tflops=4 * d * pairs / ms / 1e9, lens=[int(x) for x in lens]))
            print(json.dumps(rows[-1]), flush=True)
    with open(sys.argv[1], "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'case':34} {'ms':>8} {'TF/s':>8} {'/ batch':>8}")
    for r in rows:
        print(f"{r['case']:34} {r['ms']:8.3f} {r['tflops']:8.1f} {r['tflops'] / rows[2]['tflops']:8.3f}")


if __name__ == "__main__":
    main()

"""A/B of the persistent dK/dV kernel (``NUMBA_FLASH_WGMMA_BWD_PERSISTENT``: 0, then ``on``) in
one process: the backward's time on issue #13's shapes (fp16, causal off and on) and on issue
#11's varlen batch (16 sequences of random length, mean 1024, total 16384, (H, d) = (16, 128),
causal), with the dK/dV kernel timed alone too.  The values are timed in turn over three
rounds (10 back-to-back calls between CUDA events, median of 7: ``bench_table.median_ms``);
medians over the rounds.  The gradients of both values are compared bit for bit (the
persistent kernel runs each block's walk as the one-block kernel does).

    python3 scripts/bench_bwd_persistent_ab.py out.jsonl [--d64]

``--d64`` (session 33): ``0`` against ``auto`` (the default since then: persistent at d <= 64 and
<= 1024 query rows) on d = 64 shapes of 1024, 512 and 256 rows, no varlen batch.
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash

D64 = "--d64" in sys.argv
SHAPES = ([(16, 32, 1024, 64), (32, 32, 512, 64), (64, 16, 256, 64)] if D64 else
          [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)])
VALUES = ("0", "auto") if D64 else ("0", "on")


def main(path):
    rows = []
    gen = np.random.default_rng(0)
    cases = [((B, H, N, d), c, None) for B, H, N, d in SHAPES for c in (False, True)]
    lens = gen.integers(1, 2048, 16)
    lens = np.maximum(1, np.round(lens * 16384 / lens.sum())).astype(np.int32)
    lens[-1] += 16384 - lens.sum()
    if not D64:
        cases.append(((1, 16, int(lens.sum()), 128), True, lens))
    for (B, H, N, d), causal, vl in cases:
        q, k, v, do = (cp.asarray(gen.standard_normal((B, N, H, d), np.float32)).astype(cp.float16) for _ in range(4))
        if vl is None:
            out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)

            def call():
                return numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
        else:
            q, k, v, do = (x[0] for x in (q, k, v, do))
            cu = np.concatenate([[0], np.cumsum(vl)]).astype(np.int32)
            mx = int(vl.max())
            out, lse = numba_flash.flash_attention_varlen(q, k, v, cu, cu, mx, mx, causal=causal, return_lse=True)

            def call():
                return numba_flash.flash_attention_varlen_backward(do, q, k, v, out, lse, cu, cu, mx, mx, causal=causal)
        times, grads = {x: [] for x in VALUES}, {}
        for _ in range(3):
            for x in VALUES:
                os.environ["NUMBA_FLASH_WGMMA_BWD_PERSISTENT"] = x
                grads.setdefault(x, [g.copy() for g in call()])
                times[x].append(median_ms(call, warmup=1, rep=7, calls=10))
        ms = {x: float(np.median(t)) for x, t in times.items()}
        same = all(bool(cp.array_equal(a, b)) for a, b in zip(grads["0"], grads[VALUES[1]]))
        row = dict(shape=[B, H, N, d], causal=causal, varlen=vl is not None, ms=ms, on_vs_off=ms["0"] / ms[VALUES[1]],
                   bitwise=same)
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.environ["NUMBA_FLASH_WGMMA_BWD_PERSISTENT"] = "0"
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    print("\n| (B,H,N,d) | causal | varlen | ms, one block a tile | ms, persistent | speed-up | bitwise |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {tuple(r['shape'])} | {r['causal']} | {r['varlen']} | {r['ms']['0']:.3f} | {r['ms'][VALUES[1]]:.3f} | "
              f"{r['on_vs_off']:.3f} | {r['bitwise']} |")


if __name__ == "__main__":
    main(sys.argv[1])

"""In-process A/B of the wgmma forward's tile scheduler (``NUMBA_FLASH_WGMMA_SCHEDULER``
static / dynamic; the plan's key includes it, so both kernels live in one process):
fp16 causal (4, 16, 4096, 128) and (1, 16, 16384, 128), timed in turn over five rounds
(10 queued calls between CUDA events, median of 7), medians over the rounds.

    python3 scripts/ab_scheduler.py out.jsonl
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash

rng = np.random.default_rng(20261203)
VALUES = ("static", "dynamic")


def main(path):
    rows = []
    for B, H, N, d in ((4, 16, 4096, 128), (1, 16, 16384, 128)):
        q, k, v = (cp.asarray(rng.standard_normal((B, N, H, d), dtype=np.float32)).astype(cp.float16) for _ in range(3))
        times = {x: [] for x in VALUES}
        for _ in range(5):
            for x in VALUES:
                os.environ["NUMBA_FLASH_WGMMA_SCHEDULER"] = x
                times[x].append(median_ms(lambda: numba_flash.flash_attention(q, k, v, causal=True), warmup=2, rep=7,
                                          calls=10))  # fmt: skip
        fl = 2 * B * H * N * N * d
        row = {"shape": [B, H, N, d], "causal": True}
        for x in VALUES:
            ms = float(np.median(times[x]))
            row[f"{x}_ms"], row[f"{x}_tflops"] = ms, fl / ms / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'shape':22} {'static TF/s':>12} {'dynamic TF/s':>13} {'ratio':>7}")
    for r in rows:
        print(f"{str(tuple(r['shape'])):22} {r['static_tflops']:12.1f} {r['dynamic_tflops']:13.1f} "
              f"{r['dynamic_tflops'] / r['static_tflops']:7.3f}")


if __name__ == "__main__":
    main(sys.argv[1])

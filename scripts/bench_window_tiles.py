"""Issue #11's window bar against tile choices: (1, 16, 16384, 128) fp16, window (1024, 0)
and plain causal, with the tiles ``NUMBA_FLASH_TILES`` gives (run once per setting).

    NUMBA_FLASH_TILES='{"tc_forward": {"128": [64, 64, 4, 1]}}' python3 scripts/bench_window_tiles.py out.jsonl

Visible TFLOP/s (4·d per visible (query, key) pair, ×2.5 backward); times are medians of
10 back-to-back calls between two events (``bench_table.median_ms(calls=10)``).
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash
from numba_flash.bench.cases import visible_pairs

rng = np.random.default_rng(1)
B, H, N, d = 1, 16, 16384, 128
q, k, v, dout = (cp.asarray(rng.standard_normal((B, N, H, d), np.float32)).astype(cp.float16) for _ in range(4))
rows = []
for window in ((-1, -1), (1024, 0), (512, 0), (2048, 0)):
    kw = dict(causal=True, window_size=window)
    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **kw)
    f = median_ms(lambda: numba_flash.flash_attention(q, k, v, return_lse=True, **kw), warmup=1, rep=7, calls=10)
    b = median_ms(lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, **kw), warmup=1, rep=7,
                  calls=10)  # fmt: skip
    fl = 4 * B * H * visible_pairs(N, N, True, window) * d
    rows.append(dict(tiles=os.environ.get("NUMBA_FLASH_TILES", ""), window=window, fwd_ms=f, bwd_ms=b,
                     fwd_tflops=fl / f / 1e9, bwd_tflops=2.5 * fl / b / 1e9))  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
with open(sys.argv[1], "a") as fh:
    for r in rows:
        fh.write(json.dumps(r) + "\n")
c = rows[0]
for r in rows[1:]:
    print(f"window {r['window']}: fwd {r['fwd_tflops']:.1f} TF/s ({r['fwd_tflops'] / c['fwd_tflops']:.3f}x causal), "
          f"bwd {r['bwd_tflops']:.1f} ({r['bwd_tflops'] / c['bwd_tflops']:.3f}x)  tiles={r['tiles'] or 'default'}")

"""The backward's variants on one tree (run once per tree, ``device_ab.sh``'s ``side old|new``):
(4, 32, 4096, 64) and (4, 16, 4096, 128) causal fp16, plain / softcap 30 / dropout 0.1, queued
calls (10 back-to-back between two events, median of 7), three rounds with the cases in turn;
milliseconds a call, medians over the rounds.

    python3 scripts/bench_bwd_variants_ab.py out.jsonl [--d64]    # --d64: the first shape alone
"""
import json, sys
import cupy as cp, numpy as np
from bench_table import median_ms  # (scripts/ is on sys.path)
import numba_flash
rows = []
SHAPES = ((4, 32, 4096, 64),) if "--d64" in sys.argv else ((4, 32, 4096, 64), (4, 16, 4096, 128))
for B, H, N, d in SHAPES:
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal((B, N, H, d), np.float32)).astype(cp.float16) for _ in range(4))
    cases = {"plain": {}, "softcap": {"softcap": 30.0}, "dropout": {"dropout_p": 0.1, "seed": 3}}
    outs = {n: numba_flash.flash_attention(q, k, v, causal=True, return_lse=True, **kw) for n, kw in cases.items()}
    t = {n: [] for n in cases}
    for _ in range(3):
        for n, kw in cases.items():
            o, l = outs[n]
            t[n].append(median_ms(lambda: numba_flash.flash_attention_backward(do, q, k, v, o, l, causal=True, **kw),
                                  warmup=1, rep=7, calls=10))
    row = {"shape": [B, H, N, d], **{n: float(np.median(x)) for n, x in t.items()}}
    rows.append(row)
    print(json.dumps(row), flush=True)
with open(sys.argv[1], "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows) + "\n")

"""Split-KV under a prefill chunk on the Hopper forward against the mma.sync forward's splits
(``NUMBA_FLASH_WGMMA_SPLIT=0`` / ``1``, ``plan.wgmma_split``), in one process, and each
against one split (``num_splits=1``: the Hopper forward, no merge).

    python3 scripts/bench_prefill_split.py out.jsonl

Cases: a chunk of Nq new queries (causal, bottom-right aligned) over a cache of L tokens,
B = 1, 32 query / 8 KV heads, d = 128 (and 64), fp16, contiguous cache; ``num_splits`` auto
(the split count of ``kvcache.split_count``).  The settings are timed in turn over five
rounds (10 back-to-back calls between CUDA events, median of 7); medians over the rounds.
FLOPs: 4·B·H·d·(visible pairs).
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash
from numba_flash._report import write_jsonl
from numba_flash.bench.cases import visible_pairs

rng = np.random.default_rng(27)
CASES = [(1, 32, 8, 128, 128, 8192), (1, 32, 8, 128, 256, 32768), (1, 32, 8, 128, 512, 16384),
         (1, 32, 8, 64, 256, 32768), (2, 16, 4, 128, 128, 65536)]
SETTINGS = {"mma.sync splits": ("0", 0), "wgmma splits": ("1", 0), "one split": ("0", 1)}


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def main(path):
    rows = []
    for B, H, HK, d, nq, L in CASES:
        q, kc, vc = randn(B, nq, H, d), randn(B, L, HK, d), randn(B, L, HK, d)
        lens = np.full((B,), L, np.int32)

        def call(splits):
            return lambda: numba_flash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                                                    num_splits=splits)  # fmt: skip

        times = {name: [] for name in SETTINGS}
        outs = {}
        for name, (on, splits) in SETTINGS.items():  # compiled, warm, and their outputs compared
            os.environ["NUMBA_FLASH_WGMMA_SPLIT"] = on
            outs[name] = cp.asnumpy(call(splits)()).astype(np.float64)
        for _ in range(5):
            for name, (on, splits) in SETTINGS.items():
                os.environ["NUMBA_FLASH_WGMMA_SPLIT"] = on
                times[name].append(median_ms(call(splits), warmup=1, rep=7, calls=10))
        flops = 4 * B * H * d * visible_pairs(nq, L, True)
        row = dict(B=B, H=H, H_kv=HK, d=d, Nq=nq, L=L)
        for name in SETTINGS:
            ms = float(np.median(times[name]))
            row[f"ms {name}"], row[f"TF/s {name}"] = ms, flops / ms / 1e9
        ref = outs["one split"]
        row["max |diff| vs one split"] = {n: float(np.abs(o - ref).max()) for n, o in outs.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_jsonl(rows, path)
    print("\n| B,H/H_kv,d | Nq | L | one split TF/s | mma.sync splits TF/s | wgmma splits TF/s | wgmma / mma.sync |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        a, b, c = (r[f"TF/s {n}"] for n in ("one split", "mma.sync splits", "wgmma splits"))
        print(f"| {r['B']},{r['H']}/{r['H_kv']},{r['d']} | {r['Nq']} | {r['L']} | {a:.1f} | {b:.1f} | {c:.1f} "
              f"| {c / b:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])

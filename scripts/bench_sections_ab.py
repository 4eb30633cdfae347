"""A/B of the heaviest-first grids' L2 sections (``spec.l2_sections``), in one process: the
forward and backward with ``NUMBA_FLASH_L2_SECTIONS=off`` (every head in one section, the
order before session 32) and on (the default), with torch SDPA's cuDNN backend beside them.

    python3 scripts/bench_sections_ab.py out.jsonl [--split]

``--split``: ``SPLIT_CASES``, and a third setting, ``keys`` (the dK/dV grids' sections only),
to tell which of the backward's kernels a change comes from.  ``--rule``: ``RULE_CASES`` only
(where ``spec.l2_sections`` keeps the forward in one section, and where not).

The sections are a run-time parameter: both orders run the same compiled kernels.  Per case
the three are timed in turn over three rounds (``bench_table.median_ms``: 10 queued calls
between CUDA events), medians over the rounds.  FLOPs of the visible pairs (4·d a pair,
×2.5 backward).  Printed last: TF/s off / on, on / off, on / cuDNN.
"""

import json
import os
import sys

import cupy as cp
import numpy as np
from bench_hopper_bars import sdpa_fns
from bench_table import median_ms

import numba_flash

#: ((B, H, H_kv, N, d), causal, window): issue #13's causal shapes, MHA and GQA at 32 heads
#: (issue #11's GQA row), a non-causal control (one section either way) and #11's window row
CASES = [((4, 32, 32, 4096, 128), True, None), ((4, 16, 16, 4096, 128), True, None),
         ((4, 32, 8, 4096, 128), True, None), ((1, 16, 16, 16384, 128), True, None),
         ((1, 16, 16, 16384, 128), True, (1024, 0)), ((4, 32, 32, 4096, 64), True, None),
         ((16, 32, 32, 1024, 64), True, None), ((4, 16, 16, 4096, 128), False, None)]  # fmt: skip
SPLIT_CASES = [((4, 16, 16, 4096, 128), True, None), ((4, 32, 32, 4096, 64), True, None),
               ((16, 32, 32, 1024, 64), True, None), ((4, 32, 32, 4096, 128), True, None)]  # fmt: skip
RULE_CASES = [((4, 16, 16, 4096, 128), True, None), ((4, 32, 32, 4096, 128), True, None)]
ROUNDS = 3


def visible_pairs(N, causal, window):
    if window is not None:
        left = window[0]
        return sum(min(i, left) + 1 for i in range(N))
    return N * (N + 1) // 2 if causal else N * N


def main(path, cases=CASES, settings=("off", "on")):
    rows = []
    for (B, H, H_kv, N, d), causal, window in cases:
        gen = cp.random.default_rng(3)
        q, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
        k, v = (gen.standard_normal((B, N, H_kv, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
        kw = dict(causal=causal, **({"window_size": window} if window else {}))
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **kw)
        ours = (lambda: numba_flash.flash_attention(q, k, v, **kw),
                lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, **kw))
        fns = {x: ours for x in settings}
        if H == H_kv and window is None:
            fns["cudnn"] = sdpa_fns(q, k, v, dout, causal)["cudnn"]
        ms = {(n, p): [] for n in fns for p in (0, 1)}
        for name in settings:  # compiled and recorded under each setting
            os.environ["NUMBA_FLASH_L2_SECTIONS"] = name
            ours[0](), ours[1]()
        for _ in range(ROUNDS):
            for name, pair in fns.items():
                os.environ["NUMBA_FLASH_L2_SECTIONS"] = "on" if name == "cudnn" else name
                for p in (0, 1):
                    ms[name, p].append(median_ms(pair[p], calls=10, rep=5, warmup=1) if pair else float("nan"))
        med = {key: float(np.median(x)) for key, x in ms.items()}
        fl = 4 * B * H * d * visible_pairs(N, causal, window)
        row = dict(B=B, H=H, H_kv=H_kv, N=N, d=d, causal=causal, window=window)
        for p, part, f in ((0, "fwd", fl), (1, "bwd", 2.5 * fl)):
            for name in fns:
                row[f"{part}_{name}_ms"] = med[name, p]
                row[f"{part}_{name}_tflops"] = f / med[name, p] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        cp.get_default_memory_pool().free_all_blocks()  # the last case's arrays, once this one's replace them
    os.environ.pop("NUMBA_FLASH_L2_SECTIONS")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\nmedians of {ROUNDS} rounds in turn, 10 queued calls between events; fp16")
    print("| (B,H/H_kv,N,d) | causal / window | fwd TF/s off | on | on / off | on / cuDNN | bwd TF/s off | on | on / off "
          "| on / cuDNN |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = []
        for part in ("fwd", "bwd"):
            off, on = r[f"{part}_off_tflops"], r[f"{part}_on_tflops"]
            cud = r.get(f"{part}_cudnn_tflops")
            cells += [f"{off:.1f}", f"{on:.1f}", f"{on / off:.3f}", f"{on / cud:.3f}" if cud else "—"]
        mask = f"window {r['window']}" if r["window"] else ("causal" if r["causal"] else "none")
        print(f"| ({r['B']},{r['H']}/{r['H_kv']},{r['N']},{r['d']}) | {mask} | " + " | ".join(cells) + " |")
    for x in settings[1:-1]:  # --split: the middle setting's backward against off and on
        print(f"\nbackward TF/s with sections {x} only: / off, / on")
        for r in rows:
            print(f"({r['B']},{r['H']},{r['N']},{r['d']}): {r[f'bwd_{x}_tflops']:.1f}, "
                  f"{r[f'bwd_{x}_tflops'] / r['bwd_off_tflops']:.3f}, {r[f'bwd_{x}_tflops'] / r['bwd_on_tflops']:.3f}")


if __name__ == "__main__":
    if "--split" in sys.argv:
        main(sys.argv[1], SPLIT_CASES, ("off", "keys", "on"))
    elif "--rule" in sys.argv:
        main(sys.argv[1], RULE_CASES)
    else:
        main(sys.argv[1])

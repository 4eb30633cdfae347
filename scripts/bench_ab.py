"""A/B of an environment switch in one process: the forward's time with each value of
the switch, on issue #13's shapes (fp16, causal off and on, and bf16) and a dropout case.

    python3 scripts/bench_ab.py out.jsonl NAME=a,b [NAME2=c,d ...] [--dropout | --wide | --softcap | --window]

Several switches take their values together, by position (NAME=a with NAME2=c, then b with d);
an empty value leaves the variable unset (e.g. ``NUMBA_FLASH_WGMMA_CONSUMERS=,3``: the
default, then three consumers).

``--wide``: ``WIDE_CASES``, non-causal (the wider key tiles' cases).
``--window``: ``WINDOW_CASES``, d = 64 windows (the consumers' count).
``--softcap``: ``SOFTCAP_CASES``, the four shapes with softcap 30 (and plain causal as a reference row).
``--dropout``: the cases with dropout 0.1 instead (the four shapes causal off and on, fp16,
and bf16 at (4, 16, 4096, 128)), with plain (4, 16, 4096, 128) causal as a reference row.

The API reads the switch when it plans (``api._plan_env``: the plan and its kernels are
made once per value), so both values' kernels live in one process.  Per case the values
are timed in turn over five rounds (10 back-to-back calls between CUDA events, median of
7, ``bench_table.median_ms``), so that the GPU's clocks drifting over the run fall on
both alike; medians over the rounds.  Printed last: ms per value and b / a.
"""

import json
import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np
from bench_table import median_ms

import numba_flash

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]
CASES = [(s, "float16", c, {}) for s in SHAPES for c in (False, True)] + [
    ((4, 16, 4096, 128), "bfloat16", False, {}),
    ((4, 16, 4096, 128), "float16", True, {"dropout_p": 0.1, "seed": 7}),
]


DROPOUT = {"dropout_p": 0.1, "seed": 7}
DROPOUT_CASES = [(s, "float16", c, DROPOUT) for s in SHAPES for c in (False, True)] + [
    ((4, 16, 4096, 128), "bfloat16", True, DROPOUT),
    ((4, 16, 4096, 128), "float16", True, {}),
]

SOFTCAP = {"softcap": 30.0}
#: ``--softcap``: the four shapes with softcap 30, causal off and on, fp16, and bf16 at (4, 16, 4096, 128),
#: with plain (4, 16, 4096, 128) causal as a reference row
SOFTCAP_CASES = [(s, "float16", c, SOFTCAP) for s in SHAPES for c in (False, True)] + [
    ((4, 16, 4096, 128), "bfloat16", True, SOFTCAP),
    ((4, 16, 4096, 128), "float16", True, {}),
]

#: ``--wide``: where ``wgmma_forward.forced_keys``' ``wide`` widens the key tiles (no causal or
#: window), and N = 1024, where 160-key tiles leave 96 of 1120 keys of the last tile empty
WIDE_CASES = [((4, 16, 4096, 128), "float16", False, {}), ((1, 16, 16384, 128), "float16", False, {}),
              ((16, 32, 1024, 128), "float16", False, {}), ((4, 16, 4096, 128), "bfloat16", False, {}),
              ((4, 8, 4096, 256), "float16", False, {}), ((4, 16, 4096, 128), "float16", False, {"softcap": 30.0}),
              ((4, 16, 4096, 128), "float16", False, DROPOUT), ((4, 16, 4096, 96), "float16", False, {}),
              ((4, 8, 4096, 256), "bfloat16", False, {}), ((4, 16, 4096, 128), "float16", True, {})]

#: ``--window``: d = 64 sliding windows (causal), where three consumers' 192-row tiles visit more keys
#: than two consumers' 128-row ones and, with softcap, spill (session 29: 276 bytes); plain causal last
WINDOW_CASES = [((4, 32, 4096, 64), "float16", True, {"window_size": (256, 0)}),
                ((4, 32, 4096, 64), "float16", True, {"window_size": (1024, 0)}),
                ((1, 32, 16384, 64), "float16", True, {"window_size": (1024, 0)}),
                ((4, 32, 4096, 64), "float16", True, {"window_size": (1024, 0), "softcap": 30.0}),
                ((4, 32, 4096, 64), "float16", False, {"window_size": (512, 512)}),
                ((4, 32, 4096, 64), "float16", True, {})]


def settings(switches):
    """``["A=a1,a2", "B=b1,b2"]`` → the labels ``["a1+b1", "a2+b2"]`` (``-`` for an empty
    value) and per label its environment: ``{A: a1, B: b1}``, … (an empty value unsets
    the variable)."""
    parsed = [(sw.split("=", 1)[0], sw.split("=", 1)[1].split(",")) for sw in switches]
    n = len(parsed[0][1])
    if any(len(v) != n for _, v in parsed):
        raise SystemExit(f"switches {switches}: each needs {n} values")
    labels = ["+".join(vals[i] or "-" for _, vals in parsed) for i in range(n)]
    return labels, {labels[i]: {name: vals[i] for name, vals in parsed} for i in range(n)}


def apply(env):
    for name, value in env.items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)


def main(path, switches, cases=CASES):
    values, envs = settings(switches)
    name = " ".join(sw.split("=", 1)[0] for sw in switches)
    rows = []
    for (B, H, N, d), dtype, causal, kw in cases:
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        gen = cp.random.default_rng(0)
        q, k, v = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(dt) for _ in range(3))
        fn = lambda: numba_flash.flash_attention(q, k, v, causal=causal, **kw)  # noqa: E731
        times = {x: [] for x in values}
        for x in values:  # compiled and warm
            apply(envs[x])
            fn()
        for _ in range(5):
            for x in values:
                apply(envs[x])
                times[x].append(median_ms(fn, warmup=1, rep=7, calls=10))
        flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
        row = dict(B=B, H=H, N=N, d=d, dtype=dtype, causal=causal, kw=str(kw), switch=name)
        for x in values:
            ms = float(np.median(times[x]))
            row[f"ms_{x}"], row[f"tflops_{x}"] = ms, flops / ms / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v
        cp.get_default_memory_pool().free_all_blocks()
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    a, b = values[0], values[-1]
    print(f"\n| (B,H,N,d) | dtype | causal | extra | {name}={a} TF/s | {name}={b} TF/s | {b} / {a} |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| ({r['B']},{r['H']},{r['N']},{r['d']}) | {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['kw']} "
              f"| {r[f'tflops_{a}']:.1f} | {r[f'tflops_{b}']:.1f} | {r[f'tflops_{b}'] / r[f'tflops_{a}']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1], [a for a in sys.argv[2:] if "=" in a],
         DROPOUT_CASES if "--dropout" in sys.argv else WIDE_CASES if "--wide" in sys.argv
         else SOFTCAP_CASES if "--softcap" in sys.argv else WINDOW_CASES if "--window" in sys.argv
         else CASES)  # fmt: skip

"""Registers, spills and PTX instruction counts of every kernel the API can launch.

    python3 scripts/kernel_resources.py out.json            # every configuration
    python3 scripts/kernel_resources.py out.json --compare before.json

Compiles through ``numba_flash.inspection`` (``numba.cuda.compile_ptx``; no GPU needed,
registers from nvJitLink or ptxas) for sm_90, each (pass, dtype, head dim, causal, tf32)
the dispatch distinguishes.  ``--compare`` prints, per kernel, the change in registers,
spill bytes and static instruction counts against an earlier run: what a refactor of the
kernels must not move.
"""

import itertools
import json
import sys

from numba_flash.inspection import inspect_kernels

CONFIGS = [
    # (dtype, head dim, tf32): every family and the fallbacks
    ("float32", 64, False), ("float32", 128, False),  # register-blocked fp32
    ("float32", 32, False), ("float32", 96, False),  # row-group fp32
    ("float32", 64, True), ("float32", 128, True),  # TF32
    ("float16", 64, False), ("float16", 128, False),  # tensor cores
    ("bfloat16", 64, False), ("bfloat16", 128, False),
    ("float16", 96, False), ("bfloat16", 40, False),  # fallbacks
]
KEYS = ("registers", "spill_stores", "spill_loads", "stack_bytes", "local_bytes_ptx")


def collect():
    rows = []
    for (dtype, d, tf32), pass_, causal in itertools.product(CONFIGS, ("forward", "backward"), (False, True)):
        for r in inspect_kernels(pass_, dtype, d, causal, arch="sm_90", tf32=tf32):
            row = dict(config=f"{pass_} {dtype}{'+tf32' if tf32 else ''} d={d} {'causal' if causal else 'full'}",
                       kernel=r.name, tiles=r.tiles, counts=r.counts)
            row.update({k: getattr(r, k) for k in KEYS})
            rows.append(row)
            print(row["config"], r.name, {k: row[k] for k in KEYS}, "total", r.counts["total"], flush=True)
    return rows


def compare(rows, before):
    old_by_cfg = {}
    for r in before:
        old_by_cfg.setdefault(r["config"], []).append(r)
    new_by_cfg = {}
    for r in rows:
        new_by_cfg.setdefault(r["config"], []).append(r)
    worse = 0
    for cfg, news in new_by_cfg.items():
        for i, n in enumerate(news):
            olds = old_by_cfg.get(cfg, [])
            if i >= len(olds):
                print(f"{cfg} {n['kernel']}: new kernel")
                continue
            o = olds[i]
            diffs = []
            for k in KEYS:
                if n[k] != o[k]:
                    diffs.append(f"{k} {o[k]}→{n[k]}")
            for k, v in n["counts"].items():
                if v != o["counts"].get(k):
                    diffs.append(f"{k} {o['counts'].get(k)}→{v}")
            bad = (n["registers"] or 0) > (o["registers"] or 0) or (n["spill_stores"] or 0) > (o["spill_stores"] or 0) \
                or (n["local_bytes_ptx"] or 0) > (o["local_bytes_ptx"] or 0)
            worse += bad
            print(f"{'WORSE ' if bad else ''}{cfg} {o['kernel']}→{n['kernel']}: " + (", ".join(diffs) or "identical"))
    print(f"{worse} kernel(s) with more registers, spills or local memory")


if __name__ == "__main__":
    rows = collect()
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    if "--compare" in sys.argv:
        with open(sys.argv[sys.argv.index("--compare") + 1]) as f:
            compare(rows, json.load(f))

"""The table of an ``ncu`` text report of ``scripts/ncu_wgmma.py`` (``scripts/device_s12b.sh``):
per profiled launch its grid, duration, SM busy (the tensor pipe, by ncu's note) and the
stall reasons (warps stalled per issued instruction), largest first.

    python3 scripts/ncu_stalls.py e_ncu.txt
    python3 scripts/ncu_stalls.py e_ncu_bwd.txt backward   # ``ncu_wgmma.py backward``'s report
    python3 scripts/ncu_stalls.py e_ncu_var.txt variants   # ``ncu_wgmma.py variants``'s
"""

import re
import sys

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]


def main(path, kernels=("wgmma_forward",)):
    """``kernels``: the names profiled per case, in launch order (the backward's: dK/dV, dQ)."""
    text = open(path).read()
    # session 13's call 3 report names both backward kernels by their function's old name, wgmma_bwd
    names = kernels + (("wgmma_bwd",) if "wgmma_bwd_dq" in kernels else ())
    parts = re.split(r"\n  (?:" + "|".join(names) + r")\[", text)[1:]
    labels = [f"{k} {s} {'causal' if c else 'full'}" for s in SHAPES for c in (False, True) for k in kernels]
    if kernels == ("wgmma_forward", "variants"):  # ``ncu_wgmma.py variants``: (4, 16, 4096, 128) causal
        labels = [f"wgmma_forward {v}" for v in ("plain", "softcap 30", "ALiBi", "dropout 0.1")]
        names = ("wgmma_forward",)
    print("| launch | grid × block | duration | SM busy | stalls per issued instruction (largest first) |")
    print("|---|---|---|---|---|")
    for label, part in zip(labels, parts):
        grid = re.search(r"\) (\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", part).group(1)
        dur = re.search(r"Duration\s+(\S+)\s+([\d.,]+)", part)
        busy = re.search(r"SM Busy\s+%\s+([\d.]+)", part).group(1)
        stalls = {m.group(1): float(m.group(2)) for m in
                  re.finditer(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+inst\s+([\d.]+)", part)}
        top = sorted(((v, k) for k, v in stalls.items() if k != "selected"), reverse=True)[:6]
        print(f"| {label} | {grid} | {dur.group(2)} {dur.group(1)} | {busy} % | "
              + ", ".join(f"{k} {v:.2f}" for v, k in top) + " |")


if __name__ == "__main__":
    which = {"backward": ("wgmma_bwd_dkdv", "wgmma_bwd_dq"), "variants": ("wgmma_forward", "variants")}
    main(sys.argv[1], which.get(sys.argv[2] if sys.argv[2:] else "", ("wgmma_forward",)))

"""Bar chart of ``scripts/bench_table.py`` results: numba-flash against FlashAttention-2
(torch SDPA flash, same run), forward and backward, per shape.

    python3 scripts/plot_table.py results.jsonl out.png [title]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(path, out, title="numba-flash vs FlashAttention-2 (torch SDPA flash), NVIDIA H200"):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "fa2_fwd_tflops" in r]
    labels = [f"({r['B']},{r['H']},{r['N']},{r['d']})\n{r['dtype']}{' causal' if r['causal'] else ''}" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(rows)), 7), sharex=True)
    for ax, pass_ in zip(axes, ("fwd", "bwd")):
        ours = [r[f"{pass_}_tflops"] for r in rows]
        fa2 = [r[f"fa2_{pass_}_tflops"] for r in rows]
        ax.bar(x - 0.2, ours, 0.4, label="numba-flash")
        ax.bar(x + 0.2, fa2, 0.4, label="FlashAttention-2")
        for xi, a, b in zip(x, ours, fa2):
            ax.text(xi - 0.2, a, f"{a / b:.2f}×", ha="center", va="bottom", fontsize=7)
        ax.set_ylabel(f"{'forward' if pass_ == 'fwd' else 'backward'} TFLOP/s")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(x, labels, fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])

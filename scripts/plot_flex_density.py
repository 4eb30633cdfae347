"""Time against block density, from ``scripts/bench_flex.py``'s JSON lines.

    python3 scripts/plot_flex_density.py flex.jsonl block_sparse_density.png

Forward and backward milliseconds of the block-sparse cases (1, 8, 65536, 64) fp16
against the density of their block masks, the dense kernel's time × density dotted.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = [json.loads(line) for line in open(src) if line.startswith("{")]
    dense = next(r for r in rows if r["case"].startswith("dense"))
    sparse = sorted((float(r["case"].split()[-1]), r) for r in rows if r["case"].startswith("block-sparse"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, color in (("fwd_ms", "forward", "C0"), ("bwd_ms", "backward", "C1")):
        dens = [d for d, _ in sparse]
        ax.plot(dens, [r[key] for _, r in sparse], "o-", color=color, label=f"{label}, block-sparse")
        ax.plot(dens, [dense[key] * d for d in dens], ":", color=color, label=f"{label}, dense × density")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("block density (fraction of 128 × 128 blocks kept)")
    ax.set_ylabel("ms (median)")
    ax.set_title("block-sparse FlashAttention, (1, 8, 65536, 64) fp16, H200")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""Session 43: the tile ceilings of issue #11's two TF/s rows, counted one way.

A kernel with BLOCK × BLOCK tiles (128 × 128 on the Hopper path) pays for every pair of a
tile it visits; its TF/s counts the visible pairs only.  A row's ceiling is its tile
efficiency (visible pairs over the pairs of the visited tiles) over its baseline's: the
ratio the row would read if every visited tile cost the same, masked or not (a masked
tile costs more, so the ceiling can only be lower than this).

* window (1024, 0) at (1, 16, 16384), causal, against plain causal at the same shape;
* varlen: 16 causal sequences from ``ragged_draw`` (the scripts' draw),
  against the batch padded to the longest, and the same over ``--draws`` other seeds.

    python3 scripts/tile_ceilings.py [--draws 1000]
"""

import argparse

import numpy as np

from numba_flash.bench.cases import ragged_draw, ragged_lengths, visible_pairs

BLOCK = 128


def causal(n: int, left: int = -1) -> tuple[int, int]:
    """(visible pairs, pairs of the visited tiles) of one causal n × n attention, with a
    window of ``left`` keys (a multiple of BLOCK) or none (−1)."""
    t = -(-n // BLOCK)
    tiles = t * (t + 1) // 2 if left < 0 else sum(min(m, left // BLOCK) + 1 for m in range(t))
    return visible_pairs(n, n, causal=True, window=(left, 0)), tiles * BLOCK * BLOCK


def efficiency(counts) -> float:
    return sum(v for v, _ in counts) / sum(w for _, w in counts)


def varlen_ceiling(lens) -> float:
    return efficiency([causal(int(n)) for n in lens]) / efficiency([causal(int(max(lens)))])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=1000)
    draws = ap.parse_args().draws
    print(f"window (1024, 0), 16384 rows: ceiling {efficiency([causal(16384, 1024)]) / efficiency([causal(16384)]):.3f}")
    lens = ragged_draw()
    print(f"varlen, the scripts' draw ({min(lens)}–{max(lens)} rows): ceiling {varlen_ceiling(lens):.3f}")
    c = np.array([varlen_ceiling(ragged_lengths(np.random.default_rng(s))) for s in range(draws)])
    p10, p25, p50, p90 = np.percentile(c, [10, 25, 50, 90])
    print(f"varlen over seeds 0–{draws - 1}: median {p50:.3f}, p10 {p10:.3f}, p25 {p25:.3f}, p90 {p90:.3f}, "
          f"{c.min():.3f}–{c.max():.3f}; below 0.9 in {np.mean(c < 0.9):.0%}")


if __name__ == "__main__":
    main()

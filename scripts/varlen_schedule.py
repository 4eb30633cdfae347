"""Session 36: is the varlen row's backward gap the grid's tail?  A list-scheduling model of
the Hopper dK/dV and forward grids in their heaviest-first order (``block_info.grid_coords``:
position z for every (head, sequence) pair before the next; causal: dK/dV's first key tiles
first, the forward's last query tiles first), 132 SMs one block each, a block costing one
unit a visited tile (``C0`` more a non-empty block, ``EMPTY`` an empty one), for issue #11's
ragged lengths (``bench_knobs.py varlen``'s draw), their padded batch and 16 × 1024.  Prints
each grid's makespan against the ideal (the work over 132) and a longest-first order's.

    python3 scripts/varlen_schedule.py
"""

import heapq

import numpy as np

from numba_flash.bench.cases import ragged_lengths

H, SM = 16, 132
C0, EMPTY = 1.0, 0.1


def blocks_dkdv(lens, nmax, BN=128, BM=64):
    """Visited 64-row query tiles of each dK/dV block (128 keys), causal, in grid order."""
    out = []
    for z in range(-(-nmax // BN)):
        for L in lens:
            for _ in range(H):
                if z * BN >= L:
                    out.append(0)
                    continue
                q0 = (z * BN) // BM * BM  # causal: queries from the key tile's first row
                out.append(-(-(L - q0) // BM))
    return out


def blocks_fwd(lens, nmax, BM=128, BN=128):
    """Visited 128-key tiles of each forward block (128 queries), causal, in grid order."""
    gz, out = -(-nmax // BM), []
    for z in range(gz):
        for L in lens:
            for _ in range(H):
                t = gz - 1 - z
                out.append(0 if t * BM >= L else -(-min(L, (t + 1) * BM) // BN))
    return out


def makespan(work):
    """(the last SM's finish, the ideal) of ``work`` started in order on the first free SM."""
    heap, total = [0.0] * SM, 0.0
    for w in work:
        t = heapq.heappop(heap)
        d = (C0 + w) if w else EMPTY
        total += d
        heapq.heappush(heap, t + d)
    return max(heap), total / SM


def main():
    lens = ragged_lengths(np.random.default_rng(20261206))
    print("ragged lengths", sorted(int(n) for n in lens))
    longest = int(lens.max())
    for name, ls, nmax in (("ragged varlen", lens, longest), ("padded", [longest] * 16, longest),
                           ("16 x 1024", [1024] * 16, 1024)):
        for kind, fn in (("dK/dV", blocks_dkdv), ("forward", blocks_fwd)):
            w = fn(ls, nmax)
            ms, ideal = makespan(w)
            lpt = makespan(sorted(w, reverse=True))[0]
            print(f"{name:14s} {kind:8s} tiles {sum(w):6d}  makespan {ms:7.1f}  ideal {ideal:7.1f}  "
                  f"{ideal / ms:.3f} of ideal  (longest first: {ideal / lpt:.3f})")


if __name__ == "__main__":
    main()

"""Issue #12's speed bars (FlexAttention and block-sparse), fp16, forward and backward, on one GPU.

    python3 scripts/bench_flex.py out.jsonl [--quick]

Each line of ``out.jsonl`` is one case: milliseconds (median of CUDA-event timings of
10 back-to-back calls after warm-up, ``bench_table.median_ms(calls=10)``) and the ratio
the issue asks for.  Printed last: a short table.

* block-sparse: (1, 8, 65536, 64) with random block patterns (128-blocks, the diagonal
  kept so no row is empty) at densities 100, 50, 25, 10 and 5%, against the dense
  kernel: 10% must run ≥ 7× faster, forward and backward.
* causal as a ``mask_mod`` with its BlockMask, (4, 16, 4096, 128), against the built-in
  causal kernel (≥ 0.85×); an identity ``score_mod`` against plain (≤ 5% slower).
* document mask: 8 documents packed into (1, 16, 16384, 128), a ``create_block_mask``
  of ``doc[q] == doc[k]``, against dense attention on the same tokens (≥ 4× faster):
  8 documents of random lengths, and 8 of 2048 tokens each.  For the random ones, two
  more rows tell where the time goes: the same kept blocks as a fixed pattern (every
  block FULL: no ``mask_mod`` evaluated), and the ideal speed-up, 1 / (the fraction of
  the kernels' tiles visited).
"""

import json
import sys

import cupy as cp
import numpy as np

import numba_flash
from bench_table import median_ms  # scripts/ is on sys.path
from numba_flash import BlockMask, create_block_mask

rng = np.random.default_rng(20261201)
QUICK = "--quick" in sys.argv


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def times(shape, **kw):
    """(forward ms, backward ms) of flash_attention(**kw) at (B, H, N, d)."""
    B, H, N, d = shape
    q, k, v, do = (randn(B, N, H, d) for _ in range(4))
    bkw = {key: val for key, val in kw.items()}
    fkw = {key: val for key, val in kw.items() if key != "score_mod_grad"}
    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **fkw)
    f = median_ms(lambda: numba_flash.flash_attention(q, k, v, **fkw), rep=7 if QUICK else 15, calls=10)
    b = median_ms(lambda: numba_flash.flash_attention_backward(do, q, k, v, out, lse, **bkw), rep=7 if QUICK else 15,
                  calls=5)  # fmt: skip
    return f, b


def identity(score, b, h, q_idx, kv_idx):
    return score


def one(score, b, h, q_idx, kv_idx):
    return 1.0


def causal_mod(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def same_doc(b, h, q_idx, kv_idx, doc):
    return doc[q_idx] == doc[kv_idx]


def main(path):
    rows = []

    def record(case, f, b, base_f, base_b, bar):
        row = dict(case=case, fwd_ms=f, bwd_ms=b, fwd_ratio=base_f / f, bwd_ratio=base_b / b, bar=bar)
        rows.append(row)
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    # block-sparse against dense, N = 65536
    shape = (1, 8, 16384 if QUICK else 65536, 64)
    nb = shape[2] // 128
    dense_f, dense_b = times(shape)
    record("dense 100%", dense_f, dense_b, dense_f, dense_b, "reference")
    for density in (1.0, 0.5, 0.25, 0.1, 0.05):
        pattern = rng.random((nb, nb)) < density
        np.fill_diagonal(pattern, True)
        bm = BlockMask.from_dense(pattern, 128)
        f, b = times(shape, block_mask=bm)
        record(f"block-sparse {bm.density:.3f}", f, b, dense_f, dense_b,
               ">= 7x faster (speed-up as ratio)" if density == 0.1 else "time ~ density")  # fmt: skip

    # causal as a mask_mod against the built-in causal kernel; identity score_mod
    shape = (4, 16, 4096, 128)
    cf, cb = times(shape, causal=True)
    bm = create_block_mask(causal_mod, None, None, 4096, 4096, block_size=128)
    f, b = times(shape, block_mask=bm)
    record("causal as mask_mod", f, b, cf, cb, ">= 0.85x built-in causal")
    pf, pb = times(shape)
    f, b = times(shape, score_mod=identity, score_mod_grad=one)
    record("identity score_mod", f, b, pf, pb, "<= 5% slower than plain (ratio >= 0.952)")

    # 8 documents packed into 16384 tokens
    N = 16384
    cuts = np.sort(rng.choice(np.arange(1, N), size=7, replace=False))
    shape = (1, 16, N, 128)
    df, db = times(shape)
    for name, cuts in (("random lengths", cuts), ("2048 tokens each", np.arange(1, 8) * 2048)):
        doc = np.searchsorted(cuts, np.arange(N), side="right").astype(np.int32)
        bm = create_block_mask(same_doc, None, None, N, N, block_size=128, mod_args=(cp.asarray(doc),))
        f, b = times(shape, block_mask=bm)
        exact = float((np.bincount(doc).astype(np.int64) ** 2).sum()) / N**2
        record(f"document mask, 8 docs of {name} (pairs kept {exact:.3f}, blocks {bm.density:.3f})", f, b, df, db,
               ">= 4x faster than dense")  # fmt: skip
        if name.startswith("random"):
            fwd_kinds = bm.tile_kinds(128, 64)  # the d = 128 forward's tiles
            visited = float(np.mean(fwd_kinds != 0))
            partial = float(np.mean(fwd_kinds == 1)) / visited
            print(f"forward tiles visited {visited:.4f} (ideal speed-up {1 / visited:.2f}), of them PARTIAL {partial:.3f}")
            same = BlockMask.from_dense(bm.kinds[0, 0] != 0, 128, N, N)
            f, b = times(shape, block_mask=same)
            record("  the same blocks, all FULL (no mask_mod)", f, b, df, db, "where the time goes")
            rows.append(dict(case=f"  ideal: 1 / tiles visited ({visited:.3f})", fwd_ms=0, bwd_ms=0,
                             fwd_ratio=1 / visited, bwd_ratio=float("nan"), bar=f"PARTIAL {partial:.3f}"))  # fmt: skip

    print(f"\n{'case':44s} {'fwd ms':>9s} {'bwd ms':>9s} {'fwd x':>7s} {'bwd x':>7s}  bar")
    for r in rows:
        print(f"{r['case']:44s} {r['fwd_ms']:9.3f} {r['bwd_ms']:9.3f} {r['fwd_ratio']:7.3f} {r['bwd_ratio']:7.3f}  "
              f"{r['bar']}")


if __name__ == "__main__":
    main(sys.argv[1])

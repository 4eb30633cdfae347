"""Ring attention over NCCL, forward and backward on one long sequence (issue #15).

    numba-flash launch -n 2 scripts/ring_attention_example.py [--seqlen N] [--heads H]
        [--head-dim D] [--dtype float16] [--causal] [--contiguous] [--check] [--reps R]

Every rank builds only its own shard: the sequence is made of 2·W chunks (zigzag) or
W chunks (``--contiguous``), chunk c drawn from a generator seeded by c, so the full
sequence is the same on every rank without any rank holding it.  Each rank then runs
``ring_attention`` and ``ring_attention_backward`` on its shard (K/V travel around the
ring; nothing trains) and prints its times: medians of CUDA events after a warm-up.

``--check`` (a sequence one GPU holds): each rank also draws the whole sequence, runs
``flash_attention`` / ``flash_attention_backward`` on it, and compares its shard of the
result with the ring's (FlashAttention-2's tolerances are the tests'; here the largest
relative error is printed).
"""

import argparse

import cupy as cp
import numpy as np

import numba_flash
from numba_flash import distributed as dist
from numba_flash.bench.decode import queued_ms

DTYPES = {"float16": cp.float16, "float32": cp.float32}


def chunk(c, n, heads, d, dtype, what):
    """Chunk ``c`` (n rows) of q, k, v or dout: the same on every rank."""
    gen = cp.random.default_rng(1000 * c + "qkvo".index(what))
    return gen.standard_normal((1, n, heads, d), dtype=cp.float32).astype(dtype)


def shard_of(rank, world, zigzag, seqlen, heads, d, dtype, what):
    parts = 2 * world if zigzag else world
    n = seqlen // parts
    return cp.concatenate([chunk(c, n, heads, d, dtype, what) for c in dist._chunks(rank, world, zigzag)], axis=1)


def full(world, zigzag, seqlen, heads, d, dtype, what):
    parts = 2 * world if zigzag else world
    return cp.concatenate([chunk(c, seqlen // parts, heads, d, dtype, what) for c in range(parts)], axis=1)


def median_ms(fn, reps):
    """Median ms of one call, CUDA events around it, after a warm-up call."""
    return queued_ms(fn, calls=1, rep=reps)


def rel(a, b):
    a, b = (cp.asnumpy(x).astype(np.float64) for x in (a, b))
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--contiguous", action="store_true", help="contiguous shards instead of zigzag")
    ap.add_argument("--check", action="store_true", help="compare with the single-GPU result")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    ring = dist.init_ring()
    rank, world, zigzag = ring.rank, ring.world, not a.contiguous
    dt = DTYPES[a.dtype]
    q, k, v, dout = (shard_of(rank, world, zigzag, a.seqlen, a.heads, a.head_dim, dt, w) for w in "qkvo")
    kw = dict(comm=ring, causal=a.causal, zigzag=zigzag)
    out, lse = dist.ring_attention(q, k, v, return_lse=True, **kw)
    grads = dist.ring_attention_backward(dout, q, k, v, out, lse, **kw)
    fwd = median_ms(lambda: dist.ring_attention(q, k, v, **kw), a.reps)
    bwd = median_ms(lambda: dist.ring_attention_backward(dout, q, k, v, out, lse, **kw), a.reps)
    print(f"rank {rank}/{world}: N={a.seqlen} H={a.heads} d={a.head_dim} {a.dtype} causal={a.causal} "
          f"{'zigzag' if zigzag else 'contiguous'}: forward {fwd:.2f} ms, backward {bwd:.2f} ms, "
          f"together {fwd + bwd:.2f} ms", flush=True)  # fmt: skip
    if a.check:
        fq, fk, fv, fdo = (full(world, zigzag, a.seqlen, a.heads, a.head_dim, dt, w) for w in "qkvo")
        ref, ref_lse = numba_flash.flash_attention(fq, fk, fv, causal=a.causal, return_lse=True)
        ref_grads = numba_flash.flash_attention_backward(fdo, fq, fk, fv, ref, ref_lse, causal=a.causal)
        mine = lambda x, axis=1: dist.shard(x, world, rank, zigzag=zigzag, axis=axis)  # noqa: E731
        errs = {"out": rel(out, mine(ref)), "lse": rel(lse, mine(ref_lse, 2))}
        errs.update({n: rel(g, mine(r)) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
        print(f"rank {rank}: largest relative error against one GPU: "
              + ", ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

"""Ring attention (``numba_flash.distributed``) without NCCL: the per-rank steps of W
ranks run in lockstep in one process (``run_local``), the same generators that
``ring_attention`` drives over a NCCL ring.  Forward and backward against
``flash_attention`` on the whole sequence and the float64 reference; contiguous and
zigzag shards; causal and not; GQA; deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BWD_TOL, FWD_TOL, host
from test_variants import _xp

import numba_flash
from numba_flash import distributed as D
from numba_flash import reference

pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def _ring(q, k, v, dout, world, causal, zigzag):
    """Forward and backward over ``world`` local ranks; the full-sequence results."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    shards = [[D.shard(x, world, r, zigzag=zigzag) for x in (q, k, v, dout)] for r in range(world)]
    fwd = D.run_local([D._forward_steps(s[0], s[1], s[2], r, world, causal, scale, zigzag)
                       for r, s in enumerate(shards)])  # fmt: skip
    bwd = D.run_local([D._backward_steps(s[3], s[0], s[1], s[2], fwd[r][0], fwd[r][1], r, world, causal, scale, zigzag)
                       for r, s in enumerate(shards)])  # fmt: skip
    out = D.unshard([o for o, _ in fwd], zigzag=zigzag)
    lse = D.unshard([lse for _, lse in fwd], zigzag=zigzag, axis=2)
    grads = [D.unshard([g[i] for g in bwd], zigzag=zigzag) for i in range(3)]
    return out, lse, grads


def test_shard_round_trip():
    """shard / unshard: contiguous and zigzag (rank r holds chunks r and 2W − 1 − r)."""
    x = np.arange(2 * 12 * 3).reshape(2, 12, 3)
    for zigzag in (False, True):
        parts = [D.shard(x, 3, r, zigzag=zigzag) for r in range(3)]
        assert np.array_equal(D.unshard(parts, zigzag=zigzag), x)
    assert np.array_equal(D.shard(x, 3, 0, zigzag=True)[:, :, 0], x[:, [0, 1, 10, 11], 0])
    with pytest.raises(ValueError, match="multiple of 6"):
        D.shard(x[:, :10], 3, 0, zigzag=True)


@pytest.mark.parametrize("zigzag,causal", [(True, True), (False, False)])
def test_ring_matches_the_whole_sequence(rng, zigzag, causal):
    """Two ranks, fp32, GQA (2 query heads on 1 KV head): out and lse equal
    flash_attention on the whole sequence to fp32 rounding, the gradients equal the
    reference's; a second run gives the same bits."""
    xp = _xp()
    B, N, H, Hk, d = 1, 8, 2, 1, 64
    q, dout = (xp.asarray(rng.standard_normal((B, N, H, d)).astype(np.float32)) for _ in range(2))
    k, v = (xp.asarray(rng.standard_normal((B, N, Hk, d)).astype(np.float32)) for _ in range(2))
    out, lse, grads = _ring(q, k, v, dout, 2, causal, zigzag)
    ref_out, ref_lse = reference.attention(host(q), host(k), host(v), causal=causal)
    assert reference.rel_error(host(out), ref_out) <= FWD_TOL
    assert reference.rel_error(host(lse), ref_lse) <= FWD_TOL
    ref_grads = reference.attention_backward(host(dout), host(q), host(k), host(v), ref_out, ref_lse, causal=causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert reference.rel_error(host(g), r) <= BWD_TOL, name
    whole = numba_flash.flash_attention(q, k, v, causal=causal)
    assert reference.rel_error(host(out), host(whole)) <= FWD_TOL
    again = _ring(q, k, v, dout, 2, causal, zigzag)
    assert np.array_equal(host(again[0]), host(out))
    assert all(np.array_equal(host(a), host(b)) for a, b in zip(again[2], grads))

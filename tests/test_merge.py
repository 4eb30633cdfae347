"""``numba_flash.merge_attention`` (``kernels.merge``): partial attentions over disjoint
key sets merged into the attention over their union, against the float64 reference
(``reference.merge_attention``) and against one attention over all the keys."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FWD_TOL, SIMULATOR, host
from test_variants import _xp

import numba_flash
from numba_flash import _arrays, reference

pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def _parts(rng, xp, cuts, B=1, Nq=4, H=2, d=16, dtype=np.float32):
    """flash_attention over each key range of ``cuts``: (q, k, v, outs, lses)."""
    q = rng.standard_normal((B, Nq, H, d)).astype(dtype)
    k = rng.standard_normal((B, cuts[-1], H, d)).astype(dtype)
    v = rng.standard_normal((B, cuts[-1], H, d)).astype(dtype)
    outs, lses = [], []
    for a, e in zip(cuts[:-1], cuts[1:]):
        o, lse = numba_flash.flash_attention(xp.asarray(q), xp.asarray(k[:, a:e]), xp.asarray(v[:, a:e]),
                                             return_lse=True)  # fmt: skip
        outs.append(o)
        lses.append(lse)
    return q, k, v, xp.stack(outs), xp.stack(lses)


def test_parts_merge_to_the_whole(rng):
    """Three key ranges (one of a single key) merged: flash_attention over all the keys,
    to fp32 rounding; the merge of the parts equals the reference's merge."""
    xp = _xp()
    q, k, v, outs, lses = _parts(rng, xp, [0, 9, 10, 24])
    keep = host(outs).copy(), host(lses).copy()
    out, lse = numba_flash.merge_attention(outs, lses)
    assert out.shape == (1, 4, 2, 16) and out.dtype == np.float32 and lse.shape == (1, 2, 4)
    ref_out, ref_lse = reference.attention(q, k, v)
    assert reference.rel_error(host(out), ref_out) <= FWD_TOL
    assert reference.rel_error(host(lse), ref_lse) <= FWD_TOL
    m_out, m_lse = reference.merge_attention(*keep)
    assert reference.rel_error(host(out), m_out) <= 1e-6
    assert np.array_equal(host(outs), keep[0]) and np.array_equal(host(lses), keep[1])  # inputs untouched


def test_more_parts_than_warps_and_wide_rows(rng):
    """Eleven parts (a warp takes parts w and w + 8), one of them −inf with NaN out, into
    rows of 200 columns (two column blocks, the second partial) against the reference's
    merge, which sums in order: to fp32 rounding."""
    xp = _xp()
    S, B, Nq, H, d = 11, 1, 2, 3, 200
    outs = rng.standard_normal((S, B, Nq, H, d)).astype(np.float32)
    lses = (3 * rng.standard_normal((S, B, H, Nq))).astype(np.float32)
    lses[9, 0, 1, 0] = -np.inf
    outs[9, 0, 0, 1] = np.nan  # (query 0, head 1) of part 9: its lse is −inf
    out, lse = numba_flash.merge_attention(xp.asarray(outs), xp.asarray(lses))
    m_out, m_lse = reference.merge_attention(outs, lses)
    assert np.isfinite(host(out)).all()
    assert reference.rel_error(host(out), m_out) <= 1e-6
    assert reference.rel_error(host(lse), m_lse) <= 1e-6


def test_parts_that_saw_nothing(rng):
    """A part with lse −inf adds nothing, whatever its out holds (NaN here); rows no part
    saw get 0 and −inf; a NaN lse gives a NaN row."""
    xp = _xp()
    o = rng.standard_normal((3, 1, 4, 2, 8)).astype(np.float32)
    lse = rng.standard_normal((3, 1, 2, 4)).astype(np.float32)
    o[1] = np.nan
    lse[1] = -np.inf  # part 1 saw nothing
    lse[:, 0, 1, 2] = -np.inf  # row (i = 2, h = 1): no part saw a key
    lse[0, 0, 0, 3] = np.nan  # row (i = 3, h = 0): NaN
    out, m = numba_flash.merge_attention(xp.asarray(o), xp.asarray(lse))
    out, m = host(out), host(m)
    ref_out, ref_lse = reference.merge_attention(o, lse)
    assert np.all(out[0, 2, 1] == 0) and np.isneginf(m[0, 1, 2])
    assert np.all(np.isnan(out[0, 3, 0])) and np.isnan(m[0, 0, 3])
    ok = ~np.isnan(ref_out)
    assert np.array_equal(np.isnan(out), ~ok)
    assert reference.rel_error(out[ok], ref_out[ok]) <= 1e-6
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(m), np.isneginf(ref_lse))
    assert reference.rel_error(m[fin], ref_lse[fin]) <= 1e-6


@pytest.mark.parametrize("dtype", [np.float16, _arrays.BFLOAT16])
def test_half_parts(rng, dtype):
    """16-bit parts are merged in fp32 and returned in their dtype: within the rounding
    of that dtype of the reference's merge of the same parts."""
    xp = _xp()
    o = rng.standard_normal((2, 1, 3, 2, 16)).astype(dtype)
    lse = rng.standard_normal((2, 1, 2, 3)).astype(np.float32)
    out, _ = numba_flash.merge_attention(xp.asarray(o), xp.asarray(lse))
    assert host(out).dtype == np.dtype(dtype)
    ref, _ = reference.merge_attention(o.astype(np.float64), lse)
    eps = float(np.finfo(np.float16).eps) if dtype == np.float16 else 2.0**-8
    assert reference.rel_error(host(out).astype(np.float64), ref) <= eps


def test_deterministic(rng):
    xp = _xp()
    o = xp.asarray(rng.standard_normal((5, 2, 3, 2, 40)).astype(np.float32))
    lse = xp.asarray(rng.standard_normal((5, 2, 2, 3)).astype(np.float32))
    a = [host(x) for x in numba_flash.merge_attention(o, lse)]
    b = [host(x) for x in numba_flash.merge_attention(o, lse)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_errors_name_the_argument():
    xp = _xp()
    o = xp.zeros((2, 1, 3, 2, 8), np.float32)
    lse = xp.zeros((2, 1, 2, 3), np.float32)
    with pytest.raises(ValueError, match=r"out_parts: shape \(1, 3, 2, 8\)"):
        numba_flash.merge_attention(o[0], lse)
    with pytest.raises(ValueError, match=r"lse_parts: shape \(2, 1, 3, 2\): expected \(S, batch, heads, seqlen_q\)"):
        numba_flash.merge_attention(o, lse.transpose(0, 1, 3, 2))
    with pytest.raises(TypeError, match="lse_parts: dtype float64"):
        numba_flash.merge_attention(o, lse.astype(np.float64))
    with pytest.raises(TypeError, match="out_parts: dtype int32"):
        numba_flash.merge_attention(o.astype(np.int32), lse)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
def test_large_split(rng):
    """A 4096-key attention in 7 uneven parts (two of a single key), merged."""
    xp = _xp()
    q, k, v, outs, lses = _parts(rng, xp, [0, 1, 600, 601, 2000, 3333, 4000, 4096], B=2, Nq=64, H=8, d=128)
    out, lse = numba_flash.merge_attention(outs, lses)
    ref_out, ref_lse = reference.attention(q, k, v)
    assert reference.rel_error(host(out), ref_out) <= FWD_TOL
    assert reference.rel_error(host(lse), ref_lse) <= FWD_TOL

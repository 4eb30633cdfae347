"""The float64 reference's FlexAttention-style user functions (issue #12): ``score_mod``
(with ``score_mod_grad`` for the backward) and block masks (``create_block_mask`` from a
``mask_mod``, ``BlockMask.from_dense``), checked against what they stand for: the
built-in softcap, ALiBi and causal, per-document attention, and a dense mask."""

from __future__ import annotations

import math

import numpy as np
import pytest

from numba_flash import block_mask as M
from numba_flash import reference as R


def _qkv(rng, B=2, H=2, Nq=23, Nk=31, d=8):
    q = rng.standard_normal((B, Nq, H, d))
    k = rng.standard_normal((B, Nk, H, d))
    v = rng.standard_normal((B, Nk, H, d))
    dout = rng.standard_normal((B, Nq, H, d))
    return q, k, v, dout


def _both(q, k, v, dout, **kw):
    """(out, lse, dq, dk, dv) of the reference with keywords ``kw`` (the backward gets
    the forward's own out and lse)."""
    grad_kw = {x: kw.pop(x) for x in ("score_mod_grad",) if x in kw}
    out, lse = R.attention(q, k, v, **kw)
    return (out, lse, *R.attention_backward(dout, q, k, v, out, lse, **kw, **grad_kw))


def _close(a, b):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def test_identity_score_mod_is_plain(rng):
    q, k, v, dout = _qkv(rng)
    _close(_both(q, k, v, dout, causal=True),
           _both(q, k, v, dout, causal=True, score_mod=lambda s, b, h, i, j: s,
                 score_mod_grad=lambda s, b, h, i, j: 1.0))  # fmt: skip


def test_softcap_and_alibi_as_score_mods(rng):
    q, k, v, dout = _qkv(rng)
    cap = 2.5
    slopes = np.abs(rng.standard_normal((2, 2)))

    def mod(s, b, h, i, j, slopes):
        return cap * math.tanh(s / cap) - slopes[b, h] * abs(i + 31 - 23 - j)

    def grad(s, b, h, i, j, slopes):
        return 1.0 - math.tanh(s / cap) ** 2

    _close(_both(q, k, v, dout, softcap=cap, alibi_slopes=slopes),
           _both(q, k, v, dout, score_mod=mod, score_mod_grad=grad, mod_args=(slopes,)))  # fmt: skip


def test_causal_as_a_block_mask(rng):
    q, k, v, dout = _qkv(rng, Nq=40, Nk=52)
    bm = M.create_block_mask(lambda b, h, i, j: j <= i + 12, None, None, 40, 52, block_size=16)
    assert set(np.unique(bm.kinds)) == {M.EMPTY, M.PARTIAL, M.FULL}
    _close(_both(q, k, v, dout, causal=True), _both(q, k, v, dout, block_mask=bm))


def test_document_mask_is_per_document_attention(rng):
    lens = [7, 0, 12, 1, 20]
    ids = np.repeat(np.arange(len(lens)), lens).astype(np.int32)
    n = int(ids.size)
    q, k, v, dout = _qkv(rng, B=1, H=2, Nq=n, Nk=n)
    bm = M.create_block_mask(lambda b, h, i, j, ids: ids[i] == ids[j], None, None, n, n, block_size=16,
                             mod_args=(ids,))  # fmt: skip
    got = _both(q, k, v, dout, block_mask=bm, causal=True)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    out, lse = R.attention_varlen(q[0], k[0], v[0], cu, cu, max(lens), max(lens), causal=True)
    grads = R.attention_varlen_backward(dout[0], q[0], k[0], v[0], out, lse, cu, cu, max(lens), max(lens), causal=True)
    np.testing.assert_allclose(got[0][0], out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1][0], lse.T.T, rtol=1e-10, atol=1e-12)
    for g, r in zip(got[2:], grads):
        np.testing.assert_allclose(g[0], r, rtol=1e-10, atol=1e-12)


def test_dense_block_pattern(rng):
    q, k, v, dout = _qkv(rng, B=1, H=2, Nq=48, Nk=64)
    pattern = rng.integers(0, 2, (3, 4)).astype(bool)
    pattern[:, 0] = True  # every query row sees a block
    pattern[1] = False  # ... except the middle block's rows: out 0, lse -inf
    bm = M.BlockMask.from_dense(pattern, block_size=16)
    got = _both(q, k, v, dout, block_mask=bm)
    dense = np.repeat(np.repeat(pattern, 16, 0), 16, 1)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    s = np.where(dense, s, -np.inf)
    lse = np.log(np.exp(s).sum(-1))
    np.testing.assert_allclose(got[1][:, :, dense.any(1)], lse[:, :, dense.any(1)], rtol=1e-10)
    assert np.isneginf(got[1][:, :, 16:32]).all() and (got[0][:, 16:32] == 0).all()


def test_errors(rng):
    q, k, v, dout = _qkv(rng)
    out, lse = R.attention(q, k, v, score_mod=lambda s, b, h, i, j: 2 * s)
    with pytest.raises(ValueError, match="score_mod_grad"):
        R.attention_backward(dout, q, k, v, out, lse, score_mod=lambda s, b, h, i, j: 2 * s)
    bm = M.BlockMask.from_dense(np.ones((1, 1), bool), block_size=16)
    with pytest.raises(ValueError, match="block_mask: made for seqlen_q=16"):
        R.attention(q, k, v, block_mask=bm)
    with pytest.raises(TypeError, match="score_mod"):
        R.attention(q, k, v, score_mod=3)
    with pytest.raises(TypeError, match="mask_mod 'two': takes 2 arguments, expected 4"):
        def two(b, h):
            return True

        M.create_block_mask(two, 1, 1, 8, 8, block_size=16)
    with pytest.raises(ValueError, match="block_size=12"):
        M.BlockMask.from_dense(np.ones((1, 1), bool), block_size=12)


@pytest.mark.parametrize("bs,bm,bn", [(16, 16, 16), (32, 16, 16), (64, 32, 16), (16, 32, 16), (32, 48, 16),
                                     (48, 32, 64)])  # fmt: skip
def test_tile_kinds_and_visit_lists(rng, bs, bm, bn):
    """A kernel's tiles from the blocks: never EMPTY with a visible pair, never FULL
    with a hidden one (against the dense mask); when the tiles cut the blocks (both
    sides divide the block size) they are classified again by mask_mod, so PARTIAL
    exactly when the tile holds both; the visit lists name the non-EMPTY tiles in
    order, with their PARTIAL flags."""
    exact = bs % bm == 0 and bs % bn == 0
    Nq, Nk = 70, 101
    ids = np.repeat(np.arange(4), [20, 31, 9, 41]).astype(np.int32)
    bm_ = M.create_block_mask(lambda b, h, i, j, ids: ids[i % 101] == ids[j] and j <= i + 31, None, 2, Nq, Nk,
                              block_size=bs, mod_args=(ids,))  # fmt: skip
    for keys_are_rows in (False, True):
        kinds = bm_.tile_kinds(bm, bn, keys_are_rows)
        count, index, partial = bm_.visit_lists(bm, bn, keys_are_rows)
        for h in range(2):
            dense = bm_.dense(0, h)
            if keys_are_rows:
                dense = dense.T
            rows, cols = dense.shape
            tr, tc = (bn, bm) if keys_are_rows else (bm, bn)  # block_m is queries, block_n keys
            for t in range(-(-rows // tr)):
                want = []
                for u in range(-(-cols // tc)):
                    tile = dense[t * tr:(t + 1) * tr, u * tc:(u + 1) * tc]
                    k = kinds[0, h, t, u]
                    if k == M.EMPTY:
                        assert not tile.any()
                    elif k == M.FULL:
                        assert tile.all()
                    if tile.any():
                        assert k != M.EMPTY
                        want.append(u)
                    if exact:
                        assert (k == M.EMPTY) == (not tile.any()) and (k == M.FULL) == tile.all()
                n = count[0, h, t]
                assert list(index[0, h, t, :n]) == [u for u in range(kinds.shape[3]) if kinds[0, h, t, u] != M.EMPTY]
                assert set(want) <= set(index[0, h, t, :n])
                assert list(partial[0, h, t, :n]) == [int(kinds[0, h, t, u] == M.PARTIAL) for u in index[0, h, t, :n]]

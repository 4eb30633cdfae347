"""The float64 reference of issue #14: ``reference.attention_with_kvcache`` (contiguous
and paged caches, in-place appends, ``cache_batch_idx``, rotary) and
``reference.merge_attention``, checked against ``reference.attention`` on the keys each
sequence sees, and rotary against complex multiplication.  NumPy only: no kernels."""

from __future__ import annotations

import numpy as np
import pytest

from numba_flash import reference as R


def _case(rng, B=3, nq=2, H=4, Hk=2, d=16, S=40):
    q = rng.standard_normal((B, nq, H, d))
    kc = rng.standard_normal((B, S, Hk, d))
    vc = rng.standard_normal((B, S, Hk, d))
    return q, kc, vc


def _paged(caches, page, rng, spare=3):
    """Each contiguous cache's rows as pages in a pool, pages shuffled (the same order
    for every cache) among ``spare`` unused ones: (pools, block_table)."""
    B, S = caches[0].shape[:2]
    per = -(-S // page)
    order = rng.permutation(B * per + spare)[: B * per].reshape(B, per)
    pools = []
    for cache in caches:
        pool = np.zeros((B * per + spare, page) + cache.shape[2:])
        for b in range(B):
            for j in range(per):
                rows = cache[b, j * page : (j + 1) * page]
                pool[order[b, j], : len(rows)] = rows
        pools.append(pool)
    return pools, order.astype(np.int32)


@pytest.mark.parametrize("kw", [{}, dict(causal=True), dict(window_size=(5, 2), softcap=2.0),
                                dict(alibi_slopes=np.array([0.3, 0.1, 0.5, 0.2]), causal=True)])  # fmt: skip
def test_contiguous_equals_attention_on_the_cache_rows(rng, kw):
    """Ragged lengths (one of them 0), GQA: each sequence's attention over its first
    cache_seqlens[b] keys, causal aligned to them; lse -inf where nothing is seen."""
    q, kc, vc = _case(rng)
    lens = np.array([7, 0, 40], np.int32)
    out, lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True, **kw)
    for b, n in enumerate(lens):
        o, l = R.attention(q[b : b + 1], kc[b : b + 1, :n], vc[b : b + 1, :n], **kw)
        np.testing.assert_allclose(out[b : b + 1], o, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse[b : b + 1]), np.isneginf(l))
    assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1]))


@pytest.mark.parametrize("n_new", [1, 7])
def test_append_in_place_then_attend(rng, n_new):
    """New k, v land at cache_seqlens .. (nothing else of the cache changes), and the
    attention runs over the old keys and the new ones, causal bottom-right aligned."""
    q, kc, vc = _case(rng, nq=n_new)
    lens = np.array([0, 13, 40 - n_new], np.int32)
    k, v = rng.standard_normal((3, n_new, 2, 16)), rng.standard_normal((3, n_new, 2, 16))
    before_k, before_v = kc.copy(), vc.copy()
    out = R.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
    for b, n in enumerate(lens):
        rows = np.arange(n, n + n_new)
        np.testing.assert_array_equal(kc[b, rows], k[b])
        np.testing.assert_array_equal(vc[b, rows], v[b])
        keep = np.ones(40, bool)
        keep[rows] = False
        np.testing.assert_array_equal(kc[b, keep], before_k[b, keep])
        np.testing.assert_array_equal(vc[b, keep], before_v[b, keep])
        keys = np.concatenate([before_k[b, :n], k[b]])[None]
        vals = np.concatenate([before_v[b, :n], v[b]])[None]
        o, _ = R.attention(q[b : b + 1], keys, vals, causal=True)
        np.testing.assert_allclose(out[b : b + 1], o, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("page", [16, 64, 256])
def test_paged_equals_contiguous(rng, page):
    """A paged cache (pages shuffled in a pool with unused pages) gives the contiguous
    cache's numbers, appends land in the right pages, the unused pages stay as they were."""
    q, kc, vc = _case(rng, S=300)
    lens = np.array([5, 200, 299], np.int32)
    k, v = rng.standard_normal((3, 1, 2, 16)), rng.standard_normal((3, 1, 2, 16))
    (pk, pv), table = _paged((kc, vc), page, rng)
    unused = np.setdiff1d(np.arange(len(pk)), table)
    spare_k = pk[unused].copy()
    want = R.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
    got = R.attention_with_kvcache(q, pk, pv, k, v, cache_seqlens=lens, causal=True, block_table=table)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(pk[table[b, n // page], n % page], k[b, 0])
    np.testing.assert_array_equal(pk[unused], spare_k)


def test_cache_batch_idx_picks_the_rows(rng):
    q, kc, vc = _case(rng, B=2)
    big_k, big_v = rng.standard_normal((5, 40, 2, 16)), rng.standard_normal((5, 40, 2, 16))
    idx = np.array([4, 1], np.int32)
    big_k[idx], big_v[idx] = kc, vc
    got = R.attention_with_kvcache(q, big_k, big_v, cache_seqlens=9, cache_batch_idx=idx)
    want = R.attention_with_kvcache(q, kc, vc, cache_seqlens=9)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_is_a_complex_rotation(rng, interleaved):
    """apply_rotary against (x_a + i x_b) · e^{iθ} on the pairs it rotates; features past
    rotary_dim unchanged."""
    x = rng.standard_normal((5, 3, 12))
    theta = rng.standard_normal((9, 4))
    pos = np.array([0, 8, 3, 3, 1])
    out = R.apply_rotary(x, np.cos(theta), np.sin(theta), pos, interleaved)
    a, b = (x[..., 0:8:2], x[..., 1:8:2]) if interleaved else (x[..., :4], x[..., 4:8])
    z = (a + 1j * b) * np.exp(1j * theta[pos])[:, None, :]
    ra, rb = (out[..., 0:8:2], out[..., 1:8:2]) if interleaved else (out[..., :4], out[..., 4:8])
    np.testing.assert_allclose(ra, z.real, atol=1e-12)
    np.testing.assert_allclose(rb, z.imag, atol=1e-12)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])


@pytest.mark.parametrize("causal", [False, True])
def test_rotary_positions(rng, causal):
    """k rotated at its cache positions before the append; q at cache_seqlens + i when
    causal (or windowed), else every query at cache_seqlens (FlashAttention-2)."""
    q, kc, vc = _case(rng, nq=3)
    k, v = rng.standard_normal((3, 3, 2, 16)), rng.standard_normal((3, 3, 2, 16))
    theta = rng.standard_normal((64, 4))
    cos, sin = np.cos(theta), np.sin(theta)
    lens = np.array([2, 10, 30], np.int32)
    old_k, old_v = kc.copy(), vc.copy()
    out = R.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin,
                                   causal=causal, rotary_interleaved=False)  # fmt: skip
    for b, n in enumerate(lens):
        pos = n + np.arange(3)
        k_rot = R.apply_rotary(k[b], cos, sin, pos, False)
        np.testing.assert_allclose(kc[b, pos], k_rot, atol=1e-12)
        q_rot = R.apply_rotary(q[b], cos, sin, pos if causal else np.full(3, n), False)
        keys = np.concatenate([old_k[b, :n], k_rot])[None]
        vals = np.concatenate([old_v[b, :n], v[b]])[None]
        o, _ = R.attention(q_rot[None], keys, vals, causal=causal)
        np.testing.assert_allclose(out[b : b + 1], o, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("splits", [2, 3, 64])
def test_splits_merge_to_the_whole(rng, splits):
    """num_splits cuts the keys (some parts empty when splits > keys) and merges them:
    the unsplit numbers to rounding."""
    q, kc, vc = _case(rng)
    lens = np.array([3, 17, 40], np.int32)
    whole = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_lse=True)
    split = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_lse=True, num_splits=splits)
    np.testing.assert_allclose(split[0], whole[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(split[1], whole[1], rtol=1e-12, atol=1e-12)


def test_merge_attention(rng):
    """Parts over disjoint keys merge to the attention over all of them; a part that saw
    nothing (lse -inf) contributes nothing; rows no part saw: out 0, lse -inf."""
    q, kc, vc = _case(rng, B=2)
    cuts = [0, 9, 10, 40]
    parts = [R.attention(q, kc[:, a:e], vc[:, a:e]) for a, e in zip(cuts[:-1], cuts[1:])]
    empty_o, empty_l = np.full_like(parts[0][0], 7.0), np.full_like(parts[0][1], -np.inf)
    outs = np.stack([p[0] for p in parts] + [empty_o])
    lses = np.stack([p[1] for p in parts] + [empty_l])
    out, lse = R.merge_attention(outs, lses)
    want, want_lse = R.attention(q, kc, vc)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    none, none_lse = R.merge_attention(np.stack([empty_o, empty_o]), np.stack([empty_l, empty_l]))
    assert np.all(none == 0) and np.all(np.isneginf(none_lse))
    with pytest.raises(ValueError, match="out_parts, lse_parts"):
        R.merge_attention(outs, lses[:, :, :1])


def test_errors_name_the_argument(rng):
    q, kc, vc = _case(rng)
    k = v = rng.standard_normal((3, 2, 2, 16))
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] \+ seqlen_new = 39 \+ 2 > 40"):
        R.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=np.array([0, 1, 39]))
    table = np.array([[0, 1], [2, 3], [4, 99]], np.int32)
    pool = rng.standard_normal((6, 16, 2, 16))
    with pytest.raises(ValueError, match=r"block_table\[2\]: pages \[4, 99\]"):
        R.attention_with_kvcache(q, pool, pool.copy(), cache_seqlens=20, block_table=table)
    with pytest.raises(ValueError, match="past the end of the cache \\(its pages\\)"):
        R.attention_with_kvcache(q, pool, pool.copy(), k, v, cache_seqlens=31, block_table=table[:, :2] % 6)
    with pytest.raises(ValueError, match="cache_batch_idx: not with a paged cache"):
        R.attention_with_kvcache(q, pool, pool.copy(), cache_seqlens=1, block_table=table % 6,
                                 cache_batch_idx=np.arange(3))  # fmt: skip
    with pytest.raises(ValueError, match="cache_batch_idx"):
        R.attention_with_kvcache(q, kc, vc, cache_seqlens=1, cache_batch_idx=np.array([0, 1, 3]))
    with pytest.raises(ValueError, match="k, v: give both"):
        R.attention_with_kvcache(q, kc, vc, k, None, cache_seqlens=1)
    with pytest.raises(ValueError, match="rotary_cos: 8 positions"):
        R.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=7, rotary_cos=np.ones((8, 4)),
                                 rotary_sin=np.zeros((8, 4)))  # fmt: skip
    with pytest.raises(ValueError, match="num_splits"):
        R.attention_with_kvcache(q, kc, vc, cache_seqlens=1, num_splits=0)

"""``numba_flash.flash_attention_with_kvcache`` against the float64 reference
(``reference.attention_with_kvcache``, which appends to its own copy of the caches):
contiguous and paged caches, ragged ``cache_seqlens``, ``cache_batch_idx``, appends with
rotary (interleaved and halves), GQA/MQA, causal, window, softcap, ALiBi and split-KV.
The caches' untouched entries stay bit-identical, the appended ones equal the
reference's to rounding, and a bad call is refused before anything is written.

The simulator runs a few tiny cases (each a launch of up to 8 blocks); the matrix of
issue #14 runs with ``pytest -m gpu``."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from conftest import FWD_TOL, host, kernels_launched, seen_lse_error
from test_variants import FLOOR, _xp

import numba_flash
from numba_flash import _arrays, reference

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BF16 = _arrays.BFLOAT16


def _case(rng, dtype, *, B=2, Nq=2, H=2, H_kv=1, d=64, lens=(5, 17), n_new=0, page=0, capacity=40, rotary=None,
          alibi=False, poison=False):  # fmt: skip
    """Inputs of one call: q, caches (paged when ``page``), new k/v, keywords.
    ``poison``: every cache row the call does not read (past a sequence's keys, in pages
    or cache rows no sequence owns) is NaN, so that a kernel reading one shows."""
    lens = np.asarray(lens, np.int32)
    kw = {"cache_seqlens": lens}
    if page:
        per_seq = -(-capacity // page)
        blocks = B * per_seq + 2
        kw["block_table"] = rng.permutation(blocks)[:B * per_seq].reshape(B, per_seq).astype(np.int32)
        shape = (blocks, page, H_kv, d)
    else:
        kw["cache_batch_idx"] = rng.permutation(B + 1)[:B].astype(np.int32)
        shape = (B + 1, capacity, H_kv, d)
    k_cache, v_cache = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    if poison:
        read = np.zeros(shape[:2], bool)  # (page or cache row, row in it)
        for b, n in enumerate(lens + n_new):
            pos = np.arange(n)
            if page:
                read[kw["block_table"][b, pos // page], pos % page] = True
            else:
                read[kw["cache_batch_idx"][b], pos] = True
        k_cache[~read] = np.nan
        v_cache[~read] = np.nan
    q = rng.standard_normal((B, Nq, H, d)).astype(dtype)
    new = [rng.standard_normal((B, n_new, H_kv, d)).astype(dtype) for _ in range(2)] if n_new else [None, None]
    if rotary is not None:
        angles = rng.standard_normal((capacity + Nq, d // 4))
        kw.update(rotary_cos=np.cos(angles).astype(np.float32), rotary_sin=np.sin(angles).astype(np.float32),
                  rotary_interleaved=rotary)  # fmt: skip
    if alibi:
        kw["alibi_slopes"] = (rng.random((B, H)) * 0.3).astype(np.float32)
    return q, k_cache, v_cache, new, kw


def _baseline_errors(q, k_cache, v_cache, kw, ref_out, ref_lse, dtype, variant):
    """The errors (O, lse) of a standard attention in ``dtype``
    (``reference.attention_lowp``) over the reference's appended caches and rotated
    queries, per sequence."""
    lens = kw["cache_seqlens"]
    n_all = lens + variant["n_new"]
    out = np.empty(ref_out.shape)
    lse = np.empty(ref_lse.shape)
    for b in range(q.shape[0]):
        table = kw.get("block_table")
        cb = None if table is not None else int(kw["cache_batch_idx"][b])
        kk, vv = (reference._cache_rows(c, b, cb, int(n_all[b]), table) for c in (k_cache, v_cache))
        qb = q[b]
        if "rotary_cos" in kw:
            rows = variant["causal"] or variant["window"] != (-1, -1)
            where = lens[b] + (np.arange(q.shape[1]) if rows else np.zeros(q.shape[1], int))
            qb = reference.apply_rotary(qb, kw["rotary_cos"], kw["rotary_sin"], where, kw["rotary_interleaved"])
        slopes = None if "alibi_slopes" not in kw else kw["alibi_slopes"][b:b + 1]
        o, m = reference.attention_lowp(qb[None], kk[None], vv[None], dtype=dtype, causal=variant["causal"],
                                        window_size=variant["window"], softcap=variant["softcap"],
                                        alibi_slopes=slopes)  # fmt: skip
        out[b], lse[b] = o[0], m[0]
    return reference.rel_error(out, ref_out), seen_lse_error(lse, ref_lse)


def check_kvcache(rng, dtype, *, causal=False, window=(-1, -1), softcap=0.0, num_splits=1, **shape):
    """One call against the reference; the caches afterwards against the reference's."""
    xp = _xp()
    q, k_cache, v_cache, (k, v), kw = _case(rng, dtype, **shape)
    variant = dict(causal=causal, window=window, softcap=softcap, n_new=shape.get("n_new", 0))
    ref_k, ref_v = k_cache.astype(np.float64), v_cache.astype(np.float64)
    kw_call = dict(kw, causal=causal, window_size=window, softcap=softcap)
    ref_out, ref_lse = reference.attention_with_kvcache(q, ref_k, ref_v, k, v, return_lse=True, **kw_call)
    dev = {n: xp.asarray(x) for n, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))}
    new = {n: xp.asarray(x) for n, x in (("k", k), ("v", v)) if x is not None}
    dev_kw = {n: (xp.asarray(x) if isinstance(x, np.ndarray) and n != "cache_seqlens" else x) for n, x in
              kw_call.items()}  # fmt: skip
    before = host(dev["k_cache"]).copy(), host(dev["v_cache"]).copy()
    out, lse = numba_flash.flash_attention_with_kvcache(dev["q"], dev["k_cache"], dev["v_cache"], **new,
                                                        num_splits=num_splits, return_lse=True, **dev_kw)  # fmt: skip
    out, lse = host(out), host(lse)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    err = reference.rel_error(out, ref_out)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows that see no key: lse -inf"
    lse_err = seen_lse_error(lse, ref_lse)
    if np.dtype(dtype) == np.float32:
        tol = lse_tol = FWD_TOL
    else:  # FlashAttention-2's bar: twice the error of a standard attention in the same dtype
        base, base_lse = _baseline_errors(q, ref_k, ref_v, kw_call, ref_out, ref_lse, dtype, variant)
        tol, lse_tol = 2 * base + FLOOR, 2 * base_lse + FLOOR
    assert err <= tol, f"O rel error {err:.3g} > {tol:.3g} ({np.dtype(dtype).name}, seed {rng.seed_value})"
    assert lse_err <= lse_tol, f"lse rel error {lse_err:.3g} > {lse_tol:.3g} (seed {rng.seed_value})"
    # the caches: appended rows as the reference wrote them (to one rounding), the rest untouched
    after = host(dev["k_cache"]), host(dev["v_cache"])
    for name, b4, now, ref in (("k_cache", before[0], after[0], ref_k), ("v_cache", before[1], after[1], ref_v)):
        was = b4.astype(np.float64)
        written = ~((ref == was) | (np.isnan(ref) & np.isnan(was)))  # (poisoned rows stay NaN)
        assert np.array_equal(now[~written], b4[~written], equal_nan=True), \
            f"{name}: entries outside the append changed"
        if written.any():
            step = np.finfo(np.float32).eps if np.dtype(dtype) == np.float32 else 2.0 ** -7
            diff = np.max(np.abs(now[written].astype(np.float64) - ref[written]))
            assert diff <= 4 * step * np.nanmax(np.abs(ref)), \
                f"{name}: appended rows"
    return out


def test_contiguous_gqa_causal_append_one(rng):
    """fp32, a contiguous cache in a permuted ``cache_batch_idx``, one token appended,
    causal (bottom-right to cache_seqlens + 1), 2 query heads on 1 KV head."""
    check_kvcache(rng, np.float32, causal=True, n_new=1)


def test_paged_rotary_window_three_splits(rng):
    """fp32, pages of 16 rows in a shuffled block table, 7 tokens appended with
    interleaved rotary, window (9, 0) with causal, three splits merged."""
    check_kvcache(rng, np.float32, causal=True, window=(9, 0), n_new=7, page=16, rotary=True, num_splits=3,
                  lens=(3, 20))  # fmt: skip


def test_half_paged_softcap_alibi_auto_splits(rng):
    """fp16 on tensor cores: pages of 16, rotary in halves (GPT-NeoX), softcap and
    ALiBi, the split count chosen for the device (num_splits=0)."""
    check_kvcache(rng, np.float16, softcap=20.0, n_new=2, page=16, rotary=False, alibi=True, num_splits=0,
                  lens=(0, 30), H=2, H_kv=2)  # fmt: skip


def test_bfloat16_mqa_contiguous(rng):
    """bf16, MQA (4 query heads on 1 KV head), a contiguous cache, no append."""
    check_kvcache(rng, BF16, H=4, H_kv=1, Nq=1, lens=(12, 33))


def test_decode_gqa_heads_as_rows(rng):
    """fp32 decoding (one query) with 4 query heads on each of 2 KV heads, causal, one
    token appended, two splits: the group's heads run as the rows of one sequence."""
    check_kvcache(rng, np.float32, causal=True, Nq=1, H=8, H_kv=2, n_new=1, page=16, num_splits=2, lens=(9, 40),
                  capacity=48)  # fmt: skip


def test_half_decode_gqa_three_splits(rng):
    """fp16 decoding on the one-warp decode tiles: 4 query heads on each of 2 KV heads
    as rows (read from q in place), three splits whose fp32 partials the last split's
    block merges and rounds once to fp16."""
    check_kvcache(rng, np.float16, Nq=1, H=8, H_kv=2, n_new=1, page=16, num_splits=3, lens=(9, 40), capacity=48)


@pytest.mark.parametrize("Nq,H,page", [(2, 2, 0), (1, 8, 0), (1, 8, 16)])
def test_half_splits_merged_in_the_kernel(monkeypatch, rng, Nq, H, page):
    """Split-KV on the tensor-core forward: the last split of a row tile to finish merges
    the parts (``kernels.merge.merge_if_last``; the merge kernel is not launched).  Two
    queries a sequence (no swap), or one with the GQA decode swap (q's heads read in
    place), contiguous and paged; the first sequence's last two splits see no key; two
    calls in a row, so that the arrival counters must have been reset by the first."""
    from numba_flash import merge

    def no_merge_kernel(*args):
        raise AssertionError("the merge kernel ran")

    monkeypatch.setattr(merge, "merge_into", no_merge_kernel)
    for _ in range(2):
        check_kvcache(rng, np.float16, causal=True, Nq=Nq, H=H, H_kv=2 if H == 8 else 1, n_new=1, page=page,
                      num_splits=3, lens=(9, 90), capacity=100)  # fmt: skip


def _clusters_seen(monkeypatch) -> list:
    """The cluster size (``Variant.cluster``) of each KV-cache call's plan from now on,
    appended as the calls make them (``kvcache._launch_plan`` wrapped)."""
    from numba_flash import kvcache

    seen, real = [], kvcache._launch_plan

    def spy(*args):
        plan, splits, per_split = real(*args)
        seen.append(plan.problem.features.cluster)
        return plan, splits, per_split

    monkeypatch.setattr(kvcache, "_launch_plan", spy)
    return seen


@pytest.mark.parametrize("dtype,page,d", [(np.float16, 0, 64), (BF16, 16, 64), (np.float16, 16, 128)])
def test_half_decode_merged_in_a_cluster(monkeypatch, rng, dtype, page, d):
    """The GQA decode swap with one split runs the cluster merge (``Variant.cluster``,
    ``kernels.merge.merge_in_cluster``): rows and lse staged in shared memory, the
    cluster's barriers, each part read through ``mapa``/``ld.shared::cluster`` and the
    merged rows written in place.  The simulator runs one block at a time, so its
    clusters have one CTA; the GPU runs clusters of 2 to 4 (``test_decode_merges_gpu``,
    and issue #14's matrix under ``-m gpu``)."""
    clusters = _clusters_seen(monkeypatch)
    check_kvcache(rng, dtype, Nq=1, H=8, H_kv=2, n_new=1, page=page, num_splits=1, lens=(9, 40), capacity=48, d=d)
    assert clusters == [1], clusters


def test_cluster_of_the_splits():
    """Where split-KV's splits run as one cluster (``kvcache.cluster_of``): on sm_90+ with
    at most 4 splits of the decode tiles; not on sm_80, not past 4 splits, not with
    ``NUMBA_FLASH_CLUSTER_MERGE=0``; in the simulator a cluster of one only."""
    from numba_flash import api, kvcache
    from numba_flash import plan as P

    feats = numba_flash.variant.Variant(varlen=True, paged=True, split=True)

    def plan(arch, d=128):
        return api._plan(P.Problem("forward", "float16", d, False, False, True, 32, 8, 4, 4096, arch, False, feats,
                                   8, 32, 0))  # fmt: skip

    hopper, ampere = plan((9, 0, "a")), plan((8, 0))
    assert hopper.launches[0].tiles.warps == 1  # the decode tiles
    assert kvcache.cluster_of(hopper, 1, 128) == 1 and kvcache.cluster_of(hopper, 4, 128) == 0  # simulator
    sim = kvcache.SIMULATOR
    try:
        kvcache.SIMULATOR = False
        assert [kvcache.cluster_of(hopper, s, 128) for s in (1, 3, 4, 5, 8)] == [1, 3, 4, 0, 0]
        assert kvcache.cluster_of(ampere, 4, 128) == 0
        assert kvcache.cluster_of(hopper, 4, 126) == 0  # 16-byte chunks of fp32: d % 4 == 0
        os.environ["NUMBA_FLASH_CLUSTER_MERGE"] = "0"
        assert kvcache.cluster_of(hopper, 4, 128) == 0
    finally:
        kvcache.SIMULATOR = sim
        os.environ.pop("NUMBA_FLASH_CLUSTER_MERGE", None)


def test_decode_split_count_with_the_cluster_merge(monkeypatch):
    """``num_splits=0`` on the decode tiles of an sm_90 device (132 SMs; B = 8, 8 KV heads,
    the GQA swap): 4 splits, one cluster a row tile, on a contiguous cache and across
    pages of 256 alike; across pages with the cluster merge off, 8 (four slots an SM)."""
    from numba_flash import api, kvcache
    from numba_flash.variant import Variant

    monkeypatch.setattr(kvcache, "SIMULATOR", False)
    monkeypatch.setattr(kvcache, "_sms", lambda device: 132)

    def plan(page_rows, L=4096):
        p, splits, _ = kvcache._launch_plan.__wrapped__(Variant(varlen=True, gqa=True), True, "float16", 128, False,
                                                         True, 8, 8, 4, L, 8, 0, 0, api._plan_env(), page_rows)
        return splits, p.problem.features.cluster, p.launches[0].cluster

    for page_rows in (0, 256):
        assert plan(page_rows) == plan(page_rows, 131072) == (4, 4, (1, 1, 4))
    monkeypatch.setenv("NUMBA_FLASH_CLUSTER_MERGE", "0")
    assert plan(0) == (4, 0, (1, 1, 1)) and plan(256) == (8, 0, (1, 1, 1))


def test_half_pages_of_48_rows_some_tiles_across_two(rng):
    """fp16 on the decode tiles (32 keys) over pages of 48 rows: tiles [0, 32) lie in page
    0, [32, 64) cross into page 1 (found row by row), [64, 96) lie in page 1
    (``copy.page_of``, a page that is not a power of two); a causal append of 3."""
    check_kvcache(rng, np.float16, causal=True, n_new=3, page=48, lens=(60, 90), capacity=96, H=4, H_kv=2, Nq=3)


@pytest.mark.parametrize("page,dtype", [(16, np.float16), (48, BF16), (0, np.float16)])
def test_prefill_on_the_hopper_forward(monkeypatch, rng, page, dtype):
    """More query rows than the decode tiles take run the wgmma forward (its simulator
    twins here): pages of 16 rows (a key tile in 8 TMA boxes), of 48 (boxes of 16; the
    first tile spans three pages, the second ends inside one) and a contiguous cache (a
    box a tile; TMA zero-fills past the cache row).  Two key tiles for the longer
    sequence, so that its last tile's stage holds the first's rows where no box was
    copied; every row the call does not read is NaN.  Ragged lengths, causal, GQA,
    appends of 3."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    with kernels_launched() as ran:
        check_kvcache(rng, dtype, causal=True, B=2, Nq=20, H=2, H_kv=1, d=64, lens=(30, 150), n_new=3, page=page,
                      capacity=192, poison=True)  # fmt: skip
    assert ran[-1] == "wgmma_forward", ran


@pytest.mark.parametrize("num_splits,on,page", [(2, "0", 0), (3, "0", 0), (3, "1", 0), (2, "1", 16)])
def test_prefill_splits_cover_every_key(monkeypatch, rng, num_splits, on, page):
    """A prefill (more query rows than the decode tiles take) with split-KV on an sm_90a
    target: the split count is made on the Hopper forward's tiles (128 keys), the splits
    run the mma.sync forward (64 keys a tile), so each split's key tiles must be counted
    in the latter's (session 27: counted in the former's, the splits covered half of the
    keys and the output was silently wrong).  With ``NUMBA_FLASH_WGMMA_SPLIT=1`` the
    splits run the Hopper forward (persistent blocks over the (split, sequence) tiles,
    each part fp32, then the merge kernel), contiguous and paged."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SPLIT", on)
    with kernels_launched() as ran:
        check_kvcache(rng, np.float16, causal=True, num_splits=num_splits, B=2, Nq=20, H=2, H_kv=1, d=64,
                      lens=(150, 300), page=page, capacity=320)  # fmt: skip
    assert ran == ["wgmma_forward" if on == "1" else "tc_forward"], ran  # (the merge kernel after it)


@pytest.mark.parametrize("on", ["0", "1"])
def test_mqa_decode_swap_past_the_decode_tiles(monkeypatch, rng, on):
    """Decoding with 32 query heads a KV head: the swap makes them 32 rows of a sequence,
    more than the decode tiles take, so on an sm_90a target the 128-row tiles run it
    (the mma.sync forward, or with ``NUMBA_FLASH_WGMMA_SPLIT=1`` the Hopper forward),
    three splits, the merge kernel putting the rows back in place."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SPLIT", on)
    with kernels_launched() as ran:
        check_kvcache(rng, np.float16, num_splits=3, B=2, Nq=1, H=32, H_kv=1, d=64, lens=(300, 170), page=0,
                      capacity=320)  # fmt: skip
    assert ran == ["wgmma_forward" if on == "1" else "tc_forward"], ran


def test_split_count_heuristic():
    """1 split when the blocks fill 80% of the SMs; otherwise enough splits to fill
    waves, never more than the key tiles."""
    from numba_flash.kvcache import split_count

    assert split_count(132, 100, 132) == 1 and split_count(106, 100, 132) == 1
    assert split_count(8, 1000, 132) >= 8  # 8 blocks: most of the SMs would idle
    assert split_count(8, 3, 132) <= 3 and split_count(0, 10, 132) == 1


@pytest.mark.usefixtures("poisoned_outputs")
def test_window_side_of_the_capacity_is_open_as_flash_attn(rng):
    """FlashAttention-2's ``mha_fwd_kvcache`` compares the window's sides with the cache's
    capacity (``variant.fa2_window``): 12 queries over 3 cached keys with window (−1, 5)
    is plain attention in a cache of 3 rows (5 ≥ 3), and the formula's mask in a cache of
    8 (rows 0–3 see no key); both as the reference."""
    xp = _xp()
    q = rng.standard_normal((1, 12, 2, 16)).astype(np.float32)
    for capacity, blind_rows in ((3, 0), (8, 4)):
        k_cache, v_cache = (rng.standard_normal((1, capacity, 2, 16)).astype(np.float32) for _ in range(2))
        kw = dict(cache_seqlens=np.array([3], np.int32), window_size=(-1, 5), return_lse=True)
        out, lse = (host(x) for x in numba_flash.flash_attention_with_kvcache(
            xp.asarray(q), xp.asarray(k_cache), xp.asarray(v_cache), **kw))  # fmt: skip
        ref, ref_lse = reference.attention_with_kvcache(q, k_cache.astype(np.float64), v_cache.astype(np.float64),
                                                        **kw)  # fmt: skip
        assert np.isneginf(lse).sum(axis=2).tolist() == [[blind_rows] * 2]
        assert np.array_equal(np.isneginf(ref_lse), np.isneginf(lse))
        assert reference.rel_error(out, ref) <= FWD_TOL
        if capacity == 3:
            plain, _ = reference.attention_with_kvcache(q, k_cache.astype(np.float64), v_cache.astype(np.float64),
                                                        cache_seqlens=np.array([3], np.int32), return_lse=True)
            assert np.array_equal(ref, plain)


def test_bad_calls_raise_before_any_write(rng):
    """Writes past the cache, a page past the cache, a dtype or side mismatch and a bad
    split count: ValueError/TypeError naming the argument, and the cache untouched."""
    xp = _xp()
    q, k_cache, v_cache, (k, v), kw = _case(rng, np.float32, n_new=3, page=16, capacity=32, lens=(5, 30))
    dq, dk, dv, nk, nv = (xp.asarray(x) for x in (q, k_cache, v_cache, k, v))
    keep = host(dk).copy()
    call = numba_flash.flash_attention_with_kvcache
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] \+ seqlen_new = 30 \+ 3 > 32"):
        call(dq, dk, dv, nk, nv, **{**kw, "block_table": xp.asarray(kw["block_table"])})
    table = kw["block_table"].copy()
    table[0, 0] = k_cache.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        call(dq, dk, dv, nk, nv, cache_seqlens=np.array([5, 10], np.int32), block_table=table)
    with pytest.raises(TypeError, match="k_cache: dtype float16"):
        call(dq, xp.asarray(k_cache.astype(np.float16)), dv, block_table=kw["block_table"])
    with pytest.raises(ValueError, match="num_splits"):
        call(dq, dk, dv, block_table=kw["block_table"], cache_seqlens=3, num_splits=-1)
    with pytest.raises(ValueError, match="k, v: give both"):
        call(dq, dk, dv, nk, block_table=kw["block_table"], cache_seqlens=3)
    assert np.array_equal(host(dk), keep)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,page,n_new,splits", [
    (dt, page, n, s) for dt, page, n, s in itertools.product((np.float16, BF16, np.float32), (0, 16, 64, 256), (1, 7),
                                                             (1, 3, 0))])  # fmt: skip
def test_matrix_gpu(rng, dtype, page, n_new, splits):
    """Issue #14's matrix on the GPU: contiguous and paged (16, 64, 256), appends of 1
    and 7 with rotary, ragged lengths up to ~1000, num_splits 1, 3 and auto, with GQA,
    causal and (by the case) window, softcap, ALiBi; deterministic."""
    variant = [dict(causal=True), dict(window=(100, 50), softcap=30.0), dict(causal=True, window=(300, 0))][
        (page + n_new) % 3]  # fmt: skip
    shape = dict(B=3, Nq=4, H=8, H_kv=2, d=128, lens=(0, 517, 990), n_new=n_new, page=page, capacity=1024,
                 rotary=bool(n_new == 1), alibi=page == 64)  # fmt: skip
    check_kvcache(rng, dtype, num_splits=splits, **variant, **shape)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,page,d,splits,on", [(np.float16, 0, 128, 3, "0"), (BF16, 16, 64, 0, "0"),
                                                    (np.float16, 256, 128, 0, "1"), (BF16, 0, 64, 3, "1"),
                                                    (np.float16, 48, 128, 0, "1")])  # fmt: skip
def test_prefill_splits_gpu(monkeypatch, rng, dtype, page, d, splits, on):
    """Split-KV under a prefill of 300 query rows of one sequence among three (few row
    tiles: auto picks several splits) on the GPU: every key in some split (the split count's
    tiles and the split kernel's may differ on an sm_90a target); the splits on the
    mma.sync forward, or with ``NUMBA_FLASH_WGMMA_SPLIT=1`` on the Hopper forward."""
    from numba_flash._numba_cuda import target_arch

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SPLIT", on)
    with kernels_launched() as ran:
        check_kvcache(rng, dtype, num_splits=splits, causal=True, B=3, Nq=300, H=8, H_kv=2, d=d, lens=(0, 517, 2000),
                      n_new=7, page=page, capacity=2048, poison=True)  # fmt: skip
    if on == "1" and tuple(target_arch()) == (9, 0, "a"):  # (with "0", auto may take one split: the Hopper forward)
        assert ran == ["wgmma_forward"], ran


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,page,d", [(dt, page, d) for dt in (np.float16, BF16) for page in (0, 16, 48, 256)
                                          for d in (64, 128)])  # fmt: skip
def test_prefill_matrix_gpu(rng, dtype, page, d):
    """A prefill (300 query rows) on every page size on the GPU: the Hopper forward on an
    sm_90a target (key boxes of 128, 16, 16 and 128 rows), the mma.sync one elsewhere;
    appends of 7 with rotary, ragged lengths (one sequence of only the appended keys),
    GQA, causal, window, softcap and ALiBi by the case; every row the call does not
    read is NaN."""
    from numba_flash._numba_cuda import target_arch

    variant = [dict(causal=True), dict(window=(100, 50), softcap=30.0), dict(causal=True, window=(300, 0))][
        (page // 16 + d // 64) % 3]  # fmt: skip
    with kernels_launched() as ran:
        check_kvcache(rng, dtype, num_splits=1, B=3, Nq=300, H=8, H_kv=2, d=d, lens=(0, 517, 990), n_new=7,
                      page=page, capacity=1024, rotary=True, alibi=page == 16, poison=True, **variant)  # fmt: skip
    assert ran[-1] == ("wgmma_forward" if tuple(target_arch()) == (9, 0, "a") else "tc_forward"), ran


@pytest.mark.gpu
@pytest.mark.parametrize("splits,on,d", [(2, "1", 128), (3, "1", 128), (4, "1", 128), (5, "1", 128), (4, "0", 128),
                                         (4, "1", 256)])  # fmt: skip
def test_decode_merges_gpu(monkeypatch, rng, splits, on, d):
    """The decode step's two in-kernel merges on the GPU: the splits of a row tile as one
    thread-block cluster (2, 3 and 4 splits: ``merge_in_cluster``), the last split's
    global merge past 4 splits or with ``NUMBA_FLASH_CLUSTER_MERGE=0``
    (``merge_if_last``).  The GQA swap, pages of 64, ragged lengths (the short
    sequence's last splits see no key); each call twice, the same bits.  At d = 256 the
    merge kernel runs (``merge.merges_in_cluster``)."""
    monkeypatch.setenv("NUMBA_FLASH_CLUSTER_MERGE", on)
    clusters = _clusters_seen(monkeypatch)
    shape = dict(B=3, Nq=1, H=32, H_kv=8, d=d, lens=(5, 700, 1500), n_new=1, page=64, capacity=1600)
    outs = []
    for _ in range(2):  # the same inputs twice: rng restarted at its seed
        rng._gen = np.random.default_rng(rng.seed_value)
        outs.append(check_kvcache(rng, np.float16, num_splits=splits, **shape))
    assert np.array_equal(outs[0], outs[1], equal_nan=True)
    assert set(clusters) == {splits if on == "1" and splits <= 4 and d <= 128 else 0}, clusters


@pytest.mark.gpu
def test_deterministic_gpu(rng):
    """The same call twice (split-KV, no append) gives the same bits."""
    xp = _xp()
    q, k_cache, v_cache, _, kw = _case(rng, np.float16, B=4, Nq=1, H=32, H_kv=8, d=128, lens=(4000, 100, 4096, 2048),
                                       page=64, capacity=4096)  # fmt: skip
    args = [xp.asarray(x) for x in (q, k_cache, v_cache)]
    kw = {n: (xp.asarray(x) if n == "block_table" else x) for n, x in kw.items()}
    a = host(numba_flash.flash_attention_with_kvcache(*args, num_splits=0, **kw))
    b = host(numba_flash.flash_attention_with_kvcache(*args, num_splits=0, **kw))
    assert np.array_equal(a, b)

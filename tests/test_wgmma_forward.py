"""The Hopper forward (``kernels.wgmma_forward``, issue #13): on by default on sm_90a
(``plan.wgmma_switch``), off in the simulator unless ``NUMBA_FLASH_WGMMA=1`` (as here).

In the simulator it runs on the wgmma twins (``_ptx_sim``) against the float64
reference, to FlashAttention-2's tolerance (2× a standard attention computed in the
same dtype), with the variants the shared steps bring (causal, GQA, window, softcap,
ALiBi, dropout bit for bit, varlen).  Without a GPU it compiles for sm_90a to wgmma
with nothing in local memory.  On a GPU (``-m gpu``) the same checks at larger shapes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import FWD_TOL, device, device_kw, host, kernels_launched, lse_error

import numba_flash
from numba_flash import plan as P
from numba_flash import reference as R
from numba_flash.variant import Variant

FLOOR = 1e-5
SM90A = (9, 0, "a")  # numba-cuda's target on an H100/H200 (``_numba_cuda.target_arch``)
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.fixture
def wgmma_on(monkeypatch):
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")


def _slopes(rng, H):
    return (0.01 + 0.1 * np.abs(rng.standard_normal(H))).astype(np.float32)


def check_forward(rng, dtype, d, causal, B=1, H=2, H_kv=2, Nq=70, Nk=90, lse_tol=FWD_TOL, **kw):
    """O to FlashAttention-2's tolerance; the LSE, which carries the scores' fp32 rounding only
    (the inputs are exact in fp32), to fp32's (``lse_error``: session 30's GPU run caught a Q
    rounded once more, which the old ``allclose(rtol=1e-3, atol=1e-3)`` let pass here)."""
    dt = DTYPES[dtype]
    q = rng.standard_normal((B, Nq, H, d)).astype(dt)
    k = rng.standard_normal((B, Nk, H_kv, d)).astype(dt)
    v = rng.standard_normal((B, Nk, H_kv, d)).astype(dt)
    p = P.Problem("forward", dtype, d, causal, batch=B, heads=H, seqlen_q=Nq, seqlen_k=Nk, heads_k=H_kv,
                  arch=SM90A)  # fmt: skip
    assert [k_.name for k_ in P.plan(p).launches] == ["wgmma_forward"]
    dev = device_kw(kw)
    with kernels_launched() as ran:  # the call's own plan (with its variants), not the one above
        out, lse = numba_flash.flash_attention(device(q), device(k), device(v), causal=causal, return_lse=True, **dev)
    assert ran == ["wgmma_forward"], ran
    ref, ref_lse = R.attention(q, k, v, causal=causal, **kw)
    tol = 2 * R.rel_error(R.attention_lowp(q, k, v, dtype=dt, causal=causal, **kw)[0], ref) + FLOOR
    err = R.rel_error(host(out).astype(np.float64), ref)
    assert err <= tol, f"{dtype} d={d} causal={causal} {kw}: O rel error {err:.3g} > {tol:.3g}"
    lse_err = lse_error(host(lse), ref_lse)
    assert lse_err <= lse_tol, f"{dtype} d={d} causal={causal} {kw}: LSE error {lse_err:.3g} > {lse_tol:.3g}"
    return host(out)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal,Nq,Nk", [
    ("float16", 64, False, 200, 90),  # two query blocks of 192 (three consumers), the second partial; a partial key tile
    ("bfloat16", 64, True, 150, 150),  # rows 0–63 see none of the second key tile; rows 150–191 past Nq
    ("float16", 128, True, 17, 100),  # Nq < Nk: bottom-right causal
    # d = 96 on d = 128's tiles (``hopper.tile_dim``): TMA zero-fills columns 96–127, 12 of 16 chunks stored
    ("bfloat16", 96, False, 70, 33),
    ("float16", 40, True, 50, 90),  # d = 40 on d = 64's tiles: a box wider than the arrays' rows
])  # fmt: skip
def test_wgmma_forward_matches_the_reference(rng, dtype, d, causal, Nq, Nk):
    check_forward(rng, dtype, d, causal, Nq=Nq, Nk=Nk)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal,Nq,Nk", [
    # d = 256: 64-key tiles, O staged in Q's rows, Q loaded after K_0 and V_0 (``o_in_q``); 2 query
    # tiles × 2 heads on 2 persistent blocks: each hands its Q over once
    ("bfloat16", 256, True, 150, 100),
    ("float16", 200, False, 130, 70),  # d = 200 on d = 256's tiles (a partial key tile, rows past Nq)
    ("float16", 160, True, 20, 140),  # d = 160 on d = 192's (staging rows of their own), Nq < Nk
])  # fmt: skip
def test_wgmma_forward_past_d_128(monkeypatch, rng, dtype, d, causal, Nq, Nk):
    """The head dims past 128 (``wgmma_forward.key_tile``: 64 keys a tile), with every
    output row poisoned, against the reference; two persistent blocks (past d = 128 the
    default is a block a tile), so that each hands its Q (at d = 256: O's staging rows) on."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "2")
    check_forward(rng, dtype, d, causal, Nq=Nq, Nk=Nk)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("d,causal,lens_q,lens_k", [(64, True, [5, 0, 200, 1, 70], [7, 4, 150, 1, 90]),
                                                    (256, False, [70, 3, 20], [40, 70, 129])])  # fmt: skip
def test_wgmma_forward_dynamic_scheduler(monkeypatch, rng, d, causal, lens_q, lens_k):
    """Persistent blocks taking their tiles from the counter (``dynamic_tiles``): two
    blocks over a varlen batch's tiles (empty sequences, tiles past a sequence the
    producer skips, at d = 256 O staged in Q's rows), against the reference, twice (each
    call its fresh counter)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SCHEDULER", "dynamic")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "2")
    p = P.Problem("forward", "float16", d, causal, batch=len(lens_q), heads=2, seqlen_q=max(lens_q),
                  seqlen_k=max(lens_k), heads_k=1, arch=SM90A, features=Variant(varlen=True, causal=causal, gqa=True),
                  rows_q=sum(lens_q))  # fmt: skip
    (launch,) = P.plan(p).launches
    assert launch.grid == (2, 1, 1) and "sched" in [a.role for a in launch.args]
    for _ in range(2):
        check_varlen_forward(rng, "float16", d, causal, lens_q, lens_k)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_forward_trace(monkeypatch, rng):
    """``NUMBA_FLASH_WGMMA_TRACE`` (``wgmma_forward.trace_tiles``): two persistent blocks over
    four tiles (two heads × 200 causal rows in 128-row tiles) leave one record a tile in the
    ``sched`` buffer after the counter: each tile once, its key tiles walked (1 for rows
    0–127, 2 for rows 128–199), the consumer's eight clock readings and the producer's three
    in order; the output still matches the reference."""
    from numba_flash import api
    from numba_flash.kernels import wgmma_forward as W

    tiles = 3  # records a block (the counter deals the four tiles: a block may run one, two or three)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SCHEDULER", "dynamic")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "2")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_TRACE", str(tiles))
    made = []

    def traced(walk=None):
        made.append(np.zeros(2 + 2 * tiles * W.TRACE_WORDS, np.int32))
        return made[-1]

    monkeypatch.setitem(api.SCHEDULER_BUFFERS, "sched", traced)
    check_forward(rng, "float16", 64, True, Nq=200, Nk=200)
    (buf,) = made
    rec = buf[2:].reshape(2, tiles, W.TRACE_WORDS).view(np.uint32).astype(np.int64)
    written = rec[..., 7] != 0
    assert written.sum() == 4, rec
    r = rec[written]
    assert sorted(r[:, W.T_STEPS + 1].tolist()) == [0, 1, 2, 3]
    assert sorted(r[:, W.T_STEPS].tolist()) == [1, 1, 2, 2]
    for words in (list(range(8)), [W.T_PRODUCER + i for i in range(3)], [W.T_GLOBAL, W.T_GLOBAL + 1]):
        steps = (np.diff(r[:, words], axis=1) % (1 << 32))
        assert (steps < (1 << 31)).all(), r[:, words]  # each reading at or after the one before (mod 2**32)
    # the other records: empty, or a block's end (the loop's top and the slot read: words 0, 1, the timer's)
    end = np.delete(rec[~written], [0, 1, W.T_GLOBAL], axis=1)
    assert (end == 0).all(), rec[~written]


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_forward_variants(rng):
    """GQA + window + softcap + ALiBi through the shared score and mask steps."""
    check_forward(rng, "float16", 64, True, H=2, H_kv=1, Nq=40, Nk=75, window_size=(30, -1), softcap=5.0,
                  alibi_slopes=_slopes(rng, 2))  # fmt: skip


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("scale", [0.07, -0.09, 0.0])
def test_wgmma_forward_raw_scores_and_signed_scales(rng, scale):
    """Raw scores (``softmax.raw_scores``: the scale in the exponent's factor) for a
    positive scale; a negative or zero scale keeps scaled scores (the raw max is not the
    scaled one), and both match the reference."""
    check_forward(rng, "float16", 64, True, Nq=70, Nk=90, softmax_scale=scale)


def check_hold(monkeypatch, rng, dtype, d, causal, B, H, H_kv, Nq, Nk, holds=("0", "1", "2", "3"), **kw):
    """``NUMBA_FLASH_WGMMA_HOLD=1`` and ``=2`` (``wgmma_forward.hold_exponentials``) move
    where ptxas waits for P·V, not what is computed: O and the LSE bit for bit those
    without, on the same inputs (``kw`` the variants).  ``=3`` rescales acc before adding
    P·V instead of after (other roundings): its LSE bit for bit, its O, as each setting's,
    to FlashAttention-2's tolerance.  ``holds``: the settings run, "0" first."""
    dt = DTYPES[dtype]
    q = rng.standard_normal((B, Nq, H, d)).astype(dt)
    k = rng.standard_normal((B, Nk, H_kv, d)).astype(dt)
    v = rng.standard_normal((B, Nk, H_kv, d)).astype(dt)
    got = {}
    for hold in holds:
        monkeypatch.setenv("NUMBA_FLASH_WGMMA_HOLD", hold)
        with kernels_launched() as ran:
            out, lse = numba_flash.flash_attention(device(q), device(k), device(v), causal=causal, return_lse=True,
                                                   **device_kw(kw))  # fmt: skip
        assert ran == ["wgmma_forward"], ran
        got[hold] = host(out), host(lse)
    for hold in holds[1:]:
        assert np.array_equal(got["0"][1], got[hold][1], equal_nan=True), hold
        if hold != "3":
            assert np.array_equal(got["0"][0], got[hold][0], equal_nan=True), hold
    ref, _ = R.attention(q, k, v, causal=causal, **kw)
    tol = 2 * R.rel_error(R.attention_lowp(q, k, v, dtype=dt, causal=causal, **kw)[0], ref) + FLOOR
    for hold in holds:
        err = R.rel_error(got[hold][0].astype(np.float64), ref)
        assert err <= tol, f"{dtype} d={d} causal={causal} hold {hold} {kw}: O rel error {err:.3g} > {tol:.3g}"


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_forward_hold_settings(monkeypatch, rng):
    """``check_hold`` with softcap and dropout over three key tiles (the key loop's steps;
    two consumers: from 2 on, the keep words made before the wait); not setting 1, which 2
    contains (the GPU test runs it)."""
    check_hold(monkeypatch, rng, "float16", 64, True, 1, 1, 1, 40, 300, ("0", "2", "3"), softcap=5.0, dropout_p=0.2,
               seed=int(rng.integers(0, 2**63)))  # fmt: skip


def test_alibi_goes_on_the_tensor_cores_only_where_it_can(monkeypatch):
    """``alibi_on_products``: causal ALiBi without softcap, a positive scale, raw scores
    and two consumers; its switch; the plan's kernel takes the key ramp's 16 KiB."""
    from numba_flash.kernels import wgmma_forward as W

    monkeypatch.delenv("NUMBA_FLASH_ALIBI_PRODUCTS", raising=False)
    monkeypatch.delenv("NUMBA_FLASH_RAW_SCORES", raising=False)
    t128, t64 = W.tiles(128, True), W.tiles(64, False)  # two consumers, three
    on = Variant(causal=True, alibi=True)
    assert W.alibi_on_products(t128, on)
    for off in (Variant(alibi=True), Variant(causal=True, alibi=True, softcap=True),
                Variant(causal=True, alibi=True, nonpositive_scale=True), Variant(causal=True)):
        assert not W.alibi_on_products(t128, off), off
    assert t64.block_m == 192 and not W.alibi_on_products(t64, on)
    p = P.Problem("forward", "float16", 128, True, seqlen_q=300, seqlen_k=300, arch=SM90A, features=on)
    (launch,) = P.plan(p).launches
    assert launch.smem == W.smem_bytes(launch.tiles) + launch.tiles.block_n * 128  # the key ramp: an atom of a key tile
    for env in ("NUMBA_FLASH_ALIBI_PRODUCTS", "NUMBA_FLASH_RAW_SCORES"):
        monkeypatch.setenv(env, "0")
        assert not W.alibi_on_products(t128, on)
        monkeypatch.delenv(env)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,Nq,Nk,products,slope_range", [
    ("float16", 128, 150, 300, "1", (2.0, 2.5)),  # two blocks of 128 rows (the second partial), three key tiles
    ("bfloat16", 64, 40, 33, "1", (0.05, 1.0)),
    ("float16", 64, 70, 90, "0", (0.05, 1.0)),  # the column frame: two blocks of 64 rows (one consumer each past row 64)
])  # fmt: skip
def test_wgmma_forward_causal_alibi_column_frame(monkeypatch, rng, dtype, d, Nq, Nk, products, slope_range):
    """Causal ALiBi alone, two ways: on the tensor cores (``alibi_on_products``: the bias's
    column term one more k-slice of S, fp16 or bf16 thirds of slope / scale times the key
    ramp, its row term in the running max), and with ``NUMBA_FLASH_ALIBI_PRODUCTS=0`` as a
    column term fused with the scale (``score.column_frame``), each row's max moved back
    to true units in the epilogue (lse against the reference); slopes in ``slope_range`` so
    that the rows' terms (up to 8·slope apart in a lane, 299 at most) matter.  At d = 128
    slopes of 2 to 2.5 make the column term ~2000 raw units: added before Q·Kᵀ's k-slices
    (before session 31) it was rounded with each of them, and the LSE's error reached
    1.7e-5 here (4–5e-5 on an H100 at 1000 rows); added last and centred on the tile,
    5e-6 typically and 1.02e-5 at worst seen (a CI run, slopes 2.02 / 2.44): the bound is
    fp32's 1e-5 or, where larger, a float32 spacing at the column term's size (two
    roundings of half a spacing), 1.5e-5 at slopes near 2.4."""
    monkeypatch.setenv("NUMBA_FLASH_ALIBI_PRODUCTS", products)
    lo, hi = slope_range
    slopes = (lo + (hi - lo) * rng.random(2)).astype(np.float32)
    # the LSE carries two fp32 roundings at the column term's size (its add to S, the row
    # term's to the max): at most a spacing of float32 at slope·BLOCK_N/2 in natural units
    # (1.5e-5 at slopes near 2.4: the CI rehearsal of d7fcdc0 drew 1.02e-5; the order before
    # session 31 rounded it with each of 8 k-slices, 1.7e-5 here and 4-5e-5 on an H100)
    lse_tol = max(FWD_TOL, float(np.spacing(np.float32(slopes.max() * 64))))
    check_forward(rng, dtype, d, True, Nq=Nq, Nk=Nk, lse_tol=lse_tol, alibi_slopes=slopes)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("Nq,Nk", [(20, 64), (300, 128)])
def test_wgmma_forward_dropout_keeps_the_reference_mask(monkeypatch, rng, Nq, Nk):
    """Scale 0 (P = 1/Nk) and V the identity (d = Nk): O[i, j] = Z_ij / ((1 − p)·Nk).
    d = 64: three consumers; d = 128: two, one persistent block over three tiles."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "1")
    B, H, p, seed = 1, 2, 0.3, int(rng.integers(0, 2**63))
    q = rng.standard_normal((B, Nq, H, Nk)).astype(np.float16)
    k = rng.standard_normal((B, Nk, H, Nk)).astype(np.float16)
    v = np.ascontiguousarray(np.broadcast_to(np.eye(Nk, dtype=np.float16)[None, :, None, :], (B, Nk, H, Nk)))
    out = numba_flash.flash_attention(device(q), device(k), device(v), softmax_scale=0.0, dropout_p=p, seed=seed)
    o = host(out).astype(np.float64).transpose(0, 2, 1, 3)
    want = R.dropout_mask(seed, p, B, H, Nq, Nk)
    assert np.array_equal(o > 0, want), f"seed {seed}: {np.sum((o > 0) != want)} keep bits differ"
    # the kept values carry 1 / (1 − p) (applied to O in the epilogue), the dropped are exactly 0
    np.testing.assert_allclose(o[want], 1.0 / ((1 - p) * Nk), rtol=2e-3)
    assert np.all(o[~want] == 0)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,Nq,d", [("float16", 1000, 128), ("bfloat16", 1000, 64), ("float16", 700, 256)])
def test_wgmma_forward_dropout_mask_on_the_gpu(monkeypatch, rng, dtype, Nq, d):
    """The keep mask bit for bit over many tiles of five persistent blocks (d = 128:
    two consumers, 128-key tiles; d = 64: three, a block a tile; d = 256: 64-key tiles,
    a block a tile): scale 0 and V the identity (Nk = d), so O[i, j] = Z_ij / ((1 − p)·Nk)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "5")
    dt = DTYPES[dtype]
    B, H, p, seed = 2, 4, 0.25, int(rng.integers(0, 2**63))
    q = rng.standard_normal((B, Nq, H, d)).astype(dt)
    k = rng.standard_normal((B, d, H, d)).astype(dt)
    v = np.ascontiguousarray(np.broadcast_to(np.eye(d, dtype=dt)[None, :, None, :], (B, d, H, d)))
    with kernels_launched() as ran:
        out = numba_flash.flash_attention(device(q), device(k), device(v), softmax_scale=0.0, dropout_p=p, seed=seed)
    assert ran == ["wgmma_forward"], ran
    o = host(out).astype(np.float64).transpose(0, 2, 1, 3)
    want = R.dropout_mask(seed, p, B, H, Nq, d)
    assert np.array_equal(o > 0, want), f"seed {seed}: {np.sum((o > 0) != want)} keep bits differ"
    np.testing.assert_allclose(o[want], 1.0 / ((1 - p) * d), rtol=1e-2)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("bfloat16", 64, True), ("float16", 128, False)])
def test_wgmma_forward_dropout_across_ring_fills(monkeypatch, rng, dtype, d, causal):
    """Dropout through several key tiles and tiles of one persistent block (two of three
    key tiles each: positions 0–5 of the walk), two consumers, against the
    reference."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "1")
    seed = int(rng.integers(0, 2**63))
    check_forward(rng, dtype, d, causal, B=1, H=2, H_kv=1, Nq=70, Nk=300, dropout_p=0.2, seed=seed)


def check_varlen_forward(rng, dtype, d, causal, lens_q, lens_k, H=2, H_kv=1, **kw):
    """flash_attention_varlen on the wgmma forward against the reference, sequence by
    sequence; the last sequence's V is NaN, so that a tile reading past an earlier
    sequence into it (TMA zero-fills only past the array) would carry NaN there
    through P's masked columns times V (``hopper.past_rows``): NaN stays in the last
    sequence, as in a standard attention."""
    dt = DTYPES[dtype]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], H, d)).astype(dt)
    k = rng.standard_normal((cu_k[-1], H_kv, d)).astype(dt)
    v = rng.standard_normal((cu_k[-1], H_kv, d)).astype(dt)
    v[cu_k[-2]:] = np.nan
    mq, mk = max(lens_q), max(lens_k)
    p = P.Problem("forward", dtype, d, causal, batch=len(lens_q), heads=H, seqlen_q=mq, seqlen_k=mk, heads_k=H_kv,
                  arch=SM90A, features=Variant(varlen=True, causal=causal, gqa=H_kv < H), rows_q=int(cu_q[-1]))
    assert [k_.name for k_ in P.plan(p).launches] == ["wgmma_forward"]
    dev = device_kw(kw)
    with kernels_launched() as ran:
        out, lse = numba_flash.flash_attention_varlen(device(q), device(k), device(v), device(cu_q), device(cu_k), mq,
                                                      mk, causal=causal, return_lse=True, **dev)  # fmt: skip
    assert ran == ["wgmma_forward"], ran
    out, lse = host(out).astype(np.float64), host(lse)
    ref, ref_lse = R.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal, **kw)
    low = np.concatenate([R.attention_lowp(q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b + 1]],
                                           v[None, cu_k[b]:cu_k[b + 1]], dtype=dt, causal=causal, **kw)[0][0]
                          for b in range(len(lens_q) - 1)])  # fmt: skip
    clean = slice(0, cu_q[-2])  # every sequence but the NaN one
    tol = 2 * R.rel_error(low, ref[clean]) + FLOOR
    err = R.rel_error(out[clean], ref[clean])
    assert err <= tol, f"{dtype} d={d} causal={causal} {kw}: O rel error {err:.3g} > {tol:.3g}"
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN where a standard attention has none, or none where it has"
    assert np.isnan(ref[cu_q[-2]:]).any()  # the last sequence sees its NaN V
    lse_err = lse_error(lse, ref_lse)  # V's NaN leaves the LSE finite
    assert lse_err <= FWD_TOL, f"{dtype} d={d} causal={causal} {kw}: LSE error {lse_err:.3g}"


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_forward_varlen(rng):
    """Empty, length-1 and partial sequences, Nq ≠ Nk, GQA, causal; two persistent
    blocks over 10 tiles (the simulator's ``_sms``), four of them past their sequence."""
    check_varlen_forward(rng, "bfloat16", 128, True, [5, 0, 70, 1, 33], [7, 4, 90, 1, 20])


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_forward_varlen_alibi_on_the_tensor_cores(rng):
    """Causal ALiBi's bias on the tensor cores with each sequence's own diagonal
    (Nq ≠ Nk per sequence: the row term's distance ``fragments.lane_distance``)."""
    slopes = (0.05 + 0.95 * rng.random(2)).astype(np.float32)
    check_varlen_forward(rng, "float16", 64, True, [5, 0, 70, 1, 33], [7, 4, 90, 1, 20], alibi_slopes=slopes)


def test_the_switch(monkeypatch):
    """On by default on sm_90a and off in the simulator; ``NUMBA_FLASH_WGMMA`` 1 or 0
    overrides both; the cases the kernel does not take (and every other arch, sm_100a
    included: no wgmma there) run the mma.sync forward."""
    monkeypatch.delenv("NUMBA_FLASH_WGMMA", raising=False)
    p = P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A)
    sim = P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A, simulator=True)
    assert [k.name for k in P.plan(p).launches] == ["wgmma_forward"]
    assert [k.name for k in P.plan(sim).launches] == ["tc_forward"]
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "0")
    assert [k.name for k in P.plan(p).launches] == ["tc_forward"]
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    assert [k.name for k in P.plan(p).launches] == ["wgmma_forward"]
    assert [k.name for k in P.plan(sim).launches] == ["wgmma_forward"]
    monkeypatch.delenv("NUMBA_FLASH_WGMMA")
    for d in (8, 32, 56, 72, 96, 120, 136, 184, 200, 248):  # other multiples of 8: on the next tiles
        launches = P.plan(P.Problem("forward", "float16", d, False, seqlen_q=128, seqlen_k=128, arch=SM90A)).launches
        assert [k.name for k in launches] == ["wgmma_forward"] and launches[0].tiles.data_dim == d
        tile_d = next(t for t in (64, 128, 192, 256) if t > d)
        assert launches[0].tiles.head_dim == tile_d and launches[0].tiles.block_n == (128 if tile_d <= 128 else 64)
    for other in (P.Problem("forward", "float16", 100, False, seqlen_q=128, seqlen_k=128, arch=SM90A),  # not 8k
                  P.Problem("forward", "float16", 250, False, seqlen_q=128, seqlen_k=128, arch=SM90A),  # not 8k
                  P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=(8, 0)),
                  P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=(9, 0)),  # generic PTX
                  P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=(10, 0, "a")),
                  P.Problem("forward", "float32", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A),
                  P.Problem("forward", "float16", 64, False, seqlen_q=8, seqlen_k=128, arch=SM90A),  # decode tiles
                  P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A,
                            features=Variant(paged=True), page_rows=20),  # pages of 20 rows: boxes of 4
                  P.Problem("backward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A)):
        assert "wgmma_forward" not in [k.name for k in P.plan(other).launches], other
    # a KV cache's splits: on the Hopper forward by default since session 29, on the mma.sync forward with
    # NUMBA_FLASH_WGMMA_SPLIT=0
    split = P.Problem("forward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A,
                      features=Variant(paged=True, split=True))
    assert [k.name for k in P.plan(split).launches] == ["wgmma_forward"]
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_SPLIT", "0")
    assert "wgmma_forward" not in [k.name for k in P.plan(split).launches]
    monkeypatch.delenv("NUMBA_FLASH_WGMMA_SPLIT")
    for d, page_rows, box in ((64, 0, 128), (64, 16, 16), (64, 48, 16), (64, 8, 8), (64, 256, 128), (64, 1000, 8),
                              (256, 256, 64), (256, 48, 16), (256, 0, 64)):  # a page's rows: key boxes (d = 256: 64)
        (k,) = P.plan(P.Problem("forward", "float16", d, False, seqlen_q=128, seqlen_k=128, arch=SM90A,
                                features=Variant(paged=True, varlen=True), page_rows=page_rows)).launches
        assert k.name == "wgmma_forward" and k.boxes == (k.tiles.block_m, box), (d, page_rows, k.boxes)
    # FlexAttention's mods run there (session 21); with a block mask on 128-row tiles, the mask's 128-blocks,
    # where d = 64 otherwise takes 192 rows
    from numba_flash.variant import Mods

    for block_sparse, rows in ((True, 128), (False, 192)):
        (k,) = P.plan(P.Problem("forward", "float16", 64, False, seqlen_q=4096, seqlen_k=4096, arch=SM90A,
                                features=Variant(mods=Mods(None, None, None, block_sparse=block_sparse)))).launches
        assert k.name == "wgmma_forward" and k.tiles.block_m == rows, (block_sparse, k.tiles)
    # a sliding window at d = 64 on 128-row tiles too (``consumers``' ``window``; session 29: 1.08–1.25× with three)
    for features, rows in ((Variant(causal=True, window_left=True), 128), (Variant(window_right=True), 128),
                           (Variant(causal=True, window_left=True, softcap=True), 128), (Variant(causal=True), 192)):
        (k,) = P.plan(P.Problem("forward", "float16", 64, features.causal, seqlen_q=4096, seqlen_k=4096, arch=SM90A,
                                features=features)).launches
        assert k.name == "wgmma_forward" and k.tiles.block_m == rows, (features, k.tiles)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_CONSUMERS", "3")  # the A/B's override still rules
    (k,) = P.plan(P.Problem("forward", "float16", 64, True, seqlen_q=4096, seqlen_k=4096, arch=SM90A,
                            features=Variant(causal=True, window_left=True))).launches
    assert k.tiles.block_m == 192, k.tiles


def test_info_names_the_wgmma_forward_on_sm_90a():
    """``numba-flash info``'s table (``plan.table``) on an H200's target: the fp16/bf16
    forward and backward up to 256 are the wgmma ones (d = 64, 128, 192 (forward), 256
    and the multiples of 8 between, on the next one's tiles); other head dims,
    unaligned rows and sm_80 keep the mma.sync kernels."""
    rows = {(r["dtype"], r["head_dims"]): r for r in P.table(SM90A)}
    bwd_128 = "tensor-core: tc_bwd_stats → wgmma_bwd_dkdv → wgmma_bwd_dq"
    bwd_256 = "tensor-core: tc_bwd_stats → wgmma_bwd_dv → wgmma_bwd_dk → wgmma_bwd_dq"
    for half in ("float16", "bfloat16"):
        for dims, fwd, bwd in (("64, 128 (16-byte aligned rows)", "wgmma_forward", bwd_128),
                               ("8 to 120, multiples of 8 (16-byte aligned rows)", "wgmma_forward", bwd_128),
                               ("136 to 256, multiples of 8 (16-byte aligned rows)", "wgmma_forward", bwd_256)):
            assert rows[half, dims]["forward"] == "tensor-core: " + fwd and rows[half, dims]["backward"] == bwd
        other = rows[half, "any other from 1 to 256, or unaligned rows"]
        assert other["forward"] == "tensor-core: tc_forward" and "wgmma" not in other["backward"]
    assert all("wgmma" not in r["forward"] + r["backward"] for r in P.table((8, 0)) + P.table(SM90A, simulator=True))


def test_wgmma_forward_hold_compiles_for_sm_90a(monkeypatch):
    """``hold_exponentials``'s kernel for sm_90a at setting 3, which holds setting 2's work too
    (d = 128 causal, dropout, persistent; off by default: slower when timed, session 49):
    the key loop's never-taken fence (``hopper.hold_before_wait``, the block
    boundary) once, dropout's keep words held before it (``ptx.hold_u32x4``,
    one a Philox call: four a 128-key tile), with 3 a second ``wgmma.fence`` a step (after acc's
    rescale, before the P·V's issue); nothing in local memory, and no spills where ptxas
    assembles the whole program (with softcap too and 2, ptxas 13.0 spilled 52 bytes of a
    tile's state, outside the key loop: read in its SASS, session 48)."""
    from numba_flash.inspection import inspect_kernels

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_HOLD", "3")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "3")
    (r,) = inspect_kernels("forward", "float16", 128, True, arch="sm_90a", seqlen_q=4096,
                           variants={"dropout": True})  # fmt: skip
    assert r.ptx.count("membar.cta;") == 1 and r.ptx.count("// hold ") == 4
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_HOLD", "0")
    (r0,) = inspect_kernels("forward", "float16", 128, True, arch="sm_90a", seqlen_q=4096, variants={"dropout": True})
    fence = "wgmma.fence.sync.aligned;"
    assert "membar.cta;" not in r0.ptx and "// hold " not in r0.ptx
    assert r.ptx.count(fence) == r0.ptx.count(fence) + 1
    assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx
    if r.registers is not None and not r.assembler.startswith("nvJitLink"):
        assert r.spill_stores == 0


@pytest.mark.parametrize("d,causal,seqlen,regs,threads,persistent", [(128, True, 4096, (24, 240), 384, ""),
                                                                     (128, False, 4096, (24, 240), 384, "3"),
                                                                     (64, True, 4096, (32, 160), 512, ""),
                                                                     (64, True, 1024, (24, 240), 384, "3"),
                                                                     (256, True, 4096, (24, 240), 384, "3"),
                                                                     (192, False, 4096, (24, 240), 384, "")])  # fmt: skip
def test_wgmma_forward_compiles_for_sm_90a(monkeypatch, d, causal, seqlen, regs, threads, persistent):
    """``inspect --arch sm_90a`` of the plan: TMA copies, register reallocation (two
    consumer warpgroups at d = 128 and for d = 64 causal at 1024 rows, three at d = 64
    otherwise: ``wgmma_forward.consumers``), wgmma for S and P·V (A from registers),
    nothing in local memory, and (with a whole-program ptxas) assembled without spills;
    with ``persistent`` ("3": three blocks for the inspected problem's 32 or 16 tiles)
    the persistent kernel the issue's shapes run (its tile loop and q_empty)."""
    from numba_flash.inspection import inspect_kernels

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", persistent)

    (r,) = inspect_kernels("forward", "float16", d, causal, arch="sm_90a", seqlen_q=seqlen)
    assert r.name == "wgmma_forward" and r.arch == "sm_90a"
    assert ".target sm_90a" in r.ptx
    # S (n = BLOCK_N keys, both operands from shared memory) and P·V (n = d, A from
    # registers, B MN-major): d/16 of S and BLOCK_N/16 of P·V, each twice (the peeled first
    # tile's S and the loop's; the loop's P·V and the last tile's)
    s_sites, bn = 2, (128 if d <= 128 else 64)
    s_count = r.ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.f16.f16 ")
    pv = f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.f16.f16 "
    assert (s_count, r.ptx.count(pv)) == ((s_sites * d // 16 + 2 * bn // 16,) * 2 if d == bn
                                          else (s_sites * d // 16, 2 * bn // 16))  # fmt: skip
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in r.ptx
    assert (f"setmaxnreg.dec.sync.aligned.u32 {regs[0]}" in r.ptx
            and f"setmaxnreg.inc.sync.aligned.u32 {regs[1]}" in r.ptx)  # fmt: skip
    assert f".maxntid {threads}" in r.ptx
    assert r.ptx.count("mbarrier.init.shared::cta.b64") == 3 + 4 * 2  # q_full, q_empty, v_land, the ring's four a stage
    assert ("%nctaid.x" in r.ptx) == bool(persistent)  # the tile loop's stride, gridDim.x: compiled away otherwise
    # persistent blocks take their tiles from the counter (``dynamic_tiles``)
    assert ("atom.global.add" in r.ptx) == bool(persistent)
    assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx
    # the epilogue through shared memory: whole rows of O in 16-byte stores, d/64 · 4 a warp
    assert r.ptx.count("st.global.v4.b32") == d // 16
    if r.registers is not None and not r.assembler.startswith("nvJitLink"):
        # ptxas assembles the whole program, as the driver's JIT does on the GPU
        # (``_numba_cuda.whole_program_dispatcher``); nvJitLink assembles a relocatable
        # unit, which ignores setmaxnreg and so caps the consumers at 168 registers.
        # Past d = 128 (O alone is d/2 registers a thread) ptxas spills a tile's own state
        # (its coordinates, out's strides), reloaded a tile, outside the key loop (the SASS
        # read in session 20: no LDL/STL between the loop's first HGMMA and its branch back)
        assert r.spill_stores <= (0 if d <= 128 else 128) and r.registers <= 255


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("d", [32, 64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_wgmma_forward_on_the_gpu(rng, dtype, d, causal):
    check_forward(rng, dtype, d, causal, B=2, H=4, H_kv=2, Nq=1000, Nk=517)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 256, False), ("bfloat16", 256, True), ("float16", 192, True),
                                            ("bfloat16", 200, False)])  # fmt: skip
def test_wgmma_forward_past_d_128_on_the_gpu(rng, dtype, d, causal):
    """d = 192 and 256 on their 64-key tiles (d = 200 on 256's), against the reference."""
    check_forward(rng, dtype, d, causal, B=2, H=4, H_kv=2, Nq=1000, Nk=517)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 64, True), ("bfloat16", 128, False), ("float16", 256, True)])
def test_wgmma_forward_persistent_blocks_run_several_tiles(monkeypatch, rng, dtype, d, causal):
    """Five blocks for 48 or 64 tiles (``NUMBA_FLASH_WGMMA_PERSISTENT=5``): every block
    hands its Q buffer and its K/V ring over from tile to tile (on an H200 the issue's
    shapes have more tiles than SMs; these small ones would not; at d = 256 the hand-over
    is O's staging rows in Q's, then Q, ``wgmma_forward.o_in_q``)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_PERSISTENT", "5")
    check_forward(rng, dtype, d, causal, B=2, H=4, H_kv=2, Nq=1000, Nk=517)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d", [("float16", 128), ("bfloat16", 64), ("bfloat16", 128)])
def test_wgmma_forward_alibi_on_the_tensor_cores_on_the_gpu(rng, dtype, d):
    """Causal ALiBi with its bias on the tensor cores (``alibi_on_products``), slopes up to 1
    over 1000 rows (row terms up to 1000·slope / scale in raw units), alone and with GQA +
    window + dropout, and per-(batch, head) slopes."""
    slopes = (0.01 + np.abs(rng.standard_normal(8))).astype(np.float32)
    check_forward(rng, dtype, d, True, B=2, H=8, H_kv=2, Nq=1000, Nk=1300, alibi_slopes=slopes)
    seed = int(rng.integers(0, 2**63))
    slopes2 = (0.01 + 0.5 * rng.random((2, 8))).astype(np.float32)
    check_forward(rng, dtype, d, True, B=2, H=8, H_kv=4, Nq=517, Nk=700, alibi_slopes=slopes2, window_size=(300, 0),
                  dropout_p=0.15, seed=seed)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 128, True), ("bfloat16", 64, False), ("float16", 256, True)])
def test_wgmma_forward_hold_settings_on_the_gpu(monkeypatch, rng, dtype, d, causal):
    """``check_hold`` where ptxas schedules the real kernel: plain, then softcap + ALiBi +
    dropout + GQA, over many key tiles."""
    check_hold(monkeypatch, rng, dtype, d, causal, 2, 8, 8, 777, 1000)
    check_hold(monkeypatch, rng, dtype, d, causal, 1, 8, 2, 517, 1300, softcap=5.0, alibi_slopes=_slopes(rng, 8),
               dropout_p=0.15, seed=int(rng.integers(0, 2**63)))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d", [("float16", 64), ("bfloat16", 128), ("float16", 96), ("bfloat16", 256)])
def test_wgmma_forward_variants_on_the_gpu(rng, dtype, d):
    """GQA + window + softcap + ALiBi, then the same with dropout, at sizes that fill
    both consumers and several ring fills, against the float64 reference."""
    kw = dict(window_size=(300, 40), softcap=5.0, alibi_slopes=_slopes(rng, 8))
    check_forward(rng, dtype, d, True, B=2, H=8, H_kv=2, Nq=777, Nk=1000, **kw)
    seed = int(rng.integers(0, 2**63))
    check_forward(rng, dtype, d, False, B=1, H=8, H_kv=4, Nq=517, Nk=700, dropout_p=0.15, seed=seed, **kw)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 64, True), ("bfloat16", 128, False), ("float16", 128, True),
                                            ("bfloat16", 256, True)])  # fmt: skip
def test_wgmma_forward_varlen_on_the_gpu(rng, dtype, d, causal):
    """Sequences from 0 to 1000 rows (several query and key tiles, partial ones), GQA,
    window + softcap + ALiBi on one of them; the last sequence's V NaN."""
    lens_q, lens_k = [300, 0, 1, 1000, 129, 77], [517, 3, 1, 999, 128, 200]
    check_varlen_forward(rng, dtype, d, causal, lens_q, lens_k, H=8, H_kv=2)
    check_varlen_forward(rng, dtype, d, causal, lens_q, lens_k, H=8, H_kv=2, window_size=(200, 30), softcap=5.0,
                         alibi_slopes=_slopes(rng, 8))  # fmt: skip


def test_driver_ptx_lowers_only_a_newer_version():
    """The whole-program path hands the driver PTX of an ISA it JIT-compiles: NVVM 13.5's
    9.5 becomes 9.0 for a CUDA 13.0 driver; 9.0 PTX, or another driver major, stay as they are."""
    from numba_flash._numba_cuda import driver_ptx

    ptx = "//\n.version 9.5\n.target sm_90a\n.address_size 64\n"
    assert driver_ptx(ptx, (13, 0)) == ptx.replace(".version 9.5", ".version 9.0")
    assert driver_ptx(ptx, (13, 6)) == ptx
    assert driver_ptx(ptx.replace("9.5", "8.8"), (13, 0)) == ptx.replace("9.5", "8.8")
    assert driver_ptx(ptx, (12, 8)) == ptx


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("fam,name", [("fp16", "all"), ("bf16", "document"), ("fp16", "sparse")])
def test_wgmma_forward_flex(rng, fam, name):
    """FlexAttention's mods on the Hopper forward and backward:
    a relative-bias score_mod with GQA, causal, a window, softcap and dropout on top
    (``all``), a mask_mod's block mask with PARTIAL tiles (``document``), the paper's
    fixed block-sparse pattern in 16-blocks (``sparse``), against the float64
    reference (``test_flex_kernels.check_flex``), over several query and key tiles."""
    from test_flex_kernels import check_flex

    with kernels_launched() as ran:
        check_flex(rng, fam, name, Nq=130, Nk=140)
    assert ran[0] == "wgmma_forward" and "wgmma_bwd_dq" in ran, ran

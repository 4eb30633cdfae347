"""The Hopper backward (``kernels.wgmma_backward``, issue #13): on by default on sm_90a
(``plan.wgmma_backward``), off in the simulator unless ``NUMBA_FLASH_WGMMA=1`` (as here).

In the simulator it runs on the wgmma and TMA twins (``_ptx_sim``) against the float64
reference, to FlashAttention-2's tolerance (3× the error of a standard attention
backward computed in the same dtype).  Without a GPU its kernels compile for sm_90a to
wgmma and TMA, with nothing in local memory and no spills.  On a GPU (``-m gpu``) the
same checks at larger shapes, the variants, and determinism.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import device, device_kw, grad_errors, host, kernels_launched

import numba_flash
from numba_flash import _arrays
from numba_flash import api as A
from numba_flash import plan as P
from numba_flash import reference as R
from numba_flash.variant import Mods, Variant

SM90A = (9, 0, "a")  # numba-cuda's target on an H100/H200 (``_numba_cuda.target_arch``)
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
KERNELS = ["tc_bwd_stats", "wgmma_bwd_dkdv", "wgmma_bwd_dq"]  # dQ its own pass (no atomics)
#: past d = 128 (on d = 256's tiles) dV and dK are two kernels (``wgmma_backward.RINGS``: a thread cannot hold both)
KERNELS_256 = ["tc_bwd_stats", "wgmma_bwd_dv", "wgmma_bwd_dk", "wgmma_bwd_dq"]


def kernels(d):
    return KERNELS_256 if d > 128 else KERNELS


@pytest.fixture
def wgmma_on(monkeypatch):
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")


def _slopes(rng, H):
    return (0.01 + 0.1 * np.abs(rng.standard_normal(H))).astype(np.float32)


def run_backward(dout, q, k, v, out, lse, causal, kw):
    """The grads of ``flash_attention_backward`` on the device (``kw`` its keywords:
    the variants, the layout), and the kernels it ran."""
    dev = device_kw(kw)
    with kernels_launched() as ran:
        grads = numba_flash.flash_attention_backward(*(device(x) for x in (dout, q, k, v, out, lse)), causal=causal,
                                                     **dev)  # fmt: skip
    return [host(g) for g in grads], ran


def check_backward(rng, dtype, d, causal, B=1, H=2, H_kv=2, Nq=70, Nk=90, layout="bshd", **kw):
    dt = DTYPES[dtype]
    shape = (lambda n, h: (B, n, h, d)) if layout == "bshd" else (lambda n, h: (B, h, n, d))
    q = rng.standard_normal(shape(Nq, H)).astype(dt)
    k = rng.standard_normal(shape(Nk, H_kv)).astype(dt)
    v = rng.standard_normal(shape(Nk, H_kv)).astype(dt)
    dout = rng.standard_normal(shape(Nq, H)).astype(dt)
    kw = dict(kw, layout=layout)
    p = P.Problem("backward", dtype, d, causal, batch=B, heads=H, seqlen_q=Nq, seqlen_k=Nk, heads_k=H_kv,
                  arch=SM90A)  # fmt: skip
    assert [k_.name for k_ in P.plan(p).launches] == kernels(d)
    ref_out, ref_lse = R.attention(q, k, v, causal=causal, **kw)
    out, lse = ref_out.astype(dt), ref_lse.astype(np.float32)
    grads, ran = run_backward(dout, q, k, v, out, lse, causal, kw)
    assert ran == kernels(d), ran
    ref = R.attention_backward(dout, q, k, v, out, lse, causal=causal, **kw)
    low = R.attention_backward_lowp(dout, q, k, v, out, lse, dtype=dt, causal=causal, **kw)
    for name, got, err, base in zip(("dq", "dk", "dv"), grads, grad_errors(grads, ref), grad_errors(low, ref)):
        assert got.dtype == dt and got.shape == (q if name == "dq" else k).shape
        # FlashAttention-2's criterion, with a floor of an fp32 rounding for a gradient that is ~0
        assert err <= 3 * base + 1e-5, f"{dtype} d={d} causal={causal} {kw}: {name} {err:.3g} vs same-dtype {base:.3g}"
    return (dout, q, k, v, out, lse), grads


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal,H_kv,Nq,Nk", [
    # GQA (two query heads a KV head): dK/dV walks 2 query steps of 128 per head, 4 in all, so its
    # ring's stages are refilled; dQ 3 key steps; the last key block and both last tiles partial
    ("float16", 64, False, 1, 200, 300),
    # Nq > Nk: bottom-right causal, rows 0–9 see no key; 64-row steps, 3 a block
    ("bfloat16", 128, True, 2, 150, 140),
    # d = 256: dV (64-row steps) and dK (32-row steps, 3 a block) apart, GQA's group summed in each; dQ's
    # 32-key steps (the last partial)
    ("float16", 256, True, 1, 70, 90),
    # d = 96 on d = 128's tiles: TMA zero-fills columns 96–127, the epilogue writes 96
    ("bfloat16", 96, False, 2, 40, 33),
    # d = 40 on d = 64's tiles: a box wider than the arrays' rows
    ("float16", 40, True, 2, 50, 70),
])  # fmt: skip
def test_wgmma_backward_matches_the_reference(rng, dtype, d, causal, H_kv, Nq, Nk):
    check_backward(rng, dtype, d, causal, H=2, H_kv=H_kv, Nq=Nq, Nk=Nk)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("pipe,dtype,d,causal,Nk,kw", [
    # three stages: the dQ kernel's 64-key steps, 5 of them (the ring wraps, the last partial); softcap: P and dS
    # in one pass an element after dP, the mask's partial tiles
    ("3", "bfloat16", 128, True, 300, {"softcap": 4.0}),
    # two stages: 128-key steps, 3 of them; P while dP runs
    ("1", "float16", 64, False, 300, {}),
])  # fmt: skip
def test_wgmma_backward_pipelined(rng, monkeypatch, pipe, dtype, d, causal, Nk, kw):
    """The pipelined step (``NUMBA_FLASH_WGMMA_BWD_PIPE``: each step's gradient products issued
    behind the next step's S and dP, P computed apart from dS) against the float64 reference,
    and bitwise the same gradients as the unpipelined step (the same operations in the same
    order); so with ``NUMBA_FLASH_WGMMA_BWD_HOLD=1`` (``wgmma_backward.hold``)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PIPE", pipe)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "0")
    inputs, piped = check_backward(rng, dtype, d, causal, H=2, H_kv=1, Nq=40, Nk=Nk, **kw)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "1")  # ``wgmma_backward.hold``: P and dS before the waits
    held, _ = run_backward(*inputs, causal, dict(kw, layout="bshd"))
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "0")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PIPE", "0")
    plain, _ = run_backward(*inputs, causal, dict(kw, layout="bshd"))
    for name, a, b, c in zip(("dq", "dk", "dv"), piped, plain, held):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), name
        assert np.array_equal(c.view(np.uint16), b.view(np.uint16)), name


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_backward_variants(rng):
    """Window + softcap + ALiBi, then dropout (the reference's keep mask), through the
    shared score, mask and dropout steps."""
    kw = dict(window_size=(60, 10), softcap=5.0, alibi_slopes=_slopes(rng, 2))
    check_backward(rng, "float16", 64, True, H=2, H_kv=1, Nq=150, Nk=200, **kw)
    seed = int(rng.integers(0, 2**63))
    check_backward(rng, "bfloat16", 128, False, H=2, H_kv=2, Nq=70, Nk=130, dropout_p=0.2, seed=seed, **kw)


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_backward_bhsd_layout(rng):
    """(B, H, N, d) inputs: the kernels see (B, N, H, d) views of them, and the
    preprocess's own (B, H, 2, rows) ``stats`` workspace stays as it is: transposed with
    the inputs, heads past the second indexed its axis of 2 (on the H200, every bhsd case
    of test_kernels had wrong dQ; here an IndexError)."""
    check_backward(rng, "float16", 64, True, B=2, H=4, H_kv=2, Nq=90, Nk=70, layout="bhsd")


def test_the_switch(monkeypatch):
    """On by default on sm_90a and off in the simulator; ``NUMBA_FLASH_WGMMA`` 1 or 0
    overrides both; what the kernels do not take runs ``tc_backward``."""
    monkeypatch.delenv("NUMBA_FLASH_WGMMA", raising=False)
    p = P.Problem("backward", "bfloat16", 128, True, seqlen_q=128, seqlen_k=128, arch=SM90A)
    sim = P.Problem("backward", "bfloat16", 128, True, seqlen_q=128, seqlen_k=128, arch=SM90A, simulator=True)
    assert [k.name for k in P.plan(p).launches] == KERNELS
    assert [k.name for k in P.plan(sim).launches] == ["tc_bwd_preprocess", "tc_bwd_dkdv", "tc_bwd_dq"]
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "0")
    assert "wgmma" not in str([k.name for k in P.plan(p).launches])
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    assert [k.name for k in P.plan(sim).launches] == KERNELS
    monkeypatch.delenv("NUMBA_FLASH_WGMMA")
    for d in (8, 32, 56, 72, 96, 120, 136, 200, 248):  # other multiples of 8: on the next tiles (``tile_dim``)
        p = P.Problem("backward", "float16", d, False, seqlen_q=128, seqlen_k=128, arch=SM90A)
        launches = P.plan(p).launches
        assert [k.name for k in launches] == kernels(d), d
        tile_d = 64 if d < 64 else 128 if d < 128 else 256
        assert all(k.tiles.data_dim == d and k.tiles.head_dim == tile_d for k in launches[1:])
    for other in (P.Problem("backward", "float16", 100, False, seqlen_q=128, seqlen_k=128, arch=SM90A),
                  P.Problem("backward", "float16", 12, False, seqlen_q=128, seqlen_k=128, arch=SM90A),
                  P.Problem("backward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=(8, 0)),
                  P.Problem("backward", "float32", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A),
                  P.Problem("backward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A, aligned=False)):
        assert "wgmma" not in str([k.name for k in P.plan(other).launches]), other
    # FlexAttention's mods run there too (since session 21: the visit lists read by every role)
    flex = P.Problem("backward", "float16", 64, False, seqlen_q=128, seqlen_k=128, arch=SM90A,
                     features=Variant(mods=Mods(None, None, None, block_sparse=True)))
    assert [k.name for k in P.plan(flex).launches] == kernels(64)


def test_the_ring_override_reaches_the_api_plan(monkeypatch):
    """``NUMBA_FLASH_WGMMA_BWD_RING`` (the benchmark's other step sizes) changes the plan
    the API runs, not only a fresh one: the API's plan cache keys on it."""
    p = P.Problem("backward", "float16", 128, False, seqlen_q=128, seqlen_k=128, arch=SM90A)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    monkeypatch.delenv("NUMBA_FLASH_WGMMA_BWD_RING", raising=False)
    assert [k.tiles.ring for k in A._plan(p).launches[1:]] == [64, 64]
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_RING", "64,128")
    assert [k.tiles.ring for k in A._plan(p).launches[1:]] == [64, 128]


def test_stats_are_padded_to_whole_tiles():
    """The preprocess's ``stats`` cover the query rows rounded up to 128, so every
    128-row (and 64-row) tile's bulk copy of lse and delta rows is whole; varlen's
    sequences start 16-byte aligned (the bulk copies' rule) and each one's rows rounded
    up to 128 end before the next one's start and within the array."""
    from numba_flash.kernels import wgmma_backward as W

    assert W.stats_shape(2, 3, 1) == (2, 3, 2, 128) and W.stats_shape(1, 1, 129) == (1, 1, 2, 256)
    assert W.stats_shape(1, 1, 256) == (1, 1, 2, 256)
    rng = np.random.default_rng()
    for _ in range(200):
        lens = rng.integers(0, 300, rng.integers(1, 20))
        cu = np.concatenate([[0], np.cumsum(lens)])
        rows = W.stats_shape(1, 1, int(cu[-1]), len(lens))[3]
        starts = [W.stats_row0.py_func(cu, s) for s in range(len(lens))]
        ends = [s0 + -(-n // 128) * 128 for s0, n in zip(starts, lens)]
        assert all(s0 % 4 == 0 for s0 in starts) and rows % 4 == 0
        assert all(e <= s1 for e, s1 in zip(ends, starts[1:])) and ends[-1] <= rows, (lens, starts, rows)


STATS_CASES = [("float16", 64, 64, ()), ("bfloat16", 60, 64, ()), ("float16", 5, 8, ()),
               ("float16", 200, 200, (0, 37, 1))]  # fmt: skip


@pytest.mark.parametrize("dtype,d,width,lens", STATS_CASES, ids=[f"{c[0]}-{c[1]}-{len(c[3])}" for c in STATS_CASES])
def test_stats_rows_match_numpy(rng, dtype, d, width, lens):
    """The preprocess (``tc_backward.tc_bwd_stats_kernel``) alone against NumPy: delta
    = Σ dO∘O over a row's d columns (rows of ``width`` columns, 16-byte aligned: the
    16-byte chunks, the columns past the last whole chunk, a row narrower than a chunk,
    25 chunks on 32 lanes) and lse·log2 e, +inf where lse is −inf, for every row of
    ``stats`` up to each sequence's 128-row end (+inf and 0 past its rows); ``lens``:
    varlen's sequences (an empty one among them), else one batch of 40 rows."""
    from numba_flash.kernels import tc_backward as T
    from numba_flash.kernels import wgmma_backward as W
    from numba_flash.kernels.softmax import LOG2E

    dt, H = DTYPES[dtype], 2
    n_rows = sum(lens) if lens else 40
    o_buf, do_buf = (rng.standard_normal((1, n_rows, H, width)).astype(dt) for _ in range(2))
    o, do = o_buf[..., :d], do_buf[..., :d]  # the kernel must not read the columns past d
    o_buf[..., d:], do_buf[..., d:] = np.nan, np.nan
    lse = rng.standard_normal((1, H, n_rows)).astype(np.float32)
    lse[0, 1, 3] = -np.inf  # a row that saw no key
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32) if lens else np.zeros(1, np.int32)
    shape = W.stats_shape(1, H, n_rows, len(lens)) if lens else W.stats_shape(1, H, n_rows)
    stats = np.full(shape, np.nan, np.float32)
    seqs = [(int(cu[s]), int(cu[s + 1] - cu[s]), int(W.stats_row0.py_func(cu, s))) for s in range(len(lens))] or [
        (0, n_rows, 0)]  # fmt: skip
    grid = (-(-max(n for _, n, _ in seqs) // 128), H, len(seqs))
    views = [device(x.view(np.uint16))[..., :d] for x in (o_buf, do_buf)]  # strided, as the caller's
    stats_dev = device(stats)
    T.tc_bwd_stats_kernel(d, dtype, bool(lens))[grid, 128](*(_arrays.kernel_arg(x) for x in views + [device(lse),
                                                                                               stats_dev, device(cu)]))
    got = host(stats_dev)
    prod = o.astype(np.float64) * do.astype(np.float64)
    want_delta, scale = prod.sum(-1), np.abs(prod).sum(-1)  # (1, rows, H)
    for q0, n, s0 in seqs:
        end = s0 + -(-n // 128) * 128
        for h in range(H):
            l2, dl = got[0, h, 0, s0:end], got[0, h, 1, s0:end]
            lse_h = lse[0, h, q0:q0 + n]
            np.testing.assert_array_equal(l2[:n], np.where(lse_h == -np.inf, np.inf, lse_h * np.float32(LOG2E)))
            err = np.abs(dl[:n] - want_delta[0, q0:q0 + n, h])
            np.testing.assert_array_less(err, 1e-5 * scale[0, q0:q0 + n, h] + 1e-30)
            assert (l2[n:] == np.inf).all() and (dl[n:] == 0).all()


def check_varlen_backward(rng, dtype, d, causal, lens_q, lens_k, H=2, H_kv=1, **kw):
    """flash_attention_varlen_backward on the wgmma kernels against the reference; the
    last sequence's q, k, v and dout are NaN, so that a walked tile reading past an
    earlier sequence into it (TMA zero-fills only past the array) would carry NaN there
    through a masked 0 times it (``hopper.past_rows``)."""
    dt = DTYPES[dtype]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, dout = (rng.standard_normal((cu_q[-1], H, d)).astype(dt) for _ in range(2))
    k, v = (rng.standard_normal((cu_k[-1], H_kv, d)).astype(dt) for _ in range(2))
    mq, mk = max(lens_q), max(lens_k)
    ref_out, ref_lse = R.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal, **kw)
    out, lse = ref_out.astype(dt), ref_lse.astype(np.float32)
    for x, cu in ((q, cu_q), (dout, cu_q), (k, cu_k), (v, cu_k)):
        x[cu[-2]:] = np.nan
    dev = device_kw(kw)
    with kernels_launched() as ran:
        grads = numba_flash.flash_attention_varlen_backward(*(device(x) for x in (dout, q, k, v, out, lse)),
                                                            device(cu_q), device(cu_k), mq, mk, causal=causal, **dev)
    assert ran == kernels(d), ran
    grads = [host(g) for g in grads]
    ref = R.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, causal=causal, **kw)
    n = len(lens_q) - 1  # the clean sequences, and their rows
    cq, ck = slice(0, cu_q[-2]), slice(0, cu_k[-2])
    parts = [R.attention_backward_lowp(*(x[None, cu[b]:cu[b + 1]] for x, cu in ((dout, cu_q), (q, cu_q), (k, cu_k),
                                                                             (v, cu_k), (out, cu_q))),
                                       lse[None, :, cu_q[b]:cu_q[b + 1]], dtype=dt, causal=causal, **kw)
             for b in range(n)]  # fmt: skip
    low = [np.concatenate([p_[i][0] for p_ in parts]) for i in range(3)]
    rows = (cq, ck, ck)
    clean = [g[r].astype(np.float64) for g, r in zip(grads, rows)]
    refs = [x[r] for x, r in zip(ref, rows)]
    for name, err, base in zip(("dq", "dk", "dv"), grad_errors(clean, refs), grad_errors(low, refs)):
        assert err <= 3 * base + 1e-5, f"{dtype} d={d} causal={causal} {kw}: {name} {err:.3g} vs same-dtype {base:.3g}"
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert np.array_equal(np.isnan(g.astype(np.float64)), np.isnan(r)), f"{name}: NaN where the reference has none"


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("case", ["gqa", "varlen"])
def test_wgmma_backward_persistent_dkdv(rng, monkeypatch, case):
    """The persistent dK/dV kernel (``NUMBA_FLASH_WGMMA_BWD_PERSISTENT``; here forced to 2 blocks
    running every block of the virtual grid): GQA over two batches (6 key blocks: each launched
    block runs 3, so both K/V buffers are refilled after their consumers released them),
    and varlen with empty and length-1 sequences, causal (the blocks past a sequence skipped by
    both roles alike), against the reference."""
    from numba_flash.kernels import wgmma_backward as WB

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "2")
    d = 64 if case == "gqa" else 128
    (t,) = [x for x in WB.tiles(d) if x.keys_are_rows]
    # two more fixed tiles (128 rows of d 16-bit values each) and three more mbarriers
    assert t.persistent and WB.smem_bytes(t) == WB.smem_bytes(WB.replace(t, persistent=False)) + 2 * 256 * d + 24
    p = P.Problem("backward", "float16", d, False, batch=2, heads=2, seqlen_q=70, seqlen_k=300, heads_k=1, arch=SM90A)
    dkdv = [x for x in P.plan(p).launches if x.name == "wgmma_bwd_dkdv"][0]
    assert dkdv.grid == (2, 1, 1), dkdv.grid
    if case == "gqa":
        check_backward(rng, "float16", 64, False, B=2, H=2, H_kv=1, Nq=70, Nk=300)
    else:
        check_varlen_backward(rng, "bfloat16", 128, True, [5, 0, 150, 1, 33], [7, 4, 200, 1, 20])


@pytest.mark.parametrize("d,seqlen,features,env,want", [
    (64, 1024, {}, None, True),  # d <= 64, <= 1024 rows, causal: persistent by default (1.05-1.12x)
    (64, 512, {}, None, True),
    (64, 1025, {}, None, False),  # past 1024 rows: a block a key tile
    (128, 1024, {}, None, False),  # d = 128: 0.98-1.01x, not by default
    (64, 1024, {"varlen": True}, None, False),  # varlen: 0.93x
    (64, 1024, {"softcap": True}, None, False),  # a variant: its d = 64 persistent kernel spills (ptxas)
    (64, 1024, {"gqa": True}, None, False),
    (64, 1024, {}, "0", False),  # the switch off
    (128, 4096, {}, "on", True),  # the switch on
])  # fmt: skip
def test_wgmma_backward_persistent_by_default_on_short_walks(monkeypatch, d, seqlen, features, env, want):
    """``launches``' rule: the persistent dK/dV kernel where its walks are short (d <= 64, at
    most 1024 query rows, no variant but causal), a block a key tile elsewhere, and the
    switch above it; the persistent launch has one block an SM (2 in the simulator) on its
    virtual grid; a switch of another value is an error that names it."""
    from numba_flash.kernels import spec
    from numba_flash.kernels import wgmma_backward as WB

    if env is None:
        monkeypatch.delenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", raising=False)
    else:
        monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", env)
    sz = spec.Sizes(4, 8, seqlen, seqlen)
    launches = WB.launches(Variant(causal=True, **features), "float16", sz, d)
    (dkdv,) = [x for x in launches if x.name == "wgmma_bwd_dkdv"]
    assert dkdv.tiles.persistent == want, (d, seqlen, features, env)
    if want:
        assert dkdv.grid[1:] == (1, 1) and dkdv.grid[0] <= 132
    else:
        assert dkdv.grid == spec.key_grid(sz, WB.ROWS, True)
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "sometimes")
    with pytest.raises(ValueError, match="NUMBA_FLASH_WGMMA_BWD_PERSISTENT='sometimes'"):
        WB.launches(Variant(causal=True), "float16", sz, d)


def test_wgmma_backward_persistent_compiles_for_sm_90a(monkeypatch):
    """The persistent dK/dV kernel for sm_90a (d = 128, causal): the one-block kernel's wgmma (Sᵀ
    and dPᵀ m64n64, dK and dV m64n128, once each in the code), nothing in local memory, no
    spills where a whole-program ptxas reports them, and each lane's lse and delta pairs read
    with ``ld.shared.v2`` (``stats_word``: through int64 the ring's position, carried across
    blocks, hid that the index is non-negative and split every pair in two loads)."""
    from numba_flash.inspection import inspect_kernels

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "on")
    reports = inspect_kernels("backward", "float16", 128, True, arch="sm_90a", seqlen_q=4096)
    (r,) = [x for x in reports if x.name == "wgmma_bwd_dkdv"]
    assert r.ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 ") == 2 * 128 // 16
    assert r.ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 ") == 2 * 64 // 16
    assert r.ptx.count("ld.shared.v2.f32") == 16 and not re.search(r"ld\.shared\.f32\s", r.ptx)
    assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx
    if r.registers is not None and not r.assembler.startswith("nvJitLink"):
        assert r.spill_stores == 0, f"{r.spill_stores} bytes of spills"


@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
def test_wgmma_backward_varlen(rng):
    """Empty, length-1 and partial sequences, Nq ≠ Nk, GQA (dK/dV sums two query heads),
    causal; blocks past a sequence walk nothing; dK/dV of keys no query sees are 0."""
    check_varlen_backward(rng, "float16", 64, True, [5, 0, 70, 1, 33], [7, 4, 90, 1, 20])


def test_wgmma_backward_hold_compiles_for_sm_90a(monkeypatch):
    """``NUMBA_FLASH_WGMMA_BWD_HOLD=1`` (``wgmma_backward.hold``): the pipelined dQ kernel's
    never-taken fences (``hopper.hold_before_wait``), one after P in the walk's first step and
    two in the pipelined step (after P, after dS), P and dS held before them (``hopper.hold_tile``:
    a ``ptx.hold_f32x4`` a 4 floats, S_REGS / 4 a tile); none in the dK/dV kernel; nothing in
    local memory, no spills where ptxas assembles the whole program.  d = 128 causal only (the
    switch is off by default, no faster when timed in session 49; its d = 64 case was dropped for
    CI's time)."""
    from numba_flash.inspection import inspect_kernels

    d, causal = 128, True
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PIPE", "3")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", "0")
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "0")
    base = {r.name: r for r in inspect_kernels("backward", "float16", d, causal, arch="sm_90a", seqlen_q=4096)}
    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "1")
    held = {r.name: r for r in inspect_kernels("backward", "float16", d, causal, arch="sm_90a", seqlen_q=4096)}
    words = 64 // 8 * 4  # S_REGS: the dQ step's 64 keys at d = 128
    dq = held["wgmma_bwd_dq"]
    assert dq.ptx.count("membar.cta;") == 3 and dq.ptx.count("// hold ") == 3 * words // 4
    assert "membar.cta;" not in base["wgmma_bwd_dq"].ptx and "// hold " not in base["wgmma_bwd_dq"].ptx
    assert "membar.cta;" not in held["wgmma_bwd_dkdv"].ptx and "// hold " not in held["wgmma_bwd_dkdv"].ptx
    assert dq.local_bytes_ptx == 0 and "ld.local" not in dq.ptx and "st.local" not in dq.ptx
    if dq.registers is not None and not dq.assembler.startswith("nvJitLink"):
        assert dq.spill_stores == 0


@pytest.mark.parametrize("d,causal,pipe", [(128, False, "0"), (64, True, "1"), (256, True, "3"), (128, True, "3")])
def test_wgmma_backward_compiles_for_sm_90a(d, causal, pipe, monkeypatch):
    """``inspect --arch sm_90a`` of the plan: TMA copies (and the bulk copies of the
    stats rows in dK/dV), register reallocation, wgmma for S and dP (both operands from
    shared memory; no dP in d = 256's dV kernel) and for the gradients (A from
    registers), nothing in local memory, and (with a whole-program ptxas) assembled
    without spills; with the pipelined step (``pipe``) too, where it runs (dQ up to d = 128)."""
    from numba_flash.inspection import inspect_kernels
    from numba_flash.kernels.wgmma_backward import RINGS
    from numba_flash.kernels.wgmma_backward import tiles as bwd_tiles

    monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_PIPE", pipe)
    piped = {t.part: t.pipelined for t in bwd_tiles(d)}
    assert piped.get("dq") == (pipe != "0" and d <= 128) and not piped.get("dkdv")
    reports = inspect_kernels("backward", "float16", d, causal, arch="sm_90a", seqlen_q=4096)
    assert [r.name for r in reports] == kernels(d)
    for r in reports[1:]:
        part = r.name.removeprefix("wgmma_bwd_")
        ring = RINGS[d][part]  # the step of the walk
        products = 1 if part == "dv" else 2  # Sᵀ (and dPᵀ)
        grads = 2 if part == "dkdv" else 1
        copies = 2 if piped[part] else 1  # pipelined: the walk's first step and the others issue their own S and dP,
        # and the others and the last step their gradients' products
        assert ".target sm_90a" in r.ptx
        # the function carries its launch's name (ncu, the sanitizers and ``traffic.measure`` find it by it)
        assert re.search(r"\.entry\s+\S*" + r.name + r"B", r.ptx), r.name
        assert r.ptx.count(f"wgmma.mma_async.sync.aligned.m64n{ring}k16.f32.f16.f16 ") == copies * products * d // 16
        assert r.ptx.count(f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.f16.f16 ") == copies * grads * ring // 16
        assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in r.ptx
        assert ("cp.async.bulk.shared::cluster.global.mbarrier" in r.ptx) == (part != "dq")  # the stats rows
        assert "setmaxnreg.dec.sync.aligned.u32 24" in r.ptx and "setmaxnreg.inc.sync.aligned.u32 240" in r.ptx
        assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx
        if r.registers is not None and not r.assembler.startswith("nvJitLink"):
            assert r.spill_stores == 0, f"{r.name}: {r.spill_stores} bytes of spills"


@pytest.mark.parametrize("causal", [False, True])
def test_wgmma_backward_short_d64_default_is_persistent_and_compiles(monkeypatch, causal):
    """The persistent dK/dV kernel the plan takes by default at d = 64 and 1024 rows
    (``launches``' rule): its three more mbarriers (the second K/V buffer's), nothing in local
    memory, and (with a whole-program ptxas) no spills (session 33: 0 bytes, plain and
    causal; with a variant 24-168, which is why variants keep a block a tile)."""
    from numba_flash.inspection import inspect_kernels

    monkeypatch.delenv("NUMBA_FLASH_WGMMA_BWD_PERSISTENT", raising=False)
    (r,) = [r for r in inspect_kernels("backward", "float16", 64, causal, arch="sm_90a", seqlen_q=1024)
            if r.name == "wgmma_bwd_dkdv"]
    # the persistent kernel's second K/V buffer: its full barrier and each buffer's empty one (6 -> 9)
    assert r.ptx.count("mbarrier.init.shared::cta.b64") == 9, "not the persistent kernel"
    assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx
    if r.registers is not None and not r.assembler.startswith("nvJitLink"):
        assert r.spill_stores == 0, f"{r.spill_stores} bytes of spills"


@pytest.mark.parametrize("features", [dict(causal=True, softcap=True), dict(causal=True, dropout=True)])
def test_wgmma_backward_variant_passes_stay_in_registers(features):
    """The d = 64 dK/dV kernel with softcap (the masked copy of the per-element pass, its
    mask through the lane's frame) and with dropout (a Philox call an n-tile pair, the
    pairs in two loops): every loop of ``fragments._p_and_ds_pass`` unrolls, so S and dP
    stay in registers (session 29: with 64-bit index compares, or the pairs in one loop, a
    512-byte local array held them and ptxas serialized the kernel's wgmma)."""
    from numba_flash.inspection import inspect_kernels

    (r,) = [r for r in inspect_kernels("backward", "float16", 64, True, arch="sm_90a", variants=features)
            if r.name == "wgmma_bwd_dkdv"]
    assert r.local_bytes_ptx == 0 and "ld.local" not in r.ptx and "st.local" not in r.ptx, features


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("d", [32, 64, 96, 128, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_wgmma_backward_on_the_gpu(rng, dtype, d, causal):
    check_backward(rng, dtype, d, causal, B=2, H=4, H_kv=2, Nq=1000, Nk=517)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d", [("float16", 64), ("bfloat16", 128), ("float16", 256)])
def test_wgmma_backward_variants_on_the_gpu(rng, dtype, d):
    """GQA + window + softcap + ALiBi, then with dropout, against the float64 reference."""
    kw = dict(window_size=(300, 40), softcap=5.0, alibi_slopes=_slopes(rng, 8))
    check_backward(rng, dtype, d, True, B=2, H=8, H_kv=2, Nq=777, Nk=1000, **kw)
    seed = int(rng.integers(0, 2**63))
    check_backward(rng, dtype, d, False, B=1, H=8, H_kv=4, Nq=517, Nk=700, dropout_p=0.15, seed=seed, **kw)


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 64, True), ("bfloat16", 128, False), ("float16", 128, True),
                                             ("bfloat16", 256, True)])
def test_wgmma_backward_varlen_on_the_gpu(rng, dtype, d, causal):
    """Sequences from 0 to 1000 rows (several walked steps, partial ones), GQA, then
    window + softcap + ALiBi; the last sequence NaN."""
    lens_q, lens_k = [300, 0, 1, 1000, 129, 77], [517, 3, 1, 999, 128, 200]
    check_varlen_backward(rng, dtype, d, causal, lens_q, lens_k, H=8, H_kv=2)
    check_varlen_backward(rng, dtype, d, causal, lens_q, lens_k, H=8, H_kv=2, window_size=(200, 30), softcap=5.0,
                          alibi_slopes=_slopes(rng, 8))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on", "poisoned_outputs")
@pytest.mark.parametrize("dtype,d,causal", [("float16", 128, True), ("bfloat16", 64, False), ("bfloat16", 128, False)])
def test_wgmma_backward_hold_changes_no_bit_on_the_gpu(rng, monkeypatch, dtype, d, causal):
    """``NUMBA_FLASH_WGMMA_BWD_HOLD=1`` where ptxas schedules the real kernels: the gradients
    bit for bit those without, plain and with ALiBi + GQA, over many key steps, and to
    FlashAttention-2's tolerance (``check_backward``)."""
    for kw in ({}, {"alibi_slopes": _slopes(rng, 8)}):
        monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "1")
        inputs, held = check_backward(rng, dtype, d, causal, B=2, H=8, H_kv=2, Nq=777, Nk=1000, **kw)
        monkeypatch.setenv("NUMBA_FLASH_WGMMA_BWD_HOLD", "0")
        base, _ = run_backward(*inputs, causal, dict(kw, layout="bshd"))
        for name, a, b in zip(("dq", "dk", "dv"), held, base):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), (name, kw.keys())


@pytest.mark.gpu
@pytest.mark.usefixtures("wgmma_on")
@pytest.mark.parametrize("d,causal", [(128, True), (64, False)])
def test_wgmma_backward_gqa_is_deterministic(rng, d, causal):
    """Twenty runs of a GQA backward give bitwise the same dQ, dK and dV (no atomics; the
    group's heads summed in order)."""
    inputs, first = check_backward(rng, "bfloat16", d, causal, B=1, H=8, H_kv=2, Nq=700, Nk=900)
    for _ in range(20):
        again, _ = run_backward(*inputs, causal, {})
        assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(first, again))

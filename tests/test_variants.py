"""FlashAttention-2's variants on every kernel family, forward and backward, against the
float64 reference (``numba_flash.reference``, which has every variant).

GQA/MQA, sliding window (with and without causal), softcap, ALiBi, dropout (compared
exactly: the reference draws the same keep bits) and varlen batches,
alone and combined.  Tolerances as for plain attention: exact fp32 ≤ 1e-5 (O) / 1e-4
(gradients) relative (a gradient that is 0 in exact arithmetic, every row seeing one
key, is checked for noise ≤ 1e-6 of the largest gradient instead); fp16/bf16 ≤ 2× (O) / 3× (gradients) the error of a standard
attention computed in the same dtype (``reference.attention_lowp``); TF32 the same
factors over the TF32 baseline (``reference.attention_tf32``).  Outputs start as NaN
(``poisoned_outputs``).  The simulator runs tiny shapes; ``pytest -m gpu`` adds sizes
that span many tiles and the timing-sensitive checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BWD_TOL, FWD_TOL, SIMULATOR, grad_errors, host, seen_lse_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_flash
from numba_flash import _arrays, plan, reference

FLOOR = 1e-5  # where the same-precision baseline is (nearly) exact: see test_kernels.HALF_FLOOR

#: name: (dtype, head dim, allow_tf32, the family the plan must pick)
FAMILIES = {
    "fp32-blocked": (np.float32, 64, False, "simt-fp32"),
    "fp32-rowgroup": (np.float32, 24, False, "simt-fp32"),
    "tf32": (np.float32, 64, True, "tensor-core-tf32"),
    "fp16": (np.float16, 64, False, "tensor-core"),
    "bf16": (_arrays.BFLOAT16, 64, False, "tensor-core"),
    # tensor cores at head dims off the 64/128 tiles: 27 (unaligned rows, plain loads, odd
    # stores) and 200 (Q from shared memory, dK and dV from two kernels)
    "fp16-d27": (np.float16, 27, False, "tensor-core"),
    "bf16-d200": (_arrays.BFLOAT16, 200, False, "tensor-core"),
}

#: name: keywords (H, H_kv: heads of q and of k/v; alibi: slopes are drawn)
VARIANTS = {
    "window": dict(window_size=(5, 3)),
    "window-causal": dict(window_size=(4, -1), causal=True),
    "window-right": dict(window_size=(-1, 2)),
    "gqa-causal": dict(H=4, H_kv=2, causal=True),
    "mqa": dict(H=3, H_kv=1),
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi=True),
    "alibi-causal": dict(alibi=True, causal=True),
    "dropout": dict(dropout=0.25),
    "all": dict(H=4, H_kv=2, causal=True, window_size=(6, -1), softcap=2.0, alibi=True, dropout=0.1),
}

#: the families x variants the simulator runs (the tensor-core simulators are slow: the
#: combined case covers every variant there); ``pytest -m gpu`` runs the full matrix
SIM_MATRIX = [(f, v) for f in ("fp32-blocked", "fp32-rowgroup") for v in VARIANTS] + [
    ("fp16", v) for v in VARIANTS if v != "dropout"] + [  # fp16's dropout: in "all"
    ("tf32", "all"), ("bf16", "all"), ("tf32", "gqa-causal"), ("bf16", "window"), ("fp16-d27", "all")]  # fmt: skip
GPU_MATRIX = [(f, v) for f in FAMILIES for v in VARIANTS if (f, v) not in SIM_MATRIX]


def _kwargs(rng, variant: dict, B: int):
    kw = {k: v for k, v in variant.items() if k not in ("H", "H_kv", "alibi", "dropout")}
    H, H_kv = variant.get("H", 2), variant.get("H_kv", variant.get("H", 2))
    if variant.get("alibi"):
        kw["alibi_slopes"] = (0.5 * np.abs(rng.standard_normal((B, H)))).astype(np.float32)
    if variant.get("dropout"):
        kw.update(dropout_p=variant["dropout"], seed=int(rng.integers(0, 2**63)))
    return H, H_kv, kw


def _inputs(rng, dtype, B, H, H_kv, Nq, Nk, d):
    q = rng.standard_normal((B, Nq, H, d)).astype(dtype)
    k = rng.standard_normal((B, Nk, H_kv, d)).astype(dtype)
    v = rng.standard_normal((B, Nk, H_kv, d)).astype(dtype)
    dout = rng.standard_normal((B, Nq, H, d)).astype(dtype)
    return q, k, v, dout


def _xp():
    if SIMULATOR:
        return np
    import cupy

    return cupy


def _baselines(fam: str, dtype):
    """(forward, backward) of the same-precision standard attention, and the factors."""
    if fam == "tf32":
        return reference.attention_tf32, reference.attention_backward_tf32, {}
    if np.dtype(dtype) == np.float32:
        return None, None, {}
    return reference.attention_lowp, reference.attention_backward_lowp, {"dtype": dtype}


def check_variant(rng, fam: str, variant: dict, B=1, Nq=17, Nk=23, mods=None):
    """Forward and backward of one (family, variant) against the reference.  ``mods``:
    FlexAttention's keywords, ``mods(rng, B, H, Nq, Nk, xp) -> (forward's, the
    backward's own, the reference's)`` (``test_flex_kernels``)."""
    dtype, d, tf32, family = FAMILIES[fam]
    H, H_kv, kw = _kwargs(rng, variant, B)
    q, k, v, dout = _inputs(rng, dtype, B, H, H_kv, Nq, Nk, d)
    assert plan.family(plan.Problem("forward", _arrays.dtype_name(np.dtype(dtype)), d, allow_tf32=tf32))[0] == family
    xp = _xp()
    dev = [xp.asarray(x) for x in (q, k, v, dout)]
    kwd = dict(kw)
    if "alibi_slopes" in kwd:
        kwd["alibi_slopes"] = xp.asarray(kwd["alibi_slopes"])
    fwd_mods, bwd_mods, ref_mods = mods(rng, B, H, Nq, Nk, xp) if mods else ({}, {}, {})
    kwd.update(fwd_mods)
    kw_bwd = {**kw, **ref_mods, **bwd_mods}  # the reference's backward
    kw = {**kw, **ref_mods}
    out, lse = numba_flash.flash_attention(*dev[:3], return_lse=True, allow_tf32=tf32, **kwd)
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    fwd_base, bwd_base, low = _baselines(fam, dtype)
    err = reference.rel_error(host(out), ref_out)
    tol = FWD_TOL if fwd_base is None else 2 * reference.rel_error(fwd_base(q, k, v, **low, **kw)[0], ref_out) + FLOOR
    assert err <= tol, f"{fam} {variant}: O rel error {err:.3g} > {tol:.3g}, seed {rng.seed_value}"
    blind = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(host(lse)), blind), f"rows that see no key: lse -inf, seed {rng.seed_value}"
    lse_err = seen_lse_error(host(lse), ref_lse)
    assert lse_err <= (FWD_TOL if fam != "tf32" else 1e-3), f"LSE {lse_err:.3g}, seed {rng.seed_value}"

    # the backward, from the reference's out and lse (as the kernels would get them)
    o_in, lse_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_backward(dev[3], *dev[:3], xp.asarray(o_in), xp.asarray(lse_in),
                                                 allow_tf32=tf32, **kwd, **bwd_mods)  # fmt: skip
    for g, like in zip(grads, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype
    refs = reference.attention_backward(dout, q, k, v, o_in, lse_in, **kw_bwd)
    errs = grad_errors(grads, refs)
    if bwd_base is None:
        tols = [BWD_TOL] * 3
        largest = max(float(np.abs(r).max()) for r in refs)
        if largest == 0:  # every key dropped or invisible: nothing flows back
            assert all(np.all(host(g) == 0) for g in grads), f"{fam} {variant}: gradients of a zero attention"
            return
        for i, (g, r) in enumerate(zip(grads, refs)):
            if float(np.abs(r).max()) <= 1e-6 * largest:  # 0 in exact arithmetic (each row sees one key:
                # dS = dP∘Z/(1−p) − delta cancels; the reference's own is the noise of the fp32 out it is
                # given): fp32 rounding noise, ulps of the largest gradient summed over a column's rows and a
                # KV head's group (session 29: 1.03e-6 with window (3, 4), softcap, ALiBi, dropout on
                # fp32-blocked), held to a tenth of the gradients' bound
                noise = float(np.abs(host(g)).max()) / largest
                assert noise <= BWD_TOL / 10, (f"{fam} {variant}: gradient {i} is 0 exactly, got {noise:.3g} of the "
                                               f"largest, seed {rng.seed_value}")  # fmt: skip
                tols[i] = np.inf
    else:
        tols = [3 * b + FLOOR for b in grad_errors(bwd_base(dout, q, k, v, o_in, lse_in, **low, **kw_bwd), refs)]
    for name, e, t in zip(("dq", "dk", "dv"), errs, tols):
        assert e <= t, f"{fam} {variant}: {name} rel error {e:.3g} > {t:.3g}, seed {rng.seed_value}"


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", SIM_MATRIX, ids=[f"{f}-{v}" for f, v in SIM_MATRIX])
def test_variant(rng, fam, name):
    check_variant(rng, fam, VARIANTS[name])


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="the rest of the family x variant matrix: GPU only (simulator time)")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", GPU_MATRIX, ids=[f"{f}-{v}" for f, v in GPU_MATRIX])
def test_variant_gpu_matrix(rng, fam, name):
    check_variant(rng, fam, VARIANTS[name])


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("Nq,Nk", [(1000, 1000), (1, 1000), (1000, 63), (333, 517)])
def test_variant_combined_large(rng, fam, Nq, Nk):
    check_variant(rng, fam, dict(H=8, H_kv=2, causal=True, window_size=(200, -1), softcap=5.0, alibi=True), B=2,
                  Nq=Nq, Nk=Nk)  # fmt: skip


@settings(max_examples=6 if SIMULATOR else 60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    fam=st.sampled_from(["fp32-blocked", "fp32-rowgroup", "fp32-blocked", "fp16", "tf32", "bf16"]),
    causal=st.booleans(),
    left=st.sampled_from([-1, 0, 3, 9]),
    right=st.sampled_from([-1, 0, 4]),
    softcap=st.sampled_from([0.0, 0.7, 3.0]),
    alibi=st.booleans(),
    dropout=st.sampled_from([0.0, 0.0, 0.3]),
    heads=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
    Nq=st.sampled_from([1, 9, 17]),
    Nk=st.sampled_from([1, 12, 23]),
)
@pytest.mark.usefixtures("poisoned_outputs")
def test_variant_combinations(rng, fam, causal, left, right, softcap, alibi, dropout, heads, Nq, Nk):
    """A seeded sample of combinations (hypothesis); ``-m gpu`` runs ten times more."""
    variant = dict(H=heads[0], H_kv=heads[1], causal=causal, window_size=(left, right), softcap=softcap, alibi=alibi,
                   dropout=dropout)  # fmt: skip
    check_variant(rng, fam, variant, Nq=Nq, Nk=Nk)


@pytest.mark.skipif(not SIMULATOR, reason="device functions are plain Python calls only in the simulator")
@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    lengths=st.tuples(st.integers(1, 1 << 30), st.integers(1, 1 << 30)) | st.tuples(st.integers(1, 300),
                                                                                    st.integers(1, 300)),
    corner=st.tuples(st.integers(-64, 1 << 30), st.integers(-64, 1 << 30)) | st.tuples(st.integers(0, 300),
                                                                                      st.integers(0, 300)),
    bounds=st.tuples(st.booleans(), st.integers(0, 1 << 62) | st.integers(0, 300), st.booleans(),
                     st.integers(0, 1 << 62) | st.integers(0, 300)),
    offsets=st.tuples(st.integers(0, 255), st.integers(0, 255)),
)
def test_mask_frame_is_visible(lengths, corner, bounds, offsets):
    """The tensor-core kernels' mask through a lane's frame (``mask.frame``, ``mask.visible_at``:
    int32 bounds a tile, compared with the element's compile-time offsets) answers as
    ``mask.visible`` for every (query, key), window bounds up to 2**62 included."""
    from numba_flash.kernels import mask

    (seqlen_q, seqlen_k), (q0, k0), (has_left, left, has_right, right), (dq, dk) = lengths, corner, bounds, offsets
    mi = (seqlen_q, seqlen_k, seqlen_k - seqlen_q, has_left, left if has_left else 0, has_right,
          right if has_right else 0)  # as block_info.mask_info  # fmt: skip
    assert bool(mask.visible_at(mask.frame(q0, k0, mi), dq, dk, mi)) == bool(mask.visible(q0 + dq, k0 + dk, mi))


@pytest.mark.skipif(not SIMULATOR, reason="device functions are plain Python calls only in the simulator")
def test_mask_frame_edges():
    """:func:`test_mask_frame_is_visible` on every element of small tiles around the
    diagonal and the window's edges (where an off-by-one shows), both ways round."""
    from numba_flash.kernels import mask

    seen = set()
    for seqlen_q, seqlen_k in [(9, 9), (5, 13), (13, 5)]:
        for has_left, left, has_right, right in [(False, 0, True, 0), (True, 3, True, 0), (True, 0, True, 2),
                                                 (True, 4, False, 0), (False, 0, True, 1 << 40)]:  # fmt: skip
            mi = (seqlen_q, seqlen_k, seqlen_k - seqlen_q, has_left, left, has_right, right)
            for q0, k0 in [(0, 0), (3, 0), (0, 4), (8, 8)]:
                fr = mask.frame(q0, k0, mi)
                for dq in range(0, 12, 1):
                    for dk in range(0, 12, 1):
                        ok = bool(mask.visible(q0 + dq, k0 + dk, mi))
                        assert bool(mask.visible_at(fr, dq, dk, mi)) == ok, (mi, q0, k0, dq, dk)
                        seen.add(ok)
    assert seen == {True, False}


# --- any head dim ---------------------------------------------------------------------------


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("d", [1, 5, 27] if SIMULATOR else [pytest.param(d, marks=pytest.mark.gpu)
                                                             for d in (1, 5, 27, 59, 111, 250)])  # fmt: skip
def test_any_head_dim_fp32(rng, d):
    """Exact fp32 at head dims that are not a multiple of 8: the row-group kernels on
    the next multiple's tiles (columns past d zero on load, never written; no padded
    copy), forward and backward, with GQA, causal and softcap, against the reference."""
    shape = (1, 2, 1, 7, 11) if SIMULATOR else (2, 4, 2, 300, 517)
    check_head_dim(rng, np.float32, d, *shape, family="simt-fp32")


#: fp16/bf16 head dims: every tile dim (32 .. 256), dims padded up to one (40, 72, 136,
#: 200) and dims that are not a multiple of 8 (their rows are not 16-byte aligned: the
#: tiles are filled by plain loads; odd ones store O 16 bits at a time)
TC_DIMS_SIM = [(_arrays.BFLOAT16, 40), (np.float16, 96), (np.float16, 160), (_arrays.BFLOAT16, 256),
               (np.float16, 5), (_arrays.BFLOAT16, 27)]  # fmt: skip
TC_DIMS_GPU = [pytest.param(dt, d, marks=pytest.mark.gpu, id=f"{np.dtype(dt).name}-{d}") for dt in (np.float16, _arrays.BFLOAT16)
               for d in (1, 5, 8, 27, 32, 40, 59, 72, 96, 111, 136, 160, 192, 200, 224, 250, 256)]  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("dtype,d", TC_DIMS_SIM if SIMULATOR else TC_DIMS_GPU,
                         ids=lambda x: x if isinstance(x, int) else np.dtype(x).name)  # fmt: skip
def test_tensor_core_head_dims(rng, dtype, d):
    """fp16/bf16 at any head dim run on tensor cores, on the tiles of
    ``config.tc_tile_dim(d)`` (past 128: Q fragments from shared memory, dK and dV from
    two kernels), with GQA, causal and softcap, against the reference (2× / 3× the
    same-dtype standard attention)."""
    shape = (1, 2, 1, 17, 23) if SIMULATOR else (2, 4, 2, 300, 517)
    check_head_dim(rng, dtype, d, *shape, family="tensor-core")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("dtype,d", [pytest.param(np.float16, 64, id="float16-64"),
                                     pytest.param(_arrays.BFLOAT16, 96, id="bfloat16-96")] if SIMULATOR else
                         [pytest.param(np.float16, 64, marks=pytest.mark.gpu, id="float16-64"),
                          pytest.param(_arrays.BFLOAT16, 96, marks=pytest.mark.gpu, id="bfloat16-96")])  # fmt: skip
def test_tensor_core_unaligned_rows(rng, dtype, d):
    """Strided q, k, v whose rows do not start on 16-byte boundaries (every other head
    of a wider array, offset by one element) run on tensor cores through plain loads
    (cp.async cannot read them), and give the reference's numbers."""
    B, H, Nq, Nk = (1, 2, 17, 23) if SIMULATOR else (2, 4, 300, 517)
    wide = [rng.standard_normal((B, n, 2 * H, d + 1)).astype(dtype) for n in (Nq, Nk, Nk, Nq)]
    q, k, v, dout = (w[:, :, ::2, 1:] for w in wide)
    xp = _xp()
    qd, kd, vd, dod = (xp.asarray(w)[:, :, ::2, 1:] for w in wide)  # strided on the device too
    assert not _arrays.aligned16(qd)
    p = plan.Problem("forward", np.dtype(dtype).name, d, aligned=False)
    assert plan.family(p)[0] == "tensor-core" and not plan.plan(p).launches[0].tiles.aligned
    out, lse = numba_flash.flash_attention(qd, kd, vd, return_lse=True, causal=True)
    ref_out, ref_lse = reference.attention(q, k, v, causal=True)
    tol = 2 * reference.rel_error(reference.attention_lowp(q, k, v, dtype=dtype, causal=True)[0], ref_out) + FLOOR
    assert reference.rel_error(host(out), ref_out) <= tol, f"O, seed {rng.seed_value}"
    o_in, lse_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_backward(dod, qd, kd, vd, xp.asarray(o_in), xp.asarray(lse_in), causal=True)
    refs = reference.attention_backward(dout, q, k, v, o_in, lse_in, causal=True)
    low = reference.attention_backward_lowp(dout, q, k, v, o_in, lse_in, dtype=dtype, causal=True)
    for name, e, t in zip(("dq", "dk", "dv"), grad_errors(grads, refs), [3 * b + FLOOR for b in grad_errors(low, refs)]):
        assert e <= t, f"{name} {e:.3g} > {t:.3g}, seed {rng.seed_value}"


def check_head_dim(rng, dtype, d, B, H, H_kv, Nq, Nk, family):
    q, k, v, dout = _inputs(rng, dtype, B, H, H_kv, Nq, Nk, d)
    kw = dict(causal=True, softcap=3.0)
    for pass_ in plan.PASSES:
        p = plan.Problem(pass_, np.dtype(dtype).name, d, True, batch=B, heads=H, heads_k=H_kv, seqlen_q=Nq,
                         seqlen_k=Nk)  # fmt: skip
        assert plan.family(p)[0] == family, (pass_, plan.family(p))
    xp = _xp()
    out, lse = numba_flash.flash_attention(*(xp.asarray(x) for x in (q, k, v)), return_lse=True, **kw)
    assert out.shape == q.shape
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    o_in, lse_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_backward(*(xp.asarray(x) for x in (dout, q, k, v, o_in, lse_in)), **kw)
    refs = reference.attention_backward(dout, q, k, v, o_in, lse_in, **kw)
    if np.dtype(dtype) == np.float32:
        tol, tols = FWD_TOL, [BWD_TOL] * 3
    else:
        tol = 2 * reference.rel_error(reference.attention_lowp(q, k, v, dtype=dtype, **kw)[0], ref_out) + FLOOR
        low = reference.attention_backward_lowp(dout, q, k, v, o_in, lse_in, dtype=dtype, **kw)
        tols = [3 * b + FLOOR for b in grad_errors(low, refs)]
    assert reference.rel_error(host(out), ref_out) <= tol, f"d={d}: O, seed {rng.seed_value}"
    blind = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(host(lse)), blind), f"d={d}: rows that see no key, seed {rng.seed_value}"
    lse_err = seen_lse_error(host(lse), ref_lse)
    assert lse_err <= FWD_TOL, f"d={d}: LSE {lse_err:.3g}, seed {rng.seed_value}"  # fp32's, as check_variant
    for name, e, t in zip(("dq", "dk", "dv"), grad_errors(grads, refs), tols):
        assert e <= t, f"d={d}: {name} {e:.3g} > {t:.3g}, seed {rng.seed_value}"


# --- dropout ------------------------------------------------------------------------------


def _dropout_through_api(fam, B, H, Nq, Nk, p, seed, xp, **kw):
    """The keep mask as the kernels apply it: scale 0 makes P uniform (1/Nk) and V the
    identity (d = Nk) makes O[i, j] = Z_ij / ((1 − p)·Nk); returns (kept, out)."""
    dtype, d, tf32, _ = FAMILIES[fam]
    assert d == Nk
    gen = np.random.default_rng(seed % 2**32)
    q = gen.standard_normal((B, Nq, H, d)).astype(dtype)
    k = gen.standard_normal((B, Nk, H, d)).astype(dtype)
    v = np.ascontiguousarray(np.broadcast_to(np.eye(Nk, dtype=np.float32)[None, :, None, :], (B, Nk, H, d)), dtype)
    out = numba_flash.flash_attention(*(xp.asarray(x) for x in (q, k, v)), softmax_scale=0.0, dropout_p=p, seed=seed,
                                      allow_tf32=tf32, **kw)  # fmt: skip
    out = host(out).astype(np.float64)
    return out.transpose(0, 2, 1, 3) > 0, out  # (B, H, Nq, Nk)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", ["fp32-blocked", "fp32-rowgroup", "fp16"] + ([] if SIMULATOR else ["tf32", "bf16"]))
def test_dropout_mask_is_the_reference_mask(rng, fam):
    """The kernels keep exactly ``reference.dropout_mask``'s elements, with the kept
    probabilities scaled by 1/(1 − p); the same seed gives the same bits, another seed
    other bits.  On the GPU over 2·4·2048 rows, the kept fraction is within 1% of 1 − p."""
    d = FAMILIES[fam][1]
    B, H, Nq = (1, 2, 17) if SIMULATOR else (2, 4, 2048)  # 17: both halves of a row pair, a second 16
    p, seed = 0.3, int(rng.integers(0, 2**63))
    xp = _xp()
    kept, out = _dropout_through_api(fam, B, H, Nq, d, p, seed, xp)
    want = reference.dropout_mask(seed, p, B, H, Nq, d)
    assert np.array_equal(kept, want), f"seed {seed}: {np.sum(kept != want)} keep bits differ"
    scaled = out.transpose(0, 2, 1, 3)[kept] * (1 - p) * d
    assert np.allclose(scaled, 1.0, rtol=1e-2 if fam in ("fp16", "bf16", "tf32") else 1e-5)
    again, _ = _dropout_through_api(fam, B, H, Nq, d, p, seed, xp)
    other, _ = _dropout_through_api(fam, B, H, Nq, d, p, seed + 1, xp)
    assert np.array_equal(again, kept) and not np.array_equal(other, kept)
    if not SIMULATOR:
        assert abs(kept.mean() - reference.keep_threshold(p) / 256) < 0.01, kept.mean()


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", ["fp16"] + ([] if SIMULATOR else ["tf32", "bf16", "fp32-blocked", "fp32-rowgroup"]))
def test_dropout_backward_keeps_the_reference_mask(rng, fam):
    """The backward regenerates exactly ``reference.dropout_mask``: with scale 0 (P =
    1/Nk) and dO the identity (d = Nq), dV[j, i] = Z_ij / ((1 − p)·Nk), so dVᵀ > 0 is
    the keep mask the dK/dV kernel drew.  Nq = 32 spans two 16-row pairs' blocks, Nk =
    64 two 32-key groups and, on the tensor cores, both key halves of a 32-key group.
    The simulator runs the tensor-core case (the lane-pair sharing of ``_pair_words``);
    the fp32 kernels draw one call an element (``dropout.keep``), checked by
    test_device_keep_equals_reference_mask and the forward's mask test."""
    dtype, _, tf32, _ = FAMILIES[fam]
    B, H, Nq, Nk = 1, 2, 32, 64
    d = Nq
    p, seed = 0.3, int(rng.integers(0, 2**63))
    xp = _xp()
    q, k, v = (rng.standard_normal((B, n, H, d)).astype(dtype) for n in (Nq, Nk, Nk))
    dout = np.ascontiguousarray(np.broadcast_to(np.eye(Nq, dtype=np.float32)[None, :, None, :], (B, Nq, H, d)), dtype)
    kw = dict(softmax_scale=0.0, dropout_p=p, seed=seed, allow_tf32=tf32)
    dq_, dk_, dv_ = (xp.asarray(x) for x in (q, k, v))
    out, lse = numba_flash.flash_attention(dq_, dk_, dv_, return_lse=True, **kw)
    _, _, dv = numba_flash.flash_attention_backward(xp.asarray(dout), dq_, dk_, dv_, out, lse, **kw)
    dv = host(dv).astype(np.float64).transpose(0, 2, 3, 1)  # (B, H, i, j)
    want = reference.dropout_mask(seed, p, B, H, Nq, Nk)
    assert np.array_equal(dv > 0, want), f"seed {seed}: {np.sum((dv > 0) != want)} keep bits differ"
    assert np.allclose(dv[want] * (1 - p) * Nk, 1.0, rtol=1e-2 if fam in ("fp16", "bf16", "tf32") else 1e-5)


# --- varlen -------------------------------------------------------------------------------


def _varlen_case(rng, fam, lens_q, lens_k, H=2, H_kv=1, **kw):
    dtype, d, tf32, _ = FAMILIES[fam]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = rng.standard_normal((tq, H, d)).astype(dtype)
    k = rng.standard_normal((tk, H_kv, d)).astype(dtype)
    v = rng.standard_normal((tk, H_kv, d)).astype(dtype)
    dout = rng.standard_normal((tq, H, d)).astype(dtype)
    return dtype, tf32, (q, k, v, dout), cu_q, cu_k, max(lens_q), max(lens_k)


def _seq(cu_q, cu_k, b, *arrays):
    """Sequence b of packed arrays as a batch of one (bshd); (dout,) q, k, v (, out, lse)
    in the order given: names by position (dout, q first: query rows; k, v: key rows;
    lse (H, total_q): query columns)."""
    sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
    n = len(arrays)
    rows = {3: [sq, sk, sk], 6: [sq, sq, sk, sk, sq, None]}[n]
    out = []
    for x, r in zip(arrays, rows):
        out.append(x[:, sq][None] if r is None else x[r][None])
    return out


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", ["fp32-blocked", "fp32-rowgroup", "fp16", "tf32", "fp16-d27"])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(3, 1), softcap=1.0), dict(dropout_p=0.2, seed=2**40 + 9)],
                         ids=["causal", "window", "dropout"])
def test_varlen(rng, fam, kw):
    """Packed sequences mixing empty, length-1 and longer ones, Nq ≠ Nk per sequence,
    GQA: each sequence is its own attention (lse (H, total_q)), as the reference's
    per-sequence computation."""
    lens_q, lens_k = [5, 0, 1, 19, 3], [7, 4, 1, 11, 0]
    dtype, tf32, (q, k, v, dout), cu_q, cu_k, mq, mk = _varlen_case(rng, fam, lens_q, lens_k)
    xp = _xp()
    dq_, dk_, dv_, ddo = (xp.asarray(x) for x in (q, k, v, dout))
    out, lse = numba_flash.flash_attention_varlen(dq_, dk_, dv_, xp.asarray(cu_q), xp.asarray(cu_k), mq, mk,
                                                  return_lse=True, allow_tf32=tf32, **kw)  # fmt: skip
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    ref_out, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, **kw)
    fwd_base, bwd_base, low = _baselines(fam, dtype)
    tol = FWD_TOL
    if fwd_base is not None:  # the same-precision standard attention, sequence by sequence
        base = np.concatenate([fwd_base(*_seq(cu_q, cu_k, b, q, k, v), **low, **kw)[0][0]
                               for b in range(len(lens_q))])  # fmt: skip
        tol = 2 * reference.rel_error(base, ref_out) + FLOOR
    assert reference.rel_error(host(out), ref_out) <= tol, rng.seed_value
    blind = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(host(lse)), blind)
    o_in, lse_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_varlen_backward(ddo, dq_, dk_, dv_, xp.asarray(o_in), xp.asarray(lse_in),
                                                        xp.asarray(cu_q), xp.asarray(cu_k), mq, mk, allow_tf32=tf32,
                                                        **kw)  # fmt: skip
    refs = reference.attention_varlen_backward(dout, q, k, v, o_in, lse_in, cu_q, cu_k, mq, mk, **kw)
    errs = grad_errors(grads, refs)
    tols = [BWD_TOL] * 3
    if bwd_base is not None:
        parts = [bwd_base(*_seq(cu_q, cu_k, b, dout, q, k, v, o_in, lse_in), **low, **kw) for b in range(len(lens_q))]
        base = [np.concatenate([p[i][0] for p in parts]) for i in range(3)]
        tols = [3 * e + FLOOR for e in grad_errors(base, refs)]
    for name, e, t in zip(("dq", "dk", "dv"), errs, tols):
        assert e <= t, f"{fam}: {name} {e:.3g} > {t:.3g}, seed {rng.seed_value}"
    # keys of a sequence whose queries are empty (sequence 1 has no query) get zero gradients
    for g in grads[1:]:
        assert np.all(host(g)[cu_k[1] : cu_k[2]] == 0)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="the upload of NumPy offsets exists only on a GPU (the simulator's stay NumPy)")
def test_numpy_offsets_upload_without_waiting_for_the_gpu():
    """NumPy offsets reach the device by an asynchronous copy (``_arrays.upload_offsets``):
    the host does not wait for the kernels queued before it (a blocking copy did, so each
    varlen call waited for the previous one); the copy is by content, and right."""
    import time

    import cupy

    from numba_flash import _arrays as A

    x = cupy.ones((8192, 8192), cupy.float32)
    first = A.upload_offsets(np.array([0, 5, 9], np.int32))
    for _ in range(20):  # some 0.2 s of GPU work queued
        x = x @ x * (1 / 8192)
    t = time.perf_counter()
    offsets = np.array([0, 3, 3, int(time.time_ns() % 1000) + 3], np.int32)  # content not seen before
    dev = A.upload_offsets(offsets)
    host_s = time.perf_counter() - t
    queued = not cupy.cuda.get_current_stream().done
    cupy.cuda.get_current_stream().synchronize()
    assert queued and host_s < 0.02, (queued, host_s)
    assert dev.get().tolist() == offsets.tolist() and first.get().tolist() == [0, 5, 9]
    assert A.upload_offsets(np.array([0, 5, 9], np.int32)) is first


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="host and device offsets differ only on a GPU (the simulator's are NumPy)")
def test_varlen_offsets_on_the_host(rng):
    """NumPy cu_seqlens with device q (checked on the host without reading the device)
    give the same numbers as device ones; device offsets with NumPy q are refused."""
    import cupy

    dtype, tf32, (q, k, v, dout), cu_q, cu_k, mq, mk = _varlen_case(rng, "fp16", [5, 0, 300, 17], [9, 4, 300, 0])
    dev = [cupy.asarray(x) for x in (q, k, v)]
    host = numba_flash.flash_attention_varlen(*dev, cu_q, cu_k, mq, mk, causal=True)
    device = numba_flash.flash_attention_varlen(*dev, cupy.asarray(cu_q), cupy.asarray(cu_k), mq, mk, causal=True)
    assert np.array_equal(host.get(), device.get(), equal_nan=True)
    with pytest.raises(TypeError, match="cu_seqlens_q: a device array with NumPy q"):
        numba_flash.flash_attention_varlen(q, k, v, cupy.asarray(cu_q), cu_k, mq, mk)


@pytest.mark.usefixtures("poisoned_outputs")
def test_varlen_equals_padded_batch(rng):
    """Equal lengths: varlen gives the padded batch's numbers bit for bit (same kernels,
    same tiles, offsets only)."""
    B, N, H, d = 2, 13, 2, 64
    q, k, v = (rng.standard_normal((B, N, H, d)).astype(np.float16) for _ in range(3))
    cu = np.arange(0, (B + 1) * N, N, dtype=np.int32)
    xp = _xp()
    out, lse = numba_flash.flash_attention(*(xp.asarray(x) for x in (q, k, v)), causal=True, return_lse=True)
    packed = [xp.asarray(x.reshape(B * N, H, d)) for x in (q, k, v)]
    out_v, lse_v = numba_flash.flash_attention_varlen(*packed, xp.asarray(cu), xp.asarray(cu), N, N, causal=True,
                                                      return_lse=True)  # fmt: skip
    assert np.array_equal(host(out_v), host(out).reshape(B * N, H, d))
    assert np.array_equal(host(lse_v), host(lse).transpose(1, 0, 2).reshape(H, B * N))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", ["fp32-blocked"] + ([] if SIMULATOR else [pytest.param("fp16", marks=pytest.mark.gpu)]))
def test_alibi_slopes_per_head_are_read_in_place(rng, fam):
    """(heads,) slopes reach the kernels as a (1, heads) view, not a (batch, heads) copy a
    call (``_arrays.alibi_rows``; session 47): the same numbers as the broadcast (batch,
    heads) slopes bit for bit, forward and backward; a replayed call reads its own slopes;
    strided slopes are copied; the slopes are not modified."""
    dtype, d, tf32, _ = FAMILIES[fam]
    B, H, Nq, Nk = 2, 3, 17, 23
    q, k, v, dout = _inputs(rng, dtype, B, H, H, Nq, Nk, d)
    xp = _xp()
    dev = [xp.asarray(x) for x in (q, k, v, dout)]
    fwd_base, _, low = _baselines(fam, dtype)
    for call in range(2):  # the second call of the same signature replays the first's launches
        slopes = (0.5 * np.abs(rng.standard_normal(H))).astype(np.float32)
        s_dev = xp.asarray(slopes)
        out, lse = numba_flash.flash_attention(*dev[:3], causal=True, alibi_slopes=s_dev, return_lse=True)
        ref_out, _ = reference.attention(q, k, v, causal=True, alibi_slopes=slopes)
        err = reference.rel_error(host(out), ref_out)
        tol = FWD_TOL if fwd_base is None else (
            2 * reference.rel_error(fwd_base(q, k, v, causal=True, alibi_slopes=slopes, **low)[0], ref_out) + FLOOR)
        assert err <= tol, f"call {call}: O rel error {err:.3g} > {tol:.3g}, seed {rng.seed_value}"
        wide = xp.asarray(np.broadcast_to(slopes, (B, H)).copy())
        out_b, lse_b = numba_flash.flash_attention(*dev[:3], causal=True, alibi_slopes=wide, return_lse=True)
        assert np.array_equal(host(out), host(out_b)) and np.array_equal(host(lse), host(lse_b))
        grads = numba_flash.flash_attention_backward(dev[3], *dev[:3], out, lse, causal=True, alibi_slopes=s_dev)
        grads_b = numba_flash.flash_attention_backward(dev[3], *dev[:3], out, lse, causal=True, alibi_slopes=wide)
        assert all(np.array_equal(host(g), host(gb)) for g, gb in zip(grads, grads_b))
        assert np.array_equal(host(s_dev), slopes), "the slopes were modified"
    strided = xp.asarray(np.repeat(slopes, 2))[::2]  # (H,), stride 2 elements: copied to a contiguous row
    assert np.array_equal(host(numba_flash.flash_attention(*dev[:3], causal=True, alibi_slopes=strided)), host(out))
    rows = _arrays.alibi_rows(s_dev)
    assert rows.shape == (1, H)
    assert (np.shares_memory(rows, s_dev) if xp is np else rows.data.ptr == s_dev.data.ptr), "(H,) slopes copied"


# --- determinism and the API's checks -------------------------------------------------


@pytest.mark.parametrize("fam", ["fp32-blocked", "fp16"])
def test_gqa_backward_is_deterministic(rng, fam):
    """dK and dV of a KV head sum its query heads in a fixed order: bitwise equal run to
    run (``-m gpu``: 50 runs on a size with many blocks)."""
    dtype, d, tf32, _ = FAMILIES[fam]
    runs, shape = (3, (1, 17, 4, 23)) if SIMULATOR else (50, (2, 1000, 8, 777))
    B, Nq, H, Nk = shape
    q, k, v, dout = _inputs(rng, dtype, B, H, 2, Nq, Nk, d)
    xp = _xp()
    args = [xp.asarray(x) for x in (dout, q, k, v)]
    out, lse = numba_flash.flash_attention(*args[1:], causal=True, return_lse=True)
    first = [host(g) for g in numba_flash.flash_attention_backward(*args, out, lse, causal=True)]
    for _ in range(runs - 1):
        again = numba_flash.flash_attention_backward(*args, out, lse, causal=True)
        assert all(np.array_equal(a, host(b)) for a, b in zip(first, again))


def _qkv(H=2, H_kv=2):
    gen = np.random.default_rng(0)
    return (gen.standard_normal((1, 5, H, 8)).astype(np.float32), gen.standard_normal((1, 7, H_kv, 8)).astype(np.float32),
            gen.standard_normal((1, 7, H_kv, 8)).astype(np.float32))  # fmt: skip


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(window_size=(3,)), TypeError, r"window_size: expected a pair of ints"),
        (dict(window_size=(2.0, 1)), TypeError, r"window_size: expected a pair of ints"),
        (dict(window_size=(-2, 1)), ValueError, r"window_size: expected each side -1 \(unbounded\) or >= 0"),
        (dict(softcap=-1.0), ValueError, r"softcap: expected a finite number >= 0"),
        (dict(softcap="1"), TypeError, r"softcap: expected a real number"),
        (dict(alibi_slopes=np.ones(3, np.float32)), ValueError, r"alibi_slopes: expected shape \(heads,\) = \(2,\)"),
        (dict(alibi_slopes=np.ones(2, np.float64)), TypeError, r"alibi_slopes: expected dtype float32"),
        (dict(dropout_p=0.1), ValueError, r"seed: dropout_p=0.1 needs a seed"),
        (dict(dropout_p=1.0, seed=1), ValueError, r"dropout_p: expected a number in \[0, 1\)"),
        (dict(dropout_p=0.1, seed=-1), ValueError, r"seed: expected an int in \[0, 2\*\*64\)"),
    ],
)
def test_variant_arguments_are_checked(kw, exc, match):
    q, k, v = _qkv()
    with pytest.raises(exc, match=match):
        numba_flash.flash_attention(q, k, v, **kw)
    with pytest.raises(exc, match=match):
        numba_flash.flash_attention_backward(q, q, k, v, q, np.zeros((1, 2, 5), np.float32), **kw)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("window,causal", [((1 << 31, 0), True), ((2**63 - 1, 2**63 - 1), False), ((2**70, 3), False)])
def test_huge_window_sides_are_unbounded(rng, window, causal):
    """A window side of 2**31 or more (a Python int past int64 too) is unbounded: the same
    numbers as −1, where before 2**70 raised an OverflowError and 2**63 − 1 wrapped around
    in the kernels' 64-bit index sums (``variant.UNBOUNDED_WINDOW``)."""
    q, k, v = (rng.standard_normal((1, 9, 2, 16)).astype(np.float32) for _ in range(3))
    same = tuple(-1 if side >= 1 << 31 else side for side in window)
    out = numba_flash.flash_attention(q, k, v, window_size=window)
    ref, _ = reference.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                 causal=causal, window_size=same)  # fmt: skip
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.array_equal(out, numba_flash.flash_attention(q, k, v, window_size=same, causal=causal))


@pytest.mark.usefixtures("poisoned_outputs")
def test_window_side_of_seqlen_k_is_open_as_flash_attn(rng):
    """FlashAttention-2 opens a window side of seqlen_k or more (``variant.fa2_window``):
    at Nq = 12 > Nk = 3, window (−1, 5) is plain attention (the formula alone would hide
    keys from rows 0..5), forward and backward; varlen compares with max_seqlen_k, so
    there the same sequence with max_seqlen_k = 8 keeps the formula's mask."""
    q = rng.standard_normal((1, 12, 2, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 3, 2, 16)).astype(np.float32) for _ in range(2))
    out, lse = numba_flash.flash_attention(q, k, v, window_size=(-1, 5), return_lse=True)
    full, full_lse = numba_flash.flash_attention(q, k, v, return_lse=True)
    assert np.array_equal(out, full) and np.array_equal(lse, full_lse)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    for g, g_full in zip(numba_flash.flash_attention_backward(dout, q, k, v, out, lse, window_size=(-1, 5)),
                         numba_flash.flash_attention_backward(dout, q, k, v, full, full_lse)):  # fmt: skip
        assert np.array_equal(g, g_full)
    cu_q, cu_k = np.array([0, 12], np.int32), np.array([0, 3], np.int32)
    out_v, lse_v = numba_flash.flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, 12, 8, window_size=(-1, 5),
                                                      return_lse=True)  # fmt: skip
    ref, ref_lse = reference.attention_varlen(q[0].astype(np.float64), k[0].astype(np.float64),
                                              v[0].astype(np.float64), cu_q, cu_k, 12, 8, window_size=(-1, 5))
    assert np.isneginf(lse_v[:, :4]).all() and np.isneginf(ref_lse[:, :4]).all()  # rows 0..3 see no key
    assert np.abs(out_v - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize(
    "cu_q,cu_k,max_q,exc,match",
    [
        ([0, 3, 5], [0, 4, 7], 3, TypeError, r"cu_seqlens_q: expected a NumPy or CuPy array"),
        (np.array([0, 3, 5], np.int64), np.array([0, 4, 7], np.int32), 3, TypeError, r"cu_seqlens_q: expected dtype"),
        (np.array([1, 3, 5], np.int32), np.array([0, 4, 7], np.int32), 3, ValueError, r"cu_seqlens_q: expected to start"),
        (np.array([0, 4, 3, 5], np.int32), np.array([0, 4, 6, 7], np.int32), 4, ValueError, r"non-decreasing"),
        (np.array([0, 3, 6], np.int32), np.array([0, 4, 7], np.int32), 3, ValueError, r"last offset .* 5, got 6"),
        (np.array([0, 3, 5], np.int32), np.array([0, 4, 7], np.int32), 2, ValueError, r"max_seqlen_q: 2 is less"),
        (np.array([0, 3, 5], np.int32), np.array([0, 7], np.int32), 3, ValueError, r"cu_seqlens_k: expected 3"),
        (np.array([[0, 3, 5]], np.int32), np.array([0, 4, 7], np.int32), 3, ValueError, r"expected a 1-D array"),
    ],
)
def test_varlen_offsets_are_checked(cu_q, cu_k, max_q, exc, match):
    gen = np.random.default_rng(0)
    q = gen.standard_normal((5, 2, 8)).astype(np.float32)
    k = gen.standard_normal((7, 2, 8)).astype(np.float32)
    with pytest.raises(exc, match=match):
        numba_flash.flash_attention_varlen(q, k, k, cu_q, cu_k, max_q, 7)
    out, lse = q[:, :, :8], np.zeros((2, 5), np.float32)
    with pytest.raises(exc, match=match):
        numba_flash.flash_attention_varlen_backward(q, q, k, k, out, lse, cu_q, cu_k, max_q, 7)

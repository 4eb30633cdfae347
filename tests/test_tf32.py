"""The opt-in TF32 tensor-core forward and backward (``allow_tf32=True``).

Tolerance, from a same-precision baseline (FlashAttention-2's convention): the kernel's
error against the exact float64 attention is at most twice the error of a float64
standard attention whose Q, K, V and P are rounded to TF32 as the kernel rounds them
(``reference.attention_tf32``), plus an fp32 floor of 1e-5 (fp32 accumulation and
``ex2.approx``; it matters when the baseline's error is tiny, e.g. a single key).  The
baseline error itself is a few 1e-4 relative: that is the precision ``allow_tf32`` buys.
The backward's dQ, dK, dV may have 3× the error of a float64 backward whose Q, K, V, dO,
P and dS are rounded to TF32 (``reference.attention_backward_tf32``), plus a floor of
1e-4, each normalised as ``numba-flash check`` does (by max |ref|, or 1e-3 of the case's
largest reference gradient when a gradient vanishes: a single key).

Inputs are fresh random numbers (the seed is in the failure message); every output the
API allocates is poisoned with NaN first, so an element the kernel forgets fails.
In the CUDA simulator the shapes are tiny (each launch takes seconds); the ``gpu`` cases
add real sizes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import numba_flash
from numba_flash import _arrays, reference
from numba_flash._numba_cuda import SIMULATOR

from conftest import family, host, make_qkv

FLOOR = 1e-5  # fp32 accumulation and ex2.approx, relative to max |ref|


pytestmark = pytest.mark.usefixtures("poisoned_outputs")


# (B, H, Nq, Nk, d, causal, layout): sizes that are multiples of no tile (the tiles are
# 64×64 at d = 64, 64×32 at d = 128), Nq != Nk both ways (causal with Nq > Nk leaves
# rows that see no key: O = 0, lse = -inf), several K/V tiles (the cp.async pipeline).
SIM_CASES = [
    (1, 1, 1, 1, 64, False, "bshd"),
    (1, 1, 17, 40, 64, True, "bshd"),
    (1, 2, 63, 17, 128, True, "bhsd"),
    (1, 1, 17, 63, 128, False, "bshd"),
    (2, 1, 9, 1, 64, True, "bhsd"),
    (1, 1, 33, 63, 128, True, "bhsd"),
]
GPU_CASES = [
    pytest.param(B, H, N, N, d, causal, layout, marks=pytest.mark.gpu)
    for N, B, H, layout in ((127, 2, 3, "bshd"), (1000, 2, 4, "bhsd"), (4096, 1, 2, "bshd"))
    for d in (64, 128)
    for causal in (False, True)
] + [
    pytest.param(2, 3, Nq, Nk, d, True, "bhsd", marks=pytest.mark.gpu)
    for Nq, Nk in ((1000, 1500), (1500, 1000))
    for d in (64, 128)
]


def case_id(case):
    values = case.values if hasattr(case, "values") else case
    B, H, Nq, Nk, d, causal, layout = values
    return f"B{B}H{H}-q{Nq}k{Nk}-d{d}-{'causal' if causal else 'full'}-{layout}"


@pytest.mark.parametrize(
    "B,H,Nq,Nk,d,causal,layout", SIM_CASES + GPU_CASES, ids=[case_id(c) for c in SIM_CASES + GPU_CASES]
)
def test_forward_tf32(B, H, Nq, Nk, d, causal, layout):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    q, k, v = make_qkv(np.random.default_rng(seed), B, H, Nq, Nk, d, layout)
    assert family("forward", q.dtype, d, True, allow_tf32=True) == "tensor-core-tf32"
    xp = np
    if not SIMULATOR:
        import cupy as xp
    out, lse = numba_flash.flash_attention(
        xp.asarray(q), xp.asarray(k), xp.asarray(v), causal=causal, return_lse=True, layout=layout, allow_tf32=True
    )
    assert out.dtype == np.float32 and out.shape == q.shape and lse.shape == (B, H, Nq)
    out, lse = host(out), host(lse)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout)
    base_out, base_lse = reference.attention_tf32(q, k, v, causal=causal, layout=layout)
    for name, got, ref, base in (("O", out, ref_out, base_out), ("LSE", lse, ref_lse, base_lse)):
        err, tol = reference.rel_error(got, ref), 2 * reference.rel_error(base, ref) + FLOOR
        assert err <= tol, f"{name}: rel error {err:.3g} > {tol:.3g} (2× the tf32 baseline + {FLOOR}), seed {seed}"
    if causal and Nq > Nk:  # rows that see no key
        blind = Nq - Nk
        rows = out[:, :blind] if layout == "bshd" else out[:, :, :blind]
        assert np.all(rows == 0) and np.all(np.isneginf(lse[..., :blind]))


def test_tf32_differs_from_exact_and_is_opt_in():
    """The default stays exact fp32 (1e-5); allow_tf32=True really rounds (its error is
    the tf32 baseline's, far above fp32 rounding)."""
    gen = np.random.default_rng(7)
    q, k, v = make_qkv(gen, 1, 1, 17, 23, 64, "bshd")
    ref_out, _ = reference.attention(q, k, v, layout="bshd")
    exact = numba_flash.flash_attention(q, k, v)
    tf32 = numba_flash.flash_attention(q, k, v, allow_tf32=True)
    assert reference.rel_error(exact, ref_out) <= 1e-5
    assert reference.rel_error(tf32, ref_out) > 1e-5  # 10-bit mantissas: ~1e-4 at least


def test_tf32_fallbacks():
    """allow_tf32 changes only float32 forwards at head dims 64/128 with 16-byte aligned
    rows; anything else runs what it ran before (the exact fp32 kernel here)."""
    assert family("forward", np.float32, 64, True) == "simt-fp32"  # default: exact
    assert family("forward", np.float32, 32, True, allow_tf32=True) == "simt-fp32"
    assert family("forward", np.float32, 64, False, allow_tf32=True) == "simt-fp32"
    assert family("forward", np.float16, 64, True, allow_tf32=True) == "tensor-core"
    assert family("backward", np.float32, 64, True) == "simt-fp32"
    assert family("backward", np.float32, 128, True, allow_tf32=True) == "tensor-core-tf32"
    assert family("backward", np.float32, 32, True, allow_tf32=True) == "simt-fp32"
    assert family("backward", np.float32, 64, False, allow_tf32=True) == "simt-fp32"
    assert family("backward", np.float16, 64, True, allow_tf32=True) == "tensor-core"
    gen = np.random.default_rng()
    packed = gen.standard_normal((1, 19, 2, 64 + 1)).astype(np.float32)
    k, v = packed[:, :, :1, 1:], packed[:, :, 1:, 1:]  # rows 4 bytes off a 16-byte boundary
    q = make_qkv(gen, 1, 1, 11, 19, 64, "bshd")[0]
    assert not _arrays.aligned16(k)
    out = numba_flash.flash_attention(q, k, v, causal=True, allow_tf32=True)
    ref_out, _ = reference.attention(q, k, v, causal=True, layout="bshd")
    assert reference.rel_error(out, ref_out) <= 1e-5  # the exact kernel ran


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_allow_tf32_must_be_bool(bad):
    q, k, v = make_qkv(np.random.default_rng(), 1, 1, 3, 4, 64, "bshd")
    with pytest.raises(TypeError, match=re.escape(f"allow_tf32: expected a bool, got {bad!r}")):
        numba_flash.flash_attention(q, k, v, allow_tf32=bad)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_backward_allow_tf32_must_be_bool(bad):
    q, k, v = make_qkv(np.random.default_rng(), 1, 1, 3, 4, 64, "bshd")
    out, lse = reference.attention(q, k, v, layout="bshd")
    out, lse = out.astype(np.float32), lse.astype(np.float32)
    with pytest.raises(TypeError, match=re.escape(f"allow_tf32: expected a bool, got {bad!r}")):
        numba_flash.flash_attention_backward(out, q, k, v, out, lse, allow_tf32=bad)


def test_reference_round_tf32():
    x = np.array([1.0, 1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), 3.0, np.inf, -np.inf], dtype=np.float32)
    want = np.array([1.0, 1 + 2**-10, 1.0, -(1 + 2**-10), 3.0, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(reference.round_tf32(x), want)  # nearest, ties away from zero
    assert np.isnan(reference.round_tf32(np.float32(np.nan)))
    r = reference.round_tf32(np.random.default_rng().standard_normal(1000).astype(np.float32))
    assert np.all(r.view(np.uint32) & 0x1FFF == 0)


@pytest.mark.parametrize("head_dim,causal", [(64, True), (128, False)])
def test_tf32_ptx(head_dim, causal):
    """``numba-flash inspect --tf32``: mma.sync m16n8k8 tf32, cvt.rna.tf32, cp.async,
    vector shared loads, and nothing in local memory."""
    from click.testing import CliRunner

    from numba_flash_cli.main import main

    args = ["inspect", "--pass", "forward", "--dtype", "float32", "--head-dim", str(head_dim), "--tf32",
            "--arch", "sm_90", "--ptx"] + (["--causal"] if causal else [])  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary, _, ptx = result.output.partition("// =====")
    assert "tensor-core-tf32" in summary and "tf32_forward" in summary
    assert re.search(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", ptx)
    assert "cvt.rna.tf32.f32" in ptx and "cp.async.cg.shared.global" in ptx and "ld.shared.v4.f32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


# --------------------------------------------------------------------------------------
# backward (flash_attention_backward(..., allow_tf32=True))
# --------------------------------------------------------------------------------------

BWD_FLOOR = 1e-4  # fp32 accumulation and ex2.approx, relative as in numba-flash check

# (B, H, Nq, Nk, d, causal, layout); tiles are 64 keys × 64 queries (dK/dV) and 64 × 64
# (dQ) at d = 64, 64 × 32 and 64 × 32 at d = 128, so these cross no tile boundary at
# d = 64 and one or two at d = 128 (the cp.async pipeline); causal Nq > Nk has rows
# that see no key (dQ = 0); one key (dQ, dK vanish: the zero-gradient normalisation).
SIM_BWD_CASES = [
    (1, 1, 1, 1, 64, False, "bshd"),
    (1, 1, 17, 40, 64, True, "bshd"),
    (2, 1, 9, 1, 64, True, "bhsd"),
    (1, 1, 63, 17, 128, True, "bhsd"),
    (1, 1, 17, 63, 128, False, "bshd"),
    (1, 1, 33, 63, 128, True, "bhsd"),
]
GPU_BWD_CASES = [
    pytest.param(B, H, N, N, d, causal, layout, marks=pytest.mark.gpu)
    for N, B, H, layout in ((127, 2, 3, "bshd"), (1000, 2, 4, "bhsd"), (4096, 1, 2, "bshd"))
    for d in (64, 128)
    for causal in (False, True)
] + [
    pytest.param(2, 3, Nq, Nk, d, causal, "bhsd", marks=pytest.mark.gpu)
    for Nq, Nk in ((1000, 1500), (1500, 1000))
    for d in (64, 128)
    for causal in (False, True)
]


def _backward_inputs(seed, B, H, Nq, Nk, d, causal, layout):
    """q, k, v, dout and the float64 forward's out, lse (as float32, as a forward returns)."""
    gen = np.random.default_rng(seed)
    q, k, v = make_qkv(gen, B, H, Nq, Nk, d, layout)
    dout = make_qkv(gen, B, H, Nq, Nq, d, layout)[0]
    out, lse = reference.attention(q, k, v, causal=causal, layout=layout)
    return q, k, v, dout, out.astype(np.float32), lse.astype(np.float32)


def _run_backward(q, k, v, dout, out, lse, causal, layout):
    xp = np
    if not SIMULATOR:
        import cupy as xp
    grads = numba_flash.flash_attention_backward(
        *(xp.asarray(x) for x in (dout, q, k, v, out, lse)), causal=causal, layout=layout, allow_tf32=True
    )
    return tuple(host(g) for g in grads)


@pytest.mark.parametrize(
    "B,H,Nq,Nk,d,causal,layout", SIM_BWD_CASES + GPU_BWD_CASES, ids=[case_id(c) for c in SIM_BWD_CASES + GPU_BWD_CASES]
)
def test_backward_tf32(B, H, Nq, Nk, d, causal, layout):
    from numba_flash.check import ZERO_REF_FLOOR, measured_error

    seed = int(np.random.SeedSequence().entropy % 2**32)
    q, k, v, dout, out, lse = _backward_inputs(seed, B, H, Nq, Nk, d, causal, layout)
    assert family("backward", q.dtype, d, True, allow_tf32=True) == "tensor-core-tf32"
    grads = _run_backward(q, k, v, dout, out, lse, causal, layout)
    kw = dict(causal=causal, layout=layout)
    refs = reference.attention_backward(dout, q, k, v, out, lse, **kw)
    bases = reference.attention_backward_tf32(dout, q, k, v, out, lse, **kw)
    floor = ZERO_REF_FLOOR * max(float(np.abs(r).max()) for r in refs)
    for name, got, ref, base, like in zip(("dQ", "dK", "dV"), grads, refs, bases, (q, k, v)):
        assert got.dtype == np.float32 and got.shape == like.shape
        err, base_err = measured_error(got, ref, floor)[1], measured_error(base, ref, floor)[1]
        tol = 3 * base_err + BWD_FLOOR
        assert err <= tol, f"{name}: rel error {err:.3g} > {tol:.3g} (3× the tf32 baseline + {BWD_FLOOR}), seed {seed}"
    if causal and Nq > Nk:  # rows that see no key contribute nothing and get dQ = 0
        blind = Nq - Nk
        rows = grads[0][:, :blind] if layout == "bshd" else grads[0][:, :, :blind]
        assert np.all(rows == 0)


# Determinism (bitwise, no atomics) of the TF32 backward: tests/test_determinism.py.


@pytest.mark.parametrize("head_dim,causal", [(64, False), (128, True)])
def test_tf32_backward_ptx(head_dim, causal):
    """``numba-flash inspect --pass backward --tf32``: the three kernels (the exact fp32
    preprocess, then dK/dV and dQ on mma.sync m16n8k8 tf32 with cvt.rna.tf32 operands),
    cp.async, vector shared loads, no local memory."""
    from click.testing import CliRunner

    from numba_flash_cli.main import main

    args = ["inspect", "--pass", "backward", "--dtype", "float32", "--head-dim", str(head_dim), "--tf32",
            "--arch", "sm_90", "--ptx"] + (["--causal"] if causal else [])  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary, _, ptx = result.output.partition("// =====")
    assert "tensor-core-tf32" in summary
    assert all(name in summary for name in ("simt_blocked_preprocess", "tf32_bwd_dkdv", "tf32_bwd_dq"))
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", ptx)) >= 2
    assert "cvt.rna.tf32.f32" in ptx and "cp.async.cg.shared.global" in ptx and "ld.shared.v4.f32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx and "atom." not in ptx

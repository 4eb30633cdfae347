"""Numerics every kernel family must get right, forward and backward, against the
float64 reference: a non-default ``softmax_scale``, non-finite inputs (NaN, +inf),
paths no other test reaches (row-group kernels above d = 64), and inputs that arrive
through DLPack (and, on a GPU, PyTorch, JAX and ``__cuda_array_interface__``).

The families (``numba_flash.plan``): fp16 and bf16 tensor cores, TF32 tensor cores
(float32 with ``allow_tf32=True``), the register-blocked fp32 kernels (float32 at
d = 64/128), the row-group fp32 kernels (other head dims), and fp16 at a head dim
padded up to the tensor-core tiles (40 on the tiles of 64).

Tolerances: exact fp32 1e-5 (O, LSE) / 1e-4 (gradients); fp16/bf16 2× / 3× the error
of the same-dtype standard attention + 1e-5 (``test_kernels.half_bound``), LSE 1e-5
(float32); TF32 2× / 3× the TF32 baseline + the fp32 bound (as tests/test_tf32.py).
Inputs are fresh random numbers (the seed is in failure messages); outputs the API
allocates start as NaN.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import numba_flash
from numba_flash import _arrays, reference
from numba_flash._numba_cuda import SIMULATOR
from numba_flash.check import ZERO_REF_FLOOR, measured_error

from conftest import device, host, launch_names
from test_kernels import half_bound

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BF16 = _arrays.BFLOAT16
FP32_TOL = {"out": 1e-5, "lse": 1e-5, "dq": 1e-4, "dk": 1e-4, "dv": 1e-4}
GRADS = ("dq", "dk", "dv")

# name: (dtype, head dim, allow_tf32, the forward kernel the plan launches)
FAMILIES = {
    "tc-fp16": (np.float16, 64, False, "tc_forward"),
    "tc-bf16": (BF16, 128, False, "tc_forward"),
    "tf32": (np.float32, 64, True, "tf32_forward"),
    "fp32-blocked": (np.float32, 64, False, "simt_blocked_forward"),
    "fp32-rowgroup": (np.float32, 32, False, "simt_forward"),
    "tc-fp16-d40": (np.float16, 40, False, "tc_forward"),
}


def mode_of(name):
    dtype, _, tf32, _ = FAMILIES[name]
    return "tf32" if tf32 else _arrays.dtype_name(dtype)


def bound(mode, output, base):
    """The largest relative error allowed (see the module docstring)."""
    if mode == "float32" or (output == "lse" and mode != "tf32"):
        return FP32_TOL[output]
    factor = 2 if output in ("out", "lse") else 3
    if mode == "tf32":
        return factor * base + FP32_TOL[output]
    return half_bound(factor, base)


def baselines(mode, q, k, v, dout, **kw):
    """The same-precision standard attention's (out, lse) and (dq, dk, dv), each from
    its own forward (None for exact fp32)."""
    if mode == "float32":
        return None, None
    if mode == "tf32":
        out, lse = reference.attention_tf32(q, k, v, **kw)
        return (out, lse), reference.attention_backward_tf32(dout, q, k, v, out, lse, **kw)
    out, lse = reference.attention_lowp(q, k, v, dtype=q.dtype, **kw)
    return (out, lse), reference.attention_backward_lowp(dout, q, k, v, out, lse, dtype=q.dtype, **kw)


def inputs(seed, B, H, Nq, Nk, d, dtype, layout="bshd"):
    gen = np.random.default_rng(seed)

    def one(n):
        shape = (B, n, H, d) if layout == "bshd" else (B, H, n, d)
        return gen.standard_normal(shape).astype(dtype)

    return one(Nq), one(Nk), one(Nk), one(Nq)


def run_both(q, k, v, dout, tf32, **kw):
    """The API's forward, then its backward on the forward's own out and lse (host)."""
    out, lse = numba_flash.flash_attention(*(device(x) for x in (q, k, v)), return_lse=True, allow_tf32=tf32, **kw)
    grads = numba_flash.flash_attention_backward(*(device(x) for x in (dout, q, k, v)), out, lse, allow_tf32=tf32, **kw)
    return host(out), host(lse), tuple(host(g) for g in grads)


def check_all(mode, got, q, k, v, dout, seed, **kw):
    """Every output of ``got = (out, lse, (dq, dk, dv))`` against the reference."""
    out, lse, grads = got
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    ref_grads = reference.attention_backward(dout, q, k, v, ref_out, ref_lse, **kw)
    base_fwd, base_grads = baselines(mode, q, k, v, dout, **kw)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), f"LSE -inf pattern, seed {seed}"
    for i, (name, x, ref) in enumerate((("out", out, ref_out), ("lse", lse, ref_lse))):
        base = None if base_fwd is None else measured_error(base_fwd[i], ref)[1]
        err, tol = reference.rel_error(x, ref), bound(mode, name, base)
        assert err <= tol, f"{mode} {name}: rel error {err:.3g} > {tol:.3g} (baseline {base}), seed {seed}"
    floor = ZERO_REF_FLOOR * max(float(np.abs(g).max()) for g in ref_grads)
    for i, (name, x, ref) in enumerate(zip(GRADS, grads, ref_grads)):
        base = None if base_grads is None else measured_error(base_grads[i], ref, floor)[1]
        err, tol = measured_error(x, ref, floor)[1], bound(mode, name, base)
        assert err <= tol, f"{mode} {name}: rel error {err:.3g} > {tol:.3g} (baseline {base}), seed {seed}"


def new_seed():
    return int(np.random.SeedSequence().entropy % 2**32)


# --- 1. softmax_scale ----------------------------------------------------------------

# (family, scale, B, H, Nq, Nk, causal, layout): 0.3 (a flatter softmax than the default
# 1/sqrt(d)) and 2.5 (a sharp one: scores ~10) on every family; causal with Nq > Nk
# (rows without keys) for one scale, Nq < Nk for the other
SCALE_SIM = [
    pytest.param(fam, scale, 1, 1, Nq, Nk, causal, layout, id=f"{fam}-{scale}")
    for fam in FAMILIES
    for scale, Nq, Nk, causal, layout in ((0.3, 20, 13, True, "bshd"), (2.5, 9, 21, False, "bhsd"))
]
SCALE_GPU = [
    pytest.param(fam, scale, 2, 4, Nq, Nk, causal, "bshd", marks=pytest.mark.gpu, id=f"{fam}-{scale}-gpu")
    for fam in FAMILIES
    for scale, Nq, Nk, causal in ((0.3, 1000, 700, True), (2.5, 700, 1500, False))
]


@pytest.mark.parametrize("fam,scale,B,H,Nq,Nk,causal,layout", SCALE_SIM + SCALE_GPU)
def test_softmax_scale(fam, scale, B, H, Nq, Nk, causal, layout):
    dtype, d, tf32, kernel = FAMILIES[fam]
    names = launch_names("forward", _arrays.dtype_name(dtype), d, causal, allow_tf32=tf32, simulator=SIMULATOR)
    assert names == [kernel]
    seed = new_seed()
    q, k, v, dout = inputs(seed, B, H, Nq, Nk, d, dtype, layout)
    kw = dict(causal=causal, softmax_scale=scale, layout=layout)
    got = run_both(q, k, v, dout, tf32, **kw)
    check_all(mode_of(fam), got, q, k, v, dout, seed, **kw)
    # the scale really is used: the default scale gives another answer
    default, _ = reference.attention(q, k, v, causal=causal, layout=layout)
    assert reference.rel_error(got[0], default) > 1e-2, seed


# --- 2. non-finite inputs ------------------------------------------------------------

def nonfinite_inputs(seed, Nq, Nk, d, dtype, forward):
    """q, k, v, dout (B = 1, H = 2, bshd) for causal attention with Nq > Nk (rows
    0 .. Nq − Nk − 1 see no key).  Head 0: a NaN in q row r = Nq − Nk + 4 (it sees
    keys 0..4).  Head 1: +inf in K[j0 = Nk − 4, c], seen by rows Nq − 4 ..; rows
    Nq − 3 .. have q[·, c] < 0 (a −inf score: key j0 drops out of their softmax).
    ``forward``: also a NaN in q row 2 of head 0 (a row that sees no key: it must stay
    O = 0, lse = −inf), and row Nq − 4 of head 1 has q[·, c] > 0 (a +inf score: a NaN
    row); for the backward that row is negative too, so that head 1 has no NaN row
    (a NaN row makes every dK, dV of its head NaN in the dense reference)."""
    q, k, v, dout = inputs(seed, 1, 2, Nq, Nk, d, dtype)
    blind, c, j0 = Nq - Nk, 5, Nk - 4
    q[0, blind + 4, 0, 3] = np.nan
    k[0, j0, 1, c] = np.inf
    q[0, Nq - 4 :, 1, c] = -np.abs(q[0, Nq - 4 :, 1, c]) - 0.5
    if forward:
        q[0, 2, 0, 7] = np.nan
        q[0, Nq - 4, 1, c] = -q[0, Nq - 4, 1, c]
    return q, k, v, dout


def rows_nan(x):
    """(head, row) pairs with any NaN: x is (1, N, H, d) or lse (1, H, N)."""
    bad = np.isnan(x).any(axis=-1)[0] if x.ndim == 4 else np.isnan(x)[0].T
    return sorted((int(h), int(r)) for r, h in zip(*np.nonzero(bad)))


def finite_rel_error(x, ref, mask, floor=0.0):
    """max |x − ref| over ``mask`` / max(max |ref| over mask, floor)."""
    diff = np.abs(x.astype(np.float64) - ref)[mask]
    denom = max(float(np.abs(ref[mask]).max()) if mask.any() else 0.0, floor, 1e-300)
    return float(diff.max()) / denom if diff.size else 0.0


NONFINITE_SIM = [pytest.param(fam, 24, 16, id=fam) for fam in FAMILIES]
NONFINITE_GPU = [pytest.param(fam, 600, 400, marks=pytest.mark.gpu, id=f"{fam}-gpu") for fam in FAMILIES]


@pytest.mark.parametrize("fam,Nq,Nk", NONFINITE_SIM + NONFINITE_GPU)
def test_nonfinite_forward(fam, Nq, Nk):
    """O and LSE are NaN exactly on the rows the float64 reference makes NaN (a NaN in
    a q row, a +inf score), finite and correct elsewhere (a −inf score is a masked
    key), and rows without keys stay O = 0, lse = −inf even with a NaN in q."""
    dtype, d, tf32, _ = FAMILIES[fam]
    mode, seed = mode_of(fam), new_seed()
    kw = dict(causal=True, layout="bshd")
    blind = Nq - Nk
    q, k, v, dout = nonfinite_inputs(seed, Nq, Nk, d, dtype, forward=True)
    out, lse = numba_flash.flash_attention(*(device(x) for x in (q, k, v)), return_lse=True, allow_tf32=tf32, **kw)
    out, lse = host(out), host(lse)
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    want_nan = [(0, blind + 4), (1, Nq - 4)]
    assert rows_nan(ref_out) == rows_nan(ref_lse) == want_nan  # the reference's own semantics
    assert rows_nan(out) == want_nan, f"O NaN rows {rows_nan(out)}, expected {want_nan}, seed {seed}"
    assert rows_nan(lse) == want_nan, f"LSE NaN rows {rows_nan(lse)}, expected {want_nan}, seed {seed}"
    assert np.all(out[0, :blind] == 0) and np.all(np.isneginf(lse[0, :, :blind])), f"rows without keys, seed {seed}"
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert np.all(np.isfinite(out[~np.isnan(ref_out)])) and not np.isposinf(lse).any()
    base_fwd, _ = baselines(mode, q, k, v, dout, **kw)
    for i, (name, x, ref) in enumerate((("out", out, ref_out), ("lse", lse, ref_lse))):
        mask = np.isfinite(ref)
        base = None if base_fwd is None else finite_rel_error(base_fwd[i], ref, mask)
        err, tol = finite_rel_error(x, ref, mask), bound(mode, name, base)
        assert err <= tol, f"{mode} {name} on finite rows: {err:.3g} > {tol:.3g}, seed {seed}"


@pytest.mark.parametrize("fam,Nq,Nk", NONFINITE_SIM + NONFINITE_GPU)
def test_nonfinite_backward(fam, Nq, Nk):
    """On the reference's out and lse (NaN rows included): wherever the dense reference
    is finite the kernels are finite and correct; where it is NaN they may be finite
    (tiles a row cannot see are skipped: fewer NaNs, never more).  The dense
    reference: head 0's NaN q row makes P NaN on its whole row (masked entries too:
    exp(−inf − NaN)), so every dK, dV of head 0 is NaN and dQ is NaN on that row only;
    head 1's +inf in K[j0, c] meets dS = 0 (a −inf or masked score) in dS·K, so dQ[:, c]
    is NaN on every row, while dK, dV are finite, and 0 for key j0 (the padding rows of
    a partial query tile, zero-filled, make 0 · inf = NaN scores against it: the
    dK/dV kernels must drop them, ``softmax.softmax_grad``'s ``keep``)."""
    dtype, d, tf32, _ = FAMILIES[fam]
    mode, seed = mode_of(fam), new_seed()
    kw = dict(causal=True, layout="bshd")
    blind, c, j0 = Nq - Nk, 5, Nk - 4
    q, k, v, dout = nonfinite_inputs(seed, Nq, Nk, d, dtype, forward=False)
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    assert rows_nan(ref_out) == [(0, blind + 4)]
    o_in, l_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_backward(
        *(device(x) for x in (dout, q, k, v, o_in, l_in)), allow_tf32=tf32, **kw
    )
    grads = [host(g) for g in grads]
    refs = reference.attention_backward(dout, q, k, v, o_in, l_in, **kw)
    if mode == "float32":
        bases = None
    elif mode == "tf32":
        bases = reference.attention_backward_tf32(dout, q, k, v, o_in, l_in, **kw)
    else:
        bases = reference.attention_backward_lowp(dout, q, k, v, o_in, l_in, dtype=dtype, **kw)
    floor = ZERO_REF_FLOOR * max(float(np.abs(r[np.isfinite(r)]).max()) for r in refs)
    want = {"dq": np.ones(q.shape, bool), "dk": np.ones(k.shape, bool), "dv": np.ones(v.shape, bool)}
    want["dq"][0, blind + 4, 0] = want["dq"][0, :, 1, c] = False
    want["dk"][0, :, 0] = want["dv"][0, :, 0] = False
    extra = {}
    for i, (name, x, ref) in enumerate(zip(GRADS, grads, refs)):
        mask = np.isfinite(ref)
        assert np.array_equal(mask, want[name]), f"the reference's {name} NaN pattern changed"
        bad = mask & ~np.isfinite(x)
        assert not bad.any(), f"{mode} {name}: {int(bad.sum())} non-finite where the reference is finite, seed {seed}"
        check = mask
        base = None if bases is None else finite_rel_error(bases[i], ref, check & np.isfinite(bases[i]), floor)
        err, tol = finite_rel_error(x, ref, check, floor), bound(mode, name, base)
        assert err <= tol, f"{mode} {name} where finite: {err:.3g} > {tol:.3g}, seed {seed}"
        extra[name] = f"{int((~mask & np.isfinite(x)).sum())}/{int((~mask).sum())}"
    # where the reference is NaN the kernels may be finite (fewer NaNs): what they give
    print(f"\n{fam}: kernel-finite / reference-NaN elements: {extra}")
    assert np.all(grads[1][0, j0, 1] == 0) and np.all(grads[2][0, j0, 1] == 0)  # key j0 got weight 0


def test_inf_key_with_partial_query_tile():
    """A defect found by these tests, in its smallest form (row-group fp32, d = 32, no
    mask): every score against key 0 is −inf (+inf in K, q < 0 in that column), so key
    0 has weight 0 and the reference's dK[0] = dV[0] = 0.  The kernels gave NaN whenever
    seqlen_q did not fill the last query tile (17 here): the zero-filled padding rows
    make 0 · inf = NaN scores; the dK/dV kernels now drop padding rows exactly.  The
    reference's dQ[:, 0] is NaN (0 · inf in dS·K), the kernels' too."""
    Nq = 17
    gen = np.random.default_rng(0)
    q, k, v, dout = (gen.standard_normal((1, n, 1, 32)).astype(np.float32) for n in (Nq, 5, 5, Nq))
    k[0, 0, 0, 0] = np.inf
    q[0, :, 0, 0] = -np.abs(q[0, :, 0, 0]) - 0.5
    out, lse = reference.attention(q, k, v)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    _, dk, dv = (host(g) for g in numba_flash.flash_attention_backward(
        dout, q, k, v, out.astype(np.float32), lse.astype(np.float32)))  # fmt: skip
    assert np.isfinite(dk).all() and np.isfinite(dv).all()
    assert np.all(dk[0, 0] == 0) and np.all(dv[0, 0] == 0)


# --- 3. paths no other test reaches ---------------------------------------------------


@pytest.mark.parametrize(
    "d,Nq,Nk,causal",
    [(96, 9, 21, True), (256, 13, 6, False), pytest.param(136, 7, 40, True, marks=pytest.mark.skipif(
        SIMULATOR, reason="a third row-group width above 64: GPU only (simulator time)")),
     pytest.param(256, 700, 900, True, marks=pytest.mark.gpu)],
)  # fmt: skip
def test_row_group_above_64(d, Nq, Nk, causal):
    """float32 at head dims above 64 other than 128 runs the row-group kernels (one
    lane a column group, K/V tiles of 32 keys at d <= 128 and 16 beyond)."""
    assert launch_names("forward", "float32", d) == ["simt_forward"]
    assert launch_names("backward", "float32", d)[-1].startswith("simt_bwd")
    seed = new_seed()
    q, k, v, dout = inputs(seed, 1, 1, Nq, Nk, d, np.float32)
    kw = dict(causal=causal, layout="bshd")
    check_all("float32", run_both(q, k, v, dout, False, **kw), q, k, v, dout, seed, **kw)


class HostDLPack:
    """A host array reachable only through DLPack (not an ndarray, no
    ``__cuda_array_interface__``), as a CPU tensor of another library."""

    def __init__(self, a):
        self._a = a
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_host_inputs():
    """q, k, v, dout, out and lse handed over through ``__dlpack__`` only: NumPy comes
    back, forward and backward match the reference, the inputs are untouched."""
    seed = new_seed()
    q, k, v, dout = inputs(seed, 1, 1, 11, 17, 32, np.float32, "bhsd")
    before = [x.copy() for x in (q, k, v)]
    kw = dict(causal=True, layout="bhsd")
    out, lse = numba_flash.flash_attention(*(HostDLPack(x) for x in (q, k, v)), return_lse=True, **kw)
    assert type(out) is np.ndarray and type(lse) is np.ndarray and out.shape == q.shape
    grads = numba_flash.flash_attention_backward(*(HostDLPack(x) for x in (dout, q, k, v, out, lse)), **kw)
    assert all(type(g) is np.ndarray for g in grads)
    check_all("float32", (out, lse, grads), q, k, v, dout, seed, **kw)
    for x, b in zip((q, k, v), before):
        np.testing.assert_array_equal(x, b)


# --- on a GPU: PyTorch, JAX and __cuda_array_interface__ inputs ------------------------

TORCH_DTYPES = ["float32", "float16", "bfloat16"]


def _np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def _forward_backward_from_framework(dtype_name, device_arrays, host_arrays, seed, **kw):
    """Forward and backward on a framework's GPU arrays (q, k, v, dout), checked against
    the reference on the same values held on the host; returns (out, lse) as CuPy arrays."""
    import cupy as cp

    tq, tk, tv, tdo = device_arrays
    out, lse = numba_flash.flash_attention(tq, tk, tv, return_lse=True, **kw)
    assert isinstance(out, cp.ndarray) and out.dtype == _np_dtype(dtype_name)
    grads = numba_flash.flash_attention_backward(tdo, tq, tk, tv, out, lse, **kw)
    check_all(dtype_name, (cp.asnumpy(out), cp.asnumpy(lse), tuple(cp.asnumpy(g) for g in grads)),
              *host_arrays, seed, **kw)  # fmt: skip
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", TORCH_DTYPES)
def test_torch_tensors_forward_and_backward(dtype_name):
    """Real PyTorch CUDA tensors (DLPack; bf16 through ``__cuda_array_interface__``
    as raw words): CuPy comes back; forward and backward match the reference; a tensor
    that requires grad is refused with a TypeError naming ``.detach()``."""
    torch = pytest.importorskip("torch", reason="PyTorch is installed on the GPU machine only")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    seed = new_seed()
    dt = _np_dtype(dtype_name)
    q, k, v, dout = inputs(seed, 2, 3, 300, 500, 64, dt)
    # torch reads no ml_dtypes array: bf16 goes over as int16 words, viewed back on the GPU
    tq, tk, tv, tdo = (torch.from_numpy(x.view(np.int16) if dt == BF16 else x).cuda() for x in (q, k, v, dout))
    if dt == BF16:
        tq, tk, tv, tdo = (t.view(torch.bfloat16) for t in (tq, tk, tv, tdo))
    kw = dict(causal=True, layout="bshd")
    out, lse = _forward_backward_from_framework(dtype_name, (tq, tk, tv, tdo), (q, k, v, dout), seed, **kw)
    grad_q, grad_v = tq.clone().requires_grad_(True), tv.clone().requires_grad_(True)
    for name, args in (("q", (grad_q, tk, tv)), ("v", (tq, tk, grad_v))):
        with pytest.raises(TypeError, match=rf"{name}: a tensor that requires grad; pass {name}\.detach\(\)"):
            numba_flash.flash_attention(*args, **kw)
    with pytest.raises(TypeError, match=r"dout: a tensor that requires grad; pass dout\.detach\(\)"):
        numba_flash.flash_attention_backward(tdo.clone().requires_grad_(True), tq, tk, tv, out, lse, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", TORCH_DTYPES)
def test_jax_arrays_forward_and_backward(dtype_name):
    """JAX arrays on the GPU reach the API through DLPack (they have no
    ``__cuda_array_interface__``)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to CuPy
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    seed = new_seed()
    dt = _np_dtype(dtype_name)
    q, k, v, dout = inputs(seed, 2, 3, 300, 500, 128, dt)
    jq, jk, jv, jdo = (jax.device_put(jnp.asarray(x), jax.devices("gpu")[0]) for x in (q, k, v, dout))
    _forward_backward_from_framework(dtype_name, (jq, jk, jv, jdo), (q, k, v, dout), seed,
                                     causal=True, layout="bshd")  # fmt: skip


class DeviceCAI:
    """A device array reachable only through ``__cuda_array_interface__`` (as numba's
    device arrays and many older libraries are)."""

    def __init__(self, a):
        self._a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__
        self.shape, self.dtype = a.shape, a.dtype


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_cuda_array_interface_inputs(dtype_name):
    import cupy as cp

    seed = new_seed()
    q, k, v, dout = inputs(seed, 1, 2, 257, 300, 64, np.dtype(dtype_name))
    dq_, dk_, dv_, ddo = (cp.asarray(x) for x in (q, k, v, dout))
    kw = dict(causal=False, layout="bshd")
    out, lse = numba_flash.flash_attention(*(DeviceCAI(x) for x in (dq_, dk_, dv_)), return_lse=True, **kw)
    assert isinstance(out, cp.ndarray)
    grads = numba_flash.flash_attention_backward(*(DeviceCAI(x) for x in (ddo, dq_, dk_, dv_, out, lse)), **kw)
    check_all(dtype_name, (cp.asnumpy(out), cp.asnumpy(lse), tuple(cp.asnumpy(g) for g in grads)),
              q, k, v, dout, seed, **kw)  # fmt: skip

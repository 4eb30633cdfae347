"""Bad input gets a ValueError or TypeError naming the argument, the value and what was
expected: never a numba typing error, a CUDA error or a silent wrong answer.  None of
these launches a kernel."""

from __future__ import annotations

import re

import numpy as np
import pytest

import numba_flash
from numba_flash import reference as R


class GradTensor:
    """A stand-in for a torch CUDA tensor with requires_grad=True: both interfaces
    raise torch's RuntimeError, so they must not be touched."""

    __module__ = "torch"

    def __init__(self, a):
        self.shape, self.dtype, self.requires_grad = a.shape, a.dtype, True

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")

    def __dlpack__(self, **kwargs):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

    def __dlpack_device__(self):
        return (2, 0)


def qkv(B=1, Nq=5, Nk=7, H=2, d=16, dtype=np.float32):
    rng = np.random.default_rng()
    return (
        rng.standard_normal((B, Nq, H, d)).astype(dtype),
        rng.standard_normal((B, Nk, H, d)).astype(dtype),
        rng.standard_normal((B, Nk, H, d)).astype(dtype),
    )


def fwd_case(name):
    q, k, v = qkv()
    cases = {
        "ndim": ((q[0], k, v), {}, ValueError, r"q: expected a 4-D array .*ndim=3"),
        "list": ((q.tolist(), k, v), {}, TypeError, r"q: expected a NumPy or CuPy array"),
        "int dtype": ((q, k.astype(np.int32), v), {}, TypeError, r"k: dtype int32 is not supported"),
        "float64": ((q.astype(np.float64), k, v), {}, TypeError, r"q: dtype float64 is not supported"),
        "mixed dtype": ((q, k, v.astype(np.float16)), {}, TypeError, r"v: dtype float16 differs from q's float32"),
        "batch": ((q, np.concatenate([k, k]), v), {}, ValueError, r"k, v: batch .* must equal q's 1, got 2"),
        "heads": ((q, np.concatenate([k, k[:, :, :1]], 2), np.concatenate([v, v[:, :, :1]], 2)), {}, ValueError,
                  r"k, v: heads .* must divide q's 2 \(grouped-query attention.*got 3"),
        "v heads": ((q, k, v[:, :, :1]), {}, ValueError, r"v: heads .* must equal k's 2, got 1"),
        "head dim": ((q, k[..., :8], v[..., :8]), {}, ValueError, r"k, v: head dim .* must equal q's 16, got 8"),
        "v seqlen": ((q, k, v[:, :3]), {}, ValueError, r"v: seqlen .* must equal k's 7, got 3"),
        "big head dim": (qkv(d=264), {}, ValueError, r"q: head dim 264 is not supported; expected 1 to 256"),
        "big head dim, empty": ((q[:, :0, :, :1].repeat(264, 3), k[..., :1].repeat(264, 3), v[..., :1].repeat(264, 3)),
                                {}, ValueError, r"q: head dim 264 is not supported"),
        "last stride": ((q[..., ::2], k[..., ::2], v[..., ::2]), {}, ValueError,
                        r"q: the last axis must be contiguous"),
        "layout": ((q, k, v), {"layout": "sbhd"}, ValueError, r"layout: expected 'bshd' or 'bhsd', got 'sbhd'"),
        "layout array": ((q, k, v), {"layout": np.array(["bshd"])}, TypeError,
                         r"layout: expected a str, 'bshd' or 'bhsd', got numpy.ndarray"),
        "causal": ((q, k, v), {"causal": "yes"}, TypeError, r"causal: expected a bool, got 'yes'"),
        "causal array": ((q, k, v), {"causal": np.array([True, False])}, TypeError,
                         r"causal: expected a bool, got array\(\[ True, False\]\)"),
        "allow_tf32 array": ((q, k, v), {"allow_tf32": np.array(True)}, TypeError,
                             r"allow_tf32: expected a bool, got array\(True\)"),
        "scale type": ((q, k, v), {"softmax_scale": "0.1"}, TypeError, r"softmax_scale: expected a real number"),
        "scale nan": ((q, k, v), {"softmax_scale": float("nan")}, ValueError, r"softmax_scale: expected a finite"),
        "scale inf": ((q, k, v), {"softmax_scale": -float("inf")}, ValueError,
                      r"softmax_scale: expected a finite number in the float32 range .*got -inf"),
        "scale beyond float32": ((q, k, v), {"softmax_scale": 1e39}, ValueError,
                                 r"softmax_scale: expected a finite number in the float32 range "
                                 r"\(\|scale\| <= 3\.4e38\), got 1e\+39"),
        "scale beyond float64": ((q, k, v), {"softmax_scale": 10**400}, ValueError,
                                 r"softmax_scale: expected a finite number in the float32 range .*got 1000"),
        "requires grad": ((q, k, GradTensor(v)), {}, TypeError,
                          r"v: a tensor that requires grad; pass v\.detach\(\)"),
    }  # fmt: skip
    return cases[name]


FWD_NAMES = [
    "ndim", "list", "int dtype", "float64", "mixed dtype", "batch", "heads", "v heads", "head dim",
    "v seqlen", "big head dim", "big head dim, empty", "last stride", "layout",
    "layout array", "causal", "causal array", "allow_tf32 array", "scale type", "scale nan",
    "scale inf", "scale beyond float32", "scale beyond float64", "requires grad",
]  # fmt: skip


@pytest.mark.parametrize("name", FWD_NAMES)
def test_forward_rejects(name):
    args, kwargs, exc, pattern = fwd_case(name)
    copies = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(exc, match=pattern):
        numba_flash.flash_attention(*args, **kwargs)
    for a, c in zip(args, copies):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, c)


def test_bhsd_messages_name_the_right_axes():
    q, k, v = (x.transpose(0, 2, 1, 3) for x in qkv())
    with pytest.raises(ValueError, match=re.escape("v: seqlen (axis 2) must equal k's 7, got 3")):
        numba_flash.flash_attention(q, k, v[:, :, :3], layout="bhsd")


@pytest.mark.parametrize(
    "which,mutate,exc,pattern",
    [
        ("dout", lambda a: a[:, :3], ValueError, r"dout: shape \(1, 3, 2, 16\) must equal q's \(1, 5, 2, 16\)"),
        ("out", lambda a: a.astype(np.float16), TypeError, r"out: dtype float16 must equal q's float32"),
        ("lse", lambda a: a[..., :4], ValueError, r"lse: expected shape \(batch, heads, seqlen_q\) = \(1, 2, 5\)"),
        ("lse", lambda a: a.astype(np.float64), TypeError, r"lse: expected dtype float32, got float64"),
        ("dout", lambda a: a[0], ValueError, r"dout: expected a 4-D array"),
        ("lse", lambda a: "lse", TypeError, r"lse: expected a NumPy or CuPy array"),
        ("lse", GradTensor, TypeError, r"lse: a tensor that requires grad; pass lse\.detach\(\)"),
        ("dout", GradTensor, TypeError, r"dout: a tensor that requires grad; pass dout\.detach\(\)"),
    ],
)
def test_backward_rejects(which, mutate, exc, pattern):
    q, k, v = qkv()
    args = {
        "dout": np.ones_like(q) * 0.5,
        "out": np.ones_like(q) * 0.25,
        "lse": np.ones((1, 2, 5), np.float32),
    }
    args[which] = mutate(args[which])
    with pytest.raises(exc, match=pattern):
        numba_flash.flash_attention_backward(args["dout"], q, k, v, args["out"], args["lse"])


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        ({"causal": np.array(True)}, TypeError, r"causal: expected a bool, got array\(True\)"),
        ({"allow_tf32": "no"}, TypeError, r"allow_tf32: expected a bool, got 'no'"),
        ({"layout": np.array("bshd")}, TypeError, r"layout: expected a str"),
        ({"softmax_scale": 1e39}, ValueError, r"softmax_scale: expected a finite number in the float32 range"),
        ({"softmax_scale": 10**400}, ValueError, r"softmax_scale: expected a finite number in the float32 range"),
    ],
)
def test_backward_rejects_arguments(kwargs, exc, pattern):
    q, k, v = qkv()
    with pytest.raises(exc, match=pattern):
        numba_flash.flash_attention_backward(np.ones_like(q), q, k, v, np.ones_like(q), np.ones((1, 2, 5), np.float32),
                                             **kwargs)  # fmt: skip


def test_big_endian_float32_is_accepted_and_left_alone():
    """NumPy '>f4' arrays: taken as native copies (a bit-identical answer), the
    caller's arrays not modified, outputs native float32."""
    q, k, v = qkv(Nk=5)
    big = [x.astype(">f4") for x in (q, k, v)]
    copies = [x.copy() for x in big]
    out, lse = numba_flash.flash_attention(*big, return_lse=True)
    assert out.dtype == np.float32 and out.dtype.isnative and lse.dtype.isnative
    ref_out, ref_lse = R.attention(q, k, v, layout="bshd")
    assert R.rel_error(out, ref_out) <= 1e-5 and R.rel_error(lse, ref_lse) <= 1e-5
    for x, c in zip(big, copies):
        assert x.dtype == np.dtype(">f4")
        np.testing.assert_array_equal(x, c)


# --- needs api.py wiring: the API calls these _arrays checks --------------------------------


@pytest.mark.parametrize("value", ["yes", 1, np.array([True])])
def test_return_lse_must_be_a_bool(value):
    """needs api.py wiring: ``A.check_flag("return_lse", return_lse)``."""
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"return_lse: expected a bool, got "):
        numba_flash.flash_attention(q, k, v, return_lse=value)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_no_gpu_and_no_simulator_is_one_clear_error(monkeypatch, which):
    """needs api.py wiring: ``A.require_runtime()`` first thing in both entry points.
    (The suite runs in the simulator or on a GPU; this pretends neither is there.)"""
    from numba_flash import _numba_cuda

    monkeypatch.setattr(_numba_cuda, "SIMULATOR", False)
    monkeypatch.setattr(_numba_cuda, "gpu_available", lambda: False)
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"^no CUDA GPU found \(.*\); set NUMBA_ENABLE_CUDASIM=1 before importing "
                       r"numba .* or use numba_flash\.reference"):  # fmt: skip
        if which == "forward":
            numba_flash.flash_attention(q, k, v)
        else:
            numba_flash.flash_attention_backward(q, q, k, v, q, np.zeros((1, 2, 5), np.float32))


ZERO_SIZES = {  # (B, Nq, Nk, H)
    "batch 0": (0, 5, 7, 2),
    "heads 0": (1, 5, 7, 0),
    "seqlen_q 0": (1, 0, 7, 2),
    "seqlen_k 0": (1, 5, 0, 2),
}


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("name", list(ZERO_SIZES))
def test_zero_size_forward(name, layout):
    """needs api.py wiring (no launch for an empty grid; Nk = 0 filled without a kernel):
    empty outputs, and for seqlen_k = 0 a zero output and lse = -inf, as torch SDPA."""
    B, Nq, Nk, H = ZERO_SIZES[name]
    q, k, v = qkv(B=B, Nq=Nq, Nk=Nk, H=H)
    if layout == "bhsd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    for causal in (False, True):
        out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (B, H, Nq) and lse.dtype == np.float32
        if Nk == 0:
            assert np.all(out == 0) and np.all(np.isneginf(lse))
        ref_out, ref_lse = R.attention(q, k, v, causal=causal, layout=layout)
        assert R.max_abs_error(out, ref_out) == 0 and R.max_abs_error(lse, ref_lse) == 0


@pytest.mark.parametrize("name", list(ZERO_SIZES))
def test_zero_size_backward(name):
    """needs api.py wiring: gradients of the shapes of q, k, v; zero where there is
    nothing to differentiate (no keys, or no queries)."""
    B, Nq, Nk, H = ZERO_SIZES[name]
    q, k, v = qkv(B=B, Nq=Nq, Nk=Nk, H=H)
    dout = np.ones_like(q)
    out = np.zeros_like(q)
    lse = np.full((B, H, Nq), -np.inf, np.float32)
    dq, dk, dv = numba_flash.flash_attention_backward(dout, q, k, v, out, lse)
    for g, x in zip((dq, dk, dv), (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        assert np.all(g == 0)

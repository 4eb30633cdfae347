"""Bad input gets a ValueError or TypeError naming the argument, the value and what was
expected: never a numba typing error, a CUDA error or a silent wrong answer.  None of
these launches a kernel."""

from __future__ import annotations

import re

import numpy as np
import pytest

import numba_flash


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
        "heads": ((q, k[:, :, :1], v[:, :, :1]), {}, ValueError, r"k, v: heads .* must equal q's 2, got 1"),
        "head dim": ((q, k[..., :8], v[..., :8]), {}, ValueError, r"k, v: head dim .* must equal q's 16, got 8"),
        "v seqlen": ((q, k, v[:, :3]), {}, ValueError, r"v: seqlen .* must equal k's 7, got 3"),
        "bad head dim": ((q[..., :12], k[..., :12], v[..., :12]), {}, ValueError,
                         r"q: head dim 12 is not supported; expected a multiple of 8"),
        "big head dim": (qkv(d=264), {}, ValueError, r"q: head dim 264 is not supported"),
        "empty seqlen": ((q[:, :0], k, v), {}, ValueError, r"q: seqlen .* at least 1, got 0"),
        "last stride": ((q[..., ::2], k[..., ::2], v[..., ::2]), {}, ValueError,
                        r"q: the last axis must be contiguous"),
        "layout": ((q, k, v), {"layout": "sbhd"}, ValueError, r"layout: expected 'bshd' or 'bhsd', got 'sbhd'"),
        "causal": ((q, k, v), {"causal": "yes"}, TypeError, r"causal: expected a bool, got 'yes'"),
        "scale type": ((q, k, v), {"softmax_scale": "0.1"}, TypeError, r"softmax_scale: expected a real number"),
        "scale nan": ((q, k, v), {"softmax_scale": float("nan")}, ValueError, r"softmax_scale: expected a finite"),
    }  # fmt: skip
    return cases[name]


FWD_NAMES = [
    "ndim", "list", "int dtype", "float64", "mixed dtype", "batch", "heads", "head dim",
    "v seqlen", "bad head dim", "big head dim", "empty seqlen", "last stride", "layout",
    "causal", "scale type", "scale nan",
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

"""``flash_attention_backward`` is bitwise deterministic: no atomics anywhere.

Two checks:

* dynamic: the same inputs through the backward 2 times in the simulator (10 on a GPU,
  real sizes), compared as bits (the outputs viewed as unsigned ints: uint16 for
  fp16/bf16, uint32 for float32), not as values: two NaNs or +0/−0 would compare
  wrongly as values.  Every backward family: fp16 and bf16 tensor cores, TF32 tensor
  cores, the register-blocked fp32 kernels, the row-group fp32 kernels, and bf16 at
  head dims padded up to the tensor-core tiles (40; 256 on a GPU, with dK and dV from
  two kernels).
* static: each family's backward kernels compiled to PTX for sm_90
  (``inspection.inspect_kernels``, no GPU needed) contain no ``atom.`` or ``red.``
  instruction, so no order of arrival can change a sum.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import numba_flash
from numba_flash import _arrays, reference
from numba_flash._numba_cuda import SIMULATOR

from conftest import device, family, host, make_qkv

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BF16 = _arrays.BFLOAT16
BITS = {2: np.uint16, 4: np.uint32}


def bits(x):
    """``x`` (on the host) as its raw bits: uint16 for fp16/bf16, uint32 for float32."""
    x = np.ascontiguousarray(host(x))
    return x.view(BITS[x.dtype.itemsize])


# (name, dtype, d, allow_tf32, family the plan picks, B, H, Nq, Nk, causal)
SIM_CASES = [
    ("fp16-tc", np.float16, 64, False, "tensor-core", 1, 1, 33, 40, True),
    ("bf16-tc", BF16, 128, False, "tensor-core", 1, 1, 17, 40, False),
    ("tf32", np.float32, 64, True, "tensor-core-tf32", 1, 1, 9, 20, True),
    ("fp32-blocked", np.float32, 64, False, "simt-fp32", 1, 2, 20, 36, True),
    ("fp32-rowgroup", np.float32, 32, False, "simt-fp32", 1, 1, 24, 20, False),
    ("bf16-tc-d40", BF16, 40, False, "tensor-core", 1, 1, 17, 23, True),
]
GPU_CASES = [
    pytest.param(name, dt, d, tf32, fam, 2, 4, 2048, 2048, causal, marks=pytest.mark.gpu, id=f"{name}-gpu")
    for name, dt, d, tf32, fam, causal in (
        ("fp16-tc", np.float16, 128, False, "tensor-core", True),
        ("bf16-tc", BF16, 64, False, "tensor-core", False),
        ("tf32", np.float32, 128, True, "tensor-core-tf32", True),
        ("fp32-blocked", np.float32, 128, False, "simt-fp32", False),
        ("fp32-rowgroup", np.float32, 96, False, "simt-fp32", True),
        ("bf16-tc-d256", BF16, 256, False, "tensor-core", False),
    )
]


@pytest.mark.parametrize(
    "name,dtype,d,tf32,fam,B,H,Nq,Nk,causal", [pytest.param(*c, id=c[0]) for c in SIM_CASES] + GPU_CASES
)
def test_backward_is_bitwise_deterministic(rng, name, dtype, d, tf32, fam, B, H, Nq, Nk, causal):
    assert family("backward", np.dtype(dtype), d, allow_tf32=tf32) == fam
    runs = 2 if SIMULATOR else 10
    q, k, v = make_qkv(rng, B, H, Nq, Nk, d, "bshd", dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, layout="bshd")
    args = [device(x) for x in (dout, q, k, v, ref_out.astype(dtype), ref_lse.astype(np.float32))]
    first = [bits(g) for g in numba_flash.flash_attention_backward(*args, causal=causal, allow_tf32=tf32)]
    for run in range(1, runs):
        again = numba_flash.flash_attention_backward(*args, causal=causal, allow_tf32=tf32)
        for gname, a, b in zip(("dq", "dk", "dv"), first, again):
            b = bits(b)
            assert a.dtype == b.dtype and np.array_equal(a, b), (
                f"{name}: {gname} differs in {int((a != b).sum())} of {a.size} elements on run {run + 1}, "
                f"seed {rng.seed_value}"
            )


# --- static: no atomics in any backward kernel --------------------------------------

# (dtype, head dim, causal, tf32, family, kernel-name prefix): every backward family,
# both tensor-core head dims and both causal variants among them
PTX_CONFIGS = [
    ("float16", 64, True, False, "tensor-core", "tc_bwd"),
    ("bfloat16", 128, False, False, "tensor-core", "tc_bwd"),
    ("float32", 64, True, False, "simt-fp32", "simt_blocked"),
    ("float32", 32, False, False, "simt-fp32", "simt_bwd"),
    ("float32", 128, True, True, "tensor-core-tf32", "tf32_bwd"),
]
ATOMIC = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:atom|red)\.", re.MULTILINE)


@pytest.mark.parametrize(
    "dtype,d,causal,tf32,fam,prefix", PTX_CONFIGS, ids=[f"{c[0]}-d{c[1]}{'-tf32' if c[3] else ''}" for c in PTX_CONFIGS]
)
def test_backward_ptx_has_no_atomics(dtype, d, causal, tf32, fam, prefix):
    from numba_flash.inspection import inspect_kernels

    reports = inspect_kernels("backward", dtype, d, causal, arch="sm_90", tf32=tf32)
    assert len(reports) == 3  # preprocess (delta), dK/dV, dQ
    assert {r.family for r in reports} == {fam}
    assert any(r.name.startswith(prefix) for r in reports), [r.name for r in reports]
    for r in reports:
        assert r.ptx and ".entry" in r.ptx, r.name
        found = ATOMIC.findall(r.ptx)
        assert not found and r.counts["atom"] == 0, f"{r.name}: {len(found)} atom./red. instructions"


def test_atomic_pattern_matches_ptx_atomics():
    """The pattern above finds the instructions it must (predicated or not) and nothing
    that merely contains the letters."""
    ptx = "\n".join([
        "\tatom.global.add.f32 \t%f1, [%rd1], %f2;",
        "\t@%p1 red.global.add.f32 \t[%rd2], %f3;",
        "\t@!%p2 atom.shared.cas.b32 %r1, [%r2], %r3, %r4;",
    ])  # fmt: skip
    assert len(ATOMIC.findall(ptx)) == 3
    assert not ATOMIC.findall("\tld.global.f32 %f1, [%rd1];\n// atom. in a comment\n\tmov.f32 %fred, %f1;")

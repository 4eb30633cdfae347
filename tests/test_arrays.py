"""numba_flash._arrays: how arguments are imported and checked.

Most of this runs without a GPU: the route a device object takes (``import_route``) is
decided from its interfaces alone, and the import itself is exercised with a stand-in
for CuPy whose "device memory" is host memory (``FakeCuPy``).  The end-to-end PyTorch
test at the bottom needs a CUDA GPU and torch (``pytest -m gpu``).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from numba_flash import _arrays as A
from numba_flash import _numba_cuda
from numba_flash import reference as R

BF16 = np.dtype(ml_dtypes.bfloat16)


# --- stand-ins for device objects --------------------------------------------------------


class FakeDeviceArray:
    """An object exposing a host NumPy buffer through ``__cuda_array_interface__``, as a
    device array would; ``typestr`` overrides the buffer's (torch says ``"<V2"`` for
    bfloat16).  ``requires_grad=True`` makes the interfaces raise, as torch's do."""

    def __init__(self, buf: np.ndarray, typestr=None, requires_grad=None, dtype=None):
        self.buf = buf
        self.shape = buf.shape
        self.dtype = dtype if dtype is not None else buf.dtype
        self._typestr = typestr or buf.dtype.str
        self.touched = []  # which interfaces were read
        if requires_grad is not None:
            self.requires_grad = requires_grad

    def _touch(self, what):
        self.touched.append(what)
        if getattr(self, "requires_grad", False):  # what torch does
            raise RuntimeError(f"Can't call {what} on Tensor that requires grad. Use tensor.detach().")

    @property
    def __cuda_array_interface__(self):
        self._touch("__cuda_array_interface__")
        return {
            "shape": self.buf.shape,
            "typestr": self._typestr,
            "descr": [("", self._typestr)],
            "data": (self.buf.__array_interface__["data"][0], False),
            "strides": self.buf.strides,
            "version": 2,  # torch's: no stream
        }


class FakeDLPackArray(FakeDeviceArray):
    """A CUDA DLPack producer without ``__cuda_array_interface__`` (JAX-like)."""

    __cuda_array_interface__ = property(lambda self: self._no_cai())

    def _no_cai(self):
        raise AttributeError("__cuda_array_interface__")

    def __dlpack__(self, stream=None, **kwargs):
        self._touch("__dlpack__")
        return self.buf.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


class FakeBoth(FakeDeviceArray):
    """Both interfaces, as a PyTorch CUDA tensor has."""

    __dlpack__ = FakeDLPackArray.__dlpack__
    __dlpack_device__ = FakeDLPackArray.__dlpack_device__


class TorchTensor(FakeBoth):
    """What ``_arrays`` sees of a torch.Tensor: both interfaces, from module torch."""


TorchTensor.__module__ = "torch"


class _HostCAI:
    """What FakeCuPy.asarray wraps: a CAI dict seen through NumPy's array interface."""

    def __init__(self, obj):
        self.owner = obj  # keeps obj (and its memory) alive, as CuPy's UnownedMemory does
        cai = dict(obj.__cuda_array_interface__)
        cai.pop("descr", None)
        cai["version"] = 3
        self.__array_interface__ = cai


class FakeCuPy:
    """The parts of CuPy that ``_arrays._as_array`` calls, on host memory."""

    class ndarray:  # nothing is one of these
        pass

    def __init__(self, dlpack_error=None):
        self.calls = []
        self.dlpack_error = dlpack_error

    def asarray(self, obj):
        self.calls.append("asarray")
        return np.asarray(_HostCAI(obj))  # zero-copy: a view of the same memory

    def from_dlpack(self, obj):
        self.calls.append("from_dlpack")
        obj.__dlpack__(stream=1)
        if self.dlpack_error is not None:
            raise self.dlpack_error
        return obj.buf  # what cupy.from_dlpack shares: the producer's memory


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = FakeCuPy()
    monkeypatch.setattr(A, "_cupy", lambda: cp)
    return cp


def bf16_bits(shape, seed=0):
    """bfloat16 values and their raw 16-bit words (what torch's memory holds)."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(BF16)
    return values, values.view(np.uint16).copy()


# --- 1. bfloat16 from torch-like objects ---------------------------------------------------


def test_route_torch_bfloat16_goes_through_cai_bits():
    _, words = bf16_bits((1, 3, 2, 8))
    t = TorchTensor(words, typestr="<V2")
    assert A.import_route("q", t) == A.Route("cai-bits", BF16)
    # the decision reads only the interface description, never the data
    assert t.touched == ["__cuda_array_interface__"]


def test_route_prefers_dlpack_when_both_interfaces_exist():
    t = TorchTensor(np.zeros((1, 3, 2, 8), np.float32))
    assert A.import_route("q", t) == A.Route("dlpack-device")
    assert A.import_route("q", FakeDeviceArray(np.zeros(3, np.float16))) == A.Route("cai")
    assert A.import_route("q", FakeDLPackArray(np.zeros(3, np.float16))) == A.Route("dlpack-device")


def test_route_void2_needs_a_producer_that_says_bfloat16():
    _, words = bf16_bits((2, 8))
    # not torch, no dtype naming bfloat16: "<V2" could be anything; refuse, naming the argument
    anon = FakeDeviceArray(words, typestr="<V2", dtype=np.dtype("V2"))
    with pytest.raises(TypeError, match=r"^k: __cuda_array_interface__ typestr '<V2' \(2 raw bytes\)"):
        A.import_route("k", anon)
    # a producer whose dtype is named bfloat16 (ml_dtypes.bfloat16, torch.bfloat16, ...)
    named = FakeDeviceArray(words, typestr="<V2", dtype=BF16)
    assert A.import_route("k", named) == A.Route("cai-bits", BF16)


def test_route_of_host_and_plain_arrays():
    assert A.import_route("q", np.zeros(3)) == A.Route("numpy")

    class HostDLPack:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (1, 0)  # kDLCPU

    assert A.import_route("q", HostDLPack(np.zeros(3))) == A.Route("dlpack-host")
    with pytest.raises(TypeError, match=r"^v: expected a NumPy or CuPy array .* got list"):
        A.import_route("v", [1.0, 2.0])


def test_torch_bfloat16_is_imported_zero_copy_as_bfloat16(fake_cupy):
    values, words = bf16_bits((1, 3, 2, 8))
    t = TorchTensor(words, typestr="<V2")
    kind, arr = A._as_array("q", t)
    assert kind == "device" and fake_cupy.calls == ["asarray"]  # not DLPack: see _arrays
    assert arr.dtype == BF16 and arr.shape == (1, 3, 2, 8)
    np.testing.assert_array_equal(arr.astype(np.float32), values.astype(np.float32))
    assert np.shares_memory(arr, words)  # no copy of the caller's data
    op = A.check_operand("q", t, "bshd")
    assert op.kind == "device" and op.dtype == BF16 and A.dtype_name(op.dtype) == "bfloat16"


def test_torch_bfloat16_strided_view_keeps_its_strides(fake_cupy):
    values, words = bf16_bits((1, 6, 2, 16))
    view = words[:, ::2, :, :8]  # a strided slice, last axis contiguous
    op = A.check_operand("q", TorchTensor(view, typestr="<V2"), "bshd")
    assert op.array.strides == view.strides
    np.testing.assert_array_equal(op.array.astype(np.float32), values[:, ::2, :, :8].astype(np.float32))


def test_dlpack_import_is_used_and_its_refusal_names_the_argument(monkeypatch):
    cp = FakeCuPy()
    monkeypatch.setattr(A, "_cupy", lambda: cp)
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 1, 4)
    t = TorchTensor(x)
    kind, arr = A._as_array("q", t)
    assert kind == "device" and cp.calls == ["from_dlpack"] and "__dlpack__" in t.touched
    assert arr is x

    # a DLPack-only producer of bfloat16 with a CuPy that cannot import it
    cp.dlpack_error = NotImplementedError("CuPy does not support bfloat16 yet")
    jax_like = FakeDLPackArray(bf16_bits((1, 2, 1, 8))[1], dtype=BF16)
    with pytest.raises(TypeError, match=r"^v: could not import .* through DLPack \(NotImplementedError: CuPy"):
        A._as_array("v", jax_like)


# --- 2. tensors that require grad -------------------------------------------------------------


@pytest.mark.parametrize("name", ["q", "k", "v", "dout", "out", "lse"])
def test_requires_grad_is_refused_before_touching_the_interfaces(name):
    t = TorchTensor(np.zeros((1, 3, 2, 8), np.float32), requires_grad=True)
    with pytest.raises(TypeError, match=re.escape(f"{name}: a tensor that requires grad; pass {name}.detach()")):
        A.import_route(name, t)
    assert t.touched == []  # torch would have raised its own RuntimeError
    # requires_grad False (or absent) is an ordinary tensor
    assert A.import_route(name, TorchTensor(np.zeros(3, np.float32), requires_grad=False)).how == "dlpack-device"


# --- 3. zero-size arguments -----------------------------------------------------------------


def empty_strided(shape, dtype=np.float32):
    """A zero-size array whose strides are all 0: an empty array's strides mean nothing."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize(
    "qshape,kshape,dims",
    [
        ((0, 5, 2, 16), (0, 7, 2, 16), (0, 5, 7, 2, 16)),  # batch 0
        ((1, 5, 0, 16), (1, 7, 0, 16), (1, 5, 7, 0, 16)),  # heads 0
        ((1, 0, 2, 16), (1, 7, 2, 16), (1, 0, 7, 2, 16)),  # seqlen_q 0
        ((1, 5, 2, 16), (1, 0, 2, 16), (1, 5, 0, 2, 16)),  # seqlen_k 0
    ],
)
def test_zero_size_inputs_pass_the_checks(layout, qshape, kshape, dims):
    def arr(shape, strided):
        shape = shape if layout == "bshd" else (shape[0], shape[2], shape[1], shape[3])
        if 0 in shape and strided:
            return empty_strided(shape)
        return np.zeros(shape, np.float32)

    for strided in (False, True):
        shapes = (("q", qshape), ("k", kshape), ("v", kshape))
        q, k, v = (A.check_operand(n, arr(s, strided), layout) for n, s in shapes)
        assert A.check_qkv(q, k, v, layout) == dims


def test_zero_size_still_checks_head_dim_and_grid():
    def ops(qshape, kshape):
        shapes = (("q", qshape), ("k", kshape), ("v", kshape))
        return [A.check_operand(n, np.zeros(s, np.float32), "bshd") for n, s in shapes]

    with pytest.raises(ValueError, match=r"q: head dim 264 is not supported; expected 1 to 256"):
        A.check_qkv(*ops((1, 0, 2, 264), (1, 0, 2, 264)), "bshd")
    assert A.check_qkv(*ops((1, 0, 2, 12), (1, 3, 2, 12)), "bshd") == (1, 0, 3, 2, 12)  # any d from 1 to 256
    with pytest.raises(ValueError, match=r"q: head dim 0 is not supported"):
        A.check_qkv(*ops((1, 4, 2, 0), (1, 4, 2, 0)), "bshd")
    with pytest.raises(ValueError, match=r"q: batch and heads must be at most 65535 each, got batch=65536"):
        A.check_qkv(*ops((65536, 0, 1, 8), (65536, 0, 1, 8)), "bshd")
    # a non-empty array still needs a contiguous last axis
    with pytest.raises(ValueError, match=r"q: the last axis must be contiguous"):
        A.check_operand("q", np.zeros((1, 2, 2, 32), np.float32)[..., ::2], "bshd")


def test_zero_size_lse_is_accepted():
    q = A.check_operand("q", np.zeros((1, 0, 2, 16), np.float32), "bshd")
    assert A.check_lse(np.zeros((1, 2, 0), np.float32), q, 1, 2, 0).shape == (1, 2, 0)


# --- 4. byte order ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [">f4", ">f2"])
def test_big_endian_numpy_is_taken_as_a_native_copy(dtype):
    x = np.random.default_rng(1).standard_normal((1, 3, 2, 8)).astype(dtype)[:, ::2]
    before = x.copy()
    op = A.check_operand("q", x, "bshd")
    assert op.kind == "numpy" and op.dtype.isnative and op.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(op.array, x)  # same values
    assert not np.shares_memory(op.array, x)  # a copy ...
    np.testing.assert_array_equal(x, before)  # ... and the caller's array untouched
    assert x.dtype == np.dtype(dtype)


def test_big_endian_lse_and_unsupported_big_endian():
    q = A.check_operand("q", np.zeros((1, 3, 2, 8), np.float32), "bshd")
    lse = A.check_lse(np.zeros((1, 2, 3), ">f4"), q, 1, 2, 3)
    assert lse.dtype == np.float32 and lse.dtype.isnative
    with pytest.raises(TypeError, match=r"q: dtype float64 \(big-endian\) is not supported"):
        A.check_operand("q", np.zeros((1, 3, 2, 8), ">f8"), "bshd")


# --- 5. flags and layout ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, np.True_, np.bool_(False)])
def test_check_flag_accepts_bools(value):
    assert A.check_flag("return_lse", value) is bool(value)
    assert A.check_causal(value) is bool(value)


@pytest.mark.parametrize("name", ["causal", "return_lse", "allow_tf32"])
@pytest.mark.parametrize(
    "value,shown",
    [("yes", "'yes'"), (1, "1"), (None, "None"), (np.array(True), "array(True)"),
     (np.array([True, False]), "array([ True, False])")],
)  # fmt: skip
def test_check_flag_refuses_everything_else(name, value, shown):
    with pytest.raises(TypeError, match=re.escape(f"{name}: expected a bool, got {shown}")):
        A.check_flag(name, value)


def test_check_flag_keeps_long_reprs_short():
    with pytest.raises(TypeError) as info:
        A.check_flag("causal", np.zeros(1000, bool))
    assert len(str(info.value)) < 120


@pytest.mark.parametrize("layout", [np.array(["bshd"]), np.array("bshd"), None, 1, b"bshd"])
def test_check_layout_refuses_non_strings_with_type_error(layout):
    with pytest.raises(TypeError, match=r"^layout: expected a str, 'bshd' or 'bhsd', got "):
        A.check_layout(layout)


def test_check_layout_values():
    assert A.check_layout("bshd") == "bshd" and A.check_layout("bhsd") == "bhsd"
    with pytest.raises(ValueError, match=r"^layout: expected 'bshd' or 'bhsd', got 'BSHD'"):
        A.check_layout("BSHD")


# --- 6. softmax_scale -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scale,shown",
    [(1e39, "1e+39"), (-1e39, "-1e+39"), (np.float64(3.5e38), "3.5e+38"), (10**400, "1000000"),
     (float("inf"), "inf"), (-float("inf"), "-inf")],
)  # fmt: skip
def test_scale_outside_float32_is_a_value_error(scale, shown):
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite number in the float32 range") as info:
        A.check_scale(scale, 16)
    assert shown in str(info.value) and "3.4e38" in str(info.value)
    assert len(str(info.value)) < 200  # 10**400 is not printed in full


def test_scale_values_that_are_fine():
    assert A.check_scale(None, 16) == 0.25
    assert A.check_scale(0.0, 16) == 0.0  # uniform attention: allowed
    assert A.check_scale(-0.5, 16) == -0.5
    assert A.check_scale(3.4e38, 16) == 3.4e38
    assert A.check_scale(np.float32(0.125), 16) == 0.125
    assert A.check_scale(2, 16) == 2.0 and isinstance(A.check_scale(2, 16), float)
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite number, got nan"):
        A.check_scale(float("nan"), 16)
    for bad in ("0.1", True, np.array(0.5), 1j):
        with pytest.raises(TypeError, match=r"^softmax_scale: expected a real number or None"):
            A.check_scale(bad, 16)


# --- 7. no GPU and no simulator ---------------------------------------------------------------


def test_require_runtime_without_gpu_or_simulator(monkeypatch):
    monkeypatch.setattr(_numba_cuda, "SIMULATOR", False)
    monkeypatch.setattr(_numba_cuda, "gpu_available", lambda: False)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    with pytest.raises(RuntimeError) as info:
        A.require_runtime()
    msg = str(info.value)
    assert msg.startswith("no CUDA GPU found (")
    assert "NUMBA_ENABLE_CUDASIM is not set" in msg
    assert "set NUMBA_ENABLE_CUDASIM=1 before importing numba" in msg
    assert "numba_flash.reference" in msg
    # the variable set too late: said so
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    with pytest.raises(RuntimeError, match=r"NUMBA_ENABLE_CUDASIM='1' did not turn the simulator on"):
        A.require_runtime()


def test_require_runtime_with_gpu_or_simulator(monkeypatch):
    A.require_runtime()  # the suite runs in the simulator or on a GPU
    monkeypatch.setattr(_numba_cuda, "SIMULATOR", False)
    monkeypatch.setattr(_numba_cuda, "gpu_available", lambda: True)
    A.require_runtime()
    monkeypatch.setattr(_numba_cuda, "SIMULATOR", True)
    monkeypatch.setattr(_numba_cuda, "gpu_available", lambda: False)
    A.require_runtime()


# --- real PyTorch on a GPU --------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_torch_cuda_tensors_end_to_end(dtype_name):
    torch = pytest.importorskip("torch", reason="PyTorch is installed on the GPU machine only")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    import cupy as cp

    import numba_flash

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((2, 70, 3, 64), generator=gen, device="cuda").to(dtype) for _ in range(3))
    before = [x.clone() for x in (q, k, v)]
    out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
    assert A.dtype_name(out.dtype) == dtype_name and tuple(out.shape) == (2, 70, 3, 64)
    host = [x.float().cpu().numpy() for x in (q, k, v)]
    ref_out, ref_lse = R.attention(*host, causal=True, layout="bshd")
    tol = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}[dtype_name]
    assert R.rel_error(cp.asnumpy(out).astype(np.float32), ref_out) <= tol
    assert R.rel_error(cp.asnumpy(lse), ref_lse) <= 1e-3
    assert all(torch.equal(x, b) for x, b in zip((q, k, v), before))  # inputs untouched

    with pytest.raises(TypeError, match=re.escape("q: a tensor that requires grad; pass q.detach()")):
        numba_flash.flash_attention(q.clone().requires_grad_(True), k, v)

"""Checking and adapting the arrays a user hands to the public API.

What comes in: NumPy arrays, CuPy arrays, any object with ``__cuda_array_interface__``
(numba device arrays, PyTorch CUDA tensors, ...) or ``__dlpack__``.  What the kernels
get: 4-D views in the (batch, seqlen, heads, headdim) order with the caller's strides
(the last one 1), never a hidden copy of a device array.  What goes back: arrays of the
kind that came in: NumPy for NumPy; CuPy for CuPy and for the other device objects.

Under the CUDA simulator NumPy arrays are handed to the kernels as they are (wrapped,
not copied), so strided NumPy views are tested there exactly as CuPy views are on a GPU.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from numba_flash._numba_cuda import SIMULATOR, cuda

LAYOUTS = ("bshd", "bhsd")
MAX_HEAD_DIM = 256
MAX_GRID_YZ = 65535  # heads go on grid.y and batch on grid.z


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        return None
    return np.dtype(ml_dtypes.bfloat16)


BFLOAT16 = _bfloat16()
SUPPORTED_DTYPES = tuple(d for d in (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16) if d is not None)


def _cupy():
    try:
        import cupy
    except Exception:  # pragma: no cover - cupy missing or without a CUDA runtime
        return None
    return cupy


def dtype_name(dtype) -> str:
    return "bfloat16" if dtype == _bfloat16() else np.dtype(dtype).name


@dataclass
class Operand:
    """One array argument after checking: its name, kind and (batch, seq, heads, d) view."""

    name: str
    kind: str  # "numpy" (host) or "device"
    array: Any  # numpy.ndarray or cupy.ndarray, in the caller's layout
    view: Any  # the same data seen as (B, S, H, d)

    @property
    def dtype(self):
        return self.array.dtype


def describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__module__}.{type(x).__name__} of shape {tuple(x.shape)}, dtype {x.dtype}"
    return f"{type(x).__name__} {x!r:.60}"


def _as_array(name: str, x):
    """Return (kind, array) without copying device data."""
    if isinstance(x, np.ndarray):
        return "numpy", x
    cp = _cupy()
    if cp is not None and isinstance(x, cp.ndarray):
        return "device", x
    if hasattr(x, "__cuda_array_interface__"):
        if cp is None:
            raise TypeError(f"{name}: a device array needs CuPy, which is not importable")
        return "device", cp.asarray(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        if device_type == 1:  # kDLCPU
            return "numpy", np.from_dlpack(x)
        if cp is None:
            raise TypeError(f"{name}: a DLPack device tensor needs CuPy, which is not importable")
        return "device", cp.from_dlpack(x)
    raise TypeError(
        f"{name}: expected a NumPy or CuPy array (or an object with "
        f"__cuda_array_interface__ or __dlpack__), got {describe(x)}"
    )


def check_operand(name: str, x, layout: str) -> Operand:
    kind, arr = _as_array(name, x)
    if arr.ndim != 4:
        order = "(batch, seqlen, heads, headdim)" if layout == "bshd" else "(batch, heads, seqlen, headdim)"
        raise ValueError(f"{name}: expected a 4-D array {order}, got ndim={arr.ndim} (shape {tuple(arr.shape)})")
    if arr.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: dtype {dtype_name(arr.dtype)} is not supported; expected one of {names}")
    if arr.strides[-1] != arr.dtype.itemsize and arr.shape[-1] > 1:
        raise ValueError(
            f"{name}: the last axis must be contiguous (stride {arr.dtype.itemsize} bytes), "
            f"got strides {tuple(arr.strides)} bytes"
        )
    view = arr if layout == "bshd" else arr.transpose(0, 2, 1, 3)
    return Operand(name, kind, arr, view)


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    return layout


def check_causal(causal) -> bool:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    return bool(causal)


def check_scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / float(np.sqrt(head_dim))
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale: expected a real number or None, got {softmax_scale!r}")
    value = float(softmax_scale)
    if not np.isfinite(value):
        raise ValueError(f"softmax_scale: expected a finite number, got {softmax_scale!r}")
    return value


def check_qkv(q: Operand, k: Operand, v: Operand, layout: str):
    """Check q, k, v agree; return (B, Nq, Nk, H, d)."""
    for op in (k, v):
        if op.kind != q.kind:
            raise TypeError(
                f"{op.name}: is a {'NumPy' if op.kind == 'numpy' else 'device'} array but q is "
                f"a {'NumPy' if q.kind == 'numpy' else 'device'} array; pass all on the same side"
            )
        if op.dtype != q.dtype:
            raise TypeError(
                f"{op.name}: dtype {dtype_name(op.dtype)} differs from q's {dtype_name(q.dtype)}; "
                "q, k and v must share one dtype"
            )
    B, Nq, H, d = q.view.shape
    _, Nk, _, _ = k.view.shape
    seq = "axis 1" if layout == "bshd" else "axis 2"
    heads = "axis 2" if layout == "bshd" else "axis 1"
    if k.view.shape[0] != B or v.view.shape[0] != B:
        raise ValueError(f"k, v: batch (axis 0) must equal q's {B}, got {k.view.shape[0]} and {v.view.shape[0]}")
    if k.view.shape[2] != H or v.view.shape[2] != H:
        raise ValueError(f"k, v: heads ({heads}) must equal q's {H}, got {k.view.shape[2]} and {v.view.shape[2]}")
    if k.view.shape[3] != d or v.view.shape[3] != d:
        raise ValueError(f"k, v: head dim (axis 3) must equal q's {d}, got {k.view.shape[3]} and {v.view.shape[3]}")
    if v.view.shape[1] != Nk:
        raise ValueError(f"v: seqlen ({seq}) must equal k's {Nk}, got {v.view.shape[1]}")
    for name, n in (("q", Nq), ("k", Nk)):
        if n < 1:
            raise ValueError(f"{name}: seqlen ({seq}) must be at least 1, got {n}")
    if B < 1 or H < 1:
        raise ValueError(f"q: batch and heads must be at least 1, got batch={B}, heads={H}")
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:
        raise ValueError(f"q: batch and heads must be at most {MAX_GRID_YZ} each, got batch={B}, heads={H}")
    if d % 8 != 0 or not 8 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {d} is not supported; expected a multiple of 8 from 8 to {MAX_HEAD_DIM}")
    return B, Nq, Nk, H, d


def check_like(name: str, op: Operand, ref: Operand):
    """``op`` must have the shape, dtype and kind of ``ref`` (dout and out against q)."""
    if op.kind != ref.kind:
        raise TypeError(f"{name}: must be on the same side (host/device) as {ref.name}")
    if tuple(op.array.shape) != tuple(ref.array.shape):
        raise ValueError(f"{name}: shape {tuple(op.array.shape)} must equal {ref.name}'s {tuple(ref.array.shape)}")
    if op.dtype != ref.dtype:
        raise TypeError(f"{name}: dtype {dtype_name(op.dtype)} must equal {ref.name}'s {dtype_name(ref.dtype)}")


def check_lse(lse, q: Operand, B: int, H: int, Nq: int):
    kind, arr = _as_array("lse", lse)
    if kind != q.kind:
        raise TypeError("lse: must be on the same side (host/device) as q")
    if tuple(arr.shape) != (B, H, Nq):
        raise ValueError(f"lse: expected shape (batch, heads, seqlen_q) = {(B, H, Nq)}, got {tuple(arr.shape)}")
    if arr.dtype != np.float32:
        raise TypeError(f"lse: expected dtype float32, got {dtype_name(arr.dtype)}")
    return arr


# --- moving between the caller's world and the kernels' -------------------------------


def empty(kind: str, shape, dtype):
    """An output array on the side where the kernels run: the GPU (CuPy) for every
    kind of input, or the host under the simulator.  ``to_caller`` brings it back."""
    if SIMULATOR:
        return np.empty(shape, dtype)
    return _cupy().empty(shape, dtype)


def to_compute(op_array, kind: str):
    """The caller's array on the side where the kernels run (copies NumPy to the GPU)."""
    if kind == "numpy" and not SIMULATOR:
        return _cupy().asarray(op_array)
    return op_array


def to_caller(arr, kind: str):
    if kind == "numpy" and not SIMULATOR:
        return _cupy().asnumpy(arr)
    return arr


def kernel_arg(arr):
    """What a numba kernel is launched with: a zero-copy device view of ``arr``."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(arr)
    # sync=False: we launch on CuPy's current stream ourselves, in order.
    return cuda.as_cuda_array(arr, sync=False)


def data_ptr(arr) -> int:
    """Address of ``arr``'s first element (NumPy or CuPy)."""
    if isinstance(arr, np.ndarray):
        return arr.__array_interface__["data"][0]
    return arr.data.ptr


def aligned16(arr) -> bool:
    """True when every row (last axis) of ``arr`` starts on a 16-byte boundary, as
    cp.async's 16-byte copies need: the data pointer and every outer stride."""
    return data_ptr(arr) % 16 == 0 and all(s % 16 == 0 for s in arr.strides[:-1])


def launch_stream():
    """numba's handle on CuPy's current stream (the default stream in the simulator)."""
    if SIMULATOR:
        return 0
    ptr = _cupy().cuda.get_current_stream().ptr
    if ptr == 0:
        return cuda.default_stream()
    return cuda.external_stream(ptr)

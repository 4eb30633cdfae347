"""Checking and adapting the arrays a user hands to the public API.

What comes in: NumPy arrays, CuPy arrays, any object with ``__cuda_array_interface__``
(numba device arrays, PyTorch CUDA tensors, ...) or ``__dlpack__``.  What the kernels
get: 4-D views in the (batch, seqlen, heads, headdim) order with the caller's strides
(the last one 1), never a hidden copy of a device array.  What goes back: arrays of the
kind that came in: NumPy for NumPy; CuPy for CuPy and for the other device objects.

How a device object is imported (``import_route`` decides, ``_as_array`` does it):

- an object with ``__dlpack__`` is imported through DLPack (``cupy.from_dlpack``), also
  when it has ``__cuda_array_interface__`` too (PyTorch tensors): DLPack hands CuPy's
  current stream to the producer, which orders its pending work before it;
- except bfloat16 described by ``__cuda_array_interface__`` as ``"<V2"`` (two raw bytes;
  PyTorch does so, and it is ``ml_dtypes.bfloat16``'s own typestr): NumPy reads ``<V2`` as
  ``void16``, and only recent CuPy imports bfloat16 through DLPack (cupy/cupy#9670; older
  ones raise, some crash: cupy/cupy#8801).  Such an array is imported through its
  ``__cuda_array_interface__`` as raw ``uint16`` words and viewed as ``ml_dtypes.
  bfloat16``: zero-copy, and it works with every CuPy that has bfloat16 arrays.  A
  ``"<V2"`` array is taken for bfloat16 only when its producer says so (a PyTorch tensor,
  which exports no other dtype as ``"<V2"``, or an object whose ``dtype`` is named
  ``bfloat16``); other ``"<V2"`` arrays are refused;
- an object with ``__cuda_array_interface__`` alone goes through ``cupy.asarray``.

A tensor that requires grad (``requires_grad is True``) is refused before either interface
is touched (PyTorch would raise its own RuntimeError): pass ``x.detach()``.

NumPy arrays of a supported dtype in non-native byte order (``np.dtype(">f4")`` on a
little-endian machine) are accepted: they are copied to native byte order (the caller's
array is not modified), and outputs come back in native byte order.  Device arrays are
never byte-swapped.

Zero-size arrays (batch, heads, seqlen_q or seqlen_k of 0) pass the checks; the head dim
must still be 1 to 256.  Their strides are not checked (an empty
array's strides mean nothing).

Under the CUDA simulator NumPy arrays are handed to the kernels as they are (wrapped,
not copied), so strided NumPy views are tested there exactly as CuPy views are on a GPU.
"""

from __future__ import annotations

import collections
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from numba_flash import _numba_cuda
from numba_flash._numba_cuda import SIMULATOR, cuda

LAYOUTS = ("bshd", "bhsd")
MAX_HEAD_DIM = 256
MAX_GRID_YZ = 65535  # heads go on grid.y and batch on grid.z
FLOAT32_MAX = float(np.finfo(np.float32).max)  # 3.4028235e38

# DLPack device types (dlpack.h): where ``__dlpack_device__`` says the data lives
_KDL_CPU = 1


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        return None
    return np.dtype(ml_dtypes.bfloat16)


BFLOAT16 = _bfloat16()
SUPPORTED_DTYPES = tuple(d for d in (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16) if d is not None)
SUPPORTED_BY_NAME = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BFLOAT16}


def _cupy():
    try:
        import cupy
    except Exception:  # pragma: no cover - cupy missing or without a CUDA runtime
        return None
    return cupy


def dtype_name(dtype) -> str:
    dtype = np.dtype(dtype)
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return "bfloat16"
    if not dtype.isnative:
        return f"{dtype.name} ({'big' if dtype.byteorder == '>' else 'little'}-endian)"
    return dtype.name


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__module__}.{type(x).__name__} of shape {tuple(x.shape)}, dtype {x.dtype}"
    return f"{type(x).__name__} {_short_repr(x)}"


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


# --- the runtime ------------------------------------------------------------------------


def require_runtime() -> None:
    """Raise one clear RuntimeError when kernels can run nowhere: no CUDA GPU and numba's
    CUDA simulator off.  The API calls this before any device work (CuPy would otherwise
    end in ``cudaErrorInsufficientDriver`` or similar)."""
    if _numba_cuda.SIMULATOR or _numba_cuda.gpu_available():
        return
    flag = os.environ.get("NUMBA_ENABLE_CUDASIM")
    why = "numba.cuda.is_available() is False and " + (
        "NUMBA_ENABLE_CUDASIM is not set"
        if flag is None
        else f"NUMBA_ENABLE_CUDASIM={flag!r} did not turn the simulator on (numba reads it once, at import)"
    )
    raise RuntimeError(
        f"no CUDA GPU found ({why}); set NUMBA_ENABLE_CUDASIM=1 before importing numba to run "
        "the kernels in numba's CUDA simulator (slow, small shapes), or use "
        "numba_flash.reference for a NumPy float64 attention"
    )


# --- importing arrays -------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """How ``_as_array`` imports one argument; ``import_route`` decides."""

    how: str  # "numpy", "cupy", "dlpack-host", "dlpack-device", "cai" or "cai-bits"
    dtype: Any = None  # "cai-bits": the dtype the raw 2-byte words hold (bfloat16)


def _cuda_array_interface(name: str, x):
    """``x.__cuda_array_interface__`` as a dict, or None when ``x`` has none."""
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        return None
    except Exception as exc:  # a producer refusing (torch raises RuntimeError for grad)
        raise TypeError(f"{name}: its __cuda_array_interface__ raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(cai, dict):
        raise TypeError(f"{name}: __cuda_array_interface__ is a {type(cai).__name__}, expected a dict")
    return cai


def _says_bfloat16(x) -> bool:
    """Whether the producer of a ``"<V2"`` array says it holds bfloat16: a PyTorch tensor
    (torch exports only bfloat16 as ``"<V2"``) or an object whose ``dtype`` is named
    ``bfloat16`` (``torch.bfloat16``, ``ml_dtypes.bfloat16``)."""
    if type(x).__module__.split(".")[0] == "torch":
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and str(dtype).rsplit(".", 1)[-1] == "bfloat16"


def import_route(name: str, x) -> Route:
    """Decide how to import ``x`` without touching its data (see the module docstring)."""
    if isinstance(x, np.ndarray):
        return Route("numpy")
    cp = _cupy()
    if cp is not None and isinstance(x, cp.ndarray):
        return Route("cupy")
    # before either interface: torch raises its own RuntimeError from both
    if getattr(x, "requires_grad", False) is True:
        raise TypeError(f"{name}: a tensor that requires grad; pass {name}.detach()")
    cai = _cuda_array_interface(name, x)
    has_dlpack = hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")
    if cai is not None:
        typestr = cai.get("typestr")
        if isinstance(typestr, str) and typestr[1:] == "V2":
            if not _says_bfloat16(x):
                raise TypeError(
                    f"{name}: __cuda_array_interface__ typestr {typestr!r} (2 raw bytes) does not say "
                    f"which dtype {describe(x)} holds; expected float32, float16 or bfloat16 "
                    "(pass a CuPy array of dtype ml_dtypes.bfloat16 for bfloat16)"
                )
            if BFLOAT16 is None:  # pragma: no cover - ml_dtypes is a dependency
                raise TypeError(f"{name}: bfloat16 needs ml_dtypes, which is not importable")
            return Route("cai-bits", BFLOAT16)
    if has_dlpack:
        try:
            device_type = int(x.__dlpack_device__()[0])
        except Exception as exc:
            raise TypeError(f"{name}: its __dlpack_device__ raised {type(exc).__name__}: {exc}") from exc
        return Route("dlpack-host" if device_type == _KDL_CPU else "dlpack-device")
    if cai is not None:
        return Route("cai")
    raise TypeError(
        f"{name}: expected a NumPy or CuPy array (or an object with "
        f"__cuda_array_interface__ or __dlpack__), got {describe(x)}"
    )


class _CAIView:
    """The memory of ``owner`` under another ``__cuda_array_interface__`` (another
    typestr); holds ``owner``, so the memory lives as long as what is imported from it."""

    def __init__(self, cai: dict, owner):
        self.__cuda_array_interface__ = cai
        self.owner = owner


def _cai_as(x, typestr: str) -> _CAIView:
    cai = dict(x.__cuda_array_interface__)
    cai["typestr"] = typestr
    cai.pop("descr", None)  # optional, and it would still say "<V2"
    return _CAIView(cai, x)


def _imported(name: str, x, importer, via: str):
    """``importer(x)``; a producer's or CuPy's refusal becomes a TypeError naming ``name``."""
    try:
        return importer(x)
    except (TypeError, ValueError, NotImplementedError, BufferError) as exc:
        raise TypeError(
            f"{name}: could not import {describe(x)} through {via} ({type(exc).__name__}: {exc}); "
            "expected float32, float16 or bfloat16 data"
        ) from exc


def _native(arr: np.ndarray) -> np.ndarray:
    """A supported dtype in non-native byte order, as a native copy; else ``arr``."""
    if not arr.dtype.isnative:
        native = arr.dtype.newbyteorder("=")
        if native in SUPPORTED_DTYPES:
            return arr.astype(native)
    return arr


def _as_array(name: str, x):
    """Return (kind, array) without copying device data (see ``import_route``)."""
    route = import_route(name, x)
    if route.how == "numpy":
        return "numpy", _native(x)
    if route.how == "cupy":
        return "device", x
    if route.how == "dlpack-host":
        return "numpy", _native(_imported(name, x, np.from_dlpack, "DLPack"))
    cp = _cupy()
    if cp is None:
        raise TypeError(f"{name}: a device array needs CuPy, which is not importable")
    if route.how == "dlpack-device":
        return "device", _imported(name, x, cp.from_dlpack, "DLPack")
    if route.how == "cai":
        return "device", _imported(name, x, cp.asarray, "__cuda_array_interface__")
    # "cai-bits": 2-byte words imported as uint16, then seen as route.dtype (bfloat16)
    words = _imported(name, _cai_as(x, "<u2"), cp.asarray, "__cuda_array_interface__")
    return "device", words.view(route.dtype)


# --- argument checks ----------------------------------------------------------------------


def check_operand(name: str, x, layout: str) -> Operand:
    kind, arr = _as_array(name, x)
    if arr.ndim != 4:
        order = "(batch, seqlen, heads, headdim)" if layout == "bshd" else "(batch, heads, seqlen, headdim)"
        raise ValueError(f"{name}: expected a 4-D array {order}, got ndim={arr.ndim} (shape {tuple(arr.shape)})")
    if arr.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: dtype {dtype_name(arr.dtype)} is not supported; expected one of {names}")
    # an empty array's strides mean nothing (and its kernels never read it)
    if arr.size and arr.strides[-1] != arr.dtype.itemsize and arr.shape[-1] > 1:
        raise ValueError(
            f"{name}: the last axis must be contiguous (stride {arr.dtype.itemsize} bytes), "
            f"got strides {tuple(arr.strides)} bytes"
        )
    view = arr if layout == "bshd" else arr.transpose(0, 2, 1, 3)
    return Operand(name, kind, arr, view)


def check_packed(name: str, x) -> Operand:
    """A varlen operand: (total, heads, headdim), seen as (1, total, heads, headdim)."""
    kind, arr = _as_array(name, x)
    if arr.ndim != 3:
        raise ValueError(f"{name}: expected a 3-D array (total_tokens, heads, headdim), got ndim={arr.ndim} "
                         f"(shape {tuple(arr.shape)})")  # fmt: skip
    op = check_operand(name, arr[None], "bshd")
    return Operand(name, kind, arr, op.view)


def check_alibi(alibi_slopes, q: Operand, B: int, H: int):
    """ALiBi slopes, float32 of shape (H,) or (B, H), on q's side; returned on the compute
    side as a C-contiguous float32 array the kernels read (``score.score_info``): (1, H)
    for (H,) slopes (a view of them when they are contiguous), else (B, H).  The (B, H)
    broadcast copy this once made of (H,) slopes was a kernel a call: without it ALiBi's
    forward went from 1.12–1.13× plain's time to 1.05–1.07× on an H100 (session 47,
    ``bench_order.py alibi``)."""
    kind, arr = _as_array("alibi_slopes", alibi_slopes)
    if kind != q.kind:
        raise TypeError("alibi_slopes: must be on the same side (host/device) as q")
    if arr.dtype != np.float32:
        raise TypeError(f"alibi_slopes: expected dtype float32 (as flash-attn), got {dtype_name(arr.dtype)}")
    if tuple(arr.shape) not in ((H,), (B, H)):
        raise ValueError(f"alibi_slopes: expected shape (heads,) = {(H,)} or (batch, heads) = {(B, H)}, got "
                         f"{tuple(arr.shape)}")  # fmt: skip
    return alibi_rows(to_compute(arr, kind))


def alibi_rows(arr):
    """Slopes of shape (H,) or (B, H) (checked) as the C-contiguous (1, H) or (B, H) float32
    array the kernels index by ``[batch if rows > 1 else 0, head]``: as they are when
    contiguous, else a copy."""
    xp = np if isinstance(arr, np.ndarray) else _cupy()
    return xp.ascontiguousarray(arr.reshape((-1, arr.shape[-1])))


def check_cu_seqlens(name: str, cu, q: Operand, total: int, max_name: str, max_seqlen) -> tuple:
    """Varlen offsets: int32 (B + 1,), from 0, non-decreasing, ending at ``total``;
    ``max_seqlen`` an int at least every length.  Returns (offsets on the compute side,
    the B lengths as int64 on the host, max_seqlen).  Checked on the host: device
    offsets are copied there (the host waits for the stream's work so far); NumPy ones,
    also with q on the device, are checked without reading the device, then copied to
    it."""
    kind, arr = _as_array(name, cu)
    if kind != q.kind and kind != "numpy":  # NumPy offsets go with device q too (no wait for the GPU)
        raise TypeError(f"{name}: a device array with NumPy q: expected NumPy offsets (or q on the device)")
    if arr.dtype != np.int32:
        raise TypeError(f"{name}: expected dtype int32 (as flash-attn), got {dtype_name(arr.dtype)}")
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(f"{name}: expected a 1-D array (batch + 1,), got shape {tuple(arr.shape)}")
    host = arr if isinstance(arr, np.ndarray) else arr.get()
    lengths = np.diff(host.astype(np.int64))
    if host[0] != 0:
        raise ValueError(f"{name}: expected to start at 0, got {int(host[0])}")
    if (lengths < 0).any():
        i = int(np.argmax(lengths < 0))
        raise ValueError(f"{name}: expected non-decreasing offsets, got {int(host[i])} then {int(host[i + 1])} "
                         f"at {i}, {i + 1}")  # fmt: skip
    if int(host[-1]) != total:
        raise ValueError(f"{name}: expected the last offset to be the number of rows {total}, got {int(host[-1])}")
    if isinstance(max_seqlen, (bool, np.bool_)) or not isinstance(max_seqlen, numbers.Integral):
        raise TypeError(f"{max_name}: expected an int, got {_short_repr(max_seqlen)}")
    longest = int(lengths.max()) if lengths.size else 0
    if max_seqlen < longest:
        raise ValueError(f"{max_name}: {max_seqlen} is less than the longest sequence in {name}, {longest}")
    if lengths.size > MAX_GRID_YZ:
        raise ValueError(f"{name}: at most {MAX_GRID_YZ} sequences, got {lengths.size}")
    if kind == "numpy" and not SIMULATOR:
        return upload_offsets(np.ascontiguousarray(host)), lengths, int(max_seqlen)
    dev = to_compute(arr, kind)
    xp = np if isinstance(dev, np.ndarray) else _cupy()
    return xp.ascontiguousarray(dev), lengths, int(max_seqlen)


# NumPy offsets on the device, by device and content (``upload_offsets``): (device array,
# its pinned staging copy, the event after the copy).  Bounded; read-only to the kernels.
_OFFSETS: collections.OrderedDict = collections.OrderedDict()
_OFFSETS_KEEP = 64


def upload_offsets(host: np.ndarray):
    """NumPy offsets (int32) on the current device, without the host waiting for the
    stream.  ``cupy.asarray`` copies from pageable memory with a blocking copy, which
    waits for every kernel queued before it: each varlen call then waited for the
    previous one (on the H200 a varlen forward's host time was 0.42 ms against 0.16
    for a plain call, its GPU time under it).  Here the copy is asynchronous from a
    pinned buffer, ordered on the current stream; the device array is kept by content
    (batches often repeat their lengths), and a later stream waits for its copy."""
    cp = _cupy()
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.Device().id, host.dtype.str, host.tobytes())
    hit = _OFFSETS.get(key)
    if hit is not None:
        _OFFSETS.move_to_end(key)
        stream.wait_event(hit[2])  # on the GPU: its copy before this stream's kernels (done: no wait)
        return hit[0]
    pinned = cp.cuda.alloc_pinned_memory(host.nbytes)
    staged = np.frombuffer(pinned, host.dtype, host.size).reshape(host.shape)
    staged[...] = host
    dev = cp.empty(host.shape, host.dtype)
    dev.set(staged, stream=stream)
    _OFFSETS[key] = (dev, (staged, pinned), stream.record())
    while len(_OFFSETS) > _OFFSETS_KEEP:
        _, (_, _, done) = _OFFSETS.popitem(last=False)
        done.synchronize()  # its copy has run before its pinned buffer is freed
    return dev


def check_layout(layout) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected a str, 'bshd' or 'bhsd', got {describe(layout)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    return layout


def check_flag(name: str, value) -> bool:
    """A bool argument (``causal``, ``return_lse``, ``allow_tf32``): bool or np.bool_ only,
    so that neither a truthy string nor an array (numpy's "truth value is ambiguous")
    slips through."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {_short_repr(value)}")
    return bool(value)


def check_causal(causal) -> bool:
    return check_flag("causal", causal)


def check_scale(softmax_scale, head_dim: int) -> float:
    """``softmax_scale`` as a float: None gives 1/sqrt(head_dim); otherwise a real number
    finite in float32 (the kernels' precision), |scale| <= 3.4e38.  0.0 is allowed
    (uniform attention)."""
    if softmax_scale is None:
        return 1.0 / float(np.sqrt(head_dim))
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale: expected a real number or None, got {_short_repr(softmax_scale)}")
    try:
        value = float(softmax_scale)
    except OverflowError:  # an int (or Fraction) beyond float64
        value = float("inf") if softmax_scale > 0 else float("-inf")
    if np.isnan(value):
        raise ValueError(f"softmax_scale: expected a finite number, got {_short_repr(softmax_scale)}")
    if not abs(value) <= FLOAT32_MAX:
        raise ValueError(
            f"softmax_scale: expected a finite number in the float32 range (|scale| <= 3.4e38), "
            f"got {_short_repr(softmax_scale)}"
        )
    return value


def check_qkv(q: Operand, k: Operand, v: Operand, layout: str):
    """Check q, k, v agree; return (B, Nq, Nk, H, d).  Any of B, Nq, Nk, H may be 0 (the
    API then returns empty outputs, or for Nk = 0 a zero output and lse = -inf)."""
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
    Hk = k.view.shape[2]
    if v.view.shape[2] != Hk:
        raise ValueError(f"v: heads ({heads}) must equal k's {Hk}, got {v.view.shape[2]}")
    if (Hk == 0) != (H == 0) or (Hk and H % Hk):
        raise ValueError(
            f"k, v: heads ({heads}) must divide q's {H} (grouped-query attention: query head h reads KV head "
            f"h // (heads_q / heads_kv)), got {Hk}"
        )
    if k.view.shape[3] != d or v.view.shape[3] != d:
        raise ValueError(f"k, v: head dim (axis 3) must equal q's {d}, got {k.view.shape[3]} and {v.view.shape[3]}")
    if v.view.shape[1] != Nk:
        raise ValueError(f"v: seqlen ({seq}) must equal k's {Nk}, got {v.view.shape[1]}")
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:
        raise ValueError(f"q: batch and heads must be at most {MAX_GRID_YZ} each, got batch={B}, heads={H}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {d} is not supported; expected 1 to {MAX_HEAD_DIM}")
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


def check_lse_packed(lse, q: Operand, H: int, total_q: int):
    """varlen's lse: (heads, total_q) float32, as flash_attention_varlen returns it."""
    kind, arr = _as_array("lse", lse)
    if kind != q.kind:
        raise TypeError("lse: must be on the same side (host/device) as q")
    if tuple(arr.shape) != (H, total_q):
        raise ValueError(f"lse: expected shape (heads, total_q) = {(H, total_q)}, got {tuple(arr.shape)}")
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

"""Tensor maps for TMA (``ptx.cp_async_bulk_tensor_{2,3,4}d_g2s``), built on the host.

A tensor map describes a 2-D to 5-D array in global memory and the box one TMA copy moves
into shared memory: the element type, the dimensions and byte strides (innermost first),
the box, the shared-memory swizzle, and zero fill out of bounds.  The CUDA driver encodes
it (``cuTensorMapEncodeTiled``, through ``cuda.bindings.driver``, which numba-cuda
already depends on) into 128 opaque bytes.  numba kernels cannot take a 128-byte
``__grid_constant__`` parameter, so :func:`tensor_map` returns those bytes as a uint8
device array that the kernel passes to the copy (seen on the H200:
``../shared/probes/tma_2d_mbarrier.py``).

Requirements the driver checks: a 16-byte-aligned base address, strides that are
multiples of 16 bytes, a box of at most 256 elements a dimension, and for a swizzle, an
innermost box of at most the swizzle's span (128 B: 64 fp16 elements).
"""

from __future__ import annotations

import collections
import ctypes
import itertools

import numpy as np

from numba_flash import _arrays as A
from numba_flash._numba_cuda import SIMULATOR

SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
_TYPES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32", "uint16": "UINT16", "uint32": "UINT32"}


_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "uint16": 2, "uint32": 4}


def check(dtype: str, shape, strides_bytes, box, swizzle: int, ptr: int = 0) -> None:
    """What ``cuTensorMapEncodeTiled`` needs, checked before the driver (or the
    simulator's stand-in) sees it: a known element type and swizzle, 2 to 5
    dimensions, strides and the base address 16-byte aligned, a box of 1 … 256
    elements a dimension inside the array's rank, and with a swizzle an innermost box
    of at most the swizzle's span."""
    if dtype not in _TYPES:
        raise TypeError(f"dtype {dtype!r}: expected one of {tuple(_TYPES)}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle={swizzle}: expected one of {tuple(SWIZZLES)} (bytes)")
    rank = len(shape)
    if rank not in (2, 3, 4, 5) or len(box) != rank or len(strides_bytes) != rank - 1:
        raise ValueError(f"shape {tuple(shape)}, box {tuple(box)}, strides {tuple(strides_bytes)}: expected a 2-D "
                         "to 5-D array, a box of as many dimensions, and a stride for each but the innermost")  # fmt: skip
    if any(s % 16 for s in strides_bytes) or ptr % 16:
        raise ValueError(f"strides {tuple(strides_bytes)} bytes, address {ptr:#x}: TMA needs both 16-byte aligned")
    if any(not 1 <= b <= 256 for b in box):
        raise ValueError(f"box {tuple(box)}: expected 1 to 256 elements a dimension")
    if swizzle and box[-1] * _SIZES[dtype] > swizzle:
        raise ValueError(f"box {tuple(box)}: its innermost {box[-1] * _SIZES[dtype]} bytes exceed the {swizzle}-byte "
                         "swizzle's span")  # fmt: skip


def encode(ptr: int, dtype: str, shape, strides_bytes, box, swizzle: int = 0) -> np.ndarray:
    """The 128 bytes of the tensor map of the array at device address ``ptr``:
    ``shape`` and ``box`` outermost first (as NumPy orders them), ``strides_bytes`` of
    every dimension but the innermost (contiguous), outermost first (in any order of
    size: a (B, N, H, d) array is mapped as (B, H, N, d))."""
    from cuda.bindings import driver as drv

    check(dtype, shape, strides_bytes, box, swizzle, ptr)
    rank = len(shape)
    kind = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TYPES[dtype]}")
    err, tmap = drv.cuTensorMapEncodeTiled(
        kind, drv.cuuint32_t(rank), ptr, [drv.cuuint64_t(n) for n in reversed(shape)],
        [drv.cuuint64_t(s) for s in reversed(strides_bytes)], [drv.cuuint32_t(b) for b in reversed(box)],
        [drv.cuuint32_t(1)] * rank, drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLES[swizzle]}"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # fmt: skip
    if err != drv.CUresult.CUDA_SUCCESS:
        raise ValueError(f"cuTensorMapEncodeTiled refused shape {tuple(shape)}, strides {tuple(strides_bytes)}, "
                         f"box {tuple(box)}, swizzle {swizzle}: {err}")  # fmt: skip
    return np.frombuffer(ctypes.string_at(tmap.getPtr(), 128), np.uint8).copy()


# The simulator's tensor maps: the driver is not there, so a map's 128 bytes carry a key
# (its first 8 bytes, little-endian) into this table of (array, box, swizzle), which the
# TMA twins (``_ptx_sim``) read.  Bounded: the oldest maps are dropped.
SIM_MAPS: collections.OrderedDict = collections.OrderedDict()
_SIM_KEEP = 4096
_sim_keys = itertools.count(1)


def _sim_map(array, box, swizzle: int) -> np.ndarray:
    key = next(_sim_keys)
    SIM_MAPS[key] = (array, tuple(int(b) for b in box), int(swizzle))
    while len(SIM_MAPS) > _SIM_KEEP:
        SIM_MAPS.popitem(last=False)
    raw = np.zeros(128, np.uint8)
    raw[:8] = np.frombuffer(np.uint64(key).tobytes(), np.uint8)
    return raw


def tensor_map(array, box, swizzle: int = 0):
    """The tensor map of ``array`` (a CuPy array, or in the simulator a NumPy one: 2-D
    to 5-D, innermost dimension contiguous, any strides outside it) for boxes of
    ``box`` elements (outermost first), as a 128-byte uint8 array on the device."""
    raw = _host_map(array, box, swizzle)
    return raw if SIMULATOR else A._cupy().asarray(raw)


def _host_map(array, box, swizzle: int) -> np.ndarray:
    """``tensor_map``'s 128 bytes on the host (the simulator's are its keyed stand-in)."""
    if array.ndim not in (2, 3, 4, 5) or array.strides[-1] != array.itemsize:
        raise ValueError(f"array: shape {array.shape}, strides {array.strides}: expected 2-D to 5-D with a "
                         "contiguous innermost dimension")  # fmt: skip
    dtype = A.dtype_name(array.dtype)
    if SIMULATOR:
        check(dtype, array.shape, array.strides[:-1], box, swizzle, array.ctypes.data)
        return _sim_map(array, box, swizzle)
    return encode(int(array.data.ptr), dtype, array.shape, array.strides[:-1], box, swizzle)


def _bhnd(x):
    """A (B, N, H, d) array as TMA maps it: (B, H, N, d), the rows of one head a box."""
    return x.transpose(0, 2, 1, 3)


_MAP_CACHE: collections.OrderedDict = collections.OrderedDict()  # what a map encodes -> the (3, 128) maps
_MAP_KEEP = 256


def _stack_maps(arrays, rows, swizzle):
    """The maps of ``arrays`` (boxes of ``rows`` rows), one (len, 128) device array (one
    host-to-device copy)."""
    atom = swizzle // arrays[0].itemsize  # columns a box: the swizzle's span
    maps = np.stack([_host_map(_bhnd(x), (1, 1, r, atom), swizzle) for x, r in zip(arrays, rows)])
    return maps if SIMULATOR else A._cupy().asarray(maps)


def attention_maps(q, k, v, block_m: int, block_n: int, swizzle: int = 128, dout=None):
    """The tensor maps of a forward's (B, N, H, d) q, k and v (and a backward's ``dout``
    after them), stacked as a (3, 128) (or (4, 128)) uint8 device array: boxes of
    ``block_m`` query rows (``block_n`` key rows) of one (batch, head) by ``swizzle / 2``
    columns (one 128-byte swizzle atom; d / 64 boxes cover a row), rows past the
    sequence zero-filled by TMA.  On a GPU they are cached by what they encode (address,
    shape, strides, boxes): a map holds no data, so a new array at the same address with
    the same layout reuses it correctly."""
    arrays = (q, k, v) + (() if dout is None else (dout,))
    rows = (block_m, block_n, block_n, block_m)[: len(arrays)]
    if SIMULATOR:
        return _stack_maps(arrays, rows, swizzle)
    key = tuple((int(x.data.ptr), x.shape, x.strides, str(x.dtype)) for x in arrays) + (
        A._cupy().cuda.Device().id, block_m, block_n, swizzle)
    maps = _MAP_CACHE.get(key)
    if maps is None:
        maps = _MAP_CACHE[key] = _stack_maps(arrays, rows, swizzle)
        while len(_MAP_CACHE) > _MAP_KEEP:
            _MAP_CACHE.popitem(last=False)
    else:
        _MAP_CACHE.move_to_end(key)
    return maps

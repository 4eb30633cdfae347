"""Tensor maps for TMA (``ptx.cp_async_bulk_tensor_{2,3}d_g2s``), built on the host.

A tensor map describes a 2-D or 3-D array in global memory and the box one TMA copy moves
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

import ctypes

import numpy as np

from numba_flash import _arrays as A

SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
_TYPES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32", "uint16": "UINT16", "uint32": "UINT32"}


def encode(ptr: int, dtype: str, shape, strides_bytes, box, swizzle: int = 0) -> np.ndarray:
    """The 128 bytes of the tensor map of the array at device address ``ptr``:
    ``shape`` and ``box`` outermost first (as NumPy orders them), ``strides_bytes`` of
    every dimension but the innermost (contiguous), outermost first."""
    from cuda.bindings import driver as drv

    if dtype not in _TYPES:
        raise TypeError(f"dtype {dtype!r}: expected one of {tuple(_TYPES)}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle={swizzle}: expected one of {tuple(SWIZZLES)} (bytes)")
    rank = len(shape)
    if rank not in (2, 3) or len(box) != rank or len(strides_bytes) != rank - 1:
        raise ValueError(f"shape {tuple(shape)}, box {tuple(box)}, strides {tuple(strides_bytes)}: expected a 2-D "
                         "or 3-D array, a box of as many dimensions, and a stride for each but the innermost")  # fmt: skip
    if any(s % 16 for s in strides_bytes) or ptr % 16:
        raise ValueError(f"strides {tuple(strides_bytes)} bytes, address {ptr:#x}: TMA needs both 16-byte aligned")
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


def tensor_map(array, box, swizzle: int = 0):
    """The tensor map of a CuPy ``array`` (2-D or 3-D, innermost dimension contiguous)
    for boxes of ``box`` elements (outermost first), as a 128-byte uint8 CuPy array."""
    cp = A._cupy()
    if array.ndim not in (2, 3) or array.strides[-1] != array.itemsize:
        raise ValueError(f"array: shape {array.shape}, strides {array.strides}: expected 2-D or 3-D with a "
                         "contiguous innermost dimension")  # fmt: skip
    raw = encode(int(array.data.ptr), A.dtype_name(array.dtype), array.shape, array.strides[:-1], box, swizzle)
    return cp.asarray(raw)

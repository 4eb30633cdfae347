"""Launching numba kernels on CuPy's current stream with little host work per call.

Every kernel of numba-flash is launched here, with the compute-side arrays themselves
(CuPy on a GPU, NumPy under the simulator) and Python floats.

Two things numba's own launch path (``kernel[grid, block, stream, smem](*args)``) does
not do for us:

1. **More than 48 KiB of shared memory.**  A block may use up to 227 KiB on Hopper, but
   only 48 KiB without asking: beyond that the kernel must use *dynamic* shared memory
   (``cuda.shared.array(0, dtype)``, sized at launch) and opt in once through the
   function attribute ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``.

2. **A cheap launch.**  numba wraps every CuPy array in a device-array object
   (``cuda.as_cuda_array``), types it, flattens each 4-D array into 13 kernel
   parameters (meminfo, parent, nitems, itemsize, data, shape×4, strides×4) as Python
   objects, wraps CuPy's stream, and launches through ``cuda.core``: tens of
   microseconds per launch, which is as long as a short kernel runs.  Here the
   first launch of a (kernel, argument types) pair goes through numba once (to compile
   and to learn the function handle); later ones write the same flattened parameters
   into one int64 buffer and call ``cuLaunchKernel`` through CuPy's driver binding.
   Every parameter of our kernels is 8 bytes wide (pointers, ``intp`` sizes and
   strides, float64 and int64 scalars; the ``params`` tuple of the variants is passed
   as its members, each int64 or float64), so one int64 slot each is numba's ABI
   exactly.

``NUMBA_FLASH_LAUNCH=numba`` switches every launch back to numba's own path (for
comparison: ``scripts/api_overhead.py``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from numba_flash._arrays import data_ptr
from numba_flash._numba_cuda import SIMULATOR

_NUMBA_PATH = os.environ.get("NUMBA_FLASH_LAUNCH", "direct") == "numba"
_prepared: dict = {}  # (id(kernel), smem, arg types) -> (handle, offsets)
_opted_in: set = set()


def _is_array(a) -> bool:
    return getattr(a, "ndim", 0) > 0  # NumPy scalars have a shape too, of ndim 0


def _arg_key(a):
    if _is_array(a):
        flags = a.flags
        return (a.dtype.str, a.ndim, flags.c_contiguous, flags.f_contiguous)
    if isinstance(a, tuple):
        return tuple(_arg_key(x) for x in a)
    return type(a)


def _slots(a) -> int:
    """8-byte parameter slots of argument ``a`` in numba's ABI."""
    if _is_array(a):
        return 2 * a.ndim + 5
    return sum(_slots(x) for x in a) if isinstance(a, tuple) else 1


def _numba_args(args):
    """``args`` as numba takes them (arrays wrapped, nested tuples alike)."""
    from numba_flash._arrays import kernel_arg

    return [kernel_arg(a) if _is_array(a) else tuple(_numba_args(a)) if isinstance(a, tuple) else a for a in args]


def _stream_ptr() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def _allow_dynamic_smem(compiled, nbytes: int) -> None:
    """Raise the kernel's dynamic shared-memory limit to ``nbytes`` (once per size)."""
    from numba.cuda.cudadrv.driver import binding, driver

    cufunc = compiled._codelibrary.get_cufunc()
    key = (int(cufunc.handle), nbytes)
    if key in _opted_in:
        return
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _opted_in.add(key)


def _prepare(kernel, shared_bytes: int, args):
    """Compile ``kernel`` for ``args`` through numba (or load it from the on-disk cache,
    ``numba_flash._cache``), opt in to the shared memory, and return (function handle,
    number of 8-byte parameters)."""
    from numba_flash import _cache

    _cache.enable(kernel)
    compiled = kernel._compile_for_args(*_numba_args(args))
    if shared_bytes > 0:
        _allow_dynamic_smem(compiled, shared_bytes)
    count = sum(_slots(a) for a in args)
    handle = int(compiled._codelibrary.get_cufunc().handle)
    return handle, np.arange(count, dtype=np.uint64) * 8


def _pack(args, count: int) -> np.ndarray:
    vals = []
    _flatten(args, vals)
    buf = np.array(vals, dtype=np.int64)
    assert buf.size == count
    return buf


def _flatten(args, vals: list) -> None:
    """numba's flattened parameters of ``args`` (tuples member by member, nested
    alike), one int64 slot each."""
    for a in args:
        if _is_array(a):
            # meminfo, parent, nitems, itemsize, data, shape..., strides... (numba's order)
            vals += (0, 0, a.size, a.itemsize, data_ptr(a), *a.shape, *a.strides)
        elif isinstance(a, tuple):
            _flatten(a, vals)
        else:
            vals.append(_scalar_slot(a))


def _scalar_slot(x) -> int:
    """A scalar's slot: float64 and int64 fill it; a 4-, 2- or 1-byte NumPy scalar
    (FlexAttention's mod_args: float32, int32, bool) sits in its low bytes, which is
    where the driver reads a parameter of that size (little-endian)."""
    if isinstance(x, float):
        return struct.unpack("<q", struct.pack("<d", x))[0]
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, (np.number, np.bool_)):
        raw = np.zeros(8, np.uint8)
        raw[: x.itemsize] = np.frombuffer(np.array(x).tobytes(), np.uint8)
        return int(raw.view(np.int64)[0])
    raise TypeError(f"kernel argument of type {type(x).__name__} is not supported by launch()")


def launch(kernel, grid, threads, shared_bytes: int, *args, cluster: tuple = (1, 1, 1)) -> None:
    """``kernel[grid, threads, current CuPy stream, shared_bytes](*args)``.

    ``args`` are compute-side arrays (CuPy, or NumPy under the simulator) and Python
    floats; arrays are passed as they are (zero-copy, any strides).  ``cluster``: the
    dimensions of thread-block clusters (``cuLaunchKernelEx``; sm_90+; the simulator runs
    one block at a time and has none), (1, 1, 1) for none."""
    if _clustered(cluster) and (SIMULATOR or _NUMBA_PATH):
        raise ValueError(f"cluster={cluster}: thread-block clusters need the direct launch on an sm_90+ GPU")
    if SIMULATOR:
        kernel[grid, threads, 0, shared_bytes](*_numba_args(args))
        return
    key = (id(kernel), shared_bytes, tuple(_arg_key(a) for a in args))
    prepared = _prepared.get(key)
    if prepared is None:
        prepared = _prepared[key] = _prepare(kernel, shared_bytes, args)
    if _NUMBA_PATH:
        from numba_flash._arrays import launch_stream

        kernel[grid, threads, launch_stream(), shared_bytes](*_numba_args(args))
        return
    handle, offsets = prepared
    _launch_packed(handle, grid, threads, shared_bytes, offsets, _pack(args, offsets.size), cluster)


def _clustered(cluster) -> bool:
    return tuple(cluster) != (1, 1, 1)


def _launch_packed(handle, grid, threads, shared_bytes: int, offsets, buf, cluster=(1, 1, 1)) -> None:
    """``cuLaunchKernel`` of function ``handle`` on CuPy's current stream with the
    parameters packed in ``buf`` (one 8-byte slot each, at byte ``offsets``);
    ``cuLaunchKernelEx`` with the cluster dimensions ``cluster`` when not (1, 1, 1)."""
    params = offsets + np.uint64(buf.__array_interface__["data"][0])
    gx, gy, gz = grid if isinstance(grid, tuple) else (grid, 1, 1)
    if _clustered(cluster):
        _launch_cluster(handle, (gx, gy, gz), threads, shared_bytes, params.__array_interface__["data"][0], cluster)
        return
    from cupy.cuda import driver

    driver.launchKernel(
        handle, gx, gy, gz, threads, 1, 1, shared_bytes, _stream_ptr(), params.__array_interface__["data"][0], 0
    )


_cluster_configs: dict = {}  # (grid, threads, smem, cluster, stream) -> cuLaunchKernelEx's CUlaunchConfig


def _launch_cluster(handle, grid, threads, shared_bytes: int, params_ptr: int, cluster: tuple) -> None:
    """``cuLaunchKernelEx`` (cuda-bindings, which numba-cuda depends on) of ``handle``
    with thread-block clusters of ``cluster`` (x, y, z) CTAs; its launch configuration
    made once per shape and stream."""
    from cuda.bindings import driver as cu

    stream = _stream_ptr()
    cluster = tuple(cluster)
    key = (grid, threads, shared_bytes, cluster, stream)
    cfg = _cluster_configs.get(key)
    if cfg is None:
        if any(g % c for g, c in zip(grid, cluster)):
            raise ValueError(f"cluster={cluster}: every dimension of the grid {grid} must be a multiple of "
                             "the cluster's")
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
        cfg.sharedMemBytes = shared_bytes
        cfg.hStream = cu.CUstream(stream)
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        _cluster_configs[key] = cfg
    (err,) = cu.cuLaunchKernelEx(cfg, cu.CUfunction(handle), params_ptr, 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx with clusters of {cluster} CTAs failed: {err!r}")


# --- replay: a launch recorded once, its parameters patched per call ----------------------
# (``numba_flash._replay`` records the API's calls; this is the launch-level half.)

#: Where an array's address sits among its 2·ndim + 5 slots (meminfo, parent, nitems, itemsize, data, …).
_DATA_SLOT = 4


@dataclass(frozen=True)
class Replay:
    """One launch of a recorded call: the function handle, grid, threads, shared memory
    and the call's parameters packed (``base``), with the slots that change from call to
    call named by the role of the argument that fills them: ``pointers`` (slot, role) for
    an array argument's address (the shape and strides, pinned by the call's signature,
    stay), ``values`` (slot, width, role) for a tuple or scalar argument (``params``, the
    scale).  ``roles[i]`` named argument i (None: pinned by the signature, its slots kept);
    ``handle`` is 0 in the simulator, which launches through numba (:func:`patched` is
    still checked there)."""

    grid: tuple
    threads: int
    shared_bytes: int
    handle: int
    offsets: np.ndarray
    base: np.ndarray
    pointers: tuple
    values: tuple
    last: dict = field(default_factory=dict)  # role -> (value, its slots): the last call's, reused when equal
    cluster: tuple = (1, 1, 1)  # the thread-block cluster's dimensions (``launch``)


def recorded(kernel, grid, threads, shared_bytes: int, args, roles, cluster=(1, 1, 1)) -> Replay:
    """The :class:`Replay` of ``launch(kernel, grid, threads, shared_bytes, *args)`` just
    made, argument i coming from role ``roles[i]``."""
    count = sum(_slots(a) for a in args)
    handle, offsets = 0, np.arange(count, dtype=np.uint64) * 8
    if not SIMULATOR:  # what ``launch`` prepared for these arguments
        handle, offsets = _prepared[(id(kernel), shared_bytes, tuple(_arg_key(a) for a in args))]
    pointers, values, slot = [], [], 0
    for a, role in zip(args, roles):
        width = _slots(a)
        if role is None:  # pinned: the recorded slots stay
            pass
        elif _is_array(a):
            pointers.append((slot + _DATA_SLOT, role))
        else:
            values.append((slot, width, role))
        slot += width
    return Replay(grid, threads, shared_bytes, handle, offsets, _pack(args, count), tuple(pointers), tuple(values),
                  cluster=tuple(cluster))


def patched(rep: Replay, buffers: dict) -> np.ndarray:
    """``rep``'s parameters for a call whose arguments come from ``buffers`` (role →
    array, tuple or scalar, as the recorded call's): the addresses and values of this
    call in the recorded call's packing."""
    buf = rep.base.copy()
    for slot, role in rep.pointers:
        x = buffers[role]
        if callable(x):  # an array made for each launch that binds it (``api._scheduler``'s counter)
            x = x(None)
        buf[slot] = data_ptr(x)
    for slot, width, role in rep.values:
        value = buffers[role]
        last = rep.last.get(role)
        if last is None or last[0] != value:  # ``params``, the same tuple while the seed is
            vals = []
            _flatten((value,), vals)
            last = (value, vals)
            if type(value) is tuple and all(type(x) in (int, float) for x in value):  # compares as one bool
                rep.last[role] = last
        buf[slot : slot + width] = last[1]
    return buf


def replay(rep: Replay, buffers: dict) -> None:
    """Launch ``rep`` on CuPy's current stream with this call's ``buffers`` (on a GPU)."""
    _launch_packed(rep.handle, rep.grid, rep.threads, rep.shared_bytes, rep.offsets, patched(rep, buffers), rep.cluster)

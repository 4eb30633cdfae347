"""numba's on-disk cache for numba-flash's kernels, so that a second process starts warm.

A kernel's first launch compiles it (typing, NVVM, the link): 1.5–3 s per kernel on an
H200, paid again by every new process.  numba-cuda can keep compiled kernels on disk
(``cuda.jit(cache=True)``), but as shipped (0.30) it cannot serve ours correctly:

* our kernels are made by factories, closing over their tiles and over ``@intrinsic``
  objects (``ptx.mma_*``).  numba keys the cache by the cloudpickled closure values,
  and an intrinsic pickles a per-process uuid: every process misses and adds a file;
* the key covers the kernel's own source file only, not the device functions it calls
  from ``numba_flash.kernels`` (``softmax``, ``copy``, ...) or ``ptx``: after an edit
  there, an old kernel would load;
* data files are numbered from the index a process just read, so two processes saving
  variants of one kernel at once can point a key at the other's data.

:class:`FlashCache` replaces the key: the kernel's bytecode, a stable text of each
closure value (ints, bools, tile dataclasses, intrinsics and device functions by
name), and a hash of every source file of the package; one index a variant, data files
named by the key's hash.  :func:`enable` attaches it to a dispatcher before its first
compile (``_launch`` does); a cache hit then loads the stored cubin and skips NVVM and
the link.  ``NUMBA_FLASH_CACHE=0`` turns it off; numba's ``NUMBA_CACHE_DIR`` says where
the files go (default: ``__pycache__`` beside the kernel modules, or numba's user-wide
cache directory when that is not writable).  Uses numba-cuda internals (``CUDACache``,
``_index_key``, ``IndexDataCacheFile``), pinned by ``numba-cuda<0.31``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import warnings

import numpy as np

PACKAGE = pathlib.Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 of every .py file of the package (any edit invalidates every kernel)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class UserFunction(TypeError):
    """A kernel closes over a user's function (FlexAttention): compiled per process."""


def stable_text(value) -> str:
    """A text for a closure value that is the same in every process (TypeError for a
    value with none: that kernel is then not cached)."""
    from numba.cuda.dispatcher import CUDADispatcher
    from numba.cuda.extending import _Intrinsic

    if value is None or isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, np.generic):
        return f"{value.dtype}:{value!r}"
    if isinstance(value, tuple):
        return "(" + ",".join(map(stable_text, value)) + ")"
    if isinstance(value, _Intrinsic):
        return f"intrinsic:{value._defn.__module__}.{value._name}"
    if isinstance(value, CUDADispatcher):
        if not value.py_func.__module__.startswith("numba_flash"):  # a user's score_mod / mask_mod: its
            # name says nothing of its body (two scripts' functions may share one), so not cached
            raise UserFunction(value.py_func.__qualname__)
        # a device function made by a factory (``tc_backward._row_delta_fn``, ``hopper.ss_chain``) is the same
        # name for every closure it was made with: its closure values belong to the key
        cells = ",".join(stable_text(c.cell_contents) for c in value.py_func.__closure__ or ())
        return f"device:{value.py_func.__module__}.{value.py_func.__qualname__}[{cells}]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return repr(value)
    raise TypeError(f"no stable cache key for a closure value of type {type(value).__name__}")


def variant_key(py_func) -> str:
    """What distinguishes one compiled kernel from every other: bytecode, closure
    values, the package's sources."""
    cells = tuple(stable_text(c.cell_contents) for c in py_func.__closure__ or ())
    text = repr((py_func.__qualname__, py_func.__code__.co_code, cells, source_hash()))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_class():
    import numba_cuda
    from numba.cuda.core.caching import IndexDataCacheFile
    from numba.cuda.dispatcher import CUDACache

    class KeyedDataFile(IndexDataCacheFile):
        """Data named by the key's hash, written before the index entry pointing at it."""

        def save(self, key, data):
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            name = self._data_name_pattern.replace("{number:d}", digest)
            self._save_data(name, data)
            self._save_index({**self._load_index(), key: name})

    class FlashCache(CUDACache):
        def __init__(self, py_func):
            self._variant = variant_key(py_func)
            super().__init__(py_func)
            stamp = self._impl.locator.get_source_stamp()
            self._cache_file = KeyedDataFile(self._cache_path, f"{self._impl.filename_base}-{self._variant}", stamp)

        def _index_key(self, sig, codegen):
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, self._variant)
            if getattr(self, "_launch_config_key", None) is not None:
                key += (("launch_config", self._launch_config_key),)
            return key

    return FlashCache


def enable(kernel) -> None:
    """Attach :class:`FlashCache` to a kernel dispatcher before its first compile
    (idempotent; nothing under the simulator or with ``NUMBA_FLASH_CACHE=0``)."""
    if os.environ.get("NUMBA_FLASH_CACHE", "1") == "0" or getattr(kernel, "_numba_flash_cached", False):
        return
    kernel._numba_flash_cached = True
    try:
        kernel._cache = _cache_class()(kernel.py_func)
    except UserFunction:
        return
    except Exception as exc:  # an unkeyable closure value, no writable cache directory
        warnings.warn(f"{kernel.py_func.__qualname__}: not cached on disk ({exc})", stacklevel=2)

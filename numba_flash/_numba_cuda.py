"""The one place numba-flash imports numba's CUDA programming model from.

Every kernel module does ``from numba_flash._numba_cuda import cuda`` rather than
``from numba import cuda``, so a second backend (numba-cuda-mlir, say) can be added
later by changing this module alone.  (``numba_flash._gpu_probe`` is its counterpart
that imports no numba: it asks the driver whether there is a GPU before numba is
imported, which fixes whether the simulator is on.)

``SIMULATOR`` is True when numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``):
kernels then run on the CPU, one Python thread per CUDA thread, and NumPy arrays are
passed to them as they are.

``device_function`` is how the kernels' shared building blocks (``numba_flash.kernels``:
``block_info``, ``mask``, ``softmax``, ``copy``, ``pipeline``, ``fragments``,
``microtile``; docs/architecture.md) are declared: numba device functions
marked ``alwaysinline`` (``forceinline=True``), so that after inlining their register
arrays and compile-time arguments fold into the caller as if written there.

``kernel(launch_bounds=..., whole_program=...)`` is ``cuda.jit`` with launch bounds where
the target has them, and optionally assembled by the driver as a whole program
(``whole_program``'s docstring: ``setmaxnreg`` and overlapped ``wgmma`` need it).

``compiling_for(cc)`` lets ``numba.cuda.compile_ptx`` compile kernels that call device
functions on a machine without a GPU (see its docstring).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import warnings

from numba import cuda, config, float32, int32, int64, uint8, uint16, uint32, uint64  # noqa: F401

SIMULATOR: bool = bool(config.ENABLE_CUDASIM)

if SIMULATOR:  # the simulator lacks warp shuffles and syncwarp: add faithful twins
    from numba_flash import _ptx_sim

    _ptx_sim.install_warp_twins()


def device_function(fn):
    """``@device_function``: a numba CUDA device function, always inlined into its
    caller (NVVM ``alwaysinline``).  The simulator's ``cuda.jit`` has no
    ``forceinline``, and there a device function is a plain Python call."""
    if SIMULATOR:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


def kernel(launch_bounds=None, whole_program=False):
    """``@kernel(launch_bounds=(threads, min_blocks))``: ``cuda.jit`` with PTX launch
    bounds (``.maxntid``, ``.minnctapersm``: ptxas then caps the registers at what that
    many threads leave, as ``setmaxnreg`` needs); the simulator's ``cuda.jit`` has no
    such option, and there it is a plain kernel.  ``whole_program``: each compiled
    overload is assembled by ``whole_program`` (below)."""
    if SIMULATOR or launch_bounds is None:
        return cuda.jit

    def deco(fn):
        disp = cuda.jit(launch_bounds=launch_bounds)(fn)
        if whole_program and os.environ.get("NUMBA_FLASH_WHOLE_PROGRAM", "1") != "0":
            whole_program_dispatcher(disp)
            disp._numba_flash_whole_program = True  # ``inspection.resources`` assembles it as the GPU does
        return disp

    return deco


#: What assembled each whole-program kernel's overloads (``whole_program_dispatcher``):
#: entry name → "driver JIT (whole program)" or why numba's linker did.
ASSEMBLED: dict = {}


def whole_program_dispatcher(disp):
    """Assemble every overload ``disp`` compiles from its PTX by the driver's JIT as one
    whole program, instead of numba-cuda's linker.

    numba-cuda links a kernel with nvJitLink (or the driver's linker), which assembles
    its PTX as a relocatable unit (``ptxas -c``).  In that mode ptxas ignores
    ``setmaxnreg`` ("to maintain compatibility across compilation units", C7504), so a
    warp-specialized kernel keeps 168 registers a thread in its consumers, and it
    serializes every ``wgmma`` (C7509), so no two run at once.  The driver's JIT
    assembles a module's PTX whole (``cuda.core.ObjectCode.from_ptx``); its PTX ISA may
    be older than NVVM's, and the ``.version`` line is lowered to it (``driver_ptx``).
    Where the driver cannot load the result, numba's linker assembles it as before,
    with a warning.  ``NUMBA_FLASH_WHOLE_PROGRAM=0`` turns this off."""
    compile_one = disp.compile

    def compile(sig):
        k = compile_one(sig)
        lib = k._codelibrary
        if not getattr(lib, "_numba_flash_whole", False):
            lib._numba_flash_whole = True
            cc = lib._ensure_cc(None)
            try:
                from cuda.core import ObjectCode

                # bytes: from_ptx takes a str for a file's path
                obj = ObjectCode.from_ptx(driver_ptx(lib.get_asm_str(cc)).encode(), name=disp.__name__)
                obj.get_kernel(lib._entry_name)  # the driver JIT-compiles the module here
                lib._cubin_cache[cc] = obj
                ASSEMBLED[lib._entry_name] = "driver JIT (whole program)"
            except Exception as exc:  # an older driver or PTX it cannot take: numba's linker
                ASSEMBLED[lib._entry_name] = f"numba's linker ({type(exc).__name__}: {str(exc)[:100]})"
                warnings.warn(f"{disp.__name__}: the driver could not assemble the whole program "
                              f"({type(exc).__name__}: {exc}); numba's linker does (slower)", stacklevel=2)  # fmt: skip
        return k

    disp.compile = compile
    return disp


def driver_ptx(ptx: str, driver_version: tuple | None = None) -> str:
    """``ptx`` with its ``.version`` lowered to the newest PTX ISA the driver
    (``driver_version``, default the installed one's (major, minor)) JIT-compiles:
    CUDA 13.x takes 9.x.  Unchanged when it is not newer or the driver is not a CUDA 13
    one."""
    if driver_version is None:
        from numba.cuda.cudadrv.driver import driver

        driver_version = driver.get_version()
    major, minor = driver_version
    m = re.search(r"^\.version (\d+)\.(\d+)", ptx, re.M)
    if major != 13 or m is None:
        return ptx
    have, best = (int(m.group(1)), int(m.group(2))), (9, minor)
    if have <= best:
        return ptx
    return ptx[: m.start()] + f".version {best[0]}.{best[1]}" + ptx[m.end():]


def gpu_available() -> bool:
    """True when kernels run on a real CUDA device (not the simulator)."""
    return not SIMULATOR and _device_found()


@functools.lru_cache(maxsize=None)
def _device_found() -> bool:  # asked once a process: the API asks on every call
    try:
        return bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver missing or broken
        return False


def compute_capability() -> tuple:
    """The current device's (major, minor); (9, 0) in the simulator, which runs every
    kernel (the tensor-core ones through their twins)."""
    if SIMULATOR:
        return (9, 0)
    import cupy

    dev = cupy.cuda.Device()
    cc = _CC.get(dev.id)
    if cc is None:
        cc = _CC[dev.id] = tuple(int(x) for x in divmod(int(dev.compute_capability), 10))
    return cc


_CC: dict = {}


def l2_cache() -> tuple:
    """The current device's ``(L2 bytes, SMs)``, which size a heaviest-first grid's L2
    sections (``kernels.spec.l2_sections``); an H100's / H200's (``DEFAULT_L2_BYTES``,
    ``DEFAULT_SMS``) in the simulator."""
    from numba_flash.kernels.spec import DEFAULT_L2_BYTES, DEFAULT_SMS

    if SIMULATOR:
        return DEFAULT_L2_BYTES, DEFAULT_SMS
    import cupy

    dev = cupy.cuda.Device()
    got = _L2.get(dev.id)
    if got is None:
        attrs = dev.attributes
        got = _L2[dev.id] = (int(attrs.get("L2CacheSize", DEFAULT_L2_BYTES)),
                             int(attrs.get("MultiProcessorCount", DEFAULT_SMS)))  # fmt: skip
    return got


_L2: dict = {}


def target_arch() -> tuple:
    """The current device's compile target as the launch plan sees it (``target_of``)."""
    return target_of(compute_capability())


def target_of(cc: tuple) -> tuple:
    """The compile target of compute capability ``cc`` (major, minor): ``"a"`` appended
    from 9.0 on, as numba-cuda targets the arch-specific ``sm_XYa`` there
    (``codegen._ensure_cc``): (9, 0, "a") on an H100/H200, where wgmma and setmaxnreg exist."""
    return tuple(cc) + ("a",) if tuple(cc) >= (9, 0) else tuple(cc)


class _TargetDevice:
    """What ``CUDADispatcher.compile_device`` reads of the current device."""

    def __init__(self, cc):
        self.compute_capability = tuple(cc[:2])


_compile_lock = threading.Lock()


@contextlib.contextmanager
def compiling_for(cc):
    """Compile device functions for compute capability ``cc`` without a GPU.

    ``numba.cuda.compile_ptx`` compiles a kernel for any ``cc`` without a GPU, but a
    device function it calls is compiled by ``CUDADispatcher.compile_device``, which
    asks ``get_current_device()`` for the compute capability only (numba-cuda 0.30,
    ``numba/cuda/dispatcher.py``), and that needs a driver.  Inside this context that
    lookup answers ``cc``.  The device function's compiled form is LLVM IR that the
    kernel's own compilation (for its own ``cc``) links and inlines, so the answer only
    has to be a valid target.  Pinned to numba-cuda < 0.31 (pyproject.toml); if a
    later version moves the lookup, ``inspect`` fails loudly with numba's
    "CUDA driver library cannot be found" instead of compiling for the wrong target.
    """
    from numba.cuda import dispatcher

    with _compile_lock:
        saved = dispatcher.get_current_device
        if gpu_available():  # a real device answers for itself
            yield
            return
        dispatcher.get_current_device = lambda: _TargetDevice(cc)
        try:
            yield
        finally:
            dispatcher.get_current_device = saved

"""The one place numba-flash imports the GPU programming model from.

Every kernel module does ``from numba_flash._backend import cuda`` rather than
``from numba import cuda``, so a second backend (numba-cuda-mlir, say) can be
added later by changing this module alone.

``SIMULATOR`` is True when numba's CUDA simulator is on
(``NUMBA_ENABLE_CUDASIM=1``): kernels then run on the CPU, one Python thread per
CUDA thread, and NumPy arrays are passed to them as they are.
"""

from numba import cuda, config, float32, int32, int64, uint32, uint16  # noqa: F401

SIMULATOR: bool = bool(config.ENABLE_CUDASIM)

if SIMULATOR:  # the simulator lacks warp shuffles and syncwarp: add faithful twins
    from numba_flash import _simwarp

    _simwarp.install()


def gpu_available() -> bool:
    """True when kernels run on a real CUDA device (not the simulator)."""
    if SIMULATOR:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver missing or broken
        return False

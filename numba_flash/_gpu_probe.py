"""Is there a CUDA device?  Answered without importing numba.

numba reads ``NUMBA_ENABLE_CUDASIM`` once, when ``numba.cuda`` is first imported, so
whoever wants the simulator on a machine without a GPU (the test suite, the command
line) must decide before that import.  This asks the driver directly through ctypes.
"""

from __future__ import annotations

import ctypes
import os


def cuda_device_present() -> bool:
    """True when the CUDA driver loads and reports at least one device."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return False
    try:
        if lib.cuInit(0) != 0:
            return False
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except Exception:  # pragma: no cover - a broken driver
        return False


def use_simulator_without_gpu() -> bool:
    """Turn numba's CUDA simulator on unless a GPU is present or the user chose already.

    Must run before numba is imported.  Returns True when the simulator will be used.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not cuda_device_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

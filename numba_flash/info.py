"""``numba-flash info``: the device, the software stack, and which kernels exist.

:func:`gather_info` returns a JSON-able dict; every field that cannot be read (no GPU,
the simulator on, a package missing) is the string ``"n/a"`` instead of an error::

    {"simulator": bool, "mode": "gpu" | "simulator" | "none",
     "device": {"name", "compute_capability", "sms", "shared_memory_per_block",
                "shared_memory_per_block_optin", "l2_cache", "total_memory",
                "driver_version", "runtime_version"},
     "versions": {"python", "numba_flash", "numba", "numba-cuda", "cupy", "numpy",
                  "ml_dtypes", "torch", "nvvm"},
     "kernels": [{"dtype", "head_dims", "forward", "backward"}, ...]}
"""

from __future__ import annotations

import platform
import sys

NA = "n/a"


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return NA
    try:
        return version(name)
    except PackageNotFoundError:
        return NA


def _cuda_version(v) -> str:
    """12080 → "12.8"; (12, 8) → "12.8"."""
    try:
        if isinstance(v, (tuple, list)):
            return ".".join(str(int(x)) for x in v)
        v = int(v)
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        return NA


def _first_dist(*names: str) -> str:
    for n in names:
        v = _dist_version(n)
        if v != NA:
            return f"{v} ({n})" if n not in ("cupy",) else v
    return NA


def versions() -> dict:
    import numpy

    from numba_flash import __version__

    out = {
        "python": platform.python_version(),
        "numba_flash": __version__,
        "numba": NA,
        "numba-cuda": _dist_version("numba-cuda"),
        "cupy": _first_dist("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
        "numpy": numpy.__version__,
        "ml_dtypes": _dist_version("ml_dtypes"),
        "torch": _dist_version("torch"),
        "nvvm": NA,
    }
    try:
        import numba

        out["numba"] = numba.__version__
    except Exception:  # pragma: no cover
        pass
    return out


def _nvvm_version() -> str:
    try:
        from numba.cuda.cudadrv import nvvm

        return _cuda_version(nvvm.NVVM().get_version())
    except Exception:
        return NA


def device_info(mode: str) -> dict:
    """Device properties through CuPy (numba as a fall-back); "n/a" without a GPU."""
    info = {
        "name": NA,
        "compute_capability": NA,
        "sms": NA,
        "shared_memory_per_block": NA,
        "shared_memory_per_block_optin": NA,
        "l2_cache": NA,
        "total_memory": NA,
        "driver_version": NA,
        "runtime_version": NA,
    }
    if mode != "gpu":
        return info
    try:
        import cupy

        dev = cupy.cuda.Device()
        p = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = p.get("name", NA)
        info["name"] = name.decode() if isinstance(name, bytes) else str(name)
        info["compute_capability"] = f"{p['major']}.{p['minor']}"
        info["sms"] = int(p["multiProcessorCount"])
        info["shared_memory_per_block"] = int(p["sharedMemPerBlock"])
        info["shared_memory_per_block_optin"] = int(p.get("sharedMemPerBlockOptin", 0)) or NA
        info["l2_cache"] = int(p["l2CacheSize"])
        info["total_memory"] = int(p["totalGlobalMem"])
        info["driver_version"] = _cuda_version(cupy.cuda.runtime.driverGetVersion())
        info["runtime_version"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        pass
    if info["name"] == NA:  # no CuPy: ask numba
        try:
            from numba import cuda

            dev = cuda.get_current_device()
            name = dev.name
            info["name"] = name.decode() if isinstance(name, bytes) else str(name)
            info["compute_capability"] = "%d.%d" % dev.compute_capability
            info["sms"] = int(dev.MULTIPROCESSOR_COUNT)
            info["shared_memory_per_block"] = int(dev.MAX_SHARED_MEMORY_PER_BLOCK)
            info["shared_memory_per_block_optin"] = int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        except Exception:
            pass
    if info["driver_version"] == NA:
        try:
            from numba.cuda.cudadrv.driver import driver

            info["driver_version"] = _cuda_version(driver.get_version())
        except Exception:
            pass
    if info["runtime_version"] == NA:
        try:
            from numba import cuda

            info["runtime_version"] = _cuda_version(cuda.runtime.get_version())
        except Exception:
            pass
    return info


def gather_info() -> dict:
    """Everything ``numba-flash info`` prints, as a dict."""
    from numba_flash import plan
    from numba_flash._numba_cuda import target_of
    from numba_flash.check import runtime_mode

    mode = runtime_mode()
    v = versions()
    v["nvvm"] = _nvvm_version() if mode != "simulator" else NA
    device = device_info(mode)
    cc = device["compute_capability"]
    # the simulator runs every kernel; numba-cuda's target from 9.0 on is sm_XYa
    arch = target_of(tuple(int(x) for x in cc.split(".")) if cc != NA else (9, 0))
    try:
        kernels = plan.table(arch, simulator=mode == "simulator")
    except Exception as exc:  # pragma: no cover - a broken install
        kernels = [{"dtype": NA, "head_dims": NA, "forward": f"error: {exc}", "backward": NA}]
    return {
        "simulator": mode == "simulator",
        "mode": mode,
        "device": device,
        "versions": v,
        "kernels": kernels,
        "platform": f"{platform.system()} {platform.machine()}",
        "executable": sys.executable,
    }

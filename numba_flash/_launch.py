"""Launching numba kernels that need more than 48 KiB of shared memory.

A block may use up to 227 KiB of shared memory on Hopper, but only 48 KiB without
asking: beyond that the kernel must use *dynamic* shared memory
(``cuda.shared.array(0, dtype)``, sized at launch) and opt in once through the
function attribute ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``.  numba-cuda has
no option for it, so ``launch`` compiles the kernel for the arguments, sets the
attribute on the loaded function, and launches.
"""

from __future__ import annotations

from numba_flash._backend import SIMULATOR

STATIC_LIMIT = 48 * 1024
_opted_in: dict = {}


def _allow_dynamic_smem(kernel, args, nbytes: int) -> None:
    from numba.cuda.cudadrv.driver import binding, driver

    compiled = kernel._compile_for_args(*args)
    cufunc = compiled._codelibrary.get_cufunc()
    key = (id(cufunc), cufunc.device.id)
    if _opted_in.get(key, 0) >= nbytes:
        return
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _opted_in[key] = nbytes


def launch(kernel, grid, threads, stream, shared_bytes: int, *args) -> None:
    """``kernel[grid, threads, stream, shared_bytes](*args)``, opting in to more than
    48 KiB of dynamic shared memory first when needed."""
    if shared_bytes > STATIC_LIMIT and not SIMULATOR:
        _allow_dynamic_smem(kernel, args, shared_bytes)
    kernel[grid, threads, stream, shared_bytes](*args)

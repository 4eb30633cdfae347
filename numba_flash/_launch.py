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


def _layout_key(args) -> tuple:
    return tuple(
        (a.is_c_contiguous(), a.is_f_contiguous()) if hasattr(a, "is_c_contiguous") else type(a) for a in args
    )


def _allow_dynamic_smem(kernel, args, nbytes: int) -> None:
    from numba.cuda.cudadrv.driver import binding, driver

    key = (id(kernel), nbytes, _layout_key(args))
    if key in _opted_in:
        return
    cufunc = kernel._compile_for_args(*args)._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _opted_in[key] = True


def launch(kernel, grid, threads, stream, shared_bytes: int, *args) -> None:
    """``kernel[grid, threads, stream, shared_bytes](*args)``, opting in to the dynamic
    shared memory first: static and dynamic together may not pass 48 KiB otherwise, and
    some kernels add a small static array to their dynamic one."""
    if shared_bytes > 0 and not SIMULATOR:
        _allow_dynamic_smem(kernel, args, shared_bytes)
    kernel[grid, threads, stream, shared_bytes](*args)

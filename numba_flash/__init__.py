"""numba-flash: exact FlashAttention, forward and backward, with kernels written in numba.cuda.

    >>> import numba_flash
    >>> out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)

``numba_flash.reference`` holds the float64 NumPy reference (standard attention, the
online softmax, the tiled algorithm, the backward).
"""

from numba_flash.api import flash_attention, flash_attention_backward

__version__ = "0.1.0"
__all__ = ["flash_attention", "flash_attention_backward", "__version__"]

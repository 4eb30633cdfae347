"""numba-flash: exact FlashAttention, forward and backward, with kernels written in numba.cuda.

    >>> import numba_flash
    >>> out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)

``numba_flash.reference`` holds the float64 NumPy reference (standard attention, the
online softmax, the tiled algorithm, the backward).

Importing this package does not import numba: the API is loaded on first use, so that a
program (the test suite, the command line) can still choose numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM``, read once when numba.cuda is imported) after
``import numba_flash``.
"""

__version__ = "0.1.0"
__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_varlen",
    "flash_attention_varlen_backward",
    "BlockMask",
    "create_block_mask",
    "merge_attention",
    "flash_attention_with_kvcache",
    "__version__",
]


def __getattr__(name):
    if name in __all__[:4]:
        from numba_flash import api

        return getattr(api, name)
    if name in ("BlockMask", "create_block_mask"):
        from numba_flash import block_mask

        return getattr(block_mask, name)
    if name == "merge_attention":
        from numba_flash.merge import merge_attention

        return merge_attention
    if name == "flash_attention_with_kvcache":
        from numba_flash.kvcache import flash_attention_with_kvcache

        return flash_attention_with_kvcache
    raise AttributeError(f"module 'numba_flash' has no attribute {name!r}")

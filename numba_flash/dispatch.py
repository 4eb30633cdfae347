"""Which kernels run for a (pass, dtype, head dim, causal): one table for the API,
``numba-flash info`` and ``numba-flash inspect``.

``kernels_for`` returns the launch plan of a pass as ``KernelSpec`` records: the numba
dispatcher, its tiles, and the argument types it is compiled for (so ``inspect`` can
compile exactly what would run, without a GPU, through ``numba.cuda.compile_ptx``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from numba_flash.config import SimtTiles, simt_backward_tiles, simt_forward_tiles
from numba_flash.kernels import simt_backward, simt_forward

PASSES = ("forward", "backward")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a pass: its name, numba dispatcher, tiles and argument types."""

    name: str
    kernel: Any
    tiles: SimtTiles
    argtypes: tuple
    family: str  # "simt-fp32" today; "tensor-core" when it exists


def _numba_types(dtype, layout: str = "A"):
    from numba import types
    from numba.np import numpy_support

    elem = numpy_support.from_dtype(np.dtype(dtype))
    return (
        types.Array(elem, 4, layout),
        types.Array(types.float32, 3, "C"),
        types.float64,
    )


def kernels_for(pass_: str, dtype, head_dim: int, causal: bool) -> list[KernelSpec]:
    """The kernels a ``pass_`` ("forward" or "backward") launches, in launch order."""
    if pass_ not in PASSES:
        raise ValueError(f"pass_: expected one of {PASSES}, got {pass_!r}")
    arr4, arr3, scalar = _numba_types(dtype)
    if pass_ == "forward":
        t = simt_forward_tiles(head_dim)
        return [
            KernelSpec(
                "simt_forward",
                simt_forward.forward_kernel(t, causal),
                t,
                (arr4, arr4, arr4, arr4, arr3, scalar),
                "simt-fp32",
            )
        ]
    t = simt_backward_tiles(head_dim)
    return [
        KernelSpec("simt_bwd_preprocess", simt_backward.preprocess_kernel(t), t, (arr4, arr4, arr3), "simt-fp32"),
        KernelSpec(
            "simt_bwd_dkdv",
            simt_backward.dkdv_kernel(t, causal),
            t,
            (arr4, arr4, arr4, arr4, arr3, arr3, arr4, arr4, scalar),
            "simt-fp32",
        ),
        KernelSpec(
            "simt_bwd_dq",
            simt_backward.dq_kernel(t, causal),
            t,
            (arr4, arr4, arr4, arr4, arr3, arr3, arr4, scalar),
            "simt-fp32",
        ),
    ]


def available() -> list[dict]:
    """Rows of (dtype, head dims, forward family, backward family) for ``info``."""
    from numba_flash._arrays import SUPPORTED_DTYPES, dtype_name

    rows = []
    for dt in SUPPORTED_DTYPES:
        rows.append(
            {
                "dtype": dtype_name(dt),
                "head_dims": "8, 16, ..., 256 (multiples of 8)",
                "forward": "simt-fp32" + ("" if dt == np.float32 else " (fp32 math, fallback)"),
                "backward": "simt-fp32" + ("" if dt == np.float32 else " (fp32 math, fallback)"),
            }
        )
    return rows

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

from numba_flash.config import (
    BLOCKED_HEAD_DIMS,
    TC_HEAD_DIMS,
    BlockedTiles,
    SimtTiles,
    TcBwdTiles,
    TcTiles,
    simt_backward_tiles,
    simt_forward_tiles,
    blocked_backward_tiles,
    blocked_forward_tiles,
    tc_backward_tiles,
    tc_forward_tiles,
)
from numba_flash.kernels import simt_backward, simt_blocked_backward, simt_blocked_forward, simt_forward
from numba_flash.kernels import tc_backward, tc_forward
from numba_flash.kernels import tf32_backward, tf32_forward

PASSES = ("forward", "backward")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a pass: its name, numba dispatcher, tiles and argument types."""

    name: str
    kernel: Any
    tiles: SimtTiles | BlockedTiles | TcTiles | TcBwdTiles
    argtypes: tuple
    family: str  # "simt-fp32", "tensor-core" or "tensor-core-tf32"


def _is_half(dtype) -> bool:
    from numba_flash._arrays import dtype_name

    return dtype_name(dtype) in ("float16", "bfloat16")


def backward_family(dtype, head_dim: int, aligned: bool = True, allow_tf32: bool = False) -> str:
    """The backward's family: the same rule as the forward's (``allow_tf32`` as given to
    ``flash_attention_backward``)."""
    return forward_family(dtype, head_dim, aligned, allow_tf32)


def forward_family(dtype, head_dim: int, aligned: bool = True, allow_tf32: bool = False) -> str:
    """"tensor-core" for fp16/bf16 at head dims 64 and 128 with 16-byte aligned rows
    (cp.async copies 16 bytes); "tensor-core-tf32" for float32 under the same conditions
    when ``allow_tf32`` (opt-in, ~1e-3 relative); otherwise "simt-fp32", the exact fp32
    kernel (fp16 read as is, bf16 through fp32 copies): the documented fallback."""
    if _is_half(dtype) and head_dim in TC_HEAD_DIMS and aligned:
        return "tensor-core"
    if allow_tf32 and np.dtype(dtype) == np.float32 and head_dim in tf32_forward.TF32_HEAD_DIMS and aligned:
        return "tensor-core-tf32"
    return "simt-fp32"


def fp32_blocked(work_dtype, head_dim: int, aligned: bool = True) -> bool:
    """Whether the exact fp32 work (float32 inputs, or bf16 on fp32 copies) runs the
    register-blocked kernels (head dims 64 and 128, 16-byte aligned rows for cp.async)
    rather than the row-group ones (any head dim, fp16 read as is)."""
    return np.dtype(work_dtype) == np.float32 and head_dim in BLOCKED_HEAD_DIMS and aligned


def _numba_types(dtype, layout: str = "A"):
    from numba import types
    from numba.np import numpy_support

    elem = numpy_support.from_dtype(np.dtype(dtype))
    return (
        types.Array(elem, 4, layout),
        types.Array(types.float32, 3, "C"),
        types.float64,
    )


def kernels_for(pass_: str, dtype, head_dim: int, causal: bool, allow_tf32: bool = False) -> list[KernelSpec]:
    """The kernels a ``pass_`` ("forward" or "backward") launches, in launch order
    (``allow_tf32`` as in ``flash_attention`` and ``flash_attention_backward``: it
    changes float32 at head dims 64 and 128 only)."""
    if pass_ not in PASSES:
        raise ValueError(f"pass_: expected one of {PASSES}, got {pass_!r}")
    if pass_ == "forward" and forward_family(dtype, head_dim, True, allow_tf32) == "tensor-core-tf32":
        arr4, arr3, scalar = _numba_types(np.float32)
        t = tf32_forward.tf32_forward_tiles(head_dim, causal)
        kernel = tf32_forward.tf32_forward_kernel(t, causal)
        return [KernelSpec("tf32_forward", kernel, t, (arr4, arr4, arr4, arr4, arr3, scalar), "tensor-core-tf32")]
    if pass_ == "backward" and backward_family(dtype, head_dim, True, allow_tf32) == "tensor-core-tf32":
        arr4, arr3, scalar = _numba_types(np.float32)
        t = tf32_backward.tf32_backward_tiles(head_dim, causal)
        fam = "tensor-core-tf32"
        return [
            KernelSpec("tf32_bwd_preprocess", simt_blocked_backward.preprocess_kernel(head_dim), t, (arr4, arr4, arr3),
                       fam),  # the exact fp32 preprocess
            KernelSpec("tf32_bwd_dkdv", tf32_backward.tf32_bwd_dkdv_kernel(t, causal), t,
                       (arr4, arr4, arr4, arr4, arr3, arr3, arr4, arr4, scalar), fam),
            KernelSpec("tf32_bwd_dq", tf32_backward.tf32_bwd_dq_kernel(t, causal), t,
                       (arr4, arr4, arr4, arr4, arr3, arr3, arr4, scalar), fam),
        ]  # fmt: skip
    # bf16 has no numba type: the tensor-core kernels see uint16 bits and the fp32
    # fallback sees fp32 copies
    arr4, arr3, scalar = _numba_types(np.float16 if _is_half(dtype) else dtype)
    if pass_ == "forward" and forward_family(dtype, head_dim) == "tensor-core":
        from numba import types

        from numba_flash._arrays import dtype_name

        t = tc_forward_tiles(head_dim, causal, dtype_name(dtype))
        bits = types.Array(types.uint16, 4, "A")
        words = types.Array(types.uint32, 4, "A")
        return [
            KernelSpec(
                "tc_forward",
                tc_forward.tc_forward_kernel(t, causal, dtype_name(dtype)),
                t,
                (bits, bits, bits, words, arr3, scalar),
                "tensor-core",
            )
        ]
    if pass_ == "backward" and backward_family(dtype, head_dim) == "tensor-core":
        from numba import types

        from numba_flash._arrays import dtype_name

        name = dtype_name(dtype)
        t = tc_backward_tiles(head_dim, causal, name)
        bits = types.Array(types.uint16, 4, "A")
        words = types.Array(types.uint32, 4, "A")
        return [
            KernelSpec("tc_bwd_preprocess", tc_backward.tc_bwd_preprocess_kernel(head_dim, name), t,
                       (bits, bits, arr3), "tensor-core"),
            KernelSpec("tc_bwd_dkdv", tc_backward.tc_bwd_dkdv_kernel(t, causal, name), t,
                       (bits, bits, bits, bits, arr3, arr3, words, words, scalar), "tensor-core"),
            KernelSpec("tc_bwd_dq", tc_backward.tc_bwd_dq_kernel(t, causal, name), t,
                       (bits, bits, bits, bits, arr3, arr3, words, scalar), "tensor-core"),
        ]  # fmt: skip
    if _is_half(dtype) and dtype != np.float16:  # bf16 runs the fp32 kernels on copies
        arr4, arr3, scalar = _numba_types(np.float32)
    work_dtype = np.dtype(str(arr4.dtype))  # what the fp32 kernels read: float32 or float16
    if pass_ == "forward" and fp32_blocked(work_dtype, head_dim):
        t = blocked_forward_tiles(head_dim, causal)
        return [
            KernelSpec(
                "simt_blocked_forward",
                simt_blocked_forward.forward_kernel(t, causal),
                t,
                (arr4, arr4, arr4, arr4, arr3, scalar),
                "simt-fp32",
            )
        ]
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
    if fp32_blocked(work_dtype, head_dim):
        tkv, tq = blocked_backward_tiles(head_dim, causal)
        return [
            KernelSpec("simt_blocked_preprocess", simt_blocked_backward.preprocess_kernel(head_dim), tkv,
                       (arr4, arr4, arr3), "simt-fp32"),
            KernelSpec("simt_blocked_dkdv", simt_blocked_backward.dkdv_kernel(tkv, causal), tkv,
                       (arr4, arr4, arr4, arr4, arr3, arr3, arr4, arr4, scalar), "simt-fp32"),
            KernelSpec("simt_blocked_dq", simt_blocked_backward.dq_kernel(tq, causal), tq,
                       (arr4, arr4, arr4, arr4, arr3, arr3, arr4, scalar), "simt-fp32"),
        ]  # fmt: skip
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
        name = dtype_name(dt)
        if name == "float32":
            rows.append({"dtype": name, "head_dims": ", ".join(map(str, BLOCKED_HEAD_DIMS)) + " (16-byte aligned rows)",
                         "forward": "simt-fp32, register-blocked", "backward": "simt-fp32, register-blocked"})  # fmt: skip
            rows.append({"dtype": name, "head_dims": "8, 16, ..., 256", "forward": "simt-fp32, row-group",
                         "backward": "simt-fp32, row-group"})  # fmt: skip
            rows.append({"dtype": "float32, allow_tf32=True",
                         "head_dims": ", ".join(map(str, tf32_forward.TF32_HEAD_DIMS)),
                         "forward": "tensor-core-tf32 (~1e-3 relative)",
                         "backward": "tensor-core-tf32 (~1e-3 relative)"})  # fmt: skip
            continue
        fallback = "simt-fp32 (fp32 math" + (", on fp32 copies)" if name == "bfloat16" else ")")
        rows.append({"dtype": name, "head_dims": ", ".join(map(str, TC_HEAD_DIMS)), "forward": "tensor-core",
                     "backward": "tensor-core"})  # fmt: skip
        rows.append({"dtype": name, "head_dims": "other multiples of 8 up to 256, or rows not 16-byte aligned",
                     "forward": fallback, "backward": fallback})  # fmt: skip
    return rows

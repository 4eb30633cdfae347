"""What a kernel module states about each of its kernels, for the launch plan.

Every kernel module ends with a ``launches(...)`` function that returns, for its
tiles and a problem's sizes, one :class:`KernelLaunch` per kernel in launch order:
the compiled dispatcher, its tiles, grid, threads, dynamic shared memory, and its
parameters as :class:`Arg` roles.  ``numba_flash.plan`` picks the module and tiles;
``numba_flash.api`` binds the roles to arrays, ``numba_flash.inspection`` to numba
types.  Imports no numba.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The buffers a kernel parameter can be (``scale`` is the float softmax scale).
ROLES = ("q", "k", "v", "out", "lse", "dout", "delta", "dq", "dk", "dv", "scale")
#: How a 4-D buffer is viewed: as it is, 16-bit elements as uint16 (cp.async moves
#: bytes; the dtype matters only to mma), or pairs of 16-bit elements as uint32.
VIEWS = ("", "u16", "u32")


@dataclass(frozen=True)
class Arg:
    """One kernel parameter: which buffer (``role``) and how it is viewed."""

    role: str
    view: str = ""

    def __post_init__(self):
        if self.role not in ROLES or self.view not in VIEWS:
            raise ValueError(f"kernel argument {self.role!r} viewed as {self.view!r}: unknown")


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: ``kernel[grid, threads, stream, smem](*args bound to buffers)``."""

    name: str
    kernel: Any  # the numba dispatcher
    tiles: Any
    grid: tuple  # (x, y, z): x tiles the rows a block owns, y heads, z batch
    threads: int
    smem: int  # dynamic shared memory, bytes (0: static only)
    args: tuple  # Arg, in the kernel's parameter order


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def forward_args(inputs: str = "", output: str = "") -> tuple:
    """``(q, k, v, out, lse, softmax_scale)``."""
    return Arg("q", inputs), Arg("k", inputs), Arg("v", inputs), Arg("out", output), Arg("lse"), Arg("scale")


def preprocess_args(view: str = "") -> tuple:
    """``(out, dout, delta)``: delta = rowsum(dO∘O)."""
    return Arg("out", view), Arg("dout", view), Arg("delta")


def dkdv_args(inputs: str = "", outputs: str = "") -> tuple:
    """``(q, k, v, dout, lse, delta, dk, dv, softmax_scale)``."""
    ins = tuple(Arg(r, inputs) for r in ("q", "k", "v", "dout"))
    return ins + (Arg("lse"), Arg("delta"), Arg("dk", outputs), Arg("dv", outputs), Arg("scale"))


def dq_args(inputs: str = "", outputs: str = "") -> tuple:
    """``(q, k, v, dout, lse, delta, dq, softmax_scale)``."""
    ins = tuple(Arg(r, inputs) for r in ("q", "k", "v", "dout"))
    return ins + (Arg("lse"), Arg("delta"), Arg("dq", outputs), Arg("scale"))

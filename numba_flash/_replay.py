"""The API's fast path: a call's launches recorded once, replayed for the calls like it.

What ``flash_attention`` (the backward, the varlen pair) does on the host before its
kernels run -- import and check the arrays and keywords, make the plan, build the
variants' arguments, bind arrays to each kernel's parameters and pack them -- depends on
what the arrays look like (type, shape, strides, dtype, 16-byte alignment, device) and
on the keywords, not on the data.  On the H200's host that cost about 0.2 ms a forward
and more a backward: as long as a short kernel runs, so back-to-back calls of short
shapes, and every varlen call, waited on the host (docs/benchmarks/2026-12-03-s16).

So the first call of a :func:`signature` runs the checked path and records its launches
(``_launch.Replay``: the parameters packed, the slots that change from call to call
named by role).  A later call of the same signature checks only what the signature
does not pin (the seed; varlen's offsets, whose values are checked every call), makes
its outputs, patches the slots (the arrays' addresses, the ``params`` tuple, the tensor
maps) and launches.  Under the simulator the replay binds and launches through numba as
the checked path does (``Recording.run``), so the suite runs the same records.

What never replays: arrays other than exact CuPy arrays on a GPU (or NumPy ones in the
simulator) -- DLPack and ``__cuda_array_interface__`` objects are imported every call;
FlexAttention mods; bf16 on float32 copies; calls that launch nothing.
``NUMBA_FLASH_REPLAY=0`` turns the fast path off (read at import).
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

import numpy as np

from numba_flash import _arrays as A
from numba_flash import _launch
from numba_flash._numba_cuda import SIMULATOR

ENABLED = os.environ.get("NUMBA_FLASH_REPLAY", "1") != "0"
_KEEP = 256  # recordings kept (least recently used dropped)
_MAPS_KEEP = 64  # a recording's tensor maps, by the arrays' addresses
_RECORDINGS: collections.OrderedDict = collections.OrderedDict()

_array_type = None  # the array type that replays: cupy.ndarray on a GPU, numpy.ndarray in the simulator
_SCALARS = (bool, int, float, str, type(None), np.bool_, np.integer, np.floating)


class _NotReplayable(Exception):
    """An argument the signature cannot pin (the call takes the checked path)."""


def _array(x):
    if type(x) is not _array_type:
        raise _NotReplayable
    where = (A.data_ptr(x) % 16,) + (() if SIMULATOR else (x.data.device_id,))
    return (x.shape, x.strides, x.dtype) + where


def _value(x):
    """A keyword as the checked path would see it: its type and value (``True`` and ``1``
    are told apart: one of them is refused somewhere); tuples and lists member by member."""
    if isinstance(x, _SCALARS):
        return (type(x), x)
    if type(x) in (tuple, list):
        return (type(x),) + tuple(_value(e) for e in x)
    raise _NotReplayable


def signature(pass_: str, arrays, keywords, optional_arrays=(), env=()):
    """What a call's checked path depends on, as a dict key, or None when the call does
    not replay: ``arrays`` (each its type, shape, strides, dtype, 16-byte alignment and
    device), ``keywords`` (type and value), ``optional_arrays`` (None, or an array whose
    type, shape and dtype alone are pinned: the ALiBi slopes, read every call; varlen's
    offsets, checked every call), ``env`` (the environment the plan reads), and the current
    device."""
    global _array_type
    if not ENABLED:
        return None
    if _array_type is None:
        if SIMULATOR:
            _array_type = np.ndarray
        else:
            import cupy

            _array_type = cupy.ndarray
    try:
        key = (pass_, env, tuple(_array(x) for x in arrays), tuple(_value(x) for x in keywords),
               tuple(None if x is None else _loose(x) for x in optional_arrays))  # fmt: skip
    except _NotReplayable:
        return None
    if SIMULATOR:
        return key
    import cupy

    return key + (cupy.cuda.runtime.getDevice(),)


def _loose(x):
    if isinstance(x, np.ndarray):  # varlen's NumPy offsets go with device q too
        return (np.ndarray, x.shape, x.dtype)
    if type(x) is not _array_type:
        raise _NotReplayable
    return (_array_type, x.shape, x.dtype) + (() if SIMULATOR else (x.data.device_id,))


@dataclass
class Recording:
    """A recorded call: its plan and layout, what the replay needs to rebuild its
    buffers (``state``: the pass's own, e.g. the checked variants and the outputs'
    shapes), and each launch's ``_launch.Replay`` (with, for a launch that takes tensor
    maps, its maps by the arrays' addresses)."""

    plan: object
    layout: str
    state: dict
    launches: list = field(default_factory=list)
    maps: list = field(default_factory=list)  # per launch: None, or (maker, {addresses: maps})

    def run(self, buffers: dict, bind) -> None:
        """Launch the recorded kernels with this call's ``buffers`` (role → array, tuple
        or scalar, as the checked path's).  ``bind(plan, buffers, layout)`` is the
        checked path's own binding and launch (``api._run``), used under the simulator;
        on a GPU the recorded parameters are patched (``_launch.replay``)."""
        if SIMULATOR:
            bind(self.plan, buffers, self.layout)
            return
        for rep, maps in zip(self.launches, self.maps):
            if maps is not None:
                buffers["tmaps"] = _maps(maps, buffers)
            _launch.replay(rep, buffers)


def _maps(maps, buffers):
    """A launch's tensor maps for this call's arrays (they encode the addresses)."""
    make, known = maps
    key = tuple(A.data_ptr(buffers[r]) for r in ("q", "k", "v", "dout") if r in buffers)
    hit = known.get(key)
    if hit is None:
        hit = known[key] = make(buffers)
        while len(known) > _MAPS_KEEP:
            known.pop(next(iter(known)))
    return hit


def find(key):
    """The recording of ``key`` (None: none yet, or ``key`` is None)."""
    if key is None:
        return None
    rec = _RECORDINGS.get(key)
    if rec is not None:
        _RECORDINGS.move_to_end(key)
    return rec


def store(key, rec: Recording) -> None:
    if key is None:
        return
    _RECORDINGS[key] = rec
    while len(_RECORDINGS) > _KEEP:
        _RECORDINGS.popitem(last=False)


def clear() -> None:
    """Forget every recording (tests; a changed environment is part of the key anyway)."""
    _RECORDINGS.clear()

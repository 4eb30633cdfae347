"""Warp-level primitives for numba's CUDA simulator (used only when it is on).

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs each CUDA thread as a Python thread
but has no warp shuffles and no ``syncwarp``.  The kernels use them, so this module
adds them to the simulator's fake ``cuda`` module, with the hardware's semantics: the
lanes of a warp meet at a barrier, each deposits its value in the warp's exchange
slot, and each reads its partner's.  ``threading.current_thread()`` is the simulated
thread (``thread_id`` its linear index in the block, ``_manager`` its block), so a
warp is ``thread_id // 32`` within ``_manager``.

``warp_exchange(value)`` is the general tool: it returns the list of the 32 lanes'
values (None for lanes past the end of a partial warp).  The PTX intrinsics' twins in
``numba_flash.ptx`` are built on it.
"""

from __future__ import annotations

import threading

import numpy as np

WARP_SIZE = 32
_TIMEOUT_S = 600.0  # a lane that never arrives (an exception elsewhere) breaks the barrier
_lock = threading.Lock()


class _Warp:
    def __init__(self, lanes: int):
        self.lanes = lanes
        self.barrier = threading.Barrier(lanes, timeout=_TIMEOUT_S)
        # two exchange buffers used in turn: a lane can only be one exchange ahead of
        # the slowest (it must pass the barrier the slowest has not reached), so one
        # barrier per exchange is enough
        self.slots = ([None] * WARP_SIZE, [None] * WARP_SIZE)
        self.turn = [0] * WARP_SIZE  # per lane: which buffer its next exchange uses


def _this_warp():
    thread = threading.current_thread()
    manager = thread._manager
    warp_id, lane = divmod(thread.thread_id, WARP_SIZE)
    warps = getattr(manager, "_numba_flash_warps", None)
    if warps is None:
        with _lock:
            warps = getattr(manager, "_numba_flash_warps", None)
            if warps is None:
                warps = manager._numba_flash_warps = {}
    warp = warps.get(warp_id)
    if warp is None:
        with _lock:
            warp = warps.get(warp_id)
            if warp is None:
                nthreads = int(np.prod(manager._block_dim))
                warp = warps[warp_id] = _Warp(min(WARP_SIZE, nthreads - warp_id * WARP_SIZE))
    return warp, lane


def lane_id() -> int:
    return threading.current_thread().thread_id % WARP_SIZE


def warp_exchange(value):
    """Every lane of the warp passes ``value``; each gets the list of all lanes' values."""
    warp, lane = _this_warp()
    slots = warp.slots[warp.turn[lane]]
    warp.turn[lane] ^= 1
    slots[lane] = value
    warp.barrier.wait()  # every lane's value is in its slot
    return list(slots)


def syncwarp(mask=0xFFFFFFFF):
    warp, _ = _this_warp()
    warp.barrier.wait()


def _shfl(value, src_of_lane):
    values = warp_exchange(value)
    src = src_of_lane(lane_id())
    if 0 <= src < len(values) and values[src] is not None:
        return type(value)(values[src])
    return value


def shfl_xor_sync(mask, value, lane_mask):
    return _shfl(value, lambda lane: lane ^ int(lane_mask))


def shfl_sync(mask, value, src_lane):
    return _shfl(value, lambda lane: int(src_lane))


def shfl_down_sync(mask, value, delta):
    return _shfl(value, lambda lane: lane + int(delta) if lane + int(delta) < WARP_SIZE else lane)


def shfl_up_sync(mask, value, delta):
    return _shfl(value, lambda lane: lane - int(delta) if lane >= int(delta) else lane)


def install():
    """Add the twins to the simulator's fake ``cuda`` module (idempotent)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    for name, fn in (
        ("syncwarp", syncwarp),
        ("shfl_xor_sync", shfl_xor_sync),
        ("shfl_sync", shfl_sync),
        ("shfl_down_sync", shfl_down_sync),
        ("shfl_up_sync", shfl_up_sync),
    ):
        if not hasattr(FakeCUDAModule, name):
            setattr(FakeCUDAModule, name, staticmethod(fn))

"""The direct launch path packs kernel parameters in numba's ABI (CPU-only checks;
the GPU kernel tests launch every kernel through it)."""

import struct
from types import SimpleNamespace

import numpy as np

from numba_flash import _launch


def _fake_device_array(shape, dtype, ptr):
    """What ``_pack`` reads from a CuPy array, on an ordinary NumPy array."""
    host = np.empty(shape, dtype)[:, ::2]  # strided, not contiguous
    return SimpleNamespace(
        shape=host.shape, strides=host.strides, size=host.size, itemsize=host.itemsize,
        ndim=host.ndim, data=SimpleNamespace(ptr=ptr), flags=host.flags, dtype=host.dtype,
    )  # fmt: skip


def test_pack_follows_numbas_flattening_of_arrays_and_float64_scalars():
    rng = np.random.default_rng()
    ptr = int(rng.integers(1, 2**40)) * 16
    a = _fake_device_array((3, 10, 5, 8), np.float16, ptr)
    scale = float(rng.uniform(0.01, 1.0))
    buf = _launch._pack([a, scale], 2 * 4 + 5 + 1)
    assert buf.dtype == np.int64
    # meminfo, parent, nitems, itemsize, data, shape x4, strides x4 (bytes), then the double
    assert list(buf[:13]) == [0, 0, 3 * 5 * 5 * 8, 2, ptr, 3, 5, 5, 8, *a.strides]
    assert struct.unpack("<d", buf[13].tobytes())[0] == scale


def test_pack_rejects_arguments_it_cannot_pass():
    import pytest

    with pytest.raises(TypeError, match="not supported"):
        _launch._pack(["3"], 1)
    with pytest.raises(TypeError, match="not supported"):
        _launch._pack([None], 1)


def test_pack_flattens_nested_tuples_and_small_scalars():
    """FlexAttention's ``fx``: nested tuples of arrays and scalars, numba's order; a
    float32 / int32 / bool scalar sits in the low bytes of its 8-byte slot."""
    buf = _launch._pack([((np.float32(1.5), np.int32(-2), np.bool_(True)), (), (7, 2.0))], 5)
    assert buf[0] & 0xFFFFFFFF == np.float32(1.5).view(np.uint32)
    assert buf[1] & 0xFFFFFFFF == np.int32(-2).view(np.uint32) and buf[2] & 0xFF == 1
    assert buf[3] == 7 and buf[4] == np.float64(2.0).view(np.int64)
    assert _launch._slots(((np.float32(1), ()), np.zeros((2, 3), np.int32))) == 1 + 2 * 2 + 5


def test_arg_key_tells_layouts_apart():
    c = np.empty((2, 3, 4, 8), np.float32)
    keys = {_launch._arg_key(x) for x in (c, c[:, ::2], np.asfortranarray(c), 1.0)}
    assert len(keys) == 4

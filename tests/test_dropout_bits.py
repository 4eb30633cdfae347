"""The dropout bits: Philox4x32-10 in NumPy (``reference``) and on the device
(``kernels.dropout``), and the keep mask they define.

The device functions run in tiny kernels: in numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1, the suite's default without a GPU) or on a GPU.
"""

import numpy as np
import pytest

from numba_flash import reference as R
from numba_flash._numba_cuda import SIMULATOR, cuda, gpu_available
from numba_flash.kernels.dropout import keep, keep_threshold, philox4x32_10, seed_key

from conftest import device, host

needs_kernels = pytest.mark.skipif(
    not SIMULATOR and not gpu_available(),
    reason="device functions need numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) or a GPU")

# Random123's known-answer tests for philox4x32-10 (kat_vectors):
# (counter, key, output), each word a uint32.
KATS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KATS)
def test_numpy_philox_known_answers(counter, key, expected):
    got = R.philox4x32_10(*counter, *key)
    assert all(x.dtype == np.uint32 for x in got)
    assert [int(x) for x in got] == list(expected)


def test_numpy_philox_broadcasts():
    """Arrays of counters give, element by element, the scalar answers."""
    counters = np.array([kat[0] for kat in KATS], dtype=np.uint32)
    for (_, key, expected) in KATS:
        words = R.philox4x32_10(*counters.T, *key)
        assert words[0].shape == (3,)
        for n, (counter, _, _) in enumerate(KATS):
            scalar = R.philox4x32_10(*counter, *key)
            assert [int(w[n]) for w in words] == [int(x) for x in scalar]


@cuda.jit
def _philox_kernel(counters, keys, out):
    t = cuda.threadIdx.x
    if t < counters.shape[0]:
        x0, x1, x2, x3 = philox4x32_10(counters[t, 0], counters[t, 1], counters[t, 2],
                                       counters[t, 3], keys[t, 0], keys[t, 1])
        out[t, 0] = x0
        out[t, 1] = x1
        out[t, 2] = x2
        out[t, 3] = x3


@needs_kernels
def test_device_philox_equals_numpy(rng):
    """The KATs and 29 random (counter, key) pairs: one block of 32 threads."""
    counters = rng.integers(0, 2**32, size=(32, 4)).astype(np.uint32)
    keys = rng.integers(0, 2**32, size=(32, 2)).astype(np.uint32)
    for n, (counter, key, _) in enumerate(KATS):
        counters[n], keys[n] = counter, key
    out = device(np.zeros((32, 4), dtype=np.uint32))
    _philox_kernel[1, 32](device(counters), device(keys), out)
    got = host(out)
    expected = np.stack([np.array(R.philox4x32_10(*c, *k)) for c, k in zip(counters, keys)])
    assert np.array_equal(got, expected), f"seed={rng.seed_value}"
    for n, (_, _, answer) in enumerate(KATS):
        assert tuple(int(x) for x in got[n]) == answer


@cuda.jit
def _keep_kernel(out, k0, k1, threshold):
    """Block (b, h), thread j: the keep bits of key j for every query row."""
    b = cuda.blockIdx.x
    h = cuda.blockIdx.y
    j = cuda.threadIdx.x
    if j < out.shape[3]:
        for i in range(out.shape[2]):
            out[b, h, i, j] = 1 if keep(b, h, i, j, k0, k1, threshold) else 0


@needs_kernels
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
def test_device_keep_equals_reference_mask(rng, p):
    """(B=2, H=3, Nq=19, Nk=70): six blocks of 70 threads; Nq spans both halves of a row
    pair and a second block of 16 rows, Nk three 32-key groups
    and a partial one."""
    seed = int(rng.integers(0, 2**63)) * 2 + 1  # both key words in play
    k0, k1 = seed_key(seed)
    out = device(np.full((2, 3, 19, 70), 7, dtype=np.uint8))
    _keep_kernel[(2, 3), 70](out, np.uint32(k0), np.uint32(k1), keep_threshold(p))
    want = R.dropout_mask(seed, p, 2, 3, 19, 70)
    assert np.array_equal(host(out), want.astype(np.uint8)), f"seed={seed}"


def test_seed_key_and_threshold():
    assert seed_key(0) == (0, 0)
    assert seed_key(2**64 - 1) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert seed_key(0x0123456789ABCDEF) == (0x89ABCDEF, 0x01234567)
    assert keep_threshold(0.0) == 256 and keep_threshold(0.25) == 192
    for bad in (-1, 2**64, 1.0, None, True):
        with pytest.raises(ValueError, match=r"^seed\b"):
            seed_key(bad)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_fraction(p):
    mask = R.dropout_mask(20240601, p, 1, 1, 256, 4096)
    assert abs(mask.mean() - keep_threshold(p) / 256) < 0.005
    assert abs(keep_threshold(p) / 256 - (1 - p)) <= 1 / 512  # p rounded to a multiple of 1/256


def test_bits_follow_the_seed():
    a = R.dropout_mask(11, 0.5, 2, 2, 9, 100)
    assert np.array_equal(a, R.dropout_mask(11, 0.5, 2, 2, 9, 100))
    for other in (12, 11 + 2**32):  # the low and the high key word
        b = R.dropout_mask(other, 0.5, 2, 2, 9, 100)
        assert 0.3 < np.mean(a != b) < 0.7
    # The bits of (b, h, i, j) do not depend on the shape asked for.
    assert np.array_equal(R.dropout_mask(11, 0.5, 1, 1, 3, 40), a[:1, :1, :3, :40])

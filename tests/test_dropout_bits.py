"""The dropout bits: Philox4x32 (10 rounds for the known answers, 7 for dropout) in NumPy (``reference``) and on the device
(``kernels.dropout``), and the keep mask they define.

The device functions run in tiny kernels: in numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1, the suite's default without a GPU) or on a GPU.
"""

import numpy as np
import pytest

from numba_flash import reference as R
from numba_flash._numba_cuda import SIMULATOR, cuda, float32, gpu_available, uint32
from numba_flash.kernels.dropout import ROUNDS, drop_slice, keep, keep_threshold, philox4x32, seed_key

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
    got = R.philox4x32(*counter, *key)
    assert all(x.dtype == np.uint32 for x in got)
    assert [int(x) for x in got] == list(expected)


def test_numpy_philox_broadcasts():
    """Arrays of counters give, element by element, the scalar answers."""
    counters = np.array([kat[0] for kat in KATS], dtype=np.uint32)
    for (_, key, expected) in KATS:
        words = R.philox4x32(*counters.T, *key)
        assert words[0].shape == (3,)
        for n, (counter, _, _) in enumerate(KATS):
            scalar = R.philox4x32(*counter, *key)
            assert [int(w[n]) for w in words] == [int(x) for x in scalar]


@cuda.jit
def _philox_kernel(counters, keys, out, out7):
    t = cuda.threadIdx.x
    if t < counters.shape[0]:
        x0, x1, x2, x3 = philox4x32(counters[t, 0], counters[t, 1], counters[t, 2],
                                    counters[t, 3], keys[t, 0], keys[t, 1], 10)
        out[t, 0] = x0
        out[t, 1] = x1
        out[t, 2] = x2
        out[t, 3] = x3
        x0, x1, x2, x3 = philox4x32(counters[t, 0], counters[t, 1], counters[t, 2],
                                    counters[t, 3], keys[t, 0], keys[t, 1], ROUNDS)
        out7[t, 0] = x0
        out7[t, 1] = x1
        out7[t, 2] = x2
        out7[t, 3] = x3


@needs_kernels
def test_device_philox_equals_numpy(rng):
    """The KATs and 29 random (counter, key) pairs: one block of 32 threads, with 10
    rounds (Random123's answers) and with the dropout's 7."""
    assert ROUNDS == R.DROPOUT_ROUNDS == 7
    counters = rng.integers(0, 2**32, size=(32, 4)).astype(np.uint32)
    keys = rng.integers(0, 2**32, size=(32, 2)).astype(np.uint32)
    for n, (counter, key, _) in enumerate(KATS):
        counters[n], keys[n] = counter, key
    out = device(np.zeros((32, 4), dtype=np.uint32))
    out7 = device(np.zeros((32, 4), dtype=np.uint32))
    _philox_kernel[1, 32](device(counters), device(keys), out, out7)
    got, got7 = host(out), host(out7)
    expected = np.stack([np.array(R.philox4x32(*c, *k)) for c, k in zip(counters, keys)])
    expected7 = np.stack([np.array(R.philox4x32(*c, *k, 7)) for c, k in zip(counters, keys)])
    assert np.array_equal(got, expected), f"seed={rng.seed_value}"
    assert np.array_equal(got7, expected7), f"seed={rng.seed_value}"
    assert not np.array_equal(got7, got)
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



@cuda.jit
def _drop_slice_kernel(words, thresholds, out):
    """Thread x: word x (rows g) and its complement (rows g + 8) dropped against
    threshold y (block y), on all-ones P words: what survives is the mask."""
    t = cuda.threadIdx.x
    y = cuda.blockIdx.x
    if t < words.shape[0]:
        di = (0, 0, 0, 0, uint32(thresholds[y]), float32(1.0), 1, 1)
        frag = cuda.local.array(4, uint32)
        for e in range(4):
            frag[e] = uint32(0xFFFFFFFF)
        drop_slice(frag, 0, words[t], uint32(words[t] ^ uint32(0xFFFFFFFF)), di)
        for e in range(4):
            out[y, t, e] = frag[e]


@needs_kernels
def test_packed_drop_matches_the_byte_compares(rng):
    """``keep_msbs`` + ``drop_slice`` (the wgmma forward's SWAR compare on packed P):
    every byte value 0..255 in every byte position, against thresholds 0..256 (the
    edges and random ones), keeps exactly the 16-bit values whose byte is <
    threshold.  Threshold 0 keeps the bytes of value 0 here; ``out_scale`` is then 0."""
    values = np.arange(256, dtype=np.uint32)
    words = (values | (np.roll(values, 1) << 8) | (np.roll(values, 2) << 16) | (np.roll(values, 3) << 24)
             ).astype(np.uint32)  # fmt: skip
    edges = {0, 1, 2, 127, 128, 129, 230, 255, 256}
    thresholds = np.array(sorted(edges | set(rng.integers(0, 257, 7).tolist())), dtype=np.int64)
    out = device(np.zeros((len(thresholds), 256, 4), dtype=np.uint32))
    _drop_slice_kernel[len(thresholds), 256](device(words), device(thresholds), out)
    got = host(out).astype(np.uint64)
    halves = np.uint64(0xFFFF), np.uint64(0xFFFF0000)
    for y, th in enumerate(thresholds):
        limit = max(int(th), 1)
        rows = (words.astype(np.uint64), (~words).astype(np.uint64))  # frag[0, 2]: rows g; frag[1, 3]: g + 8
        for e in range(4):
            w = rows[e % 2]
            lo_byte = (w >> np.uint64(16 * (e // 2))) & np.uint64(0xFF)  # frag[0, 1]: bytes 0, 1; frag[2, 3]: 2, 3
            hi_byte = (w >> np.uint64(16 * (e // 2) + 8)) & np.uint64(0xFF)
            want = np.where(lo_byte < limit, halves[0], 0) | np.where(hi_byte < limit, halves[1], 0)
            assert np.array_equal(got[y, :, e], want.astype(np.uint64)), (int(th), e)
    assert 0 < got[list(thresholds).index(128)].mean() < 0xFFFFFFFF

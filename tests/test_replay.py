"""The API's fast path (``numba_flash._replay``): a call whose signature ran before
replays its recorded launches on the new arrays.

In the simulator a replay binds and launches through numba, so these tests check what
the signature pins and what it leaves to each call (fresh data, seeds, ALiBi slopes,
varlen offsets, the errors still raised), and that the recorded parameter slots, patched
with a second call's arrays, equal what that call packs itself (``_launch.patched``: the
GPU's replay).  On a GPU (``-m gpu``) replayed calls must equal checked ones bit for bit,
Hopper kernels (tensor maps, the backward's ``stats``) included.
"""

import numpy as np
import pytest

import numba_flash
from numba_flash import _launch, _replay, api, reference
from conftest import device, host

pytestmark = pytest.mark.usefixtures("poisoned_outputs")


@pytest.fixture(autouse=True)
def fresh_recordings():
    _replay.clear()
    yield
    _replay.clear()


def _qkv(rng, B, Nq, Nk, H, Hk, d, dtype=np.float32):
    q = rng.standard_normal((B, Nq, H, d)).astype(dtype)
    k, v = (rng.standard_normal((B, Nk, Hk, d)).astype(dtype) for _ in range(2))
    return q, k, v


def test_second_call_replays_and_is_right_on_new_data(rng):
    """The second call of a signature runs no checks, plans nothing and records nothing
    new; fed new data (and a new dropout seed), forward and backward still match the
    reference, dropout mask included."""
    kw = dict(causal=True, window_size=(5, -1), softcap=4.0, dropout_p=0.25)
    seen = []
    for seed in (11, 12):
        q, k, v = _qkv(rng, 1, 17, 23, 2, 1, 16)  # GQA
        dout = rng.standard_normal(q.shape).astype(np.float32)
        out, lse = numba_flash.flash_attention(q, k, v, seed=seed, return_lse=True, **kw)
        grads = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, seed=seed, **kw)
        seen.append(len(_replay._RECORDINGS))
        ref, _ = reference.attention(q, k, v, seed=seed, **kw)
        assert reference.rel_error(host(out), ref) <= 1e-5, rng.seed_value
        refs = reference.attention_backward(dout, q, k, v, host(out), host(lse), seed=seed, **kw)
        for g, r in zip(grads, refs):
            assert reference.rel_error(host(g), r) <= 1e-4, rng.seed_value
    assert seen == [2, 2]  # a forward and a backward recorded once


def test_replayed_call_with_other_slopes_and_offsets(rng):
    """ALiBi slopes and varlen offsets are this call's own: a replay copies the slopes and
    checks the offsets' values every call (a bad offset is still refused)."""
    H, d = 2, 8
    for lens in ([5, 0, 9], [1, 12, 1]):
        total = sum(lens)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        q, k, v = (rng.standard_normal((total, H, d)).astype(np.float32) for _ in range(3))
        slopes = rng.random((3, H)).astype(np.float32)
        out = numba_flash.flash_attention_varlen(q, k, v, cu, cu, 12, 12, causal=True, alibi_slopes=slopes)
        ref, _ = reference.attention_varlen(q, k, v, cu, cu, 12, 12, causal=True, alibi_slopes=slopes)
        assert reference.rel_error(host(out), ref) <= 1e-5, rng.seed_value
    assert len(_replay._RECORDINGS) == 1
    bad = np.array([0, 9, 5, total], np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected non-decreasing"):
        numba_flash.flash_attention_varlen(q, k, v, bad, cu, 12, 12, causal=True, alibi_slopes=slopes)


def test_what_the_signature_pins_still_fails_as_the_checked_path(rng):
    """A recorded signature does not let through what the checked path refuses: a seed
    that is missing or not an int, ``True`` where ``1.0`` ran, a list for a tuple is a
    new signature that is checked again."""
    q, k, v = _qkv(rng, 1, 9, 9, 2, 2, 8)
    numba_flash.flash_attention(q, k, v, dropout_p=0.5, seed=3, softmax_scale=1.0)
    with pytest.raises(ValueError, match="seed: dropout_p=0.5 needs a seed"):
        numba_flash.flash_attention(q, k, v, dropout_p=0.5, softmax_scale=1.0)
    with pytest.raises(TypeError, match="seed: expected an int"):
        numba_flash.flash_attention(q, k, v, dropout_p=0.5, seed=2.5, softmax_scale=1.0)
    with pytest.raises(TypeError, match="softmax_scale: expected a real number"):
        numba_flash.flash_attention(q, k, v, dropout_p=0.5, seed=3, softmax_scale=True)
    with pytest.raises(ValueError, match="k: expected a 4-D array"):
        numba_flash.flash_attention(q, k[0], v, dropout_p=0.5, seed=3, softmax_scale=1.0)


def test_signature_tells_apart_what_the_checked_path_depends_on(rng):
    q, k, v = _qkv(rng, 1, 9, 9, 2, 2, 8)

    def sig(*arrays, **kw):
        return _replay.signature("forward", arrays, tuple(kw.values()))

    base = sig(q, k, v, causal=False)
    assert base == sig(q.copy(), k.copy(), v.copy(), causal=False)  # data is not pinned
    others = [sig(q, k, v, causal=True), sig(q, k, v, causal=1), sig(q[:, :8], k, v, causal=False),
              sig(q.astype(np.float16), k, v, causal=False), sig(np.asfortranarray(q), k, v, causal=False),
              sig(q, k, v, causal=(False,)), sig(q, k, v, causal=[False])]  # fmt: skip
    assert len({base, *others}) == 1 + len(others)
    misaligned = np.empty(q.size + 1, np.float32)[1:].reshape(q.shape)
    assert sig(misaligned, k, v, causal=False) != base  # 16-byte alignment picks kernels
    assert sig(q.tolist(), k, v, causal=False) is None  # not an array: the checked path only
    assert sig(q, k, v, causal=np.zeros(2)) is None


def test_patched_parameters_are_the_second_calls_own(rng, monkeypatch):
    """The GPU replay's packing: a recorded launch's slots patched with a second call's
    buffers equal that call's own packed parameters (every launch of the forward and the
    backward; dropout, so ``params`` carries the seed)."""
    bound = []
    run = api._run
    monkeypatch.setattr(api, "_run", lambda plan, buffers, layout, rec=None: (bound.append(dict(buffers)),
                                                                               run(plan, buffers, layout, rec)))
    recs = []
    for seed in (1, 2):
        _replay.clear()  # each call records: the second's own packing is the reference
        q, k, v = _qkv(rng, 2, 9, 13, 2, 1, 16, np.float16)
        dout = rng.standard_normal(q.shape).astype(np.float16)
        out, lse = numba_flash.flash_attention(q, k, v, causal=True, dropout_p=0.2, seed=seed, return_lse=True)
        numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, dropout_p=0.2, seed=seed)
        recs.append(list(_replay._RECORDINGS.values()))
    (fwd1, bwd1), (fwd2, bwd2) = recs
    for first, second, buffers in ((fwd1, fwd2, bound[2]), (bwd1, bwd2, bound[3])):
        assert len(first.launches) == len(second.launches) >= 1
        for a, b in zip(first.launches, second.launches):
            assert not np.array_equal(a.base, b.base)  # new addresses, a new seed
            assert np.array_equal(_launch.patched(a, buffers), b.base)


def test_off_the_fast_path(rng, monkeypatch):
    """FlexAttention mods never record; with the fast path switched off nothing does."""
    q, k, v = _qkv(rng, 1, 9, 9, 2, 2, 8)
    numba_flash.flash_attention(q, k, v, score_mod=lambda s, b, h, i, j: s)
    assert not _replay._RECORDINGS
    monkeypatch.setattr(_replay, "ENABLED", False)
    numba_flash.flash_attention(q, k, v)
    assert not _replay._RECORDINGS


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_replay_equals_the_checked_path_on_the_gpu(rng, dtype, d):
    """Bit for bit: the Hopper forward and backward (tensor maps, ``stats``), with
    dropout, ALiBi and GQA, replayed against the same call run through the checks; and
    varlen with other offsets of the same shape."""
    import cupy as cp
    import ml_dtypes

    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    kw = dict(causal=True, dropout_p=0.1, alibi_slopes=device(rng.random(8).astype(np.float32)))

    def both(fn, *args, **extra):
        _replay.clear()
        first = fn(*args, **extra)  # records
        second = fn(*args, **extra)  # replays
        assert len(_replay._RECORDINGS) == 1
        return first, second

    for seed in (5, 6):
        q, k, v = (device(x) for x in _qkv(rng, 2, 1000, 1200, 8, 2, d, dt))
        dout = device(rng.standard_normal(q.shape).astype(dt))
        (o1, l1), (o2, l2) = both(numba_flash.flash_attention, q, k, v, seed=seed, return_lse=True, **kw)
        assert cp.array_equal(o1, o2) and cp.array_equal(l1, l2)
        g1, g2 = both(numba_flash.flash_attention_backward, dout, q, k, v, o1, l1, seed=seed, **kw)
        assert all(cp.array_equal(a, b) for a, b in zip(g1, g2))
    q, k, v = (device(rng.standard_normal((1000, 4, d)).astype(dt)) for _ in range(3))
    _replay.clear()
    for lens in ([300, 0, 1, 699], [1, 999, 0, 0]):  # the second replays the first's record
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        replayed = numba_flash.flash_attention_varlen(q, k, v, cu, cu, 1000, 1000, causal=True)
    assert len(_replay._RECORDINGS) == 1
    _replay.clear()
    checked = numba_flash.flash_attention_varlen(q, k, v, cu, cu, 1000, 1000, causal=True)
    assert cp.array_equal(replayed, checked)
    ref, _ = reference.attention_varlen(*(host(x).astype(np.float32) for x in (q, k, v)), cu, cu, 1000, 1000,
                                     causal=True)  # fmt: skip
    assert reference.rel_error(host(replayed).astype(np.float32), ref) <= 2e-2

"""Tests of FlashAttention-2's variants in numba_flash.reference: grouped-query
attention, the sliding window, softcap, ALiBi, dropout and varlen.

CPU only (no numba).  Inputs are fresh random normals every run; each test's seed
is in its failure message, and REFERENCE_TEST_SEED=<seed> replays a failure.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from test_reference import Rand as BaseRand, to_bhsd  # noqa: F401 (to_bhsd: used below)

from numba_flash import reference as R

LAYOUTS = ["bhsd", "bshd"]
# (seqlen_q, seqlen_k): 1, sizes that are multiples of no tile, Nq != Nk both ways.
SIZES = [(1, 17), (17, 63), (63, 17), (17, 17), (63, 1)]
EXACT = 1e-12  # float64 tiled vs materialised: only summation order differs
FD_TOL = 1e-6  # analytic vs central-difference gradients (eps = 1e-6)


class Rand(BaseRand):
    """test_reference's seeded generator (seed in failure messages), with GQA shapes,
    ALiBi slopes and dropout seeds."""

    def __init__(self, seed=None):
        super().__init__()
        if seed is not None:
            self.seed = seed
            self.gen = np.random.default_rng(seed)

    def qkv(self, b, h, h_kv, nq, nk, d, layout="bhsd", dv=None):
        """q (h heads), k, v (h_kv heads) and a dout shaped like out, in ``layout``."""
        dv = d if dv is None else dv

        def make(heads, n, dd):
            x = self.normal((b, heads, n, dd))
            return x.transpose(0, 2, 1, 3).copy() if layout == "bshd" else x

        return make(h, nq, d), make(h_kv, nk, d), make(h_kv, nk, dv), make(h, nq, dv)

    def slopes(self, shape):
        """ALiBi slopes (positive, as the geometric ones of the paper, and not all equal)."""
        return np.abs(self.normal(shape)) * 0.5

    def dropout_seed(self):
        return int(self.gen.integers(0, 2**63)) * 2 + int(self.gen.integers(0, 2))


@pytest.fixture
def rnd():
    return Rand()


def assert_close(x, ref, tol, what, rnd, floor=0.0):
    """max |x - ref| / max(max |ref|, floor) < tol.  ``floor`` keeps gradients that
    are 0 in exact arithmetic (one visible key: P = 1, dS = 0) from dividing noise by
    noise."""
    err = R.max_abs_error(x, ref)
    finite = np.abs(np.asarray(ref)[np.isfinite(ref)])
    denom = max(float(finite.max()) if finite.size else 0.0, floor, 1e-300)
    assert err / denom < tol, f"{what}: rel error {err / denom:.3e} >= {tol:.0e}; {rnd}"


VARIANTS = ["window", "window-band", "window-left", "window-right", "softcap", "alibi",
            "alibi-batch", "dropout", "gqa", "mqa", "all"]


def variant(name, rnd, b, h):
    """``(keywords, h_kv)`` of a named variant for batch ``b`` and ``h`` query heads."""
    kw = {
        "window": dict(window_size=(3, 2)),
        "window-band": dict(window_size=(0, 0)),
        "window-left": dict(window_size=(5, -1)),
        "window-right": dict(window_size=(-1, 4)),
        "softcap": dict(softcap=1.5),
        "alibi": dict(alibi_slopes=rnd.slopes((h,))),
        "alibi-batch": dict(alibi_slopes=rnd.slopes((b, h))),
        "dropout": dict(dropout_p=0.3, seed=rnd.dropout_seed()),
        "gqa": {},
        "mqa": {},
        "all": dict(window_size=(6, 3), softcap=2.0, alibi_slopes=rnd.slopes((b, h)),
                    dropout_p=0.2, seed=rnd.dropout_seed()),
    }[name]
    h_kv = {"gqa": h // 2, "mqa": 1, "all": h // 2}.get(name, h)
    return kw, h_kv


# ---------------------------------------------------------------------------
# Tiled == materialised, for every variant
# ---------------------------------------------------------------------------

def check_tiled(rnd, q, k, v, dout, kw, block_m, block_n, what):
    out, lse = R.attention(q, k, v, **kw)
    f_out, f_lse = R.flash_forward(q, k, v, block_m=block_m, block_n=block_n, **kw)
    assert f_out.shape == out.shape and f_lse.shape == lse.shape
    assert_close(f_out, out, EXACT, f"out {what}", rnd)
    assert_close(f_lse, lse, EXACT, f"lse {what}", rnd)
    ref = R.attention_backward(dout, q, k, v, out, lse, **kw)
    got = R.flash_backward(dout, q, k, v, out, lse, block_m=block_m, block_n=block_n, **kw)
    for name, g, r, x in zip(("dq", "dk", "dv"), got, ref, (q, k, v)):
        assert g.shape == r.shape == x.shape, name
        assert_close(g, r, EXACT, f"{name} {what}", rnd, floor=1e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", SIZES)
@pytest.mark.parametrize("name", VARIANTS)
def test_tiled_equals_standard(rnd, name, nq, nk, causal, layout):
    kw, h_kv = variant(name, rnd, 2, 4)
    kw.update(causal=causal, layout=layout)
    q, k, v, dout = rnd.qkv(2, 4, h_kv, nq, nk, 8, layout, dv=5)
    check_tiled(rnd, q, k, v, dout, kw, 16, 7, name)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    b=st.integers(1, 2), h_kv=st.integers(1, 2), group=st.integers(1, 3),
    nq=st.integers(1, 40), nk=st.integers(1, 40), d=st.integers(1, 9),
    block_m=st.integers(1, 20), block_n=st.integers(1, 20),
    causal=st.booleans(), layout=st.sampled_from(LAYOUTS),
    window=st.tuples(st.integers(-1, 12), st.integers(-1, 12)),
    softcap=st.sampled_from([0.0, 0.5, 4.0]),
    alibi=st.sampled_from([None, "heads", "batch"]),
    dropout_p=st.sampled_from([0.0, 0.2, 0.7]),
    seed=st.integers(0, 2**64 - 1),
)
def test_property_random_combinations(rnd, b, h_kv, group, nq, nk, d, block_m, block_n,
                                      causal, layout, window, softcap, alibi, dropout_p,
                                      seed):
    # Fresh values every run, the same for every replay of an example within it.
    rnd = Rand(seed=(rnd.seed * 1_000_003 + seed) % 2**128)
    h = h_kv * group
    q, k, v, dout = rnd.qkv(b, h, h_kv, nq, nk, d, layout)
    slopes = {None: None, "heads": rnd.slopes((h,)), "batch": rnd.slopes((b, h))}[alibi]
    kw = dict(causal=causal, layout=layout, window_size=window, softcap=softcap,
              alibi_slopes=slopes, dropout_p=dropout_p, seed=seed)
    check_tiled(rnd, q, k, v, dout, kw, block_m, block_n, f"{kw}")


# ---------------------------------------------------------------------------
# Gradients against finite differences
# ---------------------------------------------------------------------------

def numerical_grads(q, k, v, g, kw, eps=1e-6):
    """Central differences of L = sum(O * G) with respect to q, k and v."""
    def loss(*args):
        return float(np.sum(R.attention(*args, layout="bhsd", **kw)[0] * g))

    grads = []
    for which in range(3):
        args = [q, k, v]
        num = np.empty_like(args[which])
        for idx in np.ndindex(num.shape):
            plus, minus = list(args), list(args)
            plus[which], minus[which] = args[which].copy(), args[which].copy()
            plus[which][idx] += eps
            minus[which][idx] -= eps
            num[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        grads.append(num)
    return grads


@pytest.mark.parametrize("backward", ["attention_backward", "flash_backward"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(5, 7), (7, 5)])
@pytest.mark.parametrize("name", ["softcap", "alibi-batch", "window", "gqa", "dropout",
                                  "all"])
def test_gradients_match_finite_differences(rnd, name, nq, nk, causal, backward):
    kw, h_kv = variant(name, rnd, 1, 2)
    kw["causal"] = causal
    q, k, v, g = rnd.qkv(1, 2, h_kv, nq, nk, 4)
    out, lse = R.attention(q, k, v, layout="bhsd", **kw)
    tiles = dict(block_m=2, block_n=3) if backward == "flash_backward" else {}
    analytic = getattr(R, backward)(g, q, k, v, out, lse, layout="bhsd", **tiles, **kw)
    numeric = numerical_grads(q, k, v, g, kw)
    for grad, a, n in zip(("dq", "dk", "dv"), analytic, numeric):
        assert_close(a, n, FD_TOL, f"{backward} {name} {grad} vs finite differences", rnd,
                     floor=1e-2)


# ---------------------------------------------------------------------------
# Each variant against its definition
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(17, 63), (63, 17), (1, 17)])
@pytest.mark.parametrize("h, h_kv", [(4, 2), (3, 1), (6, 3)])
def test_gqa_equals_mha_with_repeated_kv(rnd, h, h_kv, nq, nk, causal, layout):
    q, k, v, dout = rnd.qkv(2, h, h_kv, nq, nk, 8, layout)
    axis = 2 if layout == "bshd" else 1
    k_rep, v_rep = (np.repeat(x, h // h_kv, axis=axis) for x in (k, v))
    kw = dict(causal=causal, layout=layout, softcap=3.0, window_size=(9, -1))
    out, lse = R.attention(q, k, v, **kw)
    m_out, m_lse = R.attention(q, k_rep, v_rep, **kw)
    assert np.array_equal(out, m_out) and np.array_equal(lse, m_lse), str(rnd)
    dq, dk, dv = R.attention_backward(dout, q, k, v, out, lse, **kw)
    m_dq, m_dk, m_dv = R.attention_backward(dout, q, k_rep, v_rep, out, lse, **kw)
    assert dk.shape == k.shape and dv.shape == v.shape
    assert np.array_equal(dq, m_dq), str(rnd)

    def group_sum(x):  # (..., H, ...) -> (..., H_kv, ...), summed over each group
        shape = x.shape[:axis] + (h_kv, h // h_kv) + x.shape[axis + 1:]
        return x.reshape(shape).sum(axis=axis + 1)

    assert_close(dk, group_sum(m_dk), EXACT, "dk", rnd)
    assert_close(dv, group_sum(m_dv), EXACT, "dv", rnd)


def explicit_attention(q, k, v, scale, visible, bias=None, softcap=0.0, keep=None):
    """Row-by-row softmax over the visible keys, in plain Python loops (bhsd)."""
    b_, h_, nq, _ = q.shape
    out = np.zeros(q.shape[:3] + v.shape[3:])
    lse = np.full(q.shape[:3], -np.inf)
    for b in range(b_):
        for h in range(h_):
            for i in range(nq):
                keys = [j for j in range(k.shape[2]) if visible[i][j]]
                if not keys:
                    continue
                s = np.array([scale * q[b, h, i] @ k[b, h, j] for j in keys])
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if bias is not None:
                    s = s + np.array([bias[b][h][i][j] for j in keys])
                e = np.exp(s - s.max())
                w = e / e.sum()
                if keep is not None:
                    w = w * np.array([keep[b][h][i][j] for j in keys])
                out[b, h, i] = w @ v[b, h, keys]
                lse[b, h, i] = s.max() + math.log(e.sum())
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(0, 0), (3, 2), (2, -1), (-1, 1), (20, 30), (0, -1)])
@pytest.mark.parametrize("nq, nk", [(5, 9), (9, 5), (1, 6), (6, 6)])
def test_window_equals_an_explicit_mask(rnd, nq, nk, window, causal):
    left, right = window
    right = 0 if causal else right
    visible = [[(left < 0 or j >= i + nk - nq - left) and (right < 0 or j <= i + nk - nq + right)
                for j in range(nk)] for i in range(nq)]
    assert np.array_equal(R.window_mask(nq, nk, window, causal=causal),
                          np.array(visible, dtype=bool).reshape(nq, nk))
    q, k, v, _ = rnd.qkv(2, 2, 2, nq, nk, 8, dv=3)
    out, lse = R.attention(q, k, v, causal=causal, window_size=window, softmax_scale=0.6,
                           layout="bhsd")
    exp_out, exp_lse = explicit_attention(q, k, v, 0.6, visible)
    assert_close(out, exp_out, EXACT, "out", rnd)
    assert_close(lse, exp_lse, EXACT, "lse", rnd)
    assert np.array_equal(np.isneginf(lse), np.isneginf(exp_lse))  # rows that see nothing
    assert np.all(out[np.isneginf(lse)] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(5, 9), (9, 5)])
def test_softcap_and_alibi_equal_their_formula(rnd, nq, nk, causal):
    q, k, v, _ = rnd.qkv(2, 3, 3, nq, nk, 8)
    slopes = rnd.slopes((2, 3))
    bias = [[[[-slopes[b, h] * abs(i + nk - nq - j) for j in range(nk)] for i in range(nq)]
             for h in range(3)] for b in range(2)]
    visible = R.window_mask(nq, nk, causal=causal)
    kw = dict(causal=causal, softmax_scale=2.0, layout="bhsd")
    for cap, slope in [(1.5, None), (0.0, slopes), (1.5, slopes), (0.7, slopes[0])]:
        b_bias = None if slope is None else bias if slope.ndim == 2 else [bias[0]] * 2
        out, lse = R.attention(q, k, v, softcap=cap, alibi_slopes=slope, **kw)
        exp_out, exp_lse = explicit_attention(q, k, v, 2.0, visible, b_bias, cap)
        assert_close(out, exp_out, EXACT, f"out softcap={cap}", rnd)
        assert_close(lse, exp_lse, EXACT, f"lse softcap={cap}", rnd)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nq, nk", [(17, 63), (63, 17), (17, 17)])
def test_window_special_cases(rnd, nq, nk, layout):
    q, k, v, _ = rnd.qkv(1, 2, 2, nq, nk, 8, layout)
    for fn in (R.attention, R.flash_forward):
        for causal in (False, True):
            plain = fn(q, k, v, causal=causal, layout=layout)
            open_ = fn(q, k, v, causal=causal, layout=layout, window_size=(-1, -1))
            assert all(np.array_equal(a, b) for a, b in zip(plain, open_)), str(rnd)
        causal = fn(q, k, v, causal=True, layout=layout)
        right0 = fn(q, k, v, layout=layout, window_size=(-1, 0))
        assert all(np.array_equal(a, b) for a, b in zip(causal, right0)), str(rnd)
        both = fn(q, k, v, causal=True, layout=layout, window_size=(4, 7))
        left = fn(q, k, v, layout=layout, window_size=[4, 0])
        assert all(np.array_equal(a, b) for a, b in zip(both, left)), str(rnd)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nq, nk", [(17, 63), (63, 17), (1, 17)])
def test_dropout_equals_explicit_mask(rnd, nq, nk, layout, causal):
    q, k, v, dout = rnd.qkv(2, 3, 3, nq, nk, 8, layout)
    seed, p = rnd.dropout_seed(), 0.35
    kw = dict(causal=causal, layout=layout)
    plain_out, plain_lse = R.attention(q, k, v, **kw)
    out, lse = R.attention(q, k, v, dropout_p=p, seed=seed, **kw)
    z = R.dropout_mask(seed, p, 2, 3, nq, nk)
    assert z.dtype == bool and z.shape == (2, 3, nq, nk)
    qb, kb, vb = (to_bhsd(x, layout) for x in (q, k, v))
    s = (qb @ kb.swapaxes(-1, -2)) / math.sqrt(8)
    exp_out = (softmax_from_lse(s, R.window_mask(nq, nk, causal=causal), plain_lse)
               * z / (1 - p)) @ vb
    assert_close(to_bhsd(out, layout), exp_out, EXACT, "out", rnd)
    assert np.array_equal(lse, plain_lse), "lse is the undropped softmax's"
    assert R.rel_error(out, plain_out) > 1e-3  # dropout did something
    again = R.attention(q, k, v, dropout_p=p, seed=seed, **kw)
    assert np.array_equal(again[0], out), "same seed, same output"
    other = R.attention(q, k, v, dropout_p=p, seed=seed ^ 1, **kw)
    assert not np.array_equal(other[0], out)
    zero = R.attention(q, k, v, dropout_p=0.0, seed=seed, **kw)
    assert np.array_equal(zero[0], plain_out) and np.array_equal(zero[1], plain_lse)


def softmax_from_lse(s, visible, lse):
    """P = exp(S - lse) on the visible entries, 0 elsewhere and on rows without keys."""
    seen = visible & ~np.isneginf(lse)[..., None]
    return np.where(seen, np.exp(np.where(seen, s - lse[..., None], 0)), 0.0)


# ---------------------------------------------------------------------------
# The dropout bits
# ---------------------------------------------------------------------------

def python_philox(ctr, key, rounds=7):
    """Philox4x32 on Python ints (the dropout's 7 rounds): the definition in the
    docstring, independently."""
    c, (k0, k1) = list(ctr), key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.93])
def test_dropout_mask_equals_its_definition(rnd, p):
    seed = rnd.dropout_seed()
    b_, h_, nq, nk = 2, 2, 19, 70  # rows 0..18: two row pairs' halves and a second block of 16
    mask = R.dropout_mask(seed, p, b_, h_, nq, nk)
    threshold = min(256, round((1 - p) * 256))
    key = (seed & 0xFFFFFFFF, seed >> 32)
    assert R.seed_key(seed) == key and R.keep_threshold(p) == threshold
    for b, h, i in np.ndindex(b_, h_, nq):
        for j in range(nk):
            pair = (i // 16) * 8 + i % 8
            group = (j // 32) * 4 + (j % 8) // 2
            slot = ((i // 8) % 2) * 8 + ((j % 32) // 8) * 2 + j % 2
            x = python_philox((group, pair, h, b), key)
            value = (x[slot // 4] >> (8 * (slot % 4))) & 0xFF
            assert mask[b, h, i, j] == (value < threshold), (b, h, i, j, str(rnd))


def test_keep_threshold():
    assert R.keep_threshold(0.0) == 256
    assert R.keep_threshold(0.5) == 128
    assert R.keep_threshold(1e-9) == 256
    assert R.keep_threshold(0.1) == 230  # round(230.4): the drop rate 26/256
    assert R.keep_threshold(0.9) == round(0.1 * 256)
    assert R.dropout_mask(123, 0.0, 2, 2, 5, 40).all()


# ---------------------------------------------------------------------------
# Varlen
# ---------------------------------------------------------------------------

def packed(rnd, lengths, heads, d):
    return rnd.normal((sum(lengths), heads, d))


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def seq(x, cu, b):
    """Sequence b of a packed array as a (1, n, H, d) bshd batch."""
    return x[cu[b]:cu[b + 1]][None]


@pytest.mark.parametrize("fn", ["attention", "window_mask"])
def test_window_side_of_seqlen_k_is_open_as_flash_attn(rnd, fn):
    """FlashAttention-2's rule (``mha_fwd``): a window side of seqlen_k or more is open.
    With Nq = 12 > Nk = 3 and right = 5 ≥ Nk the formula alone would hide keys from rows
    0..5 (every key from rows 0..3); FlashAttention-2, so the reference, shows them all."""
    nq, nk = 12, 3
    if fn == "window_mask":
        assert R.window_mask(nq, nk, (-1, 5)).all() and R.window_mask(nq, nk, (7, 5)).all()
        assert R.window_mask(nq, nk, (-1, 2)).sum(1).tolist() == [0] * 7 + [1, 2, 3, 3, 3]  # 2 < Nk: the formula
        return
    q, k, v = rnd.normal((1, nq, 2, 8)), rnd.normal((1, nk, 2, 8)), rnd.normal((1, nk, 2, 8))
    full, full_lse = R.attention(q, k, v)
    out, lse = R.attention(q, k, v, window_size=(-1, 5))
    assert np.array_equal(out, full) and np.array_equal(lse, full_lse)
    out, lse = R.attention(q, k, v, window_size=(-1, 2))
    assert np.isneginf(lse[:, :, :7]).all() and np.isfinite(lse[:, :, 7:]).all()


def _fa2(window, seqlen_k):
    """FlashAttention-2's window: a side of seqlen_k or more open (variant.fa2_window)."""
    return tuple(-1 if side >= seqlen_k else side for side in window)


@pytest.mark.parametrize("kw", [
    {}, dict(causal=True), dict(window_size=(2, 1)), dict(causal=True, window_size=(3, -1)),
    dict(softcap=1.2, alibi="batch"), dict(alibi="heads", causal=True), dict(softmax_scale=0.4),
], ids=["plain", "causal", "window", "causal-window", "softcap-alibi", "alibi-heads", "scale"])
def test_varlen_equals_per_sequence_attention(rnd, kw):
    len_q = [5, 0, 1, 9, 3, 1]
    len_k = [7, 4, 0, 9, 1, 1]
    h, h_kv, d, dv = 4, 2, 8, 5
    q, k, v = packed(rnd, len_q, h, d), packed(rnd, len_k, h_kv, d), packed(rnd, len_k, h_kv, dv)
    dout = packed(rnd, len_q, h, dv)
    cu_q, cu_k = offsets(len_q), offsets(len_k)
    kw = dict(kw)
    alibi = kw.pop("alibi", None)
    slopes = {None: None, "heads": rnd.slopes((h,)), "batch": rnd.slopes((len(len_q), h))}[alibi]
    out, lse = R.attention_varlen(q, k, v, cu_q, cu_k, 9, 10, alibi_slopes=slopes, **kw)
    assert out.shape == (sum(len_q), h, dv) and lse.shape == (h, sum(len_q))
    grads = R.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 9, 10,
                                        alibi_slopes=slopes, **kw)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape
    compared = 0
    for b in range(len(len_q)):
        window = kw.get("window_size", (-1, -1))
        if _fa2(_fa2(window, 10), len_k[b]) != _fa2(window, 10):
            # FlashAttention-2 opens a side of max_seqlen_k (10) or more in varlen, of seqlen_k
            # or more in a dense call: a sequence shorter than a side differs between the two
            continue
        compared += 1
        s_slopes = None if slopes is None else slopes if slopes.ndim == 1 else slopes[b]
        args = [seq(x, cu, b) for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
        s_out, s_lse = R.attention(*args, alibi_slopes=s_slopes, **kw)
        assert np.array_equal(out[cu_q[b]:cu_q[b + 1]], s_out[0]), (b, str(rnd))
        assert np.array_equal(lse[:, cu_q[b]:cu_q[b + 1]], s_lse[0]), (b, str(rnd))
        s_grads = R.attention_backward(seq(dout, cu_q, b), *args, s_out, s_lse,
                                       alibi_slopes=s_slopes, **kw)
        for name, g, sg, cu in zip(("dq", "dk", "dv"), grads, s_grads, (cu_q, cu_k, cu_k)):
            assert np.array_equal(g[cu[b]:cu[b + 1]], sg[0]), (name, b, str(rnd))
    assert compared >= 3  # the sequences of 7, 4 and 9 keys at least
    # An empty query sequence writes nothing; an empty key sequence gives 0 and -inf.
    assert np.all(out[cu_q[2]:cu_q[3]] == 0) and np.all(np.isneginf(lse[:, cu_q[2]:cu_q[3]]))


def test_varlen_dropout_indexes_by_sequence(rnd):
    """Dropout's b is the sequence's index: sequence b's bits are those of batch row b."""
    len_q, len_k = [4, 0, 6, 3], [5, 2, 6, 0]
    h, d = 2, 8
    q, k, v = packed(rnd, len_q, h, d), packed(rnd, len_k, h, d), packed(rnd, len_k, h, d)
    dout = packed(rnd, len_q, h, d)
    cu_q, cu_k = offsets(len_q), offsets(len_k)
    seed, p = rnd.dropout_seed(), 0.4
    kw = dict(causal=True, dropout_p=p, seed=seed)
    out, lse = R.attention_varlen(q, k, v, cu_q, cu_k, 6, 6, **kw)
    plain_out, plain_lse = R.attention_varlen(q, k, v, cu_q, cu_k, 6, 6, causal=True)
    assert np.array_equal(lse, plain_lse)
    z = R.dropout_mask(seed, p, len(len_q), h, max(len_q), max(len_k))
    for b, (nq, nk) in enumerate(zip(len_q, len_k)):
        qb, kb, vb = (x[cu[b]:cu[b + 1]].transpose(1, 0, 2) for x, cu in
                      ((q, cu_q), (k, cu_k), (v, cu_k)))
        s = (qb @ kb.swapaxes(-1, -2)) / math.sqrt(d)
        probs = softmax_from_lse(s, R.causal_mask(nq, nk), plain_lse[:, cu_q[b]:cu_q[b + 1]])
        exp_out = (probs * z[b, :, :nq, :nk] / (1 - p)) @ vb
        assert_close(out[cu_q[b]:cu_q[b + 1]].transpose(1, 0, 2), exp_out, EXACT,
                     f"out of sequence {b}", rnd)
    # Sequence 2 fills its (6, 6) rows: as batch row 2 of a (4, 6, h, d) batch it has
    # the same (b, i, j), hence the same bits, output and gradients.
    grads = R.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 6, 6, **kw)

    def as_row_2(x, cu):
        batch = rnd.normal((4, 6) + x.shape[1:])
        batch[2] = x[cu[2]:cu[3]]
        return batch

    qkv = [as_row_2(x, cu) for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
    b_out, b_lse = R.attention(*qkv, **kw)
    assert_close(b_out[2], out[cu_q[2]:cu_q[3]], EXACT, "out as batch row 2", rnd)
    b_grads = R.attention_backward(as_row_2(dout, cu_q), *qkv, b_out, b_lse, **kw)
    for name, g, bg, cu in zip(("dq", "dk", "dv"), grads, b_grads, (cu_q, cu_k, cu_k)):
        assert_close(g[cu[2]:cu[3]], bg[2], EXACT, f"{name} as batch row 2", rnd, floor=1e-2)


# ---------------------------------------------------------------------------
# Low-precision baselines take the variants too
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_lowp_and_tf32_baselines_apply_the_variants(rnd, layout):
    q, k, v, dout = rnd.qkv(2, 4, 2, 17, 23, 16, layout)
    kw = dict(causal=True, layout=layout, window_size=(7, -1), softcap=2.5,
              alibi_slopes=rnd.slopes((4,)), dropout_p=0.25, seed=rnd.dropout_seed())
    out, lse = R.attention(q, k, v, **kw)
    grads = R.attention_backward(dout, q, k, v, out, lse, **kw)
    checks = [
        (R.attention_lowp(q, k, v, dtype=np.float32, **kw), 1e-5),
        (R.attention_tf32(q, k, v, **kw), 3e-3),
        (R.attention_lowp(q, k, v, dtype=np.float16, **kw), 1e-2),
        (R.attention_lowp(q, k, v, dtype=ml_dtypes.bfloat16, **kw), 6e-2),
    ]
    for (b_out, b_lse), tol in checks:
        assert_close(b_out, out, tol, f"out tol={tol}", rnd)
        assert_close(b_lse, lse, tol, f"lse tol={tol}", rnd)
    b_checks = [
        (R.attention_backward_lowp(dout, q, k, v, out, lse, dtype=np.float32, **kw), 1e-4),
        (R.attention_backward_tf32(dout, q, k, v, out, lse, **kw), 1e-2),
        (R.attention_backward_lowp(dout, q, k, v, out, lse, dtype=np.float16, **kw), 2e-2),
    ]
    for b_grads, tol in b_checks:
        for name, g, r, x in zip(("dq", "dk", "dv"), b_grads, grads, (q, k, v)):
            assert g.shape == x.shape
            assert_close(g, r, tol, f"{name} tol={tol}", rnd)


def test_inputs_are_not_modified(rnd):
    q, k, v, dout = rnd.qkv(2, 4, 2, 9, 13, 8)
    slopes = rnd.slopes((2, 4))
    kw = dict(causal=True, layout="bhsd", window_size=(3, 1), softcap=1.0,
              alibi_slopes=slopes, dropout_p=0.5, seed=7)
    arrays = dict(q=q, k=k, v=v, dout=dout, slopes=slopes)
    before = {name: x.copy() for name, x in arrays.items()}
    out, lse = R.attention(q, k, v, **kw)
    R.flash_forward(q, k, v, **kw)
    R.attention_backward(dout, q, k, v, out, lse, **kw)
    R.flash_backward(dout, q, k, v, out, lse, **kw)
    for name, x in arrays.items():
        assert np.array_equal(x, before[name]), f"{name} was modified; {rnd}"


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------

def _bad_argument_cases():
    """(argument, exception, function, args, kwargs); arrays are bhsd."""
    q = np.ones((2, 4, 5, 8)) * 0.5
    k = np.ones((2, 2, 6, 8)) * 0.25
    v = np.ones((2, 2, 6, 8)) * 0.75
    out, lse = R.attention(q, k, v, layout="bhsd")
    bwd = (out, q, k, v, out, lse)
    A, F, AB, FB = R.attention, R.flash_forward, R.attention_backward, R.flash_backward
    L, LB, T = R.attention_lowp, R.attention_backward_lowp, R.attention_tf32
    pq, pk = np.ones((7, 4, 8)), np.ones((9, 2, 8))
    cu_q, cu_k = np.array([0, 3, 7], np.int32), np.array([0, 4, 9], np.int32)
    V, VB = R.attention_varlen, R.attention_varlen_backward
    vout, vlse = V(pq, pk, pk, cu_q, cu_k, 4, 5)
    E = ValueError
    return [
        ("k", E, A, (q, np.ones((2, 3, 6, 8)), v), {}),  # 3 does not divide 4
        ("k", E, A, (q[:, :3], k, v), {}),
        ("k", E, A, (q[:, :0], k, v), {}),  # no query heads, two KV heads
        ("window_size", E, A, (q, k, v), dict(window_size=(3,))),
        ("window_size", E, F, (q, k, v), dict(window_size=(-2, 0))),
        ("window_size", E, A, (q, k, v), dict(window_size=(1.0, 2))),
        ("window_size", E, AB, bwd, dict(window_size="(1, 2)")),
        ("window_size", E, A, (q, k, v), dict(window_size=(True, 2))),
        ("window_size", E, R.window_mask, (3, 3), dict(window_size=None)),
        ("softcap", E, A, (q, k, v), dict(softcap=-1.0)),
        ("softcap", E, F, (q, k, v), dict(softcap=float("inf"))),
        ("softcap", E, FB, bwd, dict(softcap=float("nan"))),
        ("softcap", E, A, (q, k, v), dict(softcap="1")),
        ("softcap", E, L, (q, k, v), dict(dtype=np.float16, softcap=True)),
        ("alibi_slopes", E, A, (q, k, v), dict(alibi_slopes=np.ones(2))),
        ("alibi_slopes", E, A, (q, k, v), dict(alibi_slopes=np.ones((4, 2)))),
        ("alibi_slopes", E, AB, bwd, dict(alibi_slopes=np.ones((2, 4, 1)))),
        ("alibi_slopes", E, A, (q, k, v), dict(alibi_slopes="slopes")),
        ("alibi_slopes", E, V, (pq, pk, pk, cu_q, cu_k, 4, 5), dict(alibi_slopes=np.ones((3, 4)))),
        ("dropout_p", E, A, (q, k, v), dict(dropout_p=1.0, seed=1)),
        ("dropout_p", E, A, (q, k, v), dict(dropout_p=-0.1, seed=1)),
        ("dropout_p", E, LB, bwd, dict(dtype=np.float16, dropout_p="0.1", seed=1)),
        ("dropout_p", E, R.dropout_mask, (1, 1.5, 1, 1, 2, 2), {}),
        ("seed", E, A, (q, k, v), dict(dropout_p=0.1)),
        ("seed", E, T, (q, k, v), dict(dropout_p=0.1, seed=-1)),
        ("seed", E, F, (q, k, v), dict(dropout_p=0.1, seed=2**64)),
        ("seed", E, A, (q, k, v), dict(dropout_p=0.1, seed=1.0)),
        ("seed", E, A, (q, k, v), dict(dropout_p=0.0, seed="x")),
        ("seed", E, R.dropout_mask, (None, 0.5, 1, 1, 2, 2), {}),
        ("seqlen_k", E, R.dropout_mask, (1, 0.5, 1, 1, 2, -2), {}),
        ("cu_seqlens_q", TypeError, V, (pq, pk, pk, cu_q.astype(np.int64), cu_k, 4, 5), {}),
        ("cu_seqlens_q", TypeError, V, (pq, pk, pk, [0, 3, 7], cu_k, 4, 5), {}),
        ("cu_seqlens_q", E, V, (pq, pk, pk, cu_q[None], cu_k, 4, 5), {}),
        ("cu_seqlens_q", E, V, (pq, pk, pk, np.array([1, 3, 7], np.int32), cu_k, 4, 5), {}),
        ("cu_seqlens_q", E, V, (pq, pk, pk, np.array([0, 4, 3, 7], np.int32), cu_k, 4, 5), {}),
        ("cu_seqlens_q", E, V, (pq, pk, pk, np.array([0, 3, 6], np.int32), cu_k, 4, 5), {}),
        ("cu_seqlens_k", E, V, (pq, pk, pk, cu_q, np.array([0, 9], np.int32), 4, 5), {}),
        ("cu_seqlens_k", E, VB, (vout, pq, pk, pk, vout, vlse, cu_q, cu_k[:-1], 4, 5), {}),
        ("max_seqlen_q", E, V, (pq, pk, pk, cu_q, cu_k, 3, 5), {}),
        ("max_seqlen_q", E, VB, (vout, pq, pk, pk, vout, vlse, cu_q, cu_k, -1, 5), {}),
        ("max_seqlen_q", E, V, (pq, pk, pk, cu_q, cu_k, True, 5), {}),
        ("max_seqlen_k", E, V, (pq, pk, pk, cu_q, cu_k, 4, 4), {}),
        ("k", E, V, (pq, np.ones((9, 3, 8)), np.ones((9, 3, 8)), cu_q, cu_k, 4, 5), {}),
        ("q", E, V, (q, pk, pk, cu_q, cu_k, 4, 5), {}),
        ("lse", E, VB, (vout, pq, pk, pk, vout, vlse.T, cu_q, cu_k, 4, 5), {}),
        ("out", E, VB, (vout, pq, pk, pk, vout[:, :2], vlse, cu_q, cu_k, 4, 5), {}),
    ]


@pytest.mark.parametrize("case", range(len(_bad_argument_cases())))
def test_bad_arguments_raise_naming_the_argument(case):
    name, exc, fn, args, kwargs = _bad_argument_cases()[case]
    if fn not in (R.attention_varlen, R.attention_varlen_backward, R.dropout_mask,
                  R.window_mask):
        kwargs = {"layout": "bhsd", **kwargs}
    with pytest.raises(exc, match=rf"^{name}\b") as info:
        fn(*args, **kwargs)
    assert "expected" in str(info.value)

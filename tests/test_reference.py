"""Tests of numba_flash.reference, the float64 NumPy FlashAttention reference.

Inputs are fresh random normals every run.  Each test's seed is in its failure
message; set REFERENCE_TEST_SEED=<seed> to replay a failure.
"""

import contextlib
import doctest
import inspect
import math
import os
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from numba_flash import reference as R

# (seqlen_q, seqlen_k): 1, odd sizes, and Nq != Nk both ways.
SIZES = [(1, 1), (17, 17), (63, 63), (17, 63), (63, 17), (1, 33), (33, 1)]
# (block_m, block_n): every size in (1, 3, 16, 64), equal and mixed.
BLOCKS = [(1, 1), (3, 3), (16, 16), (64, 64), (1, 64), (64, 1), (3, 16), (16, 3)]
LAYOUTS = ["bhsd", "bshd"]
HEADDIMS = [8, 24, 64]
EXACT = 1e-12  # float64 tiled vs materialised: only summation order differs


class Rand:
    """A fresh random generator whose seed ends up in failure messages."""

    def __init__(self):
        env = os.environ.get("REFERENCE_TEST_SEED")
        self.seed = int(env) if env else np.random.SeedSequence().entropy
        self.gen = np.random.default_rng(self.seed)

    def normal(self, shape):
        return self.gen.standard_normal(shape)

    def qkv(self, b, h, nq, nk, d, layout="bhsd", dv=None):
        """q, k, v (and a dout-shaped array) in ``layout``."""
        dv = d if dv is None else dv

        def make(n, dd):
            x = self.normal((b, h, n, dd))
            return x.transpose(0, 2, 1, 3).copy() if layout == "bshd" else x

        return make(nq, d), make(nk, d), make(nk, dv), make(nq, dv)

    def __str__(self):
        return f"seed={self.seed} (replay with REFERENCE_TEST_SEED={self.seed})"


@pytest.fixture
def rnd():
    return Rand()


def to_bhsd(x, layout):
    return x.transpose(0, 2, 1, 3) if layout == "bshd" else x


def assert_close(x, ref, tol, what, rnd):
    err = R.rel_error(x, ref)
    assert err < tol, f"{what}: rel error {err:.3e} >= {tol:.0e}; {rnd}"


@contextlib.contextmanager
def no_warnings():
    """Turn every warning (numpy's RuntimeWarning included) into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---------------------------------------------------------------------------
# Masks and the materialised attention itself
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("nq, nk", SIZES + [(5, 3), (3, 5), (4, 4)])
def test_causal_mask_is_bottom_right_aligned(nq, nk):
    mask = R.causal_mask(nq, nk)
    assert mask.shape == (nq, nk) and mask.dtype == bool
    expected = [[j <= i + nk - nq for j in range(nk)] for i in range(nq)]
    assert np.array_equal(mask, np.array(expected, dtype=bool).reshape(nq, nk))
    # The last query always sees every key.
    assert mask[-1].all()
    if nq == nk:
        assert np.array_equal(mask, np.tril(np.ones((nq, nk), dtype=bool)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(5, 7), (7, 5), (1, 4), (6, 6)])
def test_attention_matches_row_by_row_softmax(rnd, nq, nk, causal):
    """attention() against a plain Python loop over rows (independent code)."""
    q, k, v, _ = rnd.qkv(2, 2, nq, nk, 8, dv=5)
    scale = 0.7
    out, lse = R.attention(q, k, v, causal=causal, softmax_scale=scale, layout="bhsd")
    exp_out = np.zeros_like(out)
    exp_lse = np.full(lse.shape, -np.inf)
    for b in range(2):
        for h in range(2):
            for i in range(nq):
                keys = [j for j in range(nk) if not causal or j <= i + nk - nq]
                if not keys:
                    continue
                s = np.array([scale * q[b, h, i] @ k[b, h, j] for j in keys])
                e = np.exp(s - s.max())
                exp_out[b, h, i] = (e / e.sum()) @ v[b, h, keys]
                exp_lse[b, h, i] = s.max() + math.log(e.sum())
    assert out.shape == (2, 2, nq, 5) and lse.shape == (2, 2, nq)
    assert_close(out, exp_out, EXACT, "out", rnd)
    assert_close(lse, exp_lse, EXACT, "lse", rnd)


def test_default_scale_is_one_over_sqrt_headdim(rnd):
    q, k, v, _ = rnd.qkv(1, 2, 9, 11, 24)
    a = R.attention(q, k, v, layout="bhsd")
    b = R.attention(q, k, v, softmax_scale=1 / math.sqrt(24), layout="bhsd")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), str(rnd)


LAYOUT_FUNCTIONS = [name for name in R.__all__
                    if "layout" in inspect.signature(getattr(R, name)).parameters]


def test_every_layout_default_is_bshd():
    """The API defaults to bshd; a reference defaulting to bhsd silently computed
    something else from the same arrays."""
    assert len(LAYOUT_FUNCTIONS) == 8
    for name in LAYOUT_FUNCTIONS:
        default = inspect.signature(getattr(R, name)).parameters["layout"].default
        assert default == "bshd", name


def test_default_layout_reads_bshd(rnd):
    q, k, v, dout = rnd.qkv(1, 2, 5, 7, 8, layout="bshd")  # (1, 5, 2, 8): B, N, H, d
    out, lse = R.attention(q, k, v)
    b_out, b_lse = R.attention(q, k, v, layout="bshd")
    assert out.shape == (1, 5, 2, 8) and lse.shape == (1, 2, 5)
    assert np.array_equal(out, b_out) and np.array_equal(lse, b_lse), str(rnd)
    grads = R.attention_backward(dout, q, k, v, out, lse)
    b_grads = R.attention_backward(dout, q, k, v, out, lse, layout="bshd")
    assert all(np.array_equal(g, b) for g, b in zip(grads, b_grads)), str(rnd)


def test_api_and_reference_defaults_agree():
    """numba_flash.flash_attention and reference.attention, both with their default
    layout, on the same bshd arrays (B=1, N=5, H=2, d=16; the kernels run in the
    simulator without a GPU).  Read as bhsd the arrays would be H=5, N=2."""
    import numba_flash

    gen = np.random.default_rng()
    q, k, v = (gen.standard_normal((1, 5, 2, 16)).astype(np.float32) for _ in range(3))
    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True)
    ref_out, ref_lse = R.attention(q, k, v)
    assert ref_out.shape == out.shape == (1, 5, 2, 16) and ref_lse.shape == lse.shape
    assert R.rel_error(out, ref_out) <= 1e-5
    assert R.rel_error(lse, ref_lse) <= 1e-5
    wrong, _ = R.attention(q, k, v, layout="bhsd")  # the old default: another answer
    assert R.rel_error(out, wrong) > 1e-3


# ---------------------------------------------------------------------------
# Tiled forward == materialised forward
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("block_m, block_n", BLOCKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", SIZES)
def test_flash_forward_matches_attention(rnd, nq, nk, causal, block_m, block_n):
    q, k, v, _ = rnd.qkv(2, 3, nq, nk, 24)
    out, lse = R.attention(q, k, v, causal=causal, layout="bhsd")
    f_out, f_lse = R.flash_forward(q, k, v, causal=causal, layout="bhsd",
                                   block_m=block_m, block_n=block_n)
    assert f_out.shape == out.shape and f_lse.shape == lse.shape == (2, 3, nq)
    assert_close(f_out, out, EXACT, "out", rnd)
    assert_close(f_lse, lse, EXACT, "lse", rnd)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nq, nk", [(17, 63), (63, 17)])
def test_forward_layouts_and_headdims(rnd, nq, nk, layout, d, causal):
    q, k, v, _ = rnd.qkv(2, 3, nq, nk, d, layout)
    out, lse = R.attention(q, k, v, causal=causal, layout=layout)
    expected_shape = (2, nq, 3, d) if layout == "bshd" else (2, 3, nq, d)
    assert out.shape == expected_shape and lse.shape == (2, 3, nq)
    # bshd is exactly bhsd with the axes swapped.
    b_out, b_lse = R.attention(to_bhsd(q, layout), to_bhsd(k, layout),
                               to_bhsd(v, layout), causal=causal, layout="bhsd")
    assert np.array_equal(to_bhsd(out, layout), b_out), str(rnd)
    assert np.array_equal(lse, b_lse), str(rnd)
    for block in (3, 16):
        f_out, f_lse = R.flash_forward(q, k, v, causal=causal, layout=layout,
                                       block_m=block, block_n=block)
        assert f_out.shape == expected_shape
        assert_close(f_out, out, EXACT, f"out block={block}", rnd)
        assert_close(f_lse, lse, EXACT, f"lse block={block}", rnd)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_rescales_when_the_max_grows(rnd, causal):
    """Scores that increase along the keys force a rescale at every key tile,
    and a large scale makes a missed or wrong rescale enormous."""
    nq, nk, d = 20, 50, 16
    q, _, v, _ = rnd.qkv(1, 2, nq, nk, d)
    u = rnd.normal(d)
    q = np.abs(q @ u)[..., None] * u + 0.01 * q  # every query points along u
    k = np.arange(nk)[:, None] / nk * u + 0.01 * rnd.normal((1, 2, nk, d))
    out, lse = R.attention(q, k, v, causal=causal, softmax_scale=4.0, layout="bhsd")
    for block_m, block_n in [(1, 1), (7, 5), (16, 16)]:
        f_out, f_lse = R.flash_forward(q, k, v, causal=causal, softmax_scale=4.0, layout="bhsd",
                                       block_m=block_m, block_n=block_n)
        assert np.isfinite(f_out).all()
        assert_close(f_out, out, EXACT, f"out blocks={block_m, block_n}", rnd)
        assert_close(f_lse, lse, EXACT, f"lse blocks={block_m, block_n}", rnd)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2), h=st.integers(1, 3),
    nq=st.integers(1, 48), nk=st.integers(1, 48), d=st.integers(1, 16),
    block_m=st.integers(1, 24), block_n=st.integers(1, 24),
    causal=st.booleans(), layout=st.sampled_from(LAYOUTS),
    scale=st.one_of(st.none(), st.floats(0.05, 3.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_flash_forward_equals_attention(b, h, nq, nk, d, block_m, block_n,
                                                 causal, layout, scale, seed):
    gen = np.random.default_rng(seed)
    shape = (lambda n: (b, n, h, d)) if layout == "bshd" else (lambda n: (b, h, n, d))
    q, k, v = gen.standard_normal(shape(nq)), gen.standard_normal(shape(nk)), \
        gen.standard_normal(shape(nk))
    kw = dict(causal=causal, softmax_scale=scale, layout=layout)
    out, lse = R.attention(q, k, v, **kw)
    f_out, f_lse = R.flash_forward(q, k, v, block_m=block_m, block_n=block_n, **kw)
    assert R.rel_error(f_out, out) < EXACT
    assert R.rel_error(f_lse, lse) < EXACT


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("block_m, block_n", BLOCKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", SIZES)
def test_flash_backward_matches_attention_backward(rnd, nq, nk, causal,
                                                   block_m, block_n):
    q, k, v, dout = rnd.qkv(2, 3, nq, nk, 24)
    out, lse = R.attention(q, k, v, causal=causal, layout="bhsd")
    ref = R.attention_backward(dout, q, k, v, out, lse, causal=causal, layout="bhsd")
    got = R.flash_backward(dout, q, k, v, out, lse, causal=causal, layout="bhsd",
                           block_m=block_m, block_n=block_n)
    for name, g, r, x in zip("dq dk dv".split(), got, ref, (q, k, v)):
        assert g.shape == r.shape == x.shape
        if nk == 1 and name != "dv":
            # Softmax over a single key is constantly 1, so dQ = dK = 0 exactly
            # in real arithmetic; both sides hold only rounding noise.
            err = R.max_abs_error(g, r)
            assert err < 1e-13, f"{name}: abs error {err:.3e}; {rnd}"
        else:
            assert_close(g, r, EXACT, name, rnd)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_layouts_and_headdims(rnd, layout, d, causal):
    q, k, v, dout = rnd.qkv(2, 3, 17, 30, d, layout)
    kw = dict(causal=causal, layout=layout)
    out, lse = R.attention(q, k, v, **kw)
    ref = R.attention_backward(dout, q, k, v, out, lse, **kw)
    bhsd = R.attention_backward(*(to_bhsd(x, layout) for x in (dout, q, k, v, out)),
                                lse, causal=causal, layout="bhsd")
    for name, r, rb, x in zip("dq dk dv".split(), ref, bhsd, (q, k, v)):
        assert r.shape == x.shape
        assert np.array_equal(to_bhsd(r, layout), rb), f"{name}; {rnd}"
    got = R.flash_backward(dout, q, k, v, out, lse, block_m=5, block_n=7, **kw)
    for name, g, r in zip("dq dk dv".split(), got, ref):
        assert_close(g, r, EXACT, name, rnd)


def _numerical_grads(q, k, v, g, causal, eps=1e-6):
    """Central differences of L = sum(O * G) with respect to q, k and v."""
    def loss(q_, k_, v_):
        return float(np.sum(R.attention(q_, k_, v_, causal=causal, layout="bhsd")[0] * g))

    grads = []
    for which in range(3):
        args = [q, k, v]
        x = args[which]
        num = np.empty_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            args_p, args_m = list(args), list(args)
            args_p[which], args_m[which] = xp, xm
            num[idx] = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        grads.append(num)
    return grads


@pytest.mark.parametrize("backward", ["attention_backward", "flash_backward"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(5, 7), (7, 5)])
def test_gradients_match_finite_differences(rnd, nq, nk, causal, backward):
    q, k, v, g = rnd.qkv(1, 2, nq, nk, 4)
    out, lse = R.attention(q, k, v, causal=causal, layout="bhsd")
    kw = dict(block_m=2, block_n=3) if backward == "flash_backward" else {}
    analytic = getattr(R, backward)(g, q, k, v, out, lse, causal=causal, layout="bhsd", **kw)
    numeric = _numerical_grads(q, k, v, g, causal)
    for name, a, n in zip("dq dk dv".split(), analytic, numeric):
        assert_close(a, n, 1e-6, f"{backward} {name} vs finite differences", rnd)


# ---------------------------------------------------------------------------
# Rows that see no key
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("block_m, block_n", [(1, 1), (3, 16), (16, 3), (64, 64)])
@pytest.mark.parametrize("nq, nk", [(40, 9), (33, 1), (63, 17)])
def test_fully_masked_rows_give_zero_and_neg_inf(rnd, nq, nk, block_m, block_n):
    q, k, v, dout = rnd.qkv(2, 2, nq, nk, 8)
    dead = nq - nk  # causal, bottom-right: rows 0 .. nq-nk-1 see no key
    with no_warnings():
        results = {
            "attention": R.attention(q, k, v, causal=True, layout="bhsd"),
            "flash_forward": R.flash_forward(q, k, v, causal=True, layout="bhsd",
                                             block_m=block_m, block_n=block_n),
        }
        out, lse = results["attention"]
        grads = {
            "attention_backward": R.attention_backward(dout, q, k, v, out, lse,
                                                       causal=True, layout="bhsd"),
            "flash_backward": R.flash_backward(dout, q, k, v, out, lse, causal=True,
                                               layout="bhsd",
                                               block_m=block_m, block_n=block_n),
        }
        lowp = R.attention_lowp(q, k, v, dtype=np.float16, causal=True, layout="bhsd")
        lowp_grads = R.attention_backward_lowp(dout, q, k, v, out, lse, layout="bhsd",
                                               dtype=np.float16, causal=True)

    for name, (o, l) in list(results.items()) + [("attention_lowp", lowp)]:
        o64, l64 = o.astype(np.float64), l.astype(np.float64)
        assert not np.isnan(o64).any() and not np.isnan(l64).any(), f"{name}; {rnd}"
        assert np.all(o64[:, :, :dead] == 0), f"{name}: O of masked rows; {rnd}"
        assert np.all(np.isneginf(l64[:, :, :dead])), f"{name}: LSE; {rnd}"
        assert np.isfinite(o64[:, :, dead:]).all() and np.isfinite(l64[:, :, dead:]).all()
    for name, (dq, dk, dv) in list(grads.items()) + [("backward_lowp", lowp_grads)]:
        for x in (dq, dk, dv):
            assert np.isfinite(x.astype(np.float64)).all(), f"{name}; {rnd}"
        assert np.all(dq[:, :, :dead] == 0), f"{name}: dq of masked rows; {rnd}"


def test_only_the_causal_mask_hides_rows(rnd):
    """Without causal, Nq > Nk rows all see every key."""
    q, k, v, _ = rnd.qkv(1, 1, 40, 9, 8)
    out, lse = R.flash_forward(q, k, v, block_m=7, block_n=4, layout="bhsd")
    assert np.isfinite(lse).all() and not np.all(out[:, :, 0] == 0), str(rnd)


# ---------------------------------------------------------------------------
# Zero sizes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("b, h, nq, nk", [(0, 2, 5, 7), (1, 0, 5, 7), (1, 2, 0, 7),
                                          (1, 2, 5, 0), (1, 2, 0, 0)])
def test_zero_sizes(rnd, b, h, nq, nk, layout, causal):
    """Empty batch, heads or seqlens give empty results; seqlen_k = 0 leaves every
    query without a key: O = 0 and lse = -inf (and zero gradients)."""
    q, k, v, dout = rnd.qkv(b, h, nq, nk, 8, layout)
    kw = dict(causal=causal, layout=layout)
    with no_warnings():
        forwards = {
            "attention": R.attention(q, k, v, **kw),
            "flash_forward": R.flash_forward(q, k, v, block_m=3, block_n=2, **kw),
            "attention_lowp": R.attention_lowp(q, k, v, dtype=np.float16, **kw),
            "attention_tf32": R.attention_tf32(q, k, v, **kw),
        }
        out, lse = forwards["attention"]
        backwards = {
            "attention_backward": R.attention_backward(dout, q, k, v, out, lse, **kw),
            "flash_backward": R.flash_backward(dout, q, k, v, out, lse, block_m=3,
                                               block_n=2, **kw),
            "attention_backward_lowp": R.attention_backward_lowp(
                dout, q, k, v, out, lse, dtype=ml_dtypes.bfloat16, **kw),
            "attention_backward_tf32": R.attention_backward_tf32(
                dout, q, k, v, out, lse, **kw),
        }
    for name, (o, l) in forwards.items():
        assert o.shape == q.shape and l.shape == (b, h, nq), name
        assert np.all(o.astype(np.float64) == 0) if nk == 0 else True, name
        assert np.all(np.isneginf(l.astype(np.float64))) if nk == 0 else True, name
    for name, grads in backwards.items():
        for g, x in zip(grads, (q, k, v)):
            assert g.shape == x.shape, name
            assert np.all(g.astype(np.float64) == 0) if 0 in (nq, nk) else True, name


# ---------------------------------------------------------------------------
# NaN and infinity: a standard attention in IEEE arithmetic
# ---------------------------------------------------------------------------

def _forwards(q, k, v, causal=False):
    """Every forward of the reference, bhsd, as float64 (out, lse) pairs."""
    kw = dict(causal=causal, layout="bhsd")
    with np.errstate(invalid="ignore", over="ignore"):
        results = {
            "attention": R.attention(q, k, v, **kw),
            "flash_forward": R.flash_forward(q, k, v, block_m=2, block_n=3, **kw),
            "attention_tf32": R.attention_tf32(q, k, v, **kw),
            "attention_lowp": R.attention_lowp(q, k, v, dtype=np.float32, **kw),
        }
    return {name: (o.astype(np.float64), l.astype(np.float64))
            for name, (o, l) in results.items()}


def _nan_rows(out, lse):
    """Rows (b, h, i) whose output is NaN, checking that lse agrees and that a row is
    either all NaN or all finite."""
    nan_out = np.isnan(out)
    assert np.array_equal(nan_out.any(-1), nan_out.all(-1))
    assert np.array_equal(nan_out.any(-1), np.isnan(lse))
    return set(zip(*np.nonzero(nan_out.any(-1))))


def test_nan_in_a_query_poisons_only_its_row(rnd):
    q, k, v, _ = rnd.qkv(1, 2, 6, 7, 4)
    q[0, 1, 2, 3] = np.nan
    for name, (o, l) in _forwards(q, k, v).items():
        assert _nan_rows(o, l) == {(0, 1, 2)}, f"{name}; {rnd}"
        assert np.isfinite(np.delete(o, 2, axis=2)).all(), f"{name}; {rnd}"
    # its lse is NaN, not the -inf of a row without keys, so its gradient is NaN
    # too rather than a silent 0; head 0 is untouched
    out, lse = _forwards(q, k, v)["attention"]
    dout = rnd.normal(out.shape)
    with np.errstate(invalid="ignore"):
        for backward in (R.attention_backward, R.flash_backward):
            dq, dk, dv = backward(dout, q, k, v, out, lse, layout="bhsd")
            assert np.isnan(dq[0, 1, 2]).all(), backward.__name__
            assert np.isnan(dk[0, 1]).all() and np.isnan(dv[0, 1]).all()
            assert all(np.isfinite(g[0, 0]).all() for g in (dq, dk, dv))


@pytest.mark.parametrize("where", ["k", "v"])
def test_nan_in_a_key_or_value_reaches_the_rows_that_see_it(rnd, where):
    """Causal, Nq = Nk = 6: key 4 is seen by queries 4 and 5 only; masked scores are
    -inf before the softmax, so a NaN in the key does not reach queries 0..3."""
    q, k, v, _ = rnd.qkv(1, 1, 6, 6, 4)
    (k if where == "k" else v)[0, 0, 4, 1] = np.nan
    for name, (o, l) in _forwards(q, k, v, causal=True).items():
        if where == "k":
            assert _nan_rows(o, l) == {(0, 0, 4), (0, 0, 5)}, f"{name}; {rnd}"
        else:  # a NaN value spreads through P V, not into lse; in a materialised
            # P V also into the rows that weigh it 0 (0 * NaN), so only those that
            # see it are pinned down
            assert np.isfinite(l).all(), f"{name}; {rnd}"
            assert np.isnan(o[0, 0, 4:, 1]).all(), f"{name}; {rnd}"
            assert np.isfinite(np.delete(o, 1, axis=3)).all(), f"{name}; {rnd}"


def test_plus_inf_score_makes_its_row_nan(rnd):
    """One +inf score in row 3 (the others -inf or finite) gives NaN (+inf - +inf),
    not a one-hot row: the reference is an IEEE softmax, not its limit."""
    q, k, v, _ = rnd.qkv(1, 1, 5, 6, 4)
    q[0, 0, 3] = [np.inf, 0.0, 0.0, 0.0]
    k[0, 0, :, 0] = [1.0, -1.0, -1.0, -1.0, -1.0, -1.0]  # scores +inf, then -inf
    for name, (o, l) in _forwards(q, k, v).items():
        assert _nan_rows(o, l) == {(0, 0, 3)}, f"{name}; {rnd}"


def test_all_neg_inf_scores_are_a_row_without_keys(rnd):
    """-inf scores count as masked: a row whose scores are all -inf gives 0 and -inf,
    exactly as a row that sees no key."""
    q, k, v, _ = rnd.qkv(1, 1, 5, 6, 4)
    q[0, 0, 1] = [-np.inf, 0.0, 0.0, 0.0]
    k[0, 0, :, 0] = 1.0
    for name, (o, l) in _forwards(q, k, v).items():
        assert np.all(o[0, 0, 1] == 0) and np.isneginf(l[0, 0, 1]), f"{name}; {rnd}"
        assert np.isfinite(np.delete(o, 1, axis=2)).all(), f"{name}; {rnd}"
        assert np.isfinite(np.delete(l, 1, axis=2)).all(), f"{name}; {rnd}"


# ---------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk", [(17, 63), (63, 17), (1, 33)])
def test_softmax_rows_sum_to_one(rnd, nq, nk, causal):
    q, k, _, _ = rnd.qkv(2, 2, nq, nk, 16)
    ones = np.ones((2, 2, nk, 1))
    out, lse = R.flash_forward(q, k, ones, causal=causal, block_m=5, block_n=6,
                               layout="bhsd")
    visible = np.isfinite(lse)
    # O = P @ 1 is each row's sum of P.
    assert np.abs(out[..., 0][visible] - 1).max() < 1e-13, str(rnd)
    # exp(S - lse) over the visible keys sums to 1 as well.
    s = q @ k.swapaxes(-1, -2) / math.sqrt(16)
    mask = R.causal_mask(nq, nk) if causal else np.ones((nq, nk), dtype=bool)
    with np.errstate(invalid="ignore"):
        p = np.where(mask, np.exp(s - lse[..., None]), 0.0)
    assert np.abs(p.sum(-1)[visible] - 1).max() < 1e-13, str(rnd)


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_online_softmax_equals_softmax(rnd, n):
    x = 3 * rnd.normal(n)
    w, m, l = R.online_softmax(x)
    e = np.exp(x - x.max())
    assert m == x.max()
    assert abs(l - e.sum()) < 1e-13 * e.sum(), str(rnd)
    assert np.abs(w - e / e.sum()).max() < 1e-15, str(rnd)
    assert abs(w.sum() - 1) < 1e-14, str(rnd)
    for block in (1, 3, n, n + 5):
        wb, states = R.online_softmax_blocks(x, block)
        assert len(states) == -(-n // block)
        assert states[-1][0] == m and abs(states[-1][1] - l) < 1e-13 * l, str(rnd)
        assert np.abs(wb - w).max() < 1e-15, str(rnd)
        # The running max never decreases.
        assert all(a[0] <= b[0] for a, b in zip(states, states[1:]))


def test_online_softmax_worked_example():
    """The paper's example: [2, 1, 3, 0] in two blocks of 2."""
    x = [2.0, 1.0, 3.0, 0.0]
    w, states = R.online_softmax_blocks(x, block=2)
    (m1, l1), (m2, l2) = states
    assert (m1, m2) == (2.0, 3.0)
    assert round(l1, 4) == 1.3679  # e^0 + e^-1
    assert round(l1 * math.exp(m1 - m2), 4) == 0.5032  # rescaled by e^(2-3)
    assert round(math.exp(0) + math.exp(-3), 4) == 1.0498  # block 2's own sum
    assert round(l2, 4) == 1.5530
    assert np.array_equal(np.round(w, 4), [0.2369, 0.0871, 0.6439, 0.0321])
    w1, m, l = R.online_softmax(x)
    assert m == 3.0 and round(l, 4) == 1.5530
    assert np.array_equal(np.round(w1, 4), np.round(w, 4))


def test_online_softmax_with_neg_inf_entries():
    with no_warnings():
        w, m, l = R.online_softmax([-np.inf, 0.0, -np.inf, 0.0])
        wb, states = R.online_softmax_blocks([-np.inf, -np.inf, 0.0, 0.0], 2)
        w0, m0, l0 = R.online_softmax([-np.inf, -np.inf])
    assert np.array_equal(w, [0, 0.5, 0, 0.5]) and (m, l) == (0.0, 2.0)
    assert states == [(-np.inf, 0.0), (0.0, 2.0)]
    assert np.array_equal(wb, [0, 0, 0.5, 0.5])
    assert np.array_equal(w0, [0, 0]) and (m0, l0) == (-np.inf, 0.0)


def test_doctests():
    result = doctest.testmod(R)
    assert result.attempted >= 5 and result.failed == 0


# ---------------------------------------------------------------------------
# The low-precision "standard attention" baseline
# ---------------------------------------------------------------------------

# Sanity bounds (lowest, highest) on the same-dtype baseline's relative error, per
# output, for test_lowp_close_to_reference_but_not_identical's problem (B = H = 2,
# N = 32, d = 32, standard normals, default scale).  Measured over 3000 draws (1500
# each causal and not) — min / median / max:
#   fp16: O 2.8e-4 / 6.7e-4 / 2.2e-3, LSE 6.3e-5 / 1.5e-4 / 5.5e-4,
#         dQ 3.9e-4 / 1.1e-3 / 3.1e-3, dK 4.5e-4 / 1.0e-3 / 2.9e-3, dV 2.9e-4 / 8.6e-4 / 2.3e-3
#   bf16: O 2.3e-3 / 5.4e-3 / 1.9e-2, LSE 4.7e-4 / 1.2e-3 / 4.3e-3,
#         dQ 2.6e-3 / 8.7e-3 / 2.7e-2, dK 3.2e-3 / 8.5e-3 / 4.3e-2, dV 2.6e-3 / 6.8e-3 / 2.4e-2
# The caps are ~2× the largest value seen, the floors ~half the smallest: a baseline
# that stopped rounding (too exact) or rounded twice as badly fails.  (The old caps,
# 2e-2 for everything in fp16 — 6× to 36× what it reaches — and bf16's 2e-2 / 5e-2,
# barely above its measured maxima 1.9e-2 (O) and 4.3e-2 (dK), said little.)
# bf16 has 8 significant bits: rounding the scores alone moves logits by up to
# ~|s| * 2^-9, and the backward's dS = P * (dP - D) cancels on top of that, so its
# gradients have the widest spread.
LOWP_BOUNDS = {
    "float16": {"out": (1e-4, 5e-3), "lse": (2e-5, 1.2e-3), "dq": (1.5e-4, 7e-3), "dk": (1.5e-4, 7e-3),
                "dv": (1e-4, 5e-3)},
    "bfloat16": {"out": (1e-3, 4e-2), "lse": (2e-4, 9e-3), "dq": (1e-3, 6e-2), "dk": (1.5e-3, 9e-2),
                 "dv": (1e-3, 5e-2)},
}  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16],
                         ids=["float16", "bfloat16"])
def test_lowp_close_to_reference_but_not_identical(rnd, dtype, causal):
    bounds = LOWP_BOUNDS[np.dtype(dtype).name]
    q, k, v, dout = rnd.qkv(2, 2, 32, 32, 32)
    out, lse = R.attention(q, k, v, causal=causal, layout="bhsd")
    lo, llse = R.attention_lowp(q, k, v, dtype=dtype, causal=causal, layout="bhsd")
    assert lo.dtype == np.dtype(dtype) and llse.dtype == np.float32
    assert lo.shape == out.shape and llse.shape == lse.shape
    for name, x, ref in [("out", lo, out), ("lse", llse, lse)]:
        err, (low, high) = R.rel_error(x, ref), bounds[name]
        assert low < err < high, f"{name}: rel error {err:.3e} outside ({low:.1e}, {high:.1e}); {rnd}"

    grads = R.attention_backward(dout, q, k, v, out, lse, causal=causal, layout="bhsd")
    lgrads = R.attention_backward_lowp(dout, q, k, v, out, lse, dtype=dtype,
                                       causal=causal, layout="bhsd")
    for name, x, ref in zip("dq dk dv".split(), lgrads, grads):
        assert x.dtype == np.dtype(dtype) and x.shape == ref.shape
        err, (low, high) = R.rel_error(x, ref), bounds[name]
        assert low < err < high, f"{name}: rel error {err:.3e} outside ({low:.1e}, {high:.1e}); {rnd}"


# ---------------------------------------------------------------------------
# The TF32 baselines (attention_tf32 / attention_backward_tf32), which set the
# tolerances of the allow_tf32=True kernels, against an independent formula
# ---------------------------------------------------------------------------

TF32_UNIT = 2.0**-11  # unit roundoff of TF32's 11 significant bits


def tf32_by_frexp(x):
    """``x`` rounded to TF32 without bit tricks: through float32 (what a kernel reads),
    then to 11 significant bits with ties away from zero (cvt.rna), as float64."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    mant, exp = np.frexp(x)  # x = mant · 2**exp, 0.5 <= |mant| < 1
    return np.ldexp(np.sign(mant) * np.floor(np.abs(mant) * 2.0**11 + 0.5), exp - 11)


def _visible(nq, nk, causal):
    rows = [[not causal or j <= i + nk - nq for j in range(nk)] for i in range(nq)]
    return np.array(rows, dtype=bool).reshape(nq, nk)


def tf32_attention_by_rows(q, k, v, causal, scale):
    """The TF32 forward baseline, one (batch, head, query row) at a time (bhsd):
    Q, K, V rounded; exp(s − max) rounded before P·V, its sum not."""
    b_, h_, nq, _ = q.shape
    nk = k.shape[2]
    out, lse = np.zeros(q.shape[:3] + v.shape[3:]), np.full(q.shape[:3], -np.inf)
    seen = _visible(nq, nk, causal)
    for b in range(b_):
        for h in range(h_):
            tq, tk, tv = (tf32_by_frexp(x[b, h]) for x in (q, k, v))
            for i in range(nq):
                keys = np.flatnonzero(seen[i])
                if keys.size == 0:
                    continue
                s = np.array([scale * float(tq[i] @ tk[j]) for j in keys])
                e = np.exp(s - s.max())
                out[b, h, i] = tf32_by_frexp(e) @ tv[keys] / e.sum()
                lse[b, h, i] = s.max() + math.log(e.sum())
    return out, lse


def tf32_backward_by_rows(dout, q, k, v, out, lse, causal, scale):
    """The TF32 backward baseline (bhsd), written out per (batch, head): P from the
    rounded Q, K and the given lse; dP from the rounded dO, V; D = rowsum(dO∘O)
    unrounded; P and dS rounded as the operands of dV, dQ, dK."""
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    seen = _visible(q.shape[2], k.shape[2], causal)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            tq, tk, tv, tdo = (tf32_by_frexp(x[b, h]) for x in (q, k, v, dout))
            s = scale * np.einsum("id,jd->ij", tq, tk)
            p = np.where(seen, np.exp(np.where(seen, s, 0.0) - lse[b, h][:, None]), 0.0)
            big_d = np.einsum("id,id->i", dout[b, h], out[b, h])
            ds = p * (np.einsum("id,jd->ij", tdo, tv) - big_d[:, None])
            tp, tds = tf32_by_frexp(p), tf32_by_frexp(ds)
            dv[b, h] = tp.T @ tdo
            dq[b, h] = scale * tds @ tk
            dk[b, h] = scale * tds.T @ tq
    return dq, dk, dv


def test_tf32_rounding_by_frexp_equals_round_tf32():
    """The two roundings agree on float32 values of every magnitude, including exact
    ties (half of the 13 dropped bits set: rounded away from zero)."""
    gen = np.random.default_rng(0)
    x = (gen.standard_normal(20000) * 10.0 ** gen.integers(-30, 30, 20000)).astype(np.float32)
    ties = ((x.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x1000)).view(np.float32)
    for values in (x, ties, -ties):
        np.testing.assert_array_equal(tf32_by_frexp(values), R.round_tf32(values).astype(np.float64))
    assert tf32_by_frexp(np.float32(1 + 2**-11)) == 1 + 2**-10  # a tie, away from zero


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk, scale", [(9, 23, None), (23, 9, 0.3), (17, 17, 2.5)])
def test_tf32_baselines_match_an_independent_formula(rnd, nq, nk, scale, causal):
    """attention_tf32 / attention_backward_tf32 equal a row-by-row rewrite (float64,
    rounding by frexp) to 1e-12, and differ from the exact attention by TF32-sized
    errors, in units of TF32's unit roundoff u = 2^-11 ≈ 4.9e-4.  Measured over 300
    draws per case: O 0.3u..2.6u, LSE 0.06u..1u, gradients 0.4u..7u at the default
    scale and 0.3; a sharp softmax (scale 2.5: scores ~10) amplifies the score
    rounding: O up to 11u, gradients up to 30u.  Bounds: above u/10 (LSE u/100),
    below 16u (64u at scale 2.5)."""
    b, h, d = 1, 2, 16
    gen = rnd.gen
    q, k, v = (gen.standard_normal((b, h, n, d)).astype(np.float32) for n in (nq, nk, nk))
    dout = gen.standard_normal((b, h, nq, d)).astype(np.float32)
    kw = dict(causal=causal, softmax_scale=scale, layout="bhsd")
    sc = 1 / math.sqrt(d) if scale is None else scale
    out, lse = R.attention_tf32(q, k, v, **kw)
    want_out, want_lse = tf32_attention_by_rows(q, k, v, causal, sc)
    assert_close(out, want_out, EXACT, "tf32 out", rnd)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse)), str(rnd)
    assert_close(lse, want_lse, EXACT, "tf32 lse", rnd)
    # the backward from a float32 forward, as the kernels get it
    o32, l32 = out.astype(np.float32), lse.astype(np.float32)
    grads = R.attention_backward_tf32(dout, q, k, v, o32, l32, **kw)
    wants = tf32_backward_by_rows(*(x.astype(np.float64) for x in (dout, q, k, v, o32, l32)), causal, sc)
    for name, got, want in zip(("dq", "dk", "dv"), grads, wants):
        assert_close(got, want, EXACT, f"tf32 {name}", rnd)
    # ...and against the exact attention: TF32-sized differences
    exact_out, exact_lse = R.attention(q, k, v, **kw)
    exact_grads = R.attention_backward(dout, q, k, v, o32, l32, **kw)
    for name, got, ref in [("out", out, exact_out), ("lse", lse, exact_lse)] + list(
            zip(("dq", "dk", "dv"), grads, exact_grads)):
        err = R.rel_error(got, ref)
        low = TF32_UNIT / 100 if name == "lse" else TF32_UNIT / 10  # LSE: rounding inside a log-sum
        high = (64 if sc > 1 else 16) * TF32_UNIT
        assert low < err < high, f"{name}: {err:.3e} vs exact, expected ({low:.1e}, {high:.1e}); {rnd}"


def test_tf32_baseline_with_one_key_is_v_rounded():
    """One key: P = 1 exactly, so the TF32 forward is V rounded to TF32, and its lse the
    score of the rounded q and k; dV is dO rounded to TF32."""
    gen = np.random.default_rng(4)
    q, k, v, dout = (gen.standard_normal((1, 3, 1, 8)).astype(np.float32) for _ in range(4))
    out, lse = R.attention_tf32(q, k, v, layout="bhsd")
    np.testing.assert_array_equal(out, R.round_tf32(v).astype(np.float64))
    tq, tk = (R.round_tf32(x).astype(np.float64) for x in (q, k))
    np.testing.assert_allclose(lse, (tq * tk).sum(-1) / math.sqrt(8), rtol=1e-15)
    _, _, dv = R.attention_backward_tf32(dout, q, k, v, out, lse, layout="bhsd")
    np.testing.assert_array_equal(dv, R.round_tf32(dout).astype(np.float64))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lowp_float32_and_layouts(rnd, layout):
    q, k, v, dout = rnd.qkv(1, 2, 20, 12, 8, layout)
    kw = dict(causal=True, layout=layout)
    out, lse = R.attention(q, k, v, **kw)
    lo, llse = R.attention_lowp(q, k, v, dtype=np.float32, **kw)
    assert lo.dtype == np.float32 and lo.shape == out.shape
    assert 0 < R.rel_error(lo, out) < 1e-5, str(rnd)
    assert R.rel_error(llse, lse) < 1e-5, str(rnd)
    grads = R.attention_backward(dout, q, k, v, out, lse, **kw)
    lgrads = R.attention_backward_lowp(dout, q, k, v, out, lse, dtype="float32", **kw)
    for name, x, ref in zip("dq dk dv".split(), lgrads, grads):
        assert x.dtype == np.float32 and x.shape == ref.shape
        assert R.rel_error(x, ref) < 1e-5, f"{name}; {rnd}"


# ---------------------------------------------------------------------------
# Error measures
# ---------------------------------------------------------------------------

def test_rel_error_and_max_abs_error():
    ref = np.array([1.0, -4.0, 2.0])
    assert R.max_abs_error(ref + [0, 0.5, 0], ref) == 0.5
    assert R.rel_error(ref + [0, 0.5, 0], ref) == 0.125
    assert R.rel_error(ref, ref) == 0.0
    # NaN never passes.
    assert R.rel_error([1.0, np.nan, 2.0], ref) == math.inf
    assert R.max_abs_error([1.0, np.nan, 2.0], ref) == math.inf
    # -inf LSE of a fully masked row: equal counts 0, unequal counts inf.
    lse = np.array([-np.inf, 1.0, 2.0])
    with no_warnings():
        assert R.rel_error(lse, lse) == 0.0
        assert R.max_abs_error(lse, lse) == 0.0
        assert R.rel_error([0.0, 1.0, 2.0], lse) == math.inf
        assert R.rel_error(lse, [0.0, 1.0, 2.0]) == math.inf
        assert R.rel_error([np.inf, 1.0, 2.0], lse) == math.inf
        # The -inf is left out of the denominator.
        assert R.rel_error([-np.inf, 1.0, 2.5], lse) == 0.25
        # An all-zero reference divides by tiny, not 0.
        assert R.rel_error([0.0, 0.0], [0.0, 0.0]) == 0.0
        assert R.rel_error([1e-300, 0.0], [0.0, 0.0]) > 1e7
    # Low-precision inputs are measured in float64.
    half = np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16)
    assert R.rel_error(half, [1.0, 2.0]) == 0.0
    assert isinstance(R.rel_error(half, [1.0, 2.0]), float)


# ---------------------------------------------------------------------------
# Inputs are left alone; bad arguments are refused
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_inputs_are_not_modified(rnd, layout):
    q, k, v, dout = rnd.qkv(2, 2, 13, 9, 8, layout)
    kw = dict(causal=True, layout=layout)
    out, lse = R.attention(q, k, v, **kw)
    arrays = dict(q=q, k=k, v=v, dout=dout, out=out, lse=lse)
    before = {name: x.copy() for name, x in arrays.items()}
    results = [
        R.attention(q, k, v, **kw),
        R.flash_forward(q, k, v, block_m=4, block_n=5, **kw),
        R.attention_backward(dout, q, k, v, out, lse, **kw),
        R.flash_backward(dout, q, k, v, out, lse, block_m=4, block_n=5, **kw),
        R.attention_lowp(q, k, v, dtype=np.float16, **kw),
        R.attention_backward_lowp(dout, q, k, v, out, lse, dtype=ml_dtypes.bfloat16,
                                  **kw),
        (R.rel_error(out, q),),
        (R.max_abs_error(lse, lse),),
    ]
    row = q[0, 0, 0].copy()
    R.online_softmax(q[0, 0, 0])
    R.online_softmax_blocks(q[0, 0, 0], 3)
    assert np.array_equal(q[0, 0, 0], row)
    for name, x in arrays.items():
        assert np.array_equal(x, before[name]), f"{name} was modified; {rnd}"
    for result in results:
        for r in result:
            for name, x in arrays.items():
                assert not np.shares_memory(r, x), f"a result aliases {name}"


def _bad_argument_cases():
    """(argument, function, args, kwargs); the arrays are bhsd, and every function
    that takes a layout gets ``layout="bhsd"`` unless the case sets one."""
    q = np.ones((1, 2, 5, 4)) * 0.5
    k = np.ones((1, 2, 6, 4)) * 0.25
    v = np.ones((1, 2, 6, 4)) * 0.75
    out, lse = R.attention(q, k, v, layout="bhsd")
    bwd = (out, q, k, v, out, lse)
    A, F, AB, FB = R.attention, R.flash_forward, R.attention_backward, R.flash_backward
    return [
        ("q", A, (q[0], k, v), {}),
        ("q", A, (np.ones((1, 2, 5, 0)), k, v), {}),  # headdim 0 (seqlens may be 0)
        ("k", A, (q, k[..., :3], v), {}),
        ("k", A, (q, np.ones((1, 3, 6, 4)), v), {}),
        ("v", A, (q, k, v[:, :, :5]), {}),
        ("layout", A, (q, k, v), dict(layout="bsdh")),
        ("layout", A, (q, k, v), dict(layout=np.array(["bhsd"]))),
        ("layout", F, (q, k, v), dict(layout=None)),
        ("causal", A, (q, k, v), dict(causal="yes")),
        ("causal", F, (q, k, v), dict(causal=1)),
        ("causal", A, (q, k, v), dict(causal=np.array([True, False]))),
        ("softmax_scale", A, (q, k, v), dict(softmax_scale=float("nan"))),
        ("softmax_scale", F, (q, k, v), dict(softmax_scale="0.5")),
        ("softmax_scale", A, (q, k, v), dict(softmax_scale=10**400)),  # beyond float64
        ("softmax_scale", A, (q, k, v), dict(softmax_scale=-np.inf)),
        ("block_m", F, (q, k, v), dict(block_m=0)),
        ("block_m", F, (q, k, v), dict(block_m=True)),
        ("block_n", F, (q, k, v), dict(block_n=2.5)),
        ("block_n", FB, bwd, dict(block_n=-1)),
        ("block_m", FB, bwd, dict(block_m=None)),
        ("lse", AB, (out, q, k, v, out, lse[..., :4]), {}),
        ("lse", FB, (out, q, k, v, out, lse[0]), {}),
        ("dout", AB, (out[..., :3], q, k, v, out, lse), {}),
        ("out", AB, (out, q, k, v, out[:, :, :4], lse), {}),
        ("layout", AB, bwd, dict(layout="BHSD")),
        ("dtype", R.attention_lowp, (q, k, v), dict(dtype=np.int8)),
        ("dtype", R.attention_lowp, (q, k, v), dict(dtype=np.float64)),
        ("dtype", R.attention_backward_lowp, bwd, dict(dtype="nope")),
        ("x", R.online_softmax, (np.ones((2, 2)),), {}),
        ("x", R.online_softmax, ([],), {}),
        ("block", R.online_softmax_blocks, ([1.0, 2.0],), dict(block=0)),
        ("seqlen_q", R.causal_mask, (-1, 3), {}),
        ("seqlen_k", R.causal_mask, (3, 2.0), {}),
        ("x", R.rel_error, (np.ones(3), np.ones(4)), {}),
        ("x", R.max_abs_error, (np.ones((2, 1)), np.ones(2)), {}),
    ]


@pytest.mark.parametrize("case", range(len(_bad_argument_cases())))
def test_bad_arguments_raise_value_error_naming_the_argument(case):
    name, fn, args, kwargs = _bad_argument_cases()[case]
    if "layout" in inspect.signature(fn).parameters:
        kwargs = {"layout": "bhsd", **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}\b") as info:
        fn(*args, **kwargs)
    assert "expected" in str(info.value)

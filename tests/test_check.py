"""numba_flash.check's rules: how LSE is judged, NaN-poisoned outputs, and the
simulator grid that ``numba-flash check`` runs in CI.

Most of this is pure NumPy (a stand-in API, the judge on made-up errors); one case runs
a real tensor-core forward in the simulator.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from numba_flash import _arrays, plan, reference
from numba_flash import check as C

BF16 = np.dtype(ml_dtypes.bfloat16)


# --- LSE is float32: judged by the float32 bound -------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lse_of_half_inputs_gets_the_float32_bound(dtype):
    assert C.tolerance("lse", dtype) == C.FP32_TOLERANCE["lse"] == 1e-5
    # a baseline, however bad, does not loosen it
    assert C.tolerance("lse", dtype, 0.5) == 1e-5
    # the other outputs keep the same-dtype rule and still need their baseline
    assert C.tolerance("out", dtype, 1e-3) == pytest.approx(2e-3 + C.lowp_floor(dtype))
    assert C.tolerance("dk", dtype, 1e-3) == pytest.approx(3e-3 + C.lowp_floor(dtype))
    with pytest.raises(ValueError, match="same-dtype"):
        C.tolerance("out", dtype)


def test_tf32_lse_keeps_the_baseline_rule():
    """TF32 rounds Q and K before the scores, so its LSE is judged against the TF32
    baseline (factor 2 + the float32 bound), not the float32 bound alone."""
    assert C.tolerance("lse", "tf32", 1e-4) == pytest.approx(2e-4 + 1e-5)
    with pytest.raises(ValueError, match="tf32"):
        C.tolerance("lse", "tf32")


def test_uses_baseline():
    assert not any(C.uses_baseline(o, "float32") for o in C.FP32_TOLERANCE)
    for dtype in ("float16", "bfloat16"):
        assert [o for o in C.FP32_TOLERANCE if C.uses_baseline(o, dtype)] == ["out", "dq", "dk", "dv"]
    assert all(C.uses_baseline(o, "tf32") for o in C.FP32_TOLERANCE)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_judge_lse_of_half_inputs(dtype):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 2, 9)) + 3.0
    ref[0, 0, :2] = -np.inf  # rows that see no key
    scale = np.abs(ref[np.isfinite(ref)]).max()
    close = ref + 5e-6 * scale * np.sign(rng.standard_normal(ref.shape))
    r = C.judge("lse", dtype, close.astype(np.float32), ref)  # no baseline needed
    assert r.passed and r.limit == 1e-5 and r.baseline_rel is None, r
    far = ref + 3e-5 * scale  # 3e-5: inside the old same-dtype bound (~1e-3), outside 1e-5
    bad_baseline = ref + 1e-2 * scale
    r = C.judge("lse", dtype, far, ref, baseline=bad_baseline)
    assert not r.passed and r.limit == 1e-5 and r.rel == pytest.approx(3e-5)
    # the -inf pattern and NaN are still checked
    wrong = ref.copy()
    wrong[0, 0, 0] = 0.0
    r = C.judge("lse", dtype, wrong, ref)
    assert not r.passed and "-inf mismatches" in r.note
    nan = ref.copy()
    nan[0, 1, 3] = np.nan
    assert not C.judge("lse", dtype, nan, ref).passed


def test_judge_lse_near_zero_is_judged_on_the_scores_scale():
    """One key whose score nearly cancels: lse 0.00175 off by 3.26e-8 (a CI run's case, fp32
    N = 1, d = 16) is 1.9e-5 of itself but 3.3e-8 of the scores' scale, 1: it passes; an
    error of 2e-5 still fails."""
    ref = np.array([[[0.00175]]])
    r = C.judge("lse", "float32", ref + 3.26e-8, ref)
    assert r.passed and r.rel == pytest.approx(3.26e-8), r
    assert not C.judge("lse", "float32", ref + 2e-5, ref).passed


def test_judge_out_of_half_inputs_still_needs_its_baseline():
    ref = np.ones((1, 3, 1, 8))
    with pytest.raises(ValueError, match="same-dtype"):
        C.judge("out", "float16", ref, ref)
    r = C.judge("out", "float16", ref * (1 + 1e-3), ref, baseline=ref * (1 + 1e-3))
    assert r.baseline_rel == pytest.approx(1e-3) and r.limit == pytest.approx(2e-3 + 2.0**-11)


# --- NaN-poisoned outputs ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
def test_poisoned_outputs_fill_nan_and_restore(dtype):
    real = _arrays.empty
    with C.poisoned_outputs():
        arr = _arrays.empty("numpy", (2, 3, 4), dtype)
        assert arr.dtype == dtype and arr.shape == (2, 3, 4)
        assert np.all(np.isnan(arr.astype(np.float32)))
    assert _arrays.empty is real
    with pytest.raises(RuntimeError):
        with C.poisoned_outputs():
            raise RuntimeError("boom")
    assert _arrays.empty is real  # restored on the way out of an exception too
    with C.poisoned_outputs(False):
        assert _arrays.empty is real


class _ForgetfulAPI:
    """Writes the exact answer into the buffers the real API would allocate
    (``_arrays.empty``) except one element of ``forget`` ("out" or "dq")."""

    def __init__(self, forget):
        self.forget = forget

    def _fill(self, name, like, value):
        buf = _arrays.empty("numpy", like.shape, like.dtype)
        written = np.ones(buf.shape, bool)
        if name == self.forget:
            written.flat[buf.size // 2] = False
        buf[written] = value[written]
        return buf

    def flash_attention(self, q, k, v, *, causal, layout, return_lse, **kw):
        ref_out, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout)
        return self._fill("out", q, ref_out), self._fill("lse", ref_lse.astype(np.float32), ref_lse)

    def flash_attention_backward(self, dout, q, k, v, out, lse, *, causal, layout, **kw):
        refs = reference.attention_backward(dout, q, k, v, out, lse, causal=causal, layout=layout)
        return tuple(self._fill(n, x, r) for n, x, r in zip(("dq", "dk", "dv"), (q, k, v), refs))


@pytest.mark.parametrize("forget", ["out", "dq"])
def test_check_case_poisons_so_an_unwritten_element_fails(monkeypatch, forget):
    from numba_flash import api

    fake = _ForgetfulAPI(forget)
    monkeypatch.setattr(api, "flash_attention", fake.flash_attention)
    monkeypatch.setattr(api, "flash_attention_backward", fake.flash_attention_backward)
    case = C.CaseSpec(1, 1, 5, 7, 16, True, "bshd", "float32")
    # a NaN left in O would reach the backward (delta = rowsum(dO∘O)): check O alone
    r = C.check_case(case, seed=3, passes=("forward",) if forget == "out" else C.PASSES)
    assert r.error is None, r.error
    verdict = {o.output: o for o in r.outputs}
    assert not verdict[forget].passed and "1 NaN" in verdict[forget].note
    assert all(o.passed for name, o in verdict.items() if name != forget)


# --- the simulator grid reaches every kernel family ---------------------------------


def _kernels(case, pass_):
    dtype = "float32" if case.tf32 else case.dtype
    p = plan.plan(plan.Problem(pass_, dtype, case.head_dim, case.causal, allow_tf32=case.tf32, simulator=True))
    return p.family, p.work_dtype, tuple(k.name for k in p.launches)


def test_sim_cases_reach_every_family():
    cases = C.default_cases(simulator=True)
    assert cases == list(C.SIM_CASES)
    reached = {(c.dtype, c.tf32) + _kernels(c, "forward")[:1] + _kernels(c, "forward")[2][:1] for c in cases}
    assert {
        ("float32", False, "simt-fp32", "simt_forward"),  # row-group fp32
        ("float32", False, "simt-fp32", "simt_blocked_forward"),  # register-blocked fp32
        ("float16", False, "tensor-core", "tc_forward"),
        ("bfloat16", False, "tensor-core", "tc_forward"),
        ("float32", True, "tensor-core-tf32", "tf32_forward"),
    } <= reached
    assert any(c.dtype == "float16" and c.head_dim % 32 and _kernels(c, "forward")[0] == "tensor-core"
               for c in cases)  # a head dim padded up to the tensor-core tiles'
    backward = {n for c in cases for n in _kernels(c, "backward")[2]}
    for name in ("simt_bwd_dq", "simt_blocked_dq", "tc_bwd_dq", "tf32_bwd_dq"):
        assert any(n == name or n.startswith(name) for n in backward), (name, backward)
    # row-group at two lane-group widths, tiny sizes, both layouts, causal and not,
    # Nq != Nk both ways with rows that see no key, one key, two heads
    assert {c.head_dim for c in cases if _kernels(c, "forward")[2] == ("simt_forward",)} >= {16, 32}
    assert all(c.batch == 1 and c.heads <= 2 and max(c.seqlen_q, c.seqlen_k) <= 33 for c in cases)
    assert {c.layout for c in cases} == {"bshd", "bhsd"} and {c.causal for c in cases} == {False, True}
    assert any(c.seqlen_q > c.seqlen_k and c.causal for c in cases)
    assert any(c.seqlen_q < c.seqlen_k for c in cases)
    assert any(c.seqlen_q == c.seqlen_k == 1 for c in cases) and any(c.heads == 2 for c in cases)


def test_run_check_passes_poison_through(monkeypatch):
    seen = []
    def fake_check_case(case, seed, **kw):
        seen.append(kw["poison"])
        return C.CaseResult(case, seed, 0)

    monkeypatch.setattr(C, "check_case", fake_check_case)
    case = C.SIM_CASES[0]
    C.run_check([case], seed=1)
    C.run_check([case], seed=1, poison=False)
    assert seen == [True, False]


def test_check_case_tensor_core_lse_within_fp32_bound():
    """A real fp16 tensor-core forward (simulator): its LSE meets the float32 bound."""
    case = C.CaseSpec(1, 1, 9, 20, 64, True, "bshd", "float16")
    assert _kernels(case, "forward")[0] == "tensor-core"
    r = C.check_case(case, seed=5, passes=("forward",))
    assert r.error is None and r.passed, (r.error, r.outputs)
    lse = {o.output: o for o in r.outputs}["lse"]
    assert lse.limit == 1e-5 and lse.baseline_rel is None and lse.rel <= 1e-6

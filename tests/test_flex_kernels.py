"""FlexAttention in the kernels: ``score_mod``, ``mask_mod`` block masks and block-sparse
walks on every kernel family, forward and backward, against the float64 reference
(which evaluates the same Python functions in NumPy).

Tolerances as for the built-in variants (``test_variants``): exact fp32 ≤ 1e-5 / 1e-4,
fp16/bf16 and TF32 ≤ 2× / 3× the same-precision standard attention given the same
mods.  Outputs start as NaN.  The simulator runs tiny shapes on a sample of the
family × case matrix; ``pytest -m gpu`` runs all of it and sizes spanning many tiles.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import BWD_TOL, FWD_TOL, SIMULATOR, grad_errors, host, seen_lse_error
from test_variants import FAMILIES, FLOOR, _baselines, _inputs, _seq, _varlen_case, _xp, check_variant

import numba_flash
from numba_flash import BlockMask, create_block_mask, reference

# --- the user's functions (plain Python, scalar math) ---------------------------------------


def rel_bias(score, b, h, q_idx, kv_idx, table):
    """A learned relative-position bias, one table row per head."""
    return score + table[h, (q_idx - kv_idx) % table.shape[1]]


def rel_bias_grad(score, b, h, q_idx, kv_idx, table):
    return 1.0


def tanh_cap(score, b, h, q_idx, kv_idx, cap):
    """softcap written as a score_mod."""
    return cap * math.tanh(score / cap)


def tanh_cap_grad(score, b, h, q_idx, kv_idx, cap):
    t = math.tanh(score / cap)
    return 1.0 - t * t


def same_doc(b, h, q_idx, kv_idx, doc):
    """Packed documents: a query sees keys of its own document."""
    return doc[q_idx] == doc[kv_idx]


def causal_mod(b, h, q_idx, kv_idx, diag):
    return kv_idx <= q_idx + diag


def _doc_ids(rng, n, docs=3):
    cuts = np.sort(rng.choice(np.arange(1, n), size=docs - 1, replace=False))
    return np.searchsorted(cuts, np.arange(n), side="right").astype(np.int32)


def case(rng, name, B, H, Nq, Nk, xp):
    """(flash_attention keywords, backward-only keywords, reference keywords) of a case."""
    fwd, ref = {}, {}
    if name in ("bias", "all") or name == "document" and max(Nq, Nk) >= 4096:
        table = (0.5 * rng.standard_normal((H, 7))).astype(np.float32)
        fwd.update(score_mod=rel_bias, mod_args=(xp.asarray(table),))
        ref.update(score_mod=rel_bias, mod_args=(table,))
    if name == "cap":
        fwd.update(score_mod=tanh_cap, mod_args=(1.5,))
        ref.update(score_mod=tanh_cap, mod_args=(1.5,))
    if name in ("document", "all"):
        big = max(Nq, Nk) >= 4096  # real sizes: 8 documents in 128-blocks
        doc = _doc_ids(rng, max(Nq, Nk), docs=8 if big else 3)
        bm = create_block_mask(same_doc, None, None, Nq, Nk, block_size=128 if big else 16,
                               mod_args=(xp.asarray(doc),))  # fmt: skip
        fwd["block_mask"] = ref["block_mask"] = bm
    if name == "sparse":  # the paper's fixed pattern, blocks smaller than the kernels' tiles
        pattern = rng.random((B, H, -(-Nq // 16), -(-Nk // 16))) < 0.5
        fwd["block_mask"] = ref["block_mask"] = BlockMask.from_dense(pattern, 16, Nq, Nk)
    if name == "causal-mod":
        bm = create_block_mask(causal_mod, None, None, Nq, Nk, block_size=16, mod_args=(Nk - Nq,))
        fwd["block_mask"] = ref["block_mask"] = bm
    grad = {rel_bias: rel_bias_grad, tanh_cap: tanh_cap_grad}.get(fwd.get("score_mod"))
    bwd = {"score_mod_grad": grad} if grad else {}
    return fwd, bwd, ref


#: name: (case, the built-in variants as test_variants.VARIANTS writes them)
CASES = {
    "bias": ("bias", {}),
    "cap": ("cap", {"causal": True}),
    "document": ("document", {}),
    "sparse": ("sparse", {}),
    "causal-mod": ("causal-mod", {}),
    "all": ("all", {"H": 4, "H_kv": 2, "causal": True, "window_size": (9, -1), "softcap": 4.0, "dropout": 0.2}),
}

SIM_MATRIX = [(f, c) for f in ("fp32-blocked", "fp32-rowgroup") for c in CASES] + [
    ("fp16", "all"), ("bf16", "bias"), ("tf32", "all"), ("fp16", "sparse")]  # fmt: skip
GPU_MATRIX = [(f, c) for f in FAMILIES for c in CASES if (f, c) not in SIM_MATRIX]


def check_flex(rng, fam, name, B=1, Nq=37, Nk=45):
    kind, builtin = CASES[name]
    check_variant(rng, fam, builtin, B, Nq, Nk, mods=lambda rng, B, H, Nq, Nk, xp: case(rng, kind, B, H, Nq, Nk, xp))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", SIM_MATRIX, ids=[f"{f}-{c}" for f, c in SIM_MATRIX])
def test_flex(rng, fam, name):
    check_flex(rng, fam, name)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="the rest of the family x case matrix: GPU only (simulator time)")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", GPU_MATRIX, ids=[f"{f}-{c}" for f, c in GPU_MATRIX])
def test_flex_gpu_matrix(rng, fam, name):
    check_flex(rng, fam, name)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("name", ["all", "sparse"])
def test_flex_large(rng, fam, name):
    check_flex(rng, fam, name, B=2, Nq=700, Nk=1000)


# --- varlen -------------------------------------------------------------------------------


def seq_doc(b, h, q_idx, kv_idx, doc):
    """Documents inside each varlen sequence: ``doc[b, i]`` is token i's document."""
    return doc[b, q_idx] == doc[b, kv_idx]


def _varlen_mods(rng, name, lens_q, lens_k, H, xp):
    """(forward, backward's own, reference) keywords of a varlen case: the block mask is
    per sequence (batch = sequences, max lengths), indices within each sequence."""
    B, mq, mk = len(lens_q), max(lens_q), max(lens_k)
    table = (0.5 * rng.standard_normal((H, 7))).astype(np.float32)
    fwd = dict(score_mod=rel_bias, mod_args=(xp.asarray(table),))
    ref = dict(score_mod=rel_bias, mod_args=(table,))
    if name == "document":
        doc = np.stack([_doc_ids(rng, max(mq, mk, 3)) for _ in range(B)])
        bm = create_block_mask(seq_doc, B, None, mq, mk, block_size=16, mod_args=(xp.asarray(doc),))
    else:  # a fixed pattern per sequence
        bm = BlockMask.from_dense(rng.random((B, 1, -(-mq // 16), -(-mk // 16))) < 0.6, 16, mq, mk)
    fwd["block_mask"] = ref["block_mask"] = bm
    return fwd, {"score_mod_grad": rel_bias_grad}, ref


def _one_sequence(b, nq, nk, ref):
    """The reference keywords of sequence ``b`` alone, as a batch of one: the user's
    functions called with ``b`` for batch 0, the block mask cut to its lengths."""

    def score_at_b(fn):  # fn(score, b, h, q_idx, kv_idx, *mod_args)
        return lambda score, _, *rest: fn(score, b, *rest)

    bm = ref["block_mask"]
    mask_mod = None if bm.mask_mod is None else (lambda _, *rest: bm.mask_mod(b, *rest))
    kinds = bm.kinds[min(b, bm.kinds.shape[0] - 1)][None, :, : -(-nq // bm.block_size), : -(-nk // bm.block_size)]
    out = dict(ref, block_mask=BlockMask(kinds, bm.block_size, nq, nk, mask_mod, bm.mod_args))
    out.update({x: score_at_b(ref[x]) for x in ("score_mod", "score_mod_grad") if x in ref})
    return out


VARLEN_SIM = [("fp32-blocked", "document"), ("fp32-rowgroup", "sparse"), ("fp16", "document")]
VARLEN_GPU = [(f, c) for f in FAMILIES for c in ("document", "sparse") if (f, c) not in VARLEN_SIM]


def check_flex_varlen(rng, fam, name, lens_q, lens_k, H=2, H_kv=1, **kw):
    dtype, tf32, (q, k, v, dout), cu_q, cu_k, mq, mk = _varlen_case(rng, fam, lens_q, lens_k, H=H, H_kv=H_kv)
    xp = _xp()
    fwd, bwd, ref = _varlen_mods(rng, name, lens_q, lens_k, H, xp)
    dev = [xp.asarray(x) for x in (q, k, v, dout, cu_q, cu_k)]
    out, lse = numba_flash.flash_attention_varlen(*dev[:3], *dev[4:], mq, mk, return_lse=True, allow_tf32=tf32,
                                                  **kw, **fwd)  # fmt: skip
    ref_out, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, **kw, **ref)
    fwd_base, bwd_base, low = _baselines(fam, dtype)
    seqs = range(len(lens_q))
    one = [_one_sequence(b, lens_q[b], lens_k[b], {**ref, **bwd}) for b in seqs]
    tol = FWD_TOL
    if fwd_base is not None:  # the same-precision standard attention, sequence by sequence
        base = np.concatenate([fwd_base(*_seq(cu_q, cu_k, b, q, k, v), **low, **kw,
                                        **{x: y for x, y in one[b].items() if x != "score_mod_grad"})[0][0]
                               for b in seqs])  # fmt: skip
        tol = 2 * reference.rel_error(base, ref_out) + FLOOR
    err = reference.rel_error(host(out), ref_out)
    assert err <= tol, f"{fam} {name}: O rel error {err:.3g} > {tol:.3g}, seed {rng.seed_value}"
    assert np.array_equal(np.isneginf(host(lse)), np.isneginf(ref_lse)), f"lse -inf rows, seed {rng.seed_value}"
    lse_err = seen_lse_error(host(lse), ref_lse)
    assert lse_err <= (FWD_TOL if fam != "tf32" else 1e-3), f"{fam} {name}: LSE {lse_err:.3g}, seed {rng.seed_value}"
    o_in, lse_in = ref_out.astype(dtype), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_varlen_backward(dev[3], *dev[:3], xp.asarray(o_in), xp.asarray(lse_in),
                                                        *dev[4:], mq, mk, allow_tf32=tf32, **kw, **fwd, **bwd)  # fmt: skip
    refs = reference.attention_varlen_backward(dout, q, k, v, o_in, lse_in, cu_q, cu_k, mq, mk, **kw, **ref, **bwd)
    tols = [BWD_TOL] * 3
    if bwd_base is not None:
        parts = [bwd_base(*_seq(cu_q, cu_k, b, dout, q, k, v, o_in, lse_in), **low, **kw, **one[b]) for b in seqs]
        tols = [3 * e + FLOOR for e in grad_errors([np.concatenate([p[i][0] for p in parts]) for i in range(3)], refs)]
    for g, e, t in zip(("dq", "dk", "dv"), grad_errors(grads, refs), tols):
        assert e <= t, f"{fam} {name}: {g} rel error {e:.3g} > {t:.3g}, seed {rng.seed_value}"


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", VARLEN_SIM, ids=[f"{f}-{c}" for f, c in VARLEN_SIM])
def test_flex_varlen(rng, fam, name):
    """score_mod + a per-sequence block mask over packed sequences (empty, length-1 and
    longer ones, Nq ≠ Nk, GQA, causal): each sequence is its own attention, as the
    reference's."""
    check_flex_varlen(rng, fam, name, [21, 0, 1, 40], [33, 5, 1, 17], causal=True)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="the rest of the family x case matrix and real sizes: GPU only")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam,name", VARLEN_GPU + VARLEN_SIM, ids=[f"{f}-{c}" for f, c in VARLEN_GPU + VARLEN_SIM])
def test_flex_varlen_gpu(rng, fam, name):
    check_flex_varlen(rng, fam, name, [700, 0, 1, 333, 1000], [517, 9, 1, 1000, 64], H=4, H_kv=2, causal=True,
                      window_size=(300, -1))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("fam", ["fp32-blocked", "tf32", "fp16", "bf16"])
def test_flex_16k(rng, fam):
    """N = 16384 on every dtype path: 8 packed documents (create_block_mask, 128-blocks)
    with a relative-bias score_mod and causal, forward and backward, against the float64
    reference (which evaluates the same functions on whole NumPy arrays)."""
    check_variant(rng, fam, {"H": 1, "causal": True}, 1, 16384, 16384,
                  mods=lambda rng, B, H, Nq, Nk, xp: case(rng, "document", B, H, Nq, Nk, xp))  # fmt: skip


def test_flex_deterministic(rng):
    """The backward with a block mask and GQA is bitwise the same run to run."""
    q, k, v, dout = _inputs(rng, np.float32, 1, 4, 2, 20, 33, 24)
    xp = _xp()
    q, k, v, dout = (xp.asarray(x) for x in (q, k, v, dout))
    bm = BlockMask.from_dense(rng.random((2, 3)) < 0.7, 16, 20, 33)
    out, lse = numba_flash.flash_attention(q, k, v, block_mask=bm, return_lse=True)
    first = [host(g) for g in numba_flash.flash_attention_backward(dout, q, k, v, out, lse, block_mask=bm)]
    again = [host(g) for g in numba_flash.flash_attention_backward(dout, q, k, v, out, lse, block_mask=bm)]
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again))


def test_visit_lists_clip_to_the_builtin_masks():
    """The lists hold the block mask's non-EMPTY tiles inside the causal range, in
    increasing order, with the PARTIAL flag in bit 0."""
    from numba_flash.flex import visit_lists

    bm = BlockMask.from_dense(np.ones((4, 4), bool), 32, 128, 128)
    count, visit = visit_lists(bm, 64, 32, False, 128, 128, window=(-1, 0))
    assert count.tolist() == [[[2, 4]]]
    assert (visit[0, 0, 1, :4] >> 1).tolist() == [0, 1, 2, 3] and not np.any(visit[0, 0, 1, :4] & 1)
    count_t, visit_t = visit_lists(bm, 64, 32, True, 128, 128, window=(-1, 0))
    assert count_t.tolist() == [[[2, 2, 1, 1]]]  # key tile n is seen by query tiles from n·32 // 64
    assert (visit_t[0, 0, 2, :1] >> 1).tolist() == [1]
    half = BlockMask.from_dense(np.array([[True, False], [True, True]]), 32, 64, 64)
    c, vis = visit_lists(half, 64, 64, False, 64, 64)
    assert c.tolist() == [[[1]]] and vis[0, 0, 0, 0] == 1  # tile 0, PARTIAL: one of its blocks is EMPTY


# --- errors ---------------------------------------------------------------------------------


def _small(xp, dtype=np.float32):
    rng = np.random.default_rng(0)
    return [xp.asarray(rng.standard_normal((1, 8, 2, 16)).astype(dtype)) for _ in range(3)]


def test_bad_functions_are_named():
    xp = _xp()
    q, k, v = _small(xp)

    def wrong_arity(score, b, h):
        return score

    with pytest.raises(TypeError, match="score_mod 'wrong_arity'.*takes 3 arguments, expected 5"):
        numba_flash.flash_attention(q, k, v, score_mod=wrong_arity)

    def returns_tuple(score, b, h, q_idx, kv_idx):
        return (score, score)

    with pytest.raises(TypeError, match="score_mod 'returns_tuple'"):
        numba_flash.flash_attention(q, k, v, score_mod=returns_tuple)

    def undefined_name(score, b, h, q_idx, kv_idx):
        return score + not_defined_anywhere  # noqa: F821

    with pytest.raises(TypeError, match="score_mod 'undefined_name'"):
        numba_flash.flash_attention(q, k, v, score_mod=undefined_name)

    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, score_mod=rel_bias,
                                           mod_args=(xp.zeros((2, 3), np.float32),))  # fmt: skip
    with pytest.raises(ValueError, match="score_mod_grad: the backward needs the derivative"):
        numba_flash.flash_attention_backward(q, q, k, v, out, lse, score_mod=rel_bias,
                                             mod_args=(xp.zeros((2, 3), np.float32),))  # fmt: skip


def test_bad_block_masks_and_args():
    xp = _xp()
    q, k, v = _small(xp)
    with pytest.raises(ValueError, match="block_mask: made for seqlen_q=16"):
        numba_flash.flash_attention(q, k, v, block_mask=BlockMask.from_dense(np.ones((1, 1), bool), 16))
    with pytest.raises(TypeError, match="block_mask: expected a numba_flash.BlockMask"):
        numba_flash.flash_attention(q, k, v, block_mask=np.ones((1, 1), bool))
    with pytest.raises(ValueError, match="mod_args: given"):
        numba_flash.flash_attention(q, k, v, mod_args=(1.0,))
    with pytest.raises(TypeError, match=r"mod_args\[0\]: expected an array"):
        numba_flash.flash_attention(q, k, v, score_mod=tanh_cap, mod_args=("x",))
    bm = BlockMask.from_dense(np.ones((3, 1, 1, 1), bool), 16, 8, 8)
    with pytest.raises(ValueError, match="block_mask: kinds of shape"):
        numba_flash.flash_attention(q, k, v, block_mask=bm)


def test_inputs_unchanged_and_empty_rows(rng):
    """A block mask that hides every key of some rows: those rows are 0 with lse −inf;
    the inputs and mod_args are not modified."""
    xp = _xp()
    q, k, v = (xp.asarray(x) for x in _inputs(rng, np.float32, 1, 2, 2, 32, 32, 16)[:3])
    keep = [host(x).copy() for x in (q, k, v)]
    pattern = np.array([[True, False], [False, False]])
    bm = BlockMask.from_dense(pattern, 16, 32, 32)
    out, lse = numba_flash.flash_attention(q, k, v, block_mask=bm, return_lse=True)
    assert np.all(host(out)[:, 16:] == 0) and np.all(np.isneginf(host(lse)[:, :, 16:]))
    ref, _ = reference.attention(*keep, block_mask=bm)
    assert reference.rel_error(host(out), ref) <= FWD_TOL
    assert all(np.array_equal(host(x), y) for x, y in zip((q, k, v), keep))

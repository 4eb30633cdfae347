"""The register-blocked fp32 kernels (``simt_blocked_forward`` / ``_backward``).

In the simulator the API runs them with small tiles (16 × 16, 32 threads: the
simulator's cost grows with the tile); these tests also run the tiles used on a GPU
(``config.BLOCKED_FORWARD_GPU`` / ``BLOCKED_BACKWARD_GPU``, 128 or 256 threads, 16-lane
row groups) through the tuning override ``NUMBA_FLASH_TILES``, on shapes that span two
key tiles and end mid-tile.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import numba_flash
from numba_flash import config, reference

from conftest import BWD_TOL, FWD_TOL, grad_errors, host, launch_names, make_qkv

pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def test_float32_at_64_and_128_runs_the_blocked_kernels():
    for d in (64, 128):
        assert launch_names("forward", "float32", d, True) == ["simt_blocked_forward"]
        names = launch_names("backward", "float32", d, False)
        assert names == ["simt_blocked_preprocess", "simt_blocked_dkdv", "simt_blocked_dq"]
    # other head dims, unaligned rows, fp16 before sm_80 and pre-sm_80 targets keep the row-group kernels
    assert launch_names("forward", "float32", 32) == ["simt_forward"]
    assert launch_names("forward", "float32", 64, aligned=False) == ["simt_forward"]
    assert launch_names("forward", "float16", 64, aligned=False, arch=(7, 5)) == ["simt_forward"]
    assert launch_names("forward", "float32", 64, arch=(7, 5)) == ["simt_forward"]


@pytest.mark.parametrize("d,Nq,Nk,causal,layout", [(64, 17, 40, True, "bshd"), (128, 9, 70, False, "bhsd")])
def test_forward_with_the_gpu_tiles(monkeypatch, rng, d, Nq, Nk, causal, layout):
    monkeypatch.setenv("NUMBA_FLASH_TILES", json.dumps({"blocked_forward": {str(d): config.BLOCKED_FORWARD_GPU[d]}}))
    assert config.choose("blocked_forward", d, simulator=True) == config.BlockedTiles(d, *config.BLOCKED_FORWARD_GPU[d])
    q, k, v = make_qkv(rng, 1, 2, Nq, Nk, d, layout)
    out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout)
    assert reference.rel_error(host(out), ref_out) <= FWD_TOL, rng.seed_value
    assert reference.rel_error(host(lse), ref_lse) <= FWD_TOL, rng.seed_value


@pytest.mark.parametrize("d,Nq,Nk,causal,layout", [(64, 20, 40, True, "bshd"), (128, 9, 33, False, "bhsd")])
def test_backward_with_the_gpu_tiles(monkeypatch, rng, d, Nq, Nk, causal, layout):
    kv, q_tiles = config.BLOCKED_BACKWARD_GPU[d]
    monkeypatch.setenv("NUMBA_FLASH_TILES", json.dumps({"blocked_backward": {str(d): [kv, q_tiles]}}))
    q, k, v = make_qkv(rng, 1, 1, Nq, Nk, d, layout)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout)
    out, lse = ref_out.astype(np.float32), ref_lse.astype(np.float32)
    grads = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, layout=layout)
    ref = reference.attention_backward(dout, q, k, v, out, lse, causal=causal, layout=layout)
    assert max(grad_errors(grads, ref)) <= BWD_TOL, rng.seed_value


def test_one_visible_key_gives_exactly_zero_dq_and_dk(rng):
    """With one key, P = 1 and dS = dP − delta is 0 in exact arithmetic; the blocked
    preprocess sums delta in dP's order, so dQ and dK come out exactly 0."""
    q, k, v = make_qkv(rng, 1, 2, 5, 1, 64, "bshd")
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = numba_flash.flash_attention(q, k, v, return_lse=True)
    dq, dk, dv = (host(g) for g in numba_flash.flash_attention_backward(dout, q, k, v, out, lse))
    assert np.all(dq == 0) and np.all(dk == 0)
    np.testing.assert_allclose(dv[:, 0], dout.sum(axis=1), rtol=1e-5, atol=1e-5)

"""``numba_flash.bench.decode`` (``bench --decode``, ``memory --decode``): the cases,
the bytes a step reads, the split count it takes and the workspace it allocates.

In the simulator: the workspace model against every array the call allocates
(``_arrays.empty`` recorded) and the split count against the call's own plan; on a GPU
(``-m gpu``), the measured workspace of real decode shapes against the model, flat in
the cache length.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host

import numba_flash
from numba_flash import _arrays
from numba_flash._numba_cuda import SIMULATOR
from numba_flash.bench import decode as D


def test_cases_and_bytes():
    cases = D.decode_cases([4096, 32768], page_sizes=(0, 256))
    assert [(c.cache_len, c.layout) for c in cases] == [(4096, "contiguous"), (4096, "paged 256"),
                                                        (32768, "contiguous"), (32768, "paged 256")]  # fmt: skip
    assert cases[0].kv_bytes == 2 * 8 * 8 * 4096 * 128 * 2  # K and V, B = 8, 8 KV heads, d = 128, fp16
    assert D.DecodeCase(100, dtype="float32", batch=1, heads=2, heads_k=2, head_dim=8).kv_bytes == 2 * 2 * 100 * 8 * 4
    for bad, match in ((dict(heads=6, heads_k=4), "heads=6"), (dict(page_size=300), "page_size=300"),
                       (dict(dtype="int8"), "dtype"), (dict(batch=0), "batch=0")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            D.DecodeCase(4096, **bad)


def test_splits_and_workspace_do_not_grow_with_the_cache():
    """B = 8, 32/8 heads: the same split count at 4K, 32K and 128K keys (the blocks,
    not the key tiles, bound it), so the same workspace; a paged cache adds its block
    table's copy (4 bytes a page)."""
    got = {L: D.splits_of(D.DecodeCase(L)) for L in (4096, 32768, 131072)}
    assert len(set(got.values())) == 1 and got[4096] > 1, got
    s = got[4096]
    w = [D.workspace_model(D.DecodeCase(L), s)["total"] for L in (4096, 32768, 131072)]
    assert w[0] == w[1] == w[2]
    paged = D.workspace_model(D.DecodeCase(131072, page_size=256), s)["total"]
    assert paged - w[2] == 4 * 8 * (131072 // 256 - 1)
    # the fp32 partials: splits · B · H · (d + 1) floats, and the merged lse; none in a cluster
    assert D.workspace_model(D.DecodeCase(4096), s)["partial_out"] == s * 8 * 32 * 128 * 4
    in_cluster = D.workspace_model(D.DecodeCase(4096), s, s)
    assert in_cluster["partial_out"] == in_cluster["partial_lse"] == 0 and in_cluster["lse"] == 8 * 32 * 4


@pytest.mark.parametrize("Nq,H,H_kv,num_splits", [(1, 4, 2, 3), (1, 4, 2, 1), (2, 2, 2, 2), (2, 2, 2, 1)])
def test_workspace_model_is_what_the_call_allocates(rng, monkeypatch, Nq, H, H_kv, num_splits):
    """Every array ``flash_attention_with_kvcache`` allocates through ``_arrays.empty``
    (partials, merged lse, output) is what the model counts plus the output; the split
    count is the model's."""
    if not SIMULATOR:
        pytest.skip("records the simulator's allocations (host arrays); the GPU test measures the pool")
    seen = []
    real = _arrays.empty

    def record(kind, shape, dtype):
        arr = real(kind, shape, dtype)
        seen.append(arr.nbytes)
        return arr

    monkeypatch.setattr(_arrays, "empty", record)
    case = D.DecodeCase(100, batch=2, heads=H, heads_k=H_kv, head_dim=16, num_splits=num_splits, seqlen_q=Nq)
    q = rng.standard_normal((2, Nq, H, 16)).astype(np.float16)
    kc, vc = (rng.standard_normal((2, 100, H_kv, 16)).astype(np.float16) for _ in range(2))
    out = numba_flash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=100, num_splits=num_splits)
    assert np.isfinite(host(out)).all()
    splits, cluster = D.plan_of(case)
    assert splits == num_splits and cluster == (1 if (Nq, num_splits) == (1, 1) else 0)  # the simulator's clusters
    model = D.workspace_model(case, splits, cluster)
    assert sum(seen) - out.nbytes == model["total"] - model["ints"], (seen, model)


@pytest.mark.gpu
def test_measured_workspace_is_the_model_and_flat_in_the_cache():
    """H200-sized decode (B = 8, 32/8 heads, d = 128): the pool's high-water mark beyond
    the output is the model's workspace (within CuPy's 512-byte rounding per array, less
    the small ints the warm-up call uploaded and the measured call reuses, and, where the
    merge kernel runs, plus the swapped q's copy) at 4K and 32K keys alike."""
    if SIMULATOR:
        pytest.skip("real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
    rows = D.decode_memory([D.DecodeCase(4096), D.DecodeCase(32768), D.DecodeCase(32768, page_size=256)])
    assert all(r["status"] == "ok" for r in rows), rows
    q_copy = 8 * 32 * 128 * 2
    for r in rows:
        least = r["predicted_workspace_bytes"] - r["predicted_parts"]["ints"]
        assert least <= r["workspace_bytes"] <= r["predicted_workspace_bytes"] + q_copy + 8 * 512
    assert rows[0]["workspace_bytes"] == rows[1]["workspace_bytes"]


def test_progress_is_called_as_the_cli_calls_it():
    """``progress(done, total, description)``, the CLI's ``_progress`` protocol, once a
    case (session 10's first GPU run of ``bench --decode`` failed on ``progress(1)``).
    Tiny cases: in the simulator they run, or fail into their row, either way reported."""
    seen = []
    cases = [D.DecodeCase(16, batch=1, heads=2, heads_k=1, head_dim=8, dtype="float32"),
             D.DecodeCase(32, batch=1, heads=2, heads_k=1, head_dim=8, dtype="float32", page_size=16)]
    rows = D.decode_memory(cases, progress=lambda done, total, desc: seen.append((done, total, desc)))
    assert len(rows) == 2
    assert [(d, t) for d, t, _ in seen] == [(1, 2), (2, 2)]
    assert seen[0][2] == "workspace 16 keys contiguous" and seen[1][2] == "workspace 32 keys paged 16"

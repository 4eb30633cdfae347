"""The launch plan (``numba_flash.plan``): which kernels run, with which tiles, grid,
threads, shared memory and arguments.  Pure Python: nothing is compiled or launched."""

from __future__ import annotations

import dataclasses
import json

import pytest

from numba_flash import config, plan
from numba_flash.kernels import spec

P = plan.Problem


def _plan(*args, **kw):
    return plan.plan(P(*args, **kw))


@pytest.mark.parametrize(
    "problem, family, names",
    [
        (P("forward", "float16", 64), "tensor-core", ["tc_forward"]),
        (P("backward", "bfloat16", 128), "tensor-core", ["tc_bwd_preprocess", "tc_bwd_dkdv", "tc_bwd_dq"]),
        (P("forward", "float32", 128, allow_tf32=True), "tensor-core-tf32", ["tf32_forward"]),
        (P("backward", "float32", 64, allow_tf32=True), "tensor-core-tf32",
         ["simt_blocked_preprocess", "tf32_bwd_dkdv", "tf32_bwd_dq"]),
        (P("forward", "float32", 64), "simt-fp32", ["simt_blocked_forward"]),
        (P("backward", "float32", 128), "simt-fp32", ["simt_blocked_preprocess", "simt_blocked_dkdv", "simt_blocked_dq"]),
        (P("forward", "float32", 96), "simt-fp32", ["simt_forward"]),
        (P("backward", "float16", 44), "tensor-core", ["tc_bwd_preprocess", "tc_bwd_dkdv", "tc_bwd_dq"]),
        (P("backward", "float16", 44, arch=(7, 5)), "simt-fp32", ["simt_bwd_preprocess", "simt_bwd_dkdv", "simt_bwd_dq"]),
        (P("backward", "float16", 40), "tensor-core", ["tc_bwd_preprocess", "tc_bwd_dkdv", "tc_bwd_dq"]),
        (P("backward", "bfloat16", 256), "tensor-core", ["tc_bwd_preprocess", "tc_bwd_dv", "tc_bwd_dk", "tc_bwd_dq"]),
        (P("forward", "float32", 96, allow_tf32=True), "simt-fp32", ["simt_forward"]),
        (P("forward", "float16", 64, aligned=False), "tensor-core", ["tc_forward"]),  # plain loads, not cp.async
        (P("forward", "bfloat16", 59, aligned=False), "tensor-core", ["tc_forward"]),
        (P("forward", "bfloat16", 64, aligned=False, arch=(7, 5)), "simt-fp32", ["simt_forward"]),  # fp32 copies
        (P("forward", "float16", 128, arch=(7, 5)), "simt-fp32", ["simt_forward"]),
        (P("forward", "float32", 64, allow_tf32=True, arch=(7, 5)), "simt-fp32", ["simt_forward"]),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_the_rule(problem, family, names):
    p = plan.plan(problem)
    assert p.family == family
    assert [k.name for k in p.launches] == names
    assert bool(p.note) == (family == "simt-fp32" and (problem.dtype != "float32" or problem.allow_tf32))


def test_work_dtype_and_notes():
    assert _plan("forward", "bfloat16", 59, arch=(7, 5)).work_dtype == "float32"  # bf16 runs on fp32 copies
    assert _plan("forward", "float16", 59, arch=(7, 5)).work_dtype == "float16"  # fp16 read as is
    assert _plan("forward", "bfloat16", 64).work_dtype == "bfloat16"  # tensor cores
    assert _plan("forward", "bfloat16", 59).work_dtype == "bfloat16"
    note = _plan("forward", "float16", 64, arch=(7, 5)).note
    assert "sm_75" in note and "sm_80" in note
    assert not _plan("backward", "float16", 59, aligned=False).note
    assert "head dim 96 is not one of" in _plan("backward", "float32", 96, allow_tf32=True).note
    assert "16-byte aligned" in _plan("forward", "float32", 64, allow_tf32=True, aligned=False).note


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk", [(2, 3, 1, 1), (1, 5, 1000, 77), (3, 1, 64, 4096)])
def test_grids_cover_every_row(B, H, Nq, Nk, causal):
    """x tiles the rows a block owns (queries, or keys for dK/dV), y heads, z batch;
    with causal (row tiles of different work: heaviest first, block_info.block_coords)
    the tiles are z, the heads x and the batch y."""
    for problem in (P("forward", "float16", 64), P("backward", "float16", 128), P("backward", "float32", 64),
                    P("forward", "float32", 40), P("backward", "float32", 128, allow_tf32=True),
                    P("backward", "float16", 200)):  # fmt: skip
        problem = dataclasses.replace(problem, causal=causal)
        for k in plan.plan(plan.with_sizes(problem, B, H, Nq, Nk)).launches:
            x, y, z = k.grid
            if causal and not k.name.endswith("preprocess"):
                x, y, z = z, x, y
            assert (y, z) == (H, B), k.name
            rows = Nk if k.name.endswith(("dkdv", "_dk", "_dv")) else Nq
            assert x >= 1 and (x - 1) * 1 < rows, k.name  # no block entirely past the end
            assert k.threads % 32 == 0 and 32 <= k.threads <= 1024, k.name


def test_heaviest_first_grids_are_within_cuda_limits():
    """Row tiles on grid z (at most 65535): a longer sequence gets a clear error."""
    ok = plan.plan(plan.with_sizes(P("forward", "float16", 64, causal=True), 1, 2, 65535 * 128, 64))
    assert ok.launches[0].grid[2] == 65535
    with pytest.raises(ValueError, match="seqlen_q: 65536 tiles of 128 rows.*at most 65535"):
        plan.plan(plan.with_sizes(P("forward", "float16", 64, causal=True), 1, 2, 65536 * 128, 64))


def test_every_kernel_states_its_shared_memory_and_arguments():
    """Dynamic shared memory comes from the plan for every kernel that uses it (never
    n/a), within Hopper's 227 KiB opt-in; arguments are roles the API can bind."""
    problems = [P(ps, dt, d, causal, allow_tf32=tf) for ps in plan.PASSES for causal in (False, True)
                for dt, d, tf in (("float16", 64, False), ("bfloat16", 128, False), ("float32", 64, True),
                                  ("float32", 128, False), ("float32", 64, False), ("float32", 32, False))]  # fmt: skip
    seen = set()
    for problem in problems:
        for k in plan.plan(problem).launches:
            seen.add(k.name)
            assert 0 <= k.smem <= 227 * 1024, (k.name, k.smem)
            assert all(isinstance(a, spec.Arg) for a in k.args)
            if not k.name.endswith("preprocess"):  # the scale, then the variants' arguments
                assert k.args[-6].role == "scale" and k.args[-5:] == spec.VARIANT_ARGS, k.name
    blocked = {"simt_blocked_forward", "simt_blocked_dkdv", "simt_blocked_dq"}
    assert blocked <= seen
    for problem in (P("forward", "float32", 128), P("backward", "float32", 64)):
        for k in plan.plan(problem).launches:
            if k.name in blocked:
                assert k.smem > 48 * 1024  # the register-blocked kernels opt in beyond 48 KiB


def test_the_tuning_override_is_the_one_environment_variable(monkeypatch):
    monkeypatch.setenv("NUMBA_FLASH_TILES", json.dumps({"tc_forward": {"64": [64, 64, 4, 1]}}))
    t = _plan("forward", "float16", 64, seqlen_q=1024).launches[0].tiles
    assert (t.block_m, t.block_n, t.warps, t.m_tiles) == (64, 64, 4, 1)
    assert _plan("forward", "float16", 128, seqlen_q=1024).launches[0].tiles == config.tc_forward_tiles(128)  # untouched
    monkeypatch.setenv("NUMBA_FLASH_TILES", "{not json")
    with pytest.raises(ValueError, match="NUMBA_FLASH_TILES"):
        _plan("forward", "float16", 64)


def test_decode_rows_run_on_one_warp_tiles():
    """At most DECODE_ROWS query rows: the forward's tiles are one warp of 16 rows
    (config.tc_decode_tiles), at every tile head dim; more rows, a backward or a block
    mask keep the usual tiles."""
    from numba_flash.variant import Mods, Variant

    for d in (32, 64, 100, 128, 256):
        t = _plan("forward", "float16", d, seqlen_q=config.DECODE_ROWS, seqlen_k=4096).launches[0].tiles
        assert (t.block_m, t.warps, t.m_tiles) == (16, 1, 1), d
        assert t.q_in_regs == (config.tc_tile_dim(d) <= 128)
        assert t.data_dim == (d if config.tc_tile_dim(d) != d else 0)
    big = _plan("forward", "float16", 128, seqlen_q=config.DECODE_ROWS + 1).launches[0].tiles
    assert big == config.tc_forward_tiles(128)
    mods = Variant(mods=Mods(None, None, None, block_sparse=True))
    assert _plan("forward", "float16", 128, seqlen_q=1, features=mods).launches[0].tiles.block_m == 128
    assert _plan("backward", "float16", 128, seqlen_q=1).launches[1].tiles == config.tc_backward_tiles(128)


def test_tiles_are_pure_functions():
    """The same inputs give the same tiles; the simulator's register-blocked tiles are
    an explicit input, not a global."""
    assert config.blocked_forward_tiles(64, simulator=True) == config.BlockedTiles(64, *config.BLOCKED_SIMULATOR)
    assert config.blocked_forward_tiles(64, simulator=False) == config.BlockedTiles(64, *config.BLOCKED_FORWARD_GPU[64])
    assert _plan("forward", "float32", 64, simulator=True).launches[0].tiles.rows == config.BLOCKED_SIMULATOR[0]
    kv, q = config.simt_backward_tiles(32)
    # block_m is query rows and block_n key rows, in both backward kernels
    assert kv.block_n == kv.threads // kv.group and q.block_m == q.threads // q.group


@pytest.mark.parametrize("kwargs, match", [
    (dict(pass_="sideways", dtype="float16", head_dim=64), "pass"),
    (dict(pass_="forward", dtype="float64", head_dim=64), "dtype"),
    (dict(pass_="forward", dtype="float16", head_dim=260), "head_dim"),
])  # fmt: skip
def test_problem_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        P(**kwargs)


def test_table_for_info_comes_from_the_plan():
    rows = plan.table()
    assert {r["dtype"].split(",")[0] for r in rows} == {"float32", "float16", "bfloat16"}
    fp16 = next(r for r in rows if r["dtype"] == "float16")
    assert fp16["forward"] == "tensor-core: tc_forward"
    sm75 = plan.table(arch=(7, 5))
    assert all("tensor-core" not in r["forward"] for r in sm75)


@pytest.mark.parametrize(
    "pass_, dtype, head_dim, causal, tf32",
    [("forward", "float16", 64, True, False), ("backward", "bfloat16", 128, False, False),
     ("forward", "float32", 128, False, True), ("backward", "float32", 64, True, False),
     ("forward", "float32", 32, True, False)],  # fmt: skip
)
def test_building_blocks_are_inlined(pass_, dtype, head_dim, causal, tf32):
    """Every kernel of a plan compiles (no GPU needed) with its building blocks inlined:
    no call, no local memory (register arrays stay in registers), no spills where an
    assembler reports them."""
    from numba_flash.inspection import inspect_kernels

    for r in inspect_kernels(pass_, dtype, head_dim, causal, arch="sm_90", tf32=tf32):
        body = [line.split("//")[0] for line in r.ptx.splitlines()]
        assert not any(line.strip().startswith(("call", ".func")) for line in body), r.name
        assert r.local_bytes_ptx == 0 and r.counts["ld.local"] == 0 and r.counts["st.local"] == 0, r.name
        if r.spill_stores is not None:
            assert r.spill_stores == 0 and r.spill_loads == 0, (r.name, r.spill_stores)

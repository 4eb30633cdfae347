"""L2 sections of a heaviest-first grid (``block_info.l2_section``, ``spec.l2_sections``):
the order is a bijection of the grid, the one ``traffic``'s DRAM model walks, and the
Hopper kernels compute the same numbers with the heads split into sections (a tiny L2
forces several); the other families keep one.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
from conftest import SIMULATOR
from test_variants import VARIANTS, check_variant
from test_wgmma_backward import check_backward
from test_wgmma_forward import check_forward

from numba_flash import api, traffic
from numba_flash._numba_cuda import cuda
from numba_flash.kernels import spec
from numba_flash.kernels.block_info import grid_coords
from numba_flash.variant import Variant


def test_sections_where_the_heads_streamed_at_once_outgrow_l2():
    """fp16 in a 50 MB L2 with 132 SMs.  (4, 32, 4096, 128): the 128 heads' K and V (2 MiB
    each) streamed at once are 5 L2s, so the forward runs 8 heads a section (16.7 MB), and
    so does the backward's dQ; dK/dV streams Q and dO of a KV head (2 MiB): 8 KV heads.
    At 16 heads (2.6 L2s) the forward keeps one section, the backward's grids not; with
    GQA groups of 4 the sections hold whole groups (32 query heads: 8 KV heads) and dK/dV
    streams a group's Q and dO (8 MiB: 2 KV heads).  (16, 32, 1024, 64): 132 heads of
    256 KiB at once fit, one section.  At least one group or KV head, however long."""
    l2, sms = 50 * 2**20, 132
    assert spec.l2_sections("forward", 4, 32, 1, 4096, 4096, 128, 2, l2, sms) == (8, 0)
    assert spec.l2_sections("backward", 4, 32, 1, 4096, 4096, 128, 2, l2, sms) == (8, 8)
    assert spec.l2_sections("forward", 4, 16, 1, 4096, 4096, 128, 2, l2, sms) == (0, 0)
    assert spec.l2_sections("backward", 4, 16, 1, 4096, 4096, 128, 2, l2, sms) == (8, 8)
    assert spec.l2_sections("backward", 4, 32, 4, 4096, 4096, 128, 2, l2, sms) == (32, 2)
    assert spec.l2_sections("backward", 16, 32, 1, 1024, 1024, 64, 2, l2, sms) == (0, 0)
    assert spec.l2_sections("backward", 1, 2, 2, 2**20, 2**20, 256, 4, l2, sms) == (2, 1)


def test_unshared_streams_take_sections_past_one_l2():
    """``unshared`` (the default; ``NUMBA_FLASH_L2_SECTIONS=shared`` turns it off): the
    forward takes sections over one L2 where each K/V stream is read by fewer than two
    blocks at once, at d > 64 — 16 sequences of 1024 / 1590 / 2254 rows and (8, 16, 2048)
    (≥ 128 heads at once: one block a stream) — and keeps session 32's rule elsewhere: (4, 16, 4096) (64 heads: two
    blocks a stream), GQA groups of 4 (four query heads a stream), d = 64, streams that fit
    one L2 ((16, 16, 512): 132 heads of 256 KiB, 33 MB), and the backward's grids
    (sectioned over one L2 already)."""
    l2, sms = 50 * 2**20, 132

    def fwd(B, H, g, N, d, unshared=True):
        return spec.l2_sections("forward", B, H, g, N, N, d, 2, l2, sms, unshared=unshared)

    assert fwd(16, 16, 1, 1024, 128) == (33, 0) and fwd(16, 16, 1, 1024, 128, False) == (0, 0)
    assert fwd(16, 16, 1, 1590, 128) == (21, 0) and fwd(16, 16, 1, 2254, 128) == (15, 0)
    assert fwd(8, 16, 1, 2048, 128) == (16, 0)
    assert fwd(4, 16, 1, 4096, 128) == (0, 0) and fwd(4, 32, 4, 4096, 128) == (0, 0)
    assert fwd(16, 16, 1, 1590, 64) == (0, 0) and fwd(16, 16, 1, 512, 128) == (0, 0)
    assert fwd(4, 32, 1, 4096, 128) == fwd(4, 32, 1, 4096, 128, False) == (8, 0)  # over 3 L2s either way
    for args in ((16, 16, 1, 1590, 1590, 128), (4, 16, 1, 4096, 4096, 128), (16, 32, 1, 1024, 1024, 64)):
        assert (spec.l2_sections("backward", *args, 2, l2, sms, unshared=True)
                == spec.l2_sections("backward", *args, 2, l2, sms))  # fmt: skip


def test_unshared_sections_cut_the_models_dram_reads(monkeypatch):
    """The DRAM model of the Hopper forward at 16 × 1024 rows, 16 heads, d = 128, causal
    (the uniform batch of issue #11's varlen row): in session 32's order every block
    streams its own head's K and V, 0.67 GB of reads; in the default's sections of 33 heads
    0.20 GB (an H100 read 3.007 GB where the model counts 3.00 at 16 × 2254:
    docs/benchmarks/2026-12-06-s35; the forward ran 1.36× with the sections: -s36)."""
    hopper = (9, 0, "a")
    (cut,) = traffic.dram("forward", "float16", 16, 16, 1024, 1024, 128, causal=True, arch=hopper)
    shared = functools.partial(spec.l2_sections, unshared=False)
    monkeypatch.setattr(spec, "l2_sections", shared)
    (before,) = traffic.dram("forward", "float16", 16, 16, 1024, 1024, 128, causal=True, arch=hopper)
    assert before.name == cut.name == "wgmma_forward"
    assert 0.6e9 < before.read < 0.7e9 and cut.read < 0.35 * before.read


@pytest.mark.parametrize("keys_are_rows", [False, True])
@pytest.mark.parametrize("gx,gy,gz,section", [(3, 2, 4, 2), (3, 2, 4, 4), (5, 1, 3, 1), (2, 3, 5, 0), (2, 2, 3, 9)])
def test_order_is_a_bijection_and_the_models(gx, gy, gz, section, keys_are_rows):
    """Every block of a causal grid (heads gx, batch gy, tiles gz) gets its own (tile,
    head, batch), in the order ``traffic._issue_order`` models: sections of ``section``
    (head, batch) pairs (the last of (3, 2) in fours: two), heaviest tile first in each."""
    F = Variant(causal=True).flags
    n = gx * gy * gz

    @cuda.jit
    def coords(out, fx):
        x, y, z = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        t, h, b = grid_coords(x, y, z, cuda.gridDim.x, cuda.gridDim.y, cuda.gridDim.z, section, fx,
                              keys_are_rows, F)  # fmt: skip
        at = x + cuda.gridDim.x * (y + cuda.gridDim.y * z)
        out[at, 0], out[at, 1], out[at, 2] = b, h, t

    out = np.full((n, 3), -1, np.int64)
    d_out = cuda.to_device(out)
    coords[(gx, gy, gz), 1](d_out, api._dummies(0)[2])
    got = [tuple(int(c) for c in r) for r in d_out.copy_to_host()]
    assert sorted(got) == sorted((b, h, t) for b in range(gy) for h in range(gx) for t in range(gz))
    walk = type("Launch", (), {"walk": (64, 64, keys_are_rows)})
    assert got == traffic._issue_order(walk, Variant(causal=True), gx, gy, gz, section)


def test_sections_cut_the_models_causal_dram_reads():
    """The DRAM model of the causal forward at (4, 32, 4096, 128): the Hopper kernel runs
    in sections and reads K and V about once (0.54 GB, within 2× the non-causal grid's);
    the mma.sync kernel keeps one section and its waves read them again (4.4 GB)."""
    hopper = (9, 0, "a")
    (fwd,) = traffic.dram("forward", "float16", 4, 32, 4096, 4096, 128, causal=True, arch=hopper)
    (plain,) = traffic.dram("forward", "float16", 4, 32, 4096, 4096, 128, arch=hopper)
    assert fwd.name == "wgmma_forward" and fwd.read <= 2 * plain.read
    (mma,) = traffic.dram("forward", "float16", 4, 32, 4096, 4096, 128, causal=True, arch=(9, 0))
    assert mma.name == "tc_forward" and mma.read > 5 * fwd.read


@pytest.fixture
def tiny_l2(monkeypatch):
    """An L2 of one byte: sections of one KV head's group (query rows) or one KV head (key rows)."""
    monkeypatch.setattr(api, "l2_cache", lambda: (1, 132))


@pytest.mark.usefixtures("poisoned_outputs", "tiny_l2")
@pytest.mark.skipif(not SIMULATOR, reason="a simulator case; the GPU runs the sectioned Hopper tests at sizes")
def test_sectioned_hopper_forward(rng, monkeypatch):
    """The Hopper forward's twin with sections of one group (2 query heads; 4 sections),
    GQA and causal, two query tiles a head: its persistent virtual grid goes through them
    (a section order that dropped a tile leaves NaN: ``poisoned_outputs``)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    check_forward(rng, "float16", 64, True, B=2, H=4, H_kv=2, Nq=150, Nk=140)


@pytest.mark.usefixtures("poisoned_outputs", "tiny_l2")
@pytest.mark.skipif(not SIMULATOR, reason="a simulator case; the GPU runs the sectioned Hopper tests at sizes")
def test_sectioned_hopper_backward(rng, monkeypatch):
    """The Hopper backward's twins with sections (dQ: 2 query heads, dK/dV: 1 KV head; 4
    each), two key tiles a head (the persistent dK/dV kernel keeps one section:
    ``wgmma_backward``'s ``SECTIONED``)."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    check_backward(rng, "bfloat16", 64, True, B=2, H=4, H_kv=2, Nq=140, Nk=150)


@pytest.mark.usefixtures("poisoned_outputs", "tiny_l2")
def test_other_families_keep_one_section(rng):
    """The mma.sync and fp32 kernels keep the plain heaviest-first order (``block_coords``:
    the computed coordinates cost them a register): correct with the sections passed."""
    check_variant(rng, "fp32-blocked", dict(VARIANTS["all"], H=4, H_kv=2), B=2, Nq=40, Nk=50)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="sections of a size the GPU's L2 makes: needs a CUDA device")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sectioned_hopper_kernels_at_size(rng, dtype, monkeypatch):
    """(2, 8 / 2 KV heads, 1000, 64) causal with a 256 KiB L2: sections of 4 query heads
    (forward, dQ: a KV head's group) and 1 KV head (dK/dV), several of them and many
    blocks each."""
    monkeypatch.setenv("NUMBA_FLASH_WGMMA", "1")
    monkeypatch.setattr(api, "l2_cache", lambda: (2**18, 132))
    check_forward(rng, dtype, 64, True, B=2, H=8, H_kv=2, Nq=1000, Nk=1000)
    check_backward(rng, dtype, 64, True, B=2, H=8, H_kv=2, Nq=1000, Nk=1000)


def test_a_bad_sections_switch_is_named(monkeypatch):
    """``NUMBA_FLASH_L2_SECTIONS`` takes on, off, queries, keys or shared; another value
    is a ValueError naming the variable, before any launch."""
    import numba_flash

    monkeypatch.setenv("NUMBA_FLASH_L2_SECTIONS", "sideways")
    q = np.ones((1, 3, 1, 8), np.float32)
    with pytest.raises(ValueError, match="NUMBA_FLASH_L2_SECTIONS='sideways': expected on, off, queries, keys or "
                                         "shared"):  # fmt: skip
        numba_flash.flash_attention(q, q, q, causal=True)


@pytest.mark.parametrize("which,expected", [("on", 33), ("shared", 0)])
def test_the_unshared_switch_reaches_the_params(which, expected, monkeypatch):
    """The default (``on``) puts the forward's section into the call's ``params`` (16 × 1024
    rows, 16 heads, d = 128, causal, on an H100's L2: 33 heads a section);
    ``NUMBA_FLASH_L2_SECTIONS=shared`` (session 32's rule) leaves one section there.  No
    launch: the variants' step alone."""
    monkeypatch.setenv("NUMBA_FLASH_L2_SECTIONS", which)
    monkeypatch.setattr(api, "l2_cache", lambda: (50 * 2**20, 132))
    # what ``_Variants`` reads of an operand: its view's shape and its dtype
    q_op = types.SimpleNamespace(view=types.SimpleNamespace(shape=(16, 1024, 16, 128)), dtype=np.dtype(np.float16))
    var = api._Variants(q_op, q_op, 16, 16, True, (-1, -1), 0.0, None, 0.0, None, 1024, seqlen_q=1024)
    assert var.sections == (expected, 0)

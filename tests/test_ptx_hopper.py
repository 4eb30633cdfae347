"""Hopper intrinsics of ``numba_flash.ptx`` (issue #13): wgmma, mbarrier, bulk copies,
fences, setmaxnreg, thread-block clusters.

Without a GPU: a kernel using every one compiles for sm_90a (a subprocess with the
simulator off, as tests/test_ptx_compile.py does) to the intended instructions, with
nothing in local memory, and nvJitLink (when present) assembles it.  Under the
simulator the same wgmma and bulk-copy kernels run on the twins (``_ptx_sim``), and
the TMA copies, which have none, raise saying why.  On a GPU (``-m gpu``): wgmma
m64n64k16 (fp16, bf16) against NumPy, a bulk copy completing on an mbarrier, and a
TMA box with zero fill.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import device, host

from numba_flash._numba_cuda import SIMULATOR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_KERNELS = '''
import numba
from numba import cuda, float32, uint32, uint64
from numba_flash import ptx

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal (128; None in the simulator)
_SW_ALIGN = 1024 if _ALIGN else None  # a 128-byte swizzle's repeat (the simulator aligns arrays to it)


@cuda.jit(device=True)
def store_d(D, acc, tid):
    # the m64n64 accumulator of thread tid into D (64 x 64), in wgmma's layout
    store_d_cols(D, acc, tid, 0)


@cuda.jit(device=True)
def store_d_cols(D, acc, tid, j0):
    # columns 64·j0/8 .. +64 of an m64nN accumulator into D; the trip count is a literal
    # (8), so the loop unrolls and acc stays in registers
    w, lane = tid // 32, tid % 32
    g, t = lane >> 2, lane & 3
    for jj in range(8):
        j = j0 + jj
        D[16 * w + g, 8 * j + 2 * t] = acc[4 * j]
        D[16 * w + g, 8 * j + 2 * t + 1] = acc[4 * j + 1]
        D[16 * w + g + 8, 8 * j + 2 * t] = acc[4 * j + 2]
        D[16 * w + g + 8, 8 * j + 2 * t + 1] = acc[4 * j + 3]


@cuda.jit(device=True)
def one_arrival_barrier(bar, tid):
    # an mbarrier expecting one arrival, initialised by thread 0 and visible to all
    b = ptx.smem_addr(bar, 0)
    if tid == 0:
        ptx.mbarrier_init(b, 1)
    ptx.fence_proxy_async()
    cuda.syncthreads()
    return b


@cuda.jit(device=True)
def wait_phase0(b):
    while ptx.mbarrier_try_wait_parity(b, 0) == 0:
        pass


def wgmma(a_words, b_words, D, flag):
    sa = cuda.shared.array(512, uint32, alignment=_ALIGN)  # 64 x 16 halves
    sb = cuda.shared.array(512, uint32, alignment=_ALIGN)  # 64 x 16 halves (B^T, K-major)
    tid = cuda.threadIdx.x
    for i in range(tid, 512, 128):
        sa[i] = a_words[i]
        sb[i] = b_words[i]
    ptx.fence_proxy_async()
    cuda.syncthreads()
    acc = cuda.local.array(32, float32)
    for j in range(32):
        acc[j] = 0
    da = ptx.wgmma_desc(ptx.smem_addr(sa, 0), 128, 256, ptx.SWIZZLE_NONE)
    db = ptx.wgmma_desc(ptx.smem_addr(sb, 0), 128, 256, ptx.SWIZZLE_NONE)
    ptx.wgmma_fence()
    if flag[0] == 0:
        ptx.wgmma_m64n64k16_f16_acc(acc, 0, da, db, 0)
    else:
        ptx.wgmma_m64n64k16_bf16_acc(acc, 0, da, db, 0)
    ptx.wgmma_commit_group()
    ptx.wgmma_wait_group(0)
    store_d(D, acc, tid)


def wgmma_rs(a16, b_words, D, flag):
    # A (64 x 16 halves) from registers, each warp its 16 rows as mma.sync's A fragment
    sb = cuda.shared.array(512, uint32, alignment=_ALIGN)  # 64 x 16 halves (B^T, K-major)
    tid = cuda.threadIdx.x
    for i in range(tid, 512, 128):
        sb[i] = b_words[i]
    ptx.fence_proxy_async()
    cuda.syncthreads()
    w, lane = tid // 32, tid % 32
    g, t = lane >> 2, lane & 3
    a = cuda.local.array(4, uint32)
    for r in range(4):
        row = 16 * w + g + 8 * (r & 1)
        col = 2 * t + 8 * (r >> 1)
        a[r] = uint32(a16[row, col]) | (uint32(a16[row, col + 1]) << uint32(16))
    acc = cuda.local.array(32, float32)
    for j in range(32):
        acc[j] = 0
    db = ptx.wgmma_desc(ptx.smem_addr(sb, 0), 128, 256, ptx.SWIZZLE_NONE)
    ptx.wgmma_fence()
    if flag[0] == 0:
        ptx.wgmma_m64n64k16_f16_rs_acc(acc, 0, a, 0, db, 0)
    else:
        ptx.wgmma_m64n64k16_bf16_rs_acc(acc, 0, a, 0, db, 0)
    ptx.wgmma_commit_group()
    ptx.wgmma_wait_group(0)
    store_d(D, acc, tid)


def bulk(src, out, nbytes):
    tile = cuda.shared.array(1024, uint32, alignment=_ALIGN)
    bar = cuda.shared.array(1, uint64, alignment=_ALIGN)
    tid = cuda.threadIdx.x
    b = one_arrival_barrier(bar, tid)
    if tid == 0:
        ptx.mbarrier_arrive_expect_tx(b, nbytes)
        ptx.cp_async_bulk_g2s(ptx.smem_addr(tile, 0), src, 0, nbytes, b)
    wait_phase0(b)
    for i in range(tid, nbytes // 4, cuda.blockDim.x):
        out[i] = tile[i]


def tma2d(tmap, out, row0, col0):
    tile = cuda.shared.array(4096, uint32, alignment=_ALIGN)  # 64 x 64 halves
    bar = cuda.shared.array(1, uint64, alignment=_ALIGN)
    tid = cuda.threadIdx.x
    b = one_arrival_barrier(bar, tid)
    if tid == 0:
        ptx.mbarrier_arrive_expect_tx(b, 64 * 64 * 2)
        ptx.cp_async_bulk_tensor_2d_g2s(ptx.smem_addr(tile, 0), tmap, col0, row0, b)
    wait_phase0(b)
    for i in range(tid, 2048, cuda.blockDim.x):
        out[i] = tile[i]


def tma3d(tmap, out):
    tile = cuda.shared.array(1024, uint32, alignment=_ALIGN)
    bar = cuda.shared.array(1, uint64, alignment=_ALIGN)
    b = ptx.smem_addr(bar, 0)
    if cuda.threadIdx.x == 0:
        ptx.mbarrier_init(b, 1)
        ptx.mbarrier_arrive_expect_tx(b, 4096)
        ptx.cp_async_bulk_tensor_3d_g2s(ptx.smem_addr(tile, 0), tmap, 0, 0, 1, b)
    while ptx.mbarrier_try_wait_parity(b, 0) == 0:
        pass
    out[cuda.threadIdx.x] = tile[cuda.threadIdx.x]


def wgmma_sw128(tma_a, tma_b, tma_v, a16, D1, D2, flag):
    # A, B (64 x 128, K-major) and V (32 x 128, MN-major) by TMA in two 64-column atoms
    # each, 128-byte swizzle; D1 = A·Bᵀ (8 k-slices across both atoms), D2 = A[:, :32]·V
    # (A from registers, n = 128: both of V's atoms, LBO = 4 KiB apart). 40 KiB in all,
    # under the 48 KiB of static shared memory.
    sa = cuda.shared.array(10240, uint32, alignment=_SW_ALIGN)
    bar = cuda.shared.array(1, uint64, alignment=_ALIGN)
    tid = cuda.threadIdx.x
    b = one_arrival_barrier(bar, tid)
    base = ptx.smem_addr(sa, 0)  # A at 0, B at 16 KiB (atoms 8 KiB apart), V at 32 KiB (4 KiB apart)
    if tid == 0:
        ptx.mbarrier_arrive_expect_tx(b, 2 * 16384 + 8192)
        for a in range(2):
            ptx.cp_async_bulk_tensor_2d_g2s(base + 8192 * a, tma_a, 64 * a, 0, b)
            ptx.cp_async_bulk_tensor_2d_g2s(base + 16384 + 8192 * a, tma_b, 64 * a, 0, b)
            ptx.cp_async_bulk_tensor_2d_g2s(base + 32768 + 4096 * a, tma_v, 64 * a, 0, b)
    wait_phase0(b)
    acc = cuda.local.array(32, float32)
    ptx.wgmma_fence()
    for kk in range(8):
        at = (kk // 4) * 8192 + (kk % 4) * 32
        da = ptx.wgmma_desc(base + at, 16, 1024, ptx.SWIZZLE_128B)
        db = ptx.wgmma_desc(base + 16384 + at, 16, 1024, ptx.SWIZZLE_128B)
        if flag[0] == 0:
            ptx.wgmma_m64n64k16_f16_acc(acc, 0, da, db, 1 if kk > 0 else 0)
        else:
            ptx.wgmma_m64n64k16_bf16_acc(acc, 0, da, db, 1 if kk > 0 else 0)
    ptx.wgmma_commit_group()
    ptx.wgmma_wait_group(0)
    store_d(D1, acc, tid)
    w, lane = tid // 32, tid % 32
    g, t = lane >> 2, lane & 3
    a = cuda.local.array(8, uint32)
    for ps in range(2):
        for r in range(4):
            row = 16 * w + g + 8 * (r & 1)
            col = 16 * ps + 2 * t + 8 * (r >> 1)
            a[4 * ps + r] = uint32(a16[row, col]) | (uint32(a16[row, col + 1]) << uint32(16))
    acc2 = cuda.local.array(64, float32)
    ptx.wgmma_fence()
    for ps in range(2):
        dv = ptx.wgmma_desc(base + 32768 + ps * 2048, 4096, 1024, ptx.SWIZZLE_128B)
        if flag[0] == 0:
            ptx.wgmma_m64n128k16_f16_rs_bmn_acc(acc2, 0, a, 4 * ps, dv, 1 if ps > 0 else 0)
        else:
            ptx.wgmma_m64n128k16_bf16_rs_bmn_acc(acc2, 0, a, 4 * ps, dv, 1 if ps > 0 else 0)
    ptx.wgmma_commit_group()
    ptx.wgmma_wait_group(0)
    store_d_cols(D2, acc2, tid, 0)
    store_d_cols(D2, acc2, tid, 8)


def turns(out):
    """Two warpgroups take four turns each through named barriers 1 and 2 (warpgroup 1
    credits warpgroup 0 the first); whoever holds the turn appends its id to ``out``."""
    wg = cuda.threadIdx.x // 128
    seq = cuda.shared.array(1, numba.int32)
    if cuda.threadIdx.x == 0:
        seq[0] = 0
    cuda.syncthreads()
    if wg == 1:
        ptx.named_barrier_arrive(1, 256)
    for _ in range(4):
        ptx.named_barrier_sync(1 + wg, 256)
        if cuda.threadIdx.x % 128 == 0:
            k = seq[0]
            out[k] = wg
            seq[0] = k + 1
        ptx.named_barrier_arrive(2 - wg, 256)
    if wg == 0:
        ptx.named_barrier_sync(1, 256)  # warpgroup 1's last credit


def regs(out):
    if cuda.threadIdx.x < 128:
        ptx.setmaxnreg_dec(40)
    else:
        ptx.setmaxnreg_inc(232)
    bar = cuda.shared.array(1, uint64, alignment=_ALIGN)
    if cuda.threadIdx.x == 0:
        ptx.mbarrier_init(ptx.smem_addr(bar, 0), 256)
    cuda.syncthreads()
    ptx.mbarrier_arrive(ptx.smem_addr(bar, 0))
    out[cuda.threadIdx.x] = cuda.threadIdx.x


def cluster(out):
    # thread-block clusters: every CTA's values read by every CTA (tests/test_ptx_cluster.py)
    sh = cuda.shared.array(8, float32, alignment=_ALIGN)
    sh[cuda.threadIdx.x % 8] = float32(cuda.blockIdx.x)
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()
    a = ptx.mapa_shared_cluster(ptx.smem_addr(sh, 0), cuda.threadIdx.x % 4)
    x0, x1, x2, x3 = ptx.ld_shared_cluster_v4_f32(a)
    out[cuda.threadIdx.x] = x0 + x1 + x2 + x3 + ptx.ld_shared_cluster_f32(a + 16) + float32(ptx.cluster_ctarank())
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()
'''

_COMPILE = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numba
    from numba import cuda, float32, uint32
    from numba_flash._numba_cuda import compiling_for
    from numba_flash.inspection import _nvjitlink_resources
    exec(compile(open(sys.argv[2]).read(), "hopper_kernels", "exec"))
    sigs = {
        "wgmma": (uint32[:], uint32[:], float32[:, :], numba.int32[:]),
        "wgmma_rs": (numba.uint16[:, :], uint32[:], float32[:, :], numba.int32[:]),
        "bulk": (uint32[:], uint32[:], numba.int32),
        "regs": (numba.int32[:],),
        "cluster": (float32[:],),
        "turns": (numba.int32[:],),
        "tma2d": (numba.uint8[:], uint32[:], numba.int32, numba.int32),
        "tma3d": (numba.uint8[:], uint32[:]),
        "wgmma_sw128": (numba.uint8[:], numba.uint8[:], numba.uint8[:], numba.uint16[:, :], float32[:, :],
                        float32[:, :], numba.int32[:]),
    }
    out = {}
    for name, sig in sigs.items():
        with compiling_for((9, 0)):
            text, _ = cuda.compile_ptx(globals()[name], sig, cc=(9, 0, "a"))
        res, how = _nvjitlink_resources(text, "sm_90a")
        out[name] = {"ptx": text, "assembled": res is not None, "how": how}
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("hopper")
    kernels, script = d / "kernels.py", d / "compile.py"
    kernels.write_text(_KERNELS)
    script.write_text(_COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, str(script), REPO, str(kernels)], capture_output=True, text=True,
                         env=env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_wgmma_compiles_for_sm_90a(compiled):
    ptx = compiled["wgmma"]["ptx"]
    assert ".target sm_90a" in ptx
    for text in ("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                 "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                 "fence.proxy.async.shared::cta"):  # fmt: skip
        assert text in ptx, text
    assert "ld.local" not in ptx and "st.local" not in ptx, "the 32 accumulators spilled to local memory"


def test_wgmma_with_a_from_registers_compiles_for_sm_90a(compiled):
    import re

    ptx = compiled["wgmma_rs"]["ptx"]
    for t in ("f16", "bf16"):  # A as four 32-bit registers, B through a descriptor (an .b64 register)
        pat = rf"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.{t}\.{t}\s*\{{[^}}]*\}},\s*\{{%r\d+, %r\d+, %r\d+, %r\d+\}},\s*%rd\d+"
        assert re.search(pat, ptx), t
    assert "ld.local" not in ptx and "st.local" not in ptx, "the A fragment or the accumulators went to local memory"


def test_cluster_intrinsics_compile(compiled):
    """The cluster barrier, rank, ``mapa`` and distributed-shared-memory loads compile for
    sm_90a to their instructions, nothing in local memory."""
    text = compiled["cluster"]["ptx"]
    for want in ("barrier.cluster.arrive.release.aligned", "barrier.cluster.wait.acquire.aligned",
                 "%cluster_ctarank", "mapa.shared::cluster.u32", "ld.shared::cluster.v4.f32",
                 "ld.shared::cluster.f32"):  # fmt: skip
        assert want in text, want
    assert "ld.local" not in text and "st.local" not in text


def test_mbarrier_bulk_copy_and_setmaxnreg_compile(compiled):
    bulk, regs = compiled["bulk"]["ptx"], compiled["regs"]["ptx"]
    for text in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                 "mbarrier.try_wait.parity.shared::cta.b64",
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"):  # fmt: skip
        assert text in bulk, text
    for text in ("setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232",
                 "mbarrier.arrive.shared::cta.b64"):  # fmt: skip
        assert text in regs, text


def test_named_barriers_compile(compiled):
    text = compiled["turns"]["ptx"]
    assert "bar.sync" in text and "bar.arrive" in text


def check_turns():
    out = device(np.full(8, -1, np.int32))
    _hopper_kernels()["turns"][1, 256](out)
    assert host(out).tolist() == [0, 1] * 4


@pytest.mark.gpu
def test_named_barriers_take_turns():
    check_turns()


@pytest.mark.skipif(not SIMULATOR, reason="the simulator twin's test; on a GPU test_named_barriers_take_turns")
def test_named_barrier_twins_take_turns():
    check_turns()


def test_tma_copies_compile(compiled):
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in compiled["tma2d"]["ptx"]
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes" in compiled["tma3d"]["ptx"]


def test_the_assembler_accepts_them(compiled):
    for name, got in compiled.items():
        if not got["assembled"] and "no nvJitLink" in got["how"]:
            pytest.skip(f"no nvJitLink here ({got['how']})")
        assert got["assembled"], f"{name}: {got['how']}"


def test_wgmma_descriptor_bits():
    from numba_flash import ptx

    d = ptx.wgmma_desc_host(0x12340, 128, 256, ptx.SWIZZLE_128B)
    assert d & 0x3FFF == 0x12340 >> 4
    assert (d >> 16) & 0x3FFF == 128 >> 4 and (d >> 32) & 0x3FFF == 256 >> 4 and d >> 62 == 1


def check_wgmma_sw128(rng, dtype):
    """TMA boxes with the 128-byte swizzle read by wgmma: Q·Kᵀ's layout (both operands
    K-major, k-slices 32 bytes apart inside an atom, two atoms) and P·V's (A from
    registers, B MN-major over two atoms LBO apart), against float64 NumPy."""
    import ml_dtypes

    from numba_flash import tma

    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    A, B = (rng.standard_normal((64, 128)).astype(dt) for _ in range(2))
    V = rng.standard_normal((32, 128)).astype(dt)
    A64 = A.astype(np.float64)
    want1, want2 = A64 @ B.astype(np.float64).T, A64[:, :32] @ V.astype(np.float64)
    dA, dB, dV = (device(x.view(np.uint16)) for x in (A, B, V))
    maps = [tma.tensor_map(x, (rows, 64), 128) for x, rows in ((dA, 64), (dB, 64), (dV, 32))]
    D1, D2 = device(np.full((64, 64), np.nan, np.float32)), device(np.full((64, 128), np.nan, np.float32))
    _hopper_kernels()["wgmma_sw128"][1, 128](*maps, dA, D1, D2, device(np.array([0 if dtype == "float16" else 1],
                                                                            np.int32)))  # fmt: skip
    for got, want, what in ((D1, want1, "A·Bᵀ (K-major)"), (D2, want2, "A·V (MN-major B)")):
        err = float(np.abs(host(got) - want).max())
        assert err < 1e-4 * max(1.0, float(np.abs(want).max())), f"{dtype} {what}: max error {err:.3g}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_reads_tma_swizzled_tiles(rng, dtype):
    """In the simulator the twins (their layouts from the PTX ISA's canonical GMMA
    layouts); on a GPU the hardware: the layouts the wgmma forward uses."""
    if not SIMULATOR:
        from numba_flash._numba_cuda import compute_capability, gpu_available

        if not gpu_available() or compute_capability() < (9, 0):
            pytest.skip("wgmma and TMA need an sm_90 GPU (or the simulator's twins)")
    check_wgmma_sw128(rng, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_reads_tma_swizzled_tiles_on_the_gpu(rng, dtype):
    """``-m gpu`` selects only marked tests: the hardware's reading of the same tiles."""
    check_wgmma_sw128(rng, dtype)


def test_tma_twin_fills_a_box_with_zeros_past_the_edges(rng):
    """The simulator's TMA twin on the cases the H200 checked (test_tma_tile_with_zero_fill_past_the_edges)."""
    if not SIMULATOR:
        pytest.skip("the simulator twin's test; on a GPU test_tma_tile_with_zero_fill_past_the_edges")
    from numba_flash import tma

    X = rng.standard_normal((300, 200)).astype(np.float16)
    tmap = tma.tensor_map(X, (64, 64))
    for row0, col0 in [(0, 0), (250, 0), (280, 160)]:
        out = np.full(2048, 0x7E007E00, np.uint32)
        _hopper_kernels()["tma2d"][1, 128](tmap, out, row0, col0)
        want = np.zeros((64, 64), np.float16)
        src = X[row0:row0 + 64, col0:col0 + 64]
        want[:src.shape[0], :src.shape[1]] = src
        assert np.array_equal(out.view(np.uint16).reshape(64, 64), want.view(np.uint16)), (row0, col0)


def _core_layout(X):
    """(M x 16) fp16/bf16 bits -> uint32 words of 8x8 core matrices, core (mi, ki) at
    byte ((mi · 2) + ki) · 128 (LBO 128 along K, SBO 256 along M)."""
    M = X.shape[0]
    out = np.empty(M * 16, X.dtype)
    for mi in range(M // 8):
        for ki in range(2):
            at = (mi * 2 + ki) * 64
            out[at:at + 64] = X[8 * mi:8 * mi + 8, 8 * ki:8 * ki + 8].reshape(-1)
    return out.view(np.uint32)


def _hopper_kernels():
    from numba import cuda

    exec_ns = {}
    exec(compile(_KERNELS, "hopper_kernels", "exec"), exec_ns)
    return {name: cuda.jit(exec_ns[name]) for name in ("wgmma", "wgmma_rs", "bulk", "tma2d", "wgmma_sw128", "turns")}


def check_wgmma(rng, dtype, a_in_regs=False):
    """wgmma m64n64k16 with A in no-swizzle core matrices (or, ``a_in_regs``, as each
    warp's mma.sync A fragments) and Bᵀ in core matrices, against float64 NumPy."""
    import ml_dtypes

    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    A = rng.standard_normal((64, 16)).astype(dt)
    B = rng.standard_normal((16, 64)).astype(dt)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    D = device(np.full((64, 64), np.nan, np.float32))
    a = A.view(np.uint16) if a_in_regs else _core_layout(A)
    _hopper_kernels()["wgmma_rs" if a_in_regs else "wgmma"][1, 128](
        device(a), device(_core_layout(np.ascontiguousarray(B.T))), D,
        device(np.array([0 if dtype == "float16" else 1], np.int32)))  # fmt: skip
    err = float(np.abs(host(D) - ref).max())
    assert err < 1e-4 * max(1.0, float(np.abs(ref).max())), err


def check_bulk_copy(rng):
    """4096 bytes by one bulk copy, every thread waiting on the mbarrier's phase 0."""
    src = rng.integers(0, 2**32, 1024, dtype=np.uint32)
    out = device(np.zeros(1024, np.uint32))
    _hopper_kernels()["bulk"][1, 128](device(src), out, 4096)
    assert np.array_equal(host(out), src)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_m64n64k16_on_the_gpu(rng, dtype):
    check_wgmma(rng, dtype)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator twin's test; on a GPU test_wgmma_m64n64k16_on_the_gpu")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_twin_is_the_gpu_test(rng, dtype):
    """The twin runs the kernel that passed on the H200 (session 10) to the same
    bound: it reads the layout the hardware read."""
    check_wgmma(rng, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_rs_m64n64k16_on_the_gpu(rng, dtype):
    check_wgmma(rng, dtype, a_in_regs=True)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator twin's test; on a GPU test_wgmma_rs_m64n64k16_on_the_gpu")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_rs_twin(rng, dtype):
    """The register-A twin: the same product as the shared-memory one (not yet run on
    the hardware: its layout is PTX's, mma.sync's A fragment per warp)."""
    check_wgmma(rng, dtype, a_in_regs=True)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator twin's checks (the hardware hangs or faults instead)")
def test_wgmma_twin_needs_the_whole_warpgroup(rng):
    A = _core_layout(rng.standard_normal((64, 16)).astype(np.float16))
    with pytest.raises(RuntimeError, match="needs all 128 threads of the warpgroup, 96 of them"):
        _hopper_kernels()["wgmma"][1, 96](A, A.copy(), np.zeros((64, 64), np.float32), np.zeros(1, np.int32))


@pytest.mark.gpu
def test_bulk_copy_lands_on_its_mbarrier(rng):
    check_bulk_copy(rng)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator twin's test; on a GPU test_bulk_copy_lands_on_its_mbarrier")
def test_bulk_copy_twin_is_the_gpu_test(rng):
    check_bulk_copy(rng)


@pytest.mark.gpu
def test_tma_tile_with_zero_fill_past_the_edges(rng):
    """A 64 × 64 fp16 box of a 300 × 200 matrix through ``tma.tensor_map``: bit-exact
    where it lies in the matrix, zeros past its edges (the probe's cases)."""
    if SIMULATOR:
        pytest.skip("TMA has no simulator twin: needs an sm_90 GPU")
    import cupy as cp
    from numba import cuda

    from numba_flash import tma

    exec_ns = {}
    exec(compile(_KERNELS, "hopper_kernels", "exec"), exec_ns)
    kernel = cuda.jit(exec_ns["tma2d"])
    X = rng.standard_normal((300, 200)).astype(np.float16)
    dX = cp.asarray(X)
    tmap = tma.tensor_map(dX, (64, 64))
    for row0, col0 in [(0, 0), (64, 128), (250, 0), (280, 160), (7, 8)]:
        out = cp.full(2048, 0x7E007E00, np.uint32)  # NaN-poisoned
        kernel[1, 128](tmap, out, row0, col0)
        got = cp.asnumpy(out).view(np.float16).reshape(64, 64)
        want = np.zeros((64, 64), np.float16)
        src = X[row0:row0 + 64, col0:col0 + 64]
        want[:src.shape[0], :src.shape[1]] = src
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (row0, col0)


def test_tensor_map_checks_before_the_driver():
    from numba_flash import tma

    with pytest.raises(ValueError, match="swizzle=48"):
        tma.encode(0, "float16", (64, 64), (128,), (64, 64), swizzle=48)
    with pytest.raises(ValueError, match="16-byte aligned"):
        tma.encode(0, "float16", (64, 63), (126,), (64, 64))
    with pytest.raises(TypeError, match="dtype"):
        tma.encode(0, "int8", (64, 64), (64,), (64, 64))

"""numba_flash.ptx against NumPy, in the CUDA simulator or on a real GPU.

The same kernels run in both modes: the simulator where no GPU is present
(``_gpu_probe.use_simulator_without_gpu``, as conftest.py decides for the suite).
This module set NUMBA_ENABLE_CUDASIM=1 itself when numba was not imported yet,
which on a GPU machine put an xdist worker that collected it first, and every test
that worker ran after it, in the simulator (session 39: tests of other modules
failed in the simulator's twins on an H100).
"""

from numba_flash._gpu_probe import use_simulator_without_gpu

use_simulator_without_gpu()  # before numba's import (the suite's conftest.py did it already)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import float32, uint16, uint32  # noqa: E402

from numba_flash import ptx  # noqa: E402
from numba_flash._numba_cuda import SIMULATOR, cuda, gpu_available  # noqa: E402
from numba_flash.kernels import fragments  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (SIMULATOR or gpu_available()),
    reason="needs the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) or a GPU",
)

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal


def _run(kernel, grid, block, *args):
    """Launch with explicit transfers; return all arguments, arrays copied back."""
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    kernel[grid, block](*dev)
    cuda.synchronize()
    return [d.copy_to_host() if isinstance(a, np.ndarray) else a
            for a, d in zip(args, dev)]


def _bits(x, dtype):
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(dtype).view(np.uint16)


def _tf32_rna(x):
    """Reference cvt.rna.tf32.f32 on finite float32 values (bits)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x1000) & 0xFFFFE000).astype(np.uint32)


@cuda.jit(device=True)
def _pk(lo, hi):
    return uint32(lo) | (uint32(hi) << uint32(16))


# ---------------------------------------------------------------------------
# mma
# ---------------------------------------------------------------------------


@cuda.jit
def _mma16_kernel(A, B, C, D, use_bf16):
    # A: uint16[nwarps, 16, 16] bits, B: uint16[nwarps, 16, 8] bits (K x N),
    # C, D: float32[nwarps, 16, 8]; warp w of the grid computes tile w.
    tid = cuda.threadIdx.x
    w = cuda.blockIdx.x * (cuda.blockDim.x // 32) + tid // 32
    lane = tid % 32
    g = lane >> 2
    t = lane & 3
    a0 = _pk(A[w, g, 2 * t], A[w, g, 2 * t + 1])
    a1 = _pk(A[w, g + 8, 2 * t], A[w, g + 8, 2 * t + 1])
    a2 = _pk(A[w, g, 2 * t + 8], A[w, g, 2 * t + 9])
    a3 = _pk(A[w, g + 8, 2 * t + 8], A[w, g + 8, 2 * t + 9])
    b0 = _pk(B[w, 2 * t, g], B[w, 2 * t + 1, g])
    b1 = _pk(B[w, 2 * t + 8, g], B[w, 2 * t + 9, g])
    c0 = C[w, g, 2 * t]
    c1 = C[w, g, 2 * t + 1]
    c2 = C[w, g + 8, 2 * t]
    c3 = C[w, g + 8, 2 * t + 1]
    if use_bf16:
        d0, d1, d2, d3 = ptx.mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
    else:
        d0, d1, d2, d3 = ptx.mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
    D[w, g, 2 * t] = d0
    D[w, g, 2 * t + 1] = d1
    D[w, g + 8, 2 * t] = d2
    D[w, g + 8, 2 * t + 1] = d3


@cuda.jit
def _mma16_acc_kernel(A, B, C, D, use_bf16):
    # as _mma16_kernel, through the accumulating form on register arrays
    tid = cuda.threadIdx.x
    w = cuda.blockIdx.x * (cuda.blockDim.x // 32) + tid // 32
    lane = tid % 32
    g = lane >> 2
    t = lane & 3
    a = cuda.local.array(4, uint32)
    acc = cuda.local.array(4, float32)
    a[0] = _pk(A[w, g, 2 * t], A[w, g, 2 * t + 1])
    a[1] = _pk(A[w, g + 8, 2 * t], A[w, g + 8, 2 * t + 1])
    a[2] = _pk(A[w, g, 2 * t + 8], A[w, g, 2 * t + 9])
    a[3] = _pk(A[w, g + 8, 2 * t + 8], A[w, g + 8, 2 * t + 9])
    b0 = _pk(B[w, 2 * t, g], B[w, 2 * t + 1, g])
    b1 = _pk(B[w, 2 * t + 8, g], B[w, 2 * t + 9, g])
    acc[0] = C[w, g, 2 * t]
    acc[1] = C[w, g, 2 * t + 1]
    acc[2] = C[w, g + 8, 2 * t]
    acc[3] = C[w, g + 8, 2 * t + 1]
    if use_bf16:
        ptx.mma_m16n8k16_bf16_acc(acc, 0, a, 0, b0, b1)
    else:
        ptx.mma_m16n8k16_f16_acc(acc, 0, a, 0, b0, b1)
    D[w, g, 2 * t] = acc[0]
    D[w, g, 2 * t + 1] = acc[1]
    D[w, g + 8, 2 * t] = acc[2]
    D[w, g + 8, 2 * t + 1] = acc[3]


def _mma16_case(dtype, grid, block, seed, kernel=_mma16_kernel):
    rng = np.random.default_rng(seed)
    nw = grid * block // 32
    A = rng.standard_normal((nw, 16, 16)).astype(np.float32)
    B = rng.standard_normal((nw, 16, 8)).astype(np.float32)
    C = rng.standard_normal((nw, 16, 8)).astype(np.float32)
    Ab, Bb = _bits(A, dtype), _bits(B, dtype)
    D = np.zeros_like(C)
    (D,) = _run(kernel, grid, block, Ab, Bb, C, D, np.int32(dtype is not np.float16))[3:4]
    Aq = Ab.view(dtype).astype(np.float64)
    Bq = Bb.view(dtype).astype(np.float64)
    ref = Aq @ Bq + C
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_mma_m16n8k16(dtype):
    _mma16_case(dtype, 1, 32, seed=1)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_mma_m16n8k16_acc(dtype):
    _mma16_case(dtype, 1, 32, seed=5, kernel=_mma16_acc_kernel)


def test_mma_m16n8k16_several_warps_and_blocks():
    # 2 blocks x 2 warps, each warp its own tile: the simulator's per-warp
    # rendezvous must keep warps and blocks apart.
    _mma16_case(np.float16, 2, 64, seed=2)


@cuda.jit
def _mma_tf32_kernel(A, B, C, D):
    # A: float32[16, 8], B: float32[8, 8] (K x N), C, D: float32[16, 8]
    lane = cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    a0 = ptx.cvt_rna_tf32(A[g, t])
    a1 = ptx.cvt_rna_tf32(A[g + 8, t])
    a2 = ptx.cvt_rna_tf32(A[g, t + 4])
    a3 = ptx.cvt_rna_tf32(A[g + 8, t + 4])
    b0 = ptx.cvt_rna_tf32(B[t, g])
    b1 = ptx.cvt_rna_tf32(B[t + 4, g])
    d0, d1, d2, d3 = ptx.mma_m16n8k8_tf32(
        a0, a1, a2, a3, b0, b1,
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
    D[g, 2 * t] = d0
    D[g, 2 * t + 1] = d1
    D[g + 8, 2 * t] = d2
    D[g + 8, 2 * t + 1] = d3


@cuda.jit
def _mma_tf32_acc_kernel(A, B, C, D):
    # the in-place form: A's fragment from a register array, C accumulated in place
    lane = cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    a = cuda.local.array(4, uint32)
    acc = cuda.local.array(4, float32)
    a[0] = ptx.cvt_rna_tf32(A[g, t])
    a[1] = ptx.cvt_rna_tf32(A[g + 8, t])
    a[2] = ptx.cvt_rna_tf32(A[g, t + 4])
    a[3] = ptx.cvt_rna_tf32(A[g + 8, t + 4])
    acc[0] = C[g, 2 * t]
    acc[1] = C[g, 2 * t + 1]
    acc[2] = C[g + 8, 2 * t]
    acc[3] = C[g + 8, 2 * t + 1]
    ptx.mma_m16n8k8_tf32_acc(acc, 0, a, 0, ptx.cvt_rna_tf32(B[t, g]), ptx.cvt_rna_tf32(B[t + 4, g]))
    D[g, 2 * t] = acc[0]
    D[g, 2 * t + 1] = acc[1]
    D[g + 8, 2 * t] = acc[2]
    D[g + 8, 2 * t + 1] = acc[3]


@pytest.mark.parametrize("kernel", [_mma_tf32_kernel, _mma_tf32_acc_kernel], ids=["values", "in-place"])
def test_mma_m16n8k8_tf32(kernel):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.zeros_like(C)
    (D,) = _run(kernel, 1, 32, A, B, C, D)[3:4]
    Aq = _tf32_rna(A).view(np.float32).astype(np.float64)
    Bq = _tf32_rna(B).view(np.float32).astype(np.float64)
    np.testing.assert_allclose(D, Aq @ Bq + C, rtol=1e-5, atol=1e-5)
    # and the tf32 rounding is really applied
    assert not np.allclose(D, A.astype(np.float64) @ B + C, rtol=1e-7, atol=1e-7)


@cuda.jit
def _tf32_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = ptx.cvt_rna_tf32(x[i])


def test_cvt_rna_tf32():
    one = 1.0
    ulp = 2.0 ** -10
    x = np.array([0.0, -0.0, 1.0, one + ulp / 2, -(one + ulp / 2), one + 1.5 * ulp,
                  one + ulp / 2 - 2.0 ** -23, 3.14159265, -2.718281828, 1e-30,
                  3.0e38, 65504.0, np.inf, -np.inf], dtype=np.float32)
    x = np.concatenate([x, np.random.default_rng(4).standard_normal(18).astype(np.float32)])
    out = np.zeros(x.size, np.uint32)
    (out,) = _run(_tf32_kernel, 1, 32, x, out)[1:]
    ref = _tf32_rna(x)
    np.testing.assert_array_equal(out, ref)
    assert out[3] == np.float32(one + ulp).view(np.uint32)  # tie -> away
    assert out[4] == np.float32(-(one + ulp)).view(np.uint32)


# ---------------------------------------------------------------------------
# ldmatrix
# ---------------------------------------------------------------------------

_LD = 24  # padded shared row stride in elements (48 bytes, 16-byte aligned)


@cuda.jit
def _ldmatrix_kernel(M, out):
    # M: uint16[16, 16]; out: uint32[32, 14]
    lane = cuda.threadIdx.x
    s = cuda.shared.array((16, _LD), uint16, alignment=_ALIGN)
    for i in range(lane, 16 * 16, 32):
        s[i // 16, i % 16] = M[i // 16, i % 16]
    cuda.syncthreads()
    # lane l addresses row (l & 15), column block (l >> 4): matrix i is
    # M[8(i%2):8(i%2)+8, 8(i//2):8(i//2)+8]
    base = ptx.smem_addr(s, (0, 0))
    addr = base + (lane & 15) * (_LD * 2) + (lane >> 4) * 16
    r0, r1, r2, r3 = ptx.ldmatrix_x4(addr)
    out[lane, 0] = r0
    out[lane, 1] = r1
    out[lane, 2] = r2
    out[lane, 3] = r3
    r0, r1, r2, r3 = ptx.ldmatrix_x4_trans(ptx.smem_addr(s, (lane & 15, (lane >> 4) * 8)))
    out[lane, 4] = r0
    out[lane, 5] = r1
    out[lane, 6] = r2
    out[lane, 7] = r3
    r0, r1 = ptx.ldmatrix_x2(addr)
    out[lane, 8] = r0
    out[lane, 9] = r1
    r0, r1 = ptx.ldmatrix_x2_trans(addr)
    out[lane, 10] = r0
    out[lane, 11] = r1
    out[lane, 12] = ptx.ldmatrix_x1(addr)
    out[lane, 13] = ptx.ldmatrix_x1_trans(addr)


def _expected_ldmatrix(M, nmat, trans):
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    regs = []
    for i in range(nmat):
        Mi = M[8 * (i % 2):8 * (i % 2) + 8, 8 * (i // 2):8 * (i // 2) + 8].astype(np.uint32)
        if trans:
            Mi = Mi.T
        regs.append(Mi[g, 2 * t] | (Mi[g, 2 * t + 1] << 16))
    return np.stack(regs, axis=1)


def test_ldmatrix_layouts():
    M = (np.arange(256, dtype=np.uint32) * 37 + 5).astype(np.uint16).reshape(16, 16)
    out = np.zeros((32, 14), np.uint32)
    (out,) = _run(_ldmatrix_kernel, 1, 32, M, out)[1:]
    np.testing.assert_array_equal(out[:, 0:4], _expected_ldmatrix(M, 4, False))
    np.testing.assert_array_equal(out[:, 4:8], _expected_ldmatrix(M, 4, True))
    np.testing.assert_array_equal(out[:, 8:10], _expected_ldmatrix(M, 2, False))
    np.testing.assert_array_equal(out[:, 10:12], _expected_ldmatrix(M, 2, True))
    np.testing.assert_array_equal(out[:, 12:13], _expected_ldmatrix(M, 1, False))
    np.testing.assert_array_equal(out[:, 13:14], _expected_ldmatrix(M, 1, True))


@cuda.jit
def _attention_tile_kernel(Q, K, V, S, O):
    # Q, K, V: uint16[16, 16] fp16 bits (Q[m][k], K[n][k], V[k][n]);
    # S = Q K^T (float32[16, 16]); O = fp16(S) V (float32[16, 16]).
    # Uses the ldmatrix address recipes of the ptx module docstring and the
    # accumulator -> A-operand reuse of an FA2 kernel.
    lane = cuda.threadIdx.x
    sQ = cuda.shared.array((16, 16), uint16, alignment=_ALIGN)
    sK = cuda.shared.array((16, 16), uint16, alignment=_ALIGN)
    sV = cuda.shared.array((16, 16), uint16, alignment=_ALIGN)
    for i in range(lane, 256, 32):
        sQ[i // 16, i % 16] = Q[i // 16, i % 16]
        sK[i // 16, i % 16] = K[i // 16, i % 16]
        sV[i // 16, i % 16] = V[i // 16, i % 16]
    cuda.syncthreads()
    g = lane >> 2
    t = lane & 3
    a0, a1, a2, a3 = ptx.ldmatrix_x4(ptx.smem_addr(sQ, (lane & 15, (lane >> 4) * 8)))
    kb0, kb1, kb2, kb3 = ptx.ldmatrix_x4(
        ptx.smem_addr(sK, ((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8)))
    z = float32(0.0)
    s0, s1, s2, s3 = ptx.mma_m16n8k16_f16(a0, a1, a2, a3, kb0, kb1, z, z, z, z)
    s4, s5, s6, s7 = ptx.mma_m16n8k16_f16(a0, a1, a2, a3, kb2, kb3, z, z, z, z)
    S[g, 2 * t] = s0
    S[g, 2 * t + 1] = s1
    S[g + 8, 2 * t] = s2
    S[g + 8, 2 * t + 1] = s3
    S[g, 8 + 2 * t] = s4
    S[g, 8 + 2 * t + 1] = s5
    S[g + 8, 8 + 2 * t] = s6
    S[g + 8, 8 + 2 * t + 1] = s7
    p0 = ptx.pack_f16x2(s0, s1)
    p1 = ptx.pack_f16x2(s2, s3)
    p2 = ptx.pack_f16x2(s4, s5)
    p3 = ptx.pack_f16x2(s6, s7)
    vb0, vb1, vb2, vb3 = ptx.ldmatrix_x4_trans(
        ptx.smem_addr(sV, ((lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8)))
    o0, o1, o2, o3 = ptx.mma_m16n8k16_f16(p0, p1, p2, p3, vb0, vb1, z, z, z, z)
    o4, o5, o6, o7 = ptx.mma_m16n8k16_f16(p0, p1, p2, p3, vb2, vb3, z, z, z, z)
    O[g, 2 * t] = o0
    O[g, 2 * t + 1] = o1
    O[g + 8, 2 * t] = o2
    O[g + 8, 2 * t + 1] = o3
    O[g, 8 + 2 * t] = o4
    O[g, 8 + 2 * t + 1] = o5
    O[g + 8, 8 + 2 * t] = o6
    O[g + 8, 8 + 2 * t + 1] = o7


def test_ldmatrix_mma_attention_tile():
    rng = np.random.default_rng(5)
    Q, K, V = (rng.standard_normal((16, 16)).astype(np.float16) for _ in range(3))
    S = np.zeros((16, 16), np.float32)
    O = np.zeros((16, 16), np.float32)
    S, O = _run(_attention_tile_kernel, 1, 32, Q.view(np.uint16), K.view(np.uint16),
                V.view(np.uint16), S, O)[3:]
    S_ref = Q.astype(np.float64) @ K.astype(np.float64).T
    np.testing.assert_allclose(S, S_ref, rtol=1e-5, atol=1e-5)
    P = S.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(O, P @ V.astype(np.float64), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------
# cp.async
# ---------------------------------------------------------------------------


@cuda.jit
def _cp_async_kernel(G, valid_rows, out, early):
    # G: uint16[8, 16] (8 rows x 32 bytes = 16 chunks of 16 bytes).
    # Lanes 0-15 copy G into tile a (plain cp.async, group 0); lanes 16-31
    # copy G into tile b with zero fill for rows >= valid_rows (group 1).
    # out: uint16[2, 8, 16]; early[lane]: tile a's first 8 elements of the
    # lane's own chunk, read after wait_group(1) retired group 0.
    lane = cuda.threadIdx.x
    ta = cuda.shared.array((8, 16), uint16, alignment=_ALIGN)
    tb = cuda.shared.array((8, 16), uint16, alignment=_ALIGN)
    for i in range(lane, 128, 32):
        ta[i // 16, i % 16] = 0xFFFF
        tb[i // 16, i % 16] = 0xFFFF
    cuda.syncthreads()
    c = lane & 15
    row = c >> 1
    col = (c & 1) * 8
    if lane < 16:
        ptx.cp_async_16(ptx.smem_addr(ta, (row, col)), G, (row, col))
    ptx.cp_async_commit()
    if lane >= 16:
        ok = row < valid_rows
        src_row = row if ok else 0  # clamp: no byte is read when ok is False
        ptx.cp_async_16_zfill(ptx.smem_addr(tb, (row, col)), G, (src_row, col), ok)
    ptx.cp_async_commit()
    ptx.cp_async_wait_group(1)
    if lane < 16:
        for j in range(8):
            early[lane, j] = ta[row, col + j]
    ptx.cp_async_wait_all()
    cuda.syncthreads()
    for i in range(lane, 128, 32):
        out[0, i // 16, i % 16] = ta[i // 16, i % 16]
        out[1, i // 16, i % 16] = tb[i // 16, i % 16]


def test_cp_async():
    G = np.arange(128, dtype=np.uint16).reshape(8, 16) * 3 + 1
    valid = 5
    out = np.zeros((2, 8, 16), np.uint16)
    early = np.zeros((16, 8), np.uint16)
    out, early = _run(_cp_async_kernel, 1, 32, G, np.int32(valid), out, early)[2:]
    np.testing.assert_array_equal(out[0], G)
    expect_b = G.copy()
    expect_b[valid:] = 0
    np.testing.assert_array_equal(out[1], expect_b)
    np.testing.assert_array_equal(early, G.reshape(16, 8))


@cuda.jit
def _cp_async_at_kernel(G, valid_rows, out):
    # The rows of G (uint16[8, 16]) copied from the address of G[0, col] plus a
    # byte offset of ``row`` rows (``cp_async_16_zfill_at``), rows >= valid_rows
    # zero-filled; lanes 0-15, two chunks a row; out: uint16[8, 16].
    lane = cuda.threadIdx.x
    t = cuda.shared.array((8, 16), uint16, alignment=_ALIGN)
    for i in range(lane, 128, 32):
        t[i // 16, i % 16] = 0xFFFF
    cuda.syncthreads()
    row = (lane & 15) >> 1
    col = (lane & 1) * 8
    if lane < 16:
        ok = row < valid_rows
        ptx.cp_async_16_zfill_at(ptx.smem_addr(t, (row, col)), G, (0, col), row * G.strides[0], ok)
    ptx.cp_async_commit()
    ptx.cp_async_wait_all()
    cuda.syncthreads()
    for i in range(lane, 128, 32):
        out[i // 16, i % 16] = t[i // 16, i % 16]


def test_cp_async_at_offsets_rows_and_zero_fills():
    G = np.random.default_rng().integers(1, 60000, (8, 16)).astype(np.uint16)
    valid = 6
    out = np.full((8, 16), 7, np.uint16)
    out = _run(_cp_async_at_kernel, 1, 32, G, np.int32(valid), out)[2]
    expect = G.copy()
    expect[valid:] = 0
    np.testing.assert_array_equal(out, expect)


@cuda.jit
def _pipeline_kernel(A, B, D, ntiles):
    # D = sum_j A[j] @ B with the A tiles streamed through a 2-stage cp.async
    # pipeline in dynamic shared memory (2 x 16 x 16 fp16), always read with
    # the same ldmatrix addresses: catches hoisted/reordered ldmatrix on the
    # GPU and a wrong wait_group in the simulator (which defers the copies).
    # A: uint16[ntiles, 16, 16], B: uint16[16, 8], D: float32[16, 8]
    lane = cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    s = cuda.shared.array(0, uint16, alignment=_ALIGN)
    base = ptx.smem_addr(s, 0)
    row = lane >> 1  # lane copies 16 bytes: row lane // 2, half lane % 2
    col = (lane & 1) * 8
    ptx.cp_async_16(base + row * 32 + col * 2, A, (0, row, col))
    ptx.cp_async_commit()
    b0 = _pk(B[2 * t, g], B[2 * t + 1, g])
    b1 = _pk(B[2 * t + 8, g], B[2 * t + 9, g])
    d0 = float32(0.0)
    d1 = float32(0.0)
    d2 = float32(0.0)
    d3 = float32(0.0)
    frag = base + (lane & 15) * 32 + (lane >> 4) * 16
    for j in range(ntiles):
        if j + 1 < ntiles:
            nxt = ((j + 1) & 1) * 512
            ptx.cp_async_16(base + nxt + row * 32 + col * 2, A, (j + 1, row, col))
        ptx.cp_async_commit()
        ptx.cp_async_wait_group(1)
        cuda.syncthreads()
        a0, a1, a2, a3 = ptx.ldmatrix_x4(frag + (j & 1) * 512)
        d0, d1, d2, d3 = ptx.mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
        cuda.syncthreads()
    D[g, 2 * t] = d0
    D[g, 2 * t + 1] = d1
    D[g + 8, 2 * t] = d2
    D[g + 8, 2 * t + 1] = d3


def test_cp_async_ldmatrix_pipeline():
    rng = np.random.default_rng(7)
    ntiles = 3
    A = rng.standard_normal((ntiles, 16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    dA, dB = cuda.to_device(A.view(np.uint16)), cuda.to_device(B.view(np.uint16))
    dD = cuda.to_device(np.zeros((16, 8), np.float32))
    _pipeline_kernel[1, 32, 0, 2 * 16 * 16 * 2](dA, dB, dD, np.int32(ntiles))
    D = dD.copy_to_host()
    ref = sum(A[j].astype(np.float64) @ B.astype(np.float64) for j in range(ntiles))
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------
# conversions, ex2
# ---------------------------------------------------------------------------


@cuda.jit
def _pack_kernel(x, packed, unpacked, use_bf16):
    # x: float32[2n]; packed: uint32[n]; unpacked: float32[2n]
    i = cuda.grid(1)
    if i < packed.shape[0]:
        if use_bf16:
            u = ptx.pack_bf16x2(x[2 * i], x[2 * i + 1])
            lo, hi = ptx.unpack_bf16x2(u)
        else:
            u = ptx.pack_f16x2(x[2 * i], x[2 * i + 1])
            lo, hi = ptx.unpack_f16x2(u)
        packed[i] = u
        unpacked[2 * i] = lo
        unpacked[2 * i + 1] = hi


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_pack_unpack(dtype):
    special = [0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e5, -1e5, 6e-8, 3e-5,
               1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
               1.0 + 3 * 2.0 ** -8, 3.0e38, np.inf, -np.inf, 1e-30]
    rng = np.random.default_rng(6)
    x = np.concatenate([np.array(special, np.float32),
                        (rng.standard_normal(46) * 100).astype(np.float32)])
    n = x.size // 2
    packed = np.zeros(n, np.uint32)
    unpacked = np.zeros(2 * n, np.float32)
    packed, unpacked = _run(_pack_kernel, 1, 32, x, packed, unpacked,
                            np.int32(dtype is not np.float16))[1:3]
    h = _bits(x, dtype).astype(np.uint32)
    np.testing.assert_array_equal(packed, h[0::2] | (h[1::2] << 16))
    np.testing.assert_array_equal(unpacked, _bits(x, dtype).view(dtype).astype(np.float32))


@cuda.jit
def _ex2_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = ptx.ex2_approx(x[i])


def test_ex2_approx():
    x = np.concatenate([np.linspace(-30, 30, 25), [0.0, 1.0, -1.0, 0.5, 127.5, 128.0,
                                                   -126.0, -140.0, -np.inf, np.inf]]
                       ).astype(np.float32)
    out = np.zeros_like(x)
    (out,) = _run(_ex2_kernel, 1, 64, x, out)[1:]
    ref = np.exp2(x.astype(np.float64))
    ref[ref < np.finfo(np.float32).tiny] = 0.0  # ftz
    with np.errstate(over="ignore"):
        ref = ref.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=0)
    assert out[list(x).index(128.0)] == np.inf
    assert out[list(x).index(-140.0)] == 0.0


@cuda.jit
def _words_kernel(a, b, sel, hi, lo, perm):
    i = cuda.grid(1)
    if i < a.shape[0]:
        h, l = ptx.mul_wide_u32(a[i], b[i])
        hi[i] = h
        lo[i] = l
        perm[i] = ptx.prmt(a[i], b[i], sel[i])


def _prmt_reference(a, b, sel):
    """prmt.b32's default mode, byte by byte in Python ints."""
    pool = int(a) | (int(b) << 32)
    out = 0
    for i in range(4):
        nib = (int(sel) >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF * (byte >> 7)
        out |= byte << (8 * i)
    return out


def test_mul_wide_and_prmt():
    """``mul_wide_u32`` against the exact 64-bit product, ``prmt`` against the PTX
    ISA's byte selection and sign replication, on random words and the edges."""
    rng = np.random.default_rng()
    n = 64
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    a[:4], b[:4] = [0xFFFFFFFF, 0, 0x80808080, 5], [0xFFFFFFFF, 0xFFFFFFFF, 0x7F00FF80, 0x12345678]
    sel = rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint32)
    sel[:4] = [0x9988, 0xBBAA, 0x3210, 0x7654]
    hi, lo, perm = (np.zeros(n, np.uint32) for _ in range(3))
    hi, lo, perm = _run(_words_kernel, 1, n, a, b, sel, hi, lo, perm)[3:]
    prod = a.astype(object) * b.astype(object)
    assert [int(x) for x in hi] == [int(p) >> 32 for p in prod]
    assert [int(x) for x in lo] == [int(p) & 0xFFFFFFFF for p in prod]
    assert [int(x) for x in perm] == [_prmt_reference(x, y, z) for x, y, z in zip(a, b, sel)]
    assert int(perm[0]) == 0xFFFFFFFF and int(perm[2]) == int(a[2]) and int(perm[3]) == int(b[3])  # sign; a; b


# ---------------------------------------------------------------------------
# simulator-only behaviour
# ---------------------------------------------------------------------------


@cuda.jit
def _divergent_kernel(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        z = float32(0.0)
        d0, d1, d2, d3 = ptx.mma_m16n8k16_f16(0, 0, 0, 0, 0, 0, z, z, z, z)
        out[lane] = d0


@cuda.jit
def _not_shared_kernel(G, out):
    out[0] = ptx.smem_addr(G, 0)


@pytest.mark.skipif(not SIMULATOR, reason="simulator error reporting")
def test_sim_reports_misuse():
    out = np.zeros(32, np.float32)
    with pytest.raises(RuntimeError, match="never joined"):
        _divergent_kernel[1, 32](out)
    with pytest.raises(ValueError, match="not a cuda.shared.array"):
        _not_shared_kernel[1, 1](np.zeros(8, np.uint16), np.zeros(1, np.uint32))


def _lanes_still_marked_blocked():
    """How many threads of the calling simulated thread's block are marked blocked in
    ``syncthreads`` (host code the simulator's kernel calls)."""
    import threading

    me = threading.current_thread()
    return sum(1 for th in threading.enumerate()
               if getattr(th, "_manager", None) is me._manager and th.syncthreads_blocked)  # fmt: skip


@cuda.jit
def _released_kernel(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    out[t] = _lanes_still_marked_blocked()  # the kernel's only syncthreads: none may be marked now


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's syncthreads")
def test_sim_syncthreads_clears_every_flag_before_any_thread_runs_on():
    """A thread released from ``syncthreads`` sees no thread of its block still marked
    blocked there (``_ptx_sim._install_polite_block_manager`` releases in two passes).
    Released one by one, as numba's simulator does, a thread that ran on while the
    launching thread was descheduled mid-release saw lanes still marked, and a warp
    collective waiting on them reported them stuck (``shfl.idx … never joined``, under
    heavy load).  A tiny switch interval makes the launching thread descheduled often:
    the one-pass release failed 4 of 6 such launches."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(6):
            out = np.full(64, -1, np.int64)
            _released_kernel[1, 64](out)
            assert (out == 0).all(), f"{int((out > 0).sum())} threads saw lanes still marked blocked"
    finally:
        sys.setswitchinterval(interval)


@cuda.jit
def _shfl_idx_kernel(x, out):
    lane = cuda.threadIdx.x & 31
    out[cuda.threadIdx.x] = cuda.shfl_sync(0xFFFFFFFF, x[cuda.threadIdx.x], (lane * 7 + 3) % 32)


def test_shfl_idx_each_lane_its_own_source():
    """``shfl_sync`` with a different source lane in every lane (``tc_backward``'s
    preprocess hands each row's delta to its lane so): lane l of each warp gets lane
    (7l + 3) mod 32's value.  The simulator's twin took the calling lane's source for
    all and reported lanes with other sources as divergent."""
    x = np.random.default_rng().standard_normal(64).astype(np.float32)
    out = np.full(64, np.nan, np.float32)
    _, got = _run(_shfl_idx_kernel, 1, 64, x, out)
    lane = np.arange(64) % 32
    np.testing.assert_array_equal(got, x[(lane * 7 + 3) % 32 + 32 * (np.arange(64) // 32)])


# ---------------------------------------------------------------------------
# vectorised shared-memory access
# ---------------------------------------------------------------------------


@cuda.jit
def _v4_roundtrip_kernel(src, dst):
    # each thread stores its 4 floats with one st.shared.v4 into a rotated slot and
    # reads back its neighbour's with one ld.shared.v4
    s = cuda.shared.array(128, float32, alignment=_ALIGN)
    tid = cuda.threadIdx.x
    base = ptx.smem_addr(s, 0)
    slot = (tid + 1) % 32
    ptx.st_shared_v4_f32(base + slot * 16, src[tid, 0], src[tid, 1], src[tid, 2], src[tid, 3])
    cuda.syncthreads()
    a, b, c, d = ptx.ld_shared_v4_f32(base + tid * 16)
    dst[tid, 0] = a
    dst[tid, 1] = b
    dst[tid, 2] = c
    dst[tid, 3] = d


def test_shared_v4_store_then_load_moves_four_floats():
    src = np.random.default_rng().standard_normal((32, 4)).astype(np.float32)
    dst = np.full((32, 4), np.nan, np.float32)
    _, out = _run(_v4_roundtrip_kernel, 1, 32, src, dst)
    # slot s holds thread (s - 1)'s values
    np.testing.assert_array_equal(out, np.roll(src, 1, axis=0))


@cuda.jit
def _v4_global_kernel(dst, h):
    # thread tid stages words 4·tid .. 4·tid + 3 with four st.shared.b32 into the slot of
    # thread tid + 1 (mod 32, within its warp), reads its own slot back with one
    # ld.shared.v4.b32 and stores it with one st.global.v4.b32 at dst[b, n, h, 4c]:
    # warp b, its lanes on chunks 0, 1 of rows 0 .. 15 (lane = 2n + c)
    s = cuda.shared.array(0, uint32)
    tid = cuda.threadIdx.x
    b, lane = tid // 32, tid % 32
    base = ptx.smem_addr(s, 0) + 512 * b
    for j in range(4):
        ptx.st_shared_b32(base + 16 * ((lane + 1) % 32) + 4 * j, 4 * tid + j)
    cuda.syncwarp()
    w0, w1, w2, w3 = ptx.ld_shared_v4_b32(base + 16 * lane)
    ptx.st_global_v4_b32(dst, (b, lane // 2, h, 4 * (lane % 2)), w0, w1, w2, w3)


def test_global_v4_store_writes_sixteen_bytes():
    """st.shared.b32, ld.shared.v4.b32 and st.global.v4.b32 against NumPy: every word
    lands where a 4-d index says, and the words around it (other heads) stay as they were."""
    h = 1
    dst = np.full((2, 16, 3, 8), 0xDEADBEEF, np.uint32)
    d = cuda.to_device(dst)
    _v4_global_kernel[1, 64, 0, 1024](d, np.int32(h))
    cuda.synchronize()
    out = d.copy_to_host()
    want = dst.copy()
    tid = np.arange(64)
    src = (tid - 1) % 32 + 32 * (tid // 32)  # the thread whose words a slot holds
    for t in tid:
        b, lane = divmod(t, 32)
        want[b, lane // 2, h, 4 * (lane % 2):4 * (lane % 2) + 4] = 4 * src[t] + np.arange(4)
    np.testing.assert_array_equal(out, want)


@cuda.jit
def _v4_global_misaligned_kernel(dst):
    ptx.st_global_v4_b32(dst, (0, 1), 1, 2, 3, 4)


@pytest.mark.skipif(not SIMULATOR, reason="simulator error reporting")
def test_sim_global_v4_store_checks_alignment():
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        _v4_global_misaligned_kernel[1, 1](np.zeros((2, 8), np.uint32))
    with pytest.raises(TypeError, match="4-byte elements"):
        _v4_global_misaligned_kernel[1, 1](np.zeros((2, 8), np.uint16))


@cuda.jit
def _v4_nc_load_kernel(src, out):
    lane = cuda.threadIdx.x
    w0, w1, w2, w3 = ptx.ld_global_nc_v4_b32(src, (lane // 4, 1, 8 * (lane % 4)))
    out[lane, 0], out[lane, 1], out[lane, 2], out[lane, 3] = w0, w1, w2, w3


def test_global_v4_nc_load_reads_sixteen_bytes():
    """ld.global.nc.v4.b32 of a 3-d uint16 array (rows of 80 bytes; the middle index
    picks the second of two) against NumPy: eight 16-bit elements as four words, each
    word's lower-indexed element in its low half."""
    rng = np.random.default_rng()
    src = rng.integers(0, 1 << 16, size=(8, 2, 40), dtype=np.uint16)
    out = cuda.to_device(np.full((32, 4), 0xDEADBEEF, np.uint32))
    _v4_nc_load_kernel[1, 32](cuda.to_device(src), out)
    cuda.synchronize()
    got = out.copy_to_host()
    for lane in range(32):
        row = src[lane // 4, 1, 8 * (lane % 4):8 * (lane % 4) + 8].astype(np.uint32)
        np.testing.assert_array_equal(got[lane], row[0::2] | (row[1::2] << 16))


@pytest.mark.skipif(not SIMULATOR, reason="simulator error reporting")
def test_sim_global_v4_nc_load_checks_alignment():
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        _v4_nc_load_kernel[1, 32](np.zeros((8, 2, 33), np.uint16), np.zeros((32, 4), np.uint32))


# ---------------------------------------------------------------------------
# the output epilogue through shared memory (kernels.fragments)
# ---------------------------------------------------------------------------


def _staged_epilogue_kernel(NT, BF16):
    """Warp w of the grid holds, in the m16n8 accumulator layout, rows 16m .. 16m + 15
    of head h, batch b (w = (m·H + h)·B + b) of O (NT n-tiles), times its rows' scales,
    and writes them as 16-bit pairs through its staging rows (``fragments``'s epilogue)."""
    ACC, WORDS = 4 * NT, 2 * NT  # literals for local.array

    @cuda.jit
    def kernel(acc_in, scales, out, n_valid):
        # acc_in: float32[warps, 32, 4·NT]; scales: float32[warps, 16]; out: uint32[B, N, H, 4·NT]
        s = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        w = cuda.blockIdx.x * (cuda.blockDim.x // 32) + tid // 32
        lane = tid % 32
        B, H = out.shape[0], out.shape[2]
        b, h, m = w % B, (w // B) % H, w // (B * H)
        acc = cuda.local.array(ACC, float32)
        words = cuda.local.array(WORDS, uint32)
        for i in range(ACC):
            acc[i] = acc_in[w, lane, i]
        stage = ptx.smem_addr(s, 0) + (tid // 32) * (16 * 16 * NT)
        for half in range(2):
            fragments.stage_row_pairs(stage, acc, half, NT, scales[w, (lane >> 2) + 8 * half], BF16)
        fragments.store_staged_rows(out, b, 16 * m, h, stage, n_valid - 16 * m, NT, words, NT)

    return kernel


def check_staged_epilogue(NT, dtype, B, H, N, n_valid, warps_per_block, seed=0):
    rng = np.random.default_rng(seed)
    warps = B * H * (N // 16)
    o = rng.standard_normal((warps, 16, 8 * NT)).astype(np.float32)
    scales = (0.5 + rng.random((warps, 16))).astype(np.float32)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    acc = np.empty((warps, 32, 4 * NT), np.float32)  # acc[4nt + e] = O[g + 8(e >> 1), 8nt + 2t + (e & 1)]
    for nt in range(NT):
        for e in range(4):
            acc[:, :, 4 * nt + e] = o[:, g + 8 * (e >> 1), 8 * nt + 2 * t + (e & 1)]
    out = np.full((B, N, H, 4 * NT), 0xDEADBEEF, np.uint32)
    d = cuda.to_device(out)
    kern = _staged_epilogue_kernel(NT, dtype is ml_dtypes.bfloat16)
    kern[warps // warps_per_block, 32 * warps_per_block, 0, warps_per_block * 16 * 16 * NT](
        cuda.to_device(acc), cuda.to_device(scales), d, np.int32(n_valid))
    cuda.synchronize()
    got = d.copy_to_host()
    want = out.copy()
    bits = _bits(o * scales[:, :, None], dtype).astype(np.uint32)  # (warps, 16, 8NT)
    pairs = bits[:, :, 0::2] | (bits[:, :, 1::2] << 16)
    for w in range(warps):
        b, h, m = w % B, (w // B) % H, w // (B * H)
        rows = min(16, n_valid - 16 * m)
        if rows > 0:
            want[b, 16 * m:16 * m + rows, h] = pairs[w, :rows]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("NT,dtype", [(8, np.float16), (16, ml_dtypes.bfloat16)], ids=["d64-f16", "d128-bf16"])
def test_staged_epilogue_writes_whole_rows(NT, dtype):
    """``fragments.stage_row_pairs`` + ``store_staged_rows`` (the wgmma forward's
    epilogue) against NumPy: the swizzled staging rows come back in order, each row
    scaled by its own factor and rounded as pack_*x2 does; rows from ``n_valid`` on (the
    second m-tile's last 5) are not written."""
    check_staged_epilogue(NT, dtype, B=2, H=1, N=32, n_valid=27, warps_per_block=2)


@pytest.mark.gpu
@pytest.mark.parametrize("NT", [8, 16])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_staged_epilogue_on_the_gpu(NT, dtype):
    """As above with many blocks of 8 warps, on the hardware's st.global.v4.b32 (its
    16-byte alignment: rows of 4·NT words from an allocation's start)."""
    check_staged_epilogue(NT, dtype, B=3, H=8, N=1024, n_valid=1000, warps_per_block=8)

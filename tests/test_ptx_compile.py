"""numba_flash.ptx compiles to the intended PTX, with fragments in registers.

``numba.cuda.compile_ptx`` needs no GPU but cannot run under the simulator, so
a subprocess with NUMBA_ENABLE_CUDASIM=0 compiles one small kernel per group
of intrinsics for sm_90 and prints the PTX as JSON; the tests check the
instruction text and that nothing spills to local memory.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = textwrap.dedent(
    '''
    import json, sys
    try:
        from numba.cuda.cudadrv.error import NvvmSupportError
    except Exception:
        NvvmSupportError = ()
    from numba import cuda, float32, uint16, uint32
    from numba_flash import ptx

    _ALIGN = ptx.SMEM_ALIGN

    def mma(A, C, D):
        lane = cuda.threadIdx.x
        a0, a1, a2, a3 = A[lane, 0], A[lane, 1], A[lane, 2], A[lane, 3]
        b0, b1 = A[lane, 4], A[lane, 5]
        d = ptx.mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, C[lane, 0], C[lane, 1],
                                 C[lane, 2], C[lane, 3])
        e = ptx.mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, d[0], d[1], d[2], d[3])
        t = ptx.cvt_rna_tf32(C[lane, 4])
        f = ptx.mma_m16n8k8_tf32(t, a1, a2, a3, b0, b1, e[0], e[1], e[2], e[3])
        for i in range(4):
            D[lane, i] = f[i]

    def ldmatrix(M, out):
        lane = cuda.threadIdx.x
        s = cuda.shared.array((16, 24), uint16, alignment=_ALIGN)
        for i in range(lane, 256, 32):
            s[i // 16, i % 16] = M[i // 16, i % 16]
        cuda.syncthreads()
        a = ptx.smem_addr(s, (lane & 15, (lane >> 4) * 8))
        r = ptx.ldmatrix_x4(a)
        q = ptx.ldmatrix_x4_trans(a)
        x = ptx.ldmatrix_x2(a)
        y = ptx.ldmatrix_x2_trans(a)
        out[lane, 0] = r[0] + r[1] + r[2] + r[3]
        out[lane, 1] = q[0] + q[1] + q[2] + q[3]
        out[lane, 2] = x[0] + x[1] + y[0] + y[1]
        out[lane, 3] = ptx.ldmatrix_x1(a) + ptx.ldmatrix_x1_trans(a)

    def ldmatrix_dynamic(out):
        lane = cuda.threadIdx.x
        s = cuda.shared.array(0, uint16)
        r = ptx.ldmatrix_x4(ptx.smem_addr(s, lane * 8))
        out[lane, 0] = r[0] ^ r[1] ^ r[2] ^ r[3]

    def cp_async(G, n, out):
        lane = cuda.threadIdx.x
        s = cuda.shared.array((32, 8), uint16, alignment=_ALIGN)
        ptx.cp_async_16(ptx.smem_addr(s, (lane, 0)), G, (lane, 0))
        ptx.cp_async_commit()
        ptx.cp_async_16_zfill(ptx.smem_addr(s, (lane, 0)), G, (lane, 0), lane < n)
        ptx.cp_async_commit()
        ptx.cp_async_16_zfill_at(ptx.smem_addr(s, (lane, 0)), G, (0, 0), lane * G.strides[0], lane < n)
        ptx.cp_async_commit()
        ptx.cp_async_wait_group(2)
        ptx.cp_async_wait_group(0)
        ptx.cp_async_wait_all()
        cuda.syncthreads()
        out[lane] = s[31 - lane, 3]

    def global_loads(x, y):
        i = cuda.grid(1)
        ptx.fence_acq_rel_gpu()
        a, b, c, d = ptx.ld_global_cg_v4_f32(x, 4 * i)
        y[i] = a + b + c + d + ptx.ld_global_cg_f32(x, i)

    def nc_loads(x, y):
        i = cuda.grid(1)
        a, b, c, d = ptx.ld_global_nc_v4_b32(x, (i, 0))
        y[i] = a ^ b ^ c ^ d

    def convert(x, u, y):
        i = cuda.grid(1)
        p = ptx.pack_f16x2(x[2 * i], x[2 * i + 1])
        q = ptx.pack_bf16x2(x[2 * i], x[2 * i + 1])
        a, b = ptx.unpack_f16x2(p)
        c, d = ptx.unpack_bf16x2(q)
        u[i] = p ^ q
        y[i] = ptx.ex2_approx(a + b + c + d)

    kernels = {
        "mma": (mma, "void(uint32[:, :], float32[:, :], float32[:, :])"),
        "ldmatrix": (ldmatrix, "void(uint16[:, :], uint32[:, :])"),
        "ldmatrix_dynamic": (ldmatrix_dynamic, "void(uint32[:, :])"),
        "cp_async": (cp_async, "void(uint16[:, :], int32, uint16[:])"),
        "convert": (convert, "void(float32[:], uint32[:], float32[:])"),
        "global_loads": (global_loads, "void(float32[:], float32[:])"),
        "nc_loads": (nc_loads, "void(uint16[:, :], uint32[:])"),
    }
    result = {}
    for name, (fn, sig) in kernels.items():
        try:
            result[name], _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        except NvvmSupportError as e:
            print("NVVM unavailable:", e, file=sys.stderr)
            sys.exit(77)
    print(json.dumps(result))
    '''
)


@pytest.fixture(scope="module")
def ptx_text():
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, cwd=REPO,
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode == 77:
        pytest.skip("libNVVM is not available: " + proc.stderr.strip()[-300:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


EXPECTED = {
    "mma": [
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ",
        "cvt.rna.tf32.f32 ",
    ],
    "ldmatrix": [
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {",
        ".shared .align 128 .b8",
    ],
    "ldmatrix_dynamic": ["ldmatrix.sync.aligned.m8n8.x4.shared.b16 {"],
    "cp_async": [
        "cp.async.commit_group;",
        "cp.async.wait_group 2;",
        "cp.async.wait_group 0;",
        "cp.async.wait_all;",
    ],
    "global_loads": ["fence.acq_rel.gpu;", "ld.global.cg.v4.f32 {", "ld.global.cg.f32 "],
    "nc_loads": ["ld.global.nc.v4.b32 {"],
    "convert": [
        "cvt.rn.f16x2.f32 ",
        "cvt.rn.bf16x2.f32 ",
        "cvt.f32.f16 ",
        "ex2.approx.ftz.f32 ",
    ],
}


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_instructions_present(ptx_text, kernel):
    text = ptx_text[kernel]
    for needle in EXPECTED[kernel]:
        assert needle in text, f"{needle!r} missing from the PTX of {kernel}"


def test_cp_async_operands(ptx_text):
    text = ptx_text["cp_async"]
    # a 32-bit shared address and a 64-bit global address; zfill adds src-size
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16;", text)
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16, %r\d+;", text)


def test_ldmatrix_address_is_32_bit(ptx_text):
    for kernel in ("ldmatrix", "ldmatrix_dynamic"):
        assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16 "
                         r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, \[%r\d+\];", ptx_text[kernel])


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_no_local_memory(ptx_text, kernel):
    text = ptx_text[kernel]
    assert "ld.local" not in text and "st.local" not in text
    assert "__local_depot" not in text

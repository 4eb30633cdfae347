"""Inline-PTX intrinsics for tensor-core kernels: the only place PTX lives.

numba has no tensor-core API, so this module emits the few PTX instructions a
FlashAttention-2-style kernel needs through ``numba.cuda.extending.intrinsic``
and llvmlite's ``ir.InlineAsm`` (the same pattern as numba-cuda's own
``numba/cuda/cache_hints.py``).  Every operand and result is a scalar
(``uint32`` / ``float32``); intrinsics that produce several registers return a
``UniTuple``, so fragments stay in registers and never touch local memory.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, ``SIMULATOR`` True) every
public name is bound instead to a pure-Python twin from
``numba_flash._ptx_sim`` with identical semantics and fragment layouts, so the
same kernel source runs on the CPU.  The warp-collective twins (``mma_*``,
``ldmatrix_*``) exchange the 32 lanes' registers through a per-block, per-warp
rendezvous.  Warp shuffles and ``syncwarp`` are not here: use numba's
``cuda.shfl_*_sync``/``cuda.syncwarp`` (``numba_flash._numba_cuda`` adds
simulator twins of those).

Conventions used in all docstrings
----------------------------------
* ``lane = threadIdx-linear % 32``, ``g = lane >> 2`` ("groupID"),
  ``t = lane & 3`` ("threadID_in_group"), as in the PTX ISA figures.
* A ``uint32`` register holding two 16-bit values ("x2" packing) keeps the
  element with the LOWER column/row index in the LOW 16 bits.
* Arguments documented as ``uint32`` accept any integer type (they are
  truncated to 32 bits); ``float32`` arguments accept any number type.
  ``uint32`` results are numba ``uint32`` on the GPU and non-negative Python
  ints in the simulator.

m16n8k16 fragment layouts (fp16 and bf16; ``A`` is 16x16 row-major M x K,
``B`` is 16x8 K x N ("col": B^T is row-major), ``C``/``D`` are 16x8 fp32)::

    a0 = A[g  , 2t:2t+2]     a1 = A[g+8, 2t:2t+2]
    a2 = A[g  , 2t+8:2t+10]  a3 = A[g+8, 2t+8:2t+10]
    b0 = B[2t:2t+2,   g]     b1 = B[2t+8:2t+10, g]
    c0 = C[g, 2t]   c1 = C[g, 2t+1]   c2 = C[g+8, 2t]   c3 = C[g+8, 2t+1]

ldmatrix (m8n8, b16): lanes ``8i..8i+7`` give the shared addresses of the 8
rows (16 bytes each) of matrix ``i``; register ``ri`` of lane ``lane`` receives
``M_i[g, 2t:2t+2]`` (``.trans``: ``M_i[2t:2t+2, g]``, i.e. the transposed
matrix).  Feeding mma from row-major 16-bit shared tiles ``sQ[m][k]``,
``sK[n][k]`` and ``sV[k][n]`` (any row stride that keeps rows 16-byte aligned)::

    # A operand, 16x16 tile at (m0, k0):       a0, a1, a2, a3 = ldmatrix_x4(
    #     smem_addr(sQ, (m0 + (lane & 15), k0 + (lane >> 4) * 8)))
    # B operand from K (S = Q K^T), n-tiles n0 and n0+8 at k0:
    #     b0_n0, b1_n0, b0_n8, b1_n8 = ldmatrix_x4(
    #     smem_addr(sK, (n0 + (lane & 7) + ((lane >> 4) << 3), k0 + ((lane >> 3) & 1) * 8)))
    # B operand from V (O = P V), k-tile k0, n-tiles n0 and n0+8:
    #     b0_n0, b1_n0, b0_n8, b1_n8 = ldmatrix_x4_trans(
    #     smem_addr(sV, (k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8)))

Accumulators become A operands in registers (P = softmax(S) feeding P V):
the m16n8 accumulators of the two n-tiles covering S columns ``16kk..16kk+15``
are, once packed, the A fragment of the K-slice ``kk`` of the next mma:
``a0 = pack_f16x2(c0, c1)`` and ``a1 = pack_f16x2(c2, c3)`` of the first
n-tile, ``a2``/``a3`` likewise of the second.  These recipes are exercised by
``tests/test_ptx.py::test_ldmatrix_mma_attention_tile``.

Shared-memory alignment: ldmatrix rows and cp.async destinations must be
16-byte aligned, but numba aligns a ``cuda.shared.array`` only to its dtype
(2 bytes for fp16) and the simulator rejects ``alignment=``.  Bind
``SMEM_ALIGN`` (128 on the GPU, None in the simulator) to a module-level global
of the kernel's module -- numba types a global int as a literal, but
``ptx.SMEM_ALIGN`` (a module attribute) as a plain int64, which
``cuda.shared.array`` refuses::

    _ALIGN = ptx.SMEM_ALIGN
    ...
    sK = cuda.shared.array((64, 64), float16, alignment=_ALIGN)
"""

from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

from numba_flash._numba_cuda import SIMULATOR, device_function, uint64

try:  # numba-cuda keeps its own copy of numba's errors
    from numba.cuda.core.errors import NumbaTypeError as _TypeError
except ImportError:  # pragma: no cover
    from numba.core.errors import NumbaTypeError as _TypeError

__all__ = [
    "SMEM_ALIGN",
    "st_shared_v4_b32",
    "mma_m16n8k16_f16",
    "mma_m16n8k16_bf16",
    "mma_m16n8k16_f16_acc",
    "mma_m16n8k16_bf16_acc",
    "mma_m16n8k8_tf32",
    "mma_m16n8k8_tf32_acc",
    "cvt_rna_tf32",
    "ldmatrix_x1",
    "ldmatrix_x2",
    "ldmatrix_x4",
    "ldmatrix_x1_trans",
    "ldmatrix_x2_trans",
    "ldmatrix_x4_trans",
    "smem_addr",
    "cp_async_16",
    "cp_async_16_zfill",
    "cp_async_16_zfill_at",
    "cp_async_commit",
    "cp_async_wait_group",
    "cp_async_wait_all",
    "pack_f16x2",
    "pack_bf16x2",
    "unpack_f16x2",
    "unpack_bf16x2",
    "ex2_approx",
    "tanh_approx",
    "mul_wide_u32",
    "prmt",
    "ld_shared_v4_f32",
    "st_shared_v4_f32",
    "ld_shared_v4_b32",
    "st_shared_b32",
    "st_global_v4_b32",
    "ld_global_cg_f32",
    "ld_global_cg_v4_f32",
    "ld_global_nc_v4_b32",
    "fence_acq_rel_gpu",
    "sm_clock",
    "global_timer_lo",
]

#: ``alignment=`` for ``cuda.shared.array`` tiles used with ldmatrix/cp.async:
#: 128 bytes on the GPU (16 are required; 128 keeps swizzled rows on bank
#: boundaries); None in the simulator, which refuses the argument.
SMEM_ALIGN = None if SIMULATOR else 128

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_F32x2 = types.UniTuple(types.float32, 2)
_F32x4 = types.UniTuple(types.float32, 4)

# ---------------------------------------------------------------------------
# codegen helpers
# ---------------------------------------------------------------------------


def _require_ints(fname, **tys):
    for name, ty in tys.items():
        if not isinstance(ty, (types.Integer, types.Boolean)):
            raise _TypeError(f"{fname}: {name} must be an integer, got {ty}")


def _require_numbers(fname, **tys):
    for name, ty in tys.items():
        if not isinstance(ty, (types.Integer, types.Float, types.Boolean)):
            raise _TypeError(f"{fname}: {name} must be a number, got {ty}")


def _casted(context, builder, sig, args, kinds):
    """Cast each argument to the LLVM type of its kind ('u32' or 'f32')."""
    target = {"u32": types.uint32, "f32": types.float32}
    return [
        context.cast(builder, v, ty, target[k])
        for v, ty, k in zip(args, sig.args, kinds)
    ]


def _asm(builder, text, constraints, args, outs, side_effect=False, pure=False,
         convergent=False, readonly=False):
    """Emit one inline-asm call; return a list of its results (maybe empty).

    ``outs`` lists the LLVM types of the outputs.  ``pure`` marks the call
    ``readnone`` so LLVM may schedule, CSE or drop it like arithmetic;
    ``readonly`` (a load of data no thread writes during the kernel) lets LLVM
    move it past other loads and unrolled iterations, not past stores;
    ``convergent`` (warp-collective ``.sync.aligned`` instructions) forbids
    LLVM to make it control-dependent on more values (e.g. duplicate it into
    the arms of a branch), as clang does for CUDA inline asm.
    """
    if not outs:
        ret = ir.VoidType()
    elif len(outs) == 1:
        ret = outs[0]
    else:
        ret = ir.LiteralStructType(outs)
    fnty = ir.FunctionType(ret, [a.type for a in args])
    asm = ir.InlineAsm(fnty, text, constraints, side_effect=side_effect)
    attrs = ("nounwind",) + (("readnone",) if pure else ()) + (("readonly",) if readonly else ()) + (
        ("convergent",) if convergent else ())
    res = builder.call(asm, args, attrs=attrs)
    if not outs:
        return []
    if len(outs) == 1:
        return [res]
    return [builder.extract_value(res, i) for i in range(len(outs))]


def _element_pointer(context, builder, aryty, idxty, ary, idx):
    """Generic-space pointer to ``ary[idx]`` (idx: integer or tuple of them).

    No wraparound of negative indices and no bounds check: this is address
    arithmetic, as in C.
    """
    if isinstance(idxty, types.BaseTuple):
        idxtys = list(idxty)
        idxs = cgutils.unpack_tuple(builder, idx, len(idxtys))
    else:
        idxtys, idxs = [idxty], [idx]
    idxs = [context.cast(builder, v, t, types.intp) for v, t in zip(idxs, idxtys)]
    arystruct = context.make_array(aryty)(context, builder, value=ary)
    return cgutils.get_item_pointer(
        context, builder, aryty, arystruct, idxs, wraparound=False
    )


def _check_array_index(fname, ary, index):
    if not isinstance(ary, types.Array):
        raise _TypeError(f"{fname}: expected an array, got {ary}")
    if isinstance(index, types.BaseTuple):
        ok = len(index) == ary.ndim and all(
            isinstance(t, types.Integer) for t in index
        )
    else:
        ok = isinstance(index, types.Integer) and ary.ndim == 1
    if not ok:
        raise _TypeError(
            f"{fname}: index {index} does not index a {ary.ndim}-d array "
            "(give an integer for 1-d arrays, else a tuple of ndim integers)"
        )


def _unary_f32_codegen(text, constraints, out):
    """Codegen of a pure one-instruction asm on one float32 operand."""

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["f32"])
        return _asm(builder, text, constraints, vals, [out], pure=True)[0]

    return codegen


# ---------------------------------------------------------------------------
# mma.sync
# ---------------------------------------------------------------------------


def _mma_codegen(ptx_type, shape):
    text = (
        f"mma.sync.aligned.{shape}.row.col.f32.{ptx_type}.{ptx_type}.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )
    constraints = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32"] * 6 + ["f32"] * 4)
        outs = _asm(builder, text, constraints, vals, [_F32] * 4, pure=True,
                    convergent=True)
        return context.make_tuple(builder, sig.return_type, outs)

    return codegen


def _mma_typer(fname, args):
    names = ["a0", "a1", "a2", "a3", "b0", "b1", "c0", "c1", "c2", "c3"]
    named = dict(zip(names, args))
    _require_ints(fname, **{k: named[k] for k in names[:6]})
    _require_numbers(fname, **{k: named[k] for k in names[6:]})
    return _F32x4(*args)


@intrinsic
def mma_m16n8k16_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``

    Warp-wide ``D = A @ B + C`` via
    ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``.  All 32 lanes of the
    warp must call it together (converged).  A is 16x16 (M x K), B is 16x8
    (K x N), C and D are 16x8 fp32.

    a0..a3, b0, b1: uint32, each packing two fp16 (low half = lower index);
    c0..c3: float32; returns a UniTuple of 4 float32.  Per lane
    (g = lane >> 2, t = lane & 3)::

        a0 = A[g, 2t:2t+2]    a1 = A[g+8, 2t:2t+2]
        a2 = A[g, 2t+8:2t+10] a3 = A[g+8, 2t+8:2t+10]
        b0 = B[2t:2t+2, g]    b1 = B[2t+8:2t+10, g]
        c0/d0 = C[g, 2t]  c1/d1 = C[g, 2t+1]  c2/d2 = C[g+8, 2t]  c3/d3 = C[g+8, 2t+1]
    """
    args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
    return _mma_typer("mma_m16n8k16_f16", args), _mma_codegen("f16", "m16n8k16")


@intrinsic
def mma_m16n8k16_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``

    As ``mma_m16n8k16_f16`` but A and B hold bfloat16 pairs:
    ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``, with the same
    fragment layout (see ``mma_m16n8k16_f16`` and the module docstring).
    """
    args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
    return _mma_typer("mma_m16n8k16_bf16", args), _mma_codegen("bf16", "m16n8k16")


def _pointers(context, builder, aryty, idxty, ary, idx, count):
    """Pointers to ``ary[idx]`` … ``ary[idx + count - 1]`` (fragments in register arrays)."""
    idx = context.cast(builder, idx, idxty, types.intp)
    return [_element_pointer(context, builder, aryty, types.intp, ary, builder.add(idx, ir.Constant(idx.type, k)))
            for k in range(count)]  # fmt: skip


def _mma_acc_codegen(ptx_type, shape="m16n8k16"):
    """acc[i:i+4] = a[ai:ai+4] @ (b0, b1) + acc[i:i+4], through the mma's registers."""
    text = (
        f"mma.sync.aligned.{shape}.row.col.f32.{ptx_type}.{ptx_type}.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )
    constraints = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"

    def codegen(context, builder, sig, args):
        c_ptrs = _pointers(context, builder, sig.args[0], sig.args[1], args[0], args[1], 4)
        a_vals = [builder.load(p) for p in _pointers(context, builder, sig.args[2], sig.args[3], args[2], args[3], 4)]
        b_vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[4:], sig.args[4:])]
        c_vals = [builder.load(p) for p in c_ptrs]
        outs = _asm(builder, text, constraints, a_vals + b_vals + c_vals, [_F32] * 4,
                    pure=True, convergent=True)
        for p, v in zip(c_ptrs, outs):
            builder.store(v, p)
        return context.get_dummy_value()

    return codegen


def _require_fragment_arrays(fname, acc, a=None):
    """acc: a 1-d float32 (accumulator) array; a (when given): a 1-d uint32 (A fragment) array."""
    if not (isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.float32):
        raise _TypeError(f"{fname}: acc must be a 1-d float32 array, got {acc}")
    if a is not None and not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.uint32):
        raise _TypeError(f"{fname}: a must be a 1-d uint32 array, got {a}")


def _mma_acc_typer(fname, acc, i, a, ai, b0, b1):
    _require_fragment_arrays(fname, acc, a)
    _require_ints(fname, i=i, ai=ai, b0=b0, b1=b1)
    return types.void(acc, i, a, ai, b0, b1)


@intrinsic
def mma_m16n8k16_f16_acc(typingctx, acc, i, a, ai, b0, b1):
    """``mma_m16n8k16_f16_acc(acc, i, a, ai, b0, b1) -> None``

    ``mma_m16n8k16_f16`` on fragments kept in (register) arrays, accumulating in
    place: ``acc[i:i+4] += A @ B`` with A's fragment ``a[ai:ai+4]`` (uint32,
    a0..a3 as in ``mma_m16n8k16_f16``), B's ``b0, b1``, C/D ``acc[i:i+4]``
    (c0..c3).  ``acc`` and ``a`` are 1-d ``cuda.local.array`` objects; with
    compile-time indices (unrolled loops) they stay in registers.  One line of a
    kernel per mma instead of a call and four stores.
    """
    return _mma_acc_typer("mma_m16n8k16_f16_acc", acc, i, a, ai, b0, b1), _mma_acc_codegen("f16")


@intrinsic
def mma_m16n8k16_bf16_acc(typingctx, acc, i, a, ai, b0, b1):
    """``mma_m16n8k16_bf16_acc(acc, i, a, ai, b0, b1) -> None``

    As ``mma_m16n8k16_f16_acc`` with bfloat16 fragments
    (``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``).
    """
    return _mma_acc_typer("mma_m16n8k16_bf16_acc", acc, i, a, ai, b0, b1), _mma_acc_codegen("bf16")


@intrinsic
def mma_m16n8k8_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma_m16n8k8_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``

    Warp-wide ``D = A @ B + C`` with TF32 inputs:
    ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``.  A is 16x8, B is
    8x8, C/D 16x8 fp32.  a*/b* are uint32 holding one tf32 each (fp32 bits, of
    which the hardware uses the top 19; round with ``cvt_rna_tf32``); c*
    float32.  Per lane (g = lane >> 2, t = lane & 3)::

        a0 = A[g, t]   a1 = A[g+8, t]   a2 = A[g, t+4]   a3 = A[g+8, t+4]
        b0 = B[t, g]   b1 = B[t+4, g]
        c0/d0 = C[g, 2t]  c1/d1 = C[g, 2t+1]  c2/d2 = C[g+8, 2t]  c3/d3 = C[g+8, 2t+1]
    """
    args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
    return _mma_typer("mma_m16n8k8_tf32", args), _mma_codegen("tf32", "m16n8k8")


@intrinsic
def mma_m16n8k8_tf32_acc(typingctx, acc, i, a, ai, b0, b1):
    """``mma_m16n8k8_tf32_acc(acc, i, a, ai, b0, b1) -> None``

    ``mma_m16n8k8_tf32`` on fragments kept in (register) arrays, accumulating in
    place, as ``mma_m16n8k16_f16_acc``: ``acc[i:i+4] += A @ B`` with A's fragment
    ``a[ai:ai+4]`` (uint32 tf32 bit patterns, a0..a3 as in ``mma_m16n8k8_tf32``:
    ``A[g, t], A[g+8, t], A[g, t+4], A[g+8, t+4]``), B's ``b0 = B[t, g]``,
    ``b1 = B[t+4, g]`` and C/D ``acc[i:i+4]``
    (``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``).
    """
    return _mma_acc_typer("mma_m16n8k8_tf32_acc", acc, i, a, ai, b0, b1), _mma_acc_codegen("tf32", "m16n8k8")


@intrinsic
def cvt_rna_tf32(typingctx, x):
    """``cvt_rna_tf32(x: float32) -> uint32``

    ``cvt.rna.tf32.f32``: round an fp32 value to TF32 (10 mantissa bits,
    round to nearest, ties away from zero); the result is the fp32 bit pattern
    with its low 13 bits zero, ready as an ``mma_m16n8k8_tf32`` operand.
    """
    _require_numbers("cvt_rna_tf32", x=x)
    return types.uint32(x), _unary_f32_codegen("cvt.rna.tf32.f32 $0, $1;", "=r,f", _I32)


# ---------------------------------------------------------------------------
# shared-memory addresses and ldmatrix
# ---------------------------------------------------------------------------


@intrinsic
def smem_addr(typingctx, array, index):
    """``smem_addr(array, index) -> uint32``

    The 32-bit shared-state-space address (what ``cvta.to.shared`` gives, the
    operand ``ldmatrix``/``cp.async`` take) of ``array[index]``, where
    ``array`` is a ``cuda.shared.array`` (static or dynamic) or a view of one
    and ``index`` an integer (1-d) or a tuple of ndim integers.  Negative
    indices are NOT wrapped.  Compute it once per tile and add byte offsets
    (``+ row * row_bytes + col * 2``) with integer arithmetic; the result stays
    a valid address in the simulator too.  Implemented as an LLVM
    ``addrspacecast`` generic->shared (addrspace 3) plus ``ptrtoint``; NVVM
    folds the casts, leaving the shared symbol's address plus the offset (no
    ``cvta``).  Passing a non-shared array is undefined on the GPU (the
    simulator raises).
    """
    _check_array_index("smem_addr", array, index)

    def codegen(context, builder, sig, args):
        aryty, idxty = sig.args
        ptr = _element_pointer(context, builder, aryty, idxty, *args)
        sptr = builder.addrspacecast(
            ptr, ir.PointerType(ptr.type.pointee, addrspace=3)
        )
        return builder.ptrtoint(sptr, _I32)

    return types.uint32(array, index), codegen


def _ldmatrix(num, trans):
    regs = ", ".join(f"${i}" for i in range(num))
    text = (
        f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}"
        f".shared.b16 {{{regs}}}, [${num}];"
    )
    constraints = ",".join(["=r"] * num + ["r", "~{memory}"])
    ret = types.uint32 if num == 1 else types.UniTuple(types.uint32, num)

    def typer(fname, addr):
        _require_ints(fname, addr=addr)
        return ret(addr)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32"])
        outs = _asm(builder, text, constraints, vals, [_I32] * num,
                    side_effect=True, convergent=True)
        return outs[0] if num == 1 else context.make_tuple(builder, ret, outs)

    return typer, codegen


def _ldmatrix_intrinsic(num, trans, doc):
    """The ``ldmatrix`` intrinsic of ``num`` matrices (``.trans`` when ``trans``)."""
    name = f"ldmatrix_x{num}{'_trans' if trans else ''}"
    typer, codegen = _ldmatrix(num, trans)

    def impl(typingctx, addr):
        return typer(name, addr), codegen

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = doc
    return intrinsic(impl)


ldmatrix_x4 = _ldmatrix_intrinsic(4, False, """``ldmatrix_x4(addr: uint32) -> (r0, r1, r2, r3)``

    ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: the warp loads four 8x8
    matrices of 16-bit elements from shared memory.  Lane ``8i + j`` gives in
    ``addr`` the shared address (``smem_addr``) of row ``j`` of matrix ``i``
    (8 contiguous 16-bit elements, 16-byte aligned).  Lane ``lane`` receives
    ``ri = M_i[g, 2t] | M_i[g, 2t+1] << 16`` (g = lane >> 2, t = lane & 3),
    i.e. exactly the mma A/B fragment layout (see module docstring for the
    Q/K address recipes).
    """)
ldmatrix_x4_trans = _ldmatrix_intrinsic(4, True, """``ldmatrix_x4_trans(addr: uint32) -> (r0, r1, r2, r3)``

    ``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``: as ``ldmatrix_x4``
    (lane ``8i + j`` addresses row ``j`` of matrix ``i``) but each matrix is
    delivered transposed: ``ri = M_i[2t, g] | M_i[2t+1, g] << 16``.  Used for
    the V operand of ``P @ V`` with V row-major [k][n] in shared memory.
    """)
ldmatrix_x2 = _ldmatrix_intrinsic(2, False, """``ldmatrix_x2(addr: uint32) -> (r0, r1)``

    ``ldmatrix.sync.aligned.m8n8.x2.shared.b16``: two 8x8 matrices; lanes
    0-15 give row addresses (lane ``8i + j``: row ``j`` of matrix ``i``), the
    addresses of lanes 16-31 are ignored (all 32 lanes still execute it).
    ``ri = M_i[g, 2t] | M_i[g, 2t+1] << 16``.
    """)
ldmatrix_x2_trans = _ldmatrix_intrinsic(2, True, """``ldmatrix_x2_trans(addr: uint32) -> (r0, r1)``

    ``ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16``: as ``ldmatrix_x2``,
    transposed: ``ri = M_i[2t, g] | M_i[2t+1, g] << 16``.
    """)
ldmatrix_x1 = _ldmatrix_intrinsic(1, False, """``ldmatrix_x1(addr: uint32) -> r0``

    ``ldmatrix.sync.aligned.m8n8.x1.shared.b16``: one 8x8 matrix; lanes 0-7
    give the row addresses (others ignored).  Returns one uint32 (not a
    tuple): ``r0 = M[g, 2t] | M[g, 2t+1] << 16``.
    """)
ldmatrix_x1_trans = _ldmatrix_intrinsic(1, True, """``ldmatrix_x1_trans(addr: uint32) -> r0``

    ``ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16``: as ``ldmatrix_x1``,
    transposed: ``r0 = M[2t, g] | M[2t+1, g] << 16``.
    """)


# ---------------------------------------------------------------------------
# cp.async
# ---------------------------------------------------------------------------


def _global_ptr(context, builder, sig, args, at=1):
    """i64 global-space address of array[index] (args[at], args[at + 1]: the source
    of cp.async, the destination of st.global)."""
    aryty, idxty = sig.args[at], sig.args[at + 1]
    ptr = _element_pointer(context, builder, aryty, idxty, args[at], args[at + 1])
    gptr = builder.addrspacecast(
        ptr, ir.PointerType(ptr.type.pointee, addrspace=1)
    )
    return builder.ptrtoint(gptr, _I64)


@intrinsic
def cp_async_16(typingctx, dst, src, index):
    """``cp_async_16(dst: uint32, src: array, index) -> None``

    ``cp.async.cg.shared.global [dst], [src + index], 16;``: start an
    asynchronous 16-byte copy (L2 only, bypassing L1) from global
    ``src[index]`` (a device array; ``index`` an integer or ndim-tuple; the
    element's address must be 16-byte aligned) to the shared address ``dst``
    (from ``smem_addr``, 16-byte aligned).  The copy belongs to the current
    group: close it with ``cp_async_commit`` and wait with
    ``cp_async_wait_group``/``cp_async_wait_all``; the data is then visible
    to the issuing thread only, so ``cuda.syncthreads()`` before other
    threads read it.
    """
    _require_ints("cp_async_16", dst=dst)
    _check_array_index("cp_async_16", src, index)

    def codegen(context, builder, sig, args):
        d = context.cast(builder, args[0], sig.args[0], types.uint32)
        s = _global_ptr(context, builder, sig, args)
        _asm(builder, "cp.async.cg.shared.global [$0], [$1], 16;",
             "r,l,~{memory}", [d, s], [], side_effect=True)
        return context.get_dummy_value()

    return types.void(dst, src, index), codegen


@intrinsic
def cp_async_16_zfill(typingctx, dst, src, index, pred):
    """``cp_async_16_zfill(dst: uint32, src: array, index, pred) -> None``

    ``cp.async.cg.shared.global [dst], [src + index], 16, src_size;`` with
    ``src_size = 16 if pred else 0``: like ``cp_async_16`` when ``pred`` is
    true; when false nothing is read and the 16 destination bytes are filled
    with zeros (out-of-range rows of a tile).  ``src[index]`` should still be
    an in-bounds address (clamp the row), though no byte is read from it.
    """
    _require_ints("cp_async_16_zfill", dst=dst, pred=pred)
    _check_array_index("cp_async_16_zfill", src, index)

    def codegen(context, builder, sig, args):
        d = context.cast(builder, args[0], sig.args[0], types.uint32)
        s = _global_ptr(context, builder, sig, args)
        p = context.cast(builder, args[3], sig.args[3], types.boolean)
        size = builder.select(p, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
        _asm(builder, "cp.async.cg.shared.global [$0], [$1], 16, $2;",
             "r,l,r,~{memory}", [d, s, size], [], side_effect=True)
        return context.get_dummy_value()

    return types.void(dst, src, index, pred), codegen


@intrinsic
def cp_async_16_zfill_at(typingctx, dst, src, index, offset, pred):
    """``cp_async_16_zfill_at(dst: uint32, src: array, index, offset, pred) -> None``

    ``cp_async_16_zfill`` from the address of ``src[index]`` plus ``offset``
    bytes (an integer, e.g. a multiple of ``src.strides[1]``): a loop over the
    rows of a tile computes the element's address once and adds a byte count
    a row, instead of a product of every index with its stride a copy.  The
    address must stay inside ``src`` and be 16-byte aligned (not checked on
    the GPU; the simulator twin checks both).
    """
    _require_ints("cp_async_16_zfill_at", dst=dst, offset=offset, pred=pred)
    _check_array_index("cp_async_16_zfill_at", src, index)

    def codegen(context, builder, sig, args):
        d = context.cast(builder, args[0], sig.args[0], types.uint32)
        s = builder.add(_global_ptr(context, builder, sig, args),
                        context.cast(builder, args[3], sig.args[3], types.int64))
        p = context.cast(builder, args[4], sig.args[4], types.boolean)
        size = builder.select(p, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
        _asm(builder, "cp.async.cg.shared.global [$0], [$1], 16, $2;",
             "r,l,r,~{memory}", [d, s, size], [], side_effect=True)
        return context.get_dummy_value()

    return types.void(dst, src, index, offset, pred), codegen


@intrinsic
def cp_async_commit(typingctx):
    """``cp_async_commit() -> None``

    ``cp.async.commit_group;``: close the current group of this thread's
    ``cp_async_16*`` copies (an empty group is allowed).
    """

    def codegen(context, builder, sig, args):
        _asm(builder, "cp.async.commit_group;", "~{memory}", [], [],
             side_effect=True)
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cp_async_wait_group(typingctx, n):
    """``cp_async_wait_group(n) -> None``  (n: compile-time integer constant)

    ``cp.async.wait_group n;``: wait until at most ``n`` of this thread's
    committed groups are still pending (``n = 0``: all committed groups are
    complete; uncommitted copies are not waited for).  Follow with
    ``cuda.syncthreads()`` before other threads read the data.
    """
    if not isinstance(n, types.IntegerLiteral):
        # numba retries with literal argument types when this returns None;
        # a non-constant n then fails to type.
        return None
    count = int(n.literal_value)
    if not 0 <= count <= 7:
        raise _TypeError(f"cp_async_wait_group: n must be in 0..7, got {count}")

    def codegen(context, builder, sig, args):
        _asm(builder, f"cp.async.wait_group {count};", "~{memory}", [], [],
             side_effect=True)
        return context.get_dummy_value()

    return types.void(n), codegen


@intrinsic
def cp_async_wait_all(typingctx):
    """``cp_async_wait_all() -> None``

    ``cp.async.wait_all;`` (= ``commit_group`` + ``wait_group 0``): wait for
    all of this thread's copies, committed or not.
    """

    def codegen(context, builder, sig, args):
        _asm(builder, "cp.async.wait_all;", "~{memory}", [], [],
             side_effect=True)
        return context.get_dummy_value()

    return types.void(), codegen


# ---------------------------------------------------------------------------
# conversions and math
# ---------------------------------------------------------------------------


def _pack(ptx_type):
    # PTX: cvt.rn.f16x2.f32 d, a, b puts cvt(a) in d[31:16] and cvt(b) in
    # d[15:0], so the HIGH value is the first source operand.
    text = f"cvt.rn.{ptx_type}x2.f32 $0, $2, $1;"

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["f32", "f32"])
        return _asm(builder, text, "=r,f,f", vals, [_I32], pure=True)[0]

    return codegen


@intrinsic
def pack_f16x2(typingctx, lo, hi):
    """``pack_f16x2(lo: float32, hi: float32) -> uint32``

    ``cvt.rn.f16x2.f32 d, hi, lo;`` (PTX puts the FIRST source in the UPPER
    half): both values rounded to fp16 (nearest-even, overflow to inf), ``lo``
    in bits 0-15, ``hi`` in bits 16-31 -- the element order mma fragments use.
    """
    _require_numbers("pack_f16x2", lo=lo, hi=hi)
    return types.uint32(lo, hi), _pack("f16")


@intrinsic
def pack_bf16x2(typingctx, lo, hi):
    """``pack_bf16x2(lo: float32, hi: float32) -> uint32``

    ``cvt.rn.bf16x2.f32 d, hi, lo;``: both values rounded to bfloat16
    (nearest-even), ``lo`` in bits 0-15, ``hi`` in bits 16-31.
    """
    _require_numbers("pack_bf16x2", lo=lo, hi=hi)
    return types.uint32(lo, hi), _pack("bf16")


@intrinsic
def unpack_f16x2(typingctx, u):
    """``unpack_f16x2(u: uint32) -> (lo: float32, hi: float32)``

    Inverse of ``pack_f16x2`` (exact): the fp16 in bits 0-15 and bits 16-31
    widened to float32.  Emitted as LLVM ``bitcast``/``fpext half`` which
    NVVM lowers to ``mov.b32 {lo, hi}`` + ``cvt.f32.f16``.
    """
    _require_ints("unpack_f16x2", u=u)

    def codegen(context, builder, sig, args):
        (v,) = _casted(context, builder, sig, args, ["u32"])
        i16 = ir.IntType(16)
        half = ir.HalfType()
        lo = builder.bitcast(builder.trunc(v, i16), half)
        hi = builder.bitcast(builder.trunc(builder.lshr(v, ir.Constant(_I32, 16)), i16), half)
        outs = [builder.fpext(lo, _F32), builder.fpext(hi, _F32)]
        return context.make_tuple(builder, sig.return_type, outs)

    return _F32x2(u), codegen


@intrinsic
def unpack_bf16x2(typingctx, u):
    """``unpack_bf16x2(u: uint32) -> (lo: float32, hi: float32)``

    Inverse of ``pack_bf16x2`` (exact): a bfloat16 is the top half of an
    fp32, so ``lo = bits(u << 16)`` and ``hi = bits(u & 0xFFFF0000)``
    (plain integer ops, no PTX cvt needed).
    """
    _require_ints("unpack_bf16x2", u=u)

    def codegen(context, builder, sig, args):
        (v,) = _casted(context, builder, sig, args, ["u32"])
        lo = builder.bitcast(builder.shl(v, ir.Constant(_I32, 16)), _F32)
        hi = builder.bitcast(builder.and_(v, ir.Constant(_I32, 0xFFFF0000)), _F32)
        return context.make_tuple(builder, sig.return_type, [lo, hi])

    return _F32x2(u), codegen


@intrinsic
def ex2_approx(typingctx, x):
    """``ex2_approx(x: float32) -> float32``

    ``ex2.approx.ftz.f32``: 2**x on the SFU, approximate to a few ulp (within
    2e-6 relative of exp2 in the tests), subnormal inputs and results flushed
    to zero; ex2(-inf) = 0.  Use with ``x * log2(e)`` pre-scaled scores for
    softmax.  The simulator twin computes exp2 in float32 (with the ftz).
    """
    _require_numbers("ex2_approx", x=x)
    return types.float32(x), _unary_f32_codegen("ex2.approx.ftz.f32 $0, $1;", "=f,f", _F32)


@intrinsic
def tanh_approx(typingctx, x):
    """``tanh_approx(x: float32) -> float32``

    ``tanh.approx.f32`` (sm_75+): tanh on the SFU, relative error about 2**-11 (as
    FlashAttention-2's softcap, through CUTLASS's ``fast_tanh``); tanh(±inf) = ±1,
    NaN stays NaN.  The tensor-core kernels' softcap.  The simulator twin computes
    tanh in float32.
    """
    _require_numbers("tanh_approx", x=x)
    return types.float32(x), _unary_f32_codegen("tanh.approx.f32 $0, $1;", "=f,f", _F32)


# ---------------------------------------------------------------------------
# 32-bit integer words (the dropout bits)
# ---------------------------------------------------------------------------
#
# numba types every integer operation on uint32 operands as 64-bit (int64), so a
# product of two 32-bit words is a 64-bit multiply unless LLVM proves the operands
# narrow.  These two keep the dropout's words in 32-bit registers.


@intrinsic
def mul_wide_u32(typingctx, a, b):
    """``mul_wide_u32(a: uint32, b: uint32) -> (hi: uint32, lo: uint32)``

    ``mul.wide.u32 p, a, b; mov.b64 {lo, hi}, p;``: the high and low 32-bit halves of
    the 64-bit product (one ``IMAD.WIDE.U32``): Philox's ``mulhilo32``.
    """
    _require_ints("mul_wide_u32", a=a, b=b)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32", "u32"])
        text = "{ .reg .u64 p; mul.wide.u32 p, $2, $3; mov.b64 {$1, $0}, p; }"
        outs = _asm(builder, text, "=r,=r,r,r", vals, [_I32, _I32], pure=True)
        return context.make_tuple(builder, sig.return_type, outs)

    return types.UniTuple(types.uint32, 2)(a, b), codegen


@intrinsic
def prmt(typingctx, a, b, selector):
    """``prmt(a: uint32, b: uint32, selector: uint32) -> uint32``

    ``prmt.b32 d, a, b, selector;`` (default mode): byte ``i`` of ``d`` is chosen by
    nibble ``i`` of ``selector`` from the eight bytes ``b:a`` (0–3 are a's, 4–7 b's,
    by the nibble's low 3 bits); a nibble with bit 3 set replicates that byte's sign
    bit into all 8 bits.  So ``prmt(x, 0, 0x9988)`` is 0xFFFF in the low half where
    bit 7 of x is set and in the high half where bit 15 is: the dropout's keep bits
    of two bytes widened to a mask of two 16-bit values.
    """
    _require_ints("prmt", a=a, b=b, selector=selector)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32", "u32", "u32"])
        return _asm(builder, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", vals, [_I32], pure=True)[0]

    return types.uint32(a, b, selector), codegen


# ---------------------------------------------------------------------------
# vectorised shared- and global-memory access (the fp32 SIMT kernels, epilogues)
# ---------------------------------------------------------------------------


def _ld_shared_v4(kind, doc):
    """An intrinsic ``ld_shared_v4_{kind}(addr) -> 4-tuple``: ``ld.shared.v4.{kind}`` of
    four 32-bit values (``f32``: float32, ``b32``: uint32 words) at a 16-byte-aligned
    shared address, ordered with memory (a clobber); ``doc`` its docstring."""
    reg, ty, ret = {"f32": ("f", _F32, types.float32), "b32": ("r", _I32, types.uint32)}[kind]

    @intrinsic
    def impl(typingctx, addr):
        _require_ints(f"ld_shared_v4_{kind}", addr=addr)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], types.uint32)
            vals = _asm(builder, f"ld.shared.v4.{kind} {{$0, $1, $2, $3}}, [$4];",
                        f"={reg},={reg},={reg},={reg},r,~{{memory}}", [a], [ty] * 4)
            return context.make_tuple(builder, sig.return_type, vals)

        return types.UniTuple(ret, 4)(addr), codegen

    impl.__doc__ = doc
    return impl


ld_shared_v4_f32 = _ld_shared_v4("f32", """``ld_shared_v4_f32(addr: uint32) -> (f32, f32, f32, f32)``

    ``ld.shared.v4.f32 {$0, $1, $2, $3}, [addr];``: four consecutive float32
    from the shared address ``addr`` (from ``smem_addr``; 16-byte aligned) in
    one 16-byte load.  numba cannot prove a ``cuda.shared.array`` element
    16-byte aligned, so it never emits vector loads itself; a register-blocked
    (SGEMM-style) kernel needs them to keep one load per 4--8 FMAs.  Carries a
    memory clobber, so it is ordered with ``syncthreads`` and with stores.
    """)


@intrinsic
def st_shared_v4_f32(typingctx, addr, x0, x1, x2, x3):
    """``st_shared_v4_f32(addr: uint32, x0, x1, x2, x3: float32) -> None``

    ``st.shared.v4.f32 [addr], {x0, x1, x2, x3};``: one 16-byte store of four
    float32 to the 16-byte-aligned shared address ``addr``.
    """
    _require_ints("st_shared_v4_f32", addr=addr)
    _require_numbers("st_shared_v4_f32", x0=x0, x1=x1, x2=x2, x3=x3)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32"] + ["f32"] * 4)
        _asm(builder, "st.shared.v4.f32 [$0], {$1, $2, $3, $4};",
             "r,f,f,f,f,~{memory}", vals, [], side_effect=True)
        return context.get_dummy_value()

    return types.void(addr, x0, x1, x2, x3), codegen


@intrinsic
def st_shared_v4_b32(typingctx, addr, w0, w1, w2, w3):
    """``st_shared_v4_b32(addr: uint32, w0, w1, w2, w3: uint32) -> None``

    ``st.shared.v4.b32 [addr], {w0, w1, w2, w3};``: one 16-byte store of four 32-bit
    words to the 16-byte-aligned shared address ``addr`` (a 16-byte chunk of a tile
    filled by plain loads where ``cp.async`` cannot read the source: rows that are
    not 16-byte aligned).
    """
    _require_ints("st_shared_v4_b32", addr=addr, w0=w0, w1=w1, w2=w2, w3=w3)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32"] * 5)
        _asm(builder, "st.shared.v4.b32 [$0], {$1, $2, $3, $4};",
             "r,r,r,r,r,~{memory}", vals, [], side_effect=True)
        return context.get_dummy_value()

    return types.void(addr, w0, w1, w2, w3), codegen


ld_shared_v4_b32 = _ld_shared_v4("b32", """``ld_shared_v4_b32(addr: uint32) -> (uint32, uint32, uint32, uint32)``

    ``ld.shared.v4.b32 {$0, $1, $2, $3}, [addr];``: one 16-byte load of four 32-bit
    words from the 16-byte-aligned shared address ``addr`` (a staged 16-byte chunk of
    packed 16-bit pairs on its way to ``st_global_v4_b32``).  Memory clobber, as
    ``ld_shared_v4_f32``.
    """)


def _u32_pair_asm(fname, text, names, doc, convergent=False):
    """An intrinsic ``fname(a, b) -> None`` emitting ``text`` on two uint32 operands
    (``$0``, ``$1``; ``names`` name them in errors), ordered with memory (a clobber),
    ``convergent`` for barriers every lane of a warp reaches together; ``doc`` its
    docstring."""

    @intrinsic
    def impl(typingctx, a, b):
        _require_ints(fname, **{names[0]: a, names[1]: b})

        def codegen(context, builder, sig, args):
            vals = _casted(context, builder, sig, args, ["u32", "u32"])
            _asm(builder, text, "r,r,~{memory}", vals, [], side_effect=True, convergent=convergent)
            return context.get_dummy_value()

        return types.void(a, b), codegen

    impl.__doc__ = doc
    return impl


st_shared_b32 = _u32_pair_asm("st_shared_b32", "st.shared.b32 [$0], $1;", ("addr", "w"), """\
``st_shared_b32(addr: uint32, w: uint32) -> None``

    ``st.shared.b32 [addr], w;``: one 32-bit store to the 4-byte-aligned shared
    address ``addr`` (from ``smem_addr`` plus byte offsets: a swizzled staging tile
    addressed as the ``ld_shared_v4_*`` and ``ldmatrix`` that read it are).
    """)


@intrinsic
def st_global_v4_b32(typingctx, dst, index, w0, w1, w2, w3):
    """``st_global_v4_b32(dst: array, index, w0, w1, w2, w3: uint32) -> None``

    ``st.global.v4.b32 [dst + index], {w0, w1, w2, w3};``: one 16-byte store of four
    32-bit words to global ``dst[index]`` and the three elements after it in memory
    (``dst`` a device array of 4-byte elements, e.g. a uint32 view of 16-bit pairs;
    ``index`` an integer or ndim-tuple, neither wrapped nor bounds-checked, as
    ``cp_async_16``'s source; the four must be contiguous: within a row of a
    contiguous last axis).  The element's address must be 16-byte aligned: a
    misaligned one fails the launch (the simulator raises).  A warp whose lanes store
    consecutive 16-byte chunks of a row writes whole 32-byte sectors (an output
    tile's epilogue through shared memory, ``fragments.store_staged_rows``).
    """
    _check_array_index("st_global_v4_b32", dst, index)
    if dst.dtype.bitwidth != 32:
        raise _TypeError(f"st_global_v4_b32: dst must have 4-byte elements, got {dst.dtype}")
    _require_ints("st_global_v4_b32", w0=w0, w1=w1, w2=w2, w3=w3)

    def codegen(context, builder, sig, args):
        g = _global_ptr(context, builder, sig, args, at=0)
        vals = [context.cast(builder, v, ty, types.uint32) for v, ty in zip(args[2:], sig.args[2:])]
        _asm(builder, "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
             "l,r,r,r,r,~{memory}", [g] + vals, [], side_effect=True)
        return context.get_dummy_value()

    return types.void(dst, index, w0, w1, w2, w3), codegen


@intrinsic
def ld_global_cg_f32(typingctx, src, index):
    """``ld_global_cg_f32(src: float32 array, index) -> float32``

    ``ld.global.cg.f32``: a load cached in L2 only, not in the SM's L1, so it
    sees what other blocks wrote during this kernel (after their release fence
    and this block's acquire, ``fence_acq_rel_gpu``): a plain load may hit a
    line this SM cached before they wrote it.  ``index`` an integer or
    ndim-tuple, as ``cp_async_16``'s source.
    """
    _check_array_index("ld_global_cg_f32", src, index)
    if src.dtype != types.float32:
        raise _TypeError(f"ld_global_cg_f32: src must be float32, got {src.dtype}")

    def codegen(context, builder, sig, args):
        g = _global_ptr(context, builder, sig, args, at=0)
        return _asm(builder, "ld.global.cg.f32 $0, [$1];", "=f,l,~{memory}", [g], [_F32], side_effect=True)[0]

    return types.float32(src, index), codegen


@intrinsic
def ld_global_cg_v4_f32(typingctx, src, index):
    """``ld_global_cg_v4_f32(src: float32 array, index) -> (f32, f32, f32, f32)``

    ``ld.global.cg.v4.f32``: ``ld_global_cg_f32`` of ``src[index]`` and the three
    elements after it in memory (within a row of a contiguous last axis), in one
    16-byte load; the address must be 16-byte aligned (the simulator raises).
    """
    _check_array_index("ld_global_cg_v4_f32", src, index)
    if src.dtype != types.float32:
        raise _TypeError(f"ld_global_cg_v4_f32: src must be float32, got {src.dtype}")

    def codegen(context, builder, sig, args):
        g = _global_ptr(context, builder, sig, args, at=0)
        vals = _asm(builder, "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l,~{memory}", [g],
                    [_F32] * 4, side_effect=True)
        return context.make_tuple(builder, sig.return_type, vals)

    return types.UniTuple(types.float32, 4)(src, index), codegen


@intrinsic
def ld_global_nc_v4_b32(typingctx, src, index):
    """``ld_global_nc_v4_b32(src: array, index) -> (u32, u32, u32, u32)``

    ``ld.global.nc.v4.b32``: the 16 bytes from ``src[index]`` on (within a row of a
    contiguous last axis: eight 16-bit elements of a uint16 view, as four words, the
    lower-indexed element in each word's low half) in one load through the read-only
    data path, so only for data no thread writes during the kernel (the backward's
    O and dO in its preprocess, ``tc_backward._warp_deltas_fn``).  The address must be
    16-byte aligned (the simulator raises).  Read-only for LLVM (no memory clobber), so
    an unrolled loop's loads may all be in flight at once.
    """
    _check_array_index("ld_global_nc_v4_b32", src, index)

    def codegen(context, builder, sig, args):
        g = _global_ptr(context, builder, sig, args, at=0)
        vals = _asm(builder, "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [g], [_I32] * 4,
                    readonly=True)
        return context.make_tuple(builder, sig.return_type, vals)

    return types.UniTuple(types.uint32, 4)(src, index), codegen


def _timer_intrinsic(register, name, doc):
    """A ``uint32`` read of special register ``register``, volatile (never hoisted, merged
    or dropped: each call reads the register anew, in program order with its neighbours)."""

    @intrinsic
    def impl(typingctx):
        def codegen(context, builder, sig, args):
            return _asm(builder, f"mov.u32 $0, {register};", "=r,~{memory}", [], [_I32], side_effect=True)[0]

        return types.uint32(), codegen

    impl.__name__ = name
    impl.__doc__ = doc
    return impl


sm_clock = _timer_intrinsic("%clock", "sm_clock", """``sm_clock() -> uint32``

``mov.u32 r, %clock;``: the SM's cycle counter, low 32 bits (wraps every ~2 s at 2 GHz:
take differences modulo 2**32).  For traces only (``wgmma_forward.trace_tiles``): the
threads of one SM share it.""")

global_timer_lo = _timer_intrinsic("%globaltimer_lo", "global_timer_lo", """``global_timer_lo() -> uint32``

``mov.u32 r, %globaltimer_lo;``: the GPU's nanosecond timer, low 32 bits (wraps every
~4.3 s), the same on every SM; beside ``sm_clock`` it gives a trace's clock rate.""")


@intrinsic
def fence_acq_rel_gpu(typingctx):
    """``fence_acq_rel_gpu() -> None``

    ``fence.acq_rel.gpu;``: this thread's writes before the fence are seen by
    any thread of the GPU that observes a write after it (the release side, before
    an atomic that signals them), and its reads after the fence see what was
    released before the atomic it observed (the acquire side).  The simulator's
    threads share one coherent memory: its twin does nothing.
    """

    def codegen(context, builder, sig, args):
        _asm(builder, "fence.acq_rel.gpu;", "~{memory}", [], [], side_effect=True)
        return context.get_dummy_value()

    return types.void(), codegen


# ---------------------------------------------------------------------------
# Hopper (sm_90a): wgmma, mbarrier, bulk async copies, register reallocation
# ---------------------------------------------------------------------------
# Compile kernels that use these for ``cc=(9, 0, "a")`` (``.target sm_90a``; numba-cuda
# compiles for sm_90a on an sm_90 device by itself).  Under the simulator their twins
# (``_ptx_sim``) complete at issue: wgmma's product lands in the accumulators when the
# 128 threads of the warpgroup have all called it (read through the descriptors from
# the simulated shared arrays: no swizzle or the 128-byte one, K- or MN-major), a bulk
# or TMA copy's bytes land at once and complete their mbarrier's transaction (a TMA
# twin reads the simulator's own tensor maps, ``tma.SIM_MAPS``: the driver's encoding
# is opaque), and the fences, commit/wait groups and setmaxnreg do nothing.  The GPU
# tests (tests/test_ptx_hopper.py) check the layouts the twins assume on the hardware.


def _void_asm(text, doc):
    @intrinsic
    def impl(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, text, "~{memory}", [], [], side_effect=True, convergent=True)
            return context.get_dummy_value()

        return types.void(), codegen

    impl.__doc__ = doc
    return impl


fence_proxy_async = _void_asm("fence.proxy.async.shared::cta;", """``fence_proxy_async() -> None``

``fence.proxy.async.shared::cta;``: orders this thread's generic-proxy accesses to
shared memory (plain stores) before later async-proxy ones (wgmma reading its operands
through descriptors, TMA / bulk copies).  Use it after filling a tile with ``st.shared``
and before the barrier that precedes the wgmma.""")

wgmma_fence = _void_asm("wgmma.fence.sync.aligned;", """``wgmma_fence() -> None``

``wgmma.fence.sync.aligned;``: before the first ``wgmma.mma_async`` of a group, and
whenever the accumulator registers were touched by other instructions since: makes
those register writes visible to the warpgroup's wgmma.  All threads of the warp
execute it (aligned).""")


def _hold4(name, kind, constraint, what):
    @intrinsic
    def impl(typingctx, a, b, c, d):
        _require_numbers(name, a=a, b=b, c=c, d=d)

        def codegen(context, builder, sig, args):
            _asm(builder, "// hold $0 $1 $2 $3", ",".join([constraint] * 4),
                 _casted(context, builder, sig, args, [kind] * 4), [], side_effect=True)  # fmt: skip
            return context.get_dummy_value()

        return types.void(a, b, c, d), codegen

    impl.__doc__ = f"""``{name}(a, b, c, d) -> None``

No instruction: a ``volatile`` inline asm of a PTX comment that reads a, b, c and d
({what}; CuTe's ``warpgroup_fence_operand``).  LLVM must compute them before this point
and cannot sink that work past it into a later basic block, where ptxas would schedule
it after a wait (``hopper.hold_before_wait``): the wgmma forward makes dropout's keep
words under the previous tile's P·V so (``wgmma_forward.hold_exponentials`` 2), the
backward its P and dS under the products in flight (``wgmma_backward.hold``)."""
    return impl


hold_u32x4 = _hold4("hold_u32x4", "u32", "r", "32-bit integers")
hold_f32x4 = _hold4("hold_f32x4", "f32", "f", "floats")


wgmma_commit_group = _void_asm("wgmma.commit_group.sync.aligned;", """``wgmma_commit_group() -> None``

``wgmma.commit_group.sync.aligned;``: closes the wgmma operations issued since the last
commit into one wgmma-group, which ``wgmma_wait_group`` waits for.""")


@intrinsic
def wgmma_wait_group(typingctx, n):
    """``wgmma_wait_group(n) -> None``  (n: compile-time integer constant, 0..7)

    ``wgmma.wait_group.sync.aligned n;``: waits until at most ``n`` wgmma-groups of
    this warp are pending; only then may the accumulators (and the shared operands) of
    the completed groups be read or overwritten."""
    return _literal_asm(n, "wgmma_wait_group", lambda c: 0 <= c <= 7, "in 0..7", "wgmma.wait_group.sync.aligned {};")


def _literal_asm(n, fname, valid, expected, text):
    """Typing and codegen of a warp-aligned asm whose one operand ``n`` is a
    compile-time constant (``text.format(n)``); None until numba retries with a literal."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    count = int(n.literal_value)
    if not valid(count):
        raise _TypeError(f"{fname}: n must be {expected}, got {count}")

    def codegen(context, builder, sig, args):
        _asm(builder, text.format(count), "~{memory}", [], [], side_effect=True, convergent=True)
        return context.get_dummy_value()

    return types.void(n), codegen


@intrinsic
def setmaxnreg_inc(typingctx, n):
    """``setmaxnreg_inc(n) -> None``  (n: a constant, 24..256, a multiple of 8)

    ``setmaxnreg.inc.sync.aligned.u32 n;``: raises this warp's register budget to n
    per thread (a consumer warpgroup of a warp-specialized kernel takes the registers
    its producer gave back); every warp of the warpgroup executes it."""
    return _setmaxnreg(n, "inc")


@intrinsic
def setmaxnreg_dec(typingctx, n):
    """``setmaxnreg_dec(n) -> None``  (n: a constant, 24..256, a multiple of 8)

    ``setmaxnreg.dec.sync.aligned.u32 n;``: lowers this warp's register budget to n per
    thread, releasing the rest to the CTA's pool (a producer warpgroup that only issues
    copies)."""
    return _setmaxnreg(n, "dec")


def _setmaxnreg(n, how):
    return _literal_asm(n, f"setmaxnreg_{how}", lambda c: 24 <= c <= 256 and c % 8 == 0, "a multiple of 8 in 24..256",
                        f"setmaxnreg.{how}.sync.aligned.u32 {{}};")  # fmt: skip


mbarrier_init = _u32_pair_asm("mbarrier_init", "mbarrier.init.shared::cta.b64 [$0], $1;", ("addr", "count"), """\
``mbarrier_init(addr, count) -> None``

    ``mbarrier.init.shared::cta.b64 [addr], count;``: an 8-byte-aligned shared mbarrier
    at shared address ``addr`` (uint32, ``smem_addr``) expecting ``count`` arrivals per
    phase; phase 0 starts.  One thread initialises it, then ``fence_proxy_async`` (or
    ``fence.mbarrier_init``) and a barrier before others use it.""")


mbarrier_arrive_expect_tx = _u32_pair_asm(
    "mbarrier_arrive_expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", ("addr", "tx_bytes"), """\
``mbarrier_arrive_expect_tx(addr, tx_bytes) -> None``

    ``mbarrier.arrive.expect_tx.shared::cta.b64 _, [addr], tx_bytes;``: this thread
    arrives on the mbarrier and adds ``tx_bytes`` to the bytes the current phase waits
    for: the phase completes when every expected arrival came and that many bytes of
    bulk copies (``complete_tx``) have landed.""")


@intrinsic
def mbarrier_arrive(typingctx, addr):
    """``mbarrier_arrive(addr) -> None``

    ``mbarrier.arrive.shared::cta.b64 _, [addr];``: this thread arrives on the mbarrier
    (a consumer telling the producer a stage is free)."""
    _require_ints("mbarrier_arrive", addr=addr)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32"])
        _asm(builder, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", vals, [], side_effect=True)
        return context.get_dummy_value()

    return types.void(addr), codegen


def _named_barrier(op, doc):
    return _u32_pair_asm(f"named_barrier_{op}", f"bar.{op} $0, $1;", ("bar_id", "count"), doc, convergent=True)


named_barrier_sync = _named_barrier("sync", """``named_barrier_sync(bar_id, count) -> None``

``bar.sync bar_id, count;``: this warp arrives on named barrier ``bar_id`` (1–15; 0 is
``syncthreads``'s) and waits until ``count`` threads (a multiple of 32) have arrived
or synced on it.  Warp-uniform (aligned).  With :func:`named_barrier_arrive`, two
warpgroups take turns (FlashAttention-3's warp scheduler barriers: a consumer issues
its wgmma after the other's, so that one's softmax runs under the other's products).""")

named_barrier_arrive = _named_barrier("arrive", """``named_barrier_arrive(bar_id, count) -> None``

``bar.arrive bar_id, count;``: this warp arrives on named barrier ``bar_id`` without
waiting (it counts towards the ``count`` of the threads that ``named_barrier_sync`` on
it).  Warp-uniform (aligned).""")

# Thread-block clusters (sm_90): the CTAs of a cluster (the launch's cluster dimension,
# ``_launch``) run at once on one GPC and read each other's shared memory.  The
# simulator runs one block at a time, so its twins are those of a cluster of one CTA
# (rank 0; ``mapa_shared_cluster`` of another rank raises); the GPU tests run clusters
# of 2 to 8 (tests/test_ptx_cluster.py, the KV cache's split-KV merge).

cluster_arrive_release = _void_asm("barrier.cluster.arrive.release.aligned;", """``cluster_arrive_release() -> None``

``barrier.cluster.arrive.release.aligned;``: this thread arrives on its cluster's
barrier, releasing its writes before it (shared memory and global) at cluster scope.
Every thread of every CTA of the cluster arrives once a phase; all threads of the warp
execute it (aligned).  Then :func:`cluster_wait_acquire`.""")

cluster_wait_acquire = _void_asm("barrier.cluster.wait.acquire.aligned;", """``cluster_wait_acquire() -> None``

``barrier.cluster.wait.acquire.aligned;``: waits until every thread of the cluster has
arrived in this phase (:func:`cluster_arrive_release`), acquiring what they released:
after it, this thread's reads of any CTA's shared memory (``ld_shared_cluster_*``) see
the writes made before the arrivals.  Also a barrier of this CTA's threads.""")


@intrinsic
def cluster_ctarank(typingctx):
    """``cluster_ctarank() -> uint32``

    ``mov.u32 r, %cluster_ctarank;``: this CTA's rank in its cluster, 0 ..
    cluster size − 1, x fastest over the cluster's dimensions (a cluster of (1, 1, S)
    CTAs: ``blockIdx.z % S``).
    """

    def codegen(context, builder, sig, args):
        return _asm(builder, "mov.u32 $0, %cluster_ctarank;", "=r", [], [_I32], pure=True)[0]

    return types.uint32(), codegen


@intrinsic
def mapa_shared_cluster(typingctx, addr, rank):
    """``mapa_shared_cluster(addr: uint32, rank) -> uint32``

    ``mapa.shared::cluster.u32 r, addr, rank;``: the address in the cluster's shared
    window (``shared::cluster``) of the location at this CTA's shared address ``addr``
    (from ``smem_addr``) in the CTA of rank ``rank`` of the cluster, for
    ``ld_shared_cluster_*``.
    """
    _require_ints("mapa_shared_cluster", addr=addr, rank=rank)

    def codegen(context, builder, sig, args):
        a, r = (context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args))
        return _asm(builder, "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [a, r], [_I32], pure=True)[0]

    return types.uint32(addr, rank), codegen


@intrinsic
def ld_shared_cluster_f32(typingctx, addr):
    """``ld_shared_cluster_f32(addr: uint32) -> float32``

    ``ld.shared::cluster.f32 r, [addr];``: a float32 from another CTA's shared memory
    (``addr`` from ``mapa_shared_cluster``: distributed shared memory), ordered with
    memory (a clobber).
    """
    _require_ints("ld_shared_cluster_f32", addr=addr)

    def codegen(context, builder, sig, args):
        a = context.cast(builder, args[0], sig.args[0], types.uint32)
        return _asm(builder, "ld.shared::cluster.f32 $0, [$1];", "=f,r,~{memory}", [a], [_F32], side_effect=True)[0]

    return types.float32(addr), codegen


@intrinsic
def ld_shared_cluster_v4_f32(typingctx, addr):
    """``ld_shared_cluster_v4_f32(addr: uint32) -> (f32, f32, f32, f32)``

    ``ld.shared::cluster.v4.f32``: four consecutive float32 from another CTA's shared
    memory in one 16-byte load (``addr`` from ``mapa_shared_cluster``, 16-byte
    aligned; the simulator raises otherwise).
    """
    _require_ints("ld_shared_cluster_v4_f32", addr=addr)

    def codegen(context, builder, sig, args):
        a = context.cast(builder, args[0], sig.args[0], types.uint32)
        vals = _asm(builder, "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r,~{memory}", [a],
                    [_F32] * 4, side_effect=True)
        return context.make_tuple(builder, sig.return_type, vals)

    return types.UniTuple(types.float32, 4)(addr), codegen


@intrinsic
def mbarrier_try_wait_parity(typingctx, addr, parity):
    """``mbarrier_try_wait_parity(addr, parity) -> uint32``

    ``mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity;``: 1 once the phase
    of parity ``parity`` (0 or 1: phases alternate) has completed, else 0 after a
    bounded wait; spin on it: ``while ptx.mbarrier_try_wait_parity(a, ph) == 0: pass``."""
    _require_ints("mbarrier_try_wait_parity", addr=addr, parity=parity)

    def codegen(context, builder, sig, args):
        vals = _casted(context, builder, sig, args, ["u32", "u32"])
        text = ("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                "selp.u32 $0, 1, 0, p; }")  # fmt: skip
        return _asm(builder, text, "=r,r,r,~{memory}", vals, [_I32], side_effect=True)[0]

    return types.uint32(addr, parity), codegen


@intrinsic
def cp_async_bulk_g2s(typingctx, dst, src, index, nbytes, mbar):
    """``cp_async_bulk_g2s(dst, src, index, nbytes, mbar) -> None``

    ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src],
    nbytes, [mbar];``: one thread copies ``nbytes`` (a multiple of 16) contiguous bytes
    from global ``src[index]`` (16-byte aligned) to shared address ``dst`` (uint32,
    16-byte aligned) on the async proxy; their arrival counts toward the transaction
    bytes of the mbarrier at ``mbar`` (``mbarrier_arrive_expect_tx``).  A tensor map
    (``cp.async.bulk.tensor``) is not needed for rows that are contiguous."""
    _check_array_index("cp_async_bulk_g2s", src, index)
    _require_ints("cp_async_bulk_g2s", dst=dst, nbytes=nbytes, mbar=mbar)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[1], sig.args[2], args[1], args[2])
        gptr = builder.ptrtoint(ptr, _I64)
        d, n, m = (context.cast(builder, args[i], sig.args[i], types.uint32) for i in (0, 3, 4))
        _asm(builder, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
             "r,l,r,r,~{memory}", [d, gptr, n, m], [], side_effect=True)  # fmt: skip
        return context.get_dummy_value()

    return types.void(dst, src, index, nbytes, mbar), codegen


def _bulk_tensor_intrinsic(rank):
    coords = ", ".join(f"${2 + j}" for j in range(rank))
    text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes "
            f"[$0], [$1, {{{coords}}}], [${2 + rank}];")  # fmt: skip
    constraints = ",".join(["r", "l"] + ["r"] * rank + ["r"]) + ",~{memory}"
    name = f"cp_async_bulk_tensor_{rank}d_g2s"

    def typer(dst, tmap, rest):
        if not (isinstance(tmap, types.Array) and tmap.dtype == types.uint8 and tmap.ndim == 1):
            raise _TypeError(f"{name}: tmap must be the 128-byte uint8 device array of a tensor map, got {tmap}")
        _require_ints(name, dst=dst, **{f"c{j}": t for j, t in enumerate(rest[:rank])}, mbar=rest[rank])

        def codegen(context, builder, sig, args):
            arystruct = context.make_array(sig.args[1])(context, builder, value=args[1])
            tptr = builder.ptrtoint(arystruct.data, _I64)
            d = context.cast(builder, args[0], sig.args[0], types.uint32)
            cs = [context.cast(builder, args[2 + j], sig.args[2 + j], types.int32) for j in range(rank)]
            m = context.cast(builder, args[2 + rank], sig.args[2 + rank], types.uint32)
            _asm(builder, text, constraints, [d, tptr] + cs + [m], [], side_effect=True)
            return context.get_dummy_value()

        return types.void(dst, tmap, *rest), codegen

    if rank == 2:
        @intrinsic
        def impl(typingctx, dst, tmap, c0, c1, mbar):
            return typer(dst, tmap, (c0, c1, mbar))
    elif rank == 3:
        @intrinsic
        def impl(typingctx, dst, tmap, c0, c1, c2, mbar):
            return typer(dst, tmap, (c0, c1, c2, mbar))
    else:
        @intrinsic
        def impl(typingctx, dst, tmap, c0, c1, c2, c3, mbar):
            return typer(dst, tmap, (c0, c1, c2, c3, mbar))

    impl.__doc__ = f"""``{name}(dst, tmap, {", ".join(f"c{j}" for j in range(rank))}, mbar) -> None``

    ``cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes``
    (TMA): one thread copies the box of the tensor map ``tmap`` (a 128-byte uint8 device
    array from ``numba_flash.tma.tensor_map``: numba kernels cannot take a 128-byte
    ``__grid_constant__`` parameter, so the map lives in global memory) whose first
    element is at coordinates (c0 innermost, ...) into shared address ``dst`` (uint32,
    128-byte aligned; laid out with the map's swizzle), out-of-bounds elements filled
    with zeros; its bytes complete on the mbarrier ``mbar``.  The innermost coordinate's
    byte offset must be a multiple of 16 (an H200 raised ILLEGAL_INSTRUCTION otherwise:
    ``../shared/probes/tma_2d_mbarrier.py``)."""
    impl.__name__ = name
    return impl


cp_async_bulk_tensor_2d_g2s = _bulk_tensor_intrinsic(2)
cp_async_bulk_tensor_3d_g2s = _bulk_tensor_intrinsic(3)
cp_async_bulk_tensor_4d_g2s = _bulk_tensor_intrinsic(4)


#: wgmma's shared-memory matrix layouts (the descriptor's bits 62-63).
SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3


def wgmma_desc_host(addr: int, lbo: int, sbo: int, swizzle: int) -> int:
    """The 64-bit shared-memory matrix descriptor of a wgmma operand (PTX ISA, "Matrix
    Descriptor"): bits 0-13 the start address >> 4, 16-29 the leading-dimension byte
    offset >> 4, 32-45 the stride-dimension byte offset >> 4, 62-63 the swizzle mode
    (``SWIZZLE_NONE``, ``SWIZZLE_128B``, ...; base offset 0: tiles aligned to the
    swizzle's repeat).  With no swizzle and K-major operands, the tile is made of 8×8
    "core matrices" of 128 contiguous bytes: LBO is the byte step between core matrices
    along K, SBO along M (or N) (seen on the H200: ``../shared/probes/wgmma_m64n8k16.py``).
    In a kernel: :func:`wgmma_desc`, the same bits."""
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62)


def _wgmma_desc(addr, lbo, sbo, swizzle):
    """:func:`wgmma_desc_host` in a kernel (uint64 arithmetic throughout: numba would
    mix signed and unsigned 64-bit operands into floats)."""
    return (uint64((addr & 0x3FFFF) >> 4) | (uint64(lbo >> 4) << uint64(16)) | (uint64(sbo >> 4) << uint64(32))
            | (uint64(swizzle) << uint64(62)))  # fmt: skip


wgmma_desc = device_function(_wgmma_desc)


def _wgmma_asm(n, ptx_type, a_in_regs, b_mn=False):
    """``(text, constraints)`` of wgmma m64n{n}k16: outputs $0 … the n/2 accumulators,
    then A (a descriptor, or four registers), B's descriptor, scale_d, and the
    accumulators again as the tied inputs.  ``b_mn``: B is MN-major (imm-trans-b 1)."""
    regs = n // 2
    outs = ",".join(f"${j}" for j in range(regs))
    a_ops = "{" + ", ".join(f"${regs + j}" for j in range(4)) + "}" if a_in_regs else f"${regs}"
    b_at = regs + (4 if a_in_regs else 1)
    tb = "1" if b_mn else "0"
    trans = f"1, 1, {tb}" if a_in_regs else f"1, 1, 0, {tb}"  # scale-a, scale-b, (trans-a,) trans-b
    text = ("{ .reg .pred p; setp.ne.b32 p, $" + str(b_at + 1) + ", 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_type}.{ptx_type} "
            "{" + outs + "}, " + a_ops + ", $" + str(b_at) + ", p, " + trans + "; }")  # fmt: skip
    a_cons = ["r"] * 4 if a_in_regs else ["l"]
    constraints = ",".join(["=f"] * regs + a_cons + ["l", "r"] + [str(j) for j in range(regs)]) + ",~{memory}"
    return text, constraints


def _wgmma_emit(context, builder, sig, args, text, constraints, regs, operands):
    """``acc[i : i + regs]`` (args 0 and 1) = the wgmma's D, its C the same registers,
    after ``operands`` (A, B's descriptor, scale_d)."""
    ptrs = _pointers(context, builder, sig.args[0], sig.args[1], args[0], args[1], regs)
    res = _asm(builder, text, constraints, operands + [builder.load(p) for p in ptrs], [_F32] * regs,
               side_effect=True, convergent=True)  # fmt: skip
    for p, v in zip(ptrs, res):
        builder.store(v, p)
    return context.get_dummy_value()


def _wgmma_intrinsic(n, ptx_type):
    """``wgmma_m64n{n}k16_{type}_acc(acc, i, desc_a, desc_b, scale_d) -> None``."""
    regs = n // 2
    text, constraints = _wgmma_asm(n, ptx_type, False)
    name = f"wgmma_m64n{n}k16_{ptx_type}_acc"

    @intrinsic
    def impl(typingctx, acc, i, desc_a, desc_b, scale_d):
        _require_fragment_arrays(name, acc)
        _require_ints(name, i=i, desc_a=desc_a, desc_b=desc_b, scale_d=scale_d)

        def codegen(context, builder, sig, args):
            da, db = (context.cast(builder, args[j], sig.args[j], types.uint64) for j in (2, 3))
            sd = context.cast(builder, args[4], sig.args[4], types.uint32)
            return _wgmma_emit(context, builder, sig, args, text, constraints, regs, [da, db, sd])

        return types.void(acc, i, desc_a, desc_b, scale_d), codegen

    impl.__doc__ = f"""``{name}(acc, i, desc_a, desc_b, scale_d) -> None``

    ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_type}.{ptx_type}``: the warpgroup
    (4 warps, 128 threads, all calling) computes ``D = A·B + (D if scale_d else 0)``
    for A 64×16 and B 16×{n} ({ptx_type}) read from shared memory through the
    descriptors ``desc_a``, ``desc_b`` (:func:`wgmma_desc`), D 64×{n} fp32 in
    ``acc[i : i + {regs}]`` of each thread.  Thread (warp w of the warpgroup, lane with
    g = lane >> 2, t = lane & 3) holds, for j = 0 .. {n // 8 - 1}::

        acc[i + 4j]     = D[16w + g,     8j + 2t]    acc[i + 4j + 1] = D[16w + g,     8j + 2t + 1]
        acc[i + 4j + 2] = D[16w + g + 8, 8j + 2t]    acc[i + 4j + 3] = D[16w + g + 8, 8j + 2t + 1]

    Asynchronous: issue between ``wgmma_fence()`` and ``wgmma_commit_group()``, and
    read ``acc`` only after ``wgmma_wait_group``."""
    impl.__name__ = name
    return impl


_MN_B = """MN-major (imm-trans-b = 1): B's K index runs along the tile's
    rows and its N columns are contiguous, V as it lies in memory.  With the 128-byte
    swizzle, LBO steps 64 columns (one swizzle atom) and SBO 8 rows"""


def _wgmma_rs_intrinsic(n, ptx_type, b_mn=False):
    """``wgmma_m64n{n}k16_{type}_rs[_bmn]_acc(acc, i, a, ai, desc_b, scale_d) -> None``: A
    from registers (``b_mn``: B MN-major)."""
    regs = n // 2
    text, constraints = _wgmma_asm(n, ptx_type, True, b_mn)
    name = f"wgmma_m64n{n}k16_{ptx_type}_rs_{'bmn_' if b_mn else ''}acc"

    @intrinsic
    def impl(typingctx, acc, i, a, ai, desc_b, scale_d):
        _require_fragment_arrays(name, acc, a)
        _require_ints(name, i=i, ai=ai, desc_b=desc_b, scale_d=scale_d)

        def codegen(context, builder, sig, args):
            a_vals = [builder.load(p) for p in _pointers(context, builder, sig.args[2], sig.args[3], args[2], args[3], 4)]
            db = context.cast(builder, args[4], sig.args[4], types.uint64)
            sd = context.cast(builder, args[5], sig.args[5], types.uint32)
            return _wgmma_emit(context, builder, sig, args, text, constraints, regs, a_vals + [db, sd])

        return types.void(acc, i, a, ai, desc_b, scale_d), codegen

    impl.__doc__ = f"""``{name}(acc, i, a, ai, desc_b, scale_d) -> None``

    ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_type}.{ptx_type}`` with A from
    registers: as ``wgmma_m64n{n}k16_{ptx_type}_acc``, but each warp w of the warpgroup
    gives rows 16w … 16w + 15 of A (64×16) in ``a[ai : ai + 4]``, in mma.sync
    m16n8k16's A layout (g = lane >> 2, t = lane & 3; two values a word, the lower
    column in the low half)::

        a[ai]     = A[16w + g,     2t : 2t + 2]     a[ai + 1] = A[16w + g + 8, 2t : 2t + 2]
        a[ai + 2] = A[16w + g, 2t + 8 : 2t + 10]    a[ai + 3] = A[16w + g + 8, 2t + 8 : 2t + 10]

    so a P tile packed from the accumulators of S (``fragments.pack_a``) is the A
    operand of O += P·V without a trip through shared memory (FlashAttention-3's P·V).
    B (16×{n}) from shared memory through ``desc_b``, {_MN_B if b_mn else "K-major"}."""
    impl.__name__ = name
    return impl


WGMMA_N = (8, 16, 32, 64, 80, 128, 160, 192, 256)  # the N of the wgmma shapes exported below
for _n in WGMMA_N:
    for _t in ("f16", "bf16"):
        globals()[f"wgmma_m64n{_n}k16_{_t}_acc"] = _wgmma_intrinsic(_n, _t)
        globals()[f"wgmma_m64n{_n}k16_{_t}_rs_acc"] = _wgmma_rs_intrinsic(_n, _t)
        globals()[f"wgmma_m64n{_n}k16_{_t}_rs_bmn_acc"] = _wgmma_rs_intrinsic(_n, _t, True)
del _n, _t

#: The Hopper intrinsics (their simulator twins: see the section's comment).
HOPPER = ("cluster_arrive_release", "cluster_wait_acquire", "cluster_ctarank", "mapa_shared_cluster",
          "ld_shared_cluster_f32", "ld_shared_cluster_v4_f32", "fence_proxy_async", "wgmma_fence",
          "hold_u32x4", "hold_f32x4",
          "wgmma_commit_group", "wgmma_wait_group", "setmaxnreg_inc", "setmaxnreg_dec", "mbarrier_init",
          "mbarrier_arrive_expect_tx", "mbarrier_arrive", "mbarrier_try_wait_parity", "named_barrier_sync",
          "named_barrier_arrive", "cp_async_bulk_g2s",
          "cp_async_bulk_tensor_2d_g2s", "cp_async_bulk_tensor_3d_g2s", "cp_async_bulk_tensor_4d_g2s") + tuple(
    f"wgmma_m64n{n}k16_{t}_{how}acc" for n in WGMMA_N for t in ("f16", "bf16")
    for how in ("", "rs_", "rs_bmn_"))  # fmt: skip


# ---------------------------------------------------------------------------
# simulator binding
# ---------------------------------------------------------------------------

if SIMULATOR:
    from numba_flash import _ptx_sim

    for _name in __all__:
        if _name == "SMEM_ALIGN":
            continue
        _twin = getattr(_ptx_sim, _name)
        _twin.__doc__ = globals()[_name].__doc__
        globals()[_name] = _twin
    for _name in HOPPER:
        _twin = getattr(_ptx_sim, _name)
        _twin.__doc__ = globals()[_name].__doc__
        globals()[_name] = _twin
    del _name, _twin

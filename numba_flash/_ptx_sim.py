"""Pure-Python twins of ``numba_flash.ptx`` for numba's CUDA simulator.

``numba_flash.ptx`` binds these names instead of its inline-PTX intrinsics
when ``NUMBA_ENABLE_CUDASIM=1``; their docstrings are copied from there.  The
semantics and fragment layouts are those of the PTX instructions.

How the twins work
------------------
* The simulator runs every CUDA thread of a block as a Python thread
  (``numba.cuda.simulator.kernel.BlockThread``: it carries ``thread_id``, the
  linear thread index, ``_manager``, its block's ``BlockManager``, and
  ``abort``, set when another thread raised); blocks run one after another,
  each with a fresh ``BlockManager``.  All per-block state here hangs off the
  ``BlockManager`` object, so it starts fresh with every block and launch.
* Warp-collective operations (mma, ldmatrix, and the warp shuffles and
  ``syncwarp`` that the simulator lacks; ``install_warp_twins`` adds those to
  its fake ``cuda`` module) meet in a
  per-block, per-warp ``_Warp`` rendezvous: each lane deposits its registers
  in the current round, the lane that completes the round computes the
  results of all lanes at once (vectorised NumPy) and wakes the others; each
  lane then reads its own result from the round object it deposited into, so
  a round never needs a second barrier and the next call simply starts a new
  round.  A waiting lane polls every 0.2 s: if its thread's ``abort`` flag
  is set (another thread raised), or every lane still missing has exited or
  waits in ``syncthreads`` (a call not reached by the whole warp, which can
  never complete), it raises instead of hanging.  Rounds are keyed by the
  participating lane mask (always the whole warp for mma/ldmatrix).
* Several warps per block, several blocks and repeated launches work: warps
  are ``thread_id // 32`` of their block, and nothing outlives the block.
* Shared-memory "addresses" (``smem_addr``) live in a fake 32-bit shared
  window per block: the first time an allocation (a ``cuda.shared.array``
  buffer, found by walking ``.base`` from any view) is addressed it gets a
  128-byte-aligned range; an address is resolved back to (allocation bytes,
  offset) by bisection.  Byte arithmetic on addresses therefore works as on
  the GPU, and reads and writes are byte-exact whatever the array's dtype.
* ``cp.async`` copies are queued per thread: the 16 source bytes are read at
  issue time and written to shared memory when ``cp_async_wait_group``/
  ``cp_async_wait_all`` retires their group, so a kernel that reads a tile
  before waiting sees stale data here too.
"""

import bisect
import threading
import time
from collections import deque

import ml_dtypes
import numpy as np

_WAIT_TIMEOUT_S = 600.0  # last resort: a lane waits this long for the others
_POLL_S = 0.2  # how often a waiting lane checks its thread's abort flag
_FULL = 0xFFFFFFFF
_SMEM_BASE = 0x400  # first fake shared address (0 stays invalid)
_SMEM_ALIGN = 1024  # a 128-byte swizzle's repeat: a swizzled tile at an array's start is aligned as on the GPU

_state_lock = threading.Lock()


# ---------------------------------------------------------------------------
# per-thread / per-block state
# ---------------------------------------------------------------------------


def _thread():
    t = threading.current_thread()
    if not hasattr(t, "_manager") or not hasattr(t, "thread_id"):
        raise RuntimeError(
            "numba_flash.ptx simulator twins can only be called from a kernel "
            "running in numba's CUDA simulator"
        )
    return t


class _BlockState:
    def __init__(self, block_dim):
        self.nthreads = int(np.prod(block_dim))
        self.lock = threading.Lock()
        self.warps = {}
        self.groups = {}  # warpgroup id -> its 128-thread rendezvous (wgmma)
        self.mbarriers = {}  # shared address -> _Mbarrier
        self.named = {}  # named barrier id -> _NamedBarrier
        self.smem = _SharedWindow()

    def warp(self, wid):
        with self.lock:
            w = self.warps.get(wid)
            if w is None:
                live = min(32, self.nthreads - 32 * wid)
                w = self.warps[wid] = _Warp((1 << live) - 1)
            return w

    def warpgroup(self, gid):
        with self.lock:
            g = self.groups.get(gid)
            if g is None:
                live = max(0, min(128, self.nthreads - 128 * gid))
                g = self.groups[gid] = _Warp((1 << live) - 1, size=128)
            return g


def _block(t):
    m = t._manager
    st = getattr(m, "_numba_flash_ptx_state", None)
    if st is None:
        with _state_lock:
            st = getattr(m, "_numba_flash_ptx_state", None)
            if st is None:
                st = _BlockState(m._block_dim)
                m._numba_flash_ptx_state = st
    return st


# ---------------------------------------------------------------------------
# warp rendezvous
# ---------------------------------------------------------------------------


class _Round:
    __slots__ = ("op", "inputs", "arrived", "have", "results", "error")

    def __init__(self, op, size=32):
        self.op = op
        self.inputs = [None] * size
        self.arrived = 0
        self.have = 0  # bit mask of the lanes that deposited
        self.results = None
        self.error = None


class _Warp:
    """The rendezvous of ``size`` consecutive threads: a warp (32), or a warpgroup
    (128, for wgmma)."""

    def __init__(self, live_mask, size=32):
        self.live_mask = live_mask
        self.size = size
        self.cond = threading.Condition()
        self.rounds = {}  # participating-lane mask -> open _Round

    def exchange(self, op, value, compute, mask=None):
        """Deposit ``value`` for this lane; return this lane's result.

        ``compute(inputs)`` gets the list of ``size`` per-lane inputs (None for
        lanes not taking part) and returns a list of ``size`` per-lane results;
        it runs once, in the lane that completes the round.
        """
        t = _thread()
        lane = t.thread_id % self.size
        members = self.live_mask if mask is None else (int(mask) & self.live_mask)
        if not (members >> lane) & 1:
            raise RuntimeError(f"{op}: lane {lane} is not in mask {mask:#x}")
        need = bin(members).count("1")
        with self.cond:
            r = self.rounds.get(members)
            if r is None:
                r = self.rounds[members] = _Round(op, self.size)
            if r.op != op:
                r.error = RuntimeError(
                    f"warp-divergent collective calls: {r.op!r} and {op!r} "
                    "met in one round"
                )
                del self.rounds[members]
                self.cond.notify_all()
            else:
                r.inputs[lane] = value
                r.arrived += 1
                r.have |= 1 << lane
                if r.arrived == need:
                    del self.rounds[members]
                    try:
                        r.results = compute(r.inputs)
                    except BaseException as e:  # reported to every lane
                        r.error = e
                    self.cond.notify_all()
                else:
                    deadline = time.monotonic() + _WAIT_TIMEOUT_S
                    while r.results is None and r.error is None:
                        self.cond.wait(_POLL_S)
                        if r.results is not None or r.error is not None:
                            break
                        if t.abort:
                            raise RuntimeError(f"{op}: kernel aborted")
                        why = None
                        if time.monotonic() > deadline:
                            why = f"not all arrived within {_WAIT_TIMEOUT_S} s"
                        elif _missing_lanes_stuck(t, r, members, self.size):
                            why = "the missing lanes exited or wait in syncthreads"
                        if why:
                            missing = [i for i in range(self.size)
                                       if ((members & ~r.have) >> i) & 1]
                            unit = "warp" if self.size == 32 else "warpgroup"
                            r.error = RuntimeError(
                                f"{op}: lanes {missing} of {unit} "
                                f"{t.thread_id // self.size} never joined the call ({why}): "
                                f"a {unit}-collective call must be reached by all "
                                f"lanes of the {unit} together"
                            )
                            self.rounds.pop(members, None)
                            self.cond.notify_all()
        if r.error is not None:
            raise RuntimeError(f"{op} failed: {r.error}") from r.error
        return r.results[lane]


def _missing_lanes_stuck(t, r, members, size=32):
    """True when no lane missing from round ``r`` can still arrive.

    A missing lane that has exited never arrives (``install_warp_twins`` has the
    simulator's threads record their exit); one blocked in ``syncthreads``
    neither, since the simulator releases a syncthreads only once every live
    thread of the block is in it, and the waiting lanes are not.  Any other lane
    (running, or not started yet: the simulator starts a block's threads one by
    one) may still arrive.
    """
    manager, warp = t._manager, t.thread_id // size
    exited = _exited_threads(manager)
    lanes = {}
    for th in threading.enumerate():
        if getattr(th, "_manager", None) is manager and th.thread_id // size == warp:
            lanes[th.thread_id % size] = th
    for lane in range(size):
        if ((members & ~r.have) >> lane) & 1:
            if size * warp + lane in exited:
                continue
            th = lanes.get(lane)
            if th is None or not th.syncthreads_blocked:
                return False
    return True


def _exited_threads(manager):
    """Thread ids of ``manager``'s block whose kernel function has returned or raised."""
    ids = getattr(manager, "_numba_flash_exited", None)
    if ids is None:
        with _state_lock:
            ids = getattr(manager, "_numba_flash_exited", None)
            if ids is None:
                ids = manager._numba_flash_exited = set()
    return ids


def _warp_exchange(op, value, compute, mask=None):
    t = _thread()
    return _block(t).warp(t.thread_id // 32).exchange(op, value, compute, mask)


# ---------------------------------------------------------------------------
# byte-level memory access
# ---------------------------------------------------------------------------


def _unwrap(ary):
    """The ndarray behind a simulator array argument (or the array itself)."""
    item = getattr(ary, "__dict__", {}).get("_item")  # FakeWithinKernelCUDAArray
    if item is not None:
        ary = item
    inner = getattr(ary, "__dict__", {}).get("_ary")  # FakeCUDAArray
    if inner is not None:
        ary = inner
    if not isinstance(ary, np.ndarray):
        raise TypeError(f"expected an array, got {type(ary).__name__}")
    return ary


def _root(ary):
    """The ndarray owning the memory ``ary`` views (walks .base)."""
    a = ary
    while True:
        b = a.base
        if isinstance(b, memoryview) and isinstance(b.obj, np.ndarray):
            b = b.obj
        if not isinstance(b, np.ndarray) and isinstance(getattr(b, "base", None), np.ndarray):
            b = b.base  # np.lib.stride_tricks.as_strided's holder (a stride-0 view)
        if isinstance(b, np.ndarray):
            a = b
        else:
            return a


def _bytes_of(root):
    """Flat writable uint8 view of a contiguous owning array."""
    flat = root.ravel(order="K")
    if flat.size and flat.ctypes.data != root.ctypes.data:  # pragma: no cover
        raise ValueError("cannot address a non-contiguous allocation")
    return flat.view(np.uint8)


def _element(ary, index):
    """(root array, byte offset of ary[index] in it) with no wraparound."""
    a = _unwrap(ary)
    idx = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    if len(idx) != a.ndim:
        raise IndexError(f"{len(idx)} indices for a {a.ndim}-d array")
    addr = a.ctypes.data + sum(i * s for i, s in zip(idx, a.strides))
    root = _root(a)
    return root, addr - root.ctypes.data


class _SharedWindow:
    """Fake 32-bit shared-memory window of one block."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_root = {}  # (data pointer, nbytes) -> region index
        self.bases = []  # sorted fake base addresses
        self.regions = []  # (base, nbytes, uint8 view, root) in base order
        self.next = _SMEM_BASE

    def address(self, root, offset):
        key = (root.ctypes.data, root.nbytes)
        with self.lock:
            i = self.by_root.get(key)
            if i is None:
                base = -(-self.next // _SMEM_ALIGN) * _SMEM_ALIGN
                self.next = base + root.nbytes
                i = self.by_root[key] = len(self.regions)
                self.regions.append((base, root.nbytes, _bytes_of(root), root))
                self.bases.append(base)
            base, nbytes, _, _ = self.regions[i]
        if not 0 <= offset <= nbytes:
            raise IndexError("smem_addr: index outside the shared array")
        return base + offset

    def resolve(self, addr, nbytes, align, what):
        addr = int(addr) & _FULL
        if addr % align:
            raise ValueError(f"{what}: shared address {addr:#x} is not {align}-byte aligned")
        i = bisect.bisect_right(self.bases, addr) - 1
        if i >= 0:
            base, size, view, _ = self.regions[i]
            if addr + nbytes <= base + size:
                return view, addr - base
        raise ValueError(
            f"{what}: {nbytes} bytes at shared address {addr:#x} are not inside "
            "an array registered with smem_addr in this block"
        )


def _is_shared_allocation(root):
    """True unless we can tell ``root`` is not a simulator shared array."""
    try:
        from numba.cuda.simulator import kernel as simkernel

        shared = simkernel._get_kernel_context()._shared
        known = list(shared._allocations.values()) + [shared._dynshared]
    except Exception:  # pragma: no cover - simulator internals changed
        return True
    return any(root is _root(k) for k in known)


# ---------------------------------------------------------------------------
# bit helpers
# ---------------------------------------------------------------------------


def _u32(x):
    return int(x) & _FULL


def _halves(regs):
    """uint32 array -> (low uint16, high uint16) arrays."""
    r = np.asarray(regs, dtype=np.uint64).astype(np.uint32)
    return (r & 0xFFFF).astype(np.uint16), (r >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------
# mma.sync
# ---------------------------------------------------------------------------

_LANES = np.arange(32)
_G = _LANES >> 2
_T = _LANES & 3


def _mma_compute(K, fill):
    """The warp-wide m16n8kK: ``fill(regs, A, B)`` decodes the lanes' A and B registers
    into A (16 × K) and B (K × 8); C and D in the m16n8 accumulator layout."""

    def compute(inputs):
        regs = np.array([[_u32(v) for v in x[:6]] for x in inputs], dtype=np.uint64)
        acc = np.array([[float(v) for v in x[6:]] for x in inputs], dtype=np.float32)
        A, B, C = np.zeros((16, K)), np.zeros((K, 8)), np.zeros((16, 8))
        fill(regs, A, B)
        C[_G, 2 * _T], C[_G, 2 * _T + 1] = acc[:, 0], acc[:, 1]
        C[_G + 8, 2 * _T], C[_G + 8, 2 * _T + 1] = acc[:, 2], acc[:, 3]
        D = (A @ B + C).astype(np.float32)
        d = np.stack([D[_G, 2 * _T], D[_G, 2 * _T + 1],
                      D[_G + 8, 2 * _T], D[_G + 8, 2 * _T + 1]], axis=1)
        return [tuple(row) for row in d]

    return compute


def _fill_k16(decode):
    """A and B of m16n8k16: two 16-bit values a register, lower index in the low half."""

    def fill(regs, A, B):
        for reg, rows, cols in ((0, _G, 2 * _T), (1, _G + 8, 2 * _T),
                                (2, _G, 2 * _T + 8), (3, _G + 8, 2 * _T + 8)):
            lo, hi = _halves(regs[:, reg])
            A[rows, cols] = decode(lo)
            A[rows, cols + 1] = decode(hi)
        for reg, k0 in ((4, 2 * _T), (5, 2 * _T + 8)):
            lo, hi = _halves(regs[:, reg])
            B[k0, _G] = decode(lo)
            B[k0 + 1, _G] = decode(hi)

    return fill


def _fill_tf32(regs, A, B):
    """A and B of m16n8k8 tf32: one value a register."""
    A[_G, _T] = _dec_tf32(regs[:, 0])
    A[_G + 8, _T] = _dec_tf32(regs[:, 1])
    A[_G, _T + 4] = _dec_tf32(regs[:, 2])
    A[_G + 8, _T + 4] = _dec_tf32(regs[:, 3])
    B[_T, _G] = _dec_tf32(regs[:, 4])
    B[_T + 4, _G] = _dec_tf32(regs[:, 5])


def _dec_f16(h):
    return h.view(np.float16).astype(np.float64)


def _dec_bf16(h):
    return h.view(ml_dtypes.bfloat16).astype(np.float64)


def _dec_tf32(bits):
    b = np.asarray(bits, dtype=np.uint64).astype(np.uint32) & np.uint32(0xFFFFE000)
    return b.view(np.float32).astype(np.float64)


_mma_f16 = _mma_compute(16, _fill_k16(_dec_f16))
_mma_bf16 = _mma_compute(16, _fill_k16(_dec_bf16))
_mma_tf32 = _mma_compute(8, _fill_tf32)


def mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange("mma.m16n8k16.f16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), _mma_f16)


def mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange("mma.m16n8k16.bf16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), _mma_bf16)


def mma_m16n8k8_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange("mma.m16n8k8.tf32", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), _mma_tf32)


def cvt_rna_tf32(x):
    bits = int(np.float32(x).view(np.uint32))
    if (bits & 0x7F800000) == 0x7F800000:  # inf / nan: keep, truncating NaN payload
        if bits & 0x007FFFFF:
            return 0x7FFFFFFF  # canonical NaN
        return bits
    # round to nearest, ties away from zero, on the magnitude bits
    return ((bits + 0x1000) & 0xFFFFE000) & _FULL


# ---------------------------------------------------------------------------
# shared addresses and ldmatrix
# ---------------------------------------------------------------------------


def smem_addr(array, index):
    t = _thread()
    root, offset = _element(array, index)
    if not _is_shared_allocation(root):
        raise ValueError("smem_addr: array is not a cuda.shared.array")
    return _block(t).smem.address(root, offset)


def _ldmatrix_compute(num, trans, window, what):
    def compute(inputs):
        out = np.zeros((num, 32), dtype=np.uint32)
        for i in range(num):
            M = np.empty((8, 8), dtype=np.uint16)
            for j in range(8):
                view, off = window.resolve(inputs[8 * i + j], 16, 16, what)
                M[j] = view[off:off + 16].view(np.uint16)
            if trans:
                M = M.T
            lo = M[_G, 2 * _T].astype(np.uint32)
            hi = M[_G, 2 * _T + 1].astype(np.uint32)
            out[i] = lo | (hi << np.uint32(16))
        if num == 1:
            return [int(v) for v in out[0]]
        return [tuple(int(v) for v in out[:, lane]) for lane in range(32)]

    return compute


def _ldmatrix(num, trans, addr):
    t = _thread()
    what = f"ldmatrix.x{num}{'.trans' if trans else ''}"
    window = _block(t).smem
    return _warp_exchange(what, _u32(addr), _ldmatrix_compute(num, trans, window, what))


def _ldmatrix_twin(num, trans):
    def twin(addr):
        return _ldmatrix(num, trans, addr)

    return twin


ldmatrix_x1 = _ldmatrix_twin(1, False)
ldmatrix_x2 = _ldmatrix_twin(2, False)
ldmatrix_x4 = _ldmatrix_twin(4, False)
ldmatrix_x1_trans = _ldmatrix_twin(1, True)
ldmatrix_x2_trans = _ldmatrix_twin(2, True)
ldmatrix_x4_trans = _ldmatrix_twin(4, True)


# ---------------------------------------------------------------------------
# cp.async
# ---------------------------------------------------------------------------


class _CpAsyncState:
    def __init__(self):
        self.current = []
        self.committed = deque()


def _cp_state(t):
    st = getattr(t, "_numba_flash_cp_async", None)
    if st is None:
        st = t._numba_flash_cp_async = _CpAsyncState()
    return st


def _cp_async(dst, src, index, pred, what, offset=0):
    t = _thread()
    view, off = _block(t).smem.resolve(dst, 16, 16, what)
    if pred:
        root, soff = _element(src, index)
        soff += int(offset)
        sbytes = _bytes_of(root)
        if soff % 16:
            raise ValueError(f"{what}: global source is not 16-byte aligned")
        if not 0 <= soff <= sbytes.size - 16:
            raise IndexError(f"{what}: 16 source bytes outside the global array")
        data = sbytes[soff:soff + 16].copy()
    else:
        data = np.zeros(16, dtype=np.uint8)
    _cp_state(t).current.append((view, off, data))


def cp_async_16(dst, src, index):
    _cp_async(dst, src, index, True, "cp_async_16")


def cp_async_16_zfill(dst, src, index, pred):
    _cp_async(dst, src, index, bool(pred), "cp_async_16_zfill")


def cp_async_16_zfill_at(dst, src, index, offset, pred):
    _cp_async(dst, src, index, bool(pred), "cp_async_16_zfill_at", offset)


def cp_async_commit():
    st = _cp_state(_thread())
    st.committed.append(st.current)
    st.current = []


def _retire(group):
    for view, off, data in group:
        view[off:off + 16] = data


def cp_async_wait_group(n):
    n = int(n)
    st = _cp_state(_thread())
    while len(st.committed) > n:
        _retire(st.committed.popleft())


def cp_async_wait_all():
    cp_async_commit()
    cp_async_wait_group(0)


# ---------------------------------------------------------------------------
# conversions and math
# ---------------------------------------------------------------------------


def _bits16(x, dtype):
    with np.errstate(over="ignore"):  # overflow to inf is the cvt.rn result
        return int(np.array(np.float32(x)).astype(dtype).view(np.uint16))


def pack_f16x2(lo, hi):
    return _bits16(lo, np.float16) | (_bits16(hi, np.float16) << 16)


def pack_bf16x2(lo, hi):
    return _bits16(lo, ml_dtypes.bfloat16) | (_bits16(hi, ml_dtypes.bfloat16) << 16)


def unpack_f16x2(u):
    u = _u32(u)
    h = np.array([u & 0xFFFF, u >> 16], dtype=np.uint16).view(np.float16)
    return np.float32(h[0]), np.float32(h[1])


def unpack_bf16x2(u):
    u = _u32(u)
    f = np.array([(u & 0xFFFF) << 16, u & 0xFFFF0000], dtype=np.uint32).view(np.float32)
    return f[0], f[1]


_F32_TINY = np.finfo(np.float32).tiny


def ex2_approx(x):
    x = np.float32(x)
    if x != 0 and abs(x) < _F32_TINY:  # ftz input
        x = np.float32(0)
    with np.errstate(over="ignore", under="ignore"):
        r = np.exp2(x, dtype=np.float32)
    if r != 0 and abs(r) < _F32_TINY:  # ftz result
        r = np.float32(0)
    return r


def tanh_approx(x):
    return np.tanh(np.float32(x), dtype=np.float32)


def mul_wide_u32(a, b):
    p = _u32(a) * _u32(b)
    return np.uint32(p >> 32), np.uint32(p & _FULL)  # uint32, as the GPU types them


def prmt(a, b, selector):
    pool = _u32(a) | (_u32(b) << 32)
    sel, out = _u32(selector), 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return np.uint32(out)


def _mma_acc(mma):
    def twin(acc, i, a, ai, b0, b1):
        d = mma(a[ai], a[ai + 1], a[ai + 2], a[ai + 3], b0, b1, acc[i], acc[i + 1], acc[i + 2], acc[i + 3])
        for k in range(4):
            acc[i + k] = d[k]

    return twin


mma_m16n8k16_f16_acc = _mma_acc(mma_m16n8k16_f16)
mma_m16n8k16_bf16_acc = _mma_acc(mma_m16n8k16_bf16)
mma_m16n8k8_tf32_acc = _mma_acc(mma_m16n8k8_tf32)


# ---------------------------------------------------------------------------
# vectorised shared-memory access
# ---------------------------------------------------------------------------


def _shared_f32s(addr, n, what):
    """``n`` float32 at the shared address ``addr`` (aligned to their size), as a list."""
    view, off = _block(_thread()).smem.resolve(addr, 4 * n, 4 * n, what)
    return [np.float32(x) for x in view[off:off + 4 * n].view(np.float32)]


def ld_shared_v4_f32(addr):
    return tuple(_shared_f32s(addr, 4, "ld_shared_v4_f32"))


def st_shared_v4_f32(addr, x0, x1, x2, x3):
    view, off = _block(_thread()).smem.resolve(addr, 16, 16, "st_shared_v4_f32")
    view[off:off + 16] = np.array([x0, x1, x2, x3], dtype=np.float32).view(np.uint8)


def st_shared_v4_b32(addr, w0, w1, w2, w3):
    view, off = _block(_thread()).smem.resolve(addr, 16, 16, "st_shared_v4_b32")
    view[off:off + 16] = np.array([int(w) & 0xFFFFFFFF for w in (w0, w1, w2, w3)], dtype=np.uint32).view(np.uint8)


def ld_shared_v4_b32(addr):
    view, off = _block(_thread()).smem.resolve(addr, 16, 16, "ld_shared_v4_b32")
    return tuple(int(x) for x in view[off:off + 16].view(np.uint32))


def st_shared_b32(addr, w):
    view, off = _block(_thread()).smem.resolve(addr, 4, 4, "st_shared_b32")
    view[off:off + 4] = np.array([int(w) & _FULL], dtype=np.uint32).view(np.uint8)


def ld_global_cg_f32(src, index):
    a = _unwrap(src)
    if a.dtype != np.float32:
        raise TypeError(f"ld_global_cg_f32: src must be float32, got {a.dtype}")
    return np.float32(a[index])


def _global_16(ary, index, what):
    """(the root's bytes, offset) of the 16 bytes at ``ary[index]``: 16-byte aligned and
    inside the root array, as a vector load or store of the GPU requires."""
    root, off = _element(ary, index)
    if (root.ctypes.data + off) % 16:
        raise ValueError(f"{what}: the global address is not 16-byte aligned")
    data = _bytes_of(root)
    if not 0 <= off <= data.size - 16:
        raise IndexError(f"{what}: 16 bytes from the index run past the array")
    return data, off


def ld_global_cg_v4_f32(src, index):
    what = "ld_global_cg_v4_f32"
    if _unwrap(src).dtype != np.float32:
        raise TypeError(f"{what}: src must be float32, got {_unwrap(src).dtype}")
    data, off = _global_16(src, index, what)
    return tuple(np.float32(x) for x in data[off:off + 16].copy().view(np.float32))


def ld_global_nc_v4_b32(src, index):
    data, off = _global_16(src, index, "ld_global_nc_v4_b32")
    return tuple(np.uint32(x) for x in data[off:off + 16].copy().view(np.uint32))


def fence_acq_rel_gpu():
    return None


def st_global_v4_b32(dst, index, w0, w1, w2, w3):
    what = "st_global_v4_b32"
    if _unwrap(dst).itemsize != 4:
        raise TypeError(f"{what}: dst must have 4-byte elements, got {_unwrap(dst).dtype}")
    data, off = _global_16(dst, index, what)
    data[off:off + 16] = np.array([int(w) & _FULL for w in (w0, w1, w2, w3)], dtype=np.uint32).view(np.uint8)


# ---------------------------------------------------------------------------
# warp shuffles, vote.any and syncwarp (numba's simulator has none of them)
# ---------------------------------------------------------------------------


def _shuffle(op, value, src_of_lane, mask):
    """Every lane deposits ``value``; lane ``l`` gets lane ``src_of_lane(l)``'s value, or
    its own when that lane is out of range (as ``shfl.sync`` with the default clamp)."""

    def compute(inputs):
        out = []
        for lane, own in enumerate(inputs):
            src = src_of_lane(lane)
            ok = 0 <= src < 32 and inputs[src] is not None
            out.append(inputs[src] if ok else own)
        return out

    result = _warp_exchange(op, value, compute, mask)
    return type(value)(result)


def shfl_xor_sync(mask, value, lane_mask):
    m = int(lane_mask)
    return _shuffle(f"shfl.bfly {m}", value, lambda lane: lane ^ m, mask)


def shfl_sync(mask, value, src_lane):
    """``shfl.sync.idx``: each lane names its own source lane (they may differ)."""

    def compute(inputs):
        out = []
        for dep in inputs:
            if dep is None:  # not in the mask
                out.append(None)
                continue
            own, src = dep
            ok = 0 <= src < 32 and inputs[src] is not None
            out.append(inputs[src][0] if ok else own)
        return out

    return type(value)(_warp_exchange("shfl.idx", (value, int(src_lane)), compute, mask))


def shfl_down_sync(mask, value, delta):
    d = int(delta)
    return _shuffle(f"shfl.down {d}", value, lambda lane: lane + d, mask)


def shfl_up_sync(mask, value, delta):
    d = int(delta)
    return _shuffle(f"shfl.up {d}", value, lambda lane: lane - d if lane >= d else lane, mask)


def any_sync(mask, predicate):
    """``vote.sync.any``: True in every lane of ``mask`` when the predicate holds in one."""
    return _warp_exchange("vote.any", bool(predicate),
                          lambda inputs: [any(bool(x) for x in inputs if x is not None)] * len(inputs), mask)


def syncwarp(mask=_FULL):
    _warp_exchange("syncwarp", None, lambda inputs: [None] * 32, mask)


def install_warp_twins():
    """Add the shuffle, vote.any and syncwarp twins to the simulator's fake ``cuda`` module, and
    have its threads record their exit for the rendezvous (idempotent)."""
    from numba.cuda.simulator.kernel import BlockThread
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if not getattr(BlockThread.run, "_numba_flash", False):
        simulated = BlockThread.run

        def run(self):
            try:
                simulated(self)
            finally:
                _exited_threads(self._manager).add(self.thread_id)

        run._numba_flash = True
        BlockThread.run = run

    _install_direct_device_calls()
    _install_polite_block_manager()
    for name, fn in (
        ("syncwarp", syncwarp),
        ("shfl_xor_sync", shfl_xor_sync),
        ("shfl_sync", shfl_sync),
        ("shfl_down_sync", shfl_down_sync),
        ("shfl_up_sync", shfl_up_sync),
        ("any_sync", any_sync),
    ):
        if not hasattr(FakeCUDAModule, name):
            setattr(FakeCUDAModule, name, staticmethod(fn))


#: How long the simulator's launching thread sleeps between two polls of a block's threads.
_MANAGER_POLL_S = 0.0002


def _install_polite_block_manager():
    """Make the thread that runs a simulated block sleep between its polls (idempotent).

    ``BlockManager.run`` starts the block's threads, then polls all of them in a loop
    without pause (which are blocked in ``syncthreads``, which raised, which ended)
    until every one has ended.  That loop is always runnable, and it held the GIL for
    about 80 % of the time (py-spy, a 384-thread block of the Hopper backward), while
    the block's threads, which wait on each other often, got the rest.  This is the same
    loop with a short sleep between polls: a ``syncthreads`` is released at most
    ``_MANAGER_POLL_S`` later.  And it releases a ``syncthreads`` in two passes, every
    thread's ``syncthreads_blocked`` flag cleared before any thread's event is set: the
    simulator's one pass let a thread released early see a lane of its warp still marked
    blocked while the launching thread was descheduled mid-loop, and a warp collective
    waiting on that lane then reported it stuck (``_missing_lanes_stuck``; the
    ``shfl.idx`` failures under heavy load of sessions 22–23)."""
    from numba.cuda.simulator import kernel as sim

    if getattr(sim.BlockManager.run, "_numba_flash", False):
        return

    def run(self, grid_point, *args):
        threads, livethreads, blockedthreads = set(), set(), set()
        for block_point in np.ndindex(*self._block_dim):

            def target():
                self._f(*args)

            t = sim.BlockThread(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.add(t)
            livethreads.add(t)
        while livethreads:
            for t in livethreads:
                if t.syncthreads_blocked:
                    blockedthreads.add(t)
                elif t.exception:  # abort the others (not joined: as the simulator does)
                    for other in threads:
                        other.abort = True
                        other.syncthreads_blocked = False
                        other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if livethreads == blockedthreads:  # every live thread is in syncthreads: release them,
                # every flag cleared before any thread runs on: a lane released first must not see
                # another still marked blocked (the warp twins' _missing_lanes_stuck would call it stuck)
                for t in blockedthreads:
                    t.syncthreads_blocked = False
                for t in blockedthreads:
                    t.syncthreads_event.set()
                blockedthreads = set()
            livethreads = {t for t in livethreads if t.is_alive()}
            if livethreads:
                time.sleep(_MANAGER_POLL_S)  # the GIL to the block's threads
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    run._numba_flash = True
    sim.BlockManager.run = run


#: Module globals whose ``cuda`` this launch has bound to its fake module:
#: id(globals) -> (globals, the fake module, the names and what they were bound to).
_SWAPPED: dict = {}
_SWAP_LOCK = threading.Lock()


def _install_direct_device_calls():
    """Make the simulator's device-function calls direct (idempotent).

    The simulator runs a device function inside ``swapped_cuda_module``: on every call,
    under two locks, it rebinds the function module's ``cuda`` to the launch's fake
    module and back when the last thread leaves.  With a block's 384 threads each making
    thousands of such calls (the masks, the score steps), those locks and rebinds
    dominated a launch: the Hopper backward's two kernels took minutes.  Here a module's
    ``cuda`` is rebound once per launch, the first time one of its functions runs in it,
    and restored when the launch ends; a call then is a plain Python call.  (A module's
    functions only ever see the fake module of the launch running them.)"""
    from numba.cuda.simulator import kernel as sim

    if getattr(sim.FakeCUDAKernel.__call__, "_numba_flash", False):
        return
    simulated = sim.FakeCUDAKernel.__call__

    def call(self, *args):
        ctx = sim._kernel_context
        if ctx is None and not self._device:  # a launch: restore what it rebound when it ends
            try:
                return simulated(self, *args)
            finally:
                with _SWAP_LOCK:
                    for g, _, orig in _SWAPPED.values():
                        g.update(orig)
                    _SWAPPED.clear()
        if ctx is None:  # a device function called outside a kernel: as the simulator does
            return simulated(self, *args)
        g = self.fn.__globals__
        entry = _SWAPPED.get(id(g))
        if entry is None or entry[1] is not ctx:
            from numba import cuda

            with _SWAP_LOCK:
                entry = _SWAPPED.get(id(g))
                if entry is None or entry[1] is not ctx:
                    orig = {k: v for k, v in g.items() if v is cuda}
                    g.update({k: ctx for k in orig})
                    _SWAPPED[id(g)] = (g, ctx, orig)
        return self.fn(*args)

    call._numba_flash = True
    sim.FakeCUDAKernel.__call__ = call


# ---------------------------------------------------------------------------
# Hopper: wgmma, mbarrier, bulk copies (twins that complete at issue)
# ---------------------------------------------------------------------------
# A twin does its work when it is called: wgmma's product lands in the accumulators
# at once and a bulk copy's bytes at once (completing their mbarrier transaction), so
# the fences, commit and wait groups and setmaxnreg have nothing to do.  What a twin
# checks is what the hardware needs: all 128 threads of a warpgroup in one wgmma with
# the same descriptors, operands inside registered shared arrays, 16-byte alignment.


def _nothing(name):
    """A twin with nothing to do (each its own function: ``ptx`` gives it a docstring)."""

    def twin(*args):
        _thread()  # only inside a simulated kernel, as the real one

    twin.__name__ = name
    return twin


(fence_proxy_async, wgmma_fence, wgmma_commit_group, wgmma_wait_group, setmaxnreg_inc, setmaxnreg_dec,
 hold_u32x4, hold_f32x4) = (_nothing(n) for n in ("fence_proxy_async", "wgmma_fence", "wgmma_commit_group",
                                                  "wgmma_wait_group", "setmaxnreg_inc", "setmaxnreg_dec",
                                                  "hold_u32x4", "hold_f32x4"))  # fmt: skip


def _desc_fields(desc):
    """(start address, LBO, SBO, swizzle) of a wgmma matrix descriptor."""
    d = int(desc)
    return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4, d >> 62


def swizzle_128b(addr):
    """The byte address a 128-byte swizzle puts ``addr`` at (CuTe's Swizzle<3, 4, 3>):
    the 16-byte chunk (bits 4-6) XOR the row of 128 bytes within 1024 (bits 7-9).  TMA
    writes a swizzled box this way and wgmma reads it back; both on the shared address
    itself, so a swizzled tile starts on a 1024-byte boundary (descriptor base offset 0)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def _wgmma_operand(window, desc, rows, dec, what, mn_major=False):
    """The (rows × 16) operand a descriptor names, element (r, k) at (PTX ISA, "Matrix
    Descriptor"; CuTe's canonical GMMA layouts; T = 8 elements = 16 bytes):

    * K-major, no swizzle: 8 × 8 core matrices of 128 contiguous bytes, core (r/8, k/8)
      at start + (r/8)·SBO + (k/8)·LBO (the layout the H200 confirmed);
    * K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups SBO apart, k at 2k
      bytes within the row (LBO unused);
    * MN-major (``mn_major``, imm-trans-b), 128-byte swizzle: K rows of 128 bytes (64
      elements of r), 8-row groups SBO apart, 64-element atoms of r LBO apart;
    * MN-major, no swizzle: core matrices of 8 r-contiguous elements by 8 k rows, (r/8)
      SBO apart and (k/8) LBO apart;

    the 128-byte swizzle then applied to each element's address (``swizzle_128b``)."""
    addr, lbo, sbo, swizzle = _desc_fields(desc)
    if swizzle not in (0, 1):
        raise NotImplementedError(f"{what}: the simulator twin reads no swizzle or the 128-byte one, got mode {swizzle}")
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    if not mn_major and not swizzle:
        at = addr + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
    elif not mn_major:
        at = addr + (r // 8) * sbo + (r % 8) * 128 + k * 2
    elif swizzle:
        at = addr + (r // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (r % 64) * 2
    else:
        at = addr + (r // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (r % 8) * 2
    if swizzle:
        at = swizzle_128b(at)
    lo, hi = int(at.min()), int(at.max()) + 2
    view, off = window.resolve(lo, hi - lo, 2, what)
    halves = view[off:off + hi - lo].view(np.uint8)
    idx = (at - lo)
    words = halves[idx].astype(np.uint16) | (halves[idx + 1].astype(np.uint16) << 8)
    return dec(words)


def _a_from_registers(inputs, dec):
    """A (64 × 16) of a register-A wgmma: each warp's 16 rows from its lanes' four words,
    in mma.sync m16n8k16's A layout (``_fill_k16``)."""
    A = np.zeros((64, 16))
    for w in range(4):
        words = np.array([x[0] for x in inputs[32 * w:32 * w + 32]], dtype=np.uint64)
        _fill_k16(dec)(np.concatenate([words, np.zeros((32, 2), np.uint64)], axis=1), A[16 * w:16 * w + 16],
                       np.zeros((16, 8)))  # fmt: skip
    return A


def _wgmma_twin(n, kind, a_in_regs, b_mn=False):
    """wgmma m64n{n}k16: A through its descriptor (K-major), or (``a_in_regs``) from each
    thread's four words; B through its descriptor (``b_mn``: MN-major); D scattered in
    the accumulator layout."""
    dec = _dec_f16 if kind == "f16" else _dec_bf16
    how = f"{'rs_' if a_in_regs else ''}{'bmn_' if b_mn else ''}"
    name = f"wgmma_m64n{n}k16_{kind}_{how}acc"
    regs = n // 2
    # thread (warp w, g, t) holds D[16w + g (+8), 8j + 2t (+1)] at 4j + e
    tid = np.arange(128)[:, None]
    e = np.arange(regs)[None, :]
    rows = 16 * (tid // 32) + (tid % 32) // 4 + 8 * ((e % 4) // 2)
    cols = 8 * (e // 4) + 2 * (tid % 4) + e % 2
    same = slice(1, 3) if a_in_regs else slice(0, 3)  # what every thread must pass alike

    def run(acc, i, a, desc_b, scale_d):
        t = _thread()
        st = _block(t)
        arr, i = _unwrap(acc), int(i)
        mine = (a, int(desc_b), int(scale_d) != 0, arr[i:i + regs].astype(np.float64))

        def compute(inputs):
            if any(x is None for x in inputs):
                raise RuntimeError(f"{name}: needs all 128 threads of the warpgroup, "
                                   f"{sum(x is not None for x in inputs)} of them called it")  # fmt: skip
            first = inputs[0]
            if any(x[same] != first[same] for x in inputs):
                raise ValueError(f"{name}: the warpgroup's threads passed different descriptors or scale_d")
            A = _a_from_registers(inputs, dec) if a_in_regs else _wgmma_operand(st.smem, first[0], 64, dec, name)
            out = (A @ _wgmma_operand(st.smem, first[1], n, dec, name, b_mn).T)[rows, cols]
            if first[2]:
                out = out + np.stack([x[3] for x in inputs])
            return list(out.astype(np.float32))

        arr[i:i + regs] = st.warpgroup(t.thread_id // 128).exchange(name, mine, compute)

    if a_in_regs:
        def twin(acc, i, a, ai, desc_b, scale_d):
            run(acc, i, tuple(_u32(a[int(ai) + k]) for k in range(4)), desc_b, scale_d)
    else:
        def twin(acc, i, desc_a, desc_b, scale_d):
            run(acc, i, int(desc_a), desc_b, scale_d)

    twin.__name__ = name
    return twin


for _n in (8, 16, 32, 64, 80, 128, 160, 192, 256):  # ptx.WGMMA_N
    for _k in ("f16", "bf16"):
        globals()[f"wgmma_m64n{_n}k16_{_k}_acc"] = _wgmma_twin(_n, _k, False)
        globals()[f"wgmma_m64n{_n}k16_{_k}_rs_acc"] = _wgmma_twin(_n, _k, True)
        globals()[f"wgmma_m64n{_n}k16_{_k}_rs_bmn_acc"] = _wgmma_twin(_n, _k, True, True)
del _n, _k


class _Mbarrier:
    """One mbarrier: arrivals still expected in the current phase, transaction bytes
    still to land, phases completed."""

    __slots__ = ("count", "pending", "tx", "phases")

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phases = count, count, 0, 0

    def settle(self):
        if self.pending == 0 and self.tx == 0:
            self.phases += 1
            self.pending = self.count


def _mbarrier(st, addr, what):
    addr = int(addr) & _FULL
    st.smem.resolve(addr, 8, 8, what)
    b = st.mbarriers.get(addr)
    if b is None:
        raise RuntimeError(f"{what}: the mbarrier at shared address {addr:#x} was not initialised (mbarrier_init)")
    return b


def mbarrier_init(addr, count):
    st = _block(_thread())
    addr = int(addr) & _FULL
    st.smem.resolve(addr, 8, 8, "mbarrier_init")
    if int(count) < 1:
        raise ValueError(f"mbarrier_init: count={int(count)}: expected >= 1")
    with st.lock:
        st.mbarriers[addr] = _Mbarrier(int(count))


def _mbarrier_update(st, addr, what, arrivals, tx):
    """``arrivals`` arrive on the mbarrier and its phase's transaction bytes grow by
    ``tx`` (a copy that lands: negative); the phase completes when both reach 0."""
    with st.lock:
        b = _mbarrier(st, addr, what)
        b.tx += int(tx)
        b.pending -= arrivals
        b.settle()


def mbarrier_arrive_expect_tx(addr, tx_bytes):
    _mbarrier_update(_block(_thread()), addr, "mbarrier_arrive_expect_tx", 1, tx_bytes)


def mbarrier_arrive(addr):
    _mbarrier_update(_block(_thread()), addr, "mbarrier_arrive", 1, 0)


def mbarrier_try_wait_parity(addr, parity):
    st = _block(_thread())
    with st.lock:
        done = (_mbarrier(st, addr, "mbarrier_try_wait_parity").phases & 1) != (int(parity) & 1)
    if not done:
        time.sleep(0.001)  # a spinning thread lets the others run
    return np.uint32(1 if done else 0)


class _NamedBarrier:
    """``bar.sync`` / ``bar.arrive`` of one id: threads arrived in the current round, and
    the rounds completed (the syncing threads wait for theirs to complete)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.arrived, self.rounds, self.count = 0, 0, None

    def arrive(self, count, what):
        count = int(count)
        if count <= 0 or count % 32:
            raise ValueError(f"{what}: count={count}: expected a positive multiple of 32")
        if self.count is not None and self.arrived and count != self.count:
            raise RuntimeError(f"{what}: count={count} while this round counts {self.count}")
        self.count = count
        self.arrived += 1
        if self.arrived == count:
            self.arrived = 0
            self.rounds += 1
            self.cond.notify_all()


def _named(bar_id, what):
    st = _block(_thread())
    if not 1 <= int(bar_id) <= 15:
        raise ValueError(f"{what}: bar_id={int(bar_id)}: expected 1..15 (0 is syncthreads')")
    with st.lock:
        return st.named.setdefault(int(bar_id), _NamedBarrier())


def named_barrier_arrive(bar_id, count):
    nb = _named(bar_id, "named_barrier_arrive")
    with nb.cond:
        nb.arrive(count, "named_barrier_arrive")


def named_barrier_sync(bar_id, count):
    nb = _named(bar_id, "named_barrier_sync")
    with nb.cond:
        round_ = nb.rounds
        nb.arrive(count, "named_barrier_sync")
        while nb.rounds == round_:
            nb.cond.wait(0.05)


# --- thread-block clusters: the simulator runs one block at a time, so a cluster of one CTA


def cluster_arrive_release():
    t = _thread()
    st = _block(t)
    with st.lock:
        nb = st.named.setdefault("cluster", _NamedBarrier())
    with nb.cond:
        t._numba_flash_cluster_round = nb.rounds  # the phase this thread's wait waits for
        nb.arrive(st.nthreads, "cluster_arrive_release")


def cluster_wait_acquire():
    t = _thread()
    st = _block(t)
    round_ = getattr(t, "_numba_flash_cluster_round", None)
    if round_ is None:
        raise RuntimeError("cluster_wait_acquire: this thread has not arrived (cluster_arrive_release)")
    nb = st.named["cluster"]
    with nb.cond:
        while nb.rounds == round_:
            nb.cond.wait(0.05)
    t._numba_flash_cluster_round = None


def sm_clock():
    _thread()
    return np.uint32(time.perf_counter_ns() & 0xFFFFFFFF)


def global_timer_lo():
    _thread()
    return np.uint32(time.time_ns() & 0xFFFFFFFF)


def cluster_ctarank():
    _thread()
    return np.uint32(0)


def mapa_shared_cluster(addr, rank):
    _thread()
    if int(rank) != 0:
        raise ValueError(f"mapa_shared_cluster: rank={int(rank)}: the simulator runs clusters of one CTA (rank 0)")
    return np.uint32(int(addr))


def ld_shared_cluster_f32(addr):  # (rank 0's: this CTA's own shared memory)
    return _shared_f32s(addr, 1, "ld_shared_cluster_f32")[0]


def ld_shared_cluster_v4_f32(addr):
    return tuple(_shared_f32s(addr, 4, "ld_shared_cluster_v4_f32"))


def _bulk_global(ary, index, nbytes, what):
    """``(the root array's bytes, byte offset, nbytes)`` of a bulk copy's global source,
    the ``nbytes`` at ``ary[index]``: a positive multiple of 16, 16-byte aligned, inside
    the array."""
    nbytes = int(nbytes)
    if nbytes <= 0 or nbytes % 16:
        raise ValueError(f"{what}: nbytes={nbytes}: expected a positive multiple of 16")
    root, off = _element(ary, index)
    if (root.ctypes.data + off) % 16:
        raise ValueError(f"{what}: the global source is not 16-byte aligned")
    data = _bytes_of(root)
    if off + nbytes > data.size:
        raise IndexError(f"{what}: {nbytes} bytes from the source index run past the array")
    return data, off, nbytes


def cp_async_bulk_g2s(dst, src, index, nbytes, mbar):
    what = "cp_async_bulk_g2s"
    st = _block(_thread())
    data, off, nbytes = _bulk_global(src, index, nbytes, what)
    view, doff = st.smem.resolve(dst, nbytes, 16, what)
    view[doff:doff + nbytes] = data[off:off + nbytes]
    _mbarrier_update(st, mbar, what, 0, -nbytes)


def _tma_twin(rank):
    """``cp.async.bulk.tensor.{rank}d``: the box at coordinates (c0 innermost, ...) of the
    simulator's tensor map (``tma.SIM_MAPS``, keyed by the map's first 8 bytes), zeros
    past the array's edges, written densely (row-major, innermost contiguous) from
    ``dst``, each byte moved by the map's 128-byte swizzle (``swizzle_128b``); its bytes
    complete the mbarrier's transaction."""
    name = f"cp_async_bulk_tensor_{rank}d_g2s"

    def twin(dst, tmap, *rest):
        from numba_flash import tma

        st = _block(_thread())
        coords, mbar = [int(c) for c in rest[:rank]], rest[rank]
        key = int(np.asarray(_unwrap(tmap))[:8].view(np.uint64)[0])
        if key not in tma.SIM_MAPS:
            raise ValueError(f"{name}: the tensor map is not one of the simulator's (tma.tensor_map)")
        array, box, swizzle = tma.SIM_MAPS[key]
        if array.ndim != rank:
            raise ValueError(f"{name}: a {array.ndim}-d tensor map")
        dst = int(dst) & _FULL
        if dst % (1024 if swizzle == 128 else 128):
            raise ValueError(f"{name}: shared address {dst:#x} is not {1024 if swizzle == 128 else 128}-byte aligned")
        if swizzle not in (0, 128) or (swizzle and box[-1] * array.itemsize != 128):
            raise NotImplementedError(f"{name}: the twin copies unswizzled boxes, or 128-byte rows with the "
                                      "128-byte swizzle")  # fmt: skip
        if coords[0] * array.itemsize % 16:
            raise ValueError(f"{name}: the innermost coordinate {coords[0]} is not 16 bytes into a row")
        out = np.zeros(box, dtype=array.dtype)
        lo = coords[::-1]  # outermost first, as the array
        # the box's part inside the tensor (TMA zero-fills the rest, and a box wholly past an edge
        # is all zeros: a varlen walk's boxes past the last rows)
        src = tuple(slice(min(max(c, 0), n), min(max(c + b, 0), n)) for c, b, n in zip(lo, box, array.shape))
        if all(s_.stop > s_.start for s_ in src):
            out[tuple(slice(s_.start - c, s_.stop - c) for s_, c in zip(src, lo))] = array[src]
        data = out.reshape(-1).view(np.uint8)
        nbytes = data.size
        view, doff = st.smem.resolve(dst, nbytes, 16, name)
        at = np.arange(nbytes) + dst
        if swizzle:
            at = swizzle_128b(at)
        view[doff + (at - dst)] = data
        _mbarrier_update(st, mbar, name, 0, -nbytes)

    twin.__name__ = name
    return twin


cp_async_bulk_tensor_2d_g2s, cp_async_bulk_tensor_3d_g2s, cp_async_bulk_tensor_4d_g2s = (_tma_twin(r) for r in (2, 3, 4))

"""The public API: ``flash_attention`` and ``flash_attention_backward``.

Host side only: check the arguments, ask the launch plan (``numba_flash.plan``) which
kernels run, bind their arguments to arrays, launch them on CuPy's current stream, and
hand back arrays of the caller's kind.  The math is in the kernels
(``numba_flash.kernels``) and in the NumPy reference (``numba_flash.reference``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os

import numpy as np

from numba_flash import _arrays as A
from numba_flash import _launch, _replay
from numba_flash import plan as P
from numba_flash import variant as V
from numba_flash._launch import launch
from numba_flash._numba_cuda import SIMULATOR, l2_cache, target_arch
from numba_flash.kernels import spec
from numba_flash.reference import keep_threshold, seed_key

_VIEW_DTYPES = {"u16": np.uint16, "u32": np.uint32, "f32": np.float32}


def _out_shape(layout: str, B: int, N: int, H: int, d: int):
    return (B, N, H, d) if layout == "bshd" else (B, H, N, d)


def _bshd(arr, layout: str):
    return arr if layout == "bshd" else arr.transpose(0, 2, 1, 3)


def _plan_env() -> tuple:
    """The environment the plan reads: the tuning override and the wgmma kernels' switches
    (and ``L2_SECTIONS``, which the call's ``params`` read: a replayed call keeps its own)."""
    return (os.environ.get("NUMBA_FLASH_TILES"),) + tuple(
        os.environ.get(f"NUMBA_FLASH_{x}") for x in ("WGMMA", "WGMMA_PERSISTENT", "WGMMA_CONSUMERS", "WGMMA_BWD_RING",
                                                      "RAW_SCORES", "ALIBI_PRODUCTS", "WGMMA_SCHEDULER",
                                                      "CLUSTER_MERGE", "WGMMA_BWD_PIPE", "WGMMA_SPLIT",
                                                      "WGMMA_BWD_PERSISTENT", "L2_SECTIONS", "WGMMA_HOLD",
                                                      "WGMMA_BWD_HOLD"))  # fmt: skip


def _plan(problem: P.Problem) -> P.Plan:
    """The plan of ``problem``, made once: the same shapes come again and again (the
    tuning override and the wgmma kernels' switches are part of the key, so a run that
    changes them is obeyed)."""
    env = _plan_env()
    return _cached_plan(problem, env[0], env[1:])


@functools.lru_cache(maxsize=512)
def _cached_plan(problem: P.Problem, override, wgmma) -> P.Plan:
    return P.plan(problem)


@functools.lru_cache(maxsize=8)
def _dummies(device: int):
    """Stand-ins for the ALiBi slopes, varlen offsets and FlexAttention's ``fx`` when a
    call has none (the kernels read them only with the feature on)."""
    xp = np if SIMULATOR else A._cupy()
    return xp.zeros((1, 1), np.float32), xp.zeros((1,), np.int32), plain_fx(xp)


def _scheduler(walk=None):
    """The ``sched`` buffer: a fresh zeroed counter (int32 pair) for a launch whose
    persistent blocks take their tiles in turn (``wgmma_forward.dynamic_tiles``), made when
    a launch binds it (a callable role: the checked path and the replay call it)."""
    return (np if SIMULATOR else A._cupy()).zeros((2,), np.int32)


#: The forward's ``sched`` and ``sched0`` buffers (``wgmma_forward.launches`` binds one),
#: both made when a launch binds them: a fresh counter, or for a launch with the static
#: order (which never reads it) the varlen offsets' int32 stand-in, pinned in a replay.
SCHEDULER_BUFFERS = {"sched": _scheduler, "sched0": lambda walk=None: _dummies(_device_id())[1]}


def plain_fx(xp) -> tuple:
    """``fx`` of a call without mods (``kernels.flex``): no mod_args, one-entry lists
    and order, a one-entry block table, split and split-KV merge outputs (never read)."""
    count, visit, order = xp.zeros((1, 1, 1), np.int32), xp.zeros((1, 1, 1, 1), np.int32), xp.zeros((1,), np.int32)
    return ((), (), count, visit, count, visit, order, xp.zeros((1, 1), np.int32), xp.zeros((5,), np.int32),
            xp.zeros((1, 1, 1, 1), np.uint32), xp.zeros((1, 1, 1), np.float32), xp.zeros((1,), np.int32))


def _device_id() -> int:
    return -1 if SIMULATOR else A._cupy().cuda.Device().id


def _tensor_maps(k, buffers: dict, layout: str):
    """The TMA maps of launch ``k``, made from the bound q, k, v (and dout): its tiles
    give the boxes (or its ``boxes``: a paged cache's key boxes)."""
    from numba_flash import tma

    u16 = {r: _bshd(buffers[r].view(_VIEW_DTYPES["u16"]), layout) for r in ("q", "k", "v", "dout") if r in buffers}
    rows_q, rows_k = k.boxes or (k.tiles.block_m, k.tiles.block_n)
    return tma.attention_maps(u16["q"], u16["k"], u16["v"], rows_q, rows_k, dout=u16.get("dout"))


#: The backward's own 4-D workspace (``_workspace_shapes``), in no caller's layout.
_OWN = ("stats",)

#: Roles whose arguments a call's signature pins (the scale: softmax_scale and d; the flex
#: and scheduler's dummies: the device): a replay leaves their recorded slots as they are.
_PINNED = ("scale", "flex", "sched0")


def _run(plan: P.Plan, buffers: dict, layout: str, rec: _replay.Recording | None = None) -> None:
    """Launch every kernel of ``plan`` with its arguments bound to ``buffers`` (role →
    array in the caller's layout, or the float scale), 4-D arrays seen as (B, N, H, d).
    A callable buffer is asked for the launch's (its tile walk: ``flex``'s visit lists).
    ``rec``: record each launch there (``_replay``; the calls that record have no
    callable buffers)."""
    for k in plan.launches:
        args = []
        for a in k.args:
            if a.role == "tmaps":
                args.append(_tensor_maps(k, buffers, layout))
                continue
            x = buffers[a.role]
            if callable(x):
                x = x(k.walk)
            if a.view:
                x = x.view(_VIEW_DTYPES[a.view])
            # q, k, v, out, dout and the grads in the caller's layout; ``stats`` is the backward's
            # own workspace, never transposed
            args.append(_bshd(x, layout) if getattr(x, "ndim", 0) == 4 and a.role not in _OWN else x)
        launch(k.kernel, k.grid, k.threads, k.smem, *args, cluster=k.cluster)
        if rec is not None:
            roles = [None if a.role in _PINNED else a.role for a in k.args]
            rec.launches.append(_launch.recorded(k.kernel, k.grid, k.threads, k.smem, args, roles, k.cluster))
            maker = (lambda bufs, k=k: _tensor_maps(k, bufs, layout)) if "tmaps" in roles else None
            rec.maps.append(None if maker is None else (maker, {}))


def _run_checked(plan: P.Plan, buffers: dict, layout: str, var, rec=None) -> None:
    """:func:`_run`; with a user's score_mod / mask_mod inlined, a numba compile error
    becomes a TypeError (``flex.compile_error``)."""
    if var.flex is None:
        _run(plan, buffers, layout, rec)
        return
    try:
        _run(plan, buffers, layout)
    except Exception as exc:
        from numba_flash.flex import compile_error

        err = compile_error(exc)
        if err is None:
            raise
        raise err from exc


def _signature(pass_, arrays, keywords, optional_arrays, *mods):
    """The call's ``_replay.signature``, or None: FlexAttention mods (``score_mod``,
    ``block_mask``, ``score_mod_grad``, ``mod_args``) always take the checked path."""
    if any(m is not None for m in mods[:2] + mods[3:]) or type(mods[2]) is not tuple or mods[2]:
        return None
    return _replay.signature(pass_, arrays, keywords, optional_arrays, _plan_env())


def _flex(score_mod, score_mod_grad, block_mask, mod_args, B, H, Nq, Nk, backward, lengths=None):
    """A FlexCall maker for ``_Variants`` (it knows the window), or None without mods;
    ``lengths``: varlen's (B, 2) sequence lengths (queries, keys), Nq, Nk the longest."""
    if score_mod is None and block_mask is None and score_mod_grad is None:
        if not isinstance(mod_args, (tuple, list)) or mod_args:
            raise ValueError(f"mod_args: given ({type(mod_args).__name__}) without a score_mod to read them "
                             "(a block mask's mask_mod has its own, BlockMask.mod_args)")  # fmt: skip
        return None
    from numba_flash.flex import FlexCall

    return lambda window: FlexCall(score_mod, score_mod_grad, block_mask, mod_args, batch=B, heads=H, seqlen_q=Nq,
                                   seqlen_k=Nk, window=window, backward=backward, lengths=lengths)  # fmt: skip


def _check_qkv(q, k, v, causal, softmax_scale, layout):
    """The checks the forward and backward share; returns
    (layout, causal, (q_op, k_op, v_op), (B, Nq, Nk, H, d), scale)."""
    A.require_runtime()
    layout = A.check_layout(layout)
    causal = A.check_flag("causal", causal)
    ops = tuple(A.check_operand(name, x, layout) for name, x in (("q", q), ("k", k), ("v", v)))
    dims = A.check_qkv(*ops, layout)
    return layout, causal, ops, dims, A.check_scale(softmax_scale, dims[-1])


def _check_packed(q, k, v, causal, softmax_scale):
    """:func:`_check_qkv` for varlen's (total, H, d) operands (seen as batch 1)."""
    A.require_runtime()
    causal = A.check_flag("causal", causal)
    ops = tuple(A.check_packed(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    dims = A.check_qkv(*ops, "bshd")
    return causal, ops, dims, A.check_scale(softmax_scale, dims[-1])


def _check_offsets(q_op, total_q, total_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """varlen's offsets and longest lengths, checked: (cu_q, cu_k, lengths, max_q, max_k),
    ``lengths`` the (batch, 2) int64 lengths of the sequences (queries, keys) on the host."""
    cu_q, len_q, max_q = A.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q_op, total_q, "max_seqlen_q", max_seqlen_q)
    cu_k, len_k, max_k = A.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q_op, total_k, "max_seqlen_k", max_seqlen_k)
    if len_k.size != len_q.size:
        raise ValueError(f"cu_seqlens_k: expected {len_q.size + 1} offsets (as cu_seqlens_q), got {len_k.size + 1}")
    return cu_q, cu_k, np.stack([len_q, len_k], axis=1), max_q, max_k


class _Variants:
    """A call's checked variant arguments: the kernels' flags and run-time values."""

    def __init__(self, q_op, k_op, B, H, causal, window_size, softcap, alibi_slopes, dropout_p, seed, seqlen_k,
                 varlen=False, flex=None, seqlen_q=0, pass_="forward"):  # fmt: skip
        # ``seqlen_k``: what FlashAttention-2 compares the window's sides with (``variant.fa2_window``)
        self.window = V.fa2_window(V.check_window(window_size), seqlen_k)
        self.softcap = V.check_softcap(softcap)
        self.dropout_p, self.seed = V.check_dropout(dropout_p, seed)
        self.alibi = None if alibi_slopes is None else A.check_alibi(alibi_slopes, q_op, B, H)
        H_kv = k_op.view.shape[2]
        self.group = H // H_kv if H_kv else 1
        self.heads_k = H_kv
        self.flex = flex(self.window if not causal else (self.window[0], 0)) if flex else None
        self.features = V.variant_of(False, self.window, self.softcap, self.alibi is not None, self.dropout_p,
                                     varlen, self.group, self.flex.mods if self.flex else None)  # fmt: skip
        self.causal = causal
        # a heaviest-first grid's L2 sections (none without ``seqlen_q``: a KV cache's calls);
        # NUMBA_FLASH_L2_SECTIONS=off: every head in one, the order before session 32; =queries,
        # =keys: the query-row (forward, dQ) or key-row (dK/dV) grids' only; =shared: session 32's
        # rule alone, without the forward's unshared streams past one L2 (``spec.l2_sections``'
        # ``unshared``, on by default since session 36)
        d = q_op.view.shape[-1]
        which = os.environ.get("NUMBA_FLASH_L2_SECTIONS", "on")
        if which not in ("on", "off", "queries", "keys", "shared"):
            raise ValueError(f"NUMBA_FLASH_L2_SECTIONS={which!r}: expected on, off, queries, keys or shared")
        sq, sk = (spec.l2_sections(pass_, B, H, self.group, seqlen_q, seqlen_k, d, q_op.dtype.itemsize, *l2_cache(),
                                   unshared=which != "shared")
                  if seqlen_q and which != "off" else (0, 0))  # fmt: skip
        self.sections = (0 if which == "keys" else sq, 0 if which == "queries" else sk)
        self.params = self._params()

    def _params(self) -> tuple:
        """The kernels' run-time ``params`` (``variant.params``)."""
        keep = dict(keep_threshold=keep_threshold(self.dropout_p), seed_key=seed_key(self.seed),
                    keep_scale=1.0 / (1.0 - self.dropout_p)) if self.dropout_p > 0 else {}  # fmt: skip
        return V.params(self.group, self.window, self.causal, self.softcap, sections=self.sections, **keep)

    def again(self, dropout_p, seed, alibi_slopes) -> "_Variants":
        """These variants for a replayed call (``_replay``), whose signature pinned every
        argument but the seed's value and the ALiBi slopes' data: the seed checked, the
        params made again, the slopes shaped as ``check_alibi`` shapes them."""
        p, seed = V.check_dropout(dropout_p, seed)
        if p == 0.0 and alibi_slopes is None:  # nothing of this call's own: the recorded ones
            return self
        new = copy.copy(self)
        new.dropout_p, new.seed = p, seed
        new.params = new._params()
        if alibi_slopes is not None:
            new.alibi = A.alibi_rows(alibi_slopes)
        return new

    def buffers(self, cu_q=None, cu_k=None) -> dict:
        alibi0, cu0, fx0 = _dummies(_device_id())
        fx = self.flex.fx if self.flex else None  # per launch: its tiles' visit lists
        return {"params": self.params, "alibi": alibi0 if self.alibi is None else self.alibi,
                "cu_seqlens_q": cu0 if cu_q is None else cu_q, "cu_seqlens_k": cu0 if cu_k is None else cu_k,
                "flex": fx0 if fx is None else fx}


def _plan_for(pass_, op, dims, causal, allow_tf32, arrays, var: _Variants, rows_q=0) -> P.Plan:
    """The plan of a call; with a dense block mask whose blocks straddle the kernels'
    tiles, planned again with the mask function that decides those tiles
    (``flex.FlexCall.adapt``)."""
    plan = _plan(_problem(pass_, op, dims, causal, allow_tf32, arrays, var, rows_q))
    if var.flex is not None and var.flex.adapt([k.walk for k in plan.launches if k.walk]):
        var.features = dataclasses.replace(var.features, mods=var.flex.mods)
        plan = _plan(_problem(pass_, op, dims, causal, allow_tf32, arrays, var, rows_q))
    return plan


def _problem(pass_, op, dims, causal, allow_tf32, arrays, var: _Variants, rows_q=0) -> P.Problem:
    B, Nq, Nk, H, d = dims
    aligned = all(A.aligned16(x) for x in arrays)
    return P.Problem(pass_, A.dtype_name(op.dtype), d, causal, allow_tf32, aligned, B, H, Nq, Nk,
                     target_arch(), SIMULATOR, var.features, var.heads_k, rows_q)  # fmt: skip


def _forward(q_op, k_op, v_op, dims, causal, scale, var, allow_tf32, layout, out_shape, lse_shape, cu=(None, None),
             rows_q=0, key=None):
    """Run the forward plan; returns (out, lse) on the compute side, in ``out_shape``
    (q's) and ``lse_shape``; the kernels see (B, N, H, d) views of them.  ``key``: the
    call's ``_replay.signature``, under which its launches are recorded."""
    B, Nq, Nk, H, d = dims
    if scale <= 0 and not var.features.nonpositive_scale:  # the raw scores' max is not the scaled ones'
        var.features = dataclasses.replace(var.features, nonpositive_scale=True)
    kind = q_op.kind
    out = A.empty(kind, out_shape, q_op.dtype)
    lse = A.empty(kind, lse_shape, np.float32)
    if 0 in (B, H, Nq) or (Nk == 0 and not var.features.varlen):  # nothing to launch: no row sees a key
        out.fill(0)
        lse.fill(-np.inf)
        return out, lse
    qc, kc, vc = (A.to_compute(op.array, kind) for op in (q_op, k_op, v_op))
    plan = _plan_for("forward", q_op, dims, causal, allow_tf32, (qc, kc, vc), var, rows_q)
    work = A.SUPPORTED_BY_NAME[plan.work_dtype]
    if work != q_op.dtype:  # bf16 on fp32 copies
        qc, kc, vc = (x.astype(work) for x in (qc, kc, vc))
    o = out if work == q_op.dtype else A.empty(kind, out.shape, work)
    rec = None
    if key is not None and o is out and var.flex is None:
        rec = _replay.Recording(plan, layout, dict(var=var, scale=scale, out_shape=out_shape, lse_shape=lse_shape,
                                                  q_op=A.Operand("q", kind, None, None)))  # fmt: skip
    _run_checked(plan, _forward_buffers(qc, kc, vc, o, lse, scale, var, cu), layout, var, rec)
    if rec is not None:
        _replay.store(key, rec)
    if o is not out:
        out[...] = o.astype(out.dtype)
    return out, lse


def _forward_buffers(q, k, v, out, lse, scale, var, cu) -> dict:
    """The forward's buffers by role (``_run``): varlen's (total, H, d) seen as
    (1, total, H, d), its lse (H, total) as (1, H, total)."""
    buffers = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "scale": scale, **var.buffers(*cu),
               **SCHEDULER_BUFFERS}  # fmt: skip
    if var.features.varlen:
        buffers.update({r: buffers[r][None] for r in ("q", "k", "v", "out", "lse")})
    return buffers


def _replay_forward(rec: _replay.Recording, q, k, v, dropout_p, seed, alibi_slopes, cu=(None, None)):
    """A recorded forward for this call's arrays (``_replay``): (out, lse)."""
    st = rec.state
    var = st["var"].again(dropout_p, seed, alibi_slopes)
    out = A.empty("device", st["out_shape"], q.dtype)
    lse = A.empty("device", st["lse_shape"], np.float32)
    rec.run(_forward_buffers(q, k, v, out, lse, st["scale"], var, cu), _run)
    return out, lse


def _replay_offsets(rec: _replay.Recording, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """A replayed varlen call's offsets on the compute side (cu_q, cu_k), their values
    checked as every call's are (:func:`_check_offsets`)."""
    return _check_offsets(rec.state["q_op"], q.shape[0], k.shape[0], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k)[:2]  # fmt: skip


def _backward(ops, lse_arr, dims, causal, scale, var, allow_tf32, layout, shapes, cu=(None, None), rows_q=0,
              key=None):  # fmt: skip
    """Run the backward plan; ``ops`` are the (q, k, v, dout, out) operands; returns
    (dq, dk, dv) on the compute side in ``shapes``.  ``key`` as :func:`_forward`'s."""
    B, Nq, Nk, H, d = dims
    q_op = ops[0]
    kind = q_op.kind
    grads = [A.empty(kind, shape, q_op.dtype) for shape in shapes]
    if 0 in (B, H, Nq, Nk):  # no (query, key) pair: every gradient is 0
        for g in grads:
            g.fill(0)
        return grads
    computed = [A.to_compute(op.array, kind) for op in ops]
    plan = _plan_for("backward", q_op, dims, causal, allow_tf32, computed, var, rows_q)
    work = A.SUPPORTED_BY_NAME[plan.work_dtype]
    if work != q_op.dtype:  # bf16 on fp32 copies
        computed = [x.astype(work) for x in computed]
    work_grads = grads if work == q_op.dtype else [A.empty(kind, g.shape, work) for g in grads]
    lse_c = A.to_compute(lse_arr, kind)
    spaces = _workspace_shapes(plan, lse_c.shape, var, B, H, rows_q)
    workspace = _workspace(kind, spaces)
    rec = None
    if key is not None and work_grads is grads and var.flex is None:
        rec = _replay.Recording(plan, layout, dict(var=var, scale=scale, shapes=shapes, workspace=spaces,
                                                  q_op=A.Operand("q", kind, None, None)))  # fmt: skip
    buffers = _backward_buffers(computed, work_grads, lse_c, scale, var, cu, workspace)
    _run_checked(plan, buffers, layout, var, rec)
    if rec is not None:
        _replay.store(key, rec)
    if work_grads is not grads:
        for g, w in zip(grads, work_grads):
            g[...] = w.astype(g.dtype)
    return grads


def _workspace_shapes(plan: P.Plan, lse_shape, var, B: int, H: int, rows_q: int) -> dict:
    """The backward's own buffers by role: ``delta`` (lse's shape), or the Hopper
    backward's ``stats`` (its lse and delta, padded: ``wgmma_backward.stats_shape``)."""
    roles = {a.role for k in plan.launches for a in k.args}
    spaces = {}
    if "delta" in roles:
        spaces["delta"] = tuple(lse_shape)
    if "stats" in roles:
        from numba_flash.kernels.wgmma_backward import stats_shape

        spaces["stats"] = stats_shape(1, H, rows_q, B) if var.features.varlen else stats_shape(*lse_shape)
    return spaces


def _workspace(kind: str, spaces: dict) -> dict:
    """The arrays of :func:`_workspace_shapes`: float32, uninitialised."""
    return {role: A.empty(kind, shape, np.float32) for role, shape in spaces.items()}


def _backward_buffers(computed, grads, lse, scale, var, cu, workspace) -> dict:
    """The backward's buffers by role (``_run``); varlen's seen with a batch axis of 1
    (``stats``: its own (1, H, 2, rows) already)."""
    buffers = dict(zip(("q", "k", "v", "dout", "out"), computed))
    buffers.update(zip(("dq", "dk", "dv"), grads))
    buffers.update(lse=lse, scale=scale, **var.buffers(*cu), **workspace)
    if var.features.varlen:
        buffers.update({r: buffers[r][None] for r in ("q", "k", "v", "dout", "out", "dq", "dk", "dv", "lse", "delta")
                        if r in buffers})  # fmt: skip
    return buffers


def _replay_backward(rec: _replay.Recording, ops, lse, dropout_p, seed, alibi_slopes, cu=(None, None)):
    """A recorded backward for this call's arrays ``ops`` (q, k, v, dout, out): (dq, dk, dv)."""
    st = rec.state
    var = st["var"].again(dropout_p, seed, alibi_slopes)
    grads = [A.empty("device", shape, ops[0].dtype) for shape in st["shapes"]]
    workspace = _workspace("device", st["workspace"])
    rec.run(_backward_buffers(ops, grads, lse, st["scale"], var, cu, workspace), _run)
    return grads


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, dropout_p=0.0, seed=None, return_lse=False, layout="bshd",
                    allow_tf32=False, score_mod=None, block_mask=None, mod_args=()):  # fmt: skip
    """Exact attention ``softmax(scale · Q·Kᵀ) · V`` without the N×N matrix.

    Args:
        q: (batch, seqlen_q, heads, headdim) for ``layout="bshd"`` (the default, as
            flash-attn), or (batch, heads, seqlen_q, headdim) for ``layout="bhsd"``.
            float32 (exact fp32 kernels), float16 or bfloat16 (``ml_dtypes.bfloat16``;
            tensor-core kernels at every head dim 1..256 on sm_80+, else the exact
            fp32 kernels as a fallback).  Any strides with the last axis contiguous.
        k, v: (batch, seqlen_k, heads_kv, headdim), or (batch, heads_kv, seqlen_k,
            headdim); same dtype and side (host/device) as q.  heads_kv divides heads
            (grouped-query / multi-query attention: query head h reads KV head
            ``h // (heads / heads_kv)``).
        causal: mask key j from query i unless j <= i + seqlen_k − seqlen_q
            (bottom-right aligned, as FlashAttention-2 >= 2.1).  A query that sees no
            key gets a zero output row and lse = −inf.
        softmax_scale: multiplies Q·Kᵀ before the softmax; default 1/sqrt(headdim).
        window_size: ``(left, right)``, −1 meaning unbounded: query i sees key j iff
            ``i + Nk − Nq − left <= j <= i + Nk − Nq + right`` (FlashAttention-2's sliding
            window; with ``causal`` right is 0).  As FlashAttention-2, a side of Nk or more
            is unbounded (``variant.fa2_window``: it differs from the formula only for a
            right side ≥ Nk with Nq > right + 1).  Key tiles outside the band are not
            visited.  Rows that see nothing get 0 and lse −inf.
        softcap: > 0 replaces each score ``s = scale·q·k`` by ``softcap·tanh(s/softcap)``
            (Gemma-2, Grok); 0 is off.
        alibi_slopes: float32 (heads,) or (batch, heads): adds ``−slope·|i + Nk − Nq − j|``
            to the score (after the softcap).
        dropout_p, seed: dropout on the attention probabilities, in [0, 1); with
            dropout_p > 0 a ``seed`` (int in [0, 2**64)) is required.  Kept probabilities
            are scaled by 1/(1 − dropout_p) (lse is that of the undropped softmax, as
            FlashAttention-2).  The keep bit of (batch, head, query i, key j) comes from
            Philox4x32-7 (as FlashAttention-2) keyed by the seed and does not depend on tiles, kernel family
            or dtype (``numba_flash.reference.dropout_mask`` gives the same mask), so
            the backward, given the same ``dropout_p`` and ``seed``, regenerates it.
            For varlen, batch is the sequence's index and i, j are within the sequence.
        return_lse: also return the log-sum-exp that the backward pass needs.
        layout: "bshd" or "bhsd".
        allow_tf32: float32 inputs only (ignored for fp16/bf16): run the TF32 tensor-core
            kernel (``mma.sync`` m16n8k8 with Q, K, V and P rounded to TF32, fp32
            accumulation) for head dims 64 and 128 with 16-byte aligned rows, as
            PyTorch's ``allow_tf32``.  Precision about 1e-3 relative (10-bit mantissas,
            like cuBLAS TF32) instead of exact fp32; other head dims keep the exact
            kernels.  Default False: exact fp32.  ``flash_attention_backward`` takes its
            own ``allow_tf32`` (default False: the exact fp32 backward).
        score_mod: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx, *mod_args)
            -> score``, a plain Python function of scalars compiled into the kernels
            (numba, inlined): applied to every scaled score after softcap and ALiBi,
            before the masks.  ``h`` is the query head, indices are positions in the
            sequences.  docs/flex.md.
        block_mask: a ``numba_flash.BlockMask`` (``create_block_mask(mask_mod, ...)``
            or ``BlockMask.from_dense(pattern)``, the paper's block-sparse attention):
            key tiles of EMPTY blocks are not visited, its ``mask_mod`` is evaluated
            on PARTIAL ones only; combined with causal and window (both apply).
        mod_args: the arrays (CuPy, NumPy, CUDA array interface, DLPack) and scalars
            ``score_mod`` reads (a block mask's ``mask_mod`` has its own).

    Returns:
        ``out`` with q's shape and dtype, or ``(out, lse)`` with lse of shape
        (batch, heads, seqlen_q), float32, natural log.  NumPy in gives NumPy out;
        CuPy (or any ``__cuda_array_interface__`` / ``__dlpack__`` device object) in
        gives CuPy out, computed on CuPy's current stream without copying the inputs.
        Zero-size inputs give zero-size outputs; seqlen_k = 0 gives out = 0 and
        lse = −inf, as torch SDPA.  NaN and ±inf propagate as in a standard attention.
    """
    key = _signature("forward", (q, k, v), (causal, softmax_scale, window_size, softcap, dropout_p, return_lse,
                     layout, allow_tf32), (alibi_slopes,), score_mod, block_mask, mod_args)  # fmt: skip
    rec = _replay.find(key)
    if rec is not None:  # a call like this one ran the checks: its launches again, on these arrays
        out, lse = _replay_forward(rec, q, k, v, dropout_p, seed, alibi_slopes)
        return (out, lse) if return_lse else out
    layout, causal, (q_op, k_op, v_op), dims, scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    return_lse = A.check_flag("return_lse", return_lse)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    B, Nq, Nk, H, d = dims
    flex = _flex(score_mod, None, block_mask, mod_args, B, H, Nq, Nk, False)
    var = _Variants(q_op, k_op, B, H, causal, window_size, softcap, alibi_slopes, dropout_p, seed, Nk, flex=flex,
                    seqlen_q=Nq)  # fmt: skip
    out, lse = _forward(q_op, k_op, v_op, dims, causal, scale, var, allow_tf32, layout,
                        _out_shape(layout, B, Nq, H, d), (B, H, Nq), key=key)  # fmt: skip
    out = A.to_caller(out, q_op.kind)
    if return_lse:
        return out, A.to_caller(lse, q_op.kind)
    return out


def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None, layout="bshd",
                             allow_tf32=False, score_mod=None, score_mod_grad=None, block_mask=None,
                             mod_args=()):  # fmt: skip
    """Gradients of ``flash_attention`` by recomputation from the saved log-sum-exp.

    Args:
        dout: gradient of the loss with respect to ``out``; shape and dtype of q.
        q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
            seed, layout: exactly as given to the forward.
        out, lse: what the forward returned (``return_lse=True``); lse is
            (batch, heads, seqlen_q) float32.
        allow_tf32: float32 inputs only (ignored for fp16/bf16): run the backward's
            matmuls on TF32 tensor cores (``mma.sync`` m16n8k8 with Q, K, V, dO, P and dS
            rounded to TF32, fp32 accumulation, fp32 outputs) for head dims 64 and 128
            with 16-byte aligned rows, as PyTorch's ``allow_tf32``.  Precision about
            1e-3 relative instead of exact fp32; still deterministic.  Default False.
        score_mod, block_mask, mod_args: as given to the forward.
        score_mod_grad: with a score_mod, ``score_mod_grad(score, b, h, q_idx, kv_idx,
            *mod_args) -> float``, the derivative of score_mod with respect to the
            score at that score (1.0 for a bias; required: docs/flex.md).

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v, of the caller's kind.
        dQ is computed without atomics, and with GQA the dK, dV of a KV head sum its
        query heads in a fixed order, so the result is bitwise the same run to run.
        fp16/bf16 run on tensor cores (sm_80+, any head dim);
        float32 runs the exact fp32 kernels unless ``allow_tf32=True`` (whatever the
        forward was given); other cases run the exact fp32 kernels too.
    """
    key = _signature("backward", (dout, q, k, v, out, lse), (causal, softmax_scale, window_size, softcap, dropout_p,
                     layout, allow_tf32), (alibi_slopes,), score_mod, block_mask, mod_args, score_mod_grad)  # fmt: skip
    rec = _replay.find(key)
    if rec is not None:
        return tuple(_replay_backward(rec, (q, k, v, dout, out), lse, dropout_p, seed, alibi_slopes))
    layout, causal, (q_op, k_op, v_op), dims, scale = _check_qkv(q, k, v, causal, softmax_scale, layout)
    do_op = A.check_operand("dout", dout, layout)
    o_op = A.check_operand("out", out, layout)
    A.check_like("dout", do_op, q_op)
    A.check_like("out", o_op, q_op)
    B, Nq, Nk, H, d = dims
    lse_arr = A.check_lse(lse, q_op, B, H, Nq)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    flex = _flex(score_mod, score_mod_grad, block_mask, mod_args, B, H, Nq, Nk, True)
    var = _Variants(q_op, k_op, B, H, causal, window_size, softcap, alibi_slopes, dropout_p, seed, Nk, flex=flex,
                    seqlen_q=Nq, pass_="backward")  # fmt: skip
    H_kv = var.heads_k
    shapes = (_out_shape(layout, B, Nq, H, d), _out_shape(layout, B, Nk, H_kv, d), _out_shape(layout, B, Nk, H_kv, d))
    grads = _backward((q_op, k_op, v_op, do_op, o_op), lse_arr, dims, causal, scale, var, allow_tf32, layout, shapes,
                      key=key)  # fmt: skip
    return tuple(A.to_caller(g, q_op.kind) for g in grads)


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                           seed=None, return_lse=False, allow_tf32=False, score_mod=None, block_mask=None,
                           mod_args=()):  # fmt: skip
    """:func:`flash_attention` over a batch of sequences of different lengths, packed
    (FlashAttention-2's ``flash_attn_varlen_func``).

    Args:
        q: (total_q, heads, headdim): sequence b is rows ``cu_seqlens_q[b] ..
            cu_seqlens_q[b + 1] − 1``.
        k, v: (total_k, heads_kv, headdim), sequence b at ``cu_seqlens_k[b] ..``.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets, starting at 0,
            non-decreasing, ending at total_q / total_k.  Sequences may be empty.  On
            q's side, or NumPy with q on the device: they are checked on the host, and
            device offsets are copied there first (the host waits for the GPU's work
            so far; NumPy offsets spare that wait).
        max_seqlen_q, max_seqlen_k: ints at least the longest sequence (the grid).
        The keywords as :func:`flash_attention`; each sequence is its own attention
        (causal and window aligned per sequence, ALiBi slopes (batch, heads) per
        sequence).  Checked before any launch.
        score_mod, block_mask, mod_args: as :func:`flash_attention`'s, with ``b`` the
            sequence's index and ``q_idx``, ``kv_idx`` positions within the sequence;
            the block mask is made for (batch or None, heads or None, max_seqlen_q,
            max_seqlen_k), and its tiles past a sequence's end are not visited.

    Returns:
        ``out`` (total_q, heads, headdim), or ``(out, lse)`` with lse (heads, total_q)
        float32, as FlashAttention-2.
    """
    key = _signature("varlen forward", (q, k, v), (causal, softmax_scale, window_size, softcap, dropout_p, return_lse,
                     allow_tf32, max_seqlen_q, max_seqlen_k), (alibi_slopes, cu_seqlens_q, cu_seqlens_k), score_mod,
                     block_mask, mod_args)  # fmt: skip
    rec = _replay.find(key)
    if rec is not None:
        cu = _replay_offsets(rec, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        out, lse = _replay_forward(rec, q, k, v, dropout_p, seed, alibi_slopes, cu)
        return (out, lse) if return_lse else out
    causal, (q_op, k_op, v_op), dims, scale = _check_packed(q, k, v, causal, softmax_scale)
    return_lse = A.check_flag("return_lse", return_lse)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    _, total_q, total_k, H, d = dims
    cu_q, cu_k, lens, max_q, max_k = _check_offsets(q_op, total_q, total_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                    max_seqlen_k)  # fmt: skip
    B = len(lens)
    flex = _flex(score_mod, None, block_mask, mod_args, B, H, max_q, max_k, False, lens)
    var = _Variants(q_op, k_op, B, H, causal, window_size, softcap, alibi_slopes, dropout_p, seed, max_k,
                    varlen=True, flex=flex, seqlen_q=max_q)  # fmt: skip
    vdims = (B, max_q, max_k, H, d)
    out, lse = _forward(q_op, k_op, v_op, vdims, causal, scale, var, allow_tf32, "bshd", (total_q, H, d),
                        (H, total_q), (cu_q, cu_k), total_q, key)  # fmt: skip
    out = A.to_caller(out, q_op.kind)
    if return_lse:
        return out, A.to_caller(lse, q_op.kind)
    return out


def flash_attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, dropout_p=0.0, seed=None, allow_tf32=False, score_mod=None,
                                    score_mod_grad=None, block_mask=None, mod_args=()):  # fmt: skip
    """Gradients of :func:`flash_attention_varlen` (lse (heads, total_q) as it returned);
    ``(dq, dk, dv)`` shaped like q, k, v.  ``score_mod_grad`` as
    :func:`flash_attention_backward`'s."""
    key = _signature("varlen backward", (dout, q, k, v, out, lse), (causal, softmax_scale, window_size, softcap,
                     dropout_p, allow_tf32, max_seqlen_q, max_seqlen_k), (alibi_slopes, cu_seqlens_q, cu_seqlens_k),
                     score_mod, block_mask, mod_args, score_mod_grad)  # fmt: skip
    rec = _replay.find(key)
    if rec is not None:
        cu = _replay_offsets(rec, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        return tuple(_replay_backward(rec, (q, k, v, dout, out), lse, dropout_p, seed, alibi_slopes, cu))
    causal, (q_op, k_op, v_op), dims, scale = _check_packed(q, k, v, causal, softmax_scale)
    do_op = A.check_packed("dout", dout)
    o_op = A.check_packed("out", out)
    A.check_like("dout", do_op, q_op)
    A.check_like("out", o_op, q_op)
    _, total_q, total_k, H, d = dims
    cu_q, cu_k, lens, max_q, max_k = _check_offsets(q_op, total_q, total_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                    max_seqlen_k)  # fmt: skip
    B = len(lens)
    lse_arr = A.check_lse_packed(lse, q_op, H, total_q)
    allow_tf32 = A.check_flag("allow_tf32", allow_tf32)
    flex = _flex(score_mod, score_mod_grad, block_mask, mod_args, B, H, max_q, max_k, True, lens)
    var = _Variants(q_op, k_op, B, H, causal, window_size, softcap, alibi_slopes, dropout_p, seed, max_k,
                    varlen=True, flex=flex, seqlen_q=max_q, pass_="backward")  # fmt: skip
    shapes = ((total_q, H, d), (total_k, var.heads_k, d), (total_k, var.heads_k, d))
    grads = _backward((q_op, k_op, v_op, do_op, o_op), lse_arr, (B, max_q, max_k, H, d), causal, scale, var,
                      allow_tf32, "bshd", shapes, (cu_q, cu_k), total_q, key)  # fmt: skip
    return tuple(A.to_caller(g, q_op.kind) for g in grads)


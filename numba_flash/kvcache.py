"""``flash_attention_with_kvcache``: new queries against a KV cache, paged or contiguous,
with new keys and values appended in place, rotary embeddings and split-KV
(FlashAttention-2's ``flash_attn_with_kvcache``).  Host side: checks, the append, the
launch plan and the merge of the splits.

How it runs:

1. **Checks, before any launch** (``reference._check_kvcache``, the reference's own):
   shapes, dtypes, ``cache_seqlens`` + ``seqlen_new`` within the cache (its pages),
   page indices within the cache.  Device ``cache_seqlens`` / ``block_table`` /
   ``cache_batch_idx`` are copied to the host for it (a wait for the GPU's work so far).
2. **Append** (``kernels.kvcache``): k (rotated, when cos/sin are given) and v written
   at positions ``cache_seqlens[b] ..``; q rotated into a copy (the caller's q is not
   touched).
3. **Attention**: the forward kernels of every family with ``Variant.paged``: queries
   packed as varlen (``seqlen_q`` rows a sequence), keys read through the block table
   (a contiguous cache is a paged one with one page of ``seqlen_cache`` rows a
   sequence), ``cache_seqlens + seqlen_new`` keys a sequence, causal and window aligned
   to that length.  On an H100/H200 more than ``config.DECODE_ROWS`` query rows (a
   prefill) without splits run the Hopper forward, which copies a key tile by TMA in
   boxes that lie within a page (``wgmma_forward.key_box``: pages of a multiple of 8
   rows, or a contiguous cache), with splits too (``plan.wgmma_split``, since session 29;
   ``NUMBA_FLASH_WGMMA_SPLIT=0`` sends splits to mma.sync); the rest run the mma.sync kernels.
   Decoding with GQA (one query, no window, no ALiBi) runs a KV head's query heads as
   the rows of one sequence, so a block reads each K/V tile once for the group
   (FlashAttention-2's ``seqlenq_ngroups_swapped``).
4. **Split-KV** (``num_splits`` > 1, or chosen by :func:`split_count`): one launch whose
   grid's batch axis runs over (split, sequence) (``Variant.split``); split p walks key
   tiles ``[p·n, p·n + n)`` (n counted in the tiles of the kernel that runs the splits,
   which may be narrower than those the count was made on) and writes its partial O
   (fp32, as FlashAttention-2's) and lse.  On the decode tiles (:func:`merges_in_kernel`)
   they are combined into q's dtype in the same launch: on sm_90 with at most 4 splits the
   splits of a row tile run as one thread-block cluster and merge through their shared
   memory (:func:`cluster_of`, ``kernels.merge.merge_in_cluster``; no parts in HBM), else
   the last split of a row tile to finish merges (``kernels.merge.merge_if_last``,
   counters from :func:`_arrivals`);
   the GQA swap's blocks read q's heads in place;
   elsewhere the merge kernel (``merge.merge_into``) does, reading the swapped rows in
   place.  The GQA decode swap goes through the same merge even with one split.
5. **Host time per call** (a decode step is short): the plan and split count are made
   once per shape (:func:`_launch_plan`), and the packed small ints are uploaded once
   while their contents repeat (:func:`_upload_ints`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
from collections import OrderedDict

import numpy as np

from numba_flash import _arrays as A
from numba_flash import plan as P
from numba_flash import reference as R
from numba_flash import variant as V
from numba_flash._launch import launch
from numba_flash._numba_cuda import SIMULATOR, target_arch
from numba_flash.traffic import blocks_per_sm

#: SMs assumed by :func:`split_count` where the device cannot be asked (the simulator).
DEFAULT_SMS = 132
MAX_SPLITS = 128
#: Blocks of the one-warp decode tiles an SM needs in flight to keep its share of DRAM busy:
#: :func:`split_count` counts these slots, not all the blocks an SM holds (four at d = 128).
#: Since their K/V copies take ~4 instructions (session 22) two blocks stream what four did:
#: on a contiguous cache 4 splits ran 2–5% faster than the 8 that four slots chose at 4096
#: and 32768 keys and 1% at 131072 (docs/benchmarks/2026-12-04-s22).  A sequence across
#: pages takes two only where its splits then merge in a thread-block cluster
#: (:func:`cluster_of`): pages of 256 rows with 4 splits in clusters ran 0.039 / 0.248 /
#: 0.975 ms at 4096 / 32768 / 131072 keys, against 0.044 / 0.257 / 0.993 with 8 splits
#: (docs/benchmarks/2026-12-04-s23).  With the global merge it keeps four: 4 splits fell to
#: 0.94 of copy at 131072 keys (1.06 with 8), each tile's page lookup then in the way.
DECODE_BLOCKS_PER_SM = 2


@functools.lru_cache(maxsize=1024)
def split_count(blocks: int, key_tiles: int, slots: int) -> int:
    """The number of splits ``num_splits=0`` takes (FlashAttention-2's heuristic, over
    the ``slots`` of the device: SMs × the blocks of the kernel an SM holds at once,
    ``traffic.blocks_per_sm``, at most ``DECODE_BLOCKS_PER_SM`` for the decode tiles on
    one page a sequence, or across pages where the splits then merge in a cluster): 1
    when the ``blocks`` of one split (batch · heads · query tiles) already fill 80% of
    the slots; else, of the counts up to
    ``min(MAX_SPLITS, slots, key_tiles)``, the smallest whose efficiency (waves of
    blocks ÷ waves rounded up) is within 85% of the best.  (FlashAttention-2 counts SMs,
    its split kernel holding about one block an SM; the decode tiles' one-warp blocks
    fit four at d = 128, of which two keep an SM's share of DRAM busy.)"""
    if blocks <= 0 or key_tiles <= 1 or blocks >= 0.8 * slots:
        return 1
    top = max(1, min(MAX_SPLITS, slots, key_tiles))

    def efficiency(s):
        waves = blocks * s / slots
        return waves / math.ceil(waves)

    best = max(efficiency(s) for s in range(1, top + 1))
    return next(s for s in range(1, top + 1) if efficiency(s) >= 0.85 * best)


def decode_swap(seqlen_q: int, heads: int, heads_k: int, window=(-1, -1), alibi=False) -> tuple:
    """``(swap, rows, heads)`` of a call: decoding with GQA (one query, no window, no
    ALiBi) runs a KV head's ``heads // heads_k`` query heads as the rows of one sequence
    (FlashAttention-2's swap), exact because nothing then depends on the query's
    position or head; else ``seqlen_q`` rows of ``heads`` heads."""
    group = heads // heads_k
    if seqlen_q == 1 and group > 1 and tuple(window) == (-1, -1) and not alibi:
        return True, group, heads_k
    return False, seqlen_q, heads


@functools.lru_cache(maxsize=256)
def _launch_plan(features, swap, dtype, d, causal, aligned, B, heads, rows, max_k, heads_k, num_splits, device,
                 env, page_rows=0):  # fmt: skip
    """``(plan, splits, key tiles a split)`` of a call: the attention's launch plan on
    ``Variant.paged`` (and ``Variant.split`` with more than one split, or with the GQA
    decode ``swap``, whose rows the merge kernel puts back in place), the split count
    (``num_splits``, or :func:`split_count` over the device's slots for the kernel).
    ``page_rows``: the cache's rows a page when a sequence spans pages, else 0
    (``plan.Problem.page_rows``).  Made once per shape (the tuning override and the
    wgmma switches are part of the key)."""
    from numba_flash.api import _plan

    features = dataclasses.replace(features, paged=True, gqa=features.gqa and not swap)

    def make_plan(split, splits, cluster=0):
        feats = dataclasses.replace(features, split=split, cluster=cluster)
        return _plan(P.Problem("forward", dtype, d, causal, False, aligned, B * splits, heads, rows, max_k,
                               target_arch(), SIMULATOR, feats, heads_k, B * rows, page_rows))  # fmt: skip

    plan = make_plan(swap, 1)
    (walker,) = [ln for ln in plan.launches if ln.walk]
    block_m, block_n = walker.walk[0], walker.walk[1]
    key_tiles = -(-max_k // block_n)
    per_sm = blocks_per_sm(walker)
    decode = walker.name == "tc_forward" and walker.tiles.warps == 1  # the decode tiles

    def count(per):
        return split_count(B * heads * -(-rows // block_m), key_tiles, _sms(device) * per)

    if decode and not page_rows:  # one page a sequence (DECODE_BLOCKS_PER_SM)
        per_sm = min(per_sm, DECODE_BLOCKS_PER_SM)
    splits = num_splits or count(per_sm)
    if decode and page_rows and not num_splits:  # across pages: two slots an SM where the splits merge in a cluster
        fewer = count(min(per_sm, DECODE_BLOCKS_PER_SM))
        if 1 < fewer < splits and cluster_of(plan, fewer, d) == fewer:
            splits = fewer
    splits = max(1, min(splits, key_tiles))
    if splits > 1 or swap:
        plan = make_plan(True, splits)
        cluster = cluster_of(plan, splits, d)
        if cluster:
            plan = make_plan(True, splits, cluster)
        # a split's key tiles are the split plan's, whose tiles may be narrower than the plan
        # the count was made on (sm_90a: the Hopper forward's 128 keys, the split's mma.sync
        # forward 64): counted in the wider ones, the splits covered half of the keys
        (walker,) = [ln for ln in plan.launches if ln.walk]
        key_tiles = -(-max_k // walker.walk[1])
    return plan, splits, -(-key_tiles // splits)


def cluster_of(plan, splits: int, data_dim: int) -> int:
    """The thread-block cluster a split-KV launch runs its row tiles' splits as (0: none;
    ``Variant.cluster``): on the decode tiles up to d = 128 (``merge.merges_in_cluster``;
    a head dim of a multiple of 4), on sm_90+ and with at most ``merge.MAX_CLUSTER``
    splits, the S splits of a row tile are one cluster of S CTAs that merge through their
    shared memory (``kernels.merge.merge_in_cluster``) instead of the last split's global merge
    (``merge_if_last``: a release fence, an atomic, an acquire fence and two rounds of L2
    loads at the end of the walk).  The simulator runs one block at a time: a cluster of
    one there (one split: the GQA swap's), the global merge for more.
    ``NUMBA_FLASH_CLUSTER_MERGE=0`` turns it off."""
    from numba_flash._launch import _NUMBA_PATH
    from numba_flash.kernels import merge

    ln = plan.launches[0]
    if os.environ.get("NUMBA_FLASH_CLUSTER_MERGE", "1") == "0" or ln.name != "tc_forward" or data_dim % 4:
        return 0
    if not merge.merges_in_cluster(ln.tiles):
        return 0
    if SIMULATOR:
        return 1 if splits == 1 else 0
    if _NUMBA_PATH or tuple(plan.problem.arch[:2]) < (9, 0):
        return 0
    return splits if splits <= merge.MAX_CLUSTER else 0


_UPLOADS: OrderedDict = OrderedDict()  # (device, bytes) -> device array: the small int arrays of recent calls
_ARRIVALS: dict = {}  # (device, stream) -> int32 counters, zero between calls (kernels.merge.merge_if_last)


def _arrivals(n: int, device: int):
    """Split-KV's arrival counters (``kernels.merge.merge_if_last``): at least ``n``
    int32, zero between calls (the last block of a row tile resets its own), one buffer
    per device and stream (the calls on one stream run in turn; two streams must not
    share counters).  Made (zeroed) once, grown when a call needs more."""
    stream = 0 if SIMULATOR else A._cupy().cuda.get_current_stream().ptr
    key = (device, stream)
    buf = _ARRIVALS.get(key)
    if buf is None or buf.size < n:
        buf = _ARRIVALS[key] = (np if SIMULATOR else A._cupy()).zeros((max(n, 1024),), np.int32)
    return buf


def merges_in_kernel(plan, data_dim: int) -> bool:
    """Whether split-KV's parts are merged by the forward kernel itself (the last split of
    a row tile to finish: ``kernels.merge.merge_if_last``), not by the merge kernel: the
    tensor-core forward's decode tiles (``kernels.merge.merges_in_kernel``: 16-bit
    outputs) at a head dim of a multiple of 4 (16-byte fp32 chunks)."""
    from numba_flash.kernels import merge

    ln = plan.launches[0]
    return ln.name == "tc_forward" and merge.merges_in_kernel(ln.tiles) and data_dim % 4 == 0


def _upload_ints(packed: np.ndarray, device: int):
    """``packed`` (int32) on the device, the copy of a recent call's when the contents
    are the same (a decode loop with an int ``cache_seqlens`` uploads once).  The
    kernels only read it."""
    if SIMULATOR:
        return packed
    key = (device, packed.tobytes())
    hit = _UPLOADS.get(key)
    if hit is None:
        hit = _UPLOADS[key] = A._cupy().asarray(packed)
        if len(_UPLOADS) > 64:
            _UPLOADS.popitem(last=False)
    else:
        _UPLOADS.move_to_end(key)
    return hit


def _host_ints(name, x, want_ndim):
    """An int array argument (NumPy, or a device array copied to the host), or None."""
    if x is None or isinstance(x, numbers.Integral):
        return x
    kind, arr = A._as_array(name, x) if not isinstance(x, np.ndarray) else ("numpy", x)
    if kind == "device":
        arr = A._cupy().asnumpy(arr)
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu" or arr.ndim != want_ndim:
        raise TypeError(f"{name}: expected a {want_ndim}-D int32 array, got dtype {arr.dtype} shape {arr.shape}")
    return arr


@functools.lru_cache(maxsize=None)
def _sms(device: int) -> int:
    """SMs of CUDA device ``device`` (asked once: ``Device.attributes`` queries them all)."""
    if SIMULATOR:
        return DEFAULT_SMS
    return A._cupy().cuda.Device(device).attributes["MultiProcessorCount"]


def _to_device(arr):
    """An array on the side where the kernels run (the GPU, or the host under the
    simulator), copied there when it is not."""
    return np.asarray(arr) if SIMULATOR else A._cupy().asarray(arr)


def flash_attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, cache_batch_idx=None,
                                 block_table=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                                 softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, num_splits=0, return_lse=False):  # fmt: skip
    """Attention of new queries over a KV cache (FlashAttention-2's
    ``flash_attn_with_kvcache``).

    Args:
        q: (batch, seqlen_q, heads, headdim), float32, float16 or bfloat16.
        k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv, headdim), or paged:
            (num_blocks, page_size, heads_kv, headdim) with ``block_table``; q's dtype
            and side (host/device).  heads_kv divides heads (GQA/MQA).
        k, v: optional (batch, seqlen_new, heads_kv, headdim): written into the caches
            **in place** at positions ``cache_seqlens[b] ..`` (k after rotary); nothing
            else of the caches is touched.  Attention then runs over
            ``cache_seqlens + seqlen_new`` keys.
        cache_seqlens: an int or an int32 (batch,) array: the lengths before the append
            (None: 0).
        cache_batch_idx: int32 (batch,): the cache row of each sequence (contiguous
            caches only; default 0 .. batch − 1).
        block_table: int32 (batch, max_blocks): logical page j of sequence b is page
            ``block_table[b, j]`` of the cache.  Any page size.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2): k rotated at its positions,
            q at ``cache_seqlens + i`` when causal or windowed, else at
            ``cache_seqlens``; ``rotary_interleaved``: pairs (2j, 2j + 1), else halves.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as
            :func:`numba_flash.flash_attention`, aligned bottom-right to each
            sequence's ``cache_seqlens + seqlen_new`` keys.
        num_splits: split-KV parts (0: :func:`split_count` picks; 1: none).
        return_lse: also return the (batch, heads, seqlen_q) float32 log-sum-exp.

    Every check runs before any launch (a ValueError or TypeError naming the argument).
    """
    from numba_flash.api import SCHEDULER_BUFFERS, _Variants, _device_id, _dummies, _plan_env, _run_checked
    from numba_flash.kernels import kvcache as K
    from numba_flash.merge import merge_into

    A.require_runtime()
    causal = A.check_flag("causal", causal)
    return_lse = A.check_flag("return_lse", return_lse)
    rotary_interleaved = A.check_flag("rotary_interleaved", rotary_interleaved)
    q_op = A.check_operand("q", q, "bshd")
    kc_op, vc_op = (A.check_operand(n, x, "bshd") for n, x in (("k_cache", k_cache), ("v_cache", v_cache)))
    new = [A.check_operand(n, x, "bshd") for n, x in (("k", k), ("v", v)) if x is not None]
    for op in [kc_op, vc_op] + new:
        if op.kind != q_op.kind:
            raise TypeError(f"{op.name}: must be on the same side (host/device) as q ({q_op.kind}), got {op.kind}")
        if op.array.dtype != q_op.array.dtype:
            raise TypeError(f"{op.name}: dtype {A.dtype_name(op.array.dtype)}: expected q's, "
                            f"{A.dtype_name(q_op.array.dtype)}")  # fmt: skip
    if not V._is_int(num_splits) or num_splits < 0:
        raise ValueError(f"num_splits={num_splits!r}: expected an int >= 0 (0: chosen for the device)")
    lens_in = _host_ints("cache_seqlens", cache_seqlens, 1)
    table_in = _host_ints("block_table", block_table, 2)
    idx_in = _host_ints("cache_batch_idx", cache_batch_idx, 1)
    lens, n_new, batch_idx, table = R._check_kvcache(  # (the arrays' shapes only: device arrays too)
        q_op.array, kc_op.array, vc_op.array, new[0].array if new else None, new[1].array if len(new) > 1 else None,
        lens_in, idx_in, table_in, rotary_cos, rotary_sin)  # fmt: skip
    if kc_op.array.shape[3] != vc_op.array.shape[3]:
        raise ValueError(f"v_cache: head dim {vc_op.array.shape[3]}: expected k_cache's {kc_op.array.shape[3]}")
    B, Nq, H, d = q_op.array.shape
    scale = A.check_scale(softmax_scale, d)
    capacity = kc_op.array.shape[1] * (1 if table is None else table.shape[1])  # FlashAttention-2's seqlen_k here
    var = _Variants(q_op, kc_op, B, H, causal, window_size, softcap, alibi_slopes, 0.0, None, capacity, varlen=True)
    kind = q_op.kind
    if B == 0 or Nq == 0 or H == 0:
        out = np.zeros((B, Nq, H, d), q_op.array.dtype)
        lse = np.full((B, H, Nq), -np.inf, np.float32)
        return (out, lse) if return_lse else out

    # --- 2. the plan: varlen queries, paged keys ------------------------------------------
    nk = (lens + n_new).astype(np.int64)
    max_k = int(nk.max())
    group = H // var.heads_k
    # decoding with GQA: a KV head's query heads as the rows of one sequence, so that a block
    # reads each K/V tile once for the group (one query: causal is then no mask)
    swap, rows, heads = decode_swap(Nq, H, var.heads_k, var.window, var.alibi is not None)
    run_causal = causal and not swap
    total = B * rows
    kc, vc = A.to_compute(kc_op.array, kind), A.to_compute(vc_op.array, kind)
    params = V.params(1, var.window, run_causal, var.softcap) if swap else var.params
    aligned = all(A.aligned16(x) for x in (q_op.array, kc, vc))  # (a rotated or swapped q is a fresh copy)
    page_rows = kc.shape[1] if table is not None and table.shape[1] > 1 else 0  # a sequence may span pages
    plan, splits, per_split = _launch_plan(
        var.features, swap, A.dtype_name(q_op.array.dtype), d, run_causal, aligned, B, heads, rows, max(max_k, 1),
        var.heads_k, int(num_splits), _device_id(), _plan_env(), page_rows)  # fmt: skip

    # split-KV (and the GQA decode swap) on the tensor-core forward: its splits merge the
    # parts in the kernel (in a cluster, or the last split), and the swap reads q's heads
    # in place (no reordered copy of q)
    merged = splits > 1 or swap
    in_kernel = merged and (plan.problem.features.cluster > 0 or merges_in_kernel(plan, d))
    swap_group = group if in_kernel and swap else 0
    row_tiles = -(-rows // plan.launches[0].walk[0]) if plan.launches[0].walk else 1

    # the small int arrays in one upload (one wait for the GPU, not five): start (B) |
    # block table (B, pages) | split (5: key tiles a split, sequences, swap group, merged in
    # the kernel, row tiles: kernels.flex.SPLIT_AT) | cu_seqlens_q (B + 1) | cu_seqlens_k (B + 1)
    paged = table is not None
    table_h = table.astype(np.int32) if paged else np.asarray(batch_idx, np.int32)[:, None]
    packed = np.concatenate([lens.astype(np.int32), table_h.ravel(),
                             np.array([per_split, B, swap_group, int(in_kernel), row_tiles], np.int32),
                             (np.arange(B + 1) * rows).astype(np.int32),
                             np.concatenate([[0], np.cumsum(nk)]).astype(np.int32)])  # fmt: skip
    ints = _upload_ints(packed, _device_id())
    at = np.cumsum([0, B, table_h.size, 5, B + 1, B + 1])
    start, split_at, cu_q, cu_k = (ints[at[i]:at[i + 1]] for i in (0, 2, 3, 4))
    table_d = ints[at[1]:at[2]].reshape(table_h.shape)

    # --- 3. the append (in place) and rotary q -----------------------------------------
    cos = sin = None
    if rotary_cos is not None:
        cos, sin = (_to_device(A._as_array(n, x)[1]).astype(np.float32) for n, x in
                    (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)))  # fmt: skip
    if n_new:
        kn, vn = (A.to_compute(op.array, kind) for op in new)
        if cos is not None:
            k32 = kn.astype(np.float32)  # a copy: the caller's k is not touched
            launch(K.rotary, (B * n_new, kn.shape[2], 1), K.THREADS, 0, k32, cos, sin, start, 1, int(rotary_interleaved))
            kn = k32.astype(kn.dtype)
        for cache, new_rows in ((kc, kn), (vc, vn)):
            words = np.uint16 if cache.dtype.itemsize == 2 else np.uint32
            launch(K.append, (B * n_new, new_rows.shape[2], 1), K.THREADS, 0, cache.view(words), new_rows.view(words),
                   start, table_d)  # fmt: skip
        if kind == "numpy" and not SIMULATOR:  # the caller's host caches get the appended rows
            pos = lens[:, None] + np.arange(n_new)[None]
            page_rows = kc.shape[1]
            pages, off = table_h[np.arange(B)[:, None], pos // page_rows], pos % page_rows
            for host, dev in ((kc_op.array, kc), (vc_op.array, vc)):
                host[pages, off] = A._cupy().asnumpy(dev[A._cupy().asarray(pages), A._cupy().asarray(off)])
    qc = A.to_compute(q_op.array, kind)
    if cos is not None:
        q32 = qc.astype(np.float32)
        by_row = causal or var.window != (-1, -1)
        launch(K.rotary, (B * Nq, H, 1), K.THREADS, 0, q32, cos, sin, start, int(by_row), int(rotary_interleaved))
        qc = q32.astype(qc.dtype)
    if swap_group:  # (B, H, 1, d): a sequence's query heads are rows its blocks copy in place
        q_packed = qc.transpose(0, 2, 1, 3)
    else:
        if swap:
            qc = qc.reshape(B, var.heads_k, group, d).transpose(0, 2, 1, 3)  # (B, group, H_kv, d)
        q_packed = qc.reshape(total, heads, d) if qc.flags.c_contiguous else qc.copy().reshape(total, heads, d)

    # --- 4. the launch and the merge -------------------------------------------------------
    # split-KV and the GQA decode swap write fp32 partials (Variant.split), which the last
    # split's block (in_kernel) or the merge kernel combines (one split: only puts the
    # swapped rows back) into q's dtype
    work = A.SUPPORTED_BY_NAME[plan.work_dtype]
    xp = np if SIMULATOR else A._cupy()
    if work != q_op.array.dtype:  # bf16 on fp32 copies (the exact kernels' fallback)
        q_packed, kc_w, vc_w = (x.astype(work) for x in (q_packed, kc, vc))
    else:
        kc_w, vc_w = kc, vc
    alibi0, cu0, fx0 = _dummies(_device_id())
    if plan.problem.features.cluster:  # the splits merge through their shared memory: no parts in HBM
        out_parts, lse_parts = alibi0.reshape(1, 1, 1, 1), alibi0.reshape(1, 1, 1)  # (never written)
    else:
        out_parts = A.empty(kind, (splits, total, heads, d), np.float32 if merged else work)
        lse_parts = A.empty(kind, (splits, heads, total), np.float32)
    if swap_group:  # the blocks index q by sequence
        q_view = q_packed
    elif splits == 1 or plan.launches[0].name == "wgmma_forward":
        # (TMA's maps of the Hopper forward take q's strides as they are; its splits copy Q at batch 0)
        q_view = q_packed.reshape((1,) + q_packed.shape)
    else:  # every split reads the same queries
        q_view = xp.lib.stride_tricks.as_strided(q_packed, (splits,) + q_packed.shape, (0,) + q_packed.strides)
    if in_kernel:
        out = A.empty(kind, (B, Nq, H, d), q_op.array.dtype)
        lse = A.empty(kind, (B, H, Nq), np.float32)
        # the last split's merge counts arrivals; a cluster's merge meets at its barrier
        arrivals = fx0[11] if plan.problem.features.cluster else _arrivals(B * heads * row_tiles, _device_id())
        fx = fx0[:7] + (table_d, split_at, out.view(np.uint32), lse, arrivals)
    else:
        fx = fx0[:7] + (table_d, split_at) + fx0[9:]
    buffers = {"q": q_view, "k": kc_w, "v": vc_w, "out": out_parts, "lse": lse_parts, "scale": scale,
               **var.buffers(cu_q, cu_k), **SCHEDULER_BUFFERS}  # fmt: skip
    buffers.update(flex=fx, params=params)
    try:
        _run_checked(plan, buffers, "bshd", var)
    except BaseException:
        if in_kernel:  # a launch that failed may have left counters behind: a fresh zeroed buffer next time
            _ARRIVALS.clear()
        raise
    if merged and not in_kernel:  # parts (S, B, rows, heads, d) and (S, B, heads, rows), as views
        out = A.empty(kind, (B, Nq, H, d), q_op.array.dtype)
        lse = A.empty(kind, (B, H, Nq), np.float32)
        merge_into(out_parts.reshape(splits, B, rows, heads, d),
                   lse_parts.reshape(splits, heads, B, rows).transpose(0, 2, 1, 3), out, lse, group if swap else 1)
    elif not merged:
        out = out_parts[0].reshape(B, Nq, H, d)
        if work != q_op.array.dtype:
            out = out.astype(q_op.array.dtype)
        lse = xp.ascontiguousarray(lse_parts[0].reshape(H, B, Nq).transpose(1, 0, 2)) if return_lse else None
    out = A.to_caller(out, kind)
    return (out, A.to_caller(lse, kind)) if return_lse else out

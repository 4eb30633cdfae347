"""Merging partial attentions: the attention over a union of disjoint key sets from the
attention over each set (split-KV decoding, ring attention, a prefix cache and a suffix).

Math, per output row (batch b, query i, head h), over the S parts::

    m     = max_s lse_s                      (0 in place of −inf: no part saw a key)
    w_s   = exp(lse_s − m)                   0 for a part that saw no key
    lse   = m + log Σ_s w_s                  −inf when every w_s is 0
    out   = Σ_s w_s · out_s / Σ_s w_s        0 when every w_s is 0

A part whose weight is 0 is skipped, not multiplied (its out may be anything, NaN
included); a NaN or +inf lse makes the row NaN.  The sums run in a fixed order (warp w
adds parts w, w + W, …; then warp 0 adds the warps' sums in order w = 0, 1, …): the
result is deterministic.

Where the parts are read: output row (b, i, h) takes row ``r = i·GROUP + h % GROUP``
of head ``h // GROUP`` of each part, ``out_parts[s, b, r, h // GROUP, :]`` and
``lse_parts[s, b, h // GROUP, r]``.  ``GROUP = 1`` is ``merge_attention``'s layout, (S,
B, Nq, H, d) and (S, B, H, Nq); ``GROUP = H / H_kv`` reads the GQA decode swap of
``flash_attention_with_kvcache`` as it was computed (a KV head's query heads as the
rows of one sequence: (S, B, GROUP, H_kv, d), Nq = 1), with no copy to reorder it.

Grid and threads (:func:`launch_shape`):
    grid = (B·Nq·H, ceil(d / 128)): block (x, y) owns output row x (rows ordered b, i, h,
    h fastest) and its columns 128y … 128y + 127; block = 32·W threads, W = min(S, 8)
    warps.  Warp w takes parts w, w + W, …; lane l columns 128y + 4l … + 3.  Every
    thread's loads are independent of one another (the lse values, then the parts'
    columns), so a split-KV step's merge costs about two memory latencies, not one a
    part (a warp a row walking the S parts in turn took 20 µs for 8 parts of a decode
    step on the H200, the split kernel itself 39 µs: docs/benchmarks/2026-12-03-s19).

Shared memory: each warp's maximum and NaN flag, then its partial sums (W·(128 + 1)
floats).  The parts are fp32 (the host converts 16-bit ones; split-KV writes fp32
partials); the output is written in its own dtype (:func:`merge_kernel`): fp32, or
fp16 / bf16 rounded to nearest even into a uint16 view.
"""

from __future__ import annotations

import functools
import math

from numba_flash import ptx
from numba_flash._numba_cuda import cuda, device_function, float32, int32, uint16, uint32
from numba_flash.kernels.flex import ARRIVALS, LSE_MERGED, OUT_MERGED, SPLIT_AT

MAX_WARPS = 8  # warps a block: the parts a block reads at once
COLUMNS = 128  # output columns a block (4 a lane)


def launch_shape(B: int, Nq: int, H: int, D: int, S: int) -> tuple:
    """``(grid, threads)`` of the merge of S parts into B·Nq·H rows of D columns."""
    return (B * Nq * H, -(-D // COLUMNS), 1), 32 * min(S, MAX_WARPS)


@functools.lru_cache(maxsize=None)
def merge_kernel(out_dtype: str):
    """``kernel[launch_shape(...)](out_parts, lse_parts, out, lse, GROUP)``: out
    (B, Nq, H, d) float32, or a uint16 view of fp16 / bf16 (``out_dtype``), lse (B, H,
    Nq) float32."""
    F32, BF16 = out_dtype == "float32", out_dtype == "bfloat16"

    @cuda.jit
    def merge_parts(out_parts, lse_parts, out, lse, GROUP):
        S = out_parts.shape[0]
        B, Nq, H, D = out.shape
        row = cuda.blockIdx.x
        h = row % H
        i = (row // H) % Nq
        b = row // (H * Nq)
        r = i * GROUP + h % GROUP  # where the parts hold this row (module docstring)
        hp = h // GROUP
        warp = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        W = cuda.blockDim.x // 32
        c0 = cuda.blockIdx.y * COLUMNS + 4 * lane
        warp_max = cuda.shared.array(MAX_WARPS, float32)
        warp_nan = cuda.shared.array(MAX_WARPS, int32)
        warp_tot = cuda.shared.array(MAX_WARPS, float32)
        warp_acc = cuda.shared.array((MAX_WARPS, COLUMNS), float32)
        m = float32(-math.inf)
        nan = 0
        for s in range(warp, S, W):
            x = lse_parts[s, b, hp, r]
            if math.isnan(x) or x == float32(math.inf):
                nan = 1
            m = max(m, x)
        if lane == 0:
            warp_max[warp] = m
            warp_nan[warp] = nan
        cuda.syncthreads()  # every warp's maximum, before any reads them
        for w in range(W):
            m = max(m, warp_max[w])
            nan |= warp_nan[w]
        m_safe = float32(0.0) if m == float32(-math.inf) else m
        tot = float32(0.0)
        acc = cuda.local.array(4, float32)
        for k in range(4):
            acc[k] = float32(0.0)
        for s in range(warp, S, W):
            wt = math.exp(lse_parts[s, b, hp, r] - m_safe)
            tot += wt
            if wt != float32(0.0):  # a part that saw no key is not read (its out may be anything)
                for k in range(4):
                    if c0 + k < D:
                        acc[k] += wt * out_parts[s, b, r, hp, c0 + k]
        for k in range(4):
            warp_acc[warp, 4 * lane + k] = acc[k]
        if lane == 0:
            warp_tot[warp] = tot
        cuda.syncthreads()  # every warp's sums, before warp 0 adds them
        if warp != 0:
            return
        tot = float32(0.0)
        for w in range(W):
            tot += warp_tot[w]
        inv = float32(1.0) / tot if tot > float32(0.0) else float32(0.0)
        for k in range(4):
            c = c0 + k
            if c < D:
                a = float32(0.0)
                for w in range(W):
                    a += warp_acc[w, 4 * lane + k]
                o = float32(math.nan) if nan else a * inv
                if F32:
                    out[b, i, h, c] = o
                else:  # the low half of a packed pair is o rounded to the 16-bit dtype
                    w16 = ptx.pack_bf16x2(o, float32(0.0)) if BF16 else ptx.pack_f16x2(o, float32(0.0))
                    out[b, i, h, c] = uint16(w16 & uint32(0xFFFF))
        if lane == 0 and cuda.blockIdx.y == 0:
            if nan:
                lse[b, h, i] = math.nan
            elif tot > float32(0.0):
                lse[b, h, i] = m_safe + math.log(tot)
            else:
                lse[b, h, i] = -math.inf

    return merge_parts


#: Splits, and column chunks of 4 fp32, a thread of :func:`merge_if_last` reads at once: the
#: 16 loads of 16 bytes are in flight together (one warp at d <= 128: :func:`merges_in_kernel`).
SPLITS_AT_ONCE = 4
CHUNKS = 4


def merges_in_kernel(t) -> bool:
    """Whether the tensor-core forward of tiles ``t`` merges split-KV's parts itself
    (:func:`merge_if_last`): the one-warp decode tiles up to d = 128.  Elsewhere the merge's
    registers would add to the kernel's spills (128-row tiles at d = 64 and 128, the decode
    tiles at d = 256: ``ptxas``), and the merge kernel runs after it."""
    return t.warps == 1 and t.head_dim <= 128


@device_function
def no_merge(out_parts, lse_parts, fx, stats, seq, h, q0, start_m, seqlen_q, BLOCK_M, DATA_DIM, tid, THREADS, BF16):
    """:func:`merge_if_last`'s stand-in in a kernel without split-KV (whose ``out`` is not
    fp32 parts: numba types a call even in a branch that cannot run)."""
    return


@device_function
def merge_if_last(out_parts, lse_parts, fx, stats, seq, h, q0, start_m, seqlen_q, BLOCK_M, DATA_DIM, tid, THREADS,
                  BF16):  # fmt: skip
    """Split-KV merged in the forward kernel (``fx[SPLIT_AT][3]`` = 1; else nothing):
    after a block has written its split's partial rows (``out_parts[p, q0 + row, h, :]``,
    ``lse_parts[p, h, q0 + row]``), the last of the S blocks of its row tile to arrive
    merges the S parts of those rows into ``fx[OUT_MERGED]`` (a uint32 view of fp16 /
    bf16 pairs) and ``fx[LSE_MERGED]``, as :func:`merge_kernel` does, in split order
    (deterministic whichever block is last).  It saves the merge's launch, which at
    4096 keys took 6–8 µs of a 45 µs decode step (docs/benchmarks/2026-12-04-s22).

    Arrival: every thread fences its partial stores (release), thread 0 adds one to the
    row tile's counter (``fx[ARRIVALS]``, slot (seq·heads + h)·tiles + tile) and the
    block that reads S − 1 resets it to 0 for the next call and merges, after a fence
    (acquire); its reads bypass L1 (``ptx.ld_global_cg_*``), where a line fetched
    earlier in the kernel may be stale.  ``stats``: BLOCK_M + 1 float32 of free shared
    memory (each row's merged lse, then the flag that tells the block it is last).

    Where the merged rows go: row ``row`` of sequence ``seq`` and head ``h``, or with
    the GQA decode swap (``fx[SPLIT_AT][2]`` = G > 0: the block's rows are query heads
    ``h·G + row`` of the sequence's one query) ``out[seq, 0, h·G + row]`` and
    ``lse[seq, h·G + row, 0]``.  Two passes, each reading SPLITS_AT_ONCE splits at a
    time (their loads in flight together): a thread a row finds the maximum lse and the
    sum of weights online; then each thread merges CHUNKS column chunks of 4.
    """
    sa = fx[SPLIT_AT]
    if sa[3] == 0:
        return
    S = out_parts.shape[0]
    ptx.fence_acq_rel_gpu()  # release: this thread's partial rows, before the block's arrival
    cuda.syncthreads()  # every thread's fence, before thread 0 counts the block in
    if tid == 0:
        slot = (seq * lse_parts.shape[1] + h) * sa[4] + start_m // BLOCK_M
        last = cuda.atomic.add(fx[ARRIVALS], slot, 1) == S - 1
        if last:
            fx[ARRIVALS][slot] = 0  # every split has arrived: zero for the next call
        stats[BLOCK_M] = float32(1.0) if last else float32(0.0)
    cuda.syncthreads()  # the flag, before every thread reads it
    if stats[BLOCK_M] == float32(0.0):
        return
    ptx.fence_acq_rel_gpu()  # acquire: the other splits' rows
    x = cuda.local.array(SPLITS_AT_ONCE, float32)
    acc = cuda.local.array((CHUNKS, 4), float32)
    xs = cuda.local.array((CHUNKS, SPLITS_AT_ONCE), float32)
    o = cuda.local.array((CHUNKS, SPLITS_AT_ONCE, 4), float32)
    G = sa[2]
    rows = min(BLOCK_M, seqlen_q - start_m)
    # pass 1: a thread a row: the maximum lse m and 1/Σ exp(lse − m), online over the splits
    for r in range(tid, rows, THREADS):
        m = float32(-math.inf)
        tot = float32(0.0)
        nan = False
        for s0 in range(0, S, SPLITS_AT_ONCE):
            for k in range(SPLITS_AT_ONCE):  # loads without a branch between them: in flight together
                x[k] = ptx.ld_global_cg_f32(lse_parts, (min(s0 + k, S - 1), h, q0 + start_m + r))
            for k in range(SPLITS_AT_ONCE):
                xk = x[k] if s0 + k < S else float32(-math.inf)  # (a select: the loads stay ahead of it)
                if math.isnan(xk) or xk == float32(math.inf):
                    nan = True
                elif xk > m:  # a new maximum: the sum so far rescaled
                    tot = tot * math.exp(m - xk) if m != float32(-math.inf) else float32(0.0)
                    m = xk
                if xk != float32(-math.inf) and not math.isnan(xk):
                    tot += math.exp(xk - m)
        lse_out = m + math.log(tot) if tot > float32(0.0) else float32(-math.inf)
        if nan:
            lse_out = float32(math.nan)
        if G > 0:
            fx[LSE_MERGED][seq, h * G + start_m + r, 0] = lse_out
        else:
            fx[LSE_MERGED][seq, h, start_m + r] = lse_out
        stats[r] = lse_out  # the row's lse: weight of split s = exp(lse_s − lse)
    cuda.syncthreads()  # every row's lse, before the columns are merged
    # pass 2: out = Σ_s exp(lse_s − lse)·out_s, 4 columns a chunk, split order
    D4 = DATA_DIM // 4
    out = fx[OUT_MERGED]
    for i0 in range(tid, rows * D4, THREADS * CHUNKS):
        for u in range(CHUNKS):
            for e in range(4):
                acc[u, e] = float32(0.0)
        for s0 in range(0, S, SPLITS_AT_ONCE):
            # every load first (indices clamped, no branch between them: in flight together)
            for u in range(CHUNKS):
                i = min(i0 + u * THREADS, rows * D4 - 1)
                r = i // D4
                c = 4 * (i - r * D4)
                for k in range(SPLITS_AT_ONCE):
                    sk = min(s0 + k, S - 1)
                    xs[u, k] = ptx.ld_global_cg_f32(lse_parts, (sk, h, q0 + start_m + r))
                    o[u, k, 0], o[u, k, 1], o[u, k, 2], o[u, k, 3] = ptx.ld_global_cg_v4_f32(
                        out_parts, (sk, q0 + start_m + r, h, c))  # fmt: skip
            for u in range(CHUNKS):  # no branch: selects, so the loads stay ahead of their use
                r = min(i0 + u * THREADS, rows * D4 - 1) // D4
                for k in range(SPLITS_AT_ONCE):
                    w = math.exp(xs[u, k] - stats[r])
                    # a split that saw no key (weight 0) is not read into the sum: its out may be anything
                    ok = s0 + k < S and xs[u, k] != float32(-math.inf) and w != float32(0.0)
                    for e in range(4):
                        acc[u, e] += w * o[u, k, e] if ok else float32(0.0)
        for u in range(CHUNKS):
            i = i0 + u * THREADS
            if i < rows * D4:
                r = i // D4
                store_merged_chunk(out, seq, h, G, start_m + r, 4 * (i - r * D4), acc[u, 0], acc[u, 1], acc[u, 2],
                                   acc[u, 3], stats[r], BF16)  # fmt: skip


@device_function
def store_merged_chunk(out, seq, h, G, row, c, a0, a1, a2, a3, lse_row, BF16):
    """Columns c … c + 3 of merged row ``row`` (``a0`` … ``a3``, the weighted sum of the
    parts) into ``out`` (``fx[OUT_MERGED]``: a uint32 view of fp16 / bf16 pairs) as
    :func:`merge_kernel` writes them: 0 where no split saw a key (``lse_row`` −inf), NaN
    where the row's lse is NaN; at ``out[seq, 0, h·G + row]`` with the GQA decode swap
    (G > 0), else ``out[seq, row, h]``.  The in-kernel merges' last step
    (:func:`merge_if_last`, :func:`merge_in_cluster`)."""
    if lse_row == float32(-math.inf):  # no split saw a key: 0
        a0 = a1 = a2 = a3 = float32(0.0)
    elif math.isnan(lse_row):
        a0 = a1 = a2 = a3 = float32(math.nan)
    if BF16:
        w0 = ptx.pack_bf16x2(a0, a1)
        w1 = ptx.pack_bf16x2(a2, a3)
    else:
        w0 = ptx.pack_f16x2(a0, a1)
        w1 = ptx.pack_f16x2(a2, a3)
    if G > 0:
        out[seq, 0, h * G + row, c // 2] = w0
        out[seq, 0, h * G + row, c // 2 + 1] = w1
    else:
        out[seq, row, h, c // 2] = w0
        out[seq, row, h, c // 2 + 1] = w1


# --- split-KV merged through distributed shared memory (a thread-block cluster a row tile) ---

#: The most splits a cluster holds.  The hardware's portable limit is 8 CTAs, but on the
#: H200 clusters of 8 decode blocks ran slower than the global merge (4096 keys: 0.052
#: against 0.042 ms; 131072 keys over pages of 256: 1.25 against 0.98 ms), clusters of 4
#: faster (4096 keys: 0.038 against 0.041): docs/benchmarks/2026-12-04-s23.
MAX_CLUSTER = 4
#: Floats of padding after each staged row (:func:`stage_part_row`): a row stride of
#: d + 4 words puts the 8 rows of one store instruction on different banks (2-way at
#: most, against 8-way at a stride of d = 128) and keeps every row 16-byte aligned.
ROW_PAD = 4


def merges_in_cluster(t) -> bool:
    """Whether the tensor-core forward of tiles ``t`` merges split-KV's parts in a
    thread-block cluster (:func:`merge_in_cluster`): the one-warp decode tiles up to d =
    128.  It compiles past that too (the rows go through shared memory: at d = 256 the
    kernel keeps its 255 registers and spills nothing), but on the H200 a d = 256 decode
    step (B = 8, 16/8 heads, 4096 keys, 4 splits) took 0.237 ms in clusters against 0.125
    with the merge kernel (docs/benchmarks/2026-12-04-s23, call 6; not profiled)."""
    return t.warps == 1 and t.head_dim <= 128


def cluster_stage_floats(block_m: int, data_dim: int) -> int:
    """Floats of shared memory :func:`stage_part_row` and :func:`merge_in_cluster` use:
    ``block_m`` rows of ``data_dim + ROW_PAD`` floats, then the rows' lse."""
    return block_m * (data_dim + ROW_PAD) + block_m


@device_function
def stage_part_row(stats, r, acc, A0, NT, tq, scale, lse_row, BLOCK_M, DATA_DIM):
    """Row ``r`` of a split's partial output (the accumulator n-tiles ``acc[A0 + 4·nt]``,
    ``+ 1``: columns 8·nt + 2t, + 1 of this lane, times ``scale`` = 1/l) and its
    ``lse_row`` into this CTA's shared ``stats`` (float32): row r at ``r·(DATA_DIM +
    ROW_PAD)``, the lse after the ``BLOCK_M`` rows (written by lane t = 0 of the row's
    quad).  :func:`merge_in_cluster` reads them from the cluster's other CTAs."""
    ROW = DATA_DIM + ROW_PAD
    for nt in range(NT):
        col = nt * 8 + 2 * tq
        if col < DATA_DIM:
            stats[r * ROW + col] = acc[A0 + nt * 4] * scale
        if col + 1 < DATA_DIM:
            stats[r * ROW + col + 1] = acc[A0 + nt * 4 + 1] * scale
    if tq == 0:
        stats[BLOCK_M * ROW + r] = lse_row


@device_function
def merge_in_cluster(stats, fx, seq, h, start_m, seqlen_q, BLOCK_M, DATA_DIM, tid, THREADS, BF16, S):
    """Split-KV merged in the forward kernel through a thread-block cluster: the S
    splits of a row tile are the S CTAs of one cluster (``Variant.cluster``; rank =
    split), each has staged its partial rows and their lse in its shared memory
    (:func:`stage_part_row`).  After the cluster's barrier (release / acquire: every
    split's rows are visible to every CTA), CTA ``rank`` merges the 4-column chunks
    ``i`` with ``(i // THREADS) % S == rank`` of the tile's rows, reading the S parts
    of its chunks from the S CTAs' shared memory (``mapa`` + ``ld.shared::cluster``, all
    2·S loads of a chunk in flight together), as :func:`merge_kernel` does and in split
    order (deterministic).  A second barrier keeps every CTA (its shared memory) alive
    until the others have read it.  No global fences, no counters, no fp32 parts in HBM:
    the cost at the end of the walk is two cluster barriers and one round of
    distributed-shared-memory loads (against :func:`merge_if_last`'s release fence,
    atomic, acquire fence and two rounds of L2 loads).

    Where the merged rows go: as :func:`merge_if_last` (``fx[OUT_MERGED]``,
    ``fx[LSE_MERGED]``; the GQA decode swap with ``fx[SPLIT_AT][2]`` = G > 0)."""
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()  # every split's staged rows, before any CTA of the cluster reads them
    ROW = DATA_DIM + ROW_PAD
    LSE0 = BLOCK_M * ROW
    rank = int32(ptx.cluster_ctarank())
    base = ptx.smem_addr(stats, 0)
    x = cuda.local.array(MAX_CLUSTER, float32)
    o = cuda.local.array((MAX_CLUSTER, 4), float32)
    acc = cuda.local.array(4, float32)
    G = fx[SPLIT_AT][2]
    out = fx[OUT_MERGED]
    rows = min(BLOCK_M, seqlen_q - start_m)
    D4 = DATA_DIM // 4
    for i in range(rank * THREADS + tid, rows * D4, S * THREADS):
        r = i // D4
        c = 4 * (i - r * D4)
        for s in range(S):  # every load first, no branch between them: in flight together
            x[s] = ptx.ld_shared_cluster_f32(ptx.mapa_shared_cluster(base + 4 * (LSE0 + r), s))
            o[s, 0], o[s, 1], o[s, 2], o[s, 3] = ptx.ld_shared_cluster_v4_f32(
                ptx.mapa_shared_cluster(base + 4 * (r * ROW + c), s))  # fmt: skip
        m = float32(-math.inf)
        nan = False
        for s in range(S):
            if math.isnan(x[s]) or x[s] == float32(math.inf):
                nan = True
            elif x[s] > m:
                m = x[s]
        tot = float32(0.0)
        for s in range(S):  # a part that saw no key (lse −inf) adds nothing
            if x[s] != float32(-math.inf) and not math.isnan(x[s]):
                tot += math.exp(x[s] - m)
        lse_out = m + math.log(tot) if tot > float32(0.0) else float32(-math.inf)
        if nan:
            lse_out = float32(math.nan)
        for e in range(4):
            acc[e] = float32(0.0)
        for s in range(S):  # out = Σ_s exp(lse_s − lse)·out_s, split order
            w = math.exp(x[s] - lse_out)
            ok = x[s] != float32(-math.inf) and w != float32(0.0)  # weight 0: its out may be anything
            for e in range(4):
                acc[e] += w * o[s, e] if ok else float32(0.0)
        store_merged_chunk(out, seq, h, G, start_m + r, c, acc[0], acc[1], acc[2], acc[3], lse_out, BF16)
        if c == 0 and G > 0:
            fx[LSE_MERGED][seq, h * G + start_m + r, 0] = lse_out
        elif c == 0:
            fx[LSE_MERGED][seq, h, start_m + r] = lse_out
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()  # no CTA exits (its shared memory goes) while another still reads it

"""A small forward + backward of every kernel family, for compute-sanitizer.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py
    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py float32   # fp32 modes only
    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py flex      # FlexAttention only
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py flex16   # … its 16-bit cases (wgmma on sm_90a)
    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py kvcache   # flash_attention_with_kvcache only
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py kvcache16  # … its fp16 cases
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma    # the Hopper forward only (sm_90)
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma_bwd  # the Hopper backward only (sm_90)
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma_bwd wide  # … at d = 256 and 96
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma wide  # the forward past d = 128
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py wgmma_varlen  # both Hopper passes, varlen
    compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py kvsplit  # a prefill's splits, Hopper forward

Shapes are small and not multiples of any tile; causal on and off, Nq != Nk, both layouts.
"""

import sys

import cupy as cp
import numpy as np

import numba_flash

rng = np.random.default_rng(0)
import ml_dtypes

MODES = [(np.float32, False), (np.float32, True), (np.float16, False), (ml_dtypes.bfloat16, False)]
FLEX_ONLY = sys.argv[1:] in (["flex"], ["flex16"])
# flex16: the 16-bit paths alone (on an H100/H200 the Hopper kernels)
FLEX_DTYPES = MODES[2:] if sys.argv[1:] == ["flex16"] else MODES
if sys.argv[1:] == ["kvsplit"]:  # prefills' split-KV on the Hopper forward (the default since session 29), fp16
    B, H, Hk, d, Nq = 2, 4, 2, 64, 20
    lens = np.array([150, 300], np.int32)
    table = rng.permutation(48)[:40].reshape(2, 20).astype(np.int32)
    paged = [cp.asarray(rng.standard_normal((48, 16, Hk, d)).astype(np.float16)) for _ in range(2)]
    contig = [cp.asarray(rng.standard_normal((2, 320, Hk, d)).astype(np.float16)) for _ in range(2)]
    q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(np.float16))
    for caches, kw in ((contig, {}), (paged, dict(block_table=table))):
        out = numba_flash.flash_attention_with_kvcache(q, *caches, cache_seqlens=lens, causal=True, num_splits=3, **kw)
        cp.cuda.runtime.deviceSynchronize()
        print("float16 kvsplit", "paged" if kw else "contiguous", "finite:", bool(cp.isfinite(out).all()))
    print("sanitize_small: done")
    sys.exit(0)
if sys.argv[1:2] in (["kvcache"], ["kvcache16"]):  # paged (pages of 16) and contiguous caches, appends with rotary,
    # splits, decode, prefill; kvcache16: fp16 only (the decode tiles' split-KV merged in the kernel, in time for a cut)
    for dtype in (np.float16,) if sys.argv[1] == "kvcache16" else (np.float32, np.float16, ml_dtypes.bfloat16):
        B, H, Hk, d = 3, 4, 2, 64
        lens = np.array([0, 21, 40], np.int32)
        table = rng.permutation(17)[:15].reshape(3, 5).astype(np.int32)
        paged = [cp.asarray(rng.standard_normal((17, 16, Hk, d)).astype(dtype)) for _ in range(2)]
        contig = [cp.asarray(rng.standard_normal((4, 70, Hk, d)).astype(dtype)) for _ in range(2)]
        ang = rng.standard_normal((100, 16))
        cos, sin = (cp.asarray(f(ang).astype(np.float32)) for f in (np.cos, np.sin))
        # the last two: prefills (20 query rows, one split), the Hopper forward's paged TMA boxes on an H200
        for Nq, caches, kw in ((5, paged, dict(block_table=table, causal=True, num_splits=3)),
                               (2, contig, dict(cache_batch_idx=np.array([3, 0, 1], np.int32), window_size=(7, 2))),
                               (1, paged, dict(block_table=table, causal=True, num_splits=0)),
                               (20, paged, dict(block_table=table, causal=True, num_splits=1)),
                               (20, contig, dict(cache_batch_idx=np.array([3, 0, 1], np.int32), num_splits=1))):
            q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
            k, v = (cp.asarray(rng.standard_normal((B, 3, Hk, d)).astype(dtype)) for _ in range(2))
            out = numba_flash.flash_attention_with_kvcache(q, *caches, k, v, cache_seqlens=lens, rotary_cos=cos,
                                                           rotary_sin=sin, **kw)
            cp.cuda.runtime.deviceSynchronize()
            print(np.dtype(dtype).name, "kvcache", Nq, "finite:", bool(cp.isfinite(out).all()))
            lens = lens + 3
        lens = np.array([0, 21, 40], np.int32)
    print("sanitize_small: done")
    sys.exit(0)
if sys.argv[1:2] == ["wgmma"]:  # issue #13's Hopper forward: TMA ring, mbarriers, both consumers, partial tiles
    import os

    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = "3"  # three blocks: each runs several tiles (the Q and ring hand-over)
    slopes = cp.asarray([0.5, 0.25, 0.125, 0.0625], dtype=cp.float32)
    variants = dict(window_size=(50, 0), softcap=4.0, dropout_p=0.2, seed=3)
    if sys.argv[2:] == ["wide"]:  # past d = 128: 64-key tiles; at d = 256 O staged in Q's rows, Q loaded late
        cases = ((200, 131, 256, False, {}), (130, 260, 256, True, variants), (77, 300, 200, True, {}),
                 (150, 333, 192, True, dict(alibi_slopes=slopes, dropout_p=0.1, seed=5)))
    else:
        cases = ((77, 300, 64, True, {}), (200, 131, 128, False, {}), (130, 260, 64, True, variants),
                 # ALiBi on the tensor cores: the key ramp every thread writes, with dropout
                 (150, 333, 128, True, dict(alibi_slopes=slopes, dropout_p=0.1, seed=5)),
                 # dropout at d = 128 (two consumers, no ALiBi)
                 (200, 300, 128, False, dict(dropout_p=0.2, seed=4)))
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for Nq, Nk, d, causal, kw in cases:
            B, H, Hk = 2, 4, 2
            q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
            k, v = (cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(dtype)) for _ in range(2))
            out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, **kw)
            cp.cuda.runtime.deviceSynchronize()
            print(np.dtype(dtype).name, "wgmma", Nq, Nk, d, causal, "finite:",
                  bool(cp.isfinite(out).all()) and bool(cp.isfinite(lse).all()))
    print("sanitize_small: done")
    sys.exit(0)
if sys.argv[1:2] == ["wgmma_bwd"]:  # the Hopper backward: both rings, the stats bulk copies, GQA, partial tiles
    import os

    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    cases = ((77, 300, 64, True, {}), (200, 131, 128, False, {}),
             (330, 260, 128, True, dict(window_size=(50, 0), softcap=4.0, dropout_p=0.2, seed=3)))
    if sys.argv[2:] == ["wide"]:  # d = 256 (dV and dK apart, 32-row steps) and d = 96 on d = 128's tiles
        cases = ((150, 170, 256, True, {}), (90, 200, 96, False, dict(softcap=4.0, dropout_p=0.2, seed=3)))
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for Nq, Nk, d, causal, kw in cases:
            B, H, Hk = 2, 4, 2
            q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
            k, v = (cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(dtype)) for _ in range(2))
            out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True, **kw)
            dout = cp.asarray(rng.standard_normal(out.shape).astype(dtype))
            grads = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, **kw)
            cp.cuda.runtime.deviceSynchronize()
            print(np.dtype(dtype).name, "wgmma_bwd", Nq, Nk, d, causal, "finite:",
                  all(bool(cp.isfinite(g).all()) for g in grads))
    print("sanitize_small: done")
    sys.exit(0)
if sys.argv[1:] == ["wgmma_varlen"]:  # the Hopper kernels' varlen: tiles past a sequence, zeroed rows, stats rows
    import os

    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = "3"  # three blocks: each runs several tiles, some past their sequence
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for d, causal, kw in ((64, True, {}), (128, False, dict(window_size=(50, 7), softcap=4.0)), (128, True, {})):
            lq, lk = [70, 0, 1, 200, 129], [90, 3, 1, 131, 300]
            cq, ck = (cp.asarray(np.concatenate([[0], np.cumsum(x)]).astype(np.int32)) for x in (lq, lk))
            H, Hk = 4, 2
            q, dout = (cp.asarray(rng.standard_normal((sum(lq), H, d)).astype(dtype)) for _ in range(2))
            k, v = (cp.asarray(rng.standard_normal((sum(lk), Hk, d)).astype(dtype)) for _ in range(2))
            out, lse = numba_flash.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                                          return_lse=True, **kw)  # fmt: skip
            grads = numba_flash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cq, ck, max(lq), max(lk),
                                                                causal=causal, **kw)  # fmt: skip
            cp.cuda.runtime.deviceSynchronize()
            print(np.dtype(dtype).name, "wgmma_varlen", d, causal, "finite:",
                  all(bool(cp.isfinite(x).all()) for x in (out, *grads)))
    print("sanitize_small: done")
    sys.exit(0)
if FLEX_ONLY:
    MODES = []
elif len(sys.argv) > 1:  # e.g. `float32`: only the modes of those dtypes (a shorter sanitizer run)
    MODES = [(dt, tf32) for dt, tf32 in MODES if np.dtype(dt).name in sys.argv[1:]]
for dtype, tf32 in MODES:  # tf32: float32 with allow_tf32=True (the TF32 tensor-core kernels)
    for (Nq, Nk, d, causal, layout) in ((77, 77, 64, True, "bshd"), (50, 93, 128, False, "bhsd"), (93, 50, 32, True, "bshd")):
        B, H = 1, 2
        shape = lambda n: (B, n, H, d) if layout == "bshd" else (B, H, n, d)  # noqa: E731
        q, k, v = (cp.asarray(rng.standard_normal(shape(n)).astype(dtype)) for n in (Nq, Nk, Nk))
        opts = dict(causal=causal, layout=layout, allow_tf32=True) if tf32 else dict(causal=causal, layout=layout)
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **opts)
        dout = cp.asarray(rng.standard_normal(out.shape).astype(dtype))
        dq, dk, dv = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, **opts)
        cp.cuda.runtime.deviceSynchronize()
        print(np.dtype(dtype).name, "tf32" if tf32 else "", Nq, Nk, d, causal, layout, "finite:",
              all(bool(cp.isfinite(x).all()) for x in (out, dq, dk, dv)))
# the variants (issue #11): GQA + window + softcap + ALiBi + dropout, and varlen, on every mode
# (d = 59: a head dim that is not a multiple of 8)
for dtype, tf32 in MODES:
    for d in (64, 32, 59):
        B, Nq, Nk, H, Hk = 2, 45, 70, 4, 2
        q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
        k, v = (cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(dtype)) for _ in range(2))
        opts = dict(causal=True, window_size=(20, -1), softcap=3.0, alibi_slopes=cp.full((H,), 0.25, cp.float32),
                    dropout_p=0.2, seed=11, allow_tf32=tf32)
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **opts)
        grads = numba_flash.flash_attention_backward(cp.asarray(rng.standard_normal(out.shape).astype(dtype)), q, k, v,
                                                     out, lse, **opts)
        lens = [0, 9, 1, 33]
        cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        qv, kv, vv = (cp.asarray(rng.standard_normal((sum(lens), h, d)).astype(dtype)) for h in (H, Hk, Hk))
        o2, l2 = numba_flash.flash_attention_varlen(qv, kv, vv, cu, cu, 33, 33, causal=True, return_lse=True,
                                                    allow_tf32=tf32)
        g2 = numba_flash.flash_attention_varlen_backward(cp.asarray(rng.standard_normal(o2.shape).astype(dtype)), qv, kv,
                                                         vv, o2, l2, cu, cu, 33, 33, causal=True, allow_tf32=tf32)
        cp.cuda.runtime.deviceSynchronize()
        print(np.dtype(dtype).name, "tf32" if tf32 else "", d, "variants finite:",
              all(bool(cp.isfinite(x).all()) for x in (out, *grads, o2, *g2)))
# tensor-core head dims past 128 (Q from shared memory, dK and dV from two kernels), padded
for dtype in [dt for dt, tf32 in MODES if np.dtype(dt).itemsize == 2]:
    for d in (200, 256):
        B, Nq, Nk, H, Hk = 1, 45, 70, 4, 2
        q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
        k, v = (cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(dtype)) for _ in range(2))
        opts = dict(causal=True, window_size=(20, -1), softcap=3.0, dropout_p=0.2, seed=5)
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **opts)
        grads = numba_flash.flash_attention_backward(cp.asarray(rng.standard_normal(out.shape).astype(dtype)), q, k, v,
                                                     out, lse, **opts)
        cp.cuda.runtime.deviceSynchronize()
        print(np.dtype(dtype).name, d, "head dims finite:", all(bool(cp.isfinite(x).all()) for x in (out, *grads)))
# FlexAttention (issue #12): a score_mod reading a table, a mask_mod block mask reading
# document ids (blocks smaller than the tiles: PARTIAL tiles), and a dense pattern, with
# GQA and causal, on every mode
from numba_flash import BlockMask, create_block_mask


def rel_bias(score, b, h, q_idx, kv_idx, table):
    return score + table[h, (q_idx - kv_idx) % table.shape[1]]


def one(score, b, h, q_idx, kv_idx, table):
    return 1.0


def same_doc(b, h, q_idx, kv_idx, doc):
    return doc[q_idx] == doc[kv_idx]


for dtype, tf32 in FLEX_DTYPES:
    B, Nq, Nk, H, Hk, d = 2, 77, 93, 4, 2, 64
    q = cp.asarray(rng.standard_normal((B, Nq, H, d)).astype(dtype))
    k, v = (cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(dtype)) for _ in range(2))
    table = cp.asarray(rng.standard_normal((H, 5)).astype(np.float32))
    doc = cp.asarray((np.arange(max(Nq, Nk)) // 30).astype(np.int32))
    for bm in (create_block_mask(same_doc, None, H, Nq, Nk, block_size=16, mod_args=(doc,)),
               BlockMask.from_dense(rng.random((B, 1, 5, 6)) < 0.6, 16, Nq, Nk)):
        opts = dict(causal=True, allow_tf32=tf32, block_mask=bm, score_mod=rel_bias, mod_args=(table,))
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **opts)
        grads = numba_flash.flash_attention_backward(cp.asarray(rng.standard_normal(out.shape).astype(dtype)), q, k, v,
                                                     out, lse, score_mod_grad=one, **opts)
        cp.cuda.runtime.deviceSynchronize()
        print(np.dtype(dtype).name, "tf32" if tf32 else "", "flex ran")
    # varlen with a per-sequence block mask (lists clipped per sequence) and a score_mod
    lens_q, lens_k = [0, 40, 1, 77], [9, 93, 1, 30]
    cu_q, cu_k = (cp.asarray(np.concatenate([[0], np.cumsum(x)]).astype(np.int32)) for x in (lens_q, lens_k))
    qv = cp.asarray(rng.standard_normal((sum(lens_q), H, d)).astype(dtype))
    kv, vv = (cp.asarray(rng.standard_normal((sum(lens_k), Hk, d)).astype(dtype)) for _ in range(2))
    bm = BlockMask.from_dense(rng.random((4, 1, 5, 6)) < 0.6, 16, 77, 93)
    opts = dict(causal=True, allow_tf32=tf32, block_mask=bm, score_mod=rel_bias, mod_args=(table,))
    o2, l2 = numba_flash.flash_attention_varlen(qv, kv, vv, cu_q, cu_k, 77, 93, return_lse=True, **opts)
    g2 = numba_flash.flash_attention_varlen_backward(cp.asarray(rng.standard_normal(o2.shape).astype(dtype)), qv, kv,
                                                     vv, o2, l2, cu_q, cu_k, 77, 93, score_mod_grad=one, **opts)
    cp.cuda.runtime.deviceSynchronize()
    print(np.dtype(dtype).name, "tf32" if tf32 else "", "flex varlen ran")
# 128-blocks cut into the kernels' tiles: the PARTIAL blocks' tiles classified again by mask_mod
q, k, v = (cp.asarray(rng.standard_normal((1, 300, 2, 64)).astype(np.float16)) for _ in range(3))
doc = cp.asarray((np.arange(300) // 70).astype(np.int32))
bm = create_block_mask(same_doc, None, None, 300, 300, block_size=128, mod_args=(doc,))
out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, block_mask=bm)
grads = numba_flash.flash_attention_backward(out, q, k, v, out, lse, block_mask=bm)
cp.cuda.runtime.deviceSynchronize()
print("refined tiles ran")
print("sanitize_small: done")

"""Issue #14's bars: decode bandwidth and prefill against a paged cache (H200, fp16).

    python3 scripts/bench_decode.py out.jsonl [--prefill-only | --decode-only] [--lengths 4096,32768] [--sweep-at L,…]
                                              [--sweep-paged] [--pages 16,64,256]

* **Decode**: Nq = 1, B = 8, 32 query / 8 KV heads, d = 128, caches of 4096, 32768 and
  131072 tokens (full), contiguous and paged (pages of 256).  Bandwidth = bytes of K
  and V read (B·H_kv·L·d·2·2) / time, against the 4.27 TB/s copy bandwidth; beside it
  torch SDPA's flash and cuDNN backends on the same shape (``enable_gqa``, or K/V
  repeated to 32 heads where a backend refuses it).  ``num_splits`` auto, and 1, 4, 8,
  16 and 32 at 32768 (``--sweep-at L,…``: at those lengths; ``--sweep-paged``: 3, 4 and 8
  on the paged cache there too).
* **Prefill**: Nq = 2048 causal against a paged cache of 16384 (B = 2, same heads; pages
  of 256 rows, or ``--pages``), TFLOP/s against ``flash_attention`` on the same keys as
  contiguous arrays.

Times: medians of CUDA events around 10 back-to-back calls (``bench_table.median_ms``
with ``calls=10``), of single calls, and of 10 replays of the call captured in a CUDA
graph (``graph_ms``: the GPU's time of the step, without the host's).
"""

import json
import sys

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash
from numba_flash._report import write_jsonl
from numba_flash.bench import decode as DEC
from numba_flash.bench.cases import visible_pairs

rng = np.random.default_rng(14)
COPY_TBS = 4.27
SWEEP_L = (32768,)  # the lengths at which num_splits 1, 4, … are timed too (--sweep-at L,…)
if "--sweep-at" in sys.argv:
    SWEEP_L = tuple(int(x) for x in sys.argv[sys.argv.index("--sweep-at") + 1].split(","))
B, H, HK, D = 8, 32, 8, 128
PAGES = (256,)  # the prefill's page sizes (``--pages 16,64,256``)
if "--pages" in sys.argv:
    PAGES = tuple(int(x) for x in sys.argv[sys.argv.index("--pages") + 1].split(","))


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def timed(fn):
    fn()
    return DEC.queued_ms(fn), median_ms(fn, warmup=1, rep=9)


def sdpa(q, k, v):
    """(flash ms, cudnn ms) of torch SDPA on bshd q (B, 1, H, d), k/v (B, L, HK, d)."""
    got = DEC.sdpa_peers(DEC.DecodeCase(k.shape[1], B, H, HK, D), q, k, v)
    return {"flash": got["sdpa_flash"], "cudnn": got["sdpa_cudnn"]}


def main(path):
    rows = []
    lengths = (4096, 32768, 131072)
    if "--lengths" in sys.argv:
        lengths = tuple(int(x) for x in sys.argv[sys.argv.index("--lengths") + 1].split(","))
    for L in (() if "--prefill-only" in sys.argv else lengths):
        kc, vc = randn(B, L, HK, D), randn(B, L, HK, D)
        q = randn(B, 1, H, D)
        kv_bytes = 2 * B * HK * L * D * 2
        page = 256
        per = L // page
        table = rng.permutation(B * per).reshape(B, per).astype(np.int32)
        kp, vp = cp.empty((B * per, page, HK, D), cp.float16), cp.empty((B * per, page, HK, D), cp.float16)
        tb = cp.asarray(table)
        for b in range(B):  # the same keys, paged
            kp[tb[b]] = kc[b].reshape(per, page, HK, D)
            vp[tb[b]] = vc[b].reshape(per, page, HK, D)
        peers = sdpa(q, kc, vc)
        for layout, args, kw in (("contiguous", (q, kc, vc), {}), ("paged 256", (q, kp, vp), {"block_table": table})):
            splits = (0,)
            if L in SWEEP_L and layout == "contiguous":
                splits = (0, 1, 4, 8, 16, 32)
            elif L in SWEEP_L and "--sweep-paged" in sys.argv:
                splits = (0, 3, 4, 8)
            for s in splits:
                fn = lambda: numba_flash.flash_attention_with_kvcache(*args, cache_seqlens=L, num_splits=s, **kw)  # noqa: E731
                queued, single = timed(fn)
                graph, why = DEC.graph_ms(fn)
                row = dict(case="decode", L=L, layout=layout, num_splits=s, queued_ms=queued, single_ms=single,
                           graph_ms=graph, graph_error=why, graph_frac_copy=kv_bytes / graph / 1e9 / COPY_TBS,
                           tbs=kv_bytes / queued / 1e9, frac_copy=kv_bytes / queued / 1e9 / COPY_TBS,
                           sdpa_flash_ms=peers["flash"][0], sdpa_flash_how=peers["flash"][1],
                           sdpa_cudnn_ms=peers["cudnn"][0], sdpa_cudnn_how=peers["cudnn"][1])  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        del kc, vc, kp, vp
        cp.get_default_memory_pool().free_all_blocks()
    if "--decode-only" in sys.argv:
        return report(rows, path)
    # prefill: Nq = 2048 causal on a paged cache of 16384 against the plain kernel
    Bp, Nq, L = 2, 2048, 16384
    k, v = randn(Bp, L, HK, D), randn(Bp, L, HK, D)
    q = randn(Bp, Nq, H, D)
    fl = 4 * Bp * H * D * visible_pairs(Nq, L, True)
    plain = timed(lambda: numba_flash.flash_attention(q, k, v, causal=True))
    out_a = numba_flash.flash_attention(q, k, v, causal=True)
    for page in PAGES:
        per = L // page
        table = rng.permutation(Bp * per).reshape(Bp, per).astype(np.int32)
        kp, vp = cp.empty((Bp * per, page, HK, D), cp.float16), cp.empty((Bp * per, page, HK, D), cp.float16)
        tb = cp.asarray(table)
        for b in range(Bp):
            kp[tb[b]] = k[b].reshape(per, page, HK, D)
            vp[tb[b]] = v[b].reshape(per, page, HK, D)
        paged = timed(lambda: numba_flash.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=L, block_table=table,
                                                                       causal=True))  # fmt: skip
        out_b = numba_flash.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=L, block_table=table, causal=True)
        row = dict(case="prefill", Nq=Nq, L=L, page=page, plain_ms=plain[0], paged_ms=paged[0],
                   plain_tflops=fl / plain[0] / 1e9, paged_tflops=fl / paged[0] / 1e9, ratio=plain[0] / paged[0],
                   max_abs_diff=float(cp.abs(out_a.astype(cp.float32) - out_b.astype(cp.float32)).max()))  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    report(rows, path)


def report(rows, path):
    write_jsonl(rows, path)
    print(f"\n{'case':8} {'L':>7} {'layout':11} {'splits':>6} {'ms (10 queued)':>14} {'ms (1)':>8} {'TB/s':>6} "
          f"{'of copy':>7} {'graph ms':>8} {'of copy':>7} {'SDPA flash':>10} {'cudnn':>8}")
    for r in rows:
        if r["case"] == "decode":
            print(f"{'decode':8} {r['L']:7d} {r['layout']:11} {r['num_splits']:6d} {r['queued_ms']:14.3f} "
                  f"{r['single_ms']:8.3f} {r['tbs']:6.2f} {r['frac_copy']:7.2f} {r['graph_ms']:8.3f} "
                  f"{r['graph_frac_copy']:7.2f} {r['sdpa_flash_ms']:10.3f} {r['sdpa_cudnn_ms']:8.3f}"
                  + (f"  graph: {r['graph_error']}" if r["graph_error"] else ""))
        else:
            print(f"prefill Nq={r['Nq']} on {r['L']} paged ({r.get('page', 256)}): {r['paged_tflops']:.1f} TF/s vs plain "
                  f"{r['plain_tflops']:.1f}: {r['ratio']:.3f} (bar 0.9); max |diff| {r['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main(sys.argv[1])

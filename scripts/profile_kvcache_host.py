"""Where a ``flash_attention_with_kvcache`` call's host time goes, and whether the call
waits for the GPU (issue #14: the 4096-key decode was host-bound at 0.6 ms a call).

    python3 scripts/profile_kvcache_host.py OUT_DIR

For a decode (Nq = 1, B = 8, 32/8 heads, d = 128, 4096 keys, contiguous and paged) and
a prefill (Nq = 2048 causal on a paged 16384 cache, B = 2):

* ``host_us``: host time of one call, 50 calls back to back without a sync;
* ``gpu_us``: CUDA events around 10 queued calls (``bench_table.median_ms``);
* ``waits``: the call's host time right after ~20 ms of queued GPU work (a matmul
  loop) -- if the call waits for the GPU (a device-to-host copy, a pageable upload),
  this is the GPU work's time, not the host's;
* a cProfile of 50 calls (top 25 by own time) appended to ``OUT_DIR/profiles.txt``.
"""

import cProfile
import io
import json
import os
import pstats
import sys
import time

import cupy as cp
import numpy as np
from bench_table import median_ms

import numba_flash

rng = np.random.default_rng(14)
B, H, HK, D = 8, 32, 8, 128


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def paged(k, page):
    b, L = k.shape[:2]
    per = L // page
    table = rng.permutation(b * per).reshape(b, per).astype(np.int32)
    kp = cp.empty((b * per, page) + k.shape[2:], k.dtype)
    tb = cp.asarray(table)
    for i in range(b):
        kp[tb[i]] = k[i].reshape((per, page) + k.shape[2:])
    return kp, table


def busy_gpu(ms=20.0):
    """Queue about ``ms`` of GPU work (fp16 matmuls)."""
    a = cp.ones((4096, 4096), cp.float16)
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    a @ a
    e.record()
    e.synchronize()
    one = cp.cuda.get_elapsed_time(s, e)
    reps = max(1, int(ms / max(one, 1e-3)))
    return lambda: [a @ a for _ in range(reps)]


def measure(name, fn, out_dir):
    fn()
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for _ in range(50):
        fn()
    host = (time.perf_counter() - t) / 50 * 1e6
    cp.cuda.runtime.deviceSynchronize()
    gpu = median_ms(fn, warmup=2, rep=9, calls=10) * 1e3
    work = busy_gpu()
    waits = []
    for _ in range(5):
        cp.cuda.runtime.deviceSynchronize()
        work()
        t = time.perf_counter()
        fn()
        waits.append((time.perf_counter() - t) * 1e6)
        cp.cuda.runtime.deviceSynchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        fn()
    prof.disable()
    cp.cuda.runtime.deviceSynchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    with open(os.path.join(out_dir, "profiles.txt"), "a") as f:
        f.write(f"===== {name}\n" + text.getvalue())
    row = dict(case=name, host_us=host, gpu_us=gpu, waits_us=float(np.median(waits)))
    print(json.dumps(row), flush=True)
    return row


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    L = 4096
    kc, vc, q = randn(B, L, HK, D), randn(B, L, HK, D), randn(B, 1, H, D)
    kp, table = paged(kc, 256)
    vp, _ = paged(vc, 256)
    f = numba_flash.flash_attention_with_kvcache
    rows.append(measure("decode_4096_contiguous", lambda: f(q, kc, vc, cache_seqlens=L), out_dir))
    rows.append(measure("decode_4096_paged", lambda: f(q, kp, vp, cache_seqlens=L, block_table=table), out_dir))
    kn, vn = randn(B, 1, HK, D), randn(B, 1, HK, D)
    lens = np.full(B, L - 8, np.int32)
    rows.append(measure("decode_4096_append", lambda: f(q, kc, vc, kn, vn, cache_seqlens=lens), out_dir))
    Bp, Nq, L = 2, 2048, 16384
    k, v, qp = randn(Bp, L, HK, D), randn(Bp, L, HK, D), randn(Bp, Nq, H, D)
    kp, table = paged(k, 256)
    vp, _ = paged(v, 256)
    rows.append(measure("prefill_plain", lambda: numba_flash.flash_attention(qp, k, v, causal=True), out_dir))
    rows.append(measure("prefill_paged", lambda: f(qp, kp, vp, cache_seqlens=L, block_table=table, causal=True),
                        out_dir))  # fmt: skip
    print(f"\n{'case':24} {'host us':>8} {'gpu us':>8} {'after busy':>10}")
    for r in rows:
        print(f"{r['case']:24} {r['host_us']:8.1f} {r['gpu_us']:8.1f} {r['waits_us']:10.1f}")


if __name__ == "__main__":
    main(sys.argv[1])

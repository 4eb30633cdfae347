"""Where the API's host time goes, per kind of call: host microseconds a call (calls
issued without synchronising), GPU microseconds a call (CUDA events around queued
calls), and cProfile's entries by cumulative time.

    python3 scripts/profile_host.py [--profile]

Cases: a short forward and backward at (4, 16, 1024, 128) fp16 causal, a tiny forward
(1, 8, 128, 64) (host time only), varlen forwards of 16 sequences (total 16384, H 16,
d 128, causal) with NumPy and with device offsets, and torch SDPA's forward on the
same short shape for scale.  If a call's host time exceeds its GPU time, back-to-back
calls are host-bound.
"""

import cProfile
import io
import pstats
import sys

import cupy as cp
import numpy as np

import numba_flash
from bench_table import gpu_us, host_ms  # scripts/ is on sys.path


def normals(shape):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


B, H, N, d = 4, 16, 1024, 128
q, k, v = (normals((B, N, H, d)) for _ in range(3))
out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
do = normals(out.shape)
tq, tk, tv = (normals((1, 128, 8, 64)) for _ in range(3))
rng = np.random.default_rng(0)
lens = rng.integers(1, 2048, 16)
lens = (lens * 16384 / lens.sum()).astype(np.int64)
lens[-1] += 16384 - lens.sum()
cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
vq, vk, vv = (normals((16384, 16, 128)) for _ in range(3))
cu_dev = cp.asarray(cu)
maxlen = int(lens.max())

CASES = {
    "fwd (4,16,1024,128) causal": lambda: numba_flash.flash_attention(q, k, v, causal=True),
    "fwd+lse (4,16,1024,128) causal": lambda: numba_flash.flash_attention(q, k, v, causal=True, return_lse=True),
    "bwd (4,16,1024,128) causal": lambda: numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=True),
    "fwd tiny (1,128,8,64)": lambda: numba_flash.flash_attention(tq, tk, tv),
    "varlen fwd, NumPy offsets": lambda: numba_flash.flash_attention_varlen(vq, vk, vv, cu, cu, maxlen, maxlen,
                                                                            causal=True),
    "varlen fwd, device offsets": lambda: numba_flash.flash_attention_varlen(vq, vk, vv, cu_dev, cu_dev, maxlen,
                                                                             maxlen, causal=True),
}
try:
    import torch

    tt = [torch.as_tensor(x, device="cuda").transpose(1, 2) for x in (q, k, v)]
    CASES["torch SDPA fwd (same shape)"] = lambda: torch.nn.functional.scaled_dot_product_attention(*tt,
                                                                                                   is_causal=True)
except Exception as exc:  # noqa: BLE001 -- the table says why the row is missing
    print(f"torch SDPA: not run ({exc})")

print(f"{'case':34s} {'host us':>9s} {'GPU us':>9s}")
for name, fn in CASES.items():
    host = host_ms(fn, 200) * 1e3
    gpu = gpu_us(fn)
    print(f"{name:34s} {host:9.1f} {gpu:9.1f}", flush=True)

if "--profile" in sys.argv:
    for name in ("fwd (4,16,1024,128) causal", "bwd (4,16,1024,128) causal", "varlen fwd, NumPy offsets"):
        fn = CASES[name]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            fn()
        prof.disable()
        cp.cuda.runtime.deviceSynchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        print(f"\n===== {name}: cProfile, 100 calls, by cumulative time =====")
        print(s.getvalue()[-9000:])

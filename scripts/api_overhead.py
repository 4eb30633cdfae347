"""Where the per-call time of a short forward goes: host work in the API vs the kernel.

    python3 scripts/api_overhead.py [B H N d causal]     (default 16 32 1024 64 1)

Prints, per call, in microseconds: the host time of the whole API call (no sync), of the
argument checks alone, of wrapping the operands for numba (``kernel_arg``), of numba's
launch with prepared arguments, and the GPU time of the kernel (CUDA events around
launches of prepared arguments, many in flight) -- for numba's launch path and for
numba-flash's direct one (``numba_flash._launch``).  If the API's host time exceeds the
kernel's GPU time, back-to-back calls are host-bound and a benchmark measures the host.
"""

import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.variant import Variant, variant_args
from numba_flash import _arrays as A
from numba_flash import config
from numba_flash import _launch
from numba_flash._launch import launch
from numba_flash.kernels import tc_forward
from bench_table import gpu_us, host_ms  # scripts/ is on sys.path

B, H, N, d, causal = (int(x) for x in (sys.argv[1:6] if len(sys.argv) > 5 else (16, 32, 1024, 64, 1)))
causal = bool(causal)
q, k, v = (cp.random.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
REPS = 200


def host_us(fn, reps=REPS):
    return host_ms(fn, reps) * 1e3


t = config.tc_forward_tiles(d, causal, "float16")
kern = tc_forward.tc_forward_kernel(t, Variant(causal=causal), "float16")
out, lse = cp.empty_like(q), cp.empty((B, H, N), cp.float32)
args = [x.view(cp.uint16) for x in (q, k, v)] + [out.view(cp.uint32), lse, float(1 / np.sqrt(d))] + variant_args()
grid = ((N + t.block_m - 1) // t.block_m, H, B)


def prepared():
    launch(kern, grid, t.threads, tc_forward.smem_bytes(t), *args)


def api():
    numba_flash.flash_attention(q, k, v, causal=causal)


def checks():
    ops = [A.check_operand(n, x, "bshd") for n, x in (("q", q), ("k", k), ("v", v))]
    A.check_qkv(*ops, "bshd")


def wrap():
    for x in (q, k, v, out, lse):
        A.kernel_arg(x)


def one_call_gpu_us(fn, reps=REPS):
    """Events around each single call (as ``numba-flash bench`` times): host time
    spent before the kernel reaches the GPU counts here."""
    fn()
    times = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
    return float(np.median(times))


rows = {
    "argument checks, host": host_us(checks),
    "kernel_arg x5 (numba wrap), host": host_us(wrap),
    "launch_stream (numba wrap), host": host_us(A.launch_stream),
}
for path in ("numba", "direct"):
    _launch._NUMBA_PATH = path == "numba"
    rows[f"[{path}] API call, host"] = host_us(api)
    rows[f"[{path}] launch only, host"] = host_us(prepared)
    rows[f"[{path}] kernel, GPU, back to back"] = gpu_us(prepared, REPS)
    rows[f"[{path}] API call, GPU, back to back"] = gpu_us(api, REPS)
    rows[f"[{path}] API call, GPU, events around one call"] = one_call_gpu_us(api)
print(f"B={B} H={H} N={N} d={d} causal={causal} fp16")
for name, us in rows.items():
    print(f"{name:40s} {us:9.1f} us")

"""TFLOP/s of forward and backward on issue #10's shape table, with FlashAttention-2
(torch SDPA's flash backend) in the same process.

    python3 scripts/bench_table.py out.jsonl [--no-peer] [--forward-only] [--queued] [--tc-only]
    python3 scripts/bench_table.py --compare before.jsonl after.jsonl   # a markdown table
    python3 scripts/bench_table.py --compare b1.jsonl,b2.jsonl a1.jsonl,a2.jsonl   # medians of runs

Uses only the public API (``flash_attention``, ``flash_attention_backward``), so the
same script times an older checkout of the library put first on ``PYTHONPATH``: that is
how before/after figures of a refactor come from one machine and one run.  Times are
medians of CUDA-event timings of single calls after warm-up; FLOPs 4·B·H·N²·d (×0.5
causal, ×2.5 backward).  Inputs are fresh standard normals, 64 MiB or more per tensor
at every shape (beyond the 60 MB L2).  ``--forward-only`` skips the backward,
``--queued`` times 10 back-to-back calls between the events (the host's time per call
hidden, as torch.utils.benchmark times FlashAttention-2), ``--tc-only`` skips the fp32
cases; with the peer, SDPA's cuDNN backend is timed too.
"""

import json
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import numba_flash

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]
CASES = [(s, "float16", c) for s in SHAPES for c in (False, True)] + [
    ((4, 16, 4096, 128), "bfloat16", False),
    ((4, 16, 4096, 128), "float32", False),
    ((4, 32, 4096, 64), "float32", False),
]


def median_ms(fn, warmup=3, rep=15, calls=1):
    """Median milliseconds of a call: CUDA events around ``calls`` back-to-back calls,
    divided by ``calls`` (``numba_flash.bench.decode.queued_ms``)."""
    from numba_flash.bench.decode import queued_ms

    return float(queued_ms(fn, calls=calls, rep=rep, warmup=warmup))


def gpu_us(fn, reps=50):
    """Microseconds of GPU time a call: CUDA events around ``reps`` calls queued back to
    back (one warm-up call first).  When the host issues calls slower than the GPU runs
    them, this is the host's time a call instead."""
    fn()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) / reps * 1e3


def host_ms(fn, n=20):
    """Milliseconds of host time a call, over ``n`` calls issued without synchronising
    (the GPU synchronised before and after, one warm-up call first): what the API
    costs the CPU, whether or not the GPU keeps up."""
    import time

    fn()
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e3
    cp.cuda.runtime.deviceSynchronize()
    return host


def compare(before_path, after_path):
    """Per case: TFLOP/s before and after, after ÷ before, and FA2's (same run as after).
    Comma-separated lists of runs (alternated on one machine) give each case's median."""
    def load(paths):
        runs = {}
        for path in paths.split(","):
            for line in open(path):
                if line.strip():
                    r = json.loads(line)
                    runs.setdefault((r["B"], r["H"], r["N"], r["d"], r["dtype"], r["causal"]), []).append(r)
        out = {}
        for key, rs in runs.items():
            merged = dict(rs[0])
            for field in ("fwd_tflops", "bwd_tflops", "fa2_fwd_tflops", "fa2_bwd_tflops", "cudnn_fwd_tflops",
                          "cudnn_bwd_tflops"):  # fmt: skip
                values = [r[field] for r in rs if field in r]
                if values:
                    merged[field] = float(np.median(values))
            out[key] = merged
        return out

    def cells(b, a, what):  # before, after, ratio of one pass ("–" where a run had no such pass)
        f = f"{what}_tflops"
        if f not in a or f not in b:
            return "– | – | –"
        return f"{b[f]:.1f} | {a[f]:.1f} | {a[f] / b[f]:.3f}"

    def peers(a, what):
        return " / ".join(f"{a[f]:.0f}" if f in a else "–" for f in (f"fa2_{what}_tflops", f"cudnn_{what}_tflops"))

    before, after = load(before_path), load(after_path)
    print("| (B,H,N,d) | dtype | causal | fwd before | fwd after | ratio | bwd before | bwd after | ratio "
          "| FA2 / cuDNN fwd | FA2 / cuDNN bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, a in after.items():
        b = before.get(key)
        if b is None:
            continue
        print(f"| ({key[0]},{key[1]},{key[2]},{key[3]}) | {key[4]} | {'yes' if key[5] else 'no'} "
              f"| {cells(b, a, 'fwd')} | {cells(b, a, 'bwd')} | {peers(a, 'fwd')} | {peers(a, 'bwd')} |")


def main():
    if sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    path = sys.argv[1]
    peer = "--no-peer" not in sys.argv
    fwd_only, calls = "--forward-only" in sys.argv, (10 if "--queued" in sys.argv else 1)
    rows = []
    for (B, H, N, d), dtype, causal in CASES:
        if "--tc-only" in sys.argv and dtype == "float32":
            continue
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        gen = cp.random.default_rng(0)
        q, k, v, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(dt) for _ in range(4))
        out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
        flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
        fwd = median_ms(lambda: numba_flash.flash_attention(q, k, v, causal=causal), calls=calls)
        row = dict(B=B, H=H, N=N, d=d, dtype=dtype, causal=causal, fwd_ms=fwd, fwd_tflops=flops / fwd / 1e9)
        if not fwd_only:
            bwd = median_ms(lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal),
                            calls=calls)  # fmt: skip
            row.update(bwd_ms=bwd, bwd_tflops=2.5 * flops / bwd / 1e9)
        if peer and dtype != "float32":
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel

            tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).detach() for x in (q, k, v, dout))
            tq.requires_grad_(), tk.requires_grad_(), tv.requires_grad_()
            f = torch.nn.functional.scaled_dot_product_attention
            for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(backend):
                    try:
                        t_fwd = median_ms(lambda: f(tq, tk, tv, is_causal=causal), calls=calls)
                    except RuntimeError:  # the backend refuses the case
                        continue
                    row[f"{name}_fwd_tflops"] = flops / t_fwd / 1e9
                    if not fwd_only:
                        o = f(tq, tk, tv, is_causal=causal)
                        t_bwd = median_ms(lambda: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True),
                                          calls=calls)  # fmt: skip
                        row[f"{name}_bwd_tflops"] = 2.5 * flops / t_bwd / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dout, out, lse
        cp.get_default_memory_pool().free_all_blocks()
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
